"""Load llama-cpp-python's ctypes bindings against ggspec's patched build, plus our shim.

The bindings module (`llama_cpp/llama_cpp.py`) comes from the same pinned sdist as the source
tree, so it matches the library exactly. We import that one module without running the
package's `__init__` (which pulls in the high-level API and its dependencies), pointing
`LLAMA_CPP_LIB_PATH` at our build so there is only one llama.cpp in the process: the patched one.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import types
from collections import deque
from ctypes import POINTER, c_bool, c_float, c_int32, c_int64, c_uint32, c_void_p
from functools import cache
from pathlib import Path

from ggspec.native import build, paths

SHIM_ABI_VERSION = 9
CHAT_ABI_VERSION = 1  # libggspec-common (patch 0017)
GGML_LOG_LEVEL_ERROR = 4

# llama.cpp logs a great deal to stderr. We keep its recent lines (errors explain NULL returns)
# and echo them only when GGSPEC_VERBOSE is set.
_recent_log: deque[tuple[int, str]] = deque(maxlen=64)
_log_callback = None  # keeps the ctypes callback alive


def log_lines() -> list[str]:
    """llama.cpp's most recent log lines (up to 64), oldest first."""
    return [text for _level, text in _recent_log]


def last_log_error() -> str:
    """The most recent error line llama.cpp logged, or its most recent line of any kind."""
    for level, text in reversed(_recent_log):
        if level == GGML_LOG_LEVEL_ERROR and text.strip():
            return text.strip()
    return _recent_log[-1][1].strip() if _recent_log else "(no log output)"


def _on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", "replace") if text else ""
    _recent_log.append((level, line))
    if _verbose:
        sys.stderr.write(line)


_verbose = False


def _install_log_callback(lc: types.ModuleType) -> None:
    global _log_callback, _verbose
    _verbose = bool(os.environ.get("GGSPEC_VERBOSE"))
    _log_callback = lc.llama_log_callback(_on_log)
    lc.llama_log_set(_log_callback, None)


def interrupt_outside_callbacks(signum: int, frame: types.FrameType | None) -> None:
    """A SIGINT handler for programs that drive llama.cpp: KeyboardInterrupt as usual, except while
    the log callback runs, where ctypes would swallow it ("Exception ignored on calling ctypes
    callback") and the run would go on as if nothing happened. There the signal is sent again a
    few milliseconds later, once the callback has returned into llama.cpp."""
    while frame is not None:
        if frame.f_code is _on_log.__code__:
            threading.Timer(0.005, os.kill, (os.getpid(), signum)).start()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


class NotBuiltError(RuntimeError):
    """No usable build: the message tells the user what to run."""


def current_build() -> build.BuildInfo:
    options = build.current_options()
    if options is None:
        raise NotBuiltError("ggspec has no llama.cpp build yet: run `ggspec build` first")
    info = build.find_build(options)
    if info is None:
        raise NotBuiltError(
            "the patch series or build options changed since the last build: run `ggspec build`"
        )
    return info


def _import_bindings(lib_dir: str) -> types.ModuleType:
    existing = sys.modules.get("llama_cpp")
    pkg_dir = paths.sdist_dir() / "llama_cpp"
    if existing is not None and list(getattr(existing, "__path__", [])) != [str(pkg_dir)]:
        raise NotBuiltError(
            "another llama_cpp package is already imported in this process; "
            "ggspec must load its own patched build"
        )
    if not (pkg_dir / "llama_cpp.py").is_file():
        raise NotBuiltError("the pinned sdist is not extracted: run `ggspec build`")
    os.environ["LLAMA_CPP_LIB_PATH"] = lib_dir
    if existing is None:
        pkg = types.ModuleType("llama_cpp")
        pkg.__path__ = [str(pkg_dir)]  # a bare package: its __init__ is never executed
        sys.modules["llama_cpp"] = pkg
    try:
        import llama_cpp.llama_cpp as lc  # noqa: PLC0415
    except (RuntimeError, OSError) as exc:  # the bindings wrap the loader's OSError in a RuntimeError
        raise NotBuiltError(load_failure(lib_dir, exc)) from None
    return lc


def load_failure(lib_dir: str, exc: BaseException) -> str:
    """One line for a build the dynamic loader refuses: what it could not open, and for a CUDA
    build on a machine without NVIDIA's driver, what to do."""
    cause = str(exc).rsplit("': ", 1)[-1].strip() or exc.__class__.__name__
    text = f"cannot load the llama.cpp build in {lib_dir} ({cause})"
    if "libcuda.so" in cause:
        text += ("; a CUDA build runs only where NVIDIA's driver is installed: on this machine, "
                 "`ggspec build` (without --cuda) makes a CPU build current")
    return text


def _declare(lib: ctypes.CDLL, name: str, argtypes: list, restype) -> None:
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = restype


def _declare_shim(lib: ctypes.CDLL) -> None:
    """The C-ABI shim of patch 0001 (stable names for llama-ext.h + bulk batch fillers)."""
    try:
        _declare(lib, "ggspec_shim_abi_version", [], c_int32)
    except AttributeError as exc:
        raise NotBuiltError("the loaded libllama has no ggspec shim: run `ggspec build`") from exc
    version = lib.ggspec_shim_abi_version()
    if version != SHIM_ABI_VERSION:
        raise NotBuiltError(f"shim ABI {version} != expected {SHIM_ABI_VERSION}: run `ggspec build`")
    f32p = POINTER(c_float)
    i32p = POINTER(c_int32)
    _declare(lib, "ggspec_set_embeddings_layer_inp", [c_void_p, c_uint32, c_bool], None)
    # patch 0012: the prepared-plan pool
    _declare(lib, "ggspec_set_plan_pool", [c_void_p, c_uint32, c_uint32], None)
    _declare(lib, "ggspec_get_plan_stats", [c_void_p, i32p, i32p, i32p], None)
    # patch 0013: the lean step
    _declare(lib, "ggspec_copy_layer_inputs", [c_void_p, c_void_p, c_int32, c_int32, c_int32, c_int32, c_void_p],
             c_int32)
    _declare(lib, "ggspec_get_embeddings_layer_inp", [c_void_p, c_uint32], f32p)
    _declare(lib, "ggspec_model_target_layer_ids", [c_void_p], i32p)
    _declare(lib, "ggspec_model_target_layer_ids_n", [c_void_p], c_uint32)
    _declare(lib, "ggspec_set_embeddings_nextn", [c_void_p, c_bool, c_bool], None)
    _declare(lib, "ggspec_get_embeddings_nextn", [c_void_p], f32p)
    _declare(lib, "ggspec_get_embeddings_nextn_ith", [c_void_p, c_int32], f32p)
    _declare(lib, "ggspec_model_dflash_selector_top_k", [c_void_p], c_int32)
    # patch 0008: the tokenizer without exceptions escaping into ctypes (INT32_MIN instead)
    _declare(lib, "ggspec_tokenize", [c_void_p, ctypes.c_char_p, c_int32, i32p, c_int32, c_bool, c_bool], c_int32)
    _declare(lib, "ggspec_token_to_piece", [c_void_p, c_int32, ctypes.c_char_p, c_int32, c_int32, c_bool], c_int32)
    # the bulk fillers run every step: they take numpy's raw data addresses (ndarray.ctypes.data),
    # which costs a fraction of building typed pointers with data_as()
    _declare(lib, "ggspec_batch_add_tokens",
             [c_void_p, c_int32, c_void_p, c_int32, c_int32, c_void_p], c_int32)
    _declare(lib, "ggspec_batch_add_embd_rows",
             [c_void_p, c_int32, c_void_p, c_int32, c_int64, c_int32], c_int32)
    _declare(lib, "ggspec_batch_add_layer_inputs",
             [c_void_p, c_int32, c_void_p, i32p, c_int32, c_int64, c_int32, c_int32, c_int32], c_int32)
    # patch 0011: chained MTP drafting, a reduced draft vocabulary, token + hidden-state rows
    _declare(lib, "ggspec_set_mtp_chain", [c_void_p, c_int32, c_bool, c_bool], c_int32)
    _declare(lib, "ggspec_mtp_chain_result", [c_void_p, c_void_p, c_void_p, c_int32], c_int32)
    _declare(lib, "ggspec_model_set_draft_vocab", [c_void_p, c_void_p, c_int32], c_int32)
    _declare(lib, "ggspec_batch_add_tokens_h",
             [c_void_p, c_int32, c_void_p, c_int32, c_int32, c_void_p, c_void_p, c_int64, c_bool], c_int32)
    # patch 0014: a reduced output head for any context
    _declare(lib, "ggspec_set_head_rows", [c_void_p, c_void_p], c_int32)
    # patch 0004: mirrored output head under a tensor split
    _declare(lib, "ggspec_model_meta_mirror_output", [c_void_p], c_bool)
    # patch 0002: recurrent-state plane layout (capped planes, leading snapshots)
    _declare(lib, "ggspec_set_rs_planes", [c_void_p, c_int32, c_int32], c_int32)
    _declare(lib, "ggspec_rs_kept_counts", [c_void_p, c_int32, i32p, c_int32], c_int32)
    _declare(lib, "ggspec_rs_can_rollback", [c_void_p, c_int32, c_int32], c_int32)


@cache
def load() -> types.ModuleType:
    """The bindings module `llama_cpp.llama_cpp`, loaded once, with the shim declared on `_lib`.

    Shim functions are called as `lc._lib.ggspec_*`.
    """
    info = current_build()
    lc = _import_bindings(info.lib_dir)
    _declare_shim(lc._lib)
    _install_log_callback(lc)
    lc.llama_backend_init()
    return lc


@cache
@cache
def _ggml_cpu_library() -> ctypes.CDLL:
    """libggml-cpu, the CPU backend libllama loaded (the same handle: its state is shared)."""
    load()
    path = library_path() / "libggml-cpu.so"
    try:
        lib = ctypes.CDLL(str(path))
        _declare(lib, "ggml_cpu_batch_invariant_rows", [], c_int64)
        _declare(lib, "ggml_cpu_set_batch_invariant_rows", [c_int64], None)
    except (OSError, AttributeError) as exc:
        raise NotBuiltError(f"the llama.cpp build has no batch-invariant CPU backend ({path.name}): run `ggspec build`") from exc
    return lib


def batch_invariant() -> int:
    """The most rows (tokens) a CPU op may have and still compute every row as it computes that row
    alone (patches 0021, 0022; 0: off). On by default for every row count (2**63 - 1): verify
    batches, prompt chunks, several sequences' rows. GGML_CPU_BATCH_INVARIANT=0 turns it off for a
    whole run (llama.cpp's tools included), GGML_CPU_BATCH_INVARIANT_ROWS=N sets a limit (larger
    ops keep the batch-dependent kernels)."""
    return int(_ggml_cpu_library().ggml_cpu_batch_invariant_rows())


def set_batch_invariant(on: bool, rows: int | None = None) -> None:
    """Switch the CPU backend's batch invariance for this process (`rows`: its limit, None: the
    default); it takes effect at the next decode."""
    _ggml_cpu_library().ggml_cpu_set_batch_invariant_rows((-1 if rows is None else int(rows)) if on else 0)


def common_library() -> ctypes.CDLL:
    """libggspec-common (patch 0017): llama.cpp's own chat code (templates, tool-call grammars and
    parsers, the JSON-schema converter) behind a C ABI of JSON texts, its reasoning budget sampler,
    and its memory breakdown by device (what its fit measures with); loaded after libllama."""
    load()
    path = library_path() / "libggspec-common.so"
    try:
        lib = ctypes.CDLL(str(path))
        _declare(lib, "ggspec_chat_abi_version", [], c_int32)
    except (OSError, AttributeError) as exc:
        raise NotBuiltError(f"the llama.cpp build has no ggspec common library ({path.name}): run `ggspec build`") from exc
    if lib.ggspec_chat_abi_version() != CHAT_ABI_VERSION:
        raise NotBuiltError(f"chat ABI {lib.ggspec_chat_abi_version()} != expected {CHAT_ABI_VERSION}: run `ggspec build`")
    text, errp = c_void_p, POINTER(c_void_p)  # texts the library allocates come back as addresses
    _declare(lib, "ggspec_chat_string_free", [c_void_p], None)
    _declare(lib, "ggspec_chat_templates_init", [c_void_p, ctypes.c_char_p, errp], c_void_p)
    _declare(lib, "ggspec_chat_templates_free", [c_void_p], None)
    _declare(lib, "ggspec_chat_templates_info", [c_void_p], text)
    _declare(lib, "ggspec_chat_apply", [c_void_p, ctypes.c_char_p], text)
    _declare(lib, "ggspec_json_schema_to_grammar", [ctypes.c_char_p], text)
    _declare(lib, "ggspec_chat_stream_init", [ctypes.c_char_p, errp], c_void_p)
    _declare(lib, "ggspec_chat_stream_free", [c_void_p], None)
    _declare(lib, "ggspec_chat_stream_update", [c_void_p, ctypes.c_char_p, c_bool], text)
    _declare(lib, "ggspec_sampler_accept", [c_void_p, c_int32], c_bool)
    i32p = POINTER(c_int32)
    _declare(lib, "ggspec_reasoning_budget_init", [c_void_p, i32p, c_int32, i32p, i32p, c_int32, i32p, c_int32, c_int32],
             c_void_p)
    _declare(lib, "ggspec_reasoning_budget_state", [c_void_p], c_int32)
    _declare(lib, "ggspec_reasoning_budget_force", [c_void_p], c_bool)
    _declare(lib, "ggspec_reasoning_budget_end_match", [c_void_p, i32p, c_int32], c_int32)
    i64p = POINTER(ctypes.c_int64)
    _declare(lib, "ggspec_model_n_devices", [c_void_p], c_int32)
    _declare(lib, "ggspec_model_device_memory", [c_void_p, c_int32, i64p, i64p], ctypes.c_char_p)
    _declare(lib, "ggspec_memory_breakdown", [c_void_p, i64p], c_int32)
    return lib


# The short calls of every engine step (a batch cleared and filled, cache cells removed, the logits'
# address): microseconds each, a few dozen a step. Through ctypes.CDLL every call releases the GIL
# and takes it back, and in a server each of those hand-offs lets the HTTP thread in while the
# engine waits for it (measured: 1.5 ms of a 15 ms step at 8 streams). Through ctypes.PyDLL they
# keep the GIL, so the engine hands it over only during its decodes, which is when the HTTP side
# can use it for free. The functions are the same; only the GIL handling differs.
_HELD_GIL = ("llama_batch_ext_clear", "ggspec_batch_add_tokens", "ggspec_batch_add_layer_inputs",
             "ggspec_batch_add_embd_rows", "ggspec_batch_add_tokens_h", "llama_memory_seq_rm", "llama_memory_seq_pos_max", "ggspec_rs_can_rollback",
             "llama_get_logits", "llama_get_sampled_token_ith", "llama_get_sampled_logits_ith",
             "llama_get_sampled_logits_count_ith", "llama_get_sampled_candidates_ith")


@cache
def held_gil() -> ctypes.PyDLL:
    """The loaded library again, with the short per-step functions declared to keep the GIL (see
    _HELD_GIL). Not for calls that may block on an RPC worker while its watchdog (a Python
    thread, which needs the GIL) must be able to fire: callers fall back to `load()._lib` then."""
    lib = load()._lib
    held = ctypes.PyDLL(lib._name)  # the same handle: dlopen of a loaded library
    for name in _HELD_GIL:
        src = getattr(lib, name)
        _declare(held, name, src.argtypes, src.restype)
    return held


def library_path() -> Path:
    return Path(current_build().lib_dir)
