"""The CLI end to end: `ggspec run` streams the same text with and without speculation."""

from __future__ import annotations

import re

import pytest
from conftest import run_cli

from ggspec.cli.run import parse_prompt_lines


def _split(proc):
    assert proc.returncode == 0, proc.stderr
    stats = [ln for ln in proc.stderr.splitlines() if " tokens  decode " in ln]
    assert len(stats) == 1, proc.stderr
    return proc.stdout, stats[0]


def test_run_dflash_matches_no_spec(dense_pair):
    common = ["-m", str(dense_pair.target), "-p", "class Stack:", "-n", "96", "--ignore-eos"]
    spec_out, spec_stats = _split(run_cli("run", *common, "-md", str(dense_pair.draft), "--dflash",
                                          "--spec-draft-n-max", "7"))
    plain_out, plain_stats = _split(run_cli("run", *common, "--no-spec"))
    assert spec_out == plain_out and spec_out.startswith("class Stack:")
    assert re.search(r"96 tokens .*τ \d+\.\d\d \(pooled", spec_stats), spec_stats
    for phase in ("draft", "verify", "inject", "overhead"):
        assert phase in spec_stats
    assert "no speculation" in plain_stats


def test_draft_type_is_auto_detected(hybrid_pair):
    proc = run_cli("run", "-m", str(hybrid_pair.target), "-md", str(hybrid_pair.draft), "-n", "16",
                   "--spec-draft-n-max", "7")  # (a fixed length: the default may find no length pays here)
    _, stats = _split(proc)
    assert "draft-dflash n_max 7" in stats and "τ" in stats


def test_builtin_pair(build_info):
    out, stats = _split(run_cli("run", "--pair", "tiny-hybrid", "-p", "x = ", "-n", "8", "--ignore-eos"))
    assert out.startswith("x = ") and "8 tokens" in stats


def test_help_is_complete():
    top = run_cli("--help")
    assert top.returncode == 0 and "build" in top.stdout and "run" in top.stdout
    run_help = run_cli("run", "--help").stdout
    for flag in ("-m", "-md", "--dflash", "--no-draft", "--no-dflash", "--no-spec", "-p", "-n", "--spec-draft-n-max",
                 "-c", "-ctk", "-ctv", "-t", "--pair", "--ignore-eos", "-f", "-np", "--spec-type", "--spec-draft-p-min",
                 "-ngl", "N|all|auto"):
        assert flag in run_help, flag
    bench_help = run_cli("bench", "--help").stdout
    for flag in ("-np", "--spec-type", "--spec-draft-p-min", "--spec-draft-n-max", "-ctk", "--rpc-timeout", "-fa"):
        assert flag in bench_help, flag
    build_help = run_cli("build", "--help").stdout
    for flag in ("--cuda", "--vulkan", "--tools", "--force"):
        assert flag in build_help, flag


def test_llama_cpp_s_spellings_run(build_info):
    """-ngl auto / all, -fa's other words and llama.cpp's long names work as in llama.cpp's tools
    (on this machine's build: auto offloads where there is a GPU, else nothing)."""
    out, stats = _split(run_cli("run", "--pair", "tiny-coder", "--predict", "8", "--ignore-eos", "-ngl", "auto",
                                "-ngld", "auto", "-fa", "enabled", "--temperature", "0"))
    assert out.startswith("def fibonacci(n):") and "8 tokens" in stats
    proc = run_cli("run", "--pair", "tiny-coder", "-n", "4", "-ngl", "most")
    assert proc.returncode == 1 and proc.stderr.strip() == "error: -ngl: most: expected a number of layers, all or auto"


def test_default_n_max_fits_the_draft_without_a_warning(dense_pair):
    """The dense fixture's draft has block 8: the default cap 15 becomes 7 silently; a typed 15 warns."""
    common = ["run", "-m", str(dense_pair.target), "-md", str(dense_pair.draft), "-n", "8"]
    proc = run_cli(*common)
    _, stats = _split(proc)
    assert "≤ 7" in stats and "warning" not in proc.stderr, proc.stderr  # (auto ≤ 7, or plain: no length ≤ 7 pays)
    proc = run_cli(*common, "--spec-draft-n-max", "15")
    _, stats = _split(proc)
    assert "n_max 7" in stats
    assert re.search(r"warning: a draft length of 15 exceeds the draft's block.*; using 7", proc.stderr), proc.stderr


def test_n_beyond_the_context_warns_up_front(build_info):
    """-n larger than the context can hold: generation stops when it is full, and the user is told
    before it starts (it used to end with exit 0 and fewer tokens, silently)."""
    proc = run_cli("run", "--pair", "tiny-coder", "-n", "5000", "-c", "128", "-p", "def f(x):", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert "warning: -n 5000" in proc.stderr and "raise -c" in proc.stderr
    room = int(re.search(r"room for about (\d+) generated tokens", proc.stderr).group(1))
    n = int(proc.stderr.split(" tokens  decode")[0].split()[-1])
    assert 0 < room - 8 <= n <= room + 1  # stops at the full context (a spec step may stop a block early)


# --- several prompts, -np at a time ---------------------------------------------------------------

FILE_PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "The quick brown fox",
                "import os\nimport sys\n\n"]


def test_prompt_file_format():
    text = "a\\nb\n\n   \nc \\\\n d\r\n\\t stays\n"
    assert parse_prompt_lines(text) == ["a\nb", "c \\n d", "\\t stays"]
    assert parse_prompt_lines("\n \n") == []


def test_run_file_in_parallel_prints_every_output_in_order_as_solo(build_info, tmp_path):
    """-f with -np 3: four prompts through continuous batching (the fourth joins when a slot
    frees); each output is the solo plain greedy one, in file order, each with its stats line,
    then the aggregate line."""
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(p.replace("\n", "\\n") for p in FILE_PROMPTS[:2]) + "\n\n"
                    + "\n".join(p.replace("\n", "\\n") for p in FILE_PROMPTS[2:]) + "\n")
    common = ["--pair", "tiny-coder", "-n", "24", "--ignore-eos"]
    # (a fixed length, so every prompt speculates whatever this machine's costs say)
    proc = run_cli("run", *common, "-f", str(path), "-np", "3", "--spec-draft-n-max", "7")
    assert proc.returncode == 0, proc.stderr
    solo = "".join(_split(run_cli("run", *common, "--no-spec", "-p", p))[0] for p in FILE_PROMPTS)
    assert proc.stdout == solo
    stats = [ln for ln in proc.stderr.splitlines() if " tokens  decode " in ln]
    assert len(stats) == 4 and all("τ" in ln for ln in stats), proc.stderr
    aggregate, last = proc.stderr.strip().splitlines()[-2:]
    assert last == ("speedup vs plain decoding: not measured for several prompts; "
                    "`ggspec bench --pair tiny-coder -np 3` measures it"), last
    last = aggregate
    assert re.search(r"4 sequences \(-np 3\)  \d+ tokens  aggregate decode \d+\.\d t/s  \d+\.\d\d llama\.cpp calls "
                     r"per step \(\d+ steps\)  τ \d+\.\d\d \(pooled\)", last), last


def test_run_parallel_without_a_file_and_plain(build_info, tmp_path):
    """-np without -f is one prompt; --no-spec with -f batches plain decoding alike."""
    out, stats = _split(run_cli("run", "--pair", "tiny-coder", "-np", "4", "-n", "16", "--ignore-eos"))
    assert out.startswith("def fibonacci(n):") and "16 tokens" in stats
    path = tmp_path / "p.txt"
    path.write_text("\n".join(p.replace("\n", "\\n") for p in FILE_PROMPTS) + "\n")
    plain = ["run", "--pair", "tiny-coder", "--no-spec", "-f", str(path), "-n", "16", "--ignore-eos"]
    one, two = run_cli(*plain), run_cli(*plain, "-np", "2")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert two.stdout == one.stdout and one.stdout.startswith(FILE_PROMPTS[0])
    assert "4 sequences (-np 2)" in two.stderr and "τ" not in two.stderr.splitlines()[-1]


@pytest.mark.parametrize("args, needle", [
    (["-p", "x", "-f", "FILE"], "-p and -f are exclusive"),
    (["-f", "EMPTY"], "no prompt in the file"),
    (["-f", "/nonexistent/prompts.txt"], "no such file"),
])
def test_prompt_file_errors(build_info, tmp_path, args, needle):
    (tmp_path / "f.txt").write_text("x\n")
    (tmp_path / "e.txt").write_text("\n  \n")
    args = [str(tmp_path / "f.txt") if a == "FILE" else str(tmp_path / "e.txt") if a == "EMPTY" else a for a in args]
    proc = run_cli("run", "--pair", "tiny-coder", *args)
    assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# --- speculative types ------------------------------------------------------------------------------


def test_ngram_simple_runs_without_a_draft(dense_pair):
    """--spec-type ngram-simple drafts from the text: no -md needed, and the output is plain greedy's."""
    common = ["-m", str(dense_pair.target), "-p", "a b c d a b c d a b c d a b c d", "-n", "48", "--ignore-eos"]
    spec_out, spec_stats = _split(run_cli("run", *common, "--spec-type", "ngram-simple",
                                          "--spec-ngram-simple-size-n", "3"))
    plain_out, _ = _split(run_cli("run", *common, "--no-spec"))
    assert spec_out == plain_out and "τ" in spec_stats


def test_dspark_on_a_plain_dflash_draft_is_refused(dense_pair):
    proc = run_cli("run", "-m", str(dense_pair.target), "-md", str(dense_pair.draft), "--spec-type", "draft-dspark")
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert errors[0].startswith("error: --spec-type: draft-dspark needs a DSpark draft"), errors[0]


def test_run_check_says_which_kind_any_difference_is(build_info, tmp_path):
    """--check decodes each prompt plain afterwards: identical, a benign near-tie or a REAL
    divergence, one line per prompt and a summary; it needs speculation at temperature 0."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def fibonacci(n):\nclass Stack:\n")
    proc = run_cli("run", "--pair", "tiny-coder", "-f", str(prompts), "-n", "24", "--check")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("check:")]
    assert len(lines) == 3 and lines[-1].startswith("check: ") and "REAL divergences" in lines[-1]
    assert all("identical to plain greedy" in ln or "benign near-tie" in ln for ln in lines[:2]), lines
    proc = run_cli("run", "--pair", "tiny-coder", "--no-spec", "--check", "-n", "4")
    assert proc.returncode == 1 and "--check compares speculative greedy output" in proc.stderr
    assert "Traceback" not in proc.stderr


_VERDICT = re.compile(r"speculation (paid|broke even|lost on this machine): (\d+\.\d\d)× plain decoding "
                      r"\((\d+\.\d) vs (\d+\.\d) t/s, (?:one warm run each|median of (\d) alternating warm runs "
                      r"each, paired ratios (\d+\.\d\d)-(\d+\.\d\d)×)(?:; output ([^)]*))?\)")


def test_run_ends_saying_whether_speculation_paid(build_info):
    """The demo's last line: the speedup against plain decoding of the same prompt, timed right
    after on the same engine in alternating warm runs (the median of the paired ratios, with their
    range); at temperature 0 also whether the two outputs are identical."""
    proc = run_cli("run", "--pair", "tiny-coder", "-p", "class Stack:", "-n", "48", "-t", "1", "--spec-draft-n-max", "7")
    assert proc.returncode == 0, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    m = _VERDICT.match(last)
    assert m, last
    ratio = float(m[2])
    pairs = int(m[5] or 1)  # a 48-token decode is short: the verdict has time for several pairs
    assert pairs >= 2 and float(m[6]) <= ratio <= float(m[7]), last
    assert m[1] == ("paid" if ratio >= 1.05 else "broke even" if ratio > 0.95 else "lost on this machine"), last
    assert m[8] == "identical to plain greedy" or m[8].startswith("benign near-tie"), last
    assert ("try " in last) == (m[1] != "paid" and m[1] != "broke even")


def test_the_default_speculates_only_where_a_length_pays(build_info):
    """By default (the adaptive length) the last line is the timed verdict, or, where the calibrated
    costs say no length pays, that it decoded plainly (with a note). (Speed is not asserted here:
    `ggspec bench` measures it.)"""
    proc = run_cli("run", "--pair", "tiny-coder", "-p", "class Stack:", "-n", "48", "-t", "1")
    assert proc.returncode == 0, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    if "no draft length pays" in last:
        assert last.startswith("speculation broke even") and "note: no draft length pays" in proc.stderr, proc.stderr
        assert "(plain: no draft-dflash draft length ≤ 7 pays on this machine)" in proc.stderr
    else:
        m = _VERDICT.match(last)
        assert m and "auto ≤ 7" in proc.stderr, proc.stderr


def test_the_verdict_times_warm_runs_in_turn_plain_first(build_info):
    """The decode the user saw went first, cold: the verdict's runs alternate after it, plain first,
    as many pairs as the budget allows (one at least, PAIRS at most); the plain tokens are plain
    greedy's, and every timed run decodes the whole budget."""
    from helpers.pairs import DFLASH, TARGET

    from ggspec.cli.verdict import PAIRS, timed_pairs
    from ggspec.runtime import ContextParams
    from ggspec.speculative.driver import decode_plain
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import PairConfig

    cfg = PairConfig(target=TARGET, draft=DFLASH, n_max=7, ctx=ContextParams(n_ctx=1024, n_threads=1))
    with Engine.open(cfg) as sp:
        prompt = sp.target_model.tokenize("class Stack:")
        calls = []
        target_decode = sp.target.decode
        sp.target.decode = lambda batch: (calls.append(sp.active[0].speculate), target_decode(batch))[1]
        spec, plain, tokens = timed_pairs(sp, prompt, 24, True, budget=0.0)
        sp.target.decode = target_decode
        assert len(spec) == len(plain) == 1 and min(spec + plain) > 0
        assert calls[0] is False and calls[-1] is True and calls == sorted(calls)  # plain first, then speculative
        assert tokens == decode_plain(sp, prompt, 24, ignore_eos=True).tokens
        spec, plain, _ = timed_pairs(sp, prompt, 24, True, budget=60.0)
        assert len(spec) == len(plain) == PAIRS
        assert not sp.active  # every timed sequence left its slot


def test_run_says_how_to_measure_what_it_does_not(build_info, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def fibonacci(n):\nclass Stack:\n")
    several = run_cli("run", "--pair", "tiny-coder", "-f", str(prompts), "-n", "8", "-t", "1")
    assert several.returncode == 0, several.stderr
    assert several.stderr.strip().splitlines()[-1] == (
        "speedup vs plain decoding: not measured for several prompts; `ggspec bench --pair tiny-coder` measures it")
    for args in (["--no-compare"], ["--no-spec"]):
        proc = run_cli("run", "--pair", "tiny-coder", "-n", "8", "-t", "1", *args)
        assert proc.returncode == 0 and "plain decoding" not in proc.stderr, proc.stderr
    nothing = run_cli("run", "--pair", "tiny-coder", "-n", "16", "-t", "1", "--spec-type", "ngram-simple",
                      "--spec-ngram-simple-size-n", "12", "-p", "x")  # no 12-gram to match: nothing drafted
    assert nothing.returncode == 0 and nothing.stderr.strip().splitlines()[-1].startswith(
        "speculation never verified a draft in this text: "), nothing.stderr
    sampled = run_cli("run", "--pair", "tiny-coder", "-n", "16", "-t", "1", "--temp", "0.8", "--seed", "3",
                      "--spec-draft-n-max", "7")
    m = _VERDICT.match(sampled.stderr.strip().splitlines()[-1])
    assert sampled.returncode == 0 and m and m[8] is None, sampled.stderr  # sampled: no output to compare


def test_a_long_decode_is_not_decoded_again_unasked():
    from types import SimpleNamespace

    from ggspec.cli.verdict import COMPARE_MAX_S
    from ggspec.cli.verdict import verdict as _verdict

    seq = SimpleNamespace(stats=SimpleNamespace(t_decode=COMPARE_MAX_S + 1))
    line = _verdict(None, [[1]], [seq], 8, False, None, "-m t.gguf -md d.gguf", False)
    assert line == (f"speedup vs plain decoding: not measured (the decode took {COMPARE_MAX_S + 1:.0f} s; --compare "
                    "measures it); `ggspec bench -m t.gguf -md d.gguf` measures it side by side with llama.cpp")


def test_what_to_try_leaves_out_the_setting_in_use():
    from types import SimpleNamespace

    from ggspec.cli.verdict import what_to_try as _what_to_try
    from ggspec.speculative.types import registry
    from ggspec.speculative.types.draft_type import DraftPlan

    def engine(spec_type, n_max, auto):
        return SimpleNamespace(plan=DraftPlan(registry.get(spec_type)), n_max=n_max,
                               draft_length=object() if auto else None)

    assert _what_to_try(engine("draft-dflash", 7, False)) == (
        "a shorter draft (--spec-draft-n-max 3), --spec-draft-n-max auto (chooses the length, none included, every "
        "step), --spec-type ngram-simple (drafts from the text itself: no draft model to run) or --no-spec")
    assert _what_to_try(engine("draft-simple", 3, True)) == (
        "--spec-type ngram-simple (drafts from the text itself: no draft model to run) or --no-spec")
    assert _what_to_try(engine("ngram-simple", 16, True)) == "--no-spec"
