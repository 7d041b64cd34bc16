"""What contexts take on each device, as llama.cpp counts it (patch 0017's memory shim).

`measure(contexts)` sums llama.cpp's memory breakdown of each context by device: its model's
weights (once per model, however many contexts share them), its caches and recurrent states
(`context`) and its compute buffers. On contexts of models loaded with `dry=True` (metadata
only, allocations simulated: llama.cpp's no_alloc) it is what a configuration would take before
anything is allocated, which is how llama.cpp's own --fit measures; on loaded contexts it is what
llama.cpp reports after loading. `free_memory(model)` is what each device has free.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

from ggspec.errors import LlamaError
from ggspec.native import bindings

HOST = "host"  # the name of host memory (the CPU device and host buffers of GPU backends)


@dataclass
class Use:
    """Bytes on one device."""

    model: int = 0
    context: int = 0  # KV caches and recurrent states
    compute: int = 0

    @property
    def total(self) -> int:
        return self.model + self.context + self.compute

    def __iadd__(self, other: Use) -> Use:
        self.model += other.model
        self.context += other.context
        self.compute += other.compute
        return self


@dataclass
class Footprint:
    """Bytes by device name (HOST for host memory)."""

    devices: dict[str, Use] = field(default_factory=dict)

    def add(self, name: str, use: Use) -> None:
        self.devices.setdefault(name, Use()).__iadd__(use)

    def total(self, name: str | None = None) -> int:
        return sum(u.total for n, u in self.devices.items() if name is None or n == name)


def _device_names(lib, model_ptr) -> list[str]:
    names = []
    for i in range(lib.ggspec_model_n_devices(model_ptr)):
        free, total = ctypes.c_int64(), ctypes.c_int64()
        name = lib.ggspec_model_device_memory(model_ptr, i, ctypes.byref(free), ctypes.byref(total))
        names.append(name.decode() if name else f"device {i}")
    return names


def context_use(ctx) -> dict[str, Use]:
    """One context's bytes by device (its model's weights included)."""
    lib = bindings.common_library()
    names = _device_names(lib, ctx.model.ptr)
    out = (ctypes.c_int64 * (3 * (len(names) + 1)))()
    if lib.ggspec_memory_breakdown(ctx.ptr, out) != 0:
        raise LlamaError(f"llama.cpp could not report the memory of the {ctx.model.what} context")
    uses = {}
    for k, name in enumerate([*names, HOST]):
        use = Use(out[3 * k], out[3 * k + 1], out[3 * k + 2])
        if use.total:
            uses.setdefault(name, Use()).__iadd__(use)
    return uses


def context_uses(contexts) -> list[dict[str, Use]]:
    """Each context's bytes by device (None skipped), a model's weights with its first context only."""
    seen: set[int] = set()
    out = []
    for ctx in contexts:
        if ctx is None:
            continue
        uses = context_use(ctx)
        if id(ctx.model) in seen:
            uses = {name: Use(0, u.context, u.compute) for name, u in uses.items()}
        seen.add(id(ctx.model))
        out.append(uses)
    return out


def measure(contexts) -> Footprint:
    """The contexts' bytes by device; a model's weights count once."""
    fp = Footprint()
    for uses in context_uses(contexts):
        for name, use in uses.items():
            fp.add(name, use)
    return fp


def free_memory(model) -> dict[str, tuple[int, int]]:
    """(free, total) bytes of each device a model may use, and of the host."""
    lib = bindings.common_library()
    out = {}
    for i in [*range(lib.ggspec_model_n_devices(model.ptr)), -1]:
        free, total = ctypes.c_int64(), ctypes.c_int64()
        name = lib.ggspec_model_device_memory(model.ptr, i, ctypes.byref(free), ctypes.byref(total))
        if name:
            out[HOST if i < 0 else name.decode()] = (free.value, total.value)
    return out
