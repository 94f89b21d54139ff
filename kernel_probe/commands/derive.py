"""``kernel-probe lock --for inference IN OUT``: an inference lock derived from a training lock.

Run on the inference machine. Every slot whose training implementation cannot run here is replaced by
its verified portable twin (the same substitution ``factory(..., mode="inference")`` makes at run
time, decided once and written down); a slot with no usable twin stops the command and nothing is
written. The derived lock's environment is this machine's, so it verifies here, and its provenance
names the training lock and each substitution.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import kernel_lock
from kernel_lock.errors import KernelUnavailable
from kernel_lock.lock import KernelLock, Slot

from .. import __version__, output
from ..output import safe
from ..errors import ProbeError, UsageError
from .lockcmds import add_trust_argument


@dataclass(frozen=True)
class Substitution:
    slot: str
    training: str  # the training implementation id
    training_target: str
    twin_target: str
    reason: str  # why the training implementation cannot run here
    max_error: float | None

    def __str__(self) -> str:
        error = "not recorded" if self.max_error is None else f"{self.max_error:.3g}"
        return f"{self.slot}: {self.training} -> {self.twin_target} (max error {error})"


def _cannot_run_here(lock: KernelLock, slot: Slot, current: Mapping[str, Any]) -> str | None:
    """Why the slot's pinned implementation cannot run here; None if it can (it is imported to be sure)."""
    from kernel_lock.resolve import _build, _unusable_reason

    reason = _unusable_reason(slot, current)
    if reason is not None:
        return reason
    try:  # installed is not enough: a library may fail on import here (no driver), as the resolver would find
        _build(slot.name, slot.target, slot.kwargs, lock, f"slots.{slot.name}")
    except KernelUnavailable as exc:
        return exc.problem
    return None


def derive_inference(lock: KernelLock, current: Mapping[str, Any], *, source: str) -> tuple[KernelLock, list[Substitution]]:
    """The sealed inference lock for the machine ``current`` describes, and the substitutions made.

    Raises :class:`KernelUnavailable` naming every slot that cannot run here and has no usable twin.
    """
    from kernel_lock.fingerprint import library_versions
    from kernel_lock.resolve import twin_refusal

    from ..lockwrite import environment

    slots: dict[str, Slot] = {}
    substitutions: list[Substitution] = []
    refused: list[str] = []
    for name, slot in lock.slots.items():
        reason = _cannot_run_here(lock, slot, current)
        if reason is None:
            slots[name] = slot
            continue
        refusal = twin_refusal(slot)
        if refusal is not None:
            refused.append(f"{name}: {slot.implementation} cannot run here ({reason}), and {refusal}")
            continue
        twin = slot.twin
        assert twin is not None
        sub = Substitution(name, slot.implementation, slot.target, twin.target, reason, twin.max_error)
        substitutions.append(sub)
        # the twin record stays: it says how a state dict saved by the training implementation
        # migrates into this one (kernel_lock.checkpoint.migrate_state_dict reads it)
        slots[name] = replace(
            slot,
            implementation=f"twin:{slot.implementation}",
            target=twin.target,
            kwargs=dict(twin.kwargs),
            requires=(),
            devices=(),
            reason=f"inference twin of {slot.implementation} ({slot.target}), which cannot run here: {reason}; "
            f"chosen for training because: {slot.reason or 'no reason recorded'}",
        )
    if refused:
        raise KernelUnavailable(
            f"cannot derive an inference lock from {source}: {len(refused)} slot(s) have no usable twin:\n"
            + "\n".join(f"  - {r}" for r in refused),
            fix="run inference where the training library is installed, or re-train / re-probe with an "
            "implementation that has a verified torch.nn twin (nothing was written)",
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
    derived = KernelLock(
        created_by=f"kernel-probe {__version__}",
        created_at=dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        environment=environment(current, libraries),
        slots=slots,
        mode="inference",
        precision=lock.precision,
        trusted_modules=lock.trusted_modules,
        provenance=provenance,
    )
    return derived.sealed(), substitutions


def add_lock_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--for", dest="purpose", required=True, choices=("inference",),
                   help="what the new lock is for (inference: substitute verified torch.nn twins where the "
                   "training libraries cannot run)")  # fmt: skip
    p.add_argument("source", metavar="IN", help="the training lock")
    p.add_argument("out", metavar="OUT", help="where to write the inference lock (atomically)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--json", action="store_true", help="machine-readable summary on stdout")
    add_trust_argument(p)


def run_lock(args: argparse.Namespace) -> int:
    from kernel_lock import fingerprint

    from .lockcmds import _load

    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"{out} is a directory", fix=f"name the lock file, e.g. {out / 'kernel-lock.inference.toml'}")
    if out.exists() and not args.force:
        raise ProbeError(f"{out} exists; not replacing it", fix="pass --force to replace it, or choose another OUT")
    lock = _load(args.source, trust=args.trust)
    if lock.mode != "training":
        source_of = lock.provenance.get("source", "an unrecorded lock")
        raise UsageError(f"{args.source} is already an inference lock (derived from {source_of})",
                         fix="derive from the training lock itself")  # fmt: skip
    current = fingerprint.current()
    derived, substitutions = derive_inference(lock, current, source=str(args.source))
    derived.verify("inference", current=current)  # what it promises holds here (no substitution left)
    derived.dump(out)
    if args.json:
        output.print_json({
            "source": str(args.source),
            "source-digest": derived.provenance["source-digest"],
            "out": str(out),
            "digest": derived.digest,
            "substitutions": [
                {
                    "slot": s.slot,
                    "from": s.training,
                    "from-target": s.training_target,
                    "to": s.twin_target,
                    "reason": s.reason,
                    "max-error": s.max_error,
                }
                for s in substitutions
            ],
            "kept": sorted(name for name in derived.slots if name not in {s.slot for s in substitutions}),
        })
        return 0
    con = output.console()
    con.print(f"[green]wrote[/] {safe(str(out))}: inference lock derived from {safe(str(args.source))}")
    for s in substitutions:
        con.print(f"  [yellow]{safe(str(s))}[/]: {safe(s.reason)}")
    for name in kernel_lock.SLOTS:
        if name in derived.slots and name not in {s.slot for s in substitutions}:
            con.print(f"  {name}: {safe(derived.slots[name].implementation)} (runs here, kept)")
    return 0
