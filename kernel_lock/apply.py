"""A lock applied to a model that already exists (:func:`apply`), and undone (:func:`undo`).

Each covered module is replaced in place by the lock's class (same sizes, options and tensors);
each functional call of the lock's ``[model]`` table is routed to it (:mod:`kernel_lock.routing`).
Any other site is left as written, and the report (:class:`Applied`) says why. Torch is imported
only inside the functions."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import LockFormatError
from .lock import KernelLock
from .model import Model, Site
from .routing import Enter, Leave, Route, Router
from .slots import SPECS, public_name, site_of
from .slots.base import NONE_VALUE, Calls, SlotSpec

__all__ = ["RECORD", "Applied", "AppliedSite", "Record", "apply", "undo"]

RECORD = "_kernel_lock_applied"  # the model's attribute holding what apply changed
_AS_WRITTEN = "left as written"


@dataclass(frozen=True)
class AppliedSite:
    """One call site: what it resolved to (``now``, a class's dotted name; "" where it is left as
    written) and why it is left, or a note."""

    where: str
    slot: str
    kind: str
    call: str
    now: str = ""
    reason: str = ""

    @property
    def swapped(self) -> bool:
        """Whether the lock's class now runs here (replaced, or routed)."""
        return bool(self.now)


@dataclass
class Applied:
    """What :func:`apply` did: every site, and notes on the lock as a whole; ``str()`` a table."""

    sites: tuple[AppliedSite, ...]
    notes: tuple[str, ...] = ()
    router: Router | None = field(default=None, repr=False)

    @property
    def left(self) -> tuple[AppliedSite, ...]:
        """The sites left as written."""
        return tuple(s for s in self.sites if not s.swapped)

    def calls(self) -> dict[str, tuple[int, int]]:
        """Per functional site, its calls so far: (routed, left as written because their
        semantics at run time were not the lock's)."""
        counts = self.router.counts if self.router is not None else {}
        return {where: (routed, left) for where, (routed, left) in counts.items()}

    def __str__(self) -> str:
        rows = [("site", "slot", "call", "now")]
        for s in self.sites:
            now = s.now or _AS_WRITTEN
            rows.append((s.where or "<model>", s.slot or "-", s.call, now))
            if s.reason:
                rows.append(("", "", "", f"  ({s.reason})"))
        widths = [max(len(r[i]) for r in rows if not r[3].startswith("  (")) for i in range(3)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
                 for r in rows]  # fmt: skip
        done = sum(s.swapped for s in self.sites)
        left = len(self.sites) - done
        tally = f"{done} of {len(self.sites)} sites run the lock's classes; {left} left as written"
        return "\n".join([*(line.rstrip() for line in lines), tally, *self.notes])


@dataclass
class Record:
    """What :func:`undo` restores: the lock, and each replaced module's original by its path."""

    lock: KernelLock
    originals: dict[str, Any]


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class _Applier:
    """One application: the lock's classes resolved once per slot, the sites judged in turn."""

    def __init__(self, model: Any, lock: KernelLock, mode: str | None):
        self.model, self.lock, self.mode = model, lock, mode
        self.sites: list[AppliedSite] = []
        self.replaced: dict[int, tuple[str, Any, Any]] = {}  # id(original) -> (path, it, new)
        self.factories: dict[str, Any] = {}
        traced = lock.model
        self.traced: dict[str, Site] | None = (
            None if traced is None else {s.where: s for s in traced.sites}
        )

    def factory(self, slot: str) -> Any:
        """The slot's class as the lock resolves it (LockError where it cannot here)."""
        if slot not in self.factories:
            self.factories[slot] = self.lock.factory(slot, self.mode)
        return self.factories[slot]

    def left(self, where: str, slot: str, kind: str, call: str, reason: str) -> None:
        self.sites.append(AppliedSite(where, slot, kind, call, "", reason))

    def stated(self, spec: SlotSpec) -> dict[str, tuple[Any, ...]]:
        """The values the slot's table states: its kwargs, and its declaration (Activation's)."""
        table = self.lock.slots[spec.name]
        stated = {k: (v,) for k, v in table.kwargs.items()}
        return stated | {
            k: tuple(v) for k, v in (spec.declares(table) if spec.declares else {}).items()
        }

    def checked(self, spec: SlotSpec, calls: Calls, where: str, semantics: Mapping) -> str | None:
        """Why a module's semantics are not those the lock checked (the trace's site and the slot's
        table; without a trace, the table over the slot's canonical values), or None."""
        stated = self.stated(spec)
        options = {k: v for k, v in semantics.items() if k not in calls.sizes}
        if self.traced is None:
            fallback = {**calls.defaults, **spec.canonical}  # what the check ran where it is silent
            want = {k: stated.get(k, (fallback.get(k),)) for k in options if k in stated | fallback}
            return _differences(options, want, "the lock's slot")
        site = self.traced.get(where)
        if site is None:
            return "not in the lock's [model] trace"
        if site.slot != spec.name:
            return f"the lock's trace has slot {site.slot} here"
        theirs: Mapping[str, Any] = site.semantics
        why = _differences(semantics, {k: (v,) for k, v in theirs.items()}, "the lock")
        return why or _stated(options, stated)

    def module(self, where: str, module: Any, spec: SlotSpec, calls: Calls) -> None:
        """Judge one module site, and build its replacement where it is covered."""
        site = (where, spec.name, "module", public_name(type(module)))
        semantics = calls.module(module)
        if isinstance(semantics, str):
            return self.left(*site, semantics)
        if spec.name not in self.lock.slots:
            return self.left(*site, "the lock does not pin this slot")
        factory = self.factory(spec.name)  # a slot the model uses, unusable here: the lock's error
        why = self.checked(spec, calls, where, semantics)
        if why is not None:
            return self.left(*site, why)
        if where == "":
            return self.left(*site, "the model itself: apply to a parent")
        if type(module) is factory.func:
            return self.left(*site, f"already {factory.target}")
        new = _build(module, spec, calls, factory, self.lock.slots[spec.name].kwargs)
        if isinstance(new, str):
            return self.left(*site, new)
        self.replaced[id(module)] = (where, module, new)
        self.sites.append(AppliedSite(*site, factory.target))

    def function(self, site: Site, routes: dict[str, dict[str, list[Route]]]) -> None:
        """Judge one functional site of the lock's trace, and plan its route where covered."""
        owner, _, rest = site.where.rpartition(":")
        name = rest.partition("#")[0]
        left = (site.where, site.slot, "function", site.call)
        spec = SPECS.get(site.slot)
        functional = spec.calls.functions.get(name) if spec and spec.calls else None
        if spec is None or functional is None:
            return self.left(*left, f"kernel_lock routes no {name} of slot {site.slot}")
        if site.slot not in self.lock.slots:
            return self.left(*left, "the lock does not pin this slot")
        factory = self.factory(site.slot)
        try:
            self.model.get_submodule(owner)
        except AttributeError:
            return self.left(*left, f"the model has no module {owner or '<model>'}")
        sizes = spec.calls.sizes if spec.calls else frozenset()
        options = {k: v for k, v in site.semantics.items() if k not in sizes}
        why = _stated(options, self.stated(spec))
        if why is not None:
            return self.left(*left, why)
        pinned = self.lock.slots[site.slot].kwargs
        built = _build_for_call(spec, functional, factory, site.semantics, pinned)
        if isinstance(built, str):
            return self.left(*left, built)
        route = Route(site.where, dict(site.semantics), built, site.slot, name)
        routes.setdefault(owner, {}).setdefault(name, []).append(route)
        note = "when a call's semantics at run time are the lock's"
        self.sites.append(AppliedSite(*left, factory.target, note))


def _stated(
    options: Mapping[str, Any],
    stated: Mapping[str, tuple[Any, ...]],
    whose: str = "the lock's slot",
) -> str | None:
    """Where ``stated`` (the slot's table) has a value ``options`` do not (None: they have all)."""
    return _differences({k: v for k, v in options.items() if k in stated}, stated, whose)


def _differences(mine: Mapping[str, Any], want: Mapping[str, tuple[Any, ...]], whose: str) -> Any:
    """The first semantics value of ``mine`` that ``want`` does not allow, in words (or None)."""
    for key, value in mine.items():
        if key not in want:
            return f"{key} {value!r}: {whose} did not check it"
        if not any(_same(value, a) for a in want[key]):
            allowed = " or ".join(repr(a) for a in want[key])
            return f"{key} {value!r}, {whose} checked {allowed}"
    return None


def _same(a: Any, b: Any) -> bool:
    """Equal as the trace writes values (a tuple is a list; a bool is never a number)."""
    a, b = (NONE_VALUE if v is None else v for v in (a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _accepted(cls: type) -> set[str] | None:
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return None


def _unchecked(
    spec: SlotSpec, factory: Any, own: Mapping[str, Any], pinned: Mapping, semantics: Mapping
) -> Any:
    """Why the class built with the site's ``own`` options is not what the lock checked: one
    overrides an option the slot pins, or it computes other than ``semantics`` (None: neither)."""
    kwargs = {**factory.keywords, **own}
    found = spec.computes(factory.target, kwargs, factory.func) if spec.computes else None
    return _stated(own, {k: (v,) for k, v in pinned.items()}) or _stated(
        found or {}, {k: (v,) for k, v in semantics.items()}, "the site"
    )


def _build(
    module: Any, spec: SlotSpec, calls: Calls, factory: Any, pinned: Mapping[str, Any]
) -> Any:
    """The lock's class built from ``module`` (its sizes and options over the lock's kwargs),
    holding the module's own parameters and buffers; or why it cannot be."""
    state = module.state_dict(keep_vars=True)
    how = calls.module_args or spec.twin_args
    accepted = _accepted(factory.func) or set(factory.keywords)
    args, own = how(module, state, accepted) if how is not None else ((), {})
    semantics = calls.module(module)
    assert not isinstance(semantics, str)
    why = _unchecked(spec, factory, own, pinned, semantics)
    if why is not None:
        return why
    try:
        new = factory.func(*args, **{**factory.keywords, **own})
    except Exception as exc:  # the class refuses the module's own sizes or options
        return f"{factory.target} cannot be built with them ({type(exc).__name__}: {exc})"
    mine, theirs = set(state), set(new.state_dict())
    if mine != theirs:
        extra, missing = sorted(theirs - mine), sorted(mine - theirs)
        return (
            f"state-dict keys would differ ({factory.target} adds {extra or 'none'}, drops "
            f"{missing or 'none'})"
        )
    reference = next(iter(state.values()), None)
    if reference is not None:
        new.to(device=reference.device)
    try:
        new.load_state_dict(state, strict=True, assign=True)  # the same tensors
    except RuntimeError as exc:
        return f"its state does not load into {factory.target} ({exc})"
    new.train(module.training)
    return new


def _build_for_call(
    spec: SlotSpec, functional: Any, factory: Any, semantics: Mapping, pinned: Mapping[str, Any]
) -> Any:
    """The lock's class built for a functional site's semantics, or why it cannot be."""
    args, own = functional.build(semantics)
    accepted = _accepted(factory.func)
    refused = sorted(k for k in own if accepted is not None and k not in accepted)
    if refused:
        return f"{factory.target} takes no {', '.join(refused)}"
    why = _unchecked(spec, factory, own, pinned, semantics)
    if why is not None:
        return why
    if factory.target == spec.default_target and set(factory.keywords) <= set(own):
        return f"the lock pins {factory.target}, what the call runs already"
    try:
        module = factory.func(*args, **{**factory.keywords, **own})
    except Exception as exc:
        return f"{factory.target} cannot be built for it ({type(exc).__name__}: {exc})"
    holds = {name for name, _ in module.named_parameters()}
    passes = functional.params(semantics)
    if holds != passes:
        return (
            f"{factory.target} holds parameters {sorted(holds)}, the call passes {sorted(passes)}"
        )
    return module


def apply(model: Any, lock: KernelLock, mode: str | None = None) -> Applied:
    """Swap every call site of ``model`` that ``lock`` covers, in place; the report names every
    site. Raises the lock's errors (:class:`~kernel_lock.LockError`) where it cannot be used here,
    never for a site it leaves as written."""
    if getattr(model, RECORD, None) is not None:
        raise ValueError(
            "kernel_lock.apply: this model has a lock applied already; "
            "kernel_lock.apply.undo(model) first"
        )
    traced = lock.model
    if traced is not None and not traced.intact:
        raise LockFormatError(
            "the [model] table's digest is not its sites' (edited by hand?)",
            path=lock.path,
            key="model.digest",
            fix="re-run `kernel-probe --model SPEC --force` to trace the model again",
        )
    applier = _Applier(model, lock, mode)
    _modules(model, applier)
    routes: dict[str, dict[str, list[Route]]] = {}
    for site in traced.sites if traced is not None else ():
        if site.kind == "function":
            applier.function(site, routes)
    _not_found(applier, traced)
    _replace(model, applier.replaced)
    originals = {where: old for where, old, _ in applier.replaced.values()}
    router = Router(routes) if routes else None
    if router is not None:
        _hook(model, router)
    setattr(model, RECORD, Record(lock, originals))
    notes = () if traced is not None else (
        "functional calls are not routed: the lock has no [model] table "
        "(probe with `kernel-probe --model SPEC`)",
    )  # fmt: skip
    order = {s.where: i for i, s in enumerate(traced.sites if traced is not None else ())}
    sites = sorted(applier.sites, key=lambda s: order.get(s.where, len(order)))  # the trace's
    return Applied(tuple(sites), notes, router)


def _modules(model: Any, applier: _Applier) -> None:
    """Judge the model's module sites as the trace finds them (``site_of``): a site's own
    submodules are its own, never sites."""
    covered: list[str] = []
    for where, module in model.named_modules():
        if any(c == "" or where.startswith(c + ".") for c in covered):
            continue
        found = site_of(module)
        if found is None:
            continue
        covered.append(where)
        call = public_name(type(module))
        if isinstance(found, str):
            applier.left(where, "", "module", call, found)
        elif found.calls is None:
            applier.left(where, found.name, "module", call, f"no {found.name} is swapped in place")
        else:
            applier.module(where, module, found, found.calls)


def _not_found(applier: _Applier, traced: Model | None) -> None:
    """The trace's module sites the model does not hold, and the sites no slot can swap."""
    seen = {s.where for s in applier.sites}
    for site in traced.sites if traced is not None else ():
        if site.where not in seen:
            applier.left(site.where, site.slot, site.kind, site.call, _missing(applier, site))
    for gone in traced.unreached if traced is not None else ():
        if gone.where not in seen:
            kind = "function" if ":" in gone.where else "module"  # a call's where names its module
            applier.left(gone.where, "", kind, gone.call, gone.reason)


def _missing(applier: _Applier, site: Site) -> str:
    try:
        module = applier.model.get_submodule(site.where)
    except AttributeError:
        return "the model has no module here"
    return f"the model holds {_qualified(type(module))} here, not {site.call}"


def _replace(model: Any, replaced: Mapping[int, tuple[str, Any, Any]]) -> None:
    """Put each new module where its original is, under every parent that holds it."""
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is not None and id(child) in replaced:
                parent._modules[name] = replaced[id(child)][2]


def _hook(model: Any, router: Router) -> None:
    """A frame for the forward of every module under a module that makes a routed call."""
    hooked: set[int] = set()
    for owner in router.routes:
        for path, module in model.get_submodule(owner).named_modules(prefix=owner):
            if id(module) in hooked:
                continue
            hooked.add(id(module))
            module.register_forward_pre_hook(Enter(router, path if path in router.routes else None))
            module.register_forward_hook(Leave(router), always_call=True)


def undo(model: Any) -> list[str]:
    """Undo :func:`apply` in place: each replaced module's original back, holding the state the
    replacement has now; the routing hooks removed. Returns the paths restored."""
    record = model.__dict__.pop(RECORD, None)
    for module in model.modules():
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for key in [k for k, v in hooks.items() if isinstance(v, (Enter, Leave))]:
                del hooks[key]
                module._forward_hooks_always_called.pop(key, None)
    if record is None:
        return []
    back: dict[int, tuple[str, Any, Any]] = {}
    for where, original in record.originals.items():
        try:
            now = model.get_submodule(where)
        except AttributeError:
            continue  # the model changed since: nothing of apply's is left there
        original.load_state_dict(now.state_dict(keep_vars=True), strict=True, assign=True)
        original.train(now.training)
        back[id(now)] = (where, now, original)
    _replace(model, back)
    return [where for where, _, _ in back.values()]
