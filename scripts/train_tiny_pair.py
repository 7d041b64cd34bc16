"""Train ggspec's built-in tiny pair: a Qwen3 target and a DFlash drafter that really speculate.

    pip install -e '.[train]'
    python scripts/train_tiny_pair.py --out models/tiny          # ~20 min on one CPU thread
    python scripts/train_tiny_pair.py --out /tmp/smoke --smoke   # seconds: checks the pipeline

Corpus: the running interpreter's stdlib sources (every 16th file held out). Tokenizer: a 1k
byte-level BPE with Qwen2's pre-tokenizer. Target: 4-layer qwen3, hidden 128. Drafter: 2-layer
DFlash, block 8, trained on the target's own greedy continuations and layer inputs.
Same seed and thread count -> byte-identical GGUF files (printed with their sha256).
After export, the script checks the GGUFs in the patched llama.cpp against PyTorch (logits and
draft proposals) when a ggspec build is available.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tinypair import corpus, export  # noqa: E402
from tinypair import tokenizer as tk  # noqa: E402
from tinypair.model import DraftConfig, TargetConfig  # noqa: E402
from tinypair.train import deterministic, evaluate, greedy_continuations, log, train_draft, train_target  # noqa: E402

from ggspec.files import file_sha256  # noqa: E402

TARGET_FILE = "tiny-coder.gguf"
DRAFT_FILE = "tiny-coder-dflash-b8.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("models/tiny"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the bytes depend on it)")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--target-steps", type=int, default=700)
    ap.add_argument("--draft-steps", type=int, default=3000)
    ap.add_argument("--n-seq", type=int, default=1536, help="target continuations for the drafter")
    ap.add_argument("--smoke", action="store_true", help="a few steps of everything (pipeline check)")
    ap.add_argument("--no-check", action="store_true", help="skip the llama.cpp parity check")
    args = ap.parse_args()

    deterministic(args.threads)
    t_start = time.time()

    plan = dict(target_steps=args.target_steps, draft_steps=args.draft_steps, n_seq=args.n_seq,
                batch=32, seq=256, prompt_len=64, gen_len=192)
    if args.smoke:
        plan.update(target_steps=3, draft_steps=3, n_seq=4, batch=4, seq=64, gen_len=32)

    train_files, held_files = corpus.split(corpus.stdlib_files())
    train_texts = corpus.read_texts(train_files)
    tok = tk.train_tokenizer(train_texts, args.vocab)
    vocab = tk.vocab_of(tok)
    train_ids = tk.encode(tok, train_texts, vocab.eos)
    held_ids = tk.encode(tok, corpus.read_texts(held_files), vocab.eos)
    log(f"corpus: {len(train_files)} train files ({len(train_ids)} tokens), {len(held_files)} held out "
        f"({len(held_ids)} tokens); vocab {len(vocab.tokens)}")

    tcfg = TargetConfig(n_vocab=len(vocab.tokens))
    target = train_target(tcfg, train_ids, plan["target_steps"], plan["batch"], plan["seq"],
                          lr=3e-3, seed=args.seed, log=log)
    val = evaluate(target, held_ids, plan["seq"])
    log(f"target held-out loss {val:.3f}")

    dcfg = DraftConfig()
    seqs, feats = greedy_continuations(target, train_ids, plan["n_seq"], plan["prompt_len"], plan["gen_len"],
                                       batch=64, seed=args.seed + 1, layers=dcfg.target_layers, log=log)
    draft = train_draft(target, dcfg, seqs, feats, plan["draft_steps"], batch=16, anchors_per_seq=8,
                        first_anchor=plan["prompt_len"] - 1, lr=3e-3, gamma=4.0, mask_id=vocab.mask,
                        seed=args.seed + 2, log=log)

    args.out.mkdir(parents=True, exist_ok=True)
    target_path, draft_path = args.out / TARGET_FILE, args.out / DRAFT_FILE
    export.write_target(target_path, target, vocab, f"ggspec tiny-coder target (seed {args.seed})")
    export.write_draft(draft_path, draft, vocab, f"ggspec tiny-coder DFlash drafter (seed {args.seed})")
    report = {
        "seed": args.seed, "threads": args.threads, "torch": torch.__version__,
        "python_stdlib_files": len(train_files) + len(held_files),
        "train_tokens": int(len(train_ids)), "heldout_loss": round(val, 4), "plan": plan,
        "target": asdict(tcfg), "draft": asdict(replace(dcfg)),
        "minutes": round((time.time() - t_start) / 60, 1),
        "files": {p.name: {"sha256": file_sha256(p), "bytes": p.stat().st_size} for p in (target_path, draft_path)},
    }
    (args.out / "train.json").write_text(json.dumps(report, indent=2) + "\n")
    for p in (target_path, draft_path):
        log(f"{p}  {p.stat().st_size} bytes  sha256 {file_sha256(p)}")

    if not args.no_check:
        from tinypair.parity import check

        check(target, draft, target_path, draft_path, held_ids, log)
    log(f"done in {report['minutes']} min")


if __name__ == "__main__":
    main()
