"""Does a row's arithmetic depend on the batch around it? The batch-variance probe.

Plain decoding computes every token alone (a one-row decode); a verify computes the same tokens as
rows of one batch. Where the CPU kernels pick another code path for more rows (a 4-row repacked
gemm, llamafile's tiles, the tiled K-quant matmul, flash attention's KV split or Q tiles), the two
round differently and a near-tie flips: speculative text then differs from plain text. Patches 0021
and 0022 make every row of every batch take the same arithmetic (`GGML_CPU_BATCH_INVARIANT`, on by
default for every row count).

The probe compares, from the same cache:
- **rows**: tokens t[B], t[B+1], ... decoded one at a time (what plain decoding does) against the
  same tokens as rows 0..k-1 of one k-row decode with logits on every row (what a verify does);
- **neighbours**: the same k rows decoded beside other sequences' rows in one batch (what `serve`
  does with several clients) against the tokens alone;
- **chunks**: a prompt prefilled one token at a time against the same prompt in chunks of each
  size and whole (what a cached prompt, a reload or another `-ub` does), then one token decoded
  after each;
- **node**: where a row differs, the first graph node (in compute order) whose row differs, read
  through llama.cpp's eval callback, with its op: the kernel behind the difference.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

from ggspec.native.bindings import batch_invariant, library_path
from ggspec.native.bindings import load as load_bindings
from ggspec.runtime import ContextParams
from ggspec.runtime.batch import Batch
from ggspec.runtime.context import Context
from ggspec.runtime.model import Model

GGML_TYPE_F32 = 0


class _Tensor(ctypes.Structure):
    """The head of ggml.h's `struct ggml_tensor` at the pin (read-only: what the probe needs)."""
    _fields_ = [("type", ctypes.c_int32), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int32), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


@dataclass
class RowDiff:
    """One row of a k-row decode against the same token decoded alone."""
    fill: int  # cache cells before the first row
    k: int  # rows in the batch
    row: int  # the row compared (position fill + row)
    max_abs: float  # largest logit difference (0.0: the same bits)
    others: int = 0  # rows of other sequences in the same batch

    @property
    def identical(self) -> bool:
        return self.max_abs == 0.0


@dataclass
class NodeDiff:
    """The first graph node whose row differs between a one-row and a k-row decode."""
    name: str  # llama.cpp's tensor name, e.g. "ffn_out-3"
    op: str  # ggml's op, e.g. "MUL_MAT"
    src0_type: str  # the type of its first source (the weight, for a matmul)
    max_abs: float


@dataclass
class ProbeReport:
    model: str
    flash_attn: str
    repack: bool
    invariant_rows: int  # the CPU backend's batch invariance during the probe: its row limit, 0 off
    rows: list[RowDiff] = field(default_factory=list)
    chunks: list[tuple[int, float]] = field(default_factory=list)  # (chunk size, max abs diff)
    node: NodeDiff | None = None

    @property
    def identical(self) -> bool:
        return all(r.identical for r in self.rows) and all(d == 0.0 for _c, d in self.chunks)

    def worst(self) -> float:
        return max([r.max_abs for r in self.rows] + [d for _c, d in self.chunks] + [0.0])


_REPACKED = {"q4_0", "q4_K", "q5_K", "q6_K", "q2_K", "iq4_nl", "q8_0", "mxfp4"}  # repack.cpp's x86/ARM layouts
_LLAMAFILE = {"f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "iq4_nl"}  # llamafile/sgemm.cpp's x86 types
_TILED = {"q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_xs", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s",
          "iq1_s", "iq1_m"}  # tiled/tiled.cpp


def kernel_behind(node: NodeDiff, k: int, repack: bool) -> str:
    """The CPU kernel whose choice depends on the row count, for the op and weight type of the first
    differing node (what patch 0021 makes every row count take alike)."""
    if node.op == "FLASH_ATTN_EXT":
        return "flash attention: a lone row's KV split (>= 512 cells) or the Q tiles (>= 64 rows) vs the one-row path, ops.cpp"
    if node.op == "MUL_MAT":
        if repack and node.src0_type in _REPACKED and k >= 4:
            return "the repacked 4-row gemm vs its gemv, repack.cpp"
        if node.src0_type in _TILED and k >= 8:
            return "the tiled K-quant matmul (>= 8 rows) vs vec_dot, tiled/tiled.cpp"
        if node.src0_type in _LLAMAFILE:
            return "llamafile's sgemm (>= 2 rows) vs vec_dot, llamafile/sgemm.cpp"
    return "unknown"


class _NodeRecorder:
    """llama.cpp's eval callback: keeps a copy of every F32 node the graph computes, in order."""

    def __init__(self) -> None:
        self.on = False
        self.nodes: list[tuple[str, int, int, np.ndarray]] = []  # (name, op, src0 type, data)
        lc = load_bindings()
        self.callback = lc.ggml_backend_sched_eval_callback(self._call)

    def _call(self, tensor, ask, _user) -> bool:
        if not self.on:
            return not ask  # ask: "no node wanted"; else go on computing
        t = ctypes.cast(tensor, ctypes.POINTER(_Tensor)).contents
        if ask:
            return t.type == GGML_TYPE_F32
        if t.type == GGML_TYPE_F32 and t.data:
            ne = [int(x) for x in t.ne]
            nb = [int(x) for x in t.nb]
            size = max((n - 1) * s for n, s in zip(ne, nb)) + 4
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(t.data))
            arr = np.lib.stride_tricks.as_strided(raw.view(np.float32), shape=ne[::-1], strides=nb[::-1]).copy()
            src0 = ctypes.cast(t.src[0], ctypes.POINTER(_Tensor)).contents.type if t.src[0] else -1
            self.nodes.append((t.name.decode(errors="replace"), int(t.op), int(src0), arr))
        return True


def _ggml_names(op: int, src0_type: int) -> tuple[str, str]:
    """ggml's names of an op and a type (libggml-base)."""
    base = ctypes.CDLL(str(library_path() / "libggml-base.so"))
    base.ggml_op_name.argtypes, base.ggml_op_name.restype = [ctypes.c_int32], ctypes.c_char_p
    base.ggml_type_name.argtypes, base.ggml_type_name.restype = [ctypes.c_int32], ctypes.c_char_p
    return base.ggml_op_name(op).decode(), base.ggml_type_name(src0_type).decode() if src0_type >= 0 else "-"


def _token_axis(alone: np.ndarray, batched: np.ndarray, k: int) -> int | None:
    """The axis that holds the tokens: size 1 alone, k in the k-row decode, every other axis equal."""
    if alone.ndim != batched.ndim:
        return None
    for axis in range(alone.ndim):
        others = [a for a in range(alone.ndim) if a != axis]
        if alone.shape[axis] == 1 and batched.shape[axis] == k and \
                all(alone.shape[a] == batched.shape[a] for a in others):
            return axis
    return None


class Probe:
    """One model, one attention setting, one repack setting; decodes from a fixed token stream."""

    def __init__(self, path, flash_attn: str = "on", repack: bool = True, n_threads: int = 1,
                 n_ctx: int = 2048, seed: int = 0, n_gpu_layers: int = 0, cache_type: str = "f16",
                 n_seq_max: int = 1) -> None:
        self.path = path
        self.flash_attn, self.repack = flash_attn, repack
        self.recorder = _NodeRecorder()
        self.model = Model(path, repack=repack, n_gpu_layers=n_gpu_layers)
        self.ctx = Context(self.model, ContextParams(n_ctx=n_ctx * n_seq_max, n_threads=n_threads, flash_attn=flash_attn,
                                                     type_k=cache_type, type_v=cache_type, n_seq_max=n_seq_max,
                                                     n_batch=1024, n_ubatch=1024),  # a whole prompt is one op
                           eval_callback=self.recorder.callback)
        self.batch = Batch(self.ctx)
        self.batch_other = Batch(self.ctx)  # another sequence's prefix, while self.batch is being filled
        rng = np.random.default_rng(seed)
        n_vocab = self.model.n_vocab
        self.tokens = [int(t) for t in rng.integers(min(1000, n_vocab // 2), n_vocab - 1, n_ctx * n_seq_max)]

    def close(self) -> None:
        self.batch_other.close()
        self.batch.close()
        self.ctx.close()
        self.model.close()

    def _prefill(self, n: int, chunk: int | None = None) -> None:
        self.ctx.drop_sequence(0)
        chunk = chunk or self.ctx.n_batch
        for p0 in range(0, n, chunk):
            self.ctx.decode(self.batch.clear().add_tokens(self.tokens[p0:min(n, p0 + chunk)], p0, outputs="none"))

    def _one(self, pos: int) -> np.ndarray:
        self.ctx.decode(self.batch.clear().add_tokens([self.tokens[pos]], pos))
        return self.ctx.logits()[0]

    def _alone(self, fill: int, n: int) -> list[np.ndarray]:
        """The logits of tokens fill .. fill + n - 1 decoded one at a time after `fill` cells."""
        self._prefill(fill)
        return [self._one(fill + j) for j in range(n)]

    def rows(self, fill: int, ks: tuple[int, ...]) -> list[RowDiff]:
        """Every row of k-row decodes after `fill` cells against the same tokens decoded alone."""
        alone = self._alone(fill, max(ks))
        out = []
        for k in ks:
            self.ctx.remove(fill)
            self.ctx.decode(self.batch.clear().add_tokens(self.tokens[fill:fill + k], fill, outputs="all"))
            logits = self.ctx.logits()
            out += [RowDiff(fill, k, j, float(np.max(np.abs(logits[j] - alone[j])))) for j in range(k)]
        return out

    def neighbours(self, fill: int, ks: tuple[int, ...], others: int) -> list[RowDiff]:
        """Every row of k-row decodes of sequence 0 in one batch with `others` rows of each other
        sequence (each after its own prefix of other tokens) against the same tokens alone."""
        n_seq = self.ctx.n_seq_max
        alone = self._alone(fill, max(ks))
        out = []
        for k in ks:
            self.ctx.remove(fill)
            self.batch.clear().add_tokens(self.tokens[fill:fill + k], fill, outputs="all")
            for seq in range(1, n_seq):
                start = fill + max(ks) + seq * (fill + others)  # tokens of their own, after sequence 0's
                self.ctx.drop_sequence(seq)
                self.ctx.decode(self.batch_other.clear().add_tokens(self.tokens[start:start + fill], 0, seq_id=seq, outputs="none"))
                self.batch.add_tokens(self.tokens[start + fill:start + fill + others], fill, seq_id=seq, outputs="all")
            self.ctx.decode(self.batch)
            logits = self.ctx.logits()
            out += [RowDiff(fill, k, j, float(np.max(np.abs(logits[j] - alone[j]))), others * (n_seq - 1))
                    for j in range(k)]
        for seq in range(1, n_seq):
            self.ctx.drop_sequence(seq)
        return out

    def chunks(self, n: int, sizes: tuple[int, ...]) -> list[tuple[int, float]]:
        """A prompt of n tokens prefilled one token at a time vs in chunks of each size (n: whole),
        then one token decoded after it."""
        self._prefill(n, 1)
        whole = self._one(n)
        out = []
        for size in sizes:
            self._prefill(n, size)
            out.append((size, float(np.max(np.abs(self._one(n) - whole)))))
        return out

    def first_node(self, fill: int, k: int, row: int) -> NodeDiff | None:
        """The first node whose `row` differs between a k-row decode and that token alone."""
        self._prefill(fill)
        for pos in range(fill, fill + row):  # the cache plain decoding leaves
            self._one(pos)
        self.recorder.nodes, self.recorder.on = [], True
        try:
            self._one(fill + row)
            alone = self.recorder.nodes
            self.ctx.remove(fill)
            self.recorder.nodes = []
            self.ctx.decode(self.batch.clear().add_tokens(self.tokens[fill:fill + k], fill, outputs="all"))
            batched = self.recorder.nodes
        finally:
            self.recorder.on = False
        # the two graphs hold the same nodes in the same order (llama.cpp names several nodes
        # alike, e.g. every step of "Kcur-0"): pair them by place, skipping any that do not pair
        for (name, op, src0, arr), (name_b, op_b, _s, other) in zip(alone, batched):
            if name != name_b or op != op_b:
                continue
            axis = _token_axis(arr, other, k)
            if axis is None:
                continue
            mine, theirs = np.take(arr, 0, axis=axis), np.take(other, row, axis=axis)
            diff = float(np.max(np.abs(mine - theirs))) if mine.size else 0.0
            if diff != 0.0 or np.isnan(diff):
                return NodeDiff(name, *_ggml_names(op, src0), diff)
        return None


def probe(path, flash_attn: str, repack: bool, fills=(3, 40), ks=(2, 4, 8, 16), chunk_sizes=(7, 64, 128),
          n_threads: int = 1, locate: bool = True, prompt: int = 200, n_gpu_layers: int = 0,
          cache_type: str = "f16", neighbours: int = 0) -> ProbeReport:
    """Rows, chunks and (where a row differs) the first differing node, for one model and setting;
    `neighbours` > 0: the rows again beside three other sequences' `neighbours` rows each."""
    p = Probe(path, flash_attn=flash_attn, repack=repack, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
              cache_type=cache_type, n_seq_max=4 if neighbours else 1)
    try:
        report = ProbeReport(str(path), flash_attn, repack, batch_invariant())
        for fill in fills:
            report.rows += p.rows(fill, ks)
            if neighbours:
                report.rows += p.neighbours(fill, ks, neighbours)
        if chunk_sizes:
            report.chunks = p.chunks(prompt, tuple(prompt if c == "whole" else c for c in chunk_sizes))
        worst = next((r for r in report.rows if not r.identical), None)
        if locate and worst is not None:
            report.node = p.first_node(worst.fill, worst.k, worst.row)
        return report
    finally:
        p.close()


def model_arguments(ap, what: str, settings: str) -> None:
    """The probe scripts' shared flags (scripts/batch_variance.py, invariance_cost.py): the
    models (--pair, -m), the attention and repack settings (`settings`: their default, in words)."""
    from pathlib import Path  # noqa: PLC0415 (only the scripts need it)

    ap.add_argument("--pair", action="append", default=[], help=f"a pair of models.toml (its target is {what})")
    ap.add_argument("-m", "--model", action="append", default=[], type=Path, help="a GGUF file")
    ap.add_argument("--fa", action="append", choices=("on", "off"), help=f"attention setting(s) (default {settings})")
    ap.add_argument("--repack", action="append", choices=("on", "off"), help=f"repack setting(s) (default {settings})")


def model_paths(ap, args) -> list:
    """The files `model_arguments` named (a pair's target, or -m), or the parser's error."""
    from ggspec.catalogue.pairs import get_entry, resolve  # noqa: PLC0415

    paths = [resolve(get_entry(name)).target for name in args.pair] + list(args.model)
    if not paths:
        ap.error("name a model with --pair or -m")
    return paths
