"""`ggspec distill`: a DFlash draft for any GGUF target, trained from llama.cpp's own features.

Three stages, each resumable on its own:

1. `capture`: the target's own greedy continuations of a prompt corpus, decoded by llama.cpp many
   sequences per batch, with the target's layer inputs at the chosen layers kept for every
   position (float16 memmaps in a work folder).
2. `train`: the DFlash draft in PyTorch on the CPU (`model`), optionally with a reduced draft
   vocabulary and its own head (`vocab`).
3. `export` + `parity`: a dflash GGUF the pinned llama.cpp loads, then its logits checked against
   PyTorch's on the same features.

`pipeline.distill` runs them in order; the CLI is a thin shell over it.
"""
