"""The lifetime part every owning wrapper shares: free the llama.cpp handle exactly once."""

from __future__ import annotations


class OwnedHandle:
    """Owns the raw handle in `self.ptr`; subclasses say how to free it in `_free`.

    Freed by `close()`, by leaving a `with` block, or at garbage collection, whichever is first.
    """

    ptr = None

    def _free(self, ptr) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, None
            self._free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
