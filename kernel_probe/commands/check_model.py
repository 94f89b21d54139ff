"""``kernel-probe check-model SPEC --lock L [--steps N] [--json]``: the model as written against the
model with the lock applied (the work is kernel_probe.model.check's; here arguments, rendering)."""

from __future__ import annotations

import argparse
from typing import Any

from kernel_lock.errors import ExitCode
from kernel_probe import output
from kernel_probe.commands.model import _SPEC
from kernel_probe.model import DEFAULT_TIMEOUT
from kernel_probe.model.check import DEFAULT_STEPS, Check, check
from kernel_probe.output import safe, seconds


def add_check_model_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe check-model``."""
    p.add_argument("spec", metavar="SPEC", help=_SPEC)
    p.add_argument("--lock", required=True, metavar="PATH", help="the lock to apply")
    steps = f"SGD steps compared after the first forward and backward (default {DEFAULT_STEPS})"
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N", help=steps)
    limit = f"seconds the child may take in all (default {DEFAULT_TIMEOUT:g})"
    p.add_argument(
        "--timeout", type=seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS", help=limit
    )
    where = (
        "the device the check runs on: cpu or cuda (default: the one the lock was probed on, "
        "the CPU for a CPU lock; exit 3 where it is not here)"
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="", help=where)
    output.add_trust_argument(p)


def _g(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"


def timing_line(result: Check) -> str:
    """``1.12x per step (0.93 -> 0.83 s, 95% interval 1.05-1.20x over 10 rounds)``."""
    t = result.timing
    if not t:
        return f"not timed: {result.why or 'the model with the lock raised in its step'}"
    low, high = t["interval"]
    return (
        f"{t['ratio']:.2f}x per step ({t['written']:.3g} -> {t['applied']:.3g} s, 95% interval "
        f"{low:.2f}-{high:.2f}x over {t['rounds']} rounds)"
    )


def render(result: Check) -> None:
    """The verdict, the first diverging site and phase, the step time."""
    say = output.console().print
    where = ", ".join(result.sites) or "none"
    say(safe(f"model {result.spec} with {result.lock} (applied sites: {where})"))
    say(safe(f"on {result.device} ({result.device_why})"))
    first = result.first
    if result.verdict == "not-run":
        say(safe(f"not checked: {result.why}"))
    elif first is None:
        agree = f"losses agree to {result.losses_agree_to:.1g} over {result.steps} steps"
        say(f"agree in every phase ({len(result.phases)}); {agree}")
    else:
        gap = f"by {_g(first['difference'])} (tolerance {_g(first['tolerance'])})"
        say(safe(f"DIVERGING {first['phase']}: {first['what']} differs {gap}"))
    say(safe(f"step time: {timing_line(result)}"))
    for note in result.notes:
        say(safe(f"note: {note}"))


def run_check_model(args: argparse.Namespace) -> int:
    """``kernel-probe check-model``: 0 agree (or not run, said why), 3 diverging."""
    result = check(
        args.spec, args.lock, steps=args.steps, trust=args.trust, timeout=args.timeout,
        device=args.device,
    )  # fmt: skip
    if args.json:
        output.print_json(output.with_failure(result.to_dict(), None))
    else:
        render(result)
    return ExitCode.MISMATCH if result.verdict == "diverging" else ExitCode.OK
