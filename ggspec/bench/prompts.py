"""Benchmark prompts grouped by workload, built in or from a JSONL file.

Acceptance depends on the workload far more than on anything else (measured on real pairs: verbatim echo
accepts nearly everything, prose least), so every figure is reported per category as well as
over all prompts. The built-in set is raw text (no chat template), written so that a code model
of any size has something to continue: new code, an edit of shown code, a verbatim repeat of
shown code, and English prose. The shipped `stdlib` set (workloads/, made by
scripts/make_workloads.py from CPython's standard library, not written here) holds the workloads
where drafting from the text pays (edits and refactors returned whole, answers quoting a document,
JSON extraction) and those where it must not lose (open code generation, prose).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggspec.errors import InputError
from ggspec.files import check_text, json_lines


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str


_STACK = '''class Stack:
    """A last-in, first-out container."""

    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()
'''

_PARSE = '''def parse_config(path):
    result = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            result[key.strip()] = value.strip()
    return result
'''

_MEAN = '''def mean(values):
    total = 0
    count = 0
    for v in values:
        total += v
        count += 1
    return total / count
'''

BUILTIN: tuple[Prompt, ...] = (
    # code generation: a signature and a docstring, the body is up to the model
    Prompt('def merge_sorted(a, b):\n    """Merge two sorted lists into one sorted list."""\n', "code-gen"),
    Prompt('import os\n\n\ndef find_files(root, suffix):\n    """Yield the paths below root whose name ends with suffix."""\n',
           "code-gen"),
    Prompt("class LRUCache:\n    def __init__(self, capacity):\n", "code-gen"),
    # code editing: shown code, then the start of its revised version
    Prompt(_MEAN + "\n\n# The same function with type hints and a check for empty input:\n"
           "def mean(values: list[float]) -> float:\n", "code-edit"),
    Prompt(_PARSE + "\n\n# Rewritten with pathlib:\nfrom pathlib import Path\n\n\ndef parse_config(path: Path):\n",
           "code-edit"),
    Prompt(_STACK + "\n\n# The same class with a peek method added:\nclass Stack:\n", "code-edit"),
    # verbatim echo: shown code, then the start of an exact copy
    Prompt(_STACK + "\n\n# A copy of the class above:\n" + _STACK[:40], "code-echo"),
    Prompt(_PARSE + "\n\n# The same code again:\n" + _PARSE[:30], "code-echo"),
    Prompt(_MEAN + "\n\n# Repeated:\n" + _MEAN[:20], "code-echo"),
    # prose
    Prompt("The history of the printing press begins in the fifteenth century, when", "prose"),
    Prompt("Dear colleagues,\n\nThank you for attending yesterday's meeting. To summarise", "prose"),
    Prompt("A good unit test has three parts. First,", "prose"),
)


WORKLOADS = Path(__file__).resolve().parent / "workloads"  # shipped sets (scripts/make_workloads.py)


def shipped_sets() -> list[str]:
    """The names of the shipped prompt sets (`--prompts NAME`)."""
    return sorted(p.stem for p in WORKLOADS.glob("*.jsonl"))


def load_prompts(path: Path | None) -> list[Prompt]:
    """The built-in set, a shipped set by name (`stdlib`: workloads made of CPython's standard
    library, each prompt with its provenance), or a JSONL file of {"prompt": str, "category": str
    (optional)} (other keys, such as a prompt's source, are kept in the file only)."""
    if path is None:
        return list(BUILTIN)
    if not path.exists() and str(path) in shipped_sets():
        path = WORKLOADS / f"{path}.jsonl"
    prompts = []
    for n, obj in json_lines(path, f"--prompts {path}"):
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise InputError(f"--prompts {path}:{n}: expected an object with a non-empty string \"prompt\"")
        category = obj.get("category", "default")
        if not isinstance(category, str) or not category or category == "all":
            raise InputError(f"--prompts {path}:{n}: \"category\" must be a non-empty string other than 'all'")
        check_text(obj["prompt"], f"--prompts {path}:{n}: \"prompt\"")
        check_text(category, f"--prompts {path}:{n}: \"category\"")
        prompts.append(Prompt(obj["prompt"], category))
    if not prompts:
        raise InputError(f"--prompts {path}: no prompts in the file")
    return prompts
