#!/usr/bin/env python3
"""Multi-turn agent replays against `ggspec serve` and llama-server of the same build, side by side.

    python scripts/agent_replay.py --pair gemma-3-270m                 # 20 turns, 1 and 4 clients
    python scripts/agent_replay.py --pair gemma-3-270m --clients 1 --turns 24 --reps 3

A conversation is what a coding agent sends: each user turn hands the model a tool's output (a
function read from a file of CPython's standard library, or the same file read again) and asks
for it back, edited or unchanged, or for the model's own earlier answer again with a change; each
answer joins the conversation, so later turns re-read tool output and earlier answers. Every
request is a chat completion of the whole conversation so far (the server's chat template, its
prompt cache), greedy. `--clients` conversations run at once, each over its own module's
functions. Four servers, each alone on the machine, one after the other (the order alternating
between repetitions): ggspec serve with no drafting flags (a lone model drafts with `suffix`),
llama-server with `--spec-type ngram-mod` (llama.cpp's text drafter for servers), ggspec
`--no-spec` and plain llama-server. Reported per server and client count: generated tokens per
second over the whole replay (the median repetition), its ratio to each llama-server, the paired
ratios, the acceptance, and how many answers equal ggspec plain's answer to the same turn; and
where the time went, from each answer's `timings` (both servers send llama-server's): prompt
tokens decoded per turn, seconds decoding prompts, seconds generating, and the rest of the
client's wall time (HTTP, chat template, queueing, detokenizing, Python).

    python scripts/agent_replay.py --pair dummy-qwen3.5-0.8b --clients 1 --only "ggspec plain,llama-server plain"
    python scripts/agent_replay.py --stall                 # a 4,000-token prompt beside 3 streams

A hybrid target (`dummy-qwen3.5-0.8b`: Qwen3.5-0.8B's shape, random weights, `ggspec models make`)
shows whether each turn decodes only its new tokens. `--stall`: three streams generate while a
long prompt arrives; reported per server: the longest gap between two tokens of a stream while
the prompt was decoded, and the long prompt's time to its first token. llama-server runs as
upstream ships it (GGML_CPU_BATCH_INVARIANT=0: the exact kernels are ggspec's); `--identity` keeps
them, so its greedy answers can be compared with ggspec's byte for byte (the "= plain answers"
column).

    python scripts/agent_replay.py --clients 1 --identity --only "ggspec plain,llama-server plain" --reps 1
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import itertools
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from ggspec.bench.native import find_tool
from ggspec.bench.serving import free_port
from ggspec.catalogue.pairs import get_entry, resolve
from serve_bench import drafted, start, stop  # noqa: E402 (scripts/ is on the path when run as a script)

console = Console(stderr=True)

MODULES = ["textwrap", "shlex", "fnmatch", "string", "calendar", "queue", "heapq", "bisect", "statistics",
           "glob", "difflib", "base64", "html", "gettext", "posixpath", "urllib.parse"]
ASKS = ["Return `{name}` whole, with type hints added to its signature.",
        "Now return your previous version again, with its comments removed and nothing else changed.",
        "Here is the file again. Return `{name}` exactly as it is in the file, unchanged.",
        "Return your version from two turns ago again, exactly as you wrote it."]
SERVERS = ("ggspec default", "llama-server ngram-mod", "ggspec plain", "llama-server plain")


def functions() -> list[tuple[str, str, str]]:
    """The standard library's functions of 8-40 lines from MODULES, in order: (file, name, source)."""
    found = []
    for module in MODULES:
        mod = importlib.import_module(module)
        path = Path(inspect.getsourcefile(mod)).name
        for name, fn in sorted(vars(mod).items()):
            if inspect.isfunction(fn) and fn.__module__ == mod.__name__ and not name.startswith("__"):
                try:
                    src = textwrap.dedent(inspect.getsource(fn))
                except OSError:  # (made at run time: no source)
                    continue
                if 8 <= src.count("\n") <= 40:
                    found.append((path, name, src))
    return found


def conversations(count: int, n: int) -> list[list[str]]:
    """The user messages of `count` conversations of n turns: per function, four turns (ASKS),
    the tool's output (the function as read from its file) in the first and the third; each
    conversation over functions of its own."""
    pool, per = functions(), (n + 3) // 4
    out = []
    for j in range(count):
        users = []
        for path, name, src in pool[j * per:(j + 1) * per]:
            tool = f"Tool output (read_file {path}, `{name}`):\n```python\n{src}```\n\n"
            users += [(tool if i in (0, 2) else "") + ask.format(name=name) for i, ask in enumerate(ASKS)]
        out.append(users[:n])
    return out


@dataclass
class Replay:
    """One conversation's answers, the tokens they took and each turn's timings."""

    answers: list[str] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None
    # per turn: prompt tokens decoded, cached, ms decoding the prompt, ms generating, client wall ms
    turns: list[dict] = field(default_factory=list)


def chat(url: str, messages: list[dict], max_tokens: int, timeout: float) -> tuple[str, int, dict]:
    """One greedy chat completion: its text, tokens and the turn's timings."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "cache_prompt": True}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        doc = json.load(r)
    wall_ms = (time.perf_counter() - t0) * 1e3
    t = doc.get("timings") or {}
    turn = {"prompt_n": int(t.get("prompt_n", 0)), "cache_n": int(t.get("cache_n", 0)),
            "prompt_ms": float(t.get("prompt_ms", 0.0)), "predicted_ms": float(t.get("predicted_ms", 0.0)),
            "wall_ms": wall_ms}
    return doc["choices"][0]["message"]["content"] or "", int(doc["usage"]["completion_tokens"]), turn


def replay(url: str, users: list[str], max_tokens: int, timeout: float) -> Replay:
    out, messages = Replay(), []
    try:
        for text in users:
            messages.append({"role": "user", "content": text})
            answer, n, turn = chat(url, messages, max_tokens, timeout)
            messages.append({"role": "assistant", "content": answer})
            out.answers.append(answer)
            out.tokens += n
            out.turns.append(turn)
    except OSError as exc:  # (an HTTPError is one: its body says why)
        body = exc.read().decode(errors="replace")[:200] if hasattr(exc, "read") else ""
        out.error = f"{exc} {body}".strip()
    return out


def run(url: str, conversations: list[list[str]], max_tokens: int, timeout: float) -> tuple[list[Replay], float]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(conversations)) as pool:
        done = list(pool.map(lambda users: replay(url, users, max_tokens, timeout), conversations))
    return done, time.perf_counter() - t0


def commands(args, target: Path, port: int) -> dict[str, list[str]]:
    # -c is every slot's together, on both servers
    common = ["-np", str(args.parallel), "-c", str(args.ctx * args.parallel), "-t", str(args.threads), "-fa", args.fa,
              "--port", str(port), "--host", "127.0.0.1", *(["--swa-full"] if args.swa_full else [])]
    ggspec = [sys.executable, "-m", "ggspec.cli", "serve", "-m", str(target), "--no-ui", *common]
    server = [str(find_tool("llama-server")), "-m", str(target), *common, "--jinja", "--no-webui",
              "-tb", str(args.threads)]
    return {"ggspec default": ggspec, "llama-server ngram-mod": [*server, "--spec-type", "ngram-mod"],
            "ggspec plain": [*ggspec, "--no-spec"], "llama-server plain": server}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="gemma-3-270m")
    ap.add_argument("--clients", default="1,4", help="conversations at once, a comma list")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-c", "--ctx", type=int, default=8192, help="context per slot")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--only", help="comma list of servers to run (default: all four)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "ggspec-agent-replay")
    ap.add_argument("-fa", "--flash-attn", dest="fa", default="off", help="on, off or auto, for both servers")
    ap.add_argument("--stall", action="store_true", help="the stall scenario instead of the replay")
    ap.add_argument("--solo", action="store_true",
                    help="after each run of several clients, replay each conversation alone on the same server and "
                         "count the answers equal to the ones it gave beside the others")
    ap.add_argument("--swa-full", action="store_true", help="both servers keep every cell of a sliding-window "
                                                             "target (not a window-sized ring)")
    ap.add_argument("--identity", action="store_true",
                    help="llama-server keeps the build's exact kernels (its answers compared with ggspec plain's: "
                         "an identity check, not a speed comparison)")
    ap.add_argument("--stall-prompt", type=int, default=4000, help="tokens (about) of the stall's long prompt")
    args = ap.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    target = resolve(get_entry(args.pair)).target
    if args.stall:
        return stall_main(args, target)
    levels = [int(c) for c in args.clients.split(",")]
    convs = conversations(max(levels), args.turns)
    names = [n for n in SERVERS if not args.only or n in args.only.split(",")]
    env = server_env(args.identity)
    solo: dict[tuple[str, int], list[tuple[int, int]]] = {}
    results: dict[tuple[str, int], list[tuple[list[Replay], float, tuple[float, float]]]] = {}
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = commands(args, target, port)[name]
            log = args.logs / f"{name.replace(' ', '-')}.log"
            proc = start(cmd, url, env[name.startswith("llama-server")], log)
            try:
                replay(url, ["Say hello."], 8, args.timeout)  # warm-up
                for c in levels:
                    before = drafted(url, log)
                    done, seconds = run(url, convs[:c], args.max_tokens, args.timeout)
                    after = drafted(url, log)
                    results.setdefault((name, c), []).append((done, seconds, (after[0] - before[0], after[1] - before[1])))
                    tokens = sum(r.tokens for r in done)
                    errors = [r.error for r in done if r.error is not None]
                    console.print(f"  rep {rep + 1} {name} c={c}: {tokens / seconds:.1f} t/s ({tokens} tokens, "
                                  f"{seconds:.0f} s), errors {len(errors)}" + (f" (first: {errors[0]})" if errors else ""))
                    if args.solo and c > 1:
                        same, total = solo_equal(url, convs[:c], done, args)
                        solo.setdefault((name, c), []).append((same, total))
                        console.print(f"  rep {rep + 1} {name} c={c}: {same}/{total} answers equal to the same "
                                      f"conversation's alone")
            finally:
                stop(proc)
    rows = _rows(results, levels)
    for r in rows:
        if (r["server"], r["clients"]) in solo:
            pairs = solo[(r["server"], r["clients"])]
            r["equal_to_solo"] = f"{sum(a for a, _ in pairs)}/{sum(b for _, b in pairs)}"
    _table(rows, args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["errors"] == 0 for r in rows) else 1


def solo_equal(url: str, convs: list[list[str]], done: list[Replay], args) -> tuple[int, int]:
    """Each conversation replayed alone on the same server (its cache as the run left it): how many
    of its answers equal the ones it got beside the other clients."""
    same = total = 0
    for users, together in zip(convs, done):
        alone = replay(url, users, args.max_tokens, args.timeout)
        same += sum(a == b for a, b in zip(alone.answers, together.answers))
        total += len(together.answers)
    return same, total


def _rows(results, levels) -> list[dict]:
    rows = []
    for (name, c), runs in results.items():
        tps = [sum(r.tokens for r in done) / s for done, s, _ in runs]
        ref = results.get(("ggspec plain", c))
        same = total = 0
        for i, (done, _, _) in enumerate(runs):
            want = ref[min(i, len(ref) - 1)][0] if ref else done
            for mine, theirs in zip(done, want):
                same += sum(a == b for a, b in zip(mine.answers, theirs.answers))
                total += len(theirs.answers)
        acc, gen = sum(a for _, _, (a, _) in runs), sum(g for _, _, (_, g) in runs)
        rows.append({"server": name, "clients": c, "tps": statistics.median(tps), "tps_runs": [round(t, 2) for t in tps],
                     "accept": acc / gen if gen else None, "equal_to_plain": f"{same}/{total}",
                     "errors": sum(r.error is not None for done, _, _ in runs for r in done),
                     **time_split([r for done, _, _ in runs for r in done], len(runs))})
    for r in rows:
        for other in ("llama-server ngram-mod", "llama-server plain", "ggspec plain"):
            o = next((x for x in rows if x["server"] == other and x["clients"] == r["clients"]), None)
            if o is not None:
                pairs = [a / b for a, b in zip(r["tps_runs"], o["tps_runs"]) if b]
                r[f"x {other}"] = statistics.median(pairs) if pairs else None
    return rows


def time_split(replays: list[Replay], reps: int) -> dict:
    """Where one repetition's time went, summed over its conversations' turns (per repetition):
    prompt tokens decoded and cached, seconds decoding prompts, seconds generating, and the
    rest of the clients' wall time; and the prompt tokens decoded at each turn (the first
    conversation's, first repetition)."""
    turns = [t for r in replays for t in r.turns]
    total = {k: sum(t[k] for t in turns) / reps for k in ("prompt_n", "cache_n", "prompt_ms", "predicted_ms", "wall_ms")}
    return {"prompt_decoded": round(total["prompt_n"]), "prompt_cached": round(total["cache_n"]),
            "prompt_s": total["prompt_ms"] / 1e3, "generate_s": total["predicted_ms"] / 1e3,
            "rest_s": (total["wall_ms"] - total["prompt_ms"] - total["predicted_ms"]) / 1e3,
            "prompt_n_per_turn": [t["prompt_n"] for t in replays[0].turns] if replays else []}


def server_env(identity: bool = False) -> dict[bool, dict]:
    """Each server's environment (True: llama-server's, which runs as upstream ships it, without
    the exact kernels of ggspec's build, unless `identity`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    return {False: env, True: env if identity else {**env, "GGML_CPU_BATCH_INVARIANT": "0"}}


# --- the stall: a long prompt arriving while three streams generate ---------------------------------------

def stream(url: str, prompt: str, max_tokens: int, timeout: float, t_base: float) -> list[float]:
    """One streamed greedy completion: the arrival time of each of its chunks (from t_base)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True, "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter() - t_base)
    return times


def stall(url: str, args) -> dict:
    """Three streams generate; a long prompt arrives once they all have tokens. The longest gap
    between two chunks of a stream while the long prompt waited for its first token, and that
    time to first token."""
    pool = functions()
    long_prompt = "".join(src for _, _, src in pool)[:args.stall_prompt * 3]  # (~3 characters a token)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as ex:
        streams = [ex.submit(stream, url, f"# {name}\n{src}", 400, args.timeout, t0) for _, name, src in pool[:3]]
        time.sleep(3.0)  # (the three are generating)
        t_arrive = time.perf_counter() - t0
        first = ex.submit(stream, url, long_prompt, 4, args.timeout, t0).result()
        times = [f.result() for f in streams]
    t_first = first[0]
    gaps = [b - a for ts in times for a, b in itertools.pairwise(ts) if b > t_arrive and a < t_first]
    return {"ttft_s": t_first - t_arrive, "max_gap_s": max(gaps, default=0.0),
            "gaps_during": len(gaps)}


def stall_main(args, target: Path) -> int:
    env = server_env()
    cmds = {n: c for n, c in commands(args, target, 0).items() if n in ("ggspec plain", "llama-server plain")}
    rows = []
    for rep in range(args.reps):
        for name in list(cmds) if rep % 2 == 0 else list(cmds)[::-1]:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = commands(args, target, port)[name]
            proc = start(cmd, url, env[name.startswith("llama-server")], args.logs / f"stall-{name.replace(' ', '-')}.log")
            try:
                replay(url, ["Say hello."], 8, args.timeout)  # warm-up
                row = {"server": name, "rep": rep, **stall(url, args)}
            finally:
                stop(proc)
            console.print(f"  {row}")
            rows.append(row)
    for name in cmds:
        mine = [r for r in rows if r["server"] == name]
        console.print(f"{name}: longest gap {statistics.median(r['max_gap_s'] for r in mine):.2f} s, "
                      f"time to first token {statistics.median(r['ttft_s'] for r in mine):.2f} s (medians)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def _table(rows, args) -> None:
    table = Table(title=f"{args.pair}: {args.turns}-turn agent replays, -np {args.parallel}, -c {args.ctx} per slot, "
                        f"-t {args.threads}, at most {args.max_tokens} tokens per answer, greedy, {args.reps} reps")
    cols = ("server", "clients", "t/s", "× llama-server ngram-mod", "× llama-server plain", "× ggspec plain",
            "accept", "= plain answers", "= alone", "errors", "prompt tok decoded", "cached", "prompt s", "generate s",
            "rest s")
    for col in cols:
        table.add_column(col, justify="left" if col == "server" else "right")
    for r in sorted(rows, key=lambda r: (r["clients"], SERVERS.index(r["server"]))):
        ratio = [r.get(f"x {o}") for o in ("llama-server ngram-mod", "llama-server plain", "ggspec plain")]
        table.add_row(r["server"], str(r["clients"]), f"{r['tps']:.1f}", *("" if x is None else f"{x:.2f}" for x in ratio),
                      "" if r["accept"] is None else f"{100 * r['accept']:.0f}%", r["equal_to_plain"],
                      r.get("equal_to_solo", ""), str(r["errors"]),
                      str(r["prompt_decoded"]), str(r["prompt_cached"]), f"{r['prompt_s']:.1f}", f"{r['generate_s']:.1f}",
                      f"{r['rest_s']:.1f}")
    Console(width=170).print(table)


if __name__ == "__main__":
    sys.exit(main())
