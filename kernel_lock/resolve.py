"""From a verified lock to the real classes. Training never substitutes; inference may
use the slot's verified torch.nn twin, and says so (a WARNING and ``substituted_from``)."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import fingerprint, graph_attention, torchless
from .errors import Difference, KernelUnavailable, LockFormatError, LockMismatch
from .launch import confirm_in_child
from .slots import MODES, SPECS, slot_name_fix, twin_semantics
from .slots.base import Mode
from .trust import (
    IN_INFERENCE_MODE,
    build,
    install_hint,
    static_problem,
    unusable,
    unusable_reason,
)

if TYPE_CHECKING:
    from .document import LockDocument
    from .schema import Slot

__all__ = ["KernelFactory", "as_locked", "confirm_targets", "factory", "resolve_slot", "verify"]

log = logging.getLogger("kernel_lock")

# the facts an inference check reads: a slot runs as pinned only on its device types (Slot.devices)
_INFERENCE_FACTS = ("device-type",)
_REPROBE = "re-run `kernel-probe --force` on this machine"
_NO_TWIN_FIX = (
    "install the training library on this machine, or re-train / re-probe with an implementation "
    "that has a verified torch.nn twin with the same semantics and an interchangeable state dict"
)


class KernelFactory(functools.partial):
    """``functools.partial`` of the pinned class and kwargs, recording how the slot resolved."""

    slot: str
    implementation: str
    target: str
    mode: Mode
    substituted_from: str | None  # the training implementation this twin stands in for
    max_error: float | None  # verified max error between the twin and the training implementation

    def describe(self) -> str:
        """``LayerNorm -> liger.layer_norm (liger_kernel...)``, and what it substitutes for."""
        text = f"{self.slot} -> {self.implementation} ({self.target})"
        if self.substituted_from:
            text += (
                f", substituted for {self.substituted_from} (verified max error {self.max_error})"
            )
        return text


def mode_for(lock: LockDocument | None, mode: str | None) -> Mode:
    """The mode to resolve in: the one asked for, else the lock's own, else training."""
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
    """Check this machine against the lock: :class:`LockMismatch` lists every difference (training:
    fields, libraries, job-start rules; inference: every slot buildable, pinned or via its twin);
    returns notes. ``targets``: None, ``"static"`` or ``"child"`` (:func:`confirm_targets`)."""
    mode = mode_for(lock, mode)
    if current is None:  # torch-free; a fact only torch can settle is read with it
        current = torchless.for_check(_facts_checked(lock, mode))
    notes = (_verify_training if mode == "training" else _verify_inference)(lock, current)
    notes += filter(None, [graph_attention.fallback_note(lock.graph_attention, current)])
    if targets is not None:
        confirm_targets(lock, mode, current, import_unknown=targets == "child")
    return notes


def _facts_checked(lock: LockDocument, mode: Mode) -> list[str]:
    fields = lock.environment.fields
    checked = (
        [name for name, spec in fields.items() if spec.match != "ignore"]
        if mode == "training"
        else list(_INFERENCE_FACTS)
    )
    pinned = lock.graph_attention is not None or any(s.devices for s in lock.slots.values())
    if pinned and "device-type" not in checked:
        checked.append("device-type")  # a slot's devices; where anemoi's GraphTransformer runs
    return checked


def _fingerprint_notes(lock: LockDocument, current: Mapping[str, Any]) -> list[str]:
    fields = lock.environment.fields
    notes = [
        f"environment field {name!r} is unknown to this kernel_lock (a newer writer?): not checked"
        for name in fingerprint.unchecked_fields(fields)
    ]
    notes += [
        f"{name} differs (lock {spec.value!r}, here {current.get(name)!r}): not checked "
        "(match = ignore)"
        for name, spec in fields.items()
        if spec.match == "ignore"
        and name in fingerprint.FIELDS
        and current.get(name) is not None
        and str(current.get(name)) != str(spec.value)
    ]
    return notes + list(filter(None, [fingerprint.device_name_note(current)]))


def _verify_training(lock: LockDocument, current: Mapping[str, Any]) -> list[str]:
    env = lock.environment
    libraries = fingerprint.library_versions(env.libraries)
    diffs = fingerprint.compare(env.fields, current, env.libraries, libraries)
    notes = _fingerprint_notes(lock, current)
    # slots whose own library is missing or too old (installing is the fix), and their problems
    missing: list[Slot] = []
    required = 0
    for slot in lock.slots.values():
        found = unusable(slot, current, "training", lock.mode)  # as factory() judges it
        job_start = SPECS[slot.name].job_start  # the slot's own rules (the Linear's BLAS)
        diffs += found + (job_start(slot, current) if job_start is not None else [])
        if any(d.rule not in ("mode", "devices") for d in found):
            missing.append(slot)
        required += len(found) - (lock.mode == "inference")  # what the fix below covers
    graph = graph_attention.job_start_differences(lock.graph_attention, current)
    diffs = list(dict.fromkeys(diffs + graph))  # the lock's mode, said once
    if not diffs:
        return notes
    elsewhere = any(d.rule == "devices" for d in diffs)
    fix = _training_fix(lock, len(diffs) > required, missing, elsewhere)
    if graph:  # the graph-attention backend's own fix, beside the others'
        others = fix or f"{_REPROBE} to write a lock for it"
        fix = f"{others}; for [{graph_attention.TABLE}]: {graph_attention.FIX}"
        fix = graph_attention.FIX if len(graph) == len(diffs) else fix
    raise LockMismatch(diffs, path=lock.path, fix=fix)


def _training_fix(
    lock: LockDocument, others: bool, missing: list[Slot], elsewhere: bool = False
) -> str | None:
    if lock.mode == "inference":
        return f"verify it {IN_INFERENCE_MODE}, or train with the training lock it was derived from"
    if not missing and not elsewhere:
        return None
    # as factory() says it: install the library (run on the slot's device), or use the twin
    hints = ", ".join(dict.fromkeys(install_hint(slot) for slot in missing))
    need = [f"install what the lock's slots need ({hints})"] if missing else []
    need += ["run on a device the slot runs on"] if elsewhere else []
    return (
        f"{', or '.join(need)}, or load it {IN_INFERENCE_MODE} to use the verified torch.nn twins"
        + (f"; for the other fields, {_REPROBE}" if others else "")
    )


def _verify_inference(lock: LockDocument, current: Mapping[str, Any]) -> list[str]:
    notes, problems = [], []
    for slot in lock.slots.values():
        try:
            r = resolve_slot(lock, slot.name, "inference", current=current, import_classes=False)
        except KernelUnavailable:
            why = f"{unusable_reason(slot, current)}; {twin_refusal(slot)}"
            problems.append(Difference(f"slots.{slot.name}", slot.implementation, why, "inference"))
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
    # every twin judged as `rehash` judges it (other semantics or an unknown kwarg is refused)
    torch_version = str(current.get("torch") or "")
    for entry in lock.slots.values():
        if (twin := entry.twin) is not None:
            key = f"slots.{entry.name}.twin"
            try:
                static_problem(entry.name, twin.target, twin.kwargs, torch_version, lock.path, key)
            except KernelUnavailable:
                pass  # its library is not here: the slot's own target runs, or the slot fails
    return notes


def twin_refusal(slot: Slot) -> str | None:
    """Why ``slot``'s twin may not stand in for it (no twin, state dict, semantics), or None."""
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


def _no_twin(
    lock: LockDocument, entry: Slot, reason: Any, refusal: str, **fix: str
) -> KernelUnavailable:
    return KernelUnavailable(
        f"slot {entry.name}: {entry.implementation} ({entry.target}) cannot run here ({reason}), "
        f"and {refusal}",
        path=lock.path,
        key=f"slots.{entry.name}.twin",
        **fix,
    )


def confirm_targets(
    lock: LockDocument, mode: str, current: Mapping[str, Any], *, import_unknown: bool
) -> None:
    """Raise what :func:`factory` would for a slot, decided without importing where
    possible; an undecidable target is imported in a child (``import_unknown``) or refused."""
    torch_version = str(current.get("torch") or "")
    unknown = {
        entry.name: why
        for entry in lock.slots.values()
        if (why := _static_problem(lock, entry, mode, current, torch_version)) is not None
    }
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
    confirm_in_child(lock, mode, unknown)


def _static_problem(
    lock: LockDocument, entry: Slot, mode: str, current: Mapping[str, Any], torch_version: str
) -> str | None:
    """What importing the class ``entry`` resolves to in ``mode`` would say, decided statically."""
    key = f"slots.{entry.name}"
    target, kwargs, at = entry.target, entry.kwargs, key
    if mode != "training":
        r = resolve_slot(lock, entry.name, mode, current=current, import_classes=False)
        if r.substituted_from is not None:
            target, kwargs, at = r.target, r.kwargs, f"{key}.twin"
    try:
        return static_problem(entry.name, target, kwargs, torch_version, lock.path, at)
    except KernelUnavailable as exc:
        if mode == "training" or at != key:
            raise
        refusal = twin_refusal(entry)  # inference: the import path falls back to the twin
        if refusal is not None:
            raise _no_twin(lock, entry, exc.problem, refusal) from None
        assert entry.twin is not None
        twin, at = entry.twin, f"{key}.twin"
        return static_problem(entry.name, twin.target, twin.kwargs, torch_version, lock.path, at)


def _max_error_text(max_error: float | None) -> str:
    return "not recorded" if max_error is None else f"{max_error:.3g}"


@dataclass(frozen=True)
class Resolution:
    """What one slot resolves to in one mode: the one decision every caller takes."""

    slot: str
    mode: Mode
    implementation: str
    target: str
    kwargs: Mapping[str, Any]
    cls: type | None = None
    substituted_from: str | None = None
    reason: str | None = None
    max_error: float | None = None

    def to_json(self) -> dict[str, Any]:
        """What it resolves to as every command's JSON says it."""
        return {
            "implementation": self.implementation,
            "target": self.target,
            "kwargs": {**self.kwargs},
        }


# what a slot the lock does not pin resolves to: its spec's default_target, under this name
UNPINNED = "torch (default; slot not in lock)"


def as_locked(lock: LockDocument | None, slot: str, mode: str | None = None) -> Resolution:
    """What ``slot`` resolves to by the lock alone, before this machine is asked: the pinned
    implementation, or the slot's default class where the lock does not pin it. The one answer
    ``explain``, ``show`` and ``verify`` give (``resolve_slot`` builds on it)."""
    mode = mode_for(lock, mode)
    if slot not in SPECS:
        raise LockFormatError(f"unknown slot {slot!r}", key=slot, fix=slot_name_fix(slot))
    entry = lock.slots.get(slot) if lock is not None else None
    if entry is None:
        return Resolution(slot, mode, UNPINNED, SPECS[slot].default_target, {})
    return Resolution(slot, mode, entry.implementation, entry.target, entry.kwargs)


def resolve_slot(
    lock: LockDocument | None,
    slot: str,
    mode: str | None = None,
    *,
    current: Mapping[str, Any] | None = None,
    import_classes: bool = True,
    verify_environment: bool = False,
) -> Resolution:
    """Decide what ``slot`` resolves to under ``lock`` in ``mode`` (default: the lock's).
    Training: the pinned implementation or :class:`KernelUnavailable`; inference: pinned where it
    runs here, else the verified twin, else :class:`KernelUnavailable` with both reasons."""
    locked = as_locked(lock, slot, mode)
    entry, key = lock.slots.get(slot) if lock is not None else None, f"slots.{slot}"
    if lock is None or entry is None:
        cls = build(slot, locked.target, {}, None, key) if import_classes else None
        return dataclasses.replace(locked, cls=cls)
    reason = None
    if locked.mode == "training":
        _refuse_training(lock, entry)
        if verify_environment and "training" not in lock.verified_modes:
            verify(lock, mode="training")  # the whole fingerprint, once per lock
            lock.verified_modes.add("training")
    else:
        here = current if current is not None else torchless.for_check(_INFERENCE_FACTS)
        reason = unusable_reason(entry, here)
    if reason is None:
        if not import_classes:
            return locked
        try:
            return dataclasses.replace(
                locked, cls=build(slot, entry.target, entry.kwargs, lock, key)
            )
        except KernelUnavailable as exc:
            if locked.mode == "training":
                raise
            reason = exc.problem
    refusal = twin_refusal(entry)
    if refusal is not None:
        raise _no_twin(lock, entry, reason, refusal, fix=_NO_TWIN_FIX)
    twin = entry.twin
    assert twin is not None
    cls = build(slot, twin.target, twin.kwargs, lock, f"{key}.twin") if import_classes else None
    substitute = functools.partial(Resolution, slot, locked.mode, f"twin:{entry.implementation}")
    return substitute(twin.target, twin.kwargs, cls, entry.implementation, reason, twin.max_error)


def _refuse_training(lock: LockDocument, entry: Slot) -> None:
    """Raise :class:`KernelUnavailable` where ``entry`` cannot be trained with here (metadata):
    :func:`~kernel_lock.trust.unusable`'s first problem, as ``verify`` finds it."""
    slot, what = entry.name, f"slot {entry.name}: {entry.implementation} ({entry.target})"
    here = torchless.for_check(_INFERENCE_FACTS) if entry.devices else {}
    problems = unusable(entry, here, "training", lock.mode)
    if not problems:
        return
    first = problems[0]
    if first.rule == "mode":
        raise KernelUnavailable(
            f"slot {slot}: {lock.path or 'this lock'} is an inference lock (its substitutions are "
            "baked in); training never runs on substituted kernels",
            path=lock.path,
            key="mode",
            fix="train with the training lock it was derived from"
            + (f" ({lock.provenance['source']})" if lock.provenance.get("source") else "")
            + f", or resolve this one {IN_INFERENCE_MODE}",
        )
    if first.rule == "devices":
        raise KernelUnavailable(
            f"{what} runs on {first.expected}; this machine's device is {first.found}",
            path=lock.path,
            key=first.field,
            fix="train on a machine with that device, re-run `kernel-probe` on this "
            f"machine, or load it {IN_INFERENCE_MODE} to use the verified torch.nn twin",
        )
    # this slot's own library: "install it, or use inference mode" says more than verify()
    needs = [p for p in problems if p.rule != "devices"]
    raise KernelUnavailable(
        f"{what} needs "
        + "; ".join(f"{p.field.rsplit('.', 1)[-1]} {p.expected} (found: {p.found})" for p in needs),
        path=lock.path,
        key=f"slots.{slot}.requires",
        fix=f"install it ({install_hint(entry)}), re-run `kernel-probe` on this machine, "
        f"or load it {IN_INFERENCE_MODE} to use the verified torch.nn twin",
    )


def factory(
    lock: LockDocument | None,
    slot: str,
    mode: str | None = None,
    *,
    verify_environment: bool = True,
) -> KernelFactory:
    """The callable that builds ``slot``'s pinned class (training verifies the lock once)."""
    r = resolve_slot(lock, slot, mode, verify_environment=verify_environment)
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
    f = KernelFactory(r.cls, **dict(r.kwargs))
    f.slot, f.implementation, f.target, f.mode = slot, r.implementation, r.target, r.mode
    f.substituted_from, f.max_error = r.substituted_from, r.max_error
    return f
