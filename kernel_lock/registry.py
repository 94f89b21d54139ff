"""The registry: the kernel libraries, built-in candidates and adapters, as data read
from ``registry.toml`` without torch; the import allow-list follows from it."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any

from . import toml as _toml
from .slots import SPECS, TargetFacts, canonical_target
from .slots import target_facts as known_facts

__all__ = [
    "ADAPTERS",
    "AUTOCAST_ADAPTERS",
    "DATA",
    "PATH",
    "SIZE_ADAPTERS",
    "SIZE_NAMES",
    "adapter_for",
    "allowed_roots",
    "data",
    "declared_semantics",
    "generic_kernel",
    "generic_parts",
    "import_root",
    "path",
    "reset",
    "size_parameter",
    "target_facts",
    "wrapping_adapter_for",
]

DATA = "registry.toml"  # package data of kernel_lock; pyproject.toml's package-data names it too
# modules every lock may name whatever the registry says: torch itself and kernel_lock's own
OWN_ROOTS = ("torch", "kernel_lock.adapters", "kernel_lock.attention", "kernel_lock.gated_mlp")
PATH: Path | None = None  # None: the shipped file; tests point it at a copy, then call reset()


def path() -> Path:
    """The registry file in use (through importlib.resources)."""
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
    """A target's allow-list entry: its top-level package (kernel_lock's own: one module)."""
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
    """The modules a lock may name without granted trust: ``OWN_ROOTS`` and the registry's."""
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
    """What ``target`` computes and accepts, without importing it; None: only importing can tell."""
    return known_facts(target) or _declared(path()).get(canonical_target(target))


def declared_semantics(target: str) -> str | None:
    """The semantics the registry declares for ``target``, or None."""
    facts = target_facts(target)
    return facts.semantics if facts is not None else None


# ---- the adapters, by name ----------------------------------------------------------------------
ADAPTERS = "kernel_lock.adapters"

# anemoi calls norms with ``normalized_shape``; these classes call it ``hidden_size``: each adapter
# subclasses one (same state dict). adapter name -> (library class, its size parameter)
SIZE_ADAPTERS: dict[str, tuple[str, str]] = {
    "LigerLayerNormAnemoi": ("liger_kernel.transformers.LigerLayerNorm", "hidden_size"),
    "LigerRMSNormAnemoi": ("liger_kernel.transformers.LigerRMSNorm", "hidden_size"),
    "FlashAttnRMSNormAnemoi": ("flash_attn.ops.triton.layer_norm.RMSNorm", "hidden_size"),
}

# anemoi's AutocastLayerNorm casts the output back to the input dtype; these keep that cast around
# another LayerNorm kernel. adapter name -> the class it subclasses
AUTOCAST_ADAPTERS: dict[str, str] = {
    "AutocastCompiledLayerNorm": f"{ADAPTERS}.CompiledLayerNorm",
    "AutocastLigerLayerNormAnemoi": f"{ADAPTERS}.LigerLayerNormAnemoi",
    "AutocastTELayerNorm": "transformer_engine.pytorch.LayerNorm",
    "AutocastFusedLayerNorm": "apex.normalization.FusedLayerNorm",
}

# the adapters that keep an anemoi wrapper's behaviour, by the wrapper's adapter prefix
WRAPPING_ADAPTERS: dict[str, dict[str, str]] = {"Autocast": AUTOCAST_ADAPTERS}

# Generic adapters: the name carries the kernel's dotted path, dots as ``__``
# (``Autocast__site_kernels__norms__FastLN``); built on first lookup, so it pickles by name.
GENERIC_SEPARATOR = "__"
GENERIC_PREFIXES = ("Autocast", "Sized")
SIZE_NAMES = ("hidden_size", "dim")


def generic_parts(name: str) -> tuple[str, str] | None:
    """(prefix, kernel path) of a generic adapter's class name, or None."""
    prefix, sep, rest = name.partition(GENERIC_SEPARATOR)
    if not sep or prefix not in GENERIC_PREFIXES:
        return None
    parts = rest.split(GENERIC_SEPARATOR)
    if len(parts) < 2 or any(not p.isidentifier() or p.startswith("_") for p in parts):
        return None
    return prefix, ".".join(parts)


def generic_kernel(target: str) -> str | None:
    """The kernel a generic adapter target wraps (``...Autocast__a__B`` -> ``a.B``), or None."""
    module, _, name = target.rpartition(".")
    if module != ADAPTERS:
        return None
    parts = generic_parts(name)
    return parts[1] if parts else None


def adapter_for(target: str) -> str | None:
    """The ``kernel_lock.adapters`` path of the size adapter for ``target``, or None."""
    return next((f"{ADAPTERS}.{n}" for n, (w, _) in SIZE_ADAPTERS.items() if w == target), None)


def wrapping_adapter_for(prefix: str, target: str) -> str | None:
    """The adapter that runs ``target`` inside the anemoi wrapper ``prefix`` names."""
    adapters = WRAPPING_ADAPTERS.get(prefix, {})
    return next((f"{ADAPTERS}.{n}" for n, base in adapters.items() if base == target), None)


def size_parameter(cls: Any) -> str | None:
    """The name a norm class gives its size where not ``normalized_shape``, else None."""
    try:
        params = [p for p in inspect.signature(cls).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return None
    if not params or any(p.name == "normalized_shape" for p in params):
        return None
    return params[0].name if params[0].name in SIZE_NAMES else None
