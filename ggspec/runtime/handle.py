"""The lifetime part every owning wrapper shares: free the llama.cpp handle exactly once, and
refuse any use after that with a Python error instead of a crash in C++."""

from __future__ import annotations

import weakref

from ggspec.errors import ClosedError

# every handle not yet garbage-collected: close() finds the handles that use the closing one here
_live: weakref.WeakSet[OwnedHandle] = weakref.WeakSet()


class OwnedHandle:
    """Owns the raw handle in `self.ptr`; subclasses say how to free it in `_free`.

    Freed by `close()`, by leaving a `with` block, or at garbage collection, whichever is first.
    After that, `self.ptr` (and the raw pointers derived from it, `_derived`) raise ClosedError,
    so every method that reaches llama.cpp through them refuses cleanly; while open they are
    plain attributes (no cost on hot paths).

    A handle that keeps another one as an attribute uses it (a Context its Model, a draft Context
    the target Context it borrows from through ctx_other): closing the used one closes its users
    first, so none of them is left pointing at freed memory.
    """

    # raw pointers subclasses take from their handle (llama_model_get_vocab, llama_get_memory)
    _derived: tuple[str, ...] = ("vocab", "memory")

    def __new__(cls, *args, **kwargs):
        obj = super().__new__(cls)
        _live.add(obj)
        return obj

    def __getattr__(self, name: str):
        # only reached when `name` is not set: ptr and its derived pointers once closed
        if name == "ptr" or name in type(self)._derived:
            why = self.__dict__.get("_closed")
            if why:
                raise ClosedError(f"this {type(self).__name__} is closed{why}: it cannot be used any more")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def closed(self) -> bool:
        return bool(self.__dict__.get("_closed"))

    def _free(self, ptr) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._close("")

    def _close(self, why: str) -> None:
        d = self.__dict__
        if d.get("_closed") or not d.get("ptr"):  # closed already, or never opened
            return
        d["_closed"] = why or " (close() was called)"
        users = [h for h in list(_live or ()) if h is not self and not h.closed
                 and any(v is self for v in h.__dict__.values())]
        for user in users:
            user._close(f" (closed with the {type(self).__name__} it uses)")
        ptr = d.pop("ptr")
        for name in type(self)._derived:
            d.pop(name, None)
        self._free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
