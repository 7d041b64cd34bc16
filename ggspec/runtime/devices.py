"""Where a model's weights live: split mode, RPC workers, tensor split proportions, mirrored head.

`--rpc host:port,...` adds llama.cpp RPC workers (`ggspec rpc-server` / `ggml-rpc-server`) as
devices; `-sm layer` spreads whole layers over them, `-sm tensor` splits every weight across them
(one "meta" device), `-ts 3,1` weighs the split. Under `-sm tensor` the output head is split by
vocabulary rows unless `--mirror-output` keeps a full copy on each device (patch 0004).
"""

from __future__ import annotations

import ctypes
import math
import platform
import socket
from dataclasses import dataclass
from pathlib import Path

from ggspec.errors import InputError, LlamaError
from ggspec.runtime import watchdog

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
MIRROR_KEY = b"ggspec.meta_mirror_output"  # the bool kv override patch 0004 reads at load


@dataclass(frozen=True)
class Placement:
    split_mode: str = "none"
    rpc: tuple[str, ...] = ()  # "host:port" endpoints
    tensor_split: tuple[float, ...] = ()  # proportions per device; () = llama.cpp's choice
    mirror_output: bool = False
    rpc_timeout: float = 120.0  # seconds a llama.cpp call may wait on the workers (see watchdog.py)

    @staticmethod
    def parse(split_mode: str | None, rpc: str | None, tensor_split: str | None, mirror_output: bool,
              rpc_timeout: float = 120.0) -> "Placement":
        sm = split_mode or "none"
        if sm not in SPLIT_MODES:
            raise InputError(f"{sm}: expected one of {', '.join(SPLIT_MODES)}", field="split_mode")
        endpoints = tuple(parse_endpoint(e) for e in rpc.split(",")) if rpc else ()
        if len(set(endpoints)) != len(endpoints):
            raise InputError(f"{rpc}: a worker is listed twice", field="rpc")
        ts: tuple[float, ...] = ()
        if tensor_split:
            try:
                ts = tuple(float(x) for x in tensor_split.replace("/", ",").split(","))
            except ValueError:
                raise InputError(f"{tensor_split}: expected proportions like 3,1", field="tensor_split") from None
            if not all(math.isfinite(x) and x >= 0 for x in ts) or sum(ts) <= 0 or len(ts) > 16:
                raise InputError(f"{tensor_split}: expected up to 16 finite, non-negative proportions, "
                                 "not all zero", field="tensor_split")
        if not (math.isfinite(rpc_timeout) and rpc_timeout > 0):
            raise InputError(f"{rpc_timeout:g}: expected a finite number of seconds > 0", field="rpc_timeout")
        p = Placement(sm, endpoints, ts, mirror_output, rpc_timeout)
        p.check()
        return p

    def check(self) -> None:
        if self.split_mode in ("layer", "row", "tensor") and not self.rpc and not has_gpu_backend():
            raise InputError(f"{self.split_mode} splits a model across devices, and this build has no GPU "
                             "backend: add RPC workers (host:port,...)", field="split_mode")
        if self.split_mode == "row":
            raise InputError("row is a CUDA-only mode in llama.cpp; use layer or tensor with RPC workers", field="split_mode")
        if self.tensor_split and self.rpc and len(self.tensor_split) != len(self.rpc):
            raise InputError(f"{len(self.tensor_split)} proportions for {len(self.rpc)} RPC devices", field="tensor_split")
        if self.mirror_output and self.split_mode != "tensor":
            raise InputError("only applies to a tensor split (other modes keep the head whole)", field="mirror_output")

    @property
    def multi_device(self) -> bool:
        return bool(self.rpc)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_endpoint(text: str) -> str:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"{text}: expected host:port", field="rpc")
    return f"{host}:{int(port)}"


def has_gpu_backend() -> bool:
    """Whether the current build has a GPU backend (its devices reach llama.cpp by themselves)."""
    from ggspec.native import build as nb

    options = nb.current_options()
    return bool(options and (options.cuda or options.vulkan))


def check_reachable(endpoint: str, timeout: float = 3.0) -> None:
    """llama.cpp aborts the process when it cannot connect to a worker: ask the socket first.
    (A port that accepts and then never answers passes; the watchdog catches that one.)"""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise InputError(f"{endpoint}: cannot reach the RPC worker ({exc.strerror or exc}); "
                         f"start one with `ggspec rpc-server -p {port}`", field="rpc") from None


def rpc_device(endpoint: str, timeout: float = 120.0) -> int:
    """The ggml device of an RPC worker (added once per process and endpoint).

    The watchdog watches this worker from before the first contact (armed with `timeout` unless
    DeviceParams armed it already): the handshake inside `ggml_backend_rpc_add_server` blocks
    forever on a port that accepts and never answers."""
    if endpoint not in _rpc_devices:
        watchdog.arm(None if watchdog.armed() else timeout, f"--rpc {endpoint}", [endpoint])
        _rpc_devices[endpoint] = _add_rpc_device(endpoint, timeout)
    return _rpc_devices[endpoint]


_rpc_devices: dict[str, int] = {}


def _add_rpc_device(endpoint: str, timeout: float) -> int:
    from ggspec.native.backend import ggml, install_abort_handler

    check_reachable(endpoint, min(3.0, timeout))
    g = ggml()
    install_abort_handler(f"--rpc {endpoint}")  # DeviceParams names every worker of the run
    watchdog.begin()  # only needed where the watchdog cannot see the socket itself
    try:
        reg = g.rpc_add_server(endpoint.encode())
    finally:
        watchdog.end()
    if not reg or g.reg_dev_count(reg) < 1:
        raise LlamaError(f"--rpc {endpoint}: the worker offers no device")
    return g.reg_dev_get(reg, 0)


class DeviceParams:
    """The llama_model_params fields for a placement, with the ctypes arrays they point to kept
    alive as long as the model (llama.cpp reads tensor_split again after the load)."""

    def __init__(self, lc, placement: Placement) -> None:
        self.placement = placement
        self._devices = None
        self._split = None
        self._overrides = None
        if placement.rpc:
            from ggspec.native.backend import install_abort_handler

            what = "--rpc " + ",".join(placement.rpc)
            # from before the first contact until the process ends: every llama.cpp call that waits
            # on a worker (handshake, load, context, decode, reads, free) is covered
            watchdog.arm(placement.rpc_timeout, what, placement.rpc)
            devs = [rpc_device(e, placement.rpc_timeout) for e in placement.rpc]
            install_abort_handler(what)
            self._devices = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
        if placement.tensor_split:
            self._split = (ctypes.c_float * 16)(*placement.tensor_split)
        elif placement.rpc and placement.split_mode == "layer":
            # llama.cpp's default weighs by each device's free memory, which an RPC worker on a
            # CPU reports as the host's (changing) free RAM: split evenly unless told otherwise
            self._split = (ctypes.c_float * 16)(*([1.0] * len(placement.rpc)))
        if placement.mirror_output:
            kvo = lc.llama_model_kv_override
            self._overrides = (kvo * 2)()
            self._overrides[0].key = MIRROR_KEY
            self._overrides[0].tag = lc.LLAMA_KV_OVERRIDE_TYPE_BOOL
            self._overrides[0].value.val_bool = True
            self._overrides[1].key = b""

    def apply(self, params) -> None:
        params.split_mode = SPLIT_MODES[self.placement.split_mode]
        if self._devices is not None:
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if self._split is not None:
            params.tensor_split = self._split
        if self._overrides is not None:
            params.kv_overrides = self._overrides


def memory_report(placement: Placement) -> list[str]:
    """One line per RPC device: what its worker reports (free / total memory of its backend)."""
    from ggspec.native.backend import ggml

    g = ggml()
    lines = []
    for endpoint in placement.rpc:
        dev = rpc_device(endpoint)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        g.dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        name = (g.dev_name(dev) or b"?").decode()
        lines.append(f"{name} ({endpoint}): {free.value / 2**20:.0f} MiB free of {total.value / 2**20:.0f} MiB")
    return lines
