"""An inference lock derived from a training lock, for the machine it will run on.

Every slot whose training implementation cannot run here is replaced by its verified portable twin:
the decision ``kernel_lock.resolve.resolve_slot`` takes in inference mode (the same one
``factory(..., mode="inference")`` takes at run time), made once and written down. A slot with no
usable twin stops the derivation. The derived lock's environment is this machine's, so it verifies
here, and its provenance names the training lock and each substitution.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kernel_lock.errors import KernelUnavailable
from kernel_lock.lock import KernelLock
from kernel_lock.schema import Slot
from kernel_lock.slots import SPECS
from kernel_probe import __version__


@dataclass(frozen=True)
class Substitution:
    """A slot whose training implementation cannot run here, replaced by its portable twin, and
    why."""

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
    """The sealed inference lock for the machine ``current`` describes, and the substitutions made.

    Raises :class:`KernelUnavailable` naming every slot that cannot run here and has no usable twin.
    """
    from kernel_lock.fingerprint import library_versions
    from kernel_lock.resolve import resolve_slot
    from kernel_probe.probe.write import environment

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
        slots[name] = replace(
            slot,
            implementation=r.implementation,
            target=r.target,
            kwargs=dict(r.kwargs),
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
    derived = KernelLock(
        created_by=f"kernel-probe {__version__}",
        created_at=dt.datetime.now(dt.timezone.utc)
        .replace(microsecond=0)
        .isoformat()
        .replace("+00:00", "Z"),
        environment=environment(current, libraries),
        slots=slots,
        mode="inference",
        precision=lock.precision,
        trusted_modules=lock.trusted_modules,
        provenance=provenance,
        # anemoi's GraphTransformer backend: a note where it falls back
        graph_attention=lock.graph_attention,
    )
    return derived.sealed(), substitutions
