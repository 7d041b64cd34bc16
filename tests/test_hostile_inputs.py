"""Hostile input to the command line: bad text and files, damaged --resume documents and
models.toml, unwritable --save paths, closed or full stdout, damaged state in $GGSPEC_HOME,
Ctrl-C while Python is still importing (issue 12, categories 4, 5, 6, 7 (bench) and 10).

Every case runs the real CLI in a subprocess and must end in exit status 1 with exactly one
`error: ...` line: no traceback, no signal death, no hang, and nothing broken on disk (a failed
--resume leaves its file byte for byte as it was). Legal input next to each one keeps working.
Broken state lives in a private $GGSPEC_HOME that borrows the real build (its records are copies,
the library and sources are read where they are): the real ~/.cache/ggspec is never touched.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ggspec.native import build as nb
from ggspec.native import paths

TIMEOUT = 60
TINY = ("--pair", "tiny-coder")
QUICK_BENCH = ("bench", *TINY, "-n", "4", "-r", "1", "--no-warmup", "--no-plot")


def cli(*args: str, env: dict[str, str] | None = None, stdout: str = "pipe",
        timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """`python -m ggspec.cli ARGS` with stdout piped, closed (`>&-`) or full (`> /dev/full`)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200", **(env or {}))
    cmd = [sys.executable, "-m", "ggspec.cli", *args]
    if stdout == "closed":
        cmd = ["sh", "-c", 'exec "$0" "$@" >&-', *cmd]
    elif stdout == "full":
        cmd = ["sh", "-c", 'exec "$0" "$@" >/dev/full', *cmd]
    return subprocess.run(cmd, capture_output=True, timeout=timeout, env=full_env, text=True, errors="replace")


def assert_one_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 1, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert needle in errors[0], errors[0]


def assert_works(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr and "error:" not in proc.stderr, proc.stderr


# --- a private $GGSPEC_HOME that borrows the real build ------------------------------------------


@pytest.fixture
def home(tmp_path, build_info) -> Path:
    """Copies of the state files (current.json, build.json, probe records, hashes.json) around
    the real library and sources: corrupting these copies never touches ~/.cache/ggspec."""
    real = paths.ggspec_home()
    h = tmp_path / "home"
    (h / "builds" / build_info.key).mkdir(parents=True)
    shutil.copy2(real / "current.json", h / "current.json")
    shutil.copy2(Path(build_info.root) / "build.json", h / "builds" / build_info.key / "build.json")
    if (real / "probe").is_dir():
        shutil.copytree(real / "probe", h / "probe")
    if (real / "hashes.json").is_file():
        shutil.copy2(real / "hashes.json", h / "hashes.json")
    (h / "src").symlink_to(real / "src")
    return h


# --- a saved benchmark to resume ------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_bench(tmp_path_factory, build_info) -> dict:
    """A small complete benchmark document (2 repetitions of 1 prompt) on the built-in pair."""
    d = tmp_path_factory.mktemp("saved")
    prompts = d / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):", "category": "code"}\n')
    out = d / "base.json"
    proc = cli(*QUICK_BENCH, "-r", "2", "--prompts", str(prompts), "--save", str(out), "-o", "csv")
    assert_works(proc)
    return json.loads(out.read_text())


# --- the sweep --------------------------------------------------------------------------------------


@dataclass
class Case:
    args: tuple[str, ...]
    needle: str
    env: dict[str, str] = field(default_factory=dict)
    stdout: str = "pipe"
    keep: list[Path] = field(default_factory=list)  # files that must be unchanged afterwards


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _catalog(tmp: Path, text: str) -> dict[str, str]:
    return {"GGSPEC_MODELS_TOML": str(_write(tmp / "models.toml", textwrap.dedent(text)))}


TINY_SHA = "b9624d982eb32de6336c53c7a3cd79938ad93dca077ea71bb6e0d62db2b432b9"


def _resume(mutate: Callable[[dict], None], needle: str):
    def make(tmp: Path, base: dict, home: Path) -> Case:
        doc = copy.deepcopy(base)
        mutate(doc)
        path = _write(tmp / "resume.json", json.dumps(doc, indent=1))
        return Case(("bench", "--resume", str(path), "--no-plot"), needle, keep=[path])
    return make


def _set(where: Callable[[dict], dict], key: str, value):
    return lambda doc: where(doc).__setitem__(key, value)


SETTINGS = lambda d: d["settings"]
RUN0 = lambda d: d["runs"][0]

CASES: dict[str, Callable[[Path, dict, Path], Case]] = {
    # 4. results lost: the --save path is checked before anything is measured
    "save-unwritable": lambda t, b, h: Case((*QUICK_BENCH, "--save", "/proc/ggspec-nope/x.json"), "cannot write there"),
    "save-is-a-directory": lambda t, b, h: Case((*QUICK_BENCH, "--save", str(t)), "is a directory"),
    "save-under-a-file": lambda t, b, h: Case((*QUICK_BENCH, "--save", str(_write(t / "f", "x") / "x.json")),
                                              "cannot write there"),
    # 5. text and files
    "prompt-not-utf8": lambda t, b, h: Case(("run", *TINY, "-n", "4", "-p", "abc\udcff"), "-p: not valid UTF-8"),
    "prompts-lone-surrogate": lambda t, b, h: Case(
        (*QUICK_BENCH, "--prompts", str(_write(t / "p.jsonl", '{"prompt": "x\\ud800"}\n'))), "not valid UTF-8"),
    "prompts-category-surrogate": lambda t, b, h: Case(
        (*QUICK_BENCH, "--prompts", str(_write(t / "p.jsonl", '{"prompt": "x", "category": "\\udcff"}\n'))),
        "not valid UTF-8"),
    "prompts-not-utf8": lambda t, b, h: Case(
        (*QUICK_BENCH, "--prompts", str(_write(t / "p.jsonl", b'{"prompt": "caf\xe9"}\n'))), "not UTF-8 text"),
    "prompts-a-directory": lambda t, b, h: Case((*QUICK_BENCH, "--prompts", str(t)), "is a directory"),
    "resume-not-utf8": lambda t, b, h: Case(("bench", "--resume", str(_write(t / "r.json", b"\xff\xfe{}"))),
                                            "not UTF-8 text", keep=[t / "r.json"]),
    "resume-truncated": lambda t, b, h: Case(
        ("bench", "--resume", str(_write(t / "r.json", json.dumps(b)[:500]))), "not a ggspec bench JSON file",
        keep=[t / "r.json"]),
    "profile-not-utf8": lambda t, b, h: Case(
        (*QUICK_BENCH, "--acceptance-profile", str(_write(t / "w.txt", b"1 2 \xff"))), "not UTF-8 text"),
    "profile-nan": lambda t, b, h: Case(
        (*QUICK_BENCH, "--acceptance-profile", str(_write(t / "w.txt", "nan 1 1 1 1 1 1 1"))), "finite"),
    "catalog-not-utf8": lambda t, b, h: Case(("models",), "not UTF-8 text",
                                             env={"GGSPEC_MODELS_TOML": str(_write(t / "m.toml", b"\xff[pairs]"))}),
    "catalog-a-directory": lambda t, b, h: Case(("models",), "is a directory", env={"GGSPEC_MODELS_TOML": str(t)}),
    "catalog-table-for-a-string": lambda t, b, h: Case(
        ("run", "--pair", "a", "-n", "4"), "target must be a non-empty string",
        env=_catalog(t, "[pairs.a]\ntarget = {file = 'x.gguf'}\n")),
    "catalog-number-as-string": lambda t, b, h: Case(
        ("run", "--pair", "a", "-n", "4"), "n_max must be a whole number",
        env=_catalog(t, f"[pairs.a]\ntarget = 'x.gguf'\ntarget_sha256 = '{TINY_SHA}'\nn_max = '7'\n")),
    "catalog-pairs-not-a-table": lambda t, b, h: Case(("models",), "[pairs] must be a table",
                                                      env=_catalog(t, "pairs = 3\n")),
    "catalog-pair-not-a-table": lambda t, b, h: Case(("models",), "expected a table",
                                                     env=_catalog(t, "[pairs]\na = 'tiny.gguf'\n")),
    "catalog-no-target": lambda t, b, h: Case(("run", "--pair", "a"), "needs a target file",
                                              env=_catalog(t, "[pairs.a]\ndescription = 'nothing'\n")),
    "catalog-bad-checksum": lambda t, b, h: Case(("models",), "64 hexadecimal digits",
                                                 env=_catalog(t, "[pairs.a]\ntarget = 'x.gguf'\ntarget_sha256 = 'abc'\n")),
    "catalog-missing-file": lambda t, b, h: Case(
        ("run", "--pair", "a", "-n", "4"), "missing",
        env=_catalog(t, f"[pairs.a]\ntarget = 'nope.gguf'\ntarget_sha256 = '{TINY_SHA}'\n")),
    "stdout-closed-run": lambda t, b, h: Case(("run", *TINY, "-n", "4"), "standard output is closed", stdout="closed"),
    "stdout-full-run": lambda t, b, h: Case(("run", *TINY, "-n", "4"), "No space left on device", stdout="full"),
    "stdout-closed-bench": lambda t, b, h: Case(QUICK_BENCH, "standard output is closed", stdout="closed"),
    "stdout-full-bench": lambda t, b, h: Case((*QUICK_BENCH, "--prompts", str(_write(t / "p.jsonl", '{"prompt": "x"}'))),
                                              "No space left on device", stdout="full"),
    "stdout-full-models": lambda t, b, h: Case(("models",), "No space left on device", stdout="full"),
    "stdout-full-help": lambda t, b, h: Case(("run", "--help"), "No space left on device", stdout="full"),
    # 5 + 7. --resume documents of the right schema with damaged contents: refused, file untouched
    "resume-reps-negative": _resume(_set(SETTINGS, "reps", -1), "-r must be at least 1"),
    "resume-n-predict-zero": _resume(_set(SETTINGS, "n_predict", 0), "-n must be at least 1"),
    "resume-threads-string": _resume(_set(SETTINGS, "threads", "2"), "settings.threads"),
    "resume-no-prompts": _resume(_set(SETTINGS, "prompts", []), "settings.prompts"),
    "resume-prompt-surrogate": _resume(lambda d: d["settings"]["prompts"][0].__setitem__("text", "\ud800"),
                                       "not valid UTF-8"),
    "resume-config-kind": _resume(lambda d: d["configs"][0].__setitem__("kind", "turbo"), "configs[0].kind"),
    "resume-config-n-ctx-string": _resume(lambda d: d["configs"][0].__setitem__("n_ctx", "4096"), "configs[0].n_ctx"),
    "resume-run-stats": _resume(lambda d: d["runs"][0]["stats"].__setitem__("t_decode", [1]), "runs[0].stats.t_decode"),
    "resume-run-prompt-index": _resume(_set(RUN0, "prompt", 7), "runs[0].prompt"),
    "resume-run-unknown-config": _resume(_set(RUN0, "config", "kind=warp"), "runs[0].config"),
    "resume-runs-not-a-list": _resume(lambda d: d.__setitem__("runs", {"0": 1}), "'runs' is not a list"),
    "resume-profile-negative": _resume(lambda d: d["settings"].update(profile="x", profile_weights=[1, -2]),
                                       "non-negative"),
    "resume-rpc-endpoint": _resume(lambda d: d["settings"]["placement"].__setitem__("rpc", ["no-port"]), "no-port: expected host:port"),
    "resume-models-disagree": _resume(_set(lambda d: d["meta"], "target", "/elsewhere.gguf"), "different model files"),
    # 6. state on disk
    "home-is-a-file-run": lambda t, b, h: Case(("run", *TINY, "-n", "4"), "not a directory",
                                               env={"GGSPEC_HOME": str(_write(t / "home-file", "x"))}),
    "home-is-a-file-build": lambda t, b, h: Case(("build",), "not a directory",
                                                 env={"GGSPEC_HOME": str(_write(t / "home-file", "x"))}),
    "home-unwritable-build": lambda t, b, h: Case(("build",), "not writable", env={"GGSPEC_HOME": "/proc/ggspec-home"}),
    "home-is-a-file-pull": lambda t, b, h: Case(("models", "pull", "gemma-3-270m"), "not a directory",
                                                env={"GGSPEC_HOME": str(_write(t / "home-file", "x"))}),
    "home-fixtures-blocked": lambda t, b, h: Case(("run", "--pair", "tiny-dense", "-n", "4"),
                                                  "cannot write its generated files",
                                                  env={"GGSPEC_HOME": str(h), "_block": str(_write(h / "fixtures", "x"))}),
    "build-record-damaged": lambda t, b, h: Case(("run", *TINY, "-n", "4"), "run `ggspec build`",
                                                 env={"GGSPEC_HOME": str(h), "_damage": str(next(
                                                     _write(p, '{"key": ') for p in (h / "builds").glob("*/build.json")))}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input_is_one_line_and_leaves_files_alone(name, tmp_path, saved_bench, home):
    case = CASES[name](tmp_path, saved_bench, home)
    before = {p: p.read_bytes() for p in case.keep}
    env = {k: v for k, v in case.env.items() if not k.startswith("_")}
    proc = cli(*case.args, env=env, stdout=case.stdout)
    assert_one_error(proc, case.needle)
    for p, data in before.items():
        assert p.read_bytes() == data, f"{p} was rewritten by a failed command"
    leftovers = [p.name for p in tmp_path.rglob(".*.tmp")]
    assert not leftovers, leftovers


# --- legal input next to the hostile one keeps working ----------------------------------------------


def test_valid_text_and_files_work(tmp_path, build_info):
    proc = cli("run", *TINY, "-n", "4", "-p", "# caf\u00e9 \u2713 \u4e2d\n")
    assert_works(proc)
    assert proc.stdout.startswith("# caf\u00e9 \u2713 \u4e2d\n")
    bom = _write(tmp_path / "p.jsonl", b'\xef\xbb\xbf{"prompt": "def f(x):", "category": "caf\xc3\xa9"}\n')
    proc = cli(*QUICK_BENCH, "--prompts", str(bom), "-o", "jsonl")
    assert_works(proc)
    assert {json.loads(ln)["category"] for ln in proc.stdout.splitlines()} == {"all"}


def test_damaged_state_files_are_repaired_with_a_warning(home):
    """current.json (three ways), hashes.json and the CPU probe record: a warning, the command works,
    and the next one runs without a warning (the file was written again, atomically)."""
    env = {"GGSPEC_HOME": str(home)}
    current = home / "current.json"
    good = json.loads(current.read_text())
    for damage in ('{"key": ', "[]", '{"key": "x", "options": {"cuda": 1, "turbo": true}}', b"\xff\xfe"):
        _write(current, damage)
        proc = cli("run", *TINY, "-n", "4", "-p", "x", env=env)
        assert_works(proc)
        assert "warning: ignoring the damaged" in proc.stderr and "current.json" in proc.stderr
        assert json.loads(current.read_text()) == good
    _write(home / "hashes.json", "[1, 2]")
    for probe in (home / "probe").glob("*.json"):
        _write(probe, "{")
    proc = cli("run", *TINY, "-n", "4", "-p", "x", env=env)
    assert_works(proc)
    assert isinstance(json.loads((home / "hashes.json").read_text()), dict)
    proc = cli("run", *TINY, "-n", "4", "-p", "x", env=env)
    assert_works(proc)
    assert "warning" not in proc.stderr, proc.stderr
    assert not list(home.rglob(".*.tmp"))


def test_a_damaged_build_record_is_rebuilt_in_place(tmp_path, monkeypatch):
    """A build.json is written only after its build finished: when it is damaged, `ggspec build`
    compiles into the same tree (up to date: nothing to do) and writes the record again."""
    monkeypatch.setenv("GGSPEC_HOME", str(tmp_path))
    options = nb.BuildOptions()
    root = tmp_path / "builds" / nb.build_key(options)
    (root / "build" / "bin").mkdir(parents=True)
    (root / "build" / "bin" / "libllama.so").write_bytes(b"")
    (root / "build" / "CMakeCache.txt").write_text("")
    (root / "llama.cpp").mkdir()
    (root / "build.json").write_text('{"key": [')
    compiled = []
    monkeypatch.setattr(nb, "compile_tree", lambda tree, bdir, opts, targets, on_line: compiled.append(list(targets)))
    monkeypatch.setattr(nb, "obtain_sdist", lambda: pytest.fail("a damaged record must not start from scratch"))
    info = nb.build(options)
    assert compiled == [list(nb.LIBRARY_TARGETS)] and info.key == root.name
    assert nb.find_build(options) is not None and nb.current_options() == options
    (tmp_path / "current.json").write_text("{")
    assert nb.current_options() == options  # repaired from the newest matching build


def test_two_benches_saving_to_one_file_both_finish(tmp_path, build_info):
    out = tmp_path / "same.json"
    prompts = _write(tmp_path / "p.jsonl", '{"prompt": "x = 1"}\n')
    args = [sys.executable, "-m", "ggspec.cli", *QUICK_BENCH, "--prompts", str(prompts), "--save", str(out), "-o", "csv"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0 and "Traceback" not in err, err
    assert json.loads(out.read_text())["complete"] is True
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_resume_completes_and_a_complete_file_is_not_rewritten(tmp_path, saved_bench):
    path = _write(tmp_path / "partial.json", json.dumps({**saved_bench, "complete": False,
                                                          "runs": saved_bench["runs"][:2]}))
    proc = cli("bench", "--resume", str(path), "--no-plot", "-o", "csv")
    assert_works(proc)
    doc = json.loads(path.read_text())
    assert doc["complete"] is True and len(doc["runs"]) == len(saved_bench["runs"])
    data = path.read_bytes()
    proc = cli("bench", "--resume", str(path), "--no-plot", "-o", "csv")
    assert_works(proc)
    assert path.read_bytes() == data  # nothing new measured: nothing written


def test_a_save_that_fails_midway_still_prints_what_was_measured(tmp_path, build_info):
    """The disk fills after the first configuration: its rows are printed, then one error line."""
    out = tmp_path / "m.json"
    script = textwrap.dedent(f"""
        import errno, sys
        from ggspec.bench import report
        real, calls = report.save, []
        def save(path, doc):
            calls.append(1)
            if len(calls) > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(path, doc)
        report.save = save
        sys.argv = ["ggspec", *{list(QUICK_BENCH)!r}, "--matrix", "--spec-draft-n-max", "3,5,7",
                    "--save", {str(out)!r}, "-o", "csv"]
        from ggspec.cli import main
        main()
    """)
    prompts_free = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT,
                          env=prompts_free)
    assert_one_error(proc, f"cannot save {out} (No space left on device)")
    rows = [ln for ln in proc.stdout.splitlines()[1:] if ln.startswith("kind=spec")]
    assert len(rows) >= 2, proc.stdout  # the two measured configurations, not just the saved one
    assert json.loads(out.read_text())["complete"] is False  # the first save is intact


@pytest.mark.parametrize("entry", ["console-script", "python-m"])
@pytest.mark.parametrize("module", ["typer", "rich.console", "ggspec.native.bindings"])
def test_ctrl_c_while_importing(entry, module):
    """SIGINT delivered while the CLI's imports run (an import hook sends it): "interrupted", 130."""
    launch = ("from ggspec.__main__ import main; main()" if entry == "console-script"
              else "import runpy; runpy.run_module('ggspec.cli', run_name='__main__', alter_sys=True)")
    script = textwrap.dedent(f"""
        import os, signal, sys
        class Hook:
            def find_spec(self, name, path=None, target=None):
                if name == {module!r}:
                    os.kill(os.getpid(), signal.SIGINT)
                return None
        sys.meta_path.insert(0, Hook())
        sys.argv = ["ggspec", "--help"]
        {launch}
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr.strip() == "interrupted" and "Traceback" not in proc.stderr


def test_broken_pipe_ends_quietly(build_info):
    """`ggspec run ... | head -c 1` with more output than a pipe holds: no traceback, no error line."""
    proc = subprocess.run(f'"{sys.executable}" -m ggspec.cli run --pair tiny-coder -n 2000 --ignore-eos -c 4096 '
                          f'-p "x" | head -c 1 >/dev/null; echo "${{PIPESTATUS[0]}}"',
                          shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=TIMEOUT)
    assert "Traceback" not in proc.stderr and "error:" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() in ("0", "141"), proc.stdout


def test_help_shows_every_default():
    """Rich markup ate `[default: …]` in help strings ("Context size ."): every one is shown."""
    run_help = cli("run", "--help").stdout
    bench_help = cli("bench", "--help").stdout
    flat = lambda text: " ".join(text.replace("│", " ").split())
    for text, wanted in ((run_help, ("Context size [default: the pair's, else 4096]",
                                     "[default: the pair's, else f16]", "[default: as -ngl]",
                                     "[default: all with --rpc, else 0]", "[default: the pair's, else uncapped]",
                                     "a number is a fixed length [default: auto: each step verifies")),
                         (bench_help, ("[default: the built-in set", "[default: pruned]",
                                       "[default: the pair's, else 4096]", "[default: 5]"))):
        for w in wanted:
            assert w in flat(text), w
    for text in (run_help, bench_help):
        assert not re.search(r"[\w)] [.;]", flat(text)), re.search(r".{40}[\w)] [.;].{10}", flat(text))
