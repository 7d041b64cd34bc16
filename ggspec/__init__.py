"""ggspec: speculative decoding (DFlash) on a patched llama.cpp, driven from Python.

Layers point one way: `native` (build + ctypes) <- `runtime` (model, context, batch)
<- `spec` (the speculative transaction) <- `cli`.
"""

__version__ = "0.1.0"
