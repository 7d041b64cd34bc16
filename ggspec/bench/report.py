"""Benchmark results: rows per configuration x category, the saved document, and its formats.

The saved JSON document keeps every measured run, so rows are always recomputed from the runs
(a resumed matrix reports its old and new runs alike). Schema `ggspec-bench/1`, documented in
docs/commands/bench.md ("Output schema `ggspec-bench/1`"); ROW_FIELDS below is the column order of
csv / jsonl.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from ggspec.bench.configs import KINDS, NATIVE_MODES, Axes, BenchConfig, Skipped, check_axes
from ggspec.bench.forced import PROFILES
from ggspec.bench.prompts import Prompt
from ggspec.bench.runner import Run, Settings
from ggspec.errors import InputError
from ggspec.files import atomic_write, describe_bad_text, parse_json, read_text
from ggspec.runtime.devices import Placement, parse_endpoint
from ggspec.speculative.types import registry
from ggspec.speculative.stats import RunStats, k_shares, merge
from ggspec.values import is_int, is_number

SCHEMA = "ggspec-bench/1"

ROW_FIELDS = (
    # what was run
    "config", "kind", "label", "category", "n_prompts", "reps", "n_predict", "acceptance_profile",
    "ctk", "ctv", "n_ctx", "n_max", "planes", "lead", "inject", "parallel", "temp", "tree",
    # speed
    "decode_tps_mean", "decode_tps_sd", "seq_tps_mean", "calls_per_step", "prompt_tps_mean",
    "speedup_mean", "speedup_sd", "baseline_tps_mean",
    "native_speedup_mean", "native_speedup_sd", "native_baseline_tps_mean",
    # acceptance
    "tau_pooled", "tau_request_mean", "tau_token_weighted", "acceptance_rate", "position_acceptance",
    "accept_hist", "steps",
    # the adaptive length (auto): steps by drafted tokens verified, and the share at k = 0
    "k_hist", "k0_share",
    # token trees: the share of speculative steps that verified one, and draft nodes verified per step
    "tree_share", "nodes_per_step",
    # where the time goes, and the ceiling it implies
    "share_draft", "share_verify", "share_inject", "share_replay", "share_overhead",
    "ms_draft", "ms_verify", "ms_target_1", "s_max",
    # hybrid targets and memory
    "replay_share", "plane_layout", "plane_bytes", "rss_mib", "peak_rss_mib",
    # lossless check and provenance
    "identical", "near_ties", "real_divergences", "build", "patches", "target_sha256", "draft_sha256", "machine", "devices",
)


def _mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _r(x: float | None, nd: int = 4):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)


def _engine_time(r: Run) -> float:
    """A run's share of its engine's transaction time (runs saved before parallel: its decode time,
    the same thing for one sequence at a time)."""
    return r.engine_t if r.engine_t else r.stats.t_decode


def aggregate_tps(runs: list[Run]) -> float:
    """Tokens of all the runs over their engines' transaction time (prefills excluded): with one
    sequence at a time, the pooled decode t/s; with several, what the engine delivered in all."""
    t = sum(_engine_time(r) for r in runs)
    return sum(r.stats.n_decoded for r in runs) / t if t > 0 else 0.0


def _pooled_tps(groups: list[list[Run]]) -> float:
    """aggregate_tps of several repetitions' runs, summed per repetition first (as `merge` pools)."""
    t = sum(sum(_engine_time(r) for r in g) for g in groups)
    return sum(sum(r.stats.n_decoded for r in g) for g in groups) / t if t > 0 else 0.0


def _calls_per_step(runs: list[Run]) -> float | None:
    steps = sum(r.engine_steps for r in runs)
    return sum(r.engine_calls for r in runs) / steps if steps else None


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
    runs_of = {rep: [r for r in runs if r.rep == rep] for rep in reps}
    tps = [aggregate_tps(runs_of[rep]) for rep in reps]  # = per_rep[rep].decode_tps at parallel 1
    total = merge(r.stats for r in runs)
    row = {f: None for f in ROW_FIELDS}
    row.update(config=cfg.key, kind=cfg.kind, label=cfg.label, category=category,
               n_prompts=len({r.prompt for r in runs}), reps=len(reps), n_predict=settings.n_predict,
               acceptance_profile=settings.profile if cfg.speculative else None,
               ctk=cfg.ctk, ctv=cfg.ctv, n_ctx=cfg.n_ctx, n_max=cfg.n_max or None, planes=cfg.planes or None,
               lead=cfg.lead or None, inject=cfg.inject or None, parallel=cfg.parallel, temp=cfg.temp,
               tree=cfg.tree or None, build=meta.get("build"), patches=",".join(meta.get("patches", [])),
               target_sha256=meta.get("target_sha256"), draft_sha256=meta.get("draft_sha256"),
               machine=meta.get("machine"), devices=settings.devices)
    mean, sd = _mean_sd(tps)
    row.update(decode_tps_mean=_r(mean, 2), decode_tps_sd=_r(sd, 2),
               seq_tps_mean=_r(statistics.fmean(per_rep[rep].decode_tps for rep in reps), 2),
               calls_per_step=_r(_calls_per_step(runs), 3),
               rss_mib=_r(max(r.rss_mib for r in runs), 1), peak_rss_mib=_r(max(r.peak_rss_mib for r in runs), 1))
    if cfg.kind in ("spec", "baseline"):
        row["prompt_tps_mean"] = _r(statistics.fmean(per_rep[rep].prompt_tps for rep in reps), 2)

    # --native: every row also against llama.cpp's own plain greedy with the same cache types, as the
    # mean of per-repetition ratios (its runs are not back to back with this row's, but the same
    # repetition covers the same prompts)
    native_runs = [r for r in by_config.get(cfg.native_baseline().key, []) if category in ("all", r.category)]
    if native_runs:
        native_per_rep = {rep: merge(r.stats for r in native_runs if r.rep == rep) for rep in reps}
        ratios = [tps[k] / native_per_rep[rep].decode_tps for k, rep in enumerate(reps)
                  if native_per_rep[rep].decode_tps]
        n_mean, n_sd = _mean_sd(ratios)
        row.update(native_speedup_mean=_r(n_mean), native_speedup_sd=_r(n_sd),
                   native_baseline_tps_mean=_r(merge(native_per_rep.values()).decode_tps, 2))
    if cfg.kind == "baseline":
        row.update(speedup_mean=1.0, speedup_sd=0.0, baseline_tps_mean=row["decode_tps_mean"])
        if cfg.parallel > 1 and not cfg.sampled:  # batched plain decoding, checked against each prompt's solo output
            row.update(_lossless(runs))
        return row

    # speedup: ratios of paired runs (same repetition, same prompts, run back to back)
    base_runs = [r for r in by_config.get(cfg.baseline().key, []) if r.paired_with == cfg.key]
    base_of = {rep: [r for r in base_runs if r.rep == rep and category in ("all", r.category)] for rep in reps}
    base_per_rep = {rep: merge(r.stats for r in base_of[rep]) for rep in reps}
    ratios = [tps[k] / aggregate_tps(base_of[rep]) for k, rep in enumerate(reps) if aggregate_tps(base_of[rep])]
    s_mean, s_sd = _mean_sd(ratios)
    base_total = merge(base_per_rep.values())
    base_tps = _pooled_tps([base_of[rep] for rep in reps])
    row.update(speedup_mean=_r(s_mean), speedup_sd=_r(s_sd), baseline_tps_mean=_r(base_tps, 2),
               acceptance_rate=_r(total.acceptance_rate) if cfg.speculative else None,
               **({} if cfg.sampled else _lossless(runs)))
    # τ three ways (all in use in the field); pooled is the headline. llama.cpp's loop has them too
    # (from its draft dump), but no time split
    taus = [(r.stats.tau, r.stats.n_decoded) for r in runs if r.stats.spec_steps]
    weight = sum(n for _, n in taus)
    if taus:
        row.update(tau_pooled=_r(total.tau), tau_request_mean=_r(statistics.fmean(t for t, _ in taus)),
                   tau_token_weighted=_r(sum(t * n for t, n in taus) / weight if weight else math.nan),
                   position_acceptance=[round(p, 4) for p in total.position_acceptance],
                   accept_hist=total.accept_hist, steps=total.spec_steps)
    if sum(total.k_hist):
        row.update(k_hist=total.k_hist, k0_share=_r(total.k_hist[0] / sum(total.k_hist)))
    if total.spec_steps and cfg.kind == "spec":
        row.update(tree_share=_r(total.tree_steps / total.spec_steps), nodes_per_step=_r(total.nodes / total.spec_steps))
    if cfg.kind != "spec":
        return row

    shares = total.time_shares()
    steps = max(1, total.spec_steps)
    ms_draft, ms_verify = 1e3 * total.t_draft / steps, 1e3 * total.t_verify / steps
    ms_target_1 = 1e3 * base_total.t_decode / base_total.n_decoded if base_total.n_decoded else math.nan
    s_max = total.tau * ms_target_1 / (ms_draft + ms_verify) if ms_draft + ms_verify > 0 else math.nan
    row.update(ms_draft=_r(ms_draft), ms_verify=_r(ms_verify), ms_target_1=_r(ms_target_1),
               s_max=_r(s_max), replay_share=_r(total.replay_share),
               plane_layout=runs[-1].plane_layout or None, plane_bytes=runs[-1].plane_bytes or None,
               **{f"share_{k}": _r(v) for k, v in shares.items()})
    return row


def _lossless(runs: list[Run]) -> dict:
    """identical = outputs equal to plain greedy, out of all; the others split by the target's own
    top-2 margin at their first difference: near-ties (below the 0.2-nat gate: a rounding flip,
    benign) and real divergences."""
    return {"identical": f"{sum(bool(r.identical) for r in runs)}/{len(runs)}",
            "near_ties": sum(r.divergence == "near-tie" for r in runs),
            "real_divergences": sum(r.divergence == "real" for r in runs)}


def lossless_rule(settings) -> str:
    """Which rule judged the outputs: byte identity where every model ran on the CPU backend with
    its batch invariance (any difference is REAL), else the 0.2-nat gate (ggspec.speculative.lossless)."""
    from ggspec.native.bindings import batch_invariant
    from ggspec.speculative.lossless import GATE_RULE, IDENTITY_RULE

    on_cpu = not getattr(settings, "n_gpu_layers", 0) and not getattr(settings, "rpc", None)
    return IDENTITY_RULE + " (CPU, batch-invariant kernels)" if on_cpu and batch_invariant() > 0 else GATE_RULE


def identical_cell(r: dict) -> str:
    """The table's identical column: n/m, then what the differences were."""
    if not r["identical"]:
        return ""
    parts = [f"{r['near_ties']} near-tie" + ("s" if r["near_ties"] != 1 else "")] if r.get("near_ties") else []
    if r.get("real_divergences"):
        parts.append(f"{r['real_divergences']} REAL")
    return r["identical"] + (f" ({', '.join(parts)})" if parts else "")


# --- the saved document ----------------------------------------------------------------------------


def document(settings: Settings, meta: dict, configs: list[BenchConfig], skipped: list[Skipped],
             runs: list[Run], complete: bool) -> dict:
    return {
        "schema": SCHEMA,
        "complete": complete,
        "meta": meta,
        "settings": _settings_json(settings),
        "configs": [asdict(c) for c in configs],
        "skipped": [asdict(s) for s in skipped],
        "runs": [r.to_json() for r in runs],
        "rows": make_rows(configs, runs, settings, meta),
    }


def save(path: Path, doc: dict) -> None:
    """Write atomically through a temporary file of its own (two benchmarks saving to the same
    path never share one): an interrupted save never leaves a half-written file."""
    text = json.dumps(doc, indent=1) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))


def load(path: Path) -> dict:
    """A saved document, checked through and through: anything damaged is one InputError here,
    before a model is loaded or the file is touched."""
    what = f"--resume {path}"
    doc = parse_json(read_text(path, what), what, "not a ggspec bench JSON file")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(f"{what}: not a {SCHEMA} document")
    check_document(doc, what)
    return doc


class _Damaged(Exception):
    pass


def _need(cond: bool, where: str) -> None:
    if not cond:
        raise _Damaged(where)


def _is_num(v) -> bool:
    return is_number(v) and math.isfinite(v)


def _fields(obj, where: str, types: dict[str, tuple], required: tuple[str, ...]) -> None:
    _need(isinstance(obj, dict), f"{where} is not an object")
    for name in required:
        _need(name in obj, f"{where} has no {name!r}")
    for name, value in obj.items():
        _need(name in types, f"{where} has an unknown field {name!r}")
        check = types[name]
        ok = check(value) if callable(check) else isinstance(value, check) and not (
            isinstance(value, bool) and bool not in check)
        _need(ok, f"{where}.{name} has a wrong type or value")


_STATS_TYPES = {f: (lambda v: _is_num(v) and v >= 0) for f in RunStats.__dataclass_fields__}
_STATS_TYPES.update({f: (lambda v: isinstance(v, list) and all(is_int(x) and x >= 0 for x in v))
                     for f in ("accept_hist", "pos_drafted", "pos_accepted", "k_hist")})
_CONFIG_TYPES = {"kind": (str,), "ctk": (str,), "ctv": (str,), "n_ctx": is_int, "n_max": is_int,
                 "planes": (str,), "lead": (str,), "inject": (str,), "parallel": is_int,
                 "temp": lambda v: _is_num(v) and v >= 0, "adaptive": (bool,), "tree": (str,), "spec_type": (str,)}
_RUN_TYPES = {"config": (str,), "rep": is_int, "prompt": is_int, "category": (str,), "stats": (dict,),
              "identical": lambda v: v is None or isinstance(v, bool), "paired_with": (str,),
              "divergence": lambda v: v in (None, "near-tie", "real"), "margin": lambda v: v is None or _is_num(v),
              "diverged_at": lambda v: v is None or is_int(v),
              "rss_mib": _is_num, "peak_rss_mib": _is_num, "plane_bytes": is_int, "plane_layout": (str,),
              **{f: lambda v: _is_num(v) and v >= 0 for f in ("engine_t", "engine_calls", "engine_steps")}}
def _option_check(annotation: type):
    """A type option's check in a saved document: by its type (bool, a float, an int)."""
    if annotation is bool:
        return (bool,)
    return _is_num if annotation is float else is_int


_SETTINGS_TYPES = {"target": (str,), "draft": (str,), "n_predict": is_int, "reps": is_int, "threads": is_int,
                   "warmup": (bool,), "profile": lambda v: v is None or isinstance(v, str),
                   "profile_weights": lambda v: v is None or (isinstance(v, list) and all(_is_num(x) for x in v)),
                   "prompts": (list,), "placement": lambda v: v is None or isinstance(v, dict),
                   "n_gpu_layers": is_int, "flash_attn": lambda v: v in ("auto", "on", "off"),
                   "spec_type": lambda v: v is None or isinstance(v, str),
                   "p_min": _is_num,
                   **{f.key: _option_check(f.annotation) for f in registry.option_fields()},
                   "spec_select": (str,), "plan_pool": is_int, "top_k": is_int,
                   "top_p": _is_num, "min_p": _is_num, "seed": is_int}
def _draft_free(spec_type: str | None) -> bool:
    """Whether every type of a saved --spec-type drafts without a draft file (draft-mtp: the
    target's head; the n-gram types)."""
    return registry.draft_file_optional(spec_type)


def _injects(spec_type: str | None) -> bool:
    """Whether llama.cpp's rows of this --spec-type have an injection mode (DFlash drafts; None:
    detected from the draft, which may be one)."""
    return spec_type is None or any(t.traits.injection for t in registry.parse(spec_type))
_PLACEMENT_TYPES = {"split_mode": (str,), "rpc": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                    "tensor_split": lambda v: isinstance(v, list) and all(_is_num(x) and x >= 0 for x in v),
                    "mirror_output": (bool,), "rpc_timeout": lambda v: _is_num(v) and v > 0}
_META_TYPES = {"build": (str,), "build_options": (dict,),
               "patches": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "target": (str,),
               "target_sha256": (str,), "draft": (str,), "draft_sha256": lambda v: v is None or isinstance(v, str),
               "machine": (str,), "threads": is_int, "started": (str,)}


def check_document(doc: dict, what: str) -> None:
    """Every part a --resume relies on, with the reason of the first damage found."""
    try:
        _check_document(doc, what)
    except _Damaged as exc:
        raise InputError(f"{what}: damaged document ({exc})") from None


def _check_document(doc: dict, what: str) -> None:
    for name in ("complete", "meta", "settings", "configs", "skipped", "runs"):
        _need(name in doc, f"no {name!r}")
    _need(isinstance(doc["complete"], bool), "'complete' is not true or false")
    _fields(doc["meta"], "meta", _META_TYPES, ("target", "target_sha256", "draft", "draft_sha256"))
    settings = settings_from(doc, what)
    meta = doc["meta"]
    _need(meta["target"] == settings.target and meta["draft"] == settings.draft,
          "meta and settings name different model files")
    _need(bool(meta["draft"]) == (meta["draft_sha256"] is not None), "meta.draft_sha256 does not fit meta.draft")
    _need(isinstance(doc["configs"], list) and doc["configs"], "'configs' is not a non-empty list")
    configs = []
    for i, c in enumerate(doc["configs"]):
        where = f"configs[{i}]"
        _fields(c, where, _CONFIG_TYPES, ("kind",))
        try:
            cfg = BenchConfig(**c)
            _need(cfg.kind in KINDS, f"{where}.kind {cfg.kind!r} is not one of {', '.join(KINDS)}")
            check_axes(Axes(ctk=(cfg.ctk,), ctv=(cfg.ctv,), n_ctx=(cfg.n_ctx,), n_max=(max(cfg.n_max, 1),),
                            inject=(cfg.inject or "pruned",), parallel=(cfg.parallel,), temp=(cfg.temp,)))
            _need(cfg.parallel == 1 or cfg.kind in ("spec", "baseline"),
                  f"{where}.parallel {cfg.parallel}: llama.cpp's tools run parallel 1 only")
            _need(cfg.n_max >= 0 and cfg.speculative == (cfg.n_max >= 1),
                  f"{where}.n_max {cfg.n_max} does not fit kind {cfg.kind}")
            if cfg.kind == "spec":
                cfg.plane_options.check(cfg.n_max) if cfg.planes else None
            if cfg.kind == "native":
                _need(cfg.inject in NATIVE_MODES or (cfg.inject == "" and (settings.spec_type is None
                                                                           or not _injects(settings.spec_type))),
                      f"{where}.inject {cfg.inject!r} is not one of {', '.join(NATIVE_MODES)}")
        except InputError as exc:
            raise _Damaged(f"{where}: {exc.field + ': ' if exc.field else ''}{exc}") from None
        _need(not (cfg.speculative and not settings.draft and not _draft_free(settings.spec_type)),
              f"{where} is speculative, the benchmark has no draft")
        _need(not (cfg.sampled and settings.profile_weights), f"{where}.temp: an acceptance profile is greedy only")
        _need(not (cfg.speculative and settings.profile_weights and settings.profile not in PROFILES
                   and len(settings.profile_weights) != cfg.n_max + 1),
              f"{where}.n_max {cfg.n_max} does not fit the acceptance profile's {len(settings.profile_weights or ())} "
              "entries")
        configs.append(cfg)
    keys = {c.key for c in configs} | {c.baseline().key for c in configs}
    _need(len({c.key for c in configs}) == len(configs), "a configuration is listed twice")
    _need(isinstance(doc["skipped"], list), "'skipped' is not a list")
    for i, sk in enumerate(doc["skipped"]):
        _fields(sk, f"skipped[{i}]", {"label": (str,), "reason": (str,)}, ("label", "reason"))
    _need(isinstance(doc["runs"], list), "'runs' is not a list")
    seen = set()
    for i, r in enumerate(doc["runs"]):
        where = f"runs[{i}]"
        _fields(r, where, _RUN_TYPES, ("config", "rep", "prompt", "category", "stats"))
        _fields(r["stats"], f"{where}.stats", _STATS_TYPES, ())
        _need(r["config"] in keys, f"{where}.config is not a configuration of this benchmark")
        _need(not r.get("paired_with") or r["paired_with"] in keys, f"{where}.paired_with is not a configuration")
        _need(0 <= r["rep"] < settings.reps, f"{where}.rep {r['rep']} is outside 0..{settings.reps - 1}")
        _need(0 <= r["prompt"] < len(settings.prompts),
              f"{where}.prompt {r['prompt']} is outside 0..{len(settings.prompts) - 1}")
        _need(r["category"] == settings.prompts[r["prompt"]].category, f"{where}.category is not its prompt's")
        ident = (r["config"], r["rep"], r["prompt"], r.get("paired_with", ""))
        _need(ident not in seen, f"{where} repeats a measured run")
        seen.add(ident)
        Run.from_json(r)


def settings_from(doc: dict, what: str = "--resume") -> Settings:
    """The saved settings, validated like the command-line flags they came from."""
    try:
        return _settings_from(doc)
    except _Damaged as exc:
        raise InputError(f"{what}: damaged document ({exc})") from None
    except InputError as exc:
        raise InputError(f"{what}: damaged document ({exc})") from None


def _settings_json(settings: Settings) -> dict:
    """The settings as saved: each draft type's options flat beside the others (every key)."""
    d = asdict(settings)
    d.pop("type_options")
    d.update(registry.flat_options(registry.options_from_flat(dict(settings.type_options))))
    return {**d, "prompts": [asdict(p) for p in settings.prompts]}


def _settings_from(doc: dict) -> Settings:
    s = doc.get("settings")
    _fields(s, "settings", _SETTINGS_TYPES, ("target", "draft", "n_predict", "reps", "threads", "warmup", "profile",
                                             "profile_weights", "prompts"))
    s = dict(s)
    for flag, name in (("-n", "n_predict"), ("-r", "reps"), ("-t", "threads")):
        _need(s[name] >= 1, f"settings.{name} is {s[name]} ({flag} must be at least 1)")
    _need(bool(s["target"]), "settings.target is empty")
    _need(isinstance(s["prompts"], list) and s["prompts"], "settings.prompts is not a non-empty list")
    prompts = []
    for i, p in enumerate(s["prompts"]):
        where = f"settings.prompts[{i}]"
        _fields(p, where, {"text": (str,), "category": (str,)}, ("text", "category"))
        _need(bool(p["text"]) and bool(p["category"]), f"{where} has an empty text or category")
        bad = describe_bad_text(p["text"] + p["category"])
        _need(not bad, f"{where} is not valid UTF-8 text ({bad})")
        prompts.append(Prompt(p["text"], p["category"]))
    s["prompts"] = tuple(prompts)
    if s["profile_weights"] is not None:
        _need(s["profile"] is not None, "settings.profile_weights without a profile name")
        s["profile_weights"] = check_profile_weights(tuple(float(w) for w in s["profile_weights"]),
                                                     "settings.profile_weights")
    else:
        _need(s["profile"] is None, "settings.profile without its weights")
    p = s.get("placement") or {}
    _fields(p, "settings.placement", _PLACEMENT_TYPES, ())
    placement = Placement(**{**p, "rpc": tuple(parse_endpoint(e) for e in p.get("rpc", ())),
                             "tensor_split": tuple(float(x) for x in p.get("tensor_split", ()))})
    placement.check()
    s["placement"] = placement
    s["type_options"] = tuple((f.key, s.pop(f.key)) for f in registry.option_fields() if f.key in s)
    settings = Settings(**s)
    settings.sampling(1.0).validate()
    return settings


def check_profile_weights(weights: tuple[float, ...], what: str) -> tuple[float, ...]:
    if not all(math.isfinite(w) for w in weights):
        raise InputError(f"{what}: weights must be finite numbers")
    if len(weights) < 2 or min(weights) < 0 or sum(weights) <= 0:
        raise InputError(f"{what}: needs at least 2 non-negative weights, not all zero")
    return weights


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
    par = any((r["parallel"] or 1) > 1 for r in rows)  # parallel levels: aggregate and per-sequence speed
    head = ["configuration", "category", "decode t/s" + (" (aggregate)" if par else "")] + (
        ["per-seq t/s", "calls/step"] if par else []) + ["speedup"] + (["vs llama.cpp no-spec"] if native else []) + [
        "τ pooled", "accept", "auto k (share)", "tree steps, nodes/step", "S_max", "replay", "time: draft/verify/inject/replay/other %", "identical"]
    table = []
    for r in rows:
        label = r["label"] + (f" [forced: {r['acceptance_profile']}]" if r["acceptance_profile"] else "")
        shares = "" if r["share_draft"] is None else "/".join(
            f"{100 * r[f'share_{k}']:.0f}" for k in ("draft", "verify", "inject", "replay", "overhead"))
        table.append([
            label, r["category"],
            f"{_fmt(r['decode_tps_mean'], '.1f')} ± {_fmt(r['decode_tps_sd'], '.1f')}",
            *([_fmt(r["seq_tps_mean"], ".1f"), _fmt(r["calls_per_step"], ".2f")] if par else []),
            f"{_fmt(r['speedup_mean'], '.2f')} ± {_fmt(r['speedup_sd'], '.2f')}" if r["kind"] != "baseline" else "1.00",
            *([_ratio(r["native_speedup_mean"], r["native_speedup_sd"], r["kind"] == "native-baseline")] if native else []),
            _fmt(r["tau_pooled"], ".2f"),
            "" if r["acceptance_rate"] is None else f"{100 * r['acceptance_rate']:.0f}%",
            k_shares(r.get("k_hist") or [], top=3),  # the three most frequent choices of auto
            "" if not r.get("tree_share") else f"{100 * r['tree_share']:.0f}%, {r['nodes_per_step']:.1f}",
            _fmt(r["s_max"], ".2f"),
            "" if r["replay_share"] is None or r["planes"] is None else f"{100 * r['replay_share']:.0f}%",
            shares, identical_cell(r),
        ])
    keep = [i for i in range(len(head)) if i <= head.index("speedup") or any(cells[i] for cells in table)]
    out = ["| " + " | ".join(head[i] for i in keep) + " |", "|" + "---|" * len(keep)]
    out += ["| " + " | ".join(cells[i] for i in keep) + " |" for cells in table]
    lines = "\n".join(out)
    drafter = (f"drafter: {settings.spec_type}" + (" (a lone model's default: drafts from the text)"
                                                  if settings.spec_type == registry.LONE_MODEL and not settings.draft else "")
               if settings.spec_type else "")
    note = (f"\n\n{drafter + '; ' if drafter else ''}{settings.n_predict} tokens per prompt, {settings.reps} repetitions, "
            f"{len(settings.prompts)} prompts; "
            "speedup = mean of paired ratios to the no-spec baseline with the same cache types"
            + (" and parallel level; decode t/s (aggregate) = tokens of all sequences / the engine's transaction "
               "time, per-seq t/s = one sequence's tokens / the time of the steps it was in; identical = every "
               "output equals the prompt's solo plain greedy output" if par else ""))
    note += f"; identical judged by {lossless_rule(settings)}"
    if any(r.get("near_ties") or r.get("real_divergences") for r in rows):
        note += ("; a near-tie is an output that first differs where the target's own top-2 margin is below the "
                 "0.2-nat gate (batched rounding flipped a tie: benign), REAL one that differs anywhere else")
    if any(r.get("k_hist") for r in rows):
        note += ("; auto k = the adaptive length's verified drafts per step (the three most frequent, k 0: "
                 "plain decoding steps)")
    if any(r.get("tree_share") for r in rows):
        note += ("; tree steps = the speculative steps that verified a token tree, nodes/step = draft tokens "
                 "verified per speculative step (a tree's nodes)")
    if any(r["tau_pooled"] is not None for r in rows):
        note += ("; τ pooled = committed tokens / speculative steps (bonus token included); "
                 "S_max = τ·T_target(1) / (T_draft + T_verify)")
    note += "."
    if native:
        note += (" vs llama.cpp no-spec = mean of per-repetition ratios to llama.cpp's own plain greedy "
                 "(llama-completion) with the same cache types.")
    if any(r["temp"] for r in rows):
        note += (f" Rows with a temperature sample (top-k {settings.top_k}, top-p {settings.top_p:g}, min-p "
                 f"{settings.min_p:g}, prompt i seeded {settings.seed} + i, ggspec and llama.cpp alike); their outputs "
                 "differ from run to run of another kind by design, so they have no `identical`: speculative sampling "
                 "is lossless in distribution (the tests check it), and τ / accept show what it costs.")
    if settings.profile:
        note += f" [forced: {settings.profile}] = BENCHMARK DEVICE: acceptance replayed from a histogram, not the draft's."
    return lines + note + "\n"
