"""What several test modules share (never imported from a test module: tests/test_architecture.py's
neighbours keep the suite's shape). `from helpers.drafts import Recorder` resolves like
`from conftest import ...`: pytest puts tests/ on sys.path (rootdir-relative, no __init__.py in tests/).

  pairs      the shipped tiny models, the prompts and the context settings the exactness cases share
  drafts     recording drafts, comparing them with llama.cpp's dumps, forced acceptance, plain greedy
  serving    a live `ggspec serve` on loopback; three clients get plain greedy text
  stats      draws of sampled tokens over many seeds and their two-sample test
  rpc        llama.cpp RPC workers on loopback
  gguf_edit  a GGUF with metadata keys replaced, added or deleted
"""
