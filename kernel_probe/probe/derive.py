"""Locks from locks: an inference lock derived from a training lock for this machine (each slot
whose implementation cannot run here gets its verified twin, as ``resolve_slot`` decides), and
what differs between two locks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kernel_lock.errors import KernelUnavailable
from kernel_lock.fingerprint import library_versions
from kernel_lock.lock import KernelLock
from kernel_lock.resolve import resolve_slot
from kernel_lock.schema import Slot
from kernel_lock.slots import SLOTS, SPECS
from kernel_probe import __version__
from kernel_probe.probe import stale
from kernel_probe.probe.write import environment, now


@dataclass(frozen=True)
class Substitution:
    """A slot whose training implementation cannot run here, replaced by its twin, and why."""

    slot: str
    training: str  # the training implementation id
    training_target: str
    twin_target: str
    reason: str  # why the training implementation cannot run here
    max_error: float | None

    def __str__(self) -> str:
        error = "not recorded" if self.max_error is None else f"{self.max_error:.3g}"
        return f"{self.slot}: {self.training} -> {self.twin_target} (max error {error})"


def derive_inference(
    lock: KernelLock, current: Mapping[str, Any], *, source: str
) -> tuple[KernelLock, list[Substitution]]:
    """The sealed inference lock for ``current``'s machine, and the substitutions (module doc)."""
    slots: dict[str, Slot] = {}
    substitutions: list[Substitution] = []
    refused: list[str] = []
    for name, slot in lock.slots.items():
        try:  # the resolver's own decision, imports included (a library may fail on import here)
            r = resolve_slot(lock, name, "inference", current=current)
        except KernelUnavailable as exc:
            refused.append(exc.problem.removeprefix("slot "))
            continue
        if r.substituted_from is None:
            slots[name] = slot
            continue
        reason = r.reason or "not recorded"
        sub = Substitution(name, slot.implementation, slot.target, r.target, reason, r.max_error)
        substitutions.append(sub)
        # the twin record stays: it says how a state dict saved by the training implementation
        # migrates into this one (kernel_lock.checkpoint.migrate_state_dict reads it)
        # the slot's derived keys (a gate) computed from the twin's kwargs, never copied
        computed = {k.name: k.derive(r.kwargs) for k in SPECS[name].keys if k.derive is not None}
        slots[name] = replace(
            slot,
            implementation=r.implementation,
            target=r.target,
            kwargs=dict(r.kwargs),
            extra={**slot.extra, **computed},
            requires=(),
            devices=(),
            reason=f"inference twin of {slot.implementation} ({slot.target}), which cannot run "
            f"here: {reason}; chosen for training because: {slot.reason or 'no reason recorded'}",
        )
    if refused:
        raise KernelUnavailable(
            f"cannot derive an inference lock from {source}: {len(refused)} slot(s) have no "
            "usable twin:\n" + "\n".join(f"  - {r}" for r in refused),
            fix="run inference where the training library is installed, or re-train / re-probe "
            "with an implementation that has a verified torch.nn twin (nothing was written)",
        )
    distributions = sorted({r.name for s in slots.values() for r in s.requires})
    libraries = {n: v for n, v in library_versions(distributions).items() if v is not None}
    derived = KernelLock(
        created_by=f"kernel-probe {__version__}",
        created_at=now(),
        environment=environment(current, libraries),
        slots=slots,
        mode="inference",
        precision=lock.precision,
        trusted_modules=lock.trusted_modules,
        provenance=_provenance(lock, source, slots, substitutions),
        graph_attention=lock.graph_attention,  # anemoi's GraphTransformer backend
    )
    return derived.sealed(), substitutions


def _provenance(
    lock: KernelLock, source: str, slots: Mapping[str, Slot], substitutions: list[Substitution]
) -> dict[str, Any]:
    """What the derived lock records of its training lock and the substitutions."""
    provenance: dict[str, Any] = {
        "derived-for": "inference",
        "source": source,
        "source-digest": lock.compute_digest(),
        "source-created-by": lock.created_by,
    }
    if lock.created_at:
        provenance["source-created-at"] = lock.created_at
    if lock.profile.get("name"):
        provenance["source-profile"] = str(lock.profile["name"])
    provenance["substitutions"] = [str(s) for s in substitutions]
    # what anemoi reads at import: set it in the inference job's environment
    environment_vars: dict[str, str] = {}
    for entry in slots.values():
        anemoi_environment = SPECS[entry.name].anemoi_environment
        if anemoi_environment is not None:
            environment_vars.update(anemoi_environment(entry))
    if environment_vars:
        provenance["anemoi-environment"] = environment_vars
    return provenance


def _as_dict(field: Any) -> dict[str, Any] | None:
    return field.to_dict() if field else None


def lock_differences(a: KernelLock, b: KernelLock) -> dict[str, list[dict[str, Any]]]:
    """What differs between locks: top-level keys, fingerprint, libraries, slots' choices, and
    what they were probed for (the model, the profile, the options, the libraries installed)."""
    env = []
    for prefix, ax, bx in (
        ("", a.environment.fields, b.environment.fields),
        ("libraries.", a.environment.libraries, b.environment.libraries),
    ):
        for name in sorted(set(ax) | set(bx)):
            x, y = ax.get(name), bx.get(name)
            match = prefix or (x and x.match) == (y and y.match)  # a library has no match rule
            if (x and x.value) != (y and y.value) or not match:
                env.append({"field": prefix + name, "a": _as_dict(x), "b": _as_dict(y)})
    slots = []
    for name in SLOTS:
        sx, sy = a.slots.get(name), b.slots.get(name)
        for key in ("implementation", "target", "kwargs"):
            vx, vy = getattr(sx, key) if sx else None, getattr(sy, key) if sy else None
            if vx != vy:
                if key == "kwargs":
                    vx, vy = (None if v is None else dict(v) for v in (vx, vy))
                slots.append({"slot": name, "key": key, "a": vx, "b": vy})
    top = [
        {"key": key.replace("_", "-"), "a": getattr(a, key), "b": getattr(b, key)}
        for key in ("precision", "mode", "lock_version")
        if getattr(a, key) != getattr(b, key)
    ]
    # what each was probed for, as `--check` compares a lock with a run (one function: stale)
    probed = stale.differences(stale.Probed.of_lock(a), stale.Probed.of_lock(b))
    return {"lock": top, "environment": env, "slots": slots, "probe": [d.to_dict() for d in probed]}
