"""The shipped tiny models (models/tiny/) and the prompts and settings the exactness cases share."""

from __future__ import annotations

from pathlib import Path

from ggspec.runtime import ContextParams

TINY = Path(__file__).resolve().parents[2] / "models" / "tiny"
TARGET = TINY / "tiny-coder.gguf"  # the trained dense target (qwen3, 1024 tokens)
DRAFT = TINY / "tiny-coder-draft.gguf"  # its classic draft model (draft-simple)
DFLASH = TINY / "tiny-coder-dflash-b8.gguf"  # its DFlash draft, block 8
EAGLE3 = TINY / "tiny-coder-eagle3.gguf"  # its EAGLE3 head (the inputs of layers 1, 2 and 3)

# llama.cpp's settings of its tool runs (f16 caches, no flash attention on the CPU), one thread
CPP_CTX = ContextParams(n_ctx=2048, n_threads=1, flash_attn="off")

# a prompt whose text repeats soon: the n-gram types find matches in it
STACK = ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
         "        self.items.append(item)\n\n    def pop(self):\n")

# the MTP cases (tests/test_mtp.py, test_mtp_gemma4.py): the prompt, the tokens generated, and
# llama.cpp's defaults (f16 caches, its MTP context's too; flash attention left to llama.cpp)
MTP_PROMPT = "def fibonacci(n):\n    if n < 2:"
MTP_N = 48
MTP_CTX = ContextParams(n_ctx=2048, n_threads=1)
