"""The slots a lock pins, one :class:`SlotSpec` each (another package's: an entry point of
``kernel_lock.slots``, loaded only when trusted). No torch."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import LockFormatError
from ..tables import nearest
from . import activation, attention, gated_mlp, linear, norms
from .base import (
    DTYPES,
    MODES,
    NOT_PLAIN_TORCH,
    PRECISIONS,
    STATUSES,
    SlotSpec,
    Status,
    TargetFacts,
    dtype_named,
    short_dtype,
    torch_device,
)

__all__ = [
    "DTYPES",
    "ENTRY_POINTS",
    "MODES",
    "PRECISIONS",
    "SLOTS",
    "SPECS",
    "STATUSES",
    "SlotSpec",
    "Status",
    "TargetFacts",
    "canonical_target",
    "class_semantics",
    "computation_problem",
    "confusable",
    "dtype_named",
    "register",
    "semantics",
    "public_name",
    "short_dtype",
    "site_of",
    "slot_name_fix",
    "spec_of",
    "target_facts",
    "torch_device",
    "twin_semantics",
]

ENTRY_POINTS = "kernel_lock.slots"
# torch.nn's facts hold for every supported torch (tests compare them with the installed one)
TORCH_FACTS_SINCE = (2, 4)

_BUILTIN = (
    norms.LAYER_NORM,
    norms.RMS_NORM,
    linear.LINEAR,
    attention.ATTENTION,
    gated_mlp.GATED_MLP,
    activation.ACTIVATION,
)
SLOTS = tuple(s.name for s in _BUILTIN)  # the built-in slots, in the lock's order
SPECS: dict[str, SlotSpec] = {s.name: s for s in _BUILTIN}  # and those registered since


def register(spec: SlotSpec) -> SlotSpec:
    """Add a slot declared outside kernel_lock; refused if it reuses a name, semantics or key."""
    if not isinstance(spec, SlotSpec):
        raise TypeError(f"expected kernel_lock.slots.SlotSpec, got {type(spec).__name__}")
    if SPECS.get(spec.name) is spec:
        return spec
    owner = next((s.name for s in SPECS.values() if s.semantics == spec.semantics), "")
    keys = {k.name for s in SPECS.values() for k in s.keys}
    taken = [f"lock key {k.name!r} is another slot's" for k in spec.keys if k.name in keys]
    problem = (
        f"slot {spec.name!r} exists already"
        if spec.name in SPECS
        else f"semantics {spec.semantics!r} is slot {owner}'s"
        if owner
        else (taken or [""])[0]
    )
    if problem or not spec.name.isidentifier():
        raise ValueError(problem or f"slot name {spec.name!r} is not an identifier")
    SPECS[spec.name] = spec
    return spec


def semantics() -> tuple[str, ...]:
    """Every registered slot's semantics, in the slots' order."""
    return tuple(s.semantics for s in SPECS.values())


def spec_of(name: str, granted: Sequence[str] = ()) -> SlotSpec | None:
    """The spec of slot ``name``: registered, else a trusted entry point's; None when none is."""
    if name in SPECS:
        return SPECS[name]
    if not name.isidentifier():
        return None
    from importlib.metadata import entry_points  # costs ~20 ms: only for a slot not built in

    for ep in entry_points(group=ENTRY_POINTS, name=name):
        module = ep.value.split(":")[0].strip()
        root = module.split(".")[0]
        if not _under(module, granted):  # allow-list before import
            raise LockFormatError(
                f"slot {name!r} is declared by {ep.value} (entry point {ENTRY_POINTS}), a package "
                "not trusted",
                key=f"slots.{name}",
                fix=f"trust it: --trust {root}, KERNEL_LOCK_TRUST={root} or trust=[{root!r}]",
            )
        spec = ep.load()
        if not isinstance(spec, SlotSpec) or spec.name != name:
            raise LockFormatError(
                f"entry point {ep.value} is no SlotSpec named {name!r}",
                key=f"slots.{name}",
                fix="declare the slot's kernel_lock.slots.SlotSpec under its own name",
            )
        return register(spec)
    return None


def confusable(semantics: str) -> str:
    """The semantics a kernel computing ``semantics`` may compute by mistake ("" for none)."""
    return next((s.confusable for s in SPECS.values() if s.semantics == semantics), "")


def slot_name_fix(name: str) -> str:
    """The fix for an unknown slot ``name``: the slot it misspells, and the list of them."""
    near, known = nearest(name, SPECS), f"known slots: {', '.join(SPECS)}"
    if near is not None and near.lower() == str(name).lower():
        return f"did you mean {near!r}? slot names are case-sensitive"
    return f"did you mean {near!r}? {known}" if near else known


def canonical_target(target: str) -> str:
    """``torch.nn.modules.normalization.LayerNorm`` -> ``torch.nn.LayerNorm``; others unchanged."""
    return next((s.aliases[target] for s in SPECS.values() if target in s.aliases), target)


def target_facts(target: str) -> TargetFacts | None:
    """What a class computes and accepts, known without importing it (any of its public names)."""
    name = canonical_target(target)
    return next((s.known_targets[name] for s in SPECS.values() if name in s.known_targets), None)


def twin_semantics(target: str) -> str | None:
    """What a twin target computes, known without importing it; None when it cannot be told."""
    facts = target_facts(target)
    return facts.semantics if facts is not None else None


def computation_problem(
    slot: Any,
    target: str,
    kwargs: Mapping[str, Any],
    cls: type | None = None,
    *,
    twin: bool = False,
) -> str | None:
    """Why ``target`` with ``kwargs`` (``cls`` once imported) does not compute what the lock's
    ``slot`` table declares (a ``twin``: what its target computes, where that can be told); None
    when it does or only running it can tell."""
    spec = SPECS.get(slot.name)
    if spec is None or spec.computes is None:
        return None
    found = spec.computes(target, kwargs, cls)
    own = spec.computes(slot.target, slot.kwargs, None) if twin else None
    want: Mapping[str, tuple[Any, ...]]
    if own:
        want, whose = {k: (v,) for k, v in own.items()}, f"its target {slot.target} computes"
    else:
        want, whose = (spec.declares(slot) if spec.declares else {}), "the slot declares"
    for key, value in (found or {}).items():
        allowed = want.get(key)
        if allowed is not None and not any(value == a for a in allowed):
            return (
                f"{'twin ' if twin else ''}{target} computes {key} {value!r}, but {whose} {key} "
                + " or ".join(repr(a) for a in allowed)
            )
    return None


def computation_fix(twin: bool) -> str:
    """The fix for a :func:`computation_problem`."""
    if twin:
        return (
            "re-run `kernel-probe --force` to pin a twin verified against the slot's target, or "
            "remove the twin (the slot then runs only where its own target can)"
        )
    return (
        "re-run `kernel-probe --force` with the model's declaration to pin a class "
        "that computes it; a hand edit must keep what the model computes"
    )


_MODULE = "torch.nn.modules.module.Module"
_ADAPTERS = ("kernel_lock.adapters",)


def _under(module: str, roots: Sequence[str]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def _computes(cls: type, spec: SlotSpec) -> bool:
    for c in cls.__mro__:
        path = canonical_target(f"{c.__module__}.{c.__qualname__}")
        if path in spec.computed_by and c.__name__ not in spec.not_computed_by:
            return True
    return f"{cls.__module__}.*" in spec.computed_by and cls.__name__ not in spec.not_computed_by


def class_semantics(cls: Any) -> str | None:
    """What a module class computes, told by its hierarchy (a slot's ``computed_by`` subclass, not
    ``NOT_PLAIN_TORCH``; other torch modules ``other: Name``; an adapter, what it wraps); None
    where it cannot tell."""
    if not isinstance(cls, type):
        return None
    if _under(cls.__module__, _ADAPTERS):
        wrapped = next((c for c in cls.__mro__[1:] if not _under(c.__module__, _ADAPTERS)), None)
        if wrapped is None or f"{wrapped.__module__}.{wrapped.__name__}" == _MODULE:
            return None
        return class_semantics(wrapped)
    if any(_under(c.__module__, NOT_PLAIN_TORCH) for c in cls.__mro__):
        return f"other: {cls.__name__} (quantized or fused)"
    found = next((s.semantics for s in SPECS.values() if _computes(cls, s)), None)
    if found is not None:
        return found
    return f"other: {cls.__name__}" if _under(cls.__module__, ("torch",)) else None


def _qualified(cls: type) -> str:
    return canonical_target(f"{cls.__module__}.{cls.__qualname__}")


def public_name(cls: type) -> str:
    """``torch.nn.LayerNorm`` for torch.nn's classes, else ``module.Qualname``: a site's call."""
    nn = sys.modules.get("torch.nn")  # a module of torch.nn's is built: torch is imported
    if _under(cls.__module__, ("torch.nn.modules",)) and getattr(nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    return _qualified(cls)


def _own_forward(cls: type, spec: SlotSpec) -> bool:
    """Whether ``cls`` overrides the forward of the slot's class it derives from."""
    names = set(spec.computed_by) | set(spec.known_targets)
    base = next((c for c in cls.__mro__ if _qualified(c) in names), cls)
    return getattr(cls, "forward", None) is not getattr(base, "forward", None)


def site_of(module: Any) -> SlotSpec | str | None:
    """The slot whose call site a built module is, why it is out of reach (a class no slot swaps),
    or None (the calls its forward makes are the sites)."""
    cls = type(module)
    names = [_qualified(c) for c in cls.__mro__]
    names += [f"torch.nn.{c.__name__}" for c in cls.__mro__ if _under(c.__module__, ("torch.nn",))]
    reasons = {k: v for s in SPECS.values() if s.calls for k, v in s.calls.out_of_reach.items()}
    why = next((reasons[n] for n in names if n in reasons), None)
    if why is not None:
        return why
    found = class_semantics(cls)
    if found is None:
        return None
    if found.endswith("(quantized or fused)"):
        return f"{public_name(cls)} is quantized or fused: no slot computes a plain float call"
    spec = next((s for s in SPECS.values() if s.semantics == found), None)
    return None if spec is None or _own_forward(cls, spec) else spec
