"""The documentation: the site builds without a warning, the README stays short with working links,
and the `ggspec` commands the README and the pages show parse against the real command line.

Nothing here needs the llama.cpp build: commands are parsed (click's `make_context`), not run,
so a renamed or misspelt flag in a page fails here, not in a reader's terminal.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

import ggspec.cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 150
# the two fresh-machine commands (README's first screen; .ci/run runs the second verbatim)
RUN_COMMAND = ("pip install -e . && ggspec build && ggspec run --pair tiny-coder -n 128 -p $'class Stack:\\n    def "
               "__init__(self):\\n        self.items = []\\n\\n    def push(self, item):\\n'")
TEST_COMMAND = ("pip install -e '.[test,train,cuda]' && ggspec build --tools && ggspec models pull gemma-3-270m && "
                "ggspec models pull qwen2.5-coder-1.5b && python -m pytest -q")

SHELL_FENCE = re.compile(r"^```(?:bash|sh|shell|console)[ \t]*\n(.*?)^```", re.S | re.M)
ANSI_C_STRING = re.compile(r"\$'((?:[^'\\]|\\.)*)'")
SEPARATORS = {"&&", "||", ";", "|", "&", ";;"}
REDIRECTS = {">", ">>", "<", "<<", ">&", "&>", "|&"}
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PLACEHOLDER = re.compile(r"^(<[^<>]+>|\[[^\[\]]+\])$")  # a synopsis's <FILE> or [--flag]: not a command line


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def the_cli():
    """The click group of `ggspec` (ggspec.cli.app, the typer app)."""
    return typer.main.get_command(ggspec.cli.app)


def _click_core_of(command):
    """The click core typer built the command with: recent typers vendor a trimmed click
    (typer._click), older ones use click itself. Its Context, UsageError and Exit are the ones the
    parse raises; groups and options are told apart by duck typing, which both share."""
    base = next(k for k in type(command).__mro__ if k.__module__.endswith("click.core"))
    return importlib.import_module(base.__module__)


click = _click_core_of(the_cli())


def is_group(command) -> bool:
    return isinstance(getattr(command, "commands", None), dict)


def options(command) -> list:
    return [p for p in command.params if getattr(p, "param_type_name", "") == "option"]


# --- 1. the site ------------------------------------------------------------------------------------


def test_mkdocs_build_strict_passes(tmp_path):
    """Every nav entry exists, every relative link and anchor resolves, no page is left out of the
    nav, the API reference renders from the docstrings: any warning fails `--strict`."""
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0 and "No module named mkdocs" in proc.stderr:
        pytest.fail("mkdocs is not installed: pip install -e '.[test]'")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    api = (site / "api" / "index.html").read_text()
    for symbol in ("PairConfig", "Engine", "generate_spec", "RunStats", "InputError"):
        assert symbol in api, f"the API page does not render {symbol}"
    assert "Speculative decoding of one prompt" in api  # a docstring, rendered by mkdocstrings
    assert (site / "bench" / "tiny-coder-ab-decode.png").is_file()  # the measured pages' images travel


# --- 2. the README ------------------------------------------------------------------------------------


def test_readme_is_short_keeps_its_two_commands_and_its_links_resolve():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail to docs/"
    first_screen = lines[:25]
    assert RUN_COMMAND in first_screen and TEST_COMMAND in first_screen, "the fresh-machine commands moved or changed"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert TEST_COMMAND in ci, ".ci/run must run the README's test command verbatim"

    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
    links += re.findall(r"<img [^>]*src=\"([^\"]+)\"", text)
    relative = [link for link in links if not re.match(r"^(https?:|mailto:|#)", link)]
    assert relative, "the README links to no documentation page"
    broken = [link for link in relative if not (ROOT / link.split("#", 1)[0]).exists()]
    assert not broken, f"README links to files that do not exist: {broken}"
    assert re.search(r"!\[[^\]]*\]\(docs/[^)]+\.png\)", text), "the README's benchmark figure is gone"


# --- 3. every command shown parses ------------------------------------------------------------------


def logical_lines(block: str) -> list[str]:
    """A shell block's commands: continuation lines joined, `$ ` prompts dropped."""
    out, pending = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\") and not line.lstrip().startswith("#"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = pending + line
        pending = ""
        out.append(line[2:] if line.startswith("$ ") else line)
    if pending:
        out.append(pending)
    return out


def shell_words(line: str) -> list[str]:
    """shlex with bash's $'...' strings, comments, and `&& || ; | &` and redirects as tokens of
    their own."""
    def ansi_c(m: re.Match) -> str:
        return shlex.quote(m.group(1).encode("latin-1", "backslashreplace").decode("unicode_escape"))

    lex = shlex.shlex(ANSI_C_STRING.sub(ansi_c, line), posix=True, punctuation_chars=";&|<>")
    lex.whitespace_split = True
    return list(lex)


def ggspec_invocations(line: str) -> list[list[str]]:
    """The argument lists of every `ggspec ...` (or `python -m ggspec ...`) in a command line."""
    found, segment = [], []
    for word in [*shell_words(line), ";"]:
        if word not in SEPARATORS:
            segment.append(word)
            continue
        while segment and ENV_ASSIGNMENT.match(segment[0]):
            segment.pop(0)
        cut = next((i for i, w in enumerate(segment) if w in REDIRECTS), len(segment))
        segment = segment[:cut]
        if segment[:1] == ["ggspec"]:
            found.append(segment[1:])
        elif len(segment) >= 3 and re.fullmatch(r"python3?", segment[0]) and segment[1:3] == ["-m", "ggspec"]:
            found.append(segment[3:])
        segment = []
    return found


def value_options(command) -> set[str]:
    return {name for p in options(command) if not p.is_flag and not p.count for name in p.opts}


def drop_placeholders(command, args: list[str]) -> list[str]:
    """`...` standing for "more options" is dropped; `-p ...` (an option's value) is kept."""
    takes_value = value_options(command)
    return [a for i, a in enumerate(args) if a != "..." or (i > 0 and args[i - 1] in takes_value)]


def parse(args: list[str]) -> None:
    """Parse `ggspec ARGS` as the real CLI would, down to the (sub)command, without running it.
    Raises click.UsageError (NoSuchOption, BadParameter, MissingParameter...) on a bad line."""
    root = the_cli()
    ctx = click.Context(root, info_name="ggspec")
    if not args:
        raise click.UsageError("no subcommand", ctx)
    name, rest = args[0], args[1:]
    command = root.get_command(ctx, name)
    if command is None:
        raise click.UsageError(f"no such command: {name}", ctx)
    if is_group(command):  # `ggspec models [--models-dir DIR] [pull|make NAME ...]`
        takes_value = value_options(command)
        split, i = len(rest), 0
        while i < len(rest):
            if rest[i] in takes_value:
                i += 2
                continue
            if rest[i] in command.commands:
                split = i
                break
            i += 1
        group_ctx = command.make_context(name, drop_placeholders(command, rest[:split]), parent=ctx)
        if split < len(rest):
            sub = command.commands[rest[split]]
            sub.make_context(rest[split], drop_placeholders(sub, rest[split + 1:]), parent=group_ctx)
        return
    command.make_context(name, drop_placeholders(command, rest), parent=ctx)


def shown_commands() -> tuple[list[tuple[str, str, list[str]]], list[tuple[str, str]]]:
    """(file, line, args) of every ggspec invocation in a shell block; and the synopsis lines skipped."""
    shown, skipped = [], []
    for path in markdown_files():
        for block in SHELL_FENCE.findall(path.read_text()):
            for line in logical_lines(block):
                for args in ggspec_invocations(line):
                    where = str(path.relative_to(ROOT))
                    if any(PLACEHOLDER.match(a) for a in args):
                        skipped.append((where, line))
                    else:
                        shown.append((where, line, args))
    return shown, skipped


def test_shell_lines_are_split_like_bash():
    assert ggspec_invocations("pip install -e . && ggspec build && ggspec run -p $'a\\nb' -n 8  # c") == \
        [["build"], ["run", "-p", "a\nb", "-n", "8"]]
    assert ggspec_invocations("ggspec rpc-server -p 50052 &") == [["rpc-server", "-p", "50052"]]
    assert ggspec_invocations("REAL=1 ggspec bench -o csv > out.csv; curl -s x") == [["bench", "-o", "csv"]]
    assert ggspec_invocations("python -m ggspec models") == [["models"]]
    assert [line.split() for line in logical_lines("ggspec run \\\n  -n 8\n$ ggspec build")] == \
        [["ggspec", "run", "-n", "8"], ["ggspec", "build"]]


def test_the_parser_refuses_what_the_cli_refuses():
    """The check can fail: a misspelt flag, a bad value, a missing argument, an unknown command."""
    parse(["run", "--pair", "tiny-coder", "-p", "...", "-n", "128"])
    parse(["models", "--models-dir", "DIR"])
    parse(["models", "pull", "gemma-3-270m"])
    parse(["bench", "--matrix", "..."])  # "..." for "more options" is not an argument
    for bad in (["run", "--spec-draft-nmax", "3"], ["run", "-n", "many"], ["models", "pull"], ["runn"],
                ["models", "make", "x", "--thread", "2"], ["bench", "--matrix", "extra"], ["run", "-fa"]):
        with pytest.raises(click.UsageError):
            parse(bad)


def test_every_command_shown_in_the_docs_parses():
    shown, skipped = shown_commands()
    assert len(shown) >= 80, f"only {len(shown)} ggspec commands found in the docs' shell blocks"
    assert len(skipped) <= len(shown) // 10, f"too many synopsis lines skipped: {skipped}"
    files = {where for where, _, _ in shown}
    for page in ("README.md", "docs/getting-started.md", *(f"docs/commands/{c}.md" for c in
                 ("run", "bench", "serve", "models", "distill", "build", "rpc-server"))):
        assert page in files, f"{page} shows no ggspec command"
    bad = []
    for where, line, args in shown:
        try:
            parse(args)
        except click.Exit as exc:  # --help
            if exc.exit_code != 0:
                bad.append(f"{where}: {line.strip()}\n    exit {exc.exit_code}")
        except click.UsageError as exc:
            bad.append(f"{where}: {line.strip()}\n    {exc.format_message()}")
    assert not bad, "commands in the docs the CLI refuses:\n" + "\n".join(bad)


# --- 4. the flag tables of the command pages ----------------------------------------------------------


def flag_names(command) -> set[str]:
    names = {o for p in options(command) for o in (*p.opts, *p.secondary_opts)}
    if is_group(command):
        for sub in command.commands.values():
            names |= flag_names(sub)
    return names


@pytest.mark.parametrize("page", ["run", "bench", "serve", "models", "distill", "build", "rpc-server"])
def test_the_flags_a_command_page_lists_exist(page):
    text = (DOCS / "commands" / f"{page}.md").read_text()
    assert "\n## Flags\n" in text, f"docs/commands/{page}.md has no '## Flags' section"
    section = text[text.index("\n## Flags\n"):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    command = the_cli().commands[page]
    known = flag_names(command) | {"--help"}
    named = set()
    for span in re.findall(r"`([^`]+)`", section):
        for word in re.split(r"[\s,]+", span):
            word = word.split("/", 1)[0].split("=", 1)[0]
            if re.fullmatch(r"--?[a-z][a-z0-9-]*", word):
                named.add(word)
    assert named, f"docs/commands/{page}.md lists no flags"
    unknown = sorted(named - known)
    assert not unknown, f"docs/commands/{page}.md names flags `ggspec {page}` does not have: {unknown}"


def test_every_command_has_its_page_and_its_help():
    runner = CliRunner()
    root = the_cli()
    for name, command in root.commands.items():
        assert (DOCS / "commands" / f"{name}.md").is_file(), f"`ggspec {name}` has no page in docs/commands/"
        result = runner.invoke(ggspec.cli.app, [name, "--help"])
        assert result.exit_code == 0, result.output
        if is_group(command):
            for sub in command.commands:
                assert runner.invoke(ggspec.cli.app, [name, sub, "--help"]).exit_code == 0


def test_the_cheap_commands_shown_run():
    """`ggspec models` (shown on the models page and in getting started) runs here as shown: it
    lists the pairs of models.toml without the build or any download."""
    result = CliRunner().invoke(ggspec.cli.app, ["models"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for pair in ("tiny-coder", "gemma-3-270m", "dummy-qwen3-1.7b"):
        assert pair in result.output


def test_the_patch_page_has_a_section_for_every_patch():
    headings = set(re.findall(r"^## (\d{4}-[\w.-]+)$", (DOCS / "patches.md").read_text(), re.M))
    patches = {p.stem for p in (ROOT / "patches").glob("*.patch")}
    assert patches and patches <= headings, f"docs/patches.md has no section for {sorted(patches - headings)}"
