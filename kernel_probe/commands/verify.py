"""``kernel-probe verify [LOCK]``: check this machine against a lock and resolve every slot (the
check each rank can run at job start; ``--no-import`` keeps it torch-free)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import kernel_lock
from kernel_lock.errors import LockError
from kernel_lock.format.slots import MODES
from kernel_probe import output
from kernel_probe.commands.lockfile import (
    add_lock_argument,
    add_trust_argument,
    default_lock_path,
    load_lock,
)


def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe verify``."""
    add_lock_argument(p)
    p.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="training: this machine must match the lock; inference: substitute verified twins "
        "where needed (default: the lock's own mode, `mode` in the file)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="a hand-edited lock (digest mismatch), or one without an environment, is an error",
    )
    p.add_argument(
        "--no-import",
        action="store_true",
        help="check the machine and each slot's requirements from files and package metadata only, "
        "importing no kernel library and not torch (the check for every rank at job start); by "
        "default each slot's class is also imported",
    )
    add_trust_argument(p)


def run_verify(args: argparse.Namespace) -> int:
    """``kernel-probe verify [LOCK]``: does this machine match the lock, and does each slot resolve
    here."""
    from kernel_lock.resolve import factory, resolve_slot

    path = args.lock or default_lock_path()
    lock = load_lock(path, strict=args.strict, trust=args.trust)
    args.mode = args.mode or lock.mode
    result: dict[str, Any] = {
        "lock": path,
        "mode": args.mode,
        "ok": True,
        "differences": [],
        "notes": [],
        "warnings": list(lock.warnings),
        "slots": {},
        "imported": not args.no_import,
    }
    try:
        # the machine is read without torch where every checked fact can be
        # (kernel_lock.torchless) with --no-import, each slot's class and kwargs are
        # judged from the tables of known classes; one they cannot judge is an error (not
        # confirmed), never current (kernel_lock.resolve.confirm_targets)
        result["notes"] = lock.verify(args.mode, targets="static" if args.no_import else None)
    except LockError as exc:
        if not args.json:
            raise
        result["ok"] = False
        result["differences"] = [
            {"field": d.field, "expected": d.expected, "found": d.found, "rule": d.rule}
            for d in getattr(exc, "differences", ())
        ]
        output.print_json(output.with_failure(result, exc))
        output.error(str(exc))
        return exc.exit_code
    failures: list[LockError] = []
    for slot in kernel_lock.SLOTS:
        try:
            if args.no_import:  # the decision only: requirements from metadata, nothing imported
                r = resolve_slot(lock, slot, args.mode, import_classes=False)
                found = (
                    r.implementation,
                    r.target,
                    dict(r.kwargs),
                    r.substituted_from,
                    r.max_error,
                )
            else:
                f = factory(lock, slot, mode=args.mode, verify_environment=False)
                found = (
                    f.implementation,
                    f.target,
                    dict(f.keywords),
                    f.substituted_from,
                    f.max_error,
                )
        except LockError as exc:  # e.g. installed but broken on import, with no usable twin
            if not args.json:
                raise
            result["ok"] = False
            result["slots"][slot] = {
                "error": exc.problem,
                "fix": exc.fix,
                "exit_code": exc.exit_code,
            }
            failures.append(exc)
            continue
        result["slots"][slot] = dict(
            zip(
                ("implementation", "target", "kwargs", "substituted_from", "max_error"),
                found,
                strict=True,
            )
        )
    if args.json:
        worst = max(failures, key=lambda e: e.exit_code, default=None)
        output.print_json(output.with_failure(result, worst))
        if worst is not None:
            output.error(str(worst))
        return worst.exit_code if worst else 0
    # plain lines (no rich): this is every rank's job-start output, and its cost is counted
    verdict = "matches this machine" if args.mode == "training" else "can run on this machine"
    imported = "" if not args.no_import else ", classes not imported"
    lines = [
        f"ok: {path} {verdict} ({args.mode} mode{imported})",
        *(f"  note: {note}" for note in result["notes"]),
    ]
    for slot, s in result["slots"].items():
        extra = ""
        if s["substituted_from"]:
            error = "not recorded" if s["max_error"] is None else f"{s['max_error']:.3g}"
            extra = f" (substituted for {s['substituted_from']}, verified max error {error})"
        lines.append(f"  {slot:<10} -> {s['target']} {s['kwargs']}{extra}")
    sys.stdout.write(output.plain("\n".join(lines)) + "\n")
    return 0
