"""The option table (ggspec.cli.options): every shared flag spelled as llama.cpp's own tools spell
it (compared with the pin's common/arg.cpp), each declared once, and its values parsed once where
they come in (-ngl all|auto, -fa's words, --spec-type, --spec-draft-n-max).

The comparison with arg.cpp needs the llama.cpp source of the build (or the pristine pin): it is
skipped where neither is on this machine. The rest needs no build.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from ggspec.cli import config
from ggspec.cli.options import Shared, table
from ggspec.cli.parameters import takes_options
from ggspec.cli.parsers import ALL_LAYERS, AUTO, NMax, flash_attn, gpu_layers, resolved_layers
from ggspec.errors import InputError

# --- llama.cpp's options, read from common/arg.cpp ----------------------------------------------------


@dataclass(frozen=True)
class Upstream:
    """One option of arg.cpp: its spellings (a negated form's too) and its source text."""

    names: frozenset[str]
    source: str


def arg_cpp_path() -> Path | None:
    """The pin's common/arg.cpp: the current build's patched tree, else the pristine one."""
    from ggspec.native import build as nb
    from ggspec.native.bindings import NotBuiltError, current_build

    candidates = []
    try:
        candidates.append(Path(current_build().root) / "llama.cpp")
    except NotBuiltError:
        pass
    candidates.append(nb.pristine_tree())
    return next((tree / "common" / "arg.cpp" for tree in candidates if (tree / "common" / "arg.cpp").is_file()), None)


OPTION = re.compile(r"common_arg\(\s*\{([^}]*)\}(?:\s*,\s*\{([^}]*)\})?")


def parse_arg_cpp(text: str) -> list[Upstream]:
    """Every `common_arg({"-x", "--xx"}[, {"--no-xx"}], ...)` of arg.cpp, with the text up to the next one."""
    matches = list(OPTION.finditer(text))
    out = []
    for m, after in zip(matches, [*matches[1:], None]):
        names = re.findall(r'"([^"]+)"', m.group(1) + (m.group(2) or ""))
        out.append(Upstream(frozenset(names), text[m.start():after.start() if after else len(text)]))
    return out


@pytest.fixture(scope="module")
def arg_cpp() -> str:
    path = arg_cpp_path()
    if path is None:
        pytest.skip("no llama.cpp source here (the pin's common/arg.cpp comes with `ggspec build`)")
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def upstream(arg_cpp) -> list[Upstream]:
    options = parse_arg_cpp(arg_cpp)
    assert len(options) > 200, "arg.cpp no longer reads as expected: fix parse_arg_cpp"
    return options


def spellings(names) -> set[str]:
    """Flag spellings, a typer `--x/--no-x` pair split."""
    return {s for name in names for s in name.split("/")}


def test_each_shared_flag_is_spelled_as_llama_cpp_spells_it(upstream):
    """A flag llama.cpp's tools have ("same") takes exactly their spellings; one they do not have
    ("none") is not in arg.cpp at all; "other" marks a spelling llama.cpp uses for another option."""
    wrong = []
    for entry in table():
        f = entry.flag
        ours = spellings(f.spellings)
        theirs = [o for o in upstream if ours & o.names]
        if f.upstream == "same" and (not theirs or ours != set().union(*(o.names for o in theirs))):
            wrong.append(f"{entry.name}: ggspec {sorted(ours)}, llama.cpp {[sorted(o.names) for o in theirs]}")
        elif f.upstream == "none" and theirs:
            wrong.append(f"{entry.name}: llama.cpp has {[sorted(o.names) for o in theirs]} (upstream='same' or 'other'?)")
        elif f.upstream == "other" and not theirs:
            wrong.append(f"{entry.name}: llama.cpp has no {sorted(ours)} any more (upstream='none')")
    assert not wrong, "\n".join(wrong)


def test_old_spellings_are_ggspec_s_own_or_removed_upstream(upstream):
    """An old spelling ggspec still accepts is either its own old name or one llama.cpp has removed
    (llama.cpp's tools then refuse it with a pointer to the new one)."""
    for entry in table():
        for old in entry.flag.old:
            for o in (o for o in upstream if old in o.names):
                assert "has been removed" in o.source, f"{old}: llama.cpp still takes it ({sorted(o.names)})"


def _upstream(upstream, name: str) -> Upstream:
    return next(o for o in upstream if name in o.names)


@pytest.mark.parametrize("flag, field", [("-ngl", "n_gpu_layers"), ("-ngld", "n_gpu_layers_draft")])
def test_llama_cpp_s_layer_words_parse(upstream, flag, field):
    """-ngl / -ngld: every word arg.cpp compares the value with (all, auto) is one ggspec takes."""
    words = set(re.findall(r'value == "([^"]+)"', _upstream(upstream, flag).source))
    assert {"all", "auto"} <= words
    parse = gpu_layers(field)
    assert {w: parse(w) for w in words} == {"all": ALL_LAYERS, "auto": AUTO} | {w: parse(w) for w in words - {"all", "auto"}}


def test_llama_cpp_s_flash_attn_words_parse(upstream, arg_cpp):
    """-fa: every word of arg.cpp's is_truthy / is_falsey / is_autoy means on / off / auto here too."""
    source = _upstream(upstream, "-fa").source
    for function, meaning in (("is_truthy", "on"), ("is_falsey", "off"), ("is_autoy", "auto")):
        assert function in source
        body = re.search(rf"bool common_arg_utils::{function}\([^)]*\)\s*\{{(.*?)\}}", arg_cpp, re.DOTALL).group(1)
        words = re.findall(r'"([^"]*)"', body)
        assert words and all(flash_attn(w) == meaning for w in words), (function, words)


# --- declared once, parsed once ------------------------------------------------------------------------


def the_cli():
    from ggspec.cli import app

    return typer.main.get_command(app)


@pytest.mark.parametrize("command", ["run", "serve", "bench", "distill", "models"])
def test_no_flag_is_declared_twice(command):
    """The table, the command's own flags and the draft types' flags never share a spelling."""
    names = [n for p in the_cli().commands[command].params for n in (*p.opts, *p.secondary_opts)]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_each_command_takes_the_table_s_flags():
    cli = the_cli()
    for entry in table():
        for command in entry.flag.commands:
            first = entry.flag.spellings[0].split("/")[0]
            assert first in {n for p in cli.commands[command].params for n in p.opts}, (command, entry.name)


def parsed(command: str, *args: str) -> dict:
    """The values click parses for `ggspec COMMAND ARGS` (nothing runs)."""
    cli = the_cli()
    return cli.commands[command].make_context(command, list(args)).params


def test_ngl_all_and_auto_parse():
    assert parsed("run", "-ngl", "all")["n_gpu_layers"] == ALL_LAYERS
    assert parsed("run", "--gpu-layers", "auto", "-ngld", "all")["n_gpu_layers"] == AUTO
    assert parsed("serve", "--spec-draft-ngl", "auto")["n_gpu_layers_draft"] == AUTO
    assert parsed("bench", "-ngl", "-1")["n_gpu_layers"] == -1
    assert parsed("run", "-ngl", "12")["n_gpu_layers"] == 12
    with pytest.raises(InputError, match="expected a number of layers, all or auto"):
        parsed("run", "-ngl", "most")


def test_auto_layers_are_every_layer_where_there_is_a_device(monkeypatch):
    from ggspec.runtime import devices

    monkeypatch.setattr(devices, "has_gpu_backend", lambda: False)
    assert resolved_layers(AUTO, devices=False) == 0 and resolved_layers(AUTO, devices=True) == ALL_LAYERS
    monkeypatch.setattr(devices, "has_gpu_backend", lambda: True)
    assert resolved_layers(AUTO, devices=False) == ALL_LAYERS
    assert resolved_layers(None, devices=True) is None and resolved_layers(5, devices=False) == 5
    _, ngl, ngld = config.placement(Shared(n_gpu_layers=AUTO))
    assert ngl == ngld == ALL_LAYERS


def test_bench_takes_flash_attn_and_sweeps_its_axes():
    """bench's -fa is one value for every configuration; its comma lists go to `swept`."""
    got = {}
    app = typer.Typer()

    @app.command()
    @takes_options("bench")
    def bench(shared: Shared) -> None:
        got["shared"] = shared

    result = CliRunner().invoke(app, ["-fa", "off", "--spec-draft-n-max", "3,auto", "-c", "512,1024",
                                      "--temp", "0,0.7", "--spec-type", "ngram-simple"])
    assert result.exit_code == 0, result.output
    shared = got["shared"]
    assert shared.flash_attn == "off" and shared.spec_type.text == "ngram-simple"
    assert shared.swept["n_max"] == "3,auto" and shared.swept["n_ctx"] == "512,1024" and shared.swept["temp"] == "0,0.7"
    assert shared.n_max is None and shared.n_ctx is None and shared.temp == 0.0  # (the single forms: run's and serve's)
    assert parsed("bench", "--flash-attn", "enabled")["flash_attn"] == "on"


def test_bench_plans_with_the_attention_setting(build_info):
    from ggspec.bench import planning

    shared = Shared(pair="tiny-coder", flash_attn="off")
    plan = planning.plan(shared, planning.AxisFlags(), resume=None, save=None, prompts=None, profile=None, n_predict=4,
                         reps=1, warmup=False, matrix=False, native=False)
    assert plan.settings.flash_attn == "off"


def test_spec_type_and_draft_length_are_parsed_once():
    values = parsed("run", "--spec-type", "ngram-mod,ngram-simple", "--spec-draft-n-max", "auto:7")
    types = values["spec_type"]
    assert types.text == "ngram-mod,ngram-simple"  # PairConfig.spec_type: the list as written
    assert [t.name for t in types.types] == ["ngram-simple", "ngram-mod"]  # llama.cpp's order of preference
    assert types.text_only and types.draft_file_optional
    assert values["n_max"] == NMax(7, True) and parsed("run", "--spec-draft-n-max", "5")["n_max"] == NMax(5, False)
    with pytest.raises(InputError, match="given twice"):
        parsed("run", "--spec-type", "ngram-mod,ngram-mod")


def test_no_draft_and_its_old_name_and_dflash():
    assert parsed("run", "--no-draft")["no_draft"] and parsed("serve", "--no-dflash")["no_draft"]
    assert parsed("bench", "--dflash")["fixed_block"] and not parsed("run")["fixed_block"]
    cfg = config.base_config(Shared(no_draft=True), Path("t.gguf"), Path("d.gguf"))
    assert not cfg.use_draft and not cfg.fixed_block
    cfg = config.base_config(Shared(fixed_block=True, spec_type=None), Path("t.gguf"), Path("d.gguf"))
    assert cfg.use_draft and cfg.fixed_block
    with pytest.raises(InputError, match="--dflash asks for a block drafter"):
        config.base_config(Shared(fixed_block=True, no_draft=True), Path("t.gguf"), None)


def test_flash_attn_words():
    assert [flash_attn(w) for w in ("on", "true", "1", "off", "disabled", "0", "auto", "-1")] == \
        ["on", "on", "on", "off", "off", "off", "auto", "auto"]
    with pytest.raises(InputError, match="expected on, off or auto"):
        flash_attn("maybe")
