"""What several test modules share: a test module imports helpers from here or from conftest, never
from another test module (tests/test_architecture.py checks it). `from helpers.drafts import
Recorder` resolves like `from conftest import ...`: pytest's default (prepend) import mode puts
tests/ on sys.path, since tests/ has no __init__.py.

  pairs      the shipped tiny models, the prompts and the context settings the exactness cases share
  drafts     recording drafts, comparing them with llama.cpp's dumps, forced acceptance, plain greedy
  serving    a live `ggspec serve` on loopback; three clients get plain greedy text
  stats      draws of sampled tokens over many seeds and their two-sample test
  rpc        llama.cpp RPC workers on loopback
  gguf_edit  a GGUF with metadata keys replaced, added or deleted
"""
