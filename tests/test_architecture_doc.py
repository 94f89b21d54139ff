"""docs/architecture.md: one data-flow picture (Mermaid) from detection to the lock and into
training and inference; every module it names exists, and every edge joins nodes the picture
declares (issue 37)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"


def _mermaid() -> str:
    blocks = re.findall(r"```mermaid\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert len(blocks) == 1, "one picture"
    return blocks[0]


def test_every_module_the_picture_names_exists():
    named = set(re.findall(r"(kernel_(?:lock|probe)/[\w/]*(?:\.py|\.toml|/))", _mermaid()))
    assert len(named) >= 15
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_the_picture_goes_from_detection_to_training_and_inference():
    text = _mermaid()
    assert text.startswith("flowchart ")
    declared = set(re.findall(r"^\s*(\w+)[\[\(\{]", text, re.M))
    edges = re.findall(r'^\s*(\w+)\s*(?:--\s*"[^"]*"\s*)?-->\s*(\w+)', text, re.M)
    assert len(edges) >= 15
    used = {n for edge in edges for n in edge}
    assert used <= declared | {"training", "inference"}, used - declared
    # a path from detection through the lock into both training and inference
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    seen, todo = set(), ["detect"]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    assert {"lockfile", "training", "inference"} <= seen


def test_the_readme_links_the_docs_and_stays_short():
    """(Every link resolves: tests/test_doc_links.py.)"""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "docs/architecture.md" in readme and "docs/benchmarks.md" in readme
