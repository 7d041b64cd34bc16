#!/usr/bin/env python3
"""A soak of `ggspec serve`: N clients for M minutes mixing every kind of request, faults included.

    python scripts/soak.py --serve "--pair gemma-3-270m" --clients 8 --minutes 10 --save soak.json
    python scripts/soak.py --serve "--pair tiny-coder -np 4" --clients 4 --minutes 1

It starts the server on a free loopback port, runs the mix (ggspec.bench.soak), checks that no slot
is left busy, stops the server (SIGTERM: it must drain and exit 0), then starts a fresh one and
sends each distinct greedy request alone to it: every greedy answer of the soak must equal its
request's lone answer. Exit 0 when the verdict is clean (no unprovoked error, no difference,
resident memory growth after the first minute ≤ 5 %, no busy slot).
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggspec.bench import soak
from ggspec.bench.serving import free_port, wait_ready


def start(serve_args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ggspec.cli", "serve", *shlex.split(serve_args), "--port", str(port), "--no-ui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, timeout=300)
    return proc, url


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", required=True, help="`ggspec serve` arguments (a quoted string)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds before memory must stay flat")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path, help="write the summary here (JSON)")
    args = ap.parse_args()

    proc, url = start(args.serve)
    try:
        result = soak.run(url, clients=args.clients, seconds=args.minutes * 60, pid=proc.pid, seed=args.seed,
                          warmup_s=min(args.warmup, args.minutes * 60 / 2))
        result.busy_slots_after = soak.busy_slots(url)
        kept = soak.kept(url)
    finally:
        code = stop(proc)
    proc, url = start(args.serve)
    try:
        soak.lone_answers(url, result)
    finally:
        stop(proc)
    summary = {**result.summary(), "server_exit": code, "drafters_kept": kept}
    if code != 0:
        summary["verdict"].append(f"the server exited {code} on SIGTERM")
    print(json.dumps(summary, indent=1))
    if args.save:
        args.save.write_text(json.dumps(summary, indent=1))
    return 0 if not summary["verdict"] else 1


if __name__ == "__main__":
    sys.exit(main())
