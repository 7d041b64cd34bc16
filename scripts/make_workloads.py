"""Write the shipped bench prompt set `stdlib` (ggspec/bench/workloads/stdlib.jsonl): the workloads
where drafting from the text pays, and those where it must not lose, made of text no one here
wrote: CPython's own standard library sources and docstrings (PSF License), each prompt with its
provenance (the file, the function or module, the Python version it was read from).

Completion-style (raw text, no chat template), so a base or an instruction-tuned model of any
size continues it:
  edit      a function, then the start of the same function returned whole with one edit
  refactor  a class's method, then the start of it returned whole, reorganised
  quote     a module's documentation, then a question answered by quoting it
  json      a function, then the start of its signature as JSON (names copied from the code)
  code-gen  a signature and docstring: the body is up to the model (open generation)
  prose     the first sentences of a module's documentation, to go on with (open generation)

    python scripts/make_workloads.py            # rewrite the file (deterministic for a Python version)
"""

from __future__ import annotations

import importlib
import inspect
import json
import platform
import sysconfig
import textwrap
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "ggspec" / "bench" / "workloads" / "stdlib.jsonl"

EDITS = ["textwrap:dedent", "shlex:quote", "fnmatch:translate", "json.encoder:py_encode_basestring_ascii"]
REFACTORS = ["queue:Queue.put", "string:Template.substitute", "calendar:Calendar.itermonthdates",
             "argparse:HelpFormatter._format_usage"]
QUOTES = ["shelve", "unittest", "json", "csv"]
JSONS = ["shutil:copytree", "subprocess:run", "textwrap:fill", "json:dumps"]
CODE_GEN = ["statistics:median_grouped", "itertools_recipes", "difflib:get_close_matches", "glob:escape"]
PROSE = ["pydoc", "inspect", "sched", "smtplib"]

EDIT_ASKS = ["with every comment removed and nothing else changed", "with type hints added",
             "with its docstring shortened to one line", "with the variable names spelled out"]


def _obj(ref: str):
    module, _, name = ref.partition(":")
    obj = importlib.import_module(module)
    for part in name.split(".") if name else ():
        obj = getattr(obj, part)
    return obj


def _where(ref: str) -> str:
    module = ref.partition(":")[0]
    path = Path(inspect.getsourcefile(importlib.import_module(module)))
    lib = Path(sysconfig.get_paths()["stdlib"])
    return f"CPython {platform.python_version()} Lib/{path.relative_to(lib)}" + (
        f": {ref.partition(':')[2]}" if ":" in ref else " (module docstring)")


def _source(ref: str) -> str:
    return textwrap.dedent(inspect.getsource(_obj(ref)))


def _first_line(src: str) -> str:
    lines = src.splitlines(keepends=True)
    out = ""
    for line in lines:  # decorators and the whole signature, up to its colon
        out += line
        if line.rstrip().endswith(":") and not line.lstrip().startswith("@"):
            break
    return out


def _paragraphs(module: str) -> list[str]:
    """A module docstring's paragraphs of prose (more than 150 characters each)."""
    doc = inspect.getdoc(importlib.import_module(module)) or ""
    return [p for p in doc.split("\n\n") if len(p) > 150]


def _prompts() -> list[dict]:
    out = []

    def add(prompt: str, category: str, ref: str) -> None:
        out.append({"prompt": prompt, "category": category, "source": _where(ref), "license": "PSF-2.0"})

    for ref, ask in zip(EDITS, EDIT_ASKS):
        src = _source(ref)
        add(f"{src}\n\n# The same function, {ask}:\n{_first_line(src)}", "edit", ref)
    for ref in REFACTORS:
        src = _source(ref)
        add(f"{src}\n\n# The same method, returned whole with its branches reordered:\n{_first_line(src)}",
            "refactor", ref)
    for module in QUOTES:
        paragraphs = _paragraphs(module)[:3]
        second = paragraphs[1].split()
        add("\n\n".join(paragraphs) + "\n\nQuestion: what does the second paragraph above say? Answer by quoting "
            f"it exactly.\nAnswer: \"{' '.join(second[:3])}", "quote", module)
    for ref in JSONS:
        src = _source(ref)
        name = ref.partition(":")[2]
        add(f"{src}\n\n# The signature above as JSON (its name, then each parameter with its default):\n"
            f'{{"name": "{name}", "parameters": [{{"name": "', "json", ref)
    for ref in CODE_GEN:
        if ref == "itertools_recipes":  # (no such function: the next one stands in)
            ref = "difflib:SequenceMatcher.get_matching_blocks"
        src = _source(ref)
        fn = _obj(ref)
        head = _first_line(src)
        doc = inspect.getdoc(fn) or ""
        body = textwrap.indent(f'"""{doc.splitlines()[0]}"""\n', "    " if not head.startswith(" ") else "        ")
        add(head + body, "code-gen", ref)
    for module in PROSE:
        add(" ".join(_paragraphs(module)[0].split()[:40]), "prose", module)
    return out


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    prompts = _prompts()
    OUT.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    print(f"{len(prompts)} prompts -> {OUT}")


if __name__ == "__main__":
    main()
