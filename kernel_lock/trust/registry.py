"""The registry: the kernel libraries and built-in candidates kernel-lock knows, declared once as
data.

``registry.toml`` (package data of kernel_lock) holds one ``[[library]]`` table per kernel library
and one ``[[candidate]]`` table per built-in implementation of a slot. This module reads it
(tomllib, no torch) and derives the import allow-list from it: a lock may name, without being
granted trust, a class under torch, under ``kernel_lock.adapters``, or under the import root of any
registered candidate's target or twin. So the allow-list and the candidates cannot drift apart: a
lock pinning any built-in loads, and adding a library's candidate is one data entry.

kernel-probe parses the same tables into its own types (``kernel_probe.candidates``,
``kernel_probe.detect.libraries``); here they stay plain data, so importing kernel_lock stays light.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ..format import toml as _toml
from ..slots import SPECS, TargetFacts, canonical_target
from ..slots import target_facts as known_facts

__all__ = [
    "DATA",
    "OWN_ROOTS",
    "PATH",
    "allowed_roots",
    "data",
    "declared_semantics",
    "import_root",
    "path",
    "reset",
    "target_facts",
]

DATA = "registry.toml"  # package data of kernel_lock; pyproject.toml's package-data names it too
# modules every lock may name whatever the registry says: torch itself and kernel_lock's own
# adapters
OWN_ROOTS = ("torch", "kernel_lock.adapters", "kernel_lock.attention", "kernel_lock.gated_mlp")
# None: the registry.toml shipped in this package. Tests point it at a copy with an entry added
# (what shipping that file does) and call reset().
PATH: Path | None = None


def path() -> Path:
    """The registry file in use, found through importlib.resources like kernel-probe's site
    profiles."""
    if PATH is not None:
        return PATH
    from importlib.resources import files

    return Path(str(files("kernel_lock").joinpath(DATA)))


@functools.cache
def _data(where: Path) -> dict[str, Any]:
    return _toml.loads(where.read_text(encoding="utf-8"))


def data() -> dict[str, Any]:
    """The parsed registry (read once per file; callers must not modify it)."""
    return _data(path())


def reset() -> None:
    """Forget what was read (after pointing ``PATH`` elsewhere)."""
    _data.cache_clear()
    _allowed_roots.cache_clear()
    _declared.cache_clear()


def import_root(target: str) -> str:
    """The root a target's allow-list entry is: its top-level package, except kernel_lock's own
    modules, which are allowed one module at a time (only ``kernel_lock.adapters`` builds
    classes)."""
    parts = target.split(".")
    return ".".join(parts[:2]) if parts[0] == "kernel_lock" else parts[0]


@functools.cache
def _allowed_roots(where: Path) -> tuple[str, ...]:
    roots = dict.fromkeys(OWN_ROOTS)
    for cand in _data(where).get("candidate", []):
        for key in ("target", "twin-target"):
            if isinstance(cand.get(key), str) and cand[key]:
                roots.setdefault(import_root(cand[key]))
    return tuple(roots)


def allowed_roots() -> tuple[str, ...]:
    """The modules a lock may name without being granted trust: torch, kernel_lock.adapters and the
    import root of every registered candidate's target and twin."""
    return _allowed_roots(path())


@functools.cache
def _declared(where: Path) -> dict[str, TargetFacts]:
    out: dict[str, TargetFacts] = {}
    for cand in _data(where).get("candidate", []):
        target, slots = cand.get("target"), cand.get("slots") or []
        if not (isinstance(target, str) and slots and slots[0] in SPECS):
            continue
        semantics = cand.get("semantics") or SPECS[slots[0]].semantics
        known = set(cand.get("kwargs") or {}) | set(cand.get("build-kwargs") or {})
        before = out.get(target)
        if before is not None:
            known |= before.params
        out[target] = TargetFacts(semantics, frozenset(known), False)
    return out


def target_facts(target: str) -> TargetFacts | None:
    """What ``target`` computes and the constructor keywords it is known to accept, without
    importing it: torch.nn's and kernel_lock's classes from ``SlotSpec.known_targets`` (through
    their aliases), a registered candidate's from its declaration (its semantics, and the kwargs it
    is declared with: not necessarily every one it accepts). None: only importing it can tell."""
    return known_facts(target) or _declared(path()).get(canonical_target(target))


def declared_semantics(target: str) -> str | None:
    """The semantics the registry declares for ``target`` (a registered candidate's class), or
    None."""
    facts = target_facts(target)
    return facts.semantics if facts is not None else None
