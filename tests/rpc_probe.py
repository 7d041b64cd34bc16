"""Subprocess side of test_rpc.py. An RPC worker serves one client at a time, and llama.cpp
keeps its connection for the whole process, so every RPC run happens in a process of its own.

    python tests/rpc_probe.py logits TARGET OUT.npy [--rpc A,B -sm tensor|layer]
    python tests/rpc_probe.py own-head TARGET DRAFT --rpc A,B [--mirror]
    python tests/rpc_probe.py stop TARGET --rpc A --stop-at PHASE --worker PGID [--rpc-timeout S]

`stop` sends SIGSTOP to the worker's process group right before PHASE (add: the handshake, load,
context, decode, logits: right after a decode returned, clear, free) and goes on: the watchdog
must end the process (exit 1, one line) within --rpc-timeout.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import replace

import numpy as np

from ggspec.runtime import Batch, Context, ContextParams, Model
from ggspec.runtime.devices import Placement
from ggspec.speculative.proposer import Span
from ggspec.speculative.request import Request
from ggspec.speculative.sequence import Sequence
from ggspec.speculative.types.dflash import DFlashProposer, dflash_info

PROMPT = "def parse(path):\n    with open(path) as f:\n        return [line.split() for line in f]\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["logits", "own-head", "stop"])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--rpc")
    ap.add_argument("-sm", default="none")
    ap.add_argument("--mirror", action="store_true")
    ap.add_argument("--stop-at", choices=STOP_PHASES)
    ap.add_argument("--worker", type=int)
    ap.add_argument("--rpc-timeout", type=float, default=3.0)
    args = ap.parse_args()
    if args.what == "stop":
        return stop(args)
    placement = Placement.parse(args.sm if args.rpc else "none", args.rpc, None, args.mirror)
    ngl = -1 if args.rpc else 0
    # tensor parallelism runs flash attention whatever is asked: compare like with like
    params = ContextParams(n_ctx=512, type_k="f32", type_v="f32", flash_attn="on")
    if args.what == "logits":
        target, out = args.files
        with Model(target, ngl, placement=placement) as m:
            # one snapshot plane, as the engine gives a hybrid target under -sm tensor (see engine.py)
            params = replace(params, n_rs_seq=1 if m.is_recurrent else 0)
        with Model(target, ngl, placement=placement) as m, Context(m, params) as ctx, Batch(ctx) as b:
            tokens = m.tokenize(PROMPT)
            ctx.decode(b.add_tokens(tokens, 0, outputs="all"))
            np.save(out, ctx.logits())
        return
    # own-head: drive the draft directly, past ggspec's own check, to show what llama.cpp does
    target, draft = args.files
    with Model(target, ngl, placement=placement) as tm, Model(draft, ngl, placement=placement) as dm:
        with Context(tm, params) as tctx, Context(dm, params, ctx_other=tctx) as dctx, Batch(tctx) as b:
            proposer = DFlashProposer(tctx, dctx, dflash_info(dm.meta))
            tokens = tm.tokenize(PROMPT)
            tctx.decode(b.add_tokens(tokens, 0, outputs="last"))
            proposer.observe([Span(0, 0, len(tokens), 0)])
            proposer.flush()
            seq = Sequence(0, Request(tokens, 8), id_last=int(tokens[-1]), pos=len(tokens))
            drafts = proposer.propose([seq], 7)[0].tokens
            print("drafts", " ".join(map(str, drafts)))


STOP_PHASES = ("add", "load", "context", "decode", "logits", "clear", "free")


def stop(args) -> int:
    from ggspec.runtime.devices import rpc_device

    placement = Placement.parse("none", args.rpc, None, False, args.rpc_timeout)

    def phase(name: str) -> None:
        sys.stderr.write(f"phase {name}\n")
        sys.stderr.flush()
        if name == args.stop_at:
            os.killpg(args.worker, signal.SIGSTOP)

    phase("add")
    rpc_device(args.rpc, args.rpc_timeout)  # the handshake (Model would do it too)
    phase("load")
    model = Model(args.files[0], -1, placement=placement)
    phase("context")
    ctx = Context(model, ContextParams(n_ctx=512, n_batch=512))
    batch = Batch(ctx)
    tokens = model.tokenize(PROMPT * 4)
    phase("decode")
    ctx.decode(batch.add_tokens(tokens, 0, outputs="all"))
    phase("logits")
    ctx.logits()
    phase("clear")
    ctx.clear()
    batch.clear()
    ctx.decode(batch.add_tokens(tokens[:8], 0, outputs="all"))
    ctx.logits()
    phase("free")
    batch.close()
    ctx.close()
    model.close()
    print("done")
    return 0


def _die(reason: str) -> None:
    """As the CLI does: one error line and exit 1 when llama.cpp cannot go on (ggspec.fatal)."""
    sys.stderr.write(f"error: {reason}\n")
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    from ggspec import fatal

    fatal.set_handler(_die)
    sys.exit(main())
