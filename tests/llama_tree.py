"""Reads a llama.cpp source tree to learn what each architecture's graph does, so that tables in
ggspec (which archs extract layer inputs, which assert head sizes) are checked against the code.

arch enum -> GGUF name (llama-arch.cpp), arch enum -> model class (llama-model.cpp), model class
-> the graph it runs (models/models.h: its own `struct graph`, a `using graph = ...` alias, or
its parent's), graph -> the constructor's source text (models/*.cpp).
"""

from __future__ import annotations

import re
from pathlib import Path


def graph_sources(tree: Path) -> dict[str, str]:
    """GGUF architecture name -> the source of the graph constructor that architecture runs."""
    src = tree / "src"
    names = dict(re.findall(r'\{\s*(LLM_ARCH_\w+),\s*"([^"]+)"\s*\}', (src / "llama-arch.cpp").read_text()))
    classes = dict(re.findall(r"case (LLM_ARCH_\w+):\s*return new (llama_model_\w+)\(",
                              (src / "llama-model.cpp").read_text()))
    structs = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^struct (llama_model_\w+) : public (\w+) \{(.*?)^\};", (src / "models" / "models.h").read_text(),
        re.DOTALL | re.MULTILINE)}
    sources = [p.read_text() for p in sorted((src / "models").glob("*.cpp"))]
    assert len(classes) > 100 and len(structs) > 100, "the tree's layout changed: update this scanner"

    def graph_owner(cls: str) -> str:
        parent, body = structs[cls]
        alias = re.search(r"using graph = (llama_model_\w+)::graph", body)
        if alias and alias.group(1) != cls:
            return graph_owner(alias.group(1))
        if re.search(r"struct graph\b", body) or parent == "llama_model_base":
            return cls
        return graph_owner(parent)  # runs the graph it inherits

    def ctor(cls: str) -> str:
        pattern = re.compile(re.escape(cls) + r"::graph(?:<\w+>)?::graph\(")
        for text in sources:
            m = pattern.search(text)
            if m:
                return text[m.start():text.find("\n}\n", m.end())]
        return ""

    return {names[arch]: ctor(graph_owner(cls)) for arch, cls in classes.items() if cls in structs}
