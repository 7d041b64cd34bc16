"""Benchmark results: rows per configuration x category, the saved document, and its formats.

The saved JSON document keeps every measured run, so rows are always recomputed from the runs
(a resumed matrix reports its old and new runs alike). Schema `ggspec-bench/1`, documented in
README.md ("`ggspec bench` output"); ROW_FIELDS below is the column order of csv / jsonl.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from ggspec.bench.configs import BenchConfig, Skipped
from ggspec.bench.prompts import Prompt
from ggspec.bench.runner import Run, Settings
from ggspec.errors import InputError
from ggspec.runtime.devices import Placement
from ggspec.spec.stats import merge

SCHEMA = "ggspec-bench/1"

ROW_FIELDS = (
    # what was run
    "config", "kind", "label", "category", "n_prompts", "reps", "n_predict", "acceptance_profile",
    "ctk", "ctv", "n_ctx", "n_max", "planes", "lead", "inject",
    # speed
    "decode_tps_mean", "decode_tps_sd", "prompt_tps_mean", "speedup_mean", "speedup_sd", "baseline_tps_mean",
    "native_speedup_mean", "native_speedup_sd", "native_baseline_tps_mean",
    # acceptance
    "tau_pooled", "tau_request_mean", "tau_token_weighted", "acceptance_rate", "position_acceptance",
    "accept_hist", "steps",
    # where the time goes, and the ceiling it implies
    "share_draft", "share_verify", "share_inject", "share_replay", "share_overhead",
    "ms_draft", "ms_verify", "ms_target_1", "s_max",
    # hybrid targets and memory
    "replay_share", "plane_layout", "plane_bytes", "rss_mib", "peak_rss_mib",
    # lossless check and provenance
    "identical", "build", "patches", "target_sha256", "draft_sha256", "machine", "devices",
)


def _mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _r(x: float | None, nd: int = 4):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)


def make_rows(configs: list[BenchConfig], runs: list[Run], settings: Settings, meta: dict) -> list[dict]:
    """One row per configuration (baselines included) and category, plus category 'all'."""
    by_config: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_config[r.config].append(r)
    ordered: list[BenchConfig] = []
    for cfg in configs:  # each baseline row comes right before the first configuration it serves
        if cfg.kind != "baseline" and cfg.baseline() not in ordered and by_config.get(cfg.baseline().key):
            ordered.append(cfg.baseline())
            # llama.cpp's plain greedy (--native) right after ggspec's
            if cfg.native_baseline() in configs and by_config.get(cfg.native_baseline().key):
                ordered.append(cfg.native_baseline())
        if cfg not in ordered and by_config.get(cfg.key):
            ordered.append(cfg)
    categories = list(dict.fromkeys(p.category for p in settings.prompts))
    rows = []
    for cfg in ordered:
        mine = by_config[cfg.key]
        for cat in (["all"] + categories if len(categories) > 1 else ["all"]):
            sel = [r for r in mine if cat in ("all", r.category)]
            if sel:
                rows.append(_row(cfg, cat, sel, by_config, settings, meta))
    return rows


def _row(cfg: BenchConfig, category: str, runs: list[Run], by_config: dict, settings: Settings, meta: dict) -> dict:
    reps = sorted({r.rep for r in runs})
    per_rep = {rep: merge(r.stats for r in runs if r.rep == rep) for rep in reps}
    tps = [per_rep[rep].decode_tps for rep in reps]
    total = merge(r.stats for r in runs)
    row = {f: None for f in ROW_FIELDS}
    row.update(config=cfg.key, kind=cfg.kind, label=cfg.label, category=category,
               n_prompts=len({r.prompt for r in runs}), reps=len(reps), n_predict=settings.n_predict,
               acceptance_profile=settings.profile if cfg.speculative else None,
               ctk=cfg.ctk, ctv=cfg.ctv, n_ctx=cfg.n_ctx, n_max=cfg.n_max or None, planes=cfg.planes or None,
               lead=cfg.lead or None, inject=cfg.inject or None,
               build=meta.get("build"), patches=",".join(meta.get("patches", [])),
               target_sha256=meta.get("target_sha256"), draft_sha256=meta.get("draft_sha256"),
               machine=meta.get("machine"), devices=settings.devices)
    mean, sd = _mean_sd(tps)
    row.update(decode_tps_mean=_r(mean, 2), decode_tps_sd=_r(sd, 2),
               rss_mib=_r(max(r.rss_mib for r in runs), 1), peak_rss_mib=_r(max(r.peak_rss_mib for r in runs), 1))
    if cfg.kind in ("spec", "baseline"):
        row["prompt_tps_mean"] = _r(statistics.fmean(per_rep[rep].prompt_tps for rep in reps), 2)

    # --native: every row also against llama.cpp's own plain greedy with the same cache types, as the
    # mean of per-repetition ratios (its runs are not back to back with this row's, but the same
    # repetition covers the same prompts)
    native_runs = [r for r in by_config.get(cfg.native_baseline().key, []) if category in ("all", r.category)]
    if native_runs:
        native_per_rep = {rep: merge(r.stats for r in native_runs if r.rep == rep) for rep in reps}
        ratios = [per_rep[rep].decode_tps / native_per_rep[rep].decode_tps for rep in reps
                  if native_per_rep[rep].decode_tps]
        n_mean, n_sd = _mean_sd(ratios)
        row.update(native_speedup_mean=_r(n_mean), native_speedup_sd=_r(n_sd),
                   native_baseline_tps_mean=_r(merge(native_per_rep.values()).decode_tps, 2))
    if cfg.kind == "baseline":
        row.update(speedup_mean=1.0, speedup_sd=0.0, baseline_tps_mean=row["decode_tps_mean"])
        return row

    # speedup: ratios of paired runs (same repetition, same prompts, run back to back)
    base_runs = [r for r in by_config.get(cfg.baseline().key, []) if r.paired_with == cfg.key]
    base_per_rep = {rep: merge(r.stats for r in base_runs if r.rep == rep and category in ("all", r.category))
                    for rep in reps}
    ratios = [per_rep[rep].decode_tps / base_per_rep[rep].decode_tps for rep in reps if base_per_rep[rep].decode_tps]
    s_mean, s_sd = _mean_sd(ratios)
    base_total = merge(base_per_rep.values())
    row.update(speedup_mean=_r(s_mean), speedup_sd=_r(s_sd), baseline_tps_mean=_r(base_total.decode_tps, 2),
               acceptance_rate=_r(total.acceptance_rate) if cfg.speculative else None,
               identical=f"{sum(bool(r.identical) for r in runs)}/{len(runs)}")
    if cfg.kind != "spec":
        return row  # llama.cpp's tools report decode time (and draft counts) only

    # τ three ways (all in use in the field); pooled is the headline
    taus = [(r.stats.tau, r.stats.n_decoded) for r in runs if r.stats.spec_steps]
    weight = sum(n for _, n in taus)
    shares = total.time_shares()
    steps = max(1, total.spec_steps)
    ms_draft, ms_verify = 1e3 * total.t_draft / steps, 1e3 * total.t_verify / steps
    ms_target_1 = 1e3 * base_total.t_decode / base_total.n_decoded if base_total.n_decoded else math.nan
    s_max = total.tau * ms_target_1 / (ms_draft + ms_verify) if ms_draft + ms_verify > 0 else math.nan
    row.update(tau_pooled=_r(total.tau), tau_request_mean=_r(statistics.fmean(t for t, _ in taus) if taus else math.nan),
               tau_token_weighted=_r(sum(t * n for t, n in taus) / weight if weight else math.nan),
               position_acceptance=[round(p, 4) for p in total.position_acceptance], accept_hist=total.accept_hist,
               steps=total.spec_steps, ms_draft=_r(ms_draft), ms_verify=_r(ms_verify), ms_target_1=_r(ms_target_1),
               s_max=_r(s_max), replay_share=_r(total.replay_share),
               plane_layout=runs[-1].plane_layout or None, plane_bytes=runs[-1].plane_bytes or None,
               **{f"share_{k}": _r(v) for k, v in shares.items()})
    return row


# --- the saved document ----------------------------------------------------------------------------


def document(settings: Settings, meta: dict, configs: list[BenchConfig], skipped: list[Skipped],
             runs: list[Run], complete: bool) -> dict:
    return {
        "schema": SCHEMA,
        "complete": complete,
        "meta": meta,
        "settings": {**asdict(settings), "prompts": [asdict(p) for p in settings.prompts]},
        "configs": [asdict(c) for c in configs],
        "skipped": [asdict(s) for s in skipped],
        "runs": [r.to_json() for r in runs],
        "rows": make_rows(configs, runs, settings, meta),
    }


def save(path: Path, doc: dict) -> None:
    """Write atomically: an interrupted save never leaves a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)  # `--save runs/x.json` with no runs/ yet
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"--resume {path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"--resume {path}: not a ggspec bench JSON file ({exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(f"--resume {path}: not a {SCHEMA} document")
    return doc


def settings_from(doc: dict) -> Settings:
    s = dict(doc["settings"])
    s["prompts"] = tuple(Prompt(**p) for p in s["prompts"])
    s["profile_weights"] = tuple(s["profile_weights"]) if s["profile_weights"] is not None else None
    p = s.get("placement") or {}
    s["placement"] = Placement(**{**p, "rpc": tuple(p.get("rpc", ())), "tensor_split": tuple(p.get("tensor_split", ()))})
    return Settings(**s)


def runs_from(doc: dict) -> list[Run]:
    return [Run.from_json(r) for r in doc["runs"]]


# --- formats -------------------------------------------------------------------------------------


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, list):
        return ";".join(str(x) for x in v)
    return str(v)


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(ROW_FIELDS)
    for row in rows:
        w.writerow([_cell(row[f]) for f in ROW_FIELDS])
    return buf.getvalue()


def to_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps({f: row[f] for f in ROW_FIELDS}) + "\n" for row in rows)


def _fmt(x, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _ratio(mean, sd, is_reference: bool) -> str:
    if is_reference:
        return "1.00"
    return "" if mean is None else f"{mean:.2f} ± {sd:.2f}"


def to_markdown(rows: list[dict], settings: Settings) -> str:
    """llama-bench-like table: the figures people compare; csv / json carry everything. A column
    no row fills (τ and the rest on a target-only benchmark, replay on a dense target) is left out."""
    native = any(r["native_speedup_mean"] is not None for r in rows)
    head = ["configuration", "category", "decode t/s", "speedup"] + (["vs llama.cpp no-spec"] if native else []) + [
        "τ pooled", "accept", "S_max", "replay", "time: draft/verify/inject/replay/other %", "identical"]
    table = []
    for r in rows:
        label = r["label"] + (f" [forced: {r['acceptance_profile']}]" if r["acceptance_profile"] else "")
        shares = "" if r["share_draft"] is None else "/".join(
            f"{100 * r[f'share_{k}']:.0f}" for k in ("draft", "verify", "inject", "replay", "overhead"))
        table.append([
            label, r["category"],
            f"{_fmt(r['decode_tps_mean'], '.1f')} ± {_fmt(r['decode_tps_sd'], '.1f')}",
            f"{_fmt(r['speedup_mean'], '.2f')} ± {_fmt(r['speedup_sd'], '.2f')}" if r["kind"] != "baseline" else "1.00",
            *([_ratio(r["native_speedup_mean"], r["native_speedup_sd"], r["kind"] == "native-baseline")] if native else []),
            _fmt(r["tau_pooled"], ".2f"),
            "" if r["acceptance_rate"] is None else f"{100 * r['acceptance_rate']:.0f}%",
            _fmt(r["s_max"], ".2f"),
            "" if r["replay_share"] is None or r["planes"] is None else f"{100 * r['replay_share']:.0f}%",
            shares, r["identical"] or "",
        ])
    keep = [i for i in range(len(head)) if i < 4 or any(cells[i] for cells in table)]
    out = ["| " + " | ".join(head[i] for i in keep) + " |", "|" + "---|" * len(keep)]
    out += ["| " + " | ".join(cells[i] for i in keep) + " |" for cells in table]
    lines = "\n".join(out)
    note = (f"\n\n{settings.n_predict} tokens per prompt, {settings.reps} repetitions, {len(settings.prompts)} prompts; "
            "speedup = mean of paired ratios to the no-spec baseline with the same cache types")
    if any(r["tau_pooled"] is not None for r in rows):
        note += ("; τ pooled = committed tokens / speculative steps (bonus token included); "
                 "S_max = τ·T_target(1) / (T_draft + T_verify)")
    note += "."
    if native:
        note += (" vs llama.cpp no-spec = mean of per-repetition ratios to llama.cpp's own plain greedy "
                 "(llama-completion) with the same cache types.")
    if settings.profile:
        note += f" [forced: {settings.profile}] = BENCHMARK DEVICE: acceptance replayed from a histogram, not the draft's."
    return lines + note + "\n"
