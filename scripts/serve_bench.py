#!/usr/bin/env python3
"""ggspec serve against llama-server of the same patched build, side by side in one run.

    python scripts/serve_bench.py --pair tiny-coder            # concurrency 1,2,4,8; -np 8
    python scripts/serve_bench.py --pair tiny-coder --spec-type ngram-mod --spec-args "--spec-ngram-mod-n-match 4"
    python scripts/serve_bench.py --pair tiny-coder --body '{"grammar": "root ::= [^\\x00]*"}'   # every request constrained

Four servers with the same pair, slots (-np), context, cache types, threads and draft length:
ggspec speculative, llama-server speculative (`--spec-type` as given, draft-dflash by default: the
same type and `--spec-args` on both; the n-gram types without the pair's draft), ggspec plain
(--no-spec) and llama-server plain; each alone on the machine on a free loopback port, one after
the other, the order alternating between the --reps repetitions. Each gets a warm-up, then at every
concurrency `--requests-per-client` x concurrency streamed greedy completions of the built-in
bench prompts, `--max-tokens` each (ignore_eos: every request makes exactly that many). Reported
per row (the median of the repetitions): aggregate generated tokens/s, its ratio to llama-server's
speculative throughput, the median (and range) of the paired ratios (each repetition's run over
llama-server's speculative run of the same repetition), TTFT and time per output token (TPOT)
p50/p99, the draft acceptance rate (ggspec's from /metrics, llama-server's from its log), and
whether every output equals the same prompt's output from ggspec's plain server alone (the
lossless check), each difference classified by the target's own top-2 margin where the texts part:
a near-tie (below 0.2 nat: the servers batch differently and llama.cpp's arithmetic depends on the
batch) or a REAL divergence.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from ggspec.bench.native import find_tool
from ggspec.bench.prompts import BUILTIN
from ggspec.bench.serving import NotReady, free_port, run_load, solo, wait_ready
from ggspec.catalogue.pairs import get_entry, resolve
from ggspec.speculative.types import registry

console = Console(stderr=True)


def start(cmd: list[str], url: str, env: dict, log: Path) -> subprocess.Popen:
    """A server whose output goes to `log` (a pipe nobody reads would fill up and stop
    llama-server, which logs every request)."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(url, proc)
    except NotReady as exc:
        proc.kill()
        raise SystemExit(f"{Path(cmd[0]).name}: {exc}: {log.read_text()[-2000:]}") from None
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def commands(args, target: Path, draft: Path, port: int) -> dict[str, list[str]]:
    common = ["-np", str(args.parallel), "-c", str(args.ctx), "-t", str(args.threads), "-ctk", args.ctk,
              "-ctv", args.ctv, "-fa", "off", "--port", str(port), "--host", "127.0.0.1"]
    ggspec = [sys.executable, "-m", "ggspec.cli", "serve", "-m", str(target), "--no-ui", *common]
    server = [str(find_tool("llama-server")), "-m", str(target), *common, "-tb", str(args.threads),
              "--no-webui"]
    spec = ["--spec-type", args.spec_type, "--spec-draft-n-max", str(args.n_max), *args.spec_args.split()]
    md = [] if registry.text_only(args.spec_type) else ["-md", str(draft)]
    return {
        "ggspec spec": [*ggspec, *md, *spec],
        "llama-server spec": [*server, *md, *spec, "-td", str(args.threads), "-tbd", str(args.threads)],
        "ggspec plain": [*ggspec, "--no-spec"],
        "llama-server plain": server,
    }


def metric(url: str, name: str) -> float:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return float("nan")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


_LLAMA_ACCEPT = re.compile(r"draft acceptance = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)")


def drafted(url: str, log: Path) -> tuple[float, float]:
    """(accepted, drafted) draft tokens so far: ggspec's from /metrics, llama-server's from the
    per-request lines of its log."""
    acc = metric(url, "ggspec:spec_decode_num_accepted_tokens_total")
    if not math.isnan(acc) and acc > 0:  # a ggspec server with drafts
        return acc, metric(url, "ggspec:spec_decode_num_draft_tokens_total")
    found = _LLAMA_ACCEPT.findall(log.read_text(errors="replace")) if log.is_file() else []
    return float(sum(int(a) for a, _ in found)), float(sum(int(g) for _, g in found))


def paired(tps_runs: list[float], ref_runs: list | None) -> dict | None:
    """The median and range of run-by-run ratios to llama-server's speculative run of the same
    repetition. The two ran minutes apart at most, so the machine's slow drift (runs of one server
    spread 15-25 % here) cancels in each ratio, which the ratio of two medians does not do."""
    if not ref_runs:
        return None
    ratios = sorted(t / ref.throughput for t, ref in zip(tps_runs, ref_runs) if ref.throughput > 0)
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1],
            "ratios": [round(x, 3) for x in ratios]}


def _rate(runs: list[tuple[float, float]]) -> float | None:
    acc, gen = sum(a for a, _ in runs), sum(g for _, g in runs)
    return acc / gen if gen else None


def divergence_kinds(target: Path, prompts: list[str], refs: list[str], replies, args) -> dict:
    """(prompt index, text) -> "near-tie" or "REAL" for every output that differs from its solo
    reference. The oracle is plain greedy decoding in-process, with the target's top-2 margin of
    every token: of the two texts, the one that leaves that decode first does so at a token whose
    margin says which it is (below the 0.2-nat gate: a near-tie, where the servers' batching,
    which llama.cpp's arithmetic depends on, may tip it either way)."""
    from ggspec.runtime import ContextParams
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.driver import generate_greedy
    from ggspec.speculative.models import PairConfig
    from ggspec.speculative.lossless import TIE_MARGIN

    differ = {(r.index, r.text) for r in replies if r.text != refs[r.index]}
    if not differ:
        return {}
    kinds = {}
    cfg = PairConfig(target, ctx=ContextParams(n_ctx=args.ctx, n_threads=args.threads, flash_attn="off"))
    with Engine.open(cfg, plain=True) as engine:
        model = engine.target_model
        oracle = {}
        for index in sorted({i for i, _ in differ}):
            steps = list(generate_greedy(engine, model.tokenize(prompts[index]), args.max_tokens, record_margins=True))
            oracle[index] = ([t for st in steps for t in st.tokens], [m for st in steps for m in st.margins])

        def leaves(text: str, index: int) -> int | None:
            """The first oracle token the text does not continue with (None: the text is the oracle's)."""
            tokens, _ = oracle[index]
            want, have = text.encode(), b""
            for j, t in enumerate(tokens):
                have += model.token_bytes(t)
                if not want.startswith(have):
                    return j
            return None if have == want else len(tokens) - 1

        for index, text in differ:
            tokens, margins = oracle[index]
            points = [j for j in (leaves(refs[index], index), leaves(text, index)) if j is not None]
            margin = margins[min(points)] if points and min(points) < len(margins) else None
            kinds[(index, text)] = "near-tie" if margin is not None and margin < TIE_MARGIN else "REAL"
    return kinds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny-coder")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("-np", "--parallel", type=int, default=8)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-ctk", default="f16")
    ap.add_argument("-ctv", default="f16")
    ap.add_argument("--n-max", type=int, default=7)
    ap.add_argument("--spec-type", default="draft-dflash", help="llama.cpp's --spec-type, for both servers")
    ap.add_argument("--spec-args", default="", help="more speculative flags for both servers, e.g. n-gram sizes")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--body", default="{}", help="more request fields for every request (JSON), e.g. a grammar: "
                                                 "'{\"grammar\": \"root ::= [a-z ]*\"}'")
    ap.add_argument("--requests-per-client", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3, help="runs of each (server, concurrency), interleaved; the median is shown")
    ap.add_argument("--only", help="comma list of servers to run (default: all four)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "ggspec-serve-bench",
                    help="the servers' output files")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a request may take before it counts as an error")
    args = ap.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)

    files = resolve(get_entry(args.pair))
    if files.draft is None and not registry.text_only(args.spec_type):
        raise SystemExit(f"pair {args.pair} has no draft for --spec-type {args.spec_type}")
    levels = [int(c) for c in args.concurrency.split(",")]
    prompts = [p.text for p in BUILTIN]
    try:
        body = json.loads(args.body)
    except json.JSONDecodeError as exc:
        sys.exit(f"error: --body is not JSON: {exc}")
    if not isinstance(body, dict):
        sys.exit("error: --body must be a JSON object of request fields")
    extra = {"ignore_eos": True, **body}
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    names = list(commands(args, files.target, files.draft, 0))
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    # one server at a time, alone on the machine; the order alternates between repetitions so
    # the machine's drift falls on every server alike
    loads: dict[tuple[str, int], list] = {}
    accept: dict[tuple[str, int], list[tuple[float, float]]] = {}  # (accepted, drafted) per run
    refs = None
    for rep in range(args.reps):
        order = names if rep % 2 == 0 else names[::-1]
        if refs is None:
            order = ["ggspec plain", *[n for n in order if n != "ggspec plain"]]
        for name in order:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = commands(args, files.target, files.draft, port)[name]
            if rep == 0:
                console.print(f"[bold]{name}[/]: {' '.join(Path(c).name if i == 0 else c for i, c in enumerate(cmd))}",
                              soft_wrap=True)
            log = args.logs / f"{name.replace(' ', '-')}.log"
            proc = start(cmd, url, env, log)
            try:
                if refs is None:
                    refs = [r.text for r in solo(url, prompts, args.max_tokens, extra)]
                if name not in names:
                    continue
                run_load(url, prompts, clients=max(levels), requests=2 * max(levels), max_tokens=args.max_tokens,
                         extra=extra)  # warm-up
                for c in levels:
                    before = drafted(url, log)
                    load = run_load(url, prompts, clients=c, requests=args.requests_per_client * c,
                                    max_tokens=args.max_tokens, extra=extra, timeout=args.timeout)
                    after = drafted(url, log)
                    loads.setdefault((name, c), []).append(load)
                    accept.setdefault((name, c), []).append((after[0] - before[0], after[1] - before[1]))
                    console.print(f"  rep {rep + 1} {name} c={c}: {load.throughput:.0f} t/s, errors {len(load.errors)}")
            finally:
                stop(proc)
    kinds = divergence_kinds(files.target, prompts, refs, [r for runs in loads.values() for run in runs
                                                          for r in run.replies if not r.error], args)
    rows = []
    for (name, c), runs in loads.items():
        best = sorted(runs, key=lambda x: x.throughput)[len(runs) // 2]  # the median run
        replies = [r for run in runs for r in run.replies]
        same = sum(r.text == refs[r.index] for r in replies if not r.error)
        differ = [kinds[(r.index, r.text)] for r in replies if not r.error and r.text != refs[r.index]]
        ties, real = differ.count("near-tie"), differ.count("REAL")
        rows.append({"server": name, "concurrency": c, "requests": len(replies),
                     "errors": sum(len(run.errors) for run in runs),
                     "tps": best.throughput, "tps_runs": [round(run.throughput, 1) for run in runs],
                     "ttft_p50_ms": 1e3 * best.percentile("ttft", 50), "ttft_p99_ms": 1e3 * best.percentile("ttft", 99),
                     "tpot_p50_ms": 1e3 * best.percentile("tpot", 50), "tpot_p99_ms": 1e3 * best.percentile("tpot", 99),
                     "accept": _rate(accept[(name, c)]),
                     "equal_to_solo": f"{same}/{len(replies)}" + (f" ({ties} near-tie, {real} REAL)" if differ else ""),
                     "near_ties": ties, "real_divergences": real})
    ref = {r["concurrency"]: r["tps"] for r in rows if r["server"] == "llama-server spec"}
    for r in rows:  # each repetition against llama-server's run of the same repetition
        r["paired"] = paired(r["tps_runs"], loads.get(("llama-server spec", r["concurrency"])))
    table = Table(title=f"{args.pair}: {args.spec_type} {args.spec_args}, -np {args.parallel}, -c {args.ctx}, "
                        f"-t {args.threads}, n_max {args.n_max}, "
                        f"{args.max_tokens} tokens per request, greedy")
    for col in ("server", "conc.", "t/s", "× llama-server spec", "paired × (min-max)", "TTFT p50/p99 ms",
                "TPOT p50/p99 ms", "accept", "errors", "= solo"):
        table.add_column(col, justify="left" if col == "server" else "right")
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["server"])):
        x = r["tps"] / ref[r["concurrency"]] if ref.get(r["concurrency"]) else float("nan")
        pr = r["paired"]
        table.add_row(r["server"], str(r["concurrency"]), f"{r['tps']:.0f}", f"{x:.2f}",
                      f"{pr['median']:.2f} ({pr['min']:.2f}-{pr['max']:.2f})" if pr else "",
                      f"{r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f}", f"{r['tpot_p50_ms']:.2f} / {r['tpot_p99_ms']:.2f}",
                      "" if r["accept"] is None else f"{100 * r['accept']:.1f}%", str(r["errors"]), r["equal_to_solo"])
    Console(width=170).print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
