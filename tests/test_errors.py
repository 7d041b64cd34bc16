"""Bad input: one clear error line and exit code 1, never a traceback, never an abort.

Every case runs the real CLI in a subprocess, so a llama.cpp abort would show up as a negative
return code (a signal) instead of killing the test run.
"""

from __future__ import annotations

import pytest
from conftest import run_cli


def _assert_one_line_error(proc, needle: str) -> None:
    assert proc.returncode == 1, f"rc={proc.returncode}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert needle in errors[0], errors[0]


def test_missing_target(tmp_path, build_info):
    proc = run_cli("run", "-m", str(tmp_path / "nope.gguf"), "--no-spec")
    _assert_one_line_error(proc, "target file not found")


def test_target_not_gguf(tmp_path, build_info):
    junk = tmp_path / "junk.gguf"
    junk.write_text("this is not a model\n")
    proc = run_cli("run", "-m", str(junk), "--no-spec")
    _assert_one_line_error(proc, "not a GGUF model")


def test_truncated_gguf(tmp_path, dense_pair):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(dense_pair.target.read_bytes()[:5000])
    proc = run_cli("run", "-m", str(cut), "--no-spec")
    _assert_one_line_error(proc, "cut.gguf")


def test_missing_draft(dense_pair, tmp_path):
    proc = run_cli("run", "-m", str(dense_pair.target), "-md", str(tmp_path / "d.gguf"), "--dflash")
    _assert_one_line_error(proc, "draft file not found")


def test_dflash_with_a_non_dflash_draft(dense_pair):
    proc = run_cli("run", "-m", str(dense_pair.target), "-md", str(dense_pair.target), "--dflash")
    _assert_one_line_error(proc, "error: -md: ")
    assert "qwen3" in proc.stderr


def test_an_ordinary_draft_of_another_vocabulary(dense_pair, tiny_coder_pair):
    """An ordinary LLM as -md drafts draft-simple, whose vocabulary rules refuse this one."""
    proc = run_cli("run", "-m", str(dense_pair.target), "-md", str(tiny_coder_pair.target))
    _assert_one_line_error(proc, "may differ by at most 128")


def test_dflash_draft_as_target(dense_pair):
    proc = run_cli("run", "-m", str(dense_pair.draft), "--no-spec")
    _assert_one_line_error(proc, "not a target")


@pytest.mark.parametrize("case, needle", [
    ("n_embd", "hidden size"),  # llama.cpp: GGML_ASSERT in context creation
    ("layers", "target layer"),  # llama.cpp: GGML_ASSERT(lid <= n_layer) / at the next decode
    ("vocab", "vocabulary"),  # llama.cpp: out-of-bounds tensor read at the first draft
])
def test_draft_that_does_not_fit(dense_pair, bad_drafts, case, needle):
    proc = run_cli("run", "-m", str(dense_pair.target), "-md", str(bad_drafts[case]), "--dflash")
    _assert_one_line_error(proc, needle)


def test_draft_n_max_zero(dense_pair):
    proc = run_cli("run", "-m", str(dense_pair.target), "-md", str(dense_pair.draft),
                   "--spec-draft-n-max", "0")
    _assert_one_line_error(proc, "error: --spec-draft-n-max: ")
    assert "at least 1 (got 0)" in proc.stderr


@pytest.mark.parametrize("args, flag, detail", [
    (["-np", "0"], "-np", "(got 0)"),
    (["--spec-draft-p-min", "1.5"], "--spec-draft-p-min", "(got 1.5)"),
    (["--spec-type", "ngram-mod,ngram-mod"], "--spec-type", "given twice"),
    (["--spec-type", "medusa"], "--spec-type", "medusa"),
    (["--spec-dflash-inject", "later"], "--spec-dflash-inject", "later"),
    (["--spec-ngram-simple-size-n", "0"], "--spec-ngram-simple-size-n", "(got 0)"),
    (["-np", "4", "--spec-draft-n-max", "7", "-b", "16"], "-b", "16"),
])
def test_errors_name_the_flag(dense_pair, args, flag, detail):
    """The library names the field at fault; the CLI prints its flag in front, on both commands
    (bench's comma lists are checked by the same rules)."""
    proc = run_cli("run", "-m", str(dense_pair.target), "-md", str(dense_pair.draft), "-n", "4", *args)
    _assert_one_line_error(proc, f"error: {flag}: ")
    assert detail in proc.stderr
    if "-b" not in args:  # bench has no -b
        bench_args = [a if a != "-np" else "--parallel" for a in args]
        bench = run_cli("bench", "-m", str(dense_pair.target), "-md", str(dense_pair.draft), *bench_args)
        _assert_one_line_error(bench, f"error: {flag}: ")
        assert proc.stderr == bench.stderr  # the same line from both commands


def test_every_field_the_library_names_has_a_flag():
    """One FIELD -> FLAG table: every `field="..."` an InputError of the library can carry is in it."""
    import re
    from pathlib import Path

    from ggspec.cli.options import FLAGS, error_text
    from ggspec.errors import InputError

    root = Path(__file__).resolve().parents[1] / "ggspec"
    fields = {m for f in root.rglob("*.py") for m in re.findall(r'field="(\w+)"', f.read_text())}
    assert {"n_max", "p_min", "parallel", "spec_type", "draft"} <= fields
    from ggspec.server.protocol import REQUEST_PARAMS

    assert fields <= set(FLAGS) | set(REQUEST_PARAMS), fields - set(FLAGS) - set(REQUEST_PARAMS)
    assert error_text(InputError("must be at least 1", field="n_ctx")) == "-c: must be at least 1"
    assert error_text(InputError("plain message")) == "plain message"
    assert error_text(InputError("unknown field", field="nonesuch")) == "unknown field"


def test_prompt_longer_than_context(dense_pair):
    proc = run_cli("run", "-m", str(dense_pair.target), "-md", str(dense_pair.draft),
                   "-c", "64", "-p", "word " * 200)
    _assert_one_line_error(proc, "context holds 256")  # llama.cpp rounds n_ctx up to 256


def test_prompt_leaving_no_room_for_a_draft_block(dense_pair, lc):
    from ggspec.runtime import Model

    with Model(dense_pair.target) as m:  # find a prompt of 252 tokens: fits alone, not with 7 drafts
        prompt = "x = 1\n"
        while len(m.tokenize(prompt)) < 252:
            prompt += "x"
        n = len(m.tokenize(prompt))
    assert 250 <= n <= 254, n
    proc = run_cli("run", "-m", str(dense_pair.target), "-md", str(dense_pair.draft),
                   "-c", "256", "-p", prompt, "-n", "2")
    _assert_one_line_error(proc, "a draft block")
    assert run_cli("run", "-m", str(dense_pair.target), "--no-spec", "-c", "256", "-p", prompt,
                   "-n", "2").returncode == 0


def test_unknown_cache_type(dense_pair):
    proc = run_cli("run", "-m", str(dense_pair.target), "--no-spec", "-ctk", "q3_k_zz")
    _assert_one_line_error(proc, "unknown cache type")


def test_quantized_v_cache_without_flash_attention(dense_pair):
    proc = run_cli("run", "-m", str(dense_pair.target), "--no-spec", "-ctv", "q8_0", "-fa", "off")
    _assert_one_line_error(proc, "flash attention")


def test_unknown_pair():
    proc = run_cli("run", "--pair", "tiny-nonsense")
    _assert_one_line_error(proc, "unknown pair")


def test_no_build_gives_a_clear_message(tmp_path, dense_pair, monkeypatch):
    monkeypatch.setenv("GGSPEC_HOME", str(tmp_path / "empty-home"))
    proc = run_cli("run", "-m", str(dense_pair.target), "--no-spec")
    _assert_one_line_error(proc, "ggspec build")


@pytest.mark.parametrize("args, needle", [
    (["--spec-draft-rs-planes", "1"], "must be 2..8"),
    (["--spec-draft-rs-planes", "9"], "must be 2..8"),
    (["--spec-draft-rs-planes", "many"], "expected a number or 'uncapped'"),
    (["--spec-draft-rs-planes", "4", "--spec-draft-rs-planes-lead", "3"], "must be 0..2"),
    (["--spec-draft-rs-planes-lead", "sometimes"], "expected a number, 'default' or 'auto'"),
])
def test_impossible_plane_settings(hybrid_pair, args, needle):
    proc = run_cli("run", "-m", str(hybrid_pair.target), "-md", str(hybrid_pair.draft), "-n", "4", *args)
    _assert_one_line_error(proc, needle)


def test_plane_options_on_a_dense_target_warn(dense_pair):
    proc = run_cli("run", "-m", str(dense_pair.target), "-md", str(dense_pair.draft), "-n", "4",
                   "--spec-draft-rs-planes", "4")
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and "do nothing" in proc.stderr


def test_old_flag_name_and_env_var(hybrid_pair):
    import os

    for args, env in ((["--spec-mtp-rs-planes", "3"], {}), ([], {"LLAMA_ARG_SPEC_DRAFT_RS_PLANES": "3"})):
        os.environ.update(env)
        try:
            # (a fixed length: the default may find no length pays here and use no planes)
            proc = run_cli("run", "-m", str(hybrid_pair.target), "-md", str(hybrid_pair.draft), "-n", "8",
                           "--spec-draft-n-max", "7", *args)
        finally:
            for k in env:
                os.environ.pop(k)
        assert proc.returncode == 0, proc.stderr
        assert "planes: 3 planes" in proc.stderr, proc.stderr


def test_ctrl_c_inside_the_log_callback_is_not_lost(lc, monkeypatch):
    """A SIGINT handled while llama.cpp's log callback runs would be swallowed by ctypes (the run
    went on and exited 0); the CLI's handler delivers it again once the callback has returned."""
    import signal
    import sys
    import time

    from ggspec.native import bindings

    class InterruptingStderr:
        fired = False

        def write(self, text):
            if not self.fired:
                self.fired = True
                signal.raise_signal(signal.SIGINT)  # handled right here, inside the callback

    monkeypatch.setattr(bindings, "_verbose", True)
    monkeypatch.setattr(sys, "stderr", InterruptingStderr())
    previous = signal.signal(signal.SIGINT, bindings.interrupt_outside_callbacks)
    try:
        with pytest.raises(KeyboardInterrupt):
            params = lc.llama_model_default_params()
            lc.llama_model_load_from_file(b"/nonexistent/model.gguf", params)  # llama.cpp logs the failure
            time.sleep(2)  # the re-sent signal arrives here
        assert sys.stderr.fired
    finally:
        signal.signal(signal.SIGINT, previous)
