"""Every public definition of kernel_lock and kernel_probe says what it is (issue 40): a
module-level function or class, or a method of a public class, whose name does not start with an
underscore, has a docstring. Read from the source (AST), so nothing is imported."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernel_lock", "kernel_probe")


def _public(node: ast.AST) -> bool:
    return isinstance(
        node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    ) and not node.name.startswith("_")


def _overload(node: ast.AST) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any(
        (isinstance(d, ast.Name) and d.id == "overload")
        or (isinstance(d, ast.Attribute) and (d.attr == "overload" or d.attr == "setter"))
        for d in decorators
    )


def public_definitions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(dotted name, node) of each public function and class of a module, and each public method of
    a public class (an ``@overload`` stub or a property's setter is documented by its
    implementation)."""
    for node in tree.body:
        if not _public(node) or _overload(node):
            continue
        yield node.name, node  # type: ignore[attr-defined]
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if _public(item) and not _overload(item):
                    yield f"{node.name}.{item.name}", item  # type: ignore[attr-defined]


def undocumented() -> list[str]:
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for name, node in public_definitions(tree):
                if not ast.get_docstring(node):  # type: ignore[arg-type]
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")  # type: ignore[attr-defined]
    return missing


def test_every_public_definition_has_a_docstring():
    missing = undocumented()
    assert not missing, f"{len(missing)} public definitions without a docstring:\n" + "\n".join(
        missing
    )


def test_the_walk_finds_functions_classes_and_methods_and_skips_the_private():
    tree = ast.parse(
        "def f(): pass\ndef _g(): pass\nclass C:\n    def m(self): pass\n    def _p(self): "
        "pass\n    def __init__(self): pass\nclass _D:\n    def m(self): pass\n"
    )
    assert [name for name, _ in public_definitions(tree)] == ["f", "C", "C.m"]
