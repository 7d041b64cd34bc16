"""Stage 1: the target's own greedy continuations and its layer inputs, written to a work folder.

llama.cpp decodes `parallel` sequences per batch (prompts in one prefill, then one token of every
live sequence per step) with layer-input extraction on, so every position's features come from
the same decodes that chose its tokens. Arrays live in the work folder as memmaps:

    tokens.i32     [n_seq, L]            prompt then continuation (L = prompt_len + gen_len)
    features.f16   [n_seq, L, k * E]     the target's inputs of the k chosen layers, float16 ...
    scales.f32     [n_seq, L, k]         ... each row of each layer scaled to fit (Gemma's residual
                                         stream holds values far beyond float16's 65504)
    data.json      the plan, the target file, the layers, the rows done (resume point)

A sequence that reaches an end-of-generation token stops there (its length is kept).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ggspec.distill.corpus import Text, sample_prompts
from ggspec.errors import InputError

DATA_FILE = "data.json"


@dataclass(frozen=True)
class CapturePlan:
    n_seq: int = 256
    prompt_len: int = 64
    gen_len: int = 160
    parallel: int = 16
    threads: int = 2
    seed: int = 0

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.gen_len


def target_id(path: Path) -> dict:
    """Enough to tell whether a work folder's data came from this target file."""
    st = Path(path).stat()
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    return {"name": Path(path).name, "size": st.st_size, "head_sha256": hashlib.sha256(head).hexdigest()}


@dataclass
class Dataset:
    """The captured arrays of a work folder (memmaps: only the rows used are read)."""

    tokens: np.ndarray  # int32 [n_seq, L]
    features: np.ndarray  # float16 [n_seq, L, k*E]: scaled rows, see `rows`
    scales: np.ndarray  # float32 [n_seq, L, k]
    lengths: np.ndarray  # int32 [n_seq]: valid tokens of each sequence
    prompt_lens: np.ndarray  # int32 [n_seq]
    layers: tuple[int, ...]
    n_done: int

    @classmethod
    def open(cls, work: Path, mode: str = "r") -> Dataset:
        meta = json.loads((work / DATA_FILE).read_text())
        n, L, width = meta["n_seq"], meta["seq_len"], meta["width"]
        return cls(
            tokens=np.memmap(work / "tokens.i32", np.int32, mode, shape=(n, L)),
            features=np.memmap(work / "features.f16", np.float16, mode, shape=(n, L, width)),
            scales=np.memmap(work / "scales.f32", np.float32, mode, shape=(n, L, len(meta["layers"]))),
            lengths=np.asarray(meta["lengths"] + [0] * (n - len(meta["lengths"])), np.int32),
            prompt_lens=np.asarray(meta["prompt_lens"] + [0] * (n - len(meta["prompt_lens"])), np.int32),
            layers=tuple(meta["layers"]), n_done=meta["n_done"],
        )


    def rows(self, seqs, length: int) -> np.ndarray:
        """Float32 features of positions 0..length-1 of the given sequences: [len(seqs), length, k*E]."""
        f = np.asarray(self.features[seqs, :length], dtype=np.float32)
        s = np.asarray(self.scales[seqs, :length], dtype=np.float32)
        k = s.shape[-1]
        return (f.reshape(*f.shape[:-1], k, -1) * s[..., None]).reshape(f.shape)


def encode(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 rows [n, k*E] -> (float16 rows, float32 scales [n, k]): each layer's part of a row
    divided by its largest magnitude / 2^14, so float16 keeps its full relative precision."""
    parts = rows.reshape(len(rows), k, -1)
    scale = np.abs(parts).max(axis=2) / 16384.0
    scale[scale == 0] = 1.0
    return (parts / scale[..., None]).astype(np.float16).reshape(rows.shape), scale.astype(np.float32)


def bytes_needed(plan: CapturePlan, n_layers: int, n_embd: int) -> int:
    return plan.n_seq * plan.seq_len * (4 + 4 * n_layers + 2 * n_layers * n_embd)


def check_disk(work: Path, need: int) -> None:
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot use {work} as the work folder ({exc.strerror or exc})", field="work") from None
    free = shutil.disk_usage(work).free
    if free < need * 1.05:
        raise InputError(f"not enough disk space in {work}: the features need {need / 1e9:.2f} GB, "
                         f"{free / 1e9:.2f} GB free (fewer --sequences or a shorter --gen-len)", field="work")


def _meta(plan: CapturePlan, layers, n_embd: int, target: dict) -> dict:
    return {"plan": asdict(plan), "layers": list(layers), "target": target, "n_seq": plan.n_seq,
            "seq_len": plan.seq_len, "width": len(layers) * n_embd}


def prepare(work: Path, plan: CapturePlan, layers, n_embd: int, target: dict, resume: bool) -> dict:
    """The work folder's metadata: resumed (refused when it was made with other settings) or new."""
    want = _meta(plan, layers, n_embd, target)
    path = work / DATA_FILE
    if resume and path.exists():
        have = json.loads(path.read_text())
        same = {k: have.get(k) for k in want} == want
        if not same:
            raise InputError(f"{work} holds data captured with other settings (target, layers or sizes); "
                             "drop --resume to start over, or use another --work folder", field="resume")
        return have
    check_disk(work, bytes_needed(plan, len(layers), n_embd))
    meta = {**want, "n_done": 0, "lengths": [], "prompt_lens": [], "seconds": 0.0}
    np.memmap(work / "tokens.i32", np.int32, "w+", shape=(plan.n_seq, plan.seq_len)).flush()
    np.memmap(work / "features.f16", np.float16, "w+", shape=(plan.n_seq, plan.seq_len, meta["width"])).flush()
    np.memmap(work / "scales.f32", np.float32, "w+", shape=(plan.n_seq, plan.seq_len, len(layers))).flush()
    path.write_text(json.dumps(meta))
    return meta


def capture(work: Path, target_path: Path, plan: CapturePlan, layers, texts: list[Text],
            resume: bool, on_group=None) -> dict:
    """Fill the work folder (from its resume point); returns its metadata. Prompts are cut from
    `texts` with the target's tokenizer (the same ones again on a resume: same seed). `on_group(done,
    total, tokens)` is called after every group of sequences."""
    from ggspec.runtime import Batch, Context, ContextParams, Model

    with Model(target_path, what="target") as model:
        meta = prepare(work, plan, layers, model.n_embd, target_id(target_path), resume)
        if meta["n_done"] >= plan.n_seq:
            return meta
        bos = model.tokenize("", add_special=True)
        prompts = sample_prompts(texts, lambda s: model.tokenize(s, add_special=False), plan.n_seq,
                                 plan.prompt_len, plan.seed, int(bos[0]) if len(bos) else None)
        ds = Dataset.open(work, "r+")
        P = plan.parallel
        L = -(-plan.seq_len // 256) * 256  # cells per sequence, llama.cpp pads to 256
        params = ContextParams(n_ctx=P * L, n_batch=max(512, P * plan.prompt_len), n_ubatch=512,
                               n_threads=plan.threads, n_seq_max=P, type_k="f16", type_v="f16")
        with Context(model, params, what="target") as ctx, Batch(ctx) as batch:
            ctx.enable_layer_inputs(layers)
            while meta["n_done"] < plan.n_seq:
                t0 = time.time()
                first = meta["n_done"]
                group = prompts[first:first + P]
                part = slice(first, first + len(group))
                lengths, n_new = _generate(ctx, batch, model, group, plan, layers,
                                           ds.tokens[part], ds.features[part], ds.scales[part])
                for a in (ds.tokens, ds.features, ds.scales):
                    a.flush()
                meta["lengths"] += lengths
                meta["prompt_lens"] += [len(p) for p in group]
                meta["n_done"] = first + len(group)
                meta["seconds"] += time.time() - t0
                (work / DATA_FILE).write_text(json.dumps(meta))
                if on_group:
                    on_group(meta["n_done"], plan.n_seq, n_new)
    return meta


def _generate(ctx, batch, model, prompts, plan: CapturePlan, layers, tokens, feats, scales) -> tuple[list[int], int]:
    """One group: prefill every prompt, then greedy steps; writes tokens and features rows."""
    ctx.clear()
    batch.clear()
    for j, p in enumerate(prompts):
        batch.add_tokens(p, 0, seq_id=j, outputs="last")
        tokens[j, :len(p)] = p
    ctx.decode(batch)
    rows, rscale = encode(ctx.layer_inputs(layers, batch.n_tokens), len(layers))
    off = 0
    for j, p in enumerate(prompts):
        feats[j, :len(p)] = rows[off:off + len(p)]
        scales[j, :len(p)] = rscale[off:off + len(p)]
        off += len(p)
    nxt = ctx.argmax_rows()
    pos = [len(p) for p in prompts]
    lengths = [len(p) + plan.gen_len for p in prompts]
    live = list(range(len(prompts)))
    n_new = 0
    for _ in range(plan.gen_len):
        batch.clear()
        still = []
        for k, j in enumerate(live):
            t = int(nxt[k])
            tokens[j, pos[j]] = t
            n_new += 1
            if model.is_eog(t):  # the end token is a label; nothing after it
                lengths[j] = pos[j] + 1
                continue
            batch.add_tokens(np.array([t], np.int32), pos[j], seq_id=j, outputs="all")
            still.append(j)
        if not still:
            break
        ctx.decode(batch)
        rows, rscale = encode(ctx.layer_inputs(layers, batch.n_tokens), len(layers))
        for k, j in enumerate(still):
            feats[j, pos[j]] = rows[k]
            scales[j, pos[j]] = rscale[k]
            pos[j] += 1
        nxt = ctx.argmax_rows()
        live = still
    return lengths, n_new
