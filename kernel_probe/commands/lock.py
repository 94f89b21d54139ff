"""``kernel-probe lock --for inference IN OUT``: an inference lock derived from a training lock.

Run on the inference machine. Every slot whose training implementation cannot run here is replaced
by its verified portable twin (the same substitution ``factory(..., mode="inference")`` makes at run
time, decided once and written down); a slot with no usable twin stops the command and nothing is
written. The derived lock's environment is this machine's, so it verifies here, and its provenance
names the training lock and each substitution.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import kernel_lock
from kernel_probe import output
from kernel_probe.commands.lockfile import add_trust_argument, load_lock
from kernel_probe.errors import UsageError
from kernel_probe.output import safe
from kernel_probe.probe.derive import derive_inference


def add_lock_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe lock``."""
    p.add_argument(
        "--for",
        dest="purpose",
        required=True,
        choices=("inference",),
        help="what the new lock is for (inference: substitute verified torch.nn twins where the "
        "training libraries cannot run)",
    )
    p.add_argument("source", metavar="IN", help="the training lock")
    p.add_argument("out", metavar="OUT", help="where to write the inference lock (atomically)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    add_trust_argument(p)


def run_lock(args: argparse.Namespace) -> int:
    """``kernel-probe lock --for inference IN OUT``: derive an inference lock from a training
    one."""
    from kernel_lock import fingerprint

    out = Path(args.out)
    if out.is_dir():
        raise UsageError(
            f"{out} is a directory",
            fix=f"name the lock file, e.g. {out / 'kernel-lock.inference.toml'}",
        )
    if out.exists() and not args.force:
        raise UsageError(
            f"{out} exists; not replacing it",
            fix="pass --force to replace it, or choose another OUT",
        )
    lock = load_lock(args.source, trust=args.trust)
    if lock.mode != "training":
        source_of = lock.provenance.get("source", "an unrecorded lock")
        raise UsageError(
            f"{args.source} is already an inference lock (derived from {source_of})",
            fix="derive from the training lock itself",
        )
    current = fingerprint.current()
    derived, substitutions = derive_inference(lock, current, source=str(args.source))
    # what it promises holds here (no substitution left)
    derived.verify("inference", current=current)
    derived.dump(out)
    if args.json:
        output.print_json(
            {
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
                "kept": sorted(
                    name for name in derived.slots if name not in {s.slot for s in substitutions}
                ),
            }
        )
        return 0
    con = output.console()
    con.print(
        f"[green]wrote[/] {safe(str(out))}: inference lock derived from {safe(str(args.source))}"
    )
    for s in substitutions:
        con.print(f"  [yellow]{safe(str(s))}[/]: {safe(s.reason)}")
    for name in kernel_lock.SLOTS:
        if name in derived.slots and name not in {s.slot for s in substitutions}:
            con.print(f"  {name}: {safe(derived.slots[name].implementation)} (runs here, kept)")
    return 0
