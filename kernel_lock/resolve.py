"""From a verified lock to the real classes: the resolver.

Training mode never substitutes: the pinned implementation is built here, or an error says why not.
Inference mode may use the slot's verified torch.nn twin instead, and says so (a WARNING log record
and the ``substituted_from`` attribute of what it returns), so a caller can assert on it.

Kept at ``kernel_lock.resolve`` (the public face of *resolve and fingerprint*; the facts it checks
are ``kernel_lock.fingerprint``'s): models that hold a factory pickle it as
``kernel_lock.resolve.KernelFactory``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import Difference, KernelUnavailable, LockFormatError, LockMismatch
from .slots import MODES, SPECS, Mode, slot_name_fix, twin_semantics
from .trust import (
    IN_INFERENCE_MODE,
    build,
    install_hint,
    requirement_problems,
    static_problem,
    unusable_reason,
)

if TYPE_CHECKING:
    from .document import LockDocument
    from .schema import Slot

__all__ = [
    "INFERENCE_FACTS",
    "KernelFactory",
    "Resolution",
    "check_twins",
    "confirm_targets",
    "factory",
    "mode_for",
    "resolve_slot",
    "twin_refusal",
    "verify",
]

log = logging.getLogger("kernel_lock")


class KernelFactory(functools.partial):
    """``functools.partial`` of the real class, with the pinned kwargs (call-site kwargs win).

    Calling it builds the library's own module (``type(m)`` is the pinned class, no wrapper). The
    extra attributes record how the slot was resolved.
    """

    slot: str
    implementation: str
    target: str
    mode: Mode
    substituted_from: str | None  # the training implementation this twin stands in for
    max_error: float | None  # verified max error between the twin and the training implementation

    def describe(self) -> str:
        """``LayerNorm -> liger.layer_norm (liger_kernel...)``, and what it substitutes for, if
        anything."""
        text = f"{self.slot} -> {self.implementation} ({self.target})"
        if self.substituted_from:
            text += (
                f", substituted for {self.substituted_from} (verified max error {self.max_error})"
            )
        return text


def _check_slot_name(slot: str) -> None:
    if slot not in SPECS:
        raise LockFormatError(f"unknown slot {slot!r}", key=slot, fix=slot_name_fix(slot))


# the facts an inference check reads: a slot runs as pinned only on its device types (Slot.devices)
INFERENCE_FACTS = ("device-type",)


def mode_for(lock: LockDocument | None, mode: str | None) -> Mode:
    """The mode to resolve in: the one asked for, else the lock's own (``mode = "inference"`` in a
    derived lock), else training. Raises for an unknown mode."""
    chosen = mode if mode is not None else (lock.mode if lock is not None else "training")
    if chosen not in MODES:
        raise LockFormatError(f"unknown mode {chosen!r}", fix=f"use one of {', '.join(MODES)}")
    return chosen


def verify(
    lock: LockDocument,
    mode: str | None = None,
    *,
    current: Mapping[str, Any] | None = None,
    targets: str | None = None,
) -> list[str]:
    """Check this machine against the lock. Raises :class:`LockMismatch` listing every difference.

    ``targets``: whether each slot's class and kwargs are checked too, as ``factory`` would refuse
    them (:func:`confirm_targets`): None, not here (the caller imports them next); ``"static"``,
    without importing anything, a target only an import can judge being an error (``verify
    --no-import``); ``"child"``, such a target is imported in a child process (the job-start check
    of ``kernel-probe``).

    Training: every fingerprint field (under its match rule), every pinned library version and every
    slot requirement. Inference: the machine may differ (that is the point), but every slot must be
    buildable, either as pinned or through a verified twin. Returns notes (substitutions). ``mode``
    defaults to the lock's own.
    """
    mode = mode_for(lock, mode)
    if current is None:
        from . import torchless

        # without importing torch where it is not; a fact this check needs that only torch can
        # settle is read with it
        checked = (
            [name for name, spec in lock.environment.fields.items() if spec.match != "ignore"]
            if mode == "training"
            else INFERENCE_FACTS
        )
        if lock.graph_attention is not None and "device-type" not in checked:
            checked = [
                *checked,
                "device-type",
            ]  # where anemoi's GraphTransformer would run its kernel
        current = torchless.for_check(checked)
    notes: list[str] = []
    from . import graph_attention

    fallback = graph_attention.fallback_note(lock.graph_attention, current)
    if mode == "training":
        from . import fingerprint

        libs = fingerprint.library_versions(lock.environment.libraries)
        diffs = fingerprint.compare(
            lock.environment.fields, current, lock.environment.libraries, libs
        )
        notes.extend(
            f"environment field {name!r} is unknown to this kernel_lock (a newer writer?): not "
            "checked"
            for name in fingerprint.unchecked_fields(lock.environment.fields)
        )
        notes.extend(
            f"{name} differs (lock {spec.value!r}, here {current.get(name)!r}): not checked "
            "(match = ignore)"
            for name, spec in lock.environment.fields.items()
            if spec.match == "ignore"
            and name in fingerprint.FIELDS
            and current.get(name) is not None
            and str(current.get(name)) != str(spec.value)
        )
        name_note = fingerprint.device_name_note(current)
        if name_note:
            notes.append(name_note)
        missing = []  # slots whose own library is missing or too old: installing it is the fix
        for slot in lock.slots.values():
            found = requirement_problems(slot)
            diffs.extend(found)
            if found:
                missing.append(slot)
            job_start = SPECS[slot.name].job_start  # the slot's own rules (the Linear's BLAS)
            if job_start is not None:
                diffs.extend(job_start(slot, current))
        graph_diffs = graph_attention.job_start_differences(lock.graph_attention, current)
        diffs.extend(graph_diffs)
        if fallback and not graph_diffs:
            notes.append(fallback)
        if lock.mode == "inference":
            diffs.append(
                Difference(
                    "mode",
                    "inference",
                    "training asked for (training never runs on the substitutions of a derived "
                    "lock)",
                    "mode",
                )
            )
        if diffs:
            fix = None
            if lock.mode == "inference":
                fix = (
                    f"verify it {IN_INFERENCE_MODE}, or train with the training lock it was "
                    "derived from"
                )
            elif missing:  # as factory() says it: install the library, or use the verified twin
                hints = ", ".join(dict.fromkeys(install_hint(slot) for slot in missing))
                others = len(diffs) > sum(len(requirement_problems(slot)) for slot in missing)
                fix = (
                    f"install what the lock's slots need ({hints}), or load it "
                    f"{IN_INFERENCE_MODE} to use the verified torch.nn twins"
                    + (
                        "; for the other fields, re-run `kernel-probe --force` on this machine"
                        if others
                        else ""
                    )
                )
            if graph_diffs:  # the graph-attention backend's own fix, beside the others'
                others_fix = (
                    fix or "re-run `kernel-probe --force` on this machine to write a lock for it"
                )
                only = len(graph_diffs) == len(diffs)
                fix = (
                    graph_attention.FIX
                    if only
                    else f"{others_fix}; for [{graph_attention.TABLE}]: {graph_attention.FIX}"
                )
            raise LockMismatch(diffs, path=lock.path, fix=fix)
        if targets is not None:
            confirm_targets(lock, mode, current, import_unknown=targets == "child")
        return notes
    problems = []
    for slot in lock.slots.values():
        try:
            r = resolve_slot(lock, slot.name, mode, current=current, import_classes=False)
        except KernelUnavailable:
            reason, refusal = unusable_reason(slot, current), twin_refusal(slot)
            problems.append(
                Difference(
                    f"slots.{slot.name}", slot.implementation, f"{reason}; {refusal}", "inference"
                )
            )
            continue
        if r.substituted_from:
            notes.append(
                f"{slot.name}: {slot.implementation} cannot run here ({r.reason}); inference uses "
                f"twin {r.target} (verified max error {_max_error_text(r.max_error)})"
            )
    if problems:
        raise LockMismatch(
            problems,
            path=lock.path,
            fix="install the library the slot needs, or re-probe on this machine; a slot "
            "without a verified twin cannot be substituted",
        )
    if fallback:
        notes.append(fallback)
    check_twins(lock, str(current.get("torch") or ""))
    if targets is not None:
        confirm_targets(lock, mode, current, import_unknown=targets == "child")
    return notes


def check_twins(lock: LockDocument, torch_version: str) -> None:
    """Every twin of ``lock`` judged as ``rehash`` judges it (``locate.static_problem``, the one
    function): a twin may stand in for its slot in inference, so one of other semantics (an RMSNorm,
    through an alias, as LayerNorm's twin) or with a keyword argument it does not take is refused,
    whether or not it is used on this machine. A twin only an import can judge is judged where it is
    built."""
    for entry in lock.slots.values():
        if entry.twin is None:
            continue
        try:
            static_problem(
                entry.name,
                entry.twin.target,
                entry.twin.kwargs,
                torch_version,
                lock.path,
                f"slots.{entry.name}.twin",
            )
        except KernelUnavailable:
            # the twin's library is not on this machine: the slot's own target runs, or the slot
            # fails
            pass


def twin_refusal(slot: Slot) -> str | None:
    """Why ``slot``'s twin may not stand in for it, or None when it may.

    A twin may stand in only if it exists, its state dict interchanges with the pinned class's
    (directly, or through a recorded migration), and it computes the same thing as the slot.
    """
    twin = slot.twin
    if twin is None:
        return "it has no verified portable twin"
    if twin.state_dict == "incompatible":
        return (
            f"its twin's state dict does not interchange with it ({slot.target} and "
            f"{twin.target} store different keys)"
        )
    semantics = twin_semantics(twin.target)
    if semantics is not None and semantics != slot.semantics:
        return (
            f"its twin {twin.target} computes {semantics}, not {slot.semantics} (the maths "
            "would change)"
        )
    return None


# ---- the job-start check: what an import would refuse, decided without importing where it can be


def confirm_targets(
    lock: LockDocument, mode: str, current: Mapping[str, Any], *, import_unknown: bool
) -> None:
    """Raise what :func:`factory` would raise for a slot of ``lock`` in ``mode``: a target of other
    semantics or not a class, an unknown kwarg, a module that is not there.

    Decided without importing wherever ``registry.target_facts`` and the file system know the facts.
    A target they cannot judge is "not checked without import", never current: with
    ``import_unknown``, those slots are resolved by ``factory`` in a child process (foreign code
    runs there, not here) and its verdict is raised here; without, :class:`KernelUnavailable` says
    which and why (exit 3: the lock could not be confirmed).
    """
    torch_version = str(current.get("torch") or "")
    unknown: dict[str, str] = {}
    for entry in lock.slots.values():
        key = f"slots.{entry.name}"
        if mode == "training":
            target, kwargs, at = entry.target, entry.kwargs, key
        else:
            r = resolve_slot(lock, entry.name, mode, current=current, import_classes=False)
            target, kwargs, at = (
                r.target,
                r.kwargs,
                key if r.substituted_from is None else f"{key}.twin",
            )
        try:
            why = static_problem(entry.name, target, kwargs, torch_version, lock.path, at)
        except KernelUnavailable as exc:
            if mode == "training" or at != key:
                raise
            refusal = twin_refusal(entry)  # inference: the import path falls back to the twin
            if refusal is not None:
                raise KernelUnavailable(
                    f"slot {entry.name}: {entry.implementation} ({entry.target}) cannot run here "
                    f"({exc.problem}), and {refusal}",
                    path=lock.path,
                    key=f"{key}.twin",
                ) from None
            assert entry.twin is not None
            why = static_problem(
                entry.name,
                entry.twin.target,
                entry.twin.kwargs,
                torch_version,
                lock.path,
                f"{key}.twin",
            )
        if why is not None:
            unknown[entry.name] = why
    if not unknown:
        return
    if not import_unknown:
        raise KernelUnavailable(
            "not checked without import: "
            + "; ".join(f"slot {name}: {why}" for name, why in unknown.items())
            + " (so the lock is not confirmed current)",
            path=lock.path,
            key="slots." + next(iter(unknown)),
            fix="run `kernel-probe verify` without --no-import (imports each class), or "
            "`kernel-probe --check` (imports only these, in a child process)",
        )
    from .launch import (
        confirm_in_child,
    )  # a child process: only for targets no table can judge

    confirm_in_child(lock, mode, unknown)


def _max_error_text(max_error: float | None) -> str:
    return "not recorded" if max_error is None else f"{max_error:.3g}"


def _ensure_verified(lock: LockDocument, mode: str) -> None:
    done = lock.verified_modes
    if mode not in done:
        verify(lock, mode=mode)
        done.add(mode)


@dataclass(frozen=True)
class Resolution:
    """What one slot resolves to in one mode, and why: the one decision ``factory``, ``verify``,
    ``kernel-probe lock --for inference`` and the anemoi export all take.

    ``cls`` is the imported class (None when resolved without importing); ``substituted_from`` the
    training implementation a twin stands in for, with ``reason`` (why it cannot run here) and the
    twin's verified ``max_error``."""

    slot: str
    mode: Mode
    implementation: str
    target: str
    kwargs: Mapping[str, Any]
    cls: type | None = None
    substituted_from: str | None = None
    reason: str | None = None
    max_error: float | None = None


def resolve_slot(
    lock: LockDocument | None,
    slot: str,
    mode: str | None = None,
    *,
    current: Mapping[str, Any] | None = None,
    import_classes: bool = True,
) -> Resolution:
    """Decide what ``slot`` resolves to under ``lock`` in ``mode`` (default: the lock's own).

    Training: the pinned implementation, or :class:`KernelUnavailable` (requirement missing, other
    device type, an inference lock, an import that fails). Inference: the pinned implementation
    where it can run here (with ``import_classes``, an import that fails counts as cannot), else the
    verified twin, else :class:`KernelUnavailable` with both reasons. Never checks the fingerprint
    (that is ``verify``'s); ``current`` defaults to this machine.
    """
    _check_slot_name(slot)
    mode = mode_for(lock, mode)
    entry = lock.slots.get(slot) if lock is not None else None
    if entry is None:
        target = SPECS[slot].default_target
        cls = build(slot, target, {}, None, f"slots.{slot}") if import_classes else None
        return Resolution(slot, mode, "torch (default; slot not in lock)", target, {}, cls)
    assert lock is not None
    key = f"slots.{slot}"
    pinned = functools.partial(
        Resolution, slot, mode, entry.implementation, entry.target, entry.kwargs
    )
    if mode == "training":
        _refuse_training(lock, entry)
        return pinned(
            build(slot, entry.target, entry.kwargs, lock, key) if import_classes else None
        )
    if current is None:
        from . import torchless

        current = torchless.for_check(INFERENCE_FACTS)
    reason = unusable_reason(entry, current)
    if reason is None:
        if not import_classes:
            return pinned()
        try:
            return pinned(build(slot, entry.target, entry.kwargs, lock, key))
        except KernelUnavailable as exc:
            reason = exc.problem
    refusal = twin_refusal(entry)
    if refusal is not None:
        raise KernelUnavailable(
            f"slot {slot}: {entry.implementation} ({entry.target}) cannot run here ({reason}), "
            f"and {refusal}",
            path=lock.path,
            key=f"{key}.twin",
            fix="install the training library on this machine, or re-train / re-probe with an "
            "implementation that has a verified torch.nn twin with the same semantics and an "
            "interchangeable state dict",
        )
    twin = entry.twin
    assert twin is not None
    cls = build(slot, twin.target, twin.kwargs, lock, f"{key}.twin") if import_classes else None
    return Resolution(
        slot,
        mode,
        f"twin:{entry.implementation}",
        twin.target,
        twin.kwargs,
        cls,
        substituted_from=entry.implementation,
        reason=reason,
        max_error=twin.max_error,
    )


def _refuse_training(lock: LockDocument, entry: Slot) -> None:
    """Raise :class:`KernelUnavailable` when ``entry`` cannot be trained with here (metadata
    only)."""
    slot = entry.name
    if lock.mode == "inference":
        raise KernelUnavailable(
            f"slot {slot}: {lock.path or 'this lock'} is an inference lock (its substitutions are "
            "baked in); training never runs on substituted kernels",
            path=lock.path,
            key="mode",
            fix="train with the training lock it was derived from"
            + (f" ({lock.provenance['source']})" if lock.provenance.get("source") else "")
            + f", or resolve this one {IN_INFERENCE_MODE}",
        )
    # this slot's own library first: "install it, or use inference mode" says more than the list
    # of every differing environment field that verify() would give for the same cause
    problems = requirement_problems(entry)
    if problems:
        raise KernelUnavailable(
            f"slot {slot}: {entry.implementation} ({entry.target}) needs "
            + "; ".join(
                f"{p.field.rsplit('.', 1)[-1]} {p.expected} (found: {p.found})" for p in problems
            ),
            path=lock.path,
            key=f"slots.{slot}.requires",
            fix=f"install it ({install_hint(entry)}), re-run `kernel-probe` on this machine, "
            f"or load it {IN_INFERENCE_MODE} to use the verified torch.nn twin",
        )
    if entry.devices:
        from . import torchless

        here = torchless.for_check(INFERENCE_FACTS).get("device-type")
        if here not in entry.devices:
            raise KernelUnavailable(
                f"slot {slot}: {entry.implementation} ({entry.target}) runs on "
                f"{', '.join(entry.devices)}; this machine's device is {here}",
                path=lock.path,
                key=f"slots.{slot}.devices",
                fix="train on a machine with that device, re-run `kernel-probe` on this "
                f"machine, or load it {IN_INFERENCE_MODE} to use the verified torch.nn twin",
            )


def factory(
    lock: LockDocument | None,
    slot: str,
    mode: str | None = None,
    *,
    verify_environment: bool = True,
) -> KernelFactory:
    """The callable that builds ``slot``'s pinned class with the pinned kwargs.

    A slot the lock does not mention resolves to torch.nn (locks may pin only some slots). ``mode``
    defaults to the lock's own (training for a probe lock, inference for a derived one). What it
    resolves to is :func:`resolve_slot`'s decision; training mode also verifies the whole
    fingerprint once per lock (``verify_environment``).
    """
    mode = mode_for(lock, mode)
    if mode == "training" and lock is not None and slot in lock.slots:
        _check_slot_name(slot)
        _refuse_training(lock, lock.slots[slot])
        if verify_environment:
            _ensure_verified(lock, mode)  # the whole fingerprint, once per lock
    r = resolve_slot(lock, slot, mode)
    entry = lock.slots.get(slot) if lock is not None else None
    on_resolve = SPECS[slot].on_resolve  # the slot's own process-wide setting (a BLAS library)
    if lock is not None and entry is not None and on_resolve is not None:
        on_resolve(entry, lock.path)
    if r.substituted_from:
        log.warning(
            "inference substitutes %s for slot %s: %s cannot run here (%s); verified max error "
            "between them: %s",
            r.target,
            slot,
            r.substituted_from,
            r.reason,
            _max_error_text(r.max_error),
        )
    assert r.cls is not None
    return _make(
        r.cls, r.kwargs, slot, r.implementation, r.target, mode, r.substituted_from, r.max_error
    )


def _make(
    cls: type,
    kwargs: Mapping[str, Any],
    slot: str,
    implementation: str,
    target: str,
    mode: Mode,
    substituted_from: str | None,
    max_error: float | None,
) -> KernelFactory:
    f = KernelFactory(cls, **dict(kwargs))
    f.slot, f.implementation, f.target, f.mode = slot, implementation, target, mode
    f.substituted_from, f.max_error = substituted_from, max_error
    return f
