"""The CLI end to end: `ggspec run` streams the same text with and without speculation."""

from __future__ import annotations

import re

from conftest import run_cli


def _split(proc):
    assert proc.returncode == 0, proc.stderr
    stats = [ln for ln in proc.stderr.splitlines() if " tokens " in ln]
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
    proc = run_cli("run", "-m", str(hybrid_pair.target), "-md", str(hybrid_pair.draft), "-n", "16")
    _, stats = _split(proc)
    assert "τ" in stats


def test_builtin_pair(build_info):
    out, stats = _split(run_cli("run", "--pair", "tiny-hybrid", "-p", "x = ", "-n", "8", "--ignore-eos"))
    assert out.startswith("x = ") and "8 tokens" in stats


def test_help_is_complete():
    top = run_cli("--help")
    assert top.returncode == 0 and "build" in top.stdout and "run" in top.stdout
    run_help = run_cli("run", "--help").stdout
    for flag in ("-m", "-md", "--dflash", "--no-spec", "-p", "-n", "--spec-draft-n-max", "-c",
                 "-ctk", "-ctv", "-t", "--pair", "--ignore-eos"):
        assert flag in run_help, flag
    build_help = run_cli("build", "--help").stdout
    for flag in ("--cuda", "--vulkan", "--tools", "--force"):
        assert flag in build_help, flag


def test_default_n_max_fits_the_draft_without_a_warning(dense_pair):
    """The dense fixture's draft has block 8: the default 15 becomes 7 silently; a typed 15 warns."""
    common = ["run", "-m", str(dense_pair.target), "-md", str(dense_pair.draft), "-n", "8"]
    proc = run_cli(*common)
    _, stats = _split(proc)
    assert "n_max 7" in stats and "warning" not in proc.stderr, proc.stderr
    proc = run_cli(*common, "--spec-draft-n-max", "15")
    _, stats = _split(proc)
    assert "n_max 7" in stats
    assert "warning: --spec-draft-n-max 15 exceeds the draft's block size 8 - 1; using 7" in proc.stderr


def test_n_beyond_the_context_warns_up_front(build_info):
    """-n larger than the context can hold: generation stops when it is full, and the user is told
    before it starts (it used to end with exit 0 and fewer tokens, silently)."""
    proc = run_cli("run", "--pair", "tiny-coder", "-n", "5000", "-c", "128", "-p", "def f(x):", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert "warning: -n 5000" in proc.stderr and "raise -c" in proc.stderr
    room = int(re.search(r"room for about (\d+) generated tokens", proc.stderr).group(1))
    n = int(proc.stderr.split(" tokens  decode")[0].split()[-1])
    assert 0 < room - 8 <= n <= room + 1  # stops at the full context (a spec step may stop a block early)
