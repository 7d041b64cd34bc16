"""PNG plots of a benchmark document (matplotlib, headless), written next to its JSON file.

  <stem>-decode.png      decode t/s per configuration (category 'all'), ± sd, baselines marked
  <stem>-acceptance.png  accepted-count histogram and per-position acceptance per configuration
"""

from __future__ import annotations

from pathlib import Path

from ggspec.errors import InputError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise InputError("plots need matplotlib: pip install 'ggspec[plot]' (or pass --no-plot)") from None
    matplotlib.use("Agg")  # headless: no display needed
    import matplotlib.pyplot as plt

    return plt


def write_plots(doc: dict, json_path: Path) -> list[Path]:
    rows = [r for r in doc["rows"] if r["category"] == "all"]
    if not rows:
        return []
    plt = _pyplot()
    stem = json_path.with_suffix("")
    out = [Path(f"{stem}-decode.png")]
    _decode_plot(plt, rows, doc, out[0])
    spec = [r for r in rows if r["accept_hist"]]
    if spec:
        out.append(Path(f"{stem}-acceptance.png"))
        _acceptance_plot(plt, spec, doc, out[1])
    return out


def _title(doc: dict) -> str:
    s, m = doc["settings"], doc["meta"]
    forced = f", acceptance forced: {s['profile']} (benchmark device)" if s["profile"] else ""
    target = Path(m["target"]).name
    models = f"{target} + {Path(m['draft']).name}" if m.get("draft") else f"{target} (target only)"
    return (f"{models}: {len(s['prompts'])} prompts × "
            f"{s['n_predict']} tokens, {s['reps']} reps{forced}")


_COLORS = {"baseline": "0.6", "native": "tab:orange", "native-baseline": "#f7c58f"}


def _decode_plot(plt, rows: list[dict], doc: dict, path: Path) -> None:
    labels = [r["label"] for r in rows]
    tps = [r["decode_tps_mean"] or 0.0 for r in rows]
    sd = [r["decode_tps_sd"] or 0.0 for r in rows]
    colors = [_COLORS.get(r["kind"], "tab:blue") for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.6))
    y = range(len(rows))
    ax.barh(y, tps, xerr=sd, color=colors, capsize=3)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    starts = [i for i, r in enumerate(rows) if r["kind"] == "baseline"] + [len(rows)]
    for start, end in zip(starts, starts[1:]):  # each baseline's line spans the rows it is paired with
        ax.vlines(rows[start]["decode_tps_mean"], start - 0.45, end - 0.55, color="0.35", linestyle="--", linewidth=0.9)
    for yi, r in zip(y, rows):
        if r["kind"] != "baseline" and r["speedup_mean"] is not None:
            x = r["decode_tps_mean"] + (r["decode_tps_sd"] or 0.0)
            ax.text(x, yi, f"  {r['speedup_mean']:.2f}×", va="center", fontsize=8)
    what = "aggregate decode tokens/s of all sequences (-np)" if any((r.get("parallel") or 1) > 1 for r in rows) \
        else "decode tokens/s"
    ax.set_xlabel(f"{what} (mean ± sd over repetitions); grey = no-spec baseline of the same parallel level (dashed); "
                  "orange = llama.cpp's loop (light: its plain greedy)", fontsize=8)
    ax.set_title(_title(doc), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _acceptance_plot(plt, rows: list[dict], doc: dict, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        hist = r["accept_hist"]
        total = sum(hist) or 1
        left.plot(range(len(hist)), [100 * h / total for h in hist], marker="o", label=r["label"])
        pos = r["position_acceptance"] or []
        right.plot(range(1, len(pos) + 1), [100 * p for p in pos], marker="o", label=r["label"])
    left.set_xlabel("accepted draft tokens per step")
    left.set_ylabel("% of verify steps")
    left.set_title("histogram of accepted counts", fontsize=9)
    right.set_xlabel("draft position")
    right.set_ylabel("% accepted (given drafted)")
    right.set_title("per-position acceptance", fontsize=9)
    right.set_ylim(0, 105)
    right.legend(fontsize=7, loc="upper right")
    fig.suptitle(_title(doc), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
