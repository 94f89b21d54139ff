"""The generic stages never name a slot (issue 51): what a slot is lives in its own module
(``kernel_lock/slots/<slot>.py``, ``kernel_probe/slots/<slot>.py``); planning, checking, judging,
timing, choosing, writing, resolving, exporting and explaining reach it through the Slot protocol.

Read from the source (AST), so nothing is imported: a string constant that is a slot's name or
semantics, a name of a slot's constant, or an import of a slot's own module is a failure;
docstrings and comments may name slots as examples."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

GENERIC = [
    "kernel_lock/tables.py",
    "kernel_lock/toml.py",
    "kernel_lock/schema.py",
    "kernel_lock/document.py",
    "kernel_lock/graph_attention.py",
    "kernel_lock/lock.py",
    "kernel_lock/resolve.py",
    "kernel_lock/fingerprint.py",
    "kernel_lock/registry.py",
    "kernel_lock/portability.py",
    "kernel_lock/apply.py",
    "kernel_lock/routing.py",
    "kernel_lock/checkpoint.py",
    "kernel_lock/distributed.py",
    "kernel_lock/slots/__init__.py",
    "kernel_lock/slots/base.py",
    "kernel_probe/slots/__init__.py",
    "kernel_probe/slots/base.py",
    "kernel_probe/probe/planning.py",
    "kernel_probe/probe/pipeline.py",
    "kernel_probe/probe/check.py",
    "kernel_probe/probe/handlers.py",
    "kernel_probe/probe/judge.py",
    "kernel_probe/probe/tolerance.py",
    "kernel_probe/probe/report.py",
    "kernel_probe/probe/repetitions.py",
    "kernel_probe/probe/choose.py",
    "kernel_probe/probe/write.py",
    "kernel_probe/probe/derive.py",
    "kernel_probe/probe/frommodel.py",
    "kernel_probe/commands/probe.py",
    "kernel_probe/commands/check.py",
    "kernel_probe/commands/locks.py",  # show, explain, diff, verify, rehash, lock --for inference
    "kernel_probe/anemoi/pipelines.py",  # export and check-config as library functions
    "kernel_probe/jobstart.py",
    "kernel_probe/profiles.py",
]
SLOT_NAMES = {"LayerNorm", "RMSNorm", "Linear", "Attention", "GatedMLP", "Activation"}
SEMANTICS = {"layer_norm", "rms_norm", "linear", "attention", "gated_mlp", "activation"}
CONSTANTS = {"LAYER_NORM", "RMS_NORM", "LINEAR", "ATTENTION", "GATED_MLP", "ACTIVATION"}
SLOT_MODULES = {"norms", "linear", "attention", "gated_mlp", "activation"}


def _files() -> list[Path]:
    out: list[Path] = []
    for name in GENERIC:
        path = ROOT / name
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            ids.add(id(value))
    return ids


def slot_names_in(source: str) -> list[str]:
    """Where ``source`` names a slot outside its docstrings: (line, what) as text."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value in SLOT_NAMES | SEMANTICS:
                found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Name) and node.id in CONSTANTS:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = {a.name for a in node.names}
            if module.endswith("slots") and names & SLOT_MODULES and node.level == 0:
                found.append(f"{node.lineno}: from {module} import {', '.join(sorted(names))}")
            if module.rsplit(".", 1)[-1] in SLOT_MODULES and "slots" in module:
                found.append(f"{node.lineno}: from {module}")
    return found


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_generic_stage_names_no_slot(path: Path) -> None:
    found = slot_names_in(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)} names a slot: {found}"


def test_the_check_finds_a_slot_named_in_code_but_not_in_a_docstring() -> None:
    source = (
        '"""The LayerNorm slot, as an example."""\n'
        "from kernel_lock.slots import attention\n"
        "from kernel_probe.slots.gated_mlp import GATED_MLP\n"
        'def f(slot):\n    """Activation."""\n    return slot == "Attention" or GATED_MLP\n'
    )
    assert sorted(slot_names_in(source)) == [
        "2: from kernel_lock.slots import attention",
        "3: from kernel_probe.slots.gated_mlp",
        "6: 'Attention'",
        "6: GATED_MLP",
    ]
