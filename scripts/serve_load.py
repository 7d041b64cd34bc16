#!/usr/bin/env python3
"""A bounded load test of an OpenAI-compatible server: N concurrent streaming clients, M requests.

    python scripts/serve_load.py --serve "--pair tiny-coder -np 8" --clients 8 --requests 200
    python scripts/serve_load.py --url http://127.0.0.1:8080 --pid 1234 ...   # a running server

With --serve it starts `ggspec serve` on a free loopback port and stops it at the end (SIGTERM,
which must drain and exit 0). First every prompt runs alone on the idle server (the references),
then a warm-up, then the load. It passes (exit 0) when no request failed, every greedy output
equals its prompt's solo output, and the server's resident memory stayed flat after the warm-up
(growth under --rss-slack MiB). Loopback only; it stops by itself.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggspec.bench.prompts import BUILTIN
from ggspec.bench.serving import NotReady, free_port, rss_bytes, run_load, solo, wait_ready


class RssWatch:
    """The largest resident size of a process, sampled every 0.2 s from `start()`."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            self._stop.wait(0.2)

    def start(self) -> RssWatch:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_bytes(self.pid))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--serve", help="start `ggspec serve` with these arguments (a free port is added)")
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--pid", type=int, help="with --url: the server's process id (for its memory)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=None, help="requests before the memory baseline (default 2 per client)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rss-slack", type=float, default=16.0, help="MiB the server may grow after the warm-up")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()

    proc = None
    if args.serve is not None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "ggspec.cli", "serve", *shlex.split(args.serve), "--port", str(port), "--no-ui"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pid = proc.pid
    else:
        url, pid = args.url.rstrip("/"), args.pid
        if not url.startswith(("http://127.", "http://localhost")):
            raise SystemExit("--url: loopback addresses only")
    prompts = [p.text for p in BUILTIN]
    extra = {"ignore_eos": True}
    try:
        try:
            wait_ready(url, proc)
        except NotReady as exc:
            raise SystemExit(str(exc)) from None
        refs = solo(url, prompts, args.max_tokens, extra)
        bad = [r for r in refs if r.error]
        if bad:
            raise SystemExit(f"a solo request failed: {bad[0].error}")
        run_load(url, prompts, clients=args.clients, requests=args.warmup or 2 * args.clients,
                 max_tokens=args.max_tokens, extra=extra)
        rss0 = rss_bytes(pid) if pid else 0
        watch = RssWatch(pid).start() if pid else None
        load = run_load(url, prompts, clients=args.clients, requests=args.requests, max_tokens=args.max_tokens,
                        extra=extra)
        rss1 = watch.stop() if watch else 0
    finally:
        stopped = None
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                stopped = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                stopped = "killed after 60 s"
    differ = [r for r in load.replies if not r.error and r.text != refs[r.index].text]
    growth = (rss1 - rss0) / 2**20
    summary = {
        "requests": len(load.replies), "clients": args.clients, "errors": len(load.errors),
        "outputs_differing_from_solo": len(differ), "tokens": load.tokens, "seconds": round(load.seconds, 2),
        "throughput_tps": round(load.throughput, 1), "ttft_p50_ms": round(1e3 * load.percentile("ttft", 50), 2),
        "ttft_p99_ms": round(1e3 * load.percentile("ttft", 99), 2),
        "tpot_p50_ms": round(1e3 * load.percentile("tpot", 50), 3),
        "tpot_p99_ms": round(1e3 * load.percentile("tpot", 99), 3),
        "rss_after_warmup_mib": round(rss0 / 2**20, 1), "rss_peak_mib": round(rss1 / 2**20, 1),
        "rss_growth_mib": round(growth, 1), "server_exit": stopped,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        for k, v in summary.items():
            print(f"{k:28} {v}")
    for r in load.errors[:3]:
        print(f"error: {r.error}", file=sys.stderr)
    for r in differ[:3]:
        print(f"differs from solo (prompt {r.index}): {r.text!r} != {refs[r.index].text!r}", file=sys.stderr)
    ok = not load.errors and not differ and (not pid or growth < args.rss_slack) and stopped in (None, 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
