"""`ggspec bench`: schema, row consistency, matrix expansion, Ctrl-C + --resume, native rows."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli
from typer.testing import CliRunner

from ggspec.bench import report
from ggspec.bench.configs import Axes, BenchConfig, expand, split_list
from ggspec.errors import InputError

SMALL = ("-r", "2", "-n", "12", "--no-warmup")


def _rows_are_consistent(rows: list[dict], n_prompts: int) -> None:
    for r in rows:
        assert list(r) == list(report.ROW_FIELDS)
        assert r["decode_tps_mean"] > 0 and r["decode_tps_sd"] >= 0
        if r["kind"] == "baseline":
            assert r["speedup_mean"] == 1.0 and r["tau_pooled"] is None
            continue
        if r["temp"]:  # sampled: outputs are not compared token for token
            assert r["identical"] is None
        else:
            done, total = map(int, r["identical"].split("/"))
            assert done == total  # every run printed the plain greedy text
        if r["kind"] == "native-baseline":  # llama.cpp's plain greedy: speed and text only
            assert r["speedup_mean"] > 0 and r["acceptance_rate"] is None and r["native_speedup_mean"] == 1.0
            continue
        assert 0 <= r["acceptance_rate"] <= 1  # accepted <= drafted
        # llama.cpp's loop too (from its draft dump): histogram, τ and per-position acceptance
        hist = r["accept_hist"]
        assert sum(hist) == r["steps"] and len(hist) <= r["n_max"] + 1
        committed = sum((a + 1) * c for a, c in enumerate(hist))
        assert r["tau_pooled"] == pytest.approx(committed / r["steps"], abs=1e-4)  # pooled = committed / steps
        accepted = sum(a * c for a, c in enumerate(hist))
        assert accepted <= r["acceptance_rate"] * r["steps"] * r["n_max"] + 1e-6
        assert 1 <= r["tau_request_mean"] <= r["n_max"] + 1 and 1 <= r["tau_token_weighted"] <= r["n_max"] + 1
        assert all(0 <= p <= 1 for p in r["position_acceptance"]) and len(r["position_acceptance"]) == r["n_max"]
        if r["kind"] == "native":
            continue
        shares = [r[f"share_{k}"] for k in ("draft", "verify", "inject", "replay", "overhead")]
        assert sum(shares) == pytest.approx(1, abs=1e-3)
        assert r["s_max"] > 0 and r["ms_target_1"] > 0
        assert r["speedup_mean"] == pytest.approx(r["decode_tps_mean"] / r["baseline_tps_mean"], rel=0.25)
    assert {r["n_prompts"] for r in rows if r["category"] == "all"} == {n_prompts}


@pytest.fixture(scope="module")
def matrix_2x2(tmp_path_factory, build_info):
    """A 2x2 matrix (K cache type x draft length) on the built-in pair, saved and printed as jsonl."""
    out = tmp_path_factory.mktemp("bench") / "m.json"
    proc = run_cli("bench", "--pair", "tiny-coder", "--matrix", "-ctk", "f16,q8_0", "--spec-draft-n-max", "3,7",
                   *SMALL, "-o", "jsonl", "--save", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_matrix_rows_follow_the_schema_and_add_up(matrix_2x2):
    path, proc = matrix_2x2
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    doc = json.loads(path.read_text())
    assert doc["schema"] == report.SCHEMA and doc["complete"] is True
    assert rows == doc["rows"]
    spec = {r["config"] for r in rows if r["kind"] == "spec"}
    base = {r["config"] for r in rows if r["kind"] == "baseline"}
    assert len(spec) == 4 and len(base) == 2  # one no-spec baseline per K cache type
    n_prompts = len(doc["settings"]["prompts"])
    assert len(doc["runs"]) == 4 * 2 * n_prompts * 2  # configs x reps x prompts x (run + paired baseline)
    categories = {r["category"] for r in rows}
    assert categories == {"all", "code-gen", "code-edit", "code-echo", "prose"}
    _rows_are_consistent(rows, n_prompts)
    meta = doc["meta"]
    assert len(meta["target_sha256"]) == 64 and meta["patches"] and meta["machine"]
    assert all(r["build"] == meta["build"] and r["target_sha256"] == meta["target_sha256"] for r in rows)


def test_matrix_writes_plots_and_csv(matrix_2x2):
    path, _ = matrix_2x2
    for suffix in ("-decode.png", "-acceptance.png"):
        png = path.with_name(path.stem + suffix)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(path.read_text())
    table = list(csv.reader(io.StringIO(report.to_csv(doc["rows"]))))
    assert tuple(table[0]) == report.ROW_FIELDS and len(table) == len(doc["rows"]) + 1


def test_interrupted_matrix_leaves_a_valid_file_and_resume_completes_it(tmp_path, build_info):
    path = tmp_path / "partial.json"
    args = ["bench", "--pair", "tiny-coder", "--matrix", "--spec-draft-n-max", "2,3,5,7", "-r", "3", "-n", "48",
            "--no-warmup", "--no-plot", "--save", str(path)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "ggspec.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 240
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)  # the file appears once the first configuration is done
    assert proc.poll() is None, "the matrix finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "continue with --resume" in err and "Traceback" not in err
    doc = json.loads(path.read_text())
    assert doc["complete"] is False
    done = {r["config"] for r in doc["rows"] if r["kind"] == "spec"}
    assert 1 <= len(done) < 4
    n_before = len(doc["runs"])

    proc = run_cli("bench", "--resume", str(path), "--no-plot", "-o", "json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(path.read_text())
    assert doc["complete"] is True and json.loads(proc.stdout)["complete"] is True
    n_prompts = len(doc["settings"]["prompts"])
    assert len(doc["runs"]) == 4 * 3 * n_prompts * 2 > n_before
    keys = [(r["config"], r["rep"], r["prompt"], r["paired_with"]) for r in doc["runs"]]
    assert len(keys) == len(set(keys))  # nothing measured twice
    _rows_are_consistent(doc["rows"], n_prompts)


def test_hybrid_planes_matrix_with_an_acceptance_profile(build_info):
    proc = run_cli("bench", "--pair", "tiny-hybrid", "--matrix", "--spec-draft-rs-planes", "3,uncapped",
                   "--spec-draft-rs-planes-lead", "0,default", "--spec-draft-n-max", "7",
                   "--acceptance-profile", "dflash", *SMALL, "-o", "jsonl", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "skipped: n7 f16/f16 -c 4096 planes uncapped lead 0 pruned: uncapped planes keep every state" in proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines() if '"all"' in line]
    _rows_are_consistent(rows, 12)
    spec = {(r["planes"], r["lead"]): r for r in rows if r["kind"] == "spec"}
    assert set(spec) == {("3", "0"), ("3", "default"), ("uncapped", "default")}
    assert all(r["acceptance_profile"] == "dflash" for r in spec.values())
    assert spec[("uncapped", "default")]["replay_share"] == 0
    assert spec[("3", "0")]["replay_share"] > spec[("3", "default")]["replay_share"] > 0  # the capped-planes table's shape
    assert spec[("3", "0")]["plane_bytes"] < spec[("uncapped", "default")]["plane_bytes"]
    # the same forced acceptance in every configuration
    assert len({tuple(r["accept_hist"]) for r in spec.values()}) == 1


def test_native_rows_from_llama_cpp_s_own_loop(build_info):
    """llama-speculative-simple (immediate, and patch 0003's deferral) with patch 0005's forced
    acceptance: the same text as plain greedy decoding, and the acceptance ggspec measured."""
    proc = run_cli("bench", "--pair", "tiny-coder", "--native", "--acceptance-profile", "mtp", "-r", "1", "-n", "24",
                   "--no-warmup", "-o", "jsonl", "--spec-draft-n-max", "7", timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = {(r["kind"], r["inject"]): r for r in map(json.loads, proc.stdout.splitlines()) if r["category"] == "all"}
    assert set(rows) == {("baseline", None), ("native-baseline", None), ("spec", "pruned"), ("native", "immediate"),
                         ("native", "deferred")}
    _rows_are_consistent(list(rows.values()), 12)
    ours = rows[("spec", "pruned")]["acceptance_rate"]
    for mode in ("immediate", "deferred"):
        assert rows[("native", mode)]["acceptance_rate"] == pytest.approx(ours, abs=0.05)
    # every row also against llama.cpp's plain greedy
    assert all(r["native_speedup_mean"] > 0 for r in rows.values())


def test_temperature_axis_with_llama_cpp_s_loop(tmp_path, build_info):
    """--temp 0,0.7: greedy rows compared token for token, sampled rows labelled with their
    temperature and compared by acceptance (ggspec's rejection sampler next to llama.cpp's loop at the
    same sampler settings and seeds); the seed is kept in the saved settings."""
    out = tmp_path / "t.json"
    proc = run_cli("bench", "--pair", "tiny-coder", "--native", "--matrix", "--temp", "0,0.7", "--spec-draft-n-max", "7",
                   "--prompts", str(_prompts(tmp_path, 3)), "-r", "1", "-n", "24", "--no-warmup", "-s", "11",
                   "--top-k", "20", "-o", "jsonl", "--save", str(out), "--no-plot", timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    _rows_are_consistent(rows, 3)
    by = {(r["kind"], r["inject"], r["temp"]): r for r in rows if r["category"] == "all"}
    kinds = {("baseline", None), ("native-baseline", None), ("spec", "pruned"), ("native", "immediate"),
             ("native", "deferred")}
    assert set(by) == {(k, i, t) for k, i in kinds for t in (0.0, 0.7)}
    for (kind, _, temp), r in by.items():
        assert ("temp 0.7" in r["label"]) == (temp > 0)
        if kind in ("spec", "native"):
            assert 1 < r["tau_pooled"] < 8
    # sampling accepts less than greedy decoding on the tiny pair, in both loops
    for kind, inject in (("spec", "pruned"), ("native", "immediate")):
        assert by[(kind, inject, 0.7)]["acceptance_rate"] < by[(kind, inject, 0.0)]["acceptance_rate"]
    doc = json.loads(out.read_text())
    assert doc["settings"]["seed"] == 11 and doc["settings"]["top_k"] == 20
    assert report.settings_from(doc).sampling(0.7).top_k == 20
    text = report.to_markdown(rows, report.settings_from(doc))
    assert "top-k 20" in text and "seeded 11 + i" in text


def test_an_acceptance_profile_beside_an_engine_plain_by_cost(build_info, monkeypatch, tmp_path):
    """`auto` with an acceptance profile, where the calibration says no draft length pays: that
    engine has no proposer to arm (it decodes plainly), so its row is plain decoding (k 0 on every
    step) beside the fixed length's forced row, not a traceback (it was: 'NoneType' has no 'arm')."""
    import ggspec.cli
    from ggspec.speculative.rules import calibration
    from ggspec.speculative.rules.draft_length import DraftLength

    monkeypatch.setattr(calibration, "cache_dir", lambda: tmp_path / "calibration")
    monkeypatch.setattr(DraftLength, "hopeless", lambda self, n_live: True)
    result = CliRunner().invoke(ggspec.cli.app, ["bench", "--pair", "tiny-coder", "--acceptance-profile", "dflash",
                                                 "--spec-draft-n-max", "3,auto", "--matrix", "-t", "1", *SMALL,
                                                 "--prompts", str(_prompts(tmp_path, 2)), "-o", "jsonl"])
    assert result.exit_code == 0, result.output
    rows = {(r["kind"], r["n_max"]): r for r in map(json.loads, result.stdout.splitlines()) if r["category"] == "all"}
    auto = next(r for (kind, n), r in rows.items() if kind == "spec" and r["k_hist"] is not None)
    assert auto["k0_share"] == 1.0 and auto["tau_pooled"] is None and auto["identical"] == "4/4"
    assert rows[("spec", 3)]["acceptance_rate"] > 0 and rows[("spec", 3)]["identical"] == "4/4"


def test_temperature_needs_no_acceptance_profile(build_info):
    proc = run_cli("bench", "--pair", "tiny-coder", "--temp", "0.7", "--acceptance-profile", "mtp", "-n", "8", "-r", "1")
    assert proc.returncode == 1
    assert "temperature 0 only" in proc.stderr and "Traceback" not in proc.stderr


def test_a_random_seed_is_drawn_once_and_saved(tmp_path, build_info):
    out = tmp_path / "s.json"
    proc = run_cli("bench", "--pair", "tiny-coder", "--temp", "1.0", "--prompts", str(_prompts(tmp_path, 1)), "-r", "1",
                   "-n", "8", "--no-warmup", "--save", str(out), "--no-plot", timeout=300)
    assert proc.returncode == 0, proc.stderr
    seed = json.loads(out.read_text())["settings"]["seed"]
    assert 0 <= seed < 2**32 - 1
    assert f"seeded {seed} + i" in proc.stdout


def _prompts(tmp_path, n: int = 2) -> Path:
    path = tmp_path / "prompts.jsonl"
    texts = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "The quick brown fox"][:n]
    path.write_text("".join(json.dumps({"prompt": t, "category": "code"}) + "\n" for t in texts))
    return path


def test_a_lone_model_benches_its_text_drafter_beside_llama_cpps_ngram_types(tmp_path, build_info):
    """No draft, no type: the lone-model default (suffix, adaptive) against ggspec's plain, and
    llama.cpp's plain and its own loop with each of its n-gram types on the same prompts; every
    row's text is plain greedy text."""
    target = Path(__file__).resolve().parents[1] / "models" / "tiny" / "tiny-coder.gguf"
    out = tmp_path / "lone.json"
    proc = run_cli("bench", "-m", str(target), "--native", "--prompts", str(_prompts(tmp_path)), "-r", "1", "-n", "32",
                   "--no-warmup", "-o", "md", "--save", str(out), "--no-plot", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "drafts from the text itself (suffix)" in proc.stderr
    assert "drafter: suffix (a lone model's default" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["settings"]["spec_type"] == "suffix"
    labels = {r["label"] for r in doc["rows"] if r["category"] == "all"}
    natives = sorted(r["label"].split()[1] for r in doc["rows"] if r["kind"] == "native" and r["category"] == "all")
    assert natives == ["ngram-cache", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-simple"], labels
    assert all(r["identical"] == "2/2" for r in doc["rows"] if r["kind"] in ("spec", "native") and r["category"] == "all")


def test_native_target_only_bench_runs_both_plain_rows(tmp_path, build_info):
    """--spec-type none: ggspec's --no-spec and llama.cpp's plain greedy (llama-completion), same
    text, with their ratio both ways."""
    target = Path(__file__).resolve().parents[1] / "models" / "tiny" / "tiny-coder.gguf"
    out = tmp_path / "runs" / "plain.json"  # --save creates its directory
    proc = run_cli("bench", "-m", str(target), "--spec-type", "none", "--native", "--prompts", str(_prompts(tmp_path)),
                   "-r", "2", "-n", "32", "--no-warmup", "-o", "md", "--save", str(out), "--no-plot", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| llama.cpp no-spec f16/f16 | all |" in proc.stdout and "vs llama.cpp no-spec" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["meta"]["draft"] == "" and doc["meta"]["draft_sha256"] is None
    rows = {r["kind"]: r for r in doc["rows"]}
    assert list(rows) == ["baseline", "native-baseline"]
    _rows_are_consistent(list(rows.values()), 2)
    assert rows["native-baseline"]["identical"] == "4/4"
    ours, theirs = rows["baseline"], rows["native-baseline"]
    # llama.cpp's row: its paired ratio to ggspec; ggspec's row: its ratio to llama.cpp (two
    # aggregations of a few noisy timings, per pair and per repetition: a busy machine parts them)
    assert theirs["speedup_mean"] * ours["native_speedup_mean"] == pytest.approx(1, rel=0.5)
    assert ours["native_baseline_tps_mean"] == pytest.approx(theirs["decode_tps_mean"], rel=0.1)  # pooled vs per rep


def test_bench_fits_the_default_draft_length_to_the_block(dense_pair, tmp_path, build_info):
    """A block-8 draft and no --spec-draft-n-max: n_max 7, silently (as `ggspec run`); a typed
    length beyond the block is skipped with the reason."""
    common = ["bench", "-m", str(dense_pair.target), "-md", str(dense_pair.draft), "--prompts",
              str(_prompts(tmp_path, 1)), "-r", "1", "-n", "8", "--no-warmup", "-o", "jsonl"]
    proc = run_cli(*common, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "skipped" not in proc.stderr and "warning" not in proc.stderr, proc.stderr
    spec = [r for r in map(json.loads, proc.stdout.splitlines()) if r["kind"] == "spec"]
    assert [r["n_max"] for r in spec] == [7]
    proc = run_cli(*common, "--spec-draft-n-max", "15", timeout=120)
    assert proc.returncode == 1 and "no configuration left to run" in proc.stderr
    assert "the draft's block allows at most 7 draft tokens per step" in proc.stderr


@pytest.mark.parametrize("args, msg", [
    (("--spec-type", "none"), "--spec-type none: nothing speculates; add --native"),
    (("--spec-type", "none", "--native", "--spec-draft-n-max", "7"),
     "--spec-draft-n-max: speculative settings do not apply: --spec-type none decodes plainly"),
])
def test_target_only_bench_input(args, msg, dense_pair):
    proc = run_cli("bench", "-m", str(dense_pair.target), *args)
    assert proc.returncode == 1 and msg in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, msg", [
    (("--spec-draft-n-max", "3,7"), "add --matrix"),
    (("-o", "xml"), "-o xml"),
    (("--acceptance-profile", "nope"), "neither a built-in profile"),
    (("-ctk", "f16,,q8_0", "--matrix"), "empty item"),
    (("-ctk", "f17"), "unknown cache type"),
    (("--spec-draft-n-max", "x"), "comma list of numbers"),
    (("--resume", "/nonexistent.json"), "no such file"),
    (("-r", "0"), "at least 1"),
])
def test_bad_bench_input_is_one_line(args, msg, build_info):
    proc = run_cli("bench", "--pair", "tiny-coder", *args) if "--resume" not in args else run_cli("bench", *args)
    assert proc.returncode != 0 and msg in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_resume_refuses_new_settings(tmp_path):
    proc = run_cli("bench", "--resume", str(tmp_path / "x.json"), "-ctk", "q8_0")
    assert proc.returncode == 1 and "--resume continues with the saved settings: drop -ctk" in proc.stderr


def test_prompt_files_are_checked(tmp_path, build_info):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "def f():", "category": "code"}\n{"text": "oops"}\n')
    proc = run_cli("bench", "--pair", "tiny-coder", "--prompts", str(bad))
    assert proc.returncode == 1 and f"{bad}:2: expected an object" in proc.stderr


def test_expand_skips_invalid_combinations_with_a_reason():
    axes = Axes(n_max=(3, 7), planes=("3", "5", "uncapped"), lead=("0", "auto"))
    configs, skipped = expand(axes, recurrent=True, n_tokens=100)
    reasons = {s.reason for s in skipped}
    assert any("must be 2..4" in r for r in reasons)  # 5 planes > n_max + 1 = 4
    assert any("the lead changes nothing" in r for r in reasons)
    assert len(configs) == 2 * 2 + 2 * 1  # planes 3 x {0, auto} for both n_max, planes 5 x {0, auto} at n_max 7
    dense, skipped = expand(axes, recurrent=False, n_tokens=100)
    assert dense == [] and all("hybrid targets only" in s.reason for s in skipped)
    configs, skipped = expand(Axes(n_ctx=(128, 4096)), recurrent=False, n_tokens=120)
    assert [c.n_ctx for c in configs] == [4096] and "too small" in skipped[0].reason
    configs, skipped = expand(Axes(n_max=(3, 7)), recurrent=False, n_tokens=10, profile_len=8)
    assert [c.n_max for c in configs] == [7] and "needs 4" in skipped[0].reason
    configs, skipped = expand(Axes(n_max=(7, 15)), recurrent=False, n_tokens=10, n_max_limit=7)
    assert [c.n_max for c in configs] == [7] and "at most 7 draft tokens" in skipped[0].reason


def test_expand_puts_llama_cpp_s_plain_row_next_to_each_baseline():
    configs, _ = expand(Axes(ctk=("f16", "q8_0"), n_max=(3, 7)), recurrent=False, n_tokens=10, native=True)
    assert [(c.kind, c.ctk, c.n_max, c.inject) for c in configs] == [
        ("native-baseline", "f16", 0, ""), ("spec", "f16", 3, "pruned"), ("spec", "f16", 7, "pruned"),
        ("native-baseline", "q8_0", 0, ""), ("spec", "q8_0", 3, "pruned"), ("spec", "q8_0", 7, "pruned"),
        *[("native", ctk, n, mode) for ctk in ("f16", "q8_0") for n in (3, 7) for mode in ("immediate", "deferred")]]
    assert configs[0].label == "llama.cpp no-spec f16/f16" and configs[0].baseline().kind == "baseline"
    # target only: the plain rows alone (and nothing at all without --native)
    plain, skipped = expand(Axes(n_ctx=(64, 4096)), recurrent=False, n_tokens=100, native=True, speculative=False)
    assert [(c.kind, c.n_ctx) for c in plain] == [("native-baseline", 4096)] and "too small" in skipped[0].reason
    assert expand(Axes(), recurrent=False, n_tokens=10, speculative=False)[0] == []


def test_split_list():
    assert split_list("-c", "1024, 4096", (1,), int) == (1024, 4096)
    assert split_list("-c", None, (1,), int) == (1,)
    with pytest.raises(InputError, match="listed twice"):
        split_list("-ctk", "f16,f16", ())


def test_every_column_is_documented_on_the_bench_page():
    """docs/commands/bench.md's schema section names every csv / jsonl column (the share_* columns
    as one range); only that section counts, up to the page's next heading."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "commands" / "bench.md").read_text()
    schema = page[page.index("## Output schema `ggspec-bench/1`"):]
    end = schema.find("\n## ", 1)
    schema = schema if end < 0 else schema[:end]
    assert "| column | meaning |" in schema
    missing = [f for f in report.ROW_FIELDS if f not in schema and not f.startswith("share_")]
    assert not missing, missing


@pytest.mark.real
def test_real_pair_plain_side_by_side_with_llama_cpp(real_target, tmp_path, build_info):
    """The real Gemma 3 270M (262k vocabulary, Q4_K_M) alone: `--pair gemma-3-270m --native` runs
    the lone-model default (suffix) and the plain rows, and llama.cpp's own loop with each of its
    n-gram types; every text equals ggspec's plain greedy text byte for byte (the same build, the
    same attention setting, the CPU backend's batch invariance)."""
    proc = run_cli("bench", "--pair", "gemma-3-270m", "--native", "--prompts", str(_prompts(tmp_path)), "-r", "1",
                   "-n", "16", "--no-warmup", "-o", "jsonl", timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in map(json.loads, proc.stdout.splitlines()) if r["category"] == "all"]
    assert sorted({r["kind"] for r in rows}) == ["baseline", "native", "native-baseline", "spec"]
    for r in rows:
        if r["kind"] != "baseline":
            assert r["identical"] == "2/2" and not r["near_ties"] and not r["real_divergences"], r
    assert next(r for r in rows if r["kind"] == "baseline")["native_speedup_mean"] > 0


# --- parallel sequences ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parallel_1_2(tmp_path_factory, build_info):
    """-np 1,2 on the built-in pair: the spec configuration and its baseline at both levels."""
    tmp = tmp_path_factory.mktemp("parallel")
    out = tmp / "p.json"
    proc = run_cli("bench", "--pair", "tiny-coder", "--matrix", "--parallel", "1,2", "--prompts", str(_prompts(tmp, 3)),
                   "--spec-draft-n-max", "7", *SMALL, "-o", "jsonl", "--save", str(out), "--no-plot", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out, [json.loads(line) for line in proc.stdout.splitlines()]


def test_parallel_axis_rows(parallel_1_2):
    path, rows = parallel_1_2
    doc = json.loads(path.read_text())
    assert rows == doc["rows"]
    _rows_are_consistent(rows, 3)
    by = {(r["kind"], r["parallel"]): r for r in rows}
    assert set(by) == {("spec", 1), ("spec", 2), ("baseline", 1), ("baseline", 2)}
    one, two = by[("spec", 1)], by[("spec", 2)]
    # parallel 1 is what it always was: no parallel in the key or label, aggregate = per-sequence t/s
    assert "parallel" not in one["config"] and "-np" not in one["label"]
    assert "parallel=2" in two["config"] and two["label"].endswith("-np 2")
    assert one["decode_tps_mean"] == one["seq_tps_mean"]
    assert by[("baseline", 1)]["identical"] is None
    # every sequence at -np 2 equals its prompt's solo plain greedy output, speculative or not
    assert two["identical"] == "6/6" and by[("baseline", 2)]["identical"] == "6/6"
    for r in rows:
        assert r["seq_tps_mean"] > 0 and r["calls_per_step"] > 0
    # one llama.cpp call per plain step whatever the parallel level; speculative steps do not grow
    # with the number of sequences (one injection, one draft, one verify)
    assert by[("baseline", 1)]["calls_per_step"] == by[("baseline", 2)]["calls_per_step"] == 1.0
    assert 2 <= two["calls_per_step"] <= 3 and 2 <= one["calls_per_step"] <= 3
    # the speedup is against the no-spec baseline of the same parallel level
    assert two["baseline_tps_mean"] == pytest.approx(by[("baseline", 2)]["decode_tps_mean"], rel=0.3)
    runs = [r for r in doc["runs"] if r["config"] == two["config"]]
    assert len(runs) == 6 and all(r["engine_t"] > 0 and r["engine_steps"] > 0 for r in runs)
    # the aggregate is the sum of tokens over the engine's transaction time (each run's share of it)
    for rep in (0, 1):
        mine = [r for r in runs if r["rep"] == rep]
        assert sum(r["engine_t"] for r in mine) < sum(r["stats"]["t_decode"] for r in mine)


def test_parallel_markdown_shows_per_sequence_speed(parallel_1_2):
    path, rows = parallel_1_2
    doc = json.loads(path.read_text())
    settings = report.settings_from(doc)
    text = report.to_markdown(rows, settings)
    assert "| decode t/s (aggregate) | per-seq t/s | calls/step | speedup |" in text and "-np 2" in text
    solo = report.to_markdown([r for r in rows if r["parallel"] == 1], settings)
    assert "per-seq" not in solo and "| decode t/s | speedup |" in solo


def test_resume_of_a_file_saved_before_parallel(parallel_1_2, tmp_path):
    """An old document (no parallel, no engine shares, no spec type) resumes and reports as before."""
    path, _ = parallel_1_2
    doc = json.loads(path.read_text())
    doc["configs"] = [c for c in doc["configs"] if c.pop("parallel") == 1]
    old_keys = {BenchConfig(**c).key for c in doc["configs"]} | {BenchConfig(**c).baseline().key for c in doc["configs"]}
    runs = [r for r in doc["runs"] if r["config"] in old_keys and r["rep"] == 0]
    for r in runs:
        for f in ("engine_t", "engine_calls", "engine_steps"):
            r.pop(f)
    doc.update(runs=runs, complete=False, rows=[])
    for f in ("spec_type", "p_min", "ngram_size_n", "ngram_size_m"):
        doc["settings"].pop(f)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    proc = run_cli("bench", "--resume", str(old), "--no-plot", "-o", "jsonl", timeout=300)
    assert proc.returncode == 0, proc.stderr
    new = json.loads(old.read_text())
    assert new["complete"] is True and len(new["runs"]) == 2 * 3 * 2
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    _rows_are_consistent(rows, 3)
    assert {r["parallel"] for r in rows} == {1}


def test_ngram_simple_bench_needs_no_draft(dense_pair, tmp_path):
    path = tmp_path / "rep.jsonl"
    path.write_text(json.dumps({"prompt": "a b c d a b c d a b c d a b c d", "category": "echo"}) + "\n")
    proc = run_cli("bench", "-m", str(dense_pair.target), "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
                   "3", "--prompts", str(path), "-r", "1", "-n", "16", "--no-warmup", "-o", "jsonl", "-np", "1,2",
                   "--matrix", timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = {(r["kind"], r["parallel"]): r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(rows) == {("spec", 1), ("spec", 2), ("baseline", 1), ("baseline", 2)}
    assert rows[("spec", 1)]["inject"] is None and rows[("spec", 1)]["identical"] == "1/1"
    doc_settings = rows[("spec", 1)]
    assert doc_settings["acceptance_rate"] is not None


def test_expand_parallel_levels():
    configs, skipped = expand(Axes(n_max=(7,), parallel=(1, 4)), recurrent=False, n_tokens=100, native=True)
    assert [(c.kind, c.parallel, c.inject) for c in configs] == [
        ("native-baseline", 1, ""), ("spec", 1, "pruned"), ("spec", 4, "pruned"),
        ("native", 1, "immediate"), ("native", 1, "deferred")]
    assert any("parallel 1 only" in s.reason and "-np 4" in s.label for s in skipped)
    assert configs[2].baseline() == BenchConfig("baseline", n_ctx=4096, parallel=4)
    assert configs[2].solo() == BenchConfig("baseline", n_ctx=4096)
    assert configs[1].key == "kind=spec|ctk=f16|ctv=f16|n_ctx=4096|n_max=7|inject=pruned"  # as before parallel
    # the shared cache must hold every sequence, the batch every verify block
    configs, skipped = expand(Axes(n_ctx=(1024,), n_max=(15,), parallel=(2, 8, 64)), recurrent=False, n_tokens=200)
    assert [c.parallel for c in configs] == [2]
    assert [s.reason.split(":")[0] for s in skipped] == ["-c 1024 is too small for -np 8", "-c 1024 is too small for -np 64"]
    _, skipped = expand(Axes(n_ctx=(65536,), n_max=(15,), parallel=(64,)), recurrent=False, n_tokens=200)
    assert "-np 64 x (n_max 15 + 1) verify rows exceed the batch of 512 tokens" in skipped[0].reason
    plain, skipped = expand(Axes(parallel=(1, 2)), recurrent=False, n_tokens=10, native=True, speculative=False)
    assert [(c.kind, c.parallel) for c in plain] == [("native-baseline", 1)] and "parallel 1 only" in skipped[0].reason
    ngram, _ = expand(Axes(inject=("pruned", "deferred")), recurrent=False, n_tokens=10, dflash=False)
    assert [c.inject for c in ngram] == [""]
    with pytest.raises(InputError, match=r"1\.\.256 \(got 0\)") as exc:  # PairConfig's own rule
        expand(Axes(parallel=(0,)), recurrent=False, n_tokens=10)
    assert exc.value.field == "parallel"


def test_bench_documents_store_portable_model_paths(tmp_path, monkeypatch):
    """Model paths in bench documents: repository-relative for files in it (a clone elsewhere reads
    the same document), `$GGSPEC_HOME/...` for pulled and made models, absolute otherwise."""
    from pathlib import Path

    from ggspec.files import local_path, portable_path
    from ggspec.native.paths import REPO_ROOT

    home = tmp_path / "home"
    monkeypatch.setenv("GGSPEC_HOME", str(home))
    shipped = REPO_ROOT / "models" / "tiny" / "tiny-coder.gguf"
    pulled = home / "models" / "x.gguf"
    own = tmp_path / "mine" / "y.gguf"
    assert portable_path(shipped) == "models/tiny/tiny-coder.gguf"
    assert portable_path(pulled) == "$GGSPEC_HOME/models/x.gguf"
    assert portable_path(own) == str(own)
    for path in (shipped, pulled, own):
        assert local_path(portable_path(path)) == path
    assert local_path("models/tiny/tiny-coder.gguf").is_file()
    assert Path(portable_path(Path("models/tiny/tiny-coder.gguf"))) == Path("models/tiny/tiny-coder.gguf")


def test_committed_documents_name_no_machine_folders():
    """What is committed must read the same on any machine: no absolute folders of the machine
    a measurement ran on, in the bench documents, the catalog or the docs."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [*root.glob("docs/**/*.json"), *root.glob("docs/**/*.md"), root / "models.toml", root / "README.md"]
    machine = re.compile(r"(?<![\w.~$])/(?:work|root|home|tmp)/\w")
    found = [f"{p.relative_to(root)}: {m.group(0)}" for p in files for m in machine.finditer(p.read_text())]
    assert not found, found
