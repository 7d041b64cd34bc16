"""Native layer: building the patched llama.cpp and loading its ctypes bindings."""
