"""``kernel-probe diff A B``: what changed between two locks (lock keys, environment fields,
choices); ``--exit-code`` makes a difference exit 6 (ExitCode.LOCKS_DIFFER)."""

from __future__ import annotations

import argparse

from kernel_lock.errors import ExitCode
from kernel_probe import output
from kernel_probe.commands.lockfile import load_lock
from kernel_probe.output import safe


def add_diff_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe diff``."""
    p.add_argument("a", help="old lock")
    p.add_argument("b", help="new lock")
    p.add_argument(
        "--exit-code",
        action="store_true",
        help=f"exit {ExitCode.LOCKS_DIFFER.value} when the locks differ, 0 when they do not "
        "(git diff --exit-code uses 1, which kernel-probe keeps for failures)",
    )


def run_diff(args: argparse.Namespace) -> int:
    """``kernel-probe diff A B``: what differs between two locks (environment, slots), as text or
    JSON."""
    a, b = load_lock(args.a, check_targets=False), load_lock(args.b, check_targets=False)
    from kernel_probe.probe.derive import lock_differences

    diffs = lock_differences(a, b)
    differ = any(diffs.values())
    code = ExitCode.LOCKS_DIFFER if (differ and args.exit_code) else 0
    if args.json:
        from kernel_probe.errors import ProbeError

        failed = ProbeError(f"{args.a} and {args.b} differ (see the differences)") if code else None
        output.print_json(output.with_failure(dict(diffs), failed, code))
        if failed is not None:
            output.error(f"{failed.problem} (exit {code}, --exit-code)")
    else:
        con = output.console()
        if not differ:
            con.print("no differences in environment or choices")
        for d in diffs["lock"]:
            con.print(f"{d['key']}: {safe(repr(d['a']))} -> {safe(repr(d['b']))}")
        for d in diffs["environment"]:
            fa = d["a"]["value"] if d["a"] else "absent"
            fb = d["b"]["value"] if d["b"] else "absent"
            con.print(f"environment {safe(d['field'])}: {safe(repr(fa))} -> {safe(repr(fb))}")
        for d in diffs["slots"]:
            con.print(f"slot {d['slot']} {d['key']}: {safe(repr(d['a']))} -> {safe(repr(d['b']))}")
    return code
