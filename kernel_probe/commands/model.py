"""``kernel-probe model SPEC`` (the call-site table of a model's trace) and ``check-model SPEC
--lock L`` (the model as written against the model with the lock applied): the work is
kernel_probe.model's; here the arguments and the rendering."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from kernel_lock.errors import ExitCode
from kernel_lock.model import Model
from kernel_lock.slots import PRECISIONS
from kernel_probe import output
from kernel_probe.model import DEFAULT_TIMEOUT, trace_with_notes
from kernel_probe.model.check import DEFAULT_STEPS, NOT_TIMED, Check, check
from kernel_probe.output import print_rows, safe, seconds

_SPEC = (
    "the model: path/to/file.py:callable or package.module:callable (a callable with no "
    "required arguments returning (model, args) or (model, args, kwargs): one forward's inputs "
    "at the model's real sizes), or anemoi:CONFIG (an anemoi training config: a YAML path or "
    "the name of a config anemoi-training ships)"
)
_TIMEOUT: dict[str, Any] = dict(type=seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe model``."""
    p.add_argument("spec", metavar="SPEC", help=_SPEC)
    regimes = (
        "the training precision the sites are traced under (default 32-true): -true casts the "
        "model and its floating inputs, -mixed runs under autocast"
    )
    p.add_argument("--precision", default="32-true", choices=tuple(PRECISIONS), help=regimes)
    limit = (
        f"seconds the child importing, building and running the model may take (default "
        f"{DEFAULT_TIMEOUT:g})"
    )
    p.add_argument("--timeout", help=limit, **_TIMEOUT)
    output.add_trust_argument(p)


def _value(value: Any) -> str:
    if isinstance(value, list):
        return "x".join(str(v) for v in value) if all(type(v) is int for v in value) else str(value)
    if isinstance(value, bool):
        return str(value).lower()
    quote = isinstance(value, str) and (not value or any(c.isspace() or c == "=" for c in value))
    return json.dumps(value) if quote else str(value)


def semantics_text(semantics: Mapping[str, Any]) -> str:
    """``eps=1e-05 bias=false normalized_shape=256``: a site's semantics on one line."""
    return " ".join(f"{k}={_value(v)}" for k, v in semantics.items())


def render(model: Model) -> None:
    """The call-site table, then the sites out of reach."""
    rows = [
        (
            safe(s.where or "<model>"),
            safe(s.slot),
            safe(s.call),
            str(s.calls),
            safe(" ".join(s.shapes)),
            safe(s.dtype),
            safe(semantics_text(s.semantics)),
        )
        for s in model.sites
    ]
    title = f"model {model.spec} (traced: {model.traced}; {model.digest[:19]}...)"
    columns = ("site", "slot", "call", "calls", "shapes", "dtype", "semantics")
    print_rows(safe(title), columns, rows, right=("calls",), whole=True)  # one line a site
    if not model.sites:
        output.console().print("no call site of any slot found")
    if model.unreached:
        gone = [(safe(u.where or "<model>"), safe(u.call), safe(u.reason)) for u in model.unreached]
        print_rows(
            "out of reach (left as written)", ("site", "call", "reason"), gone, wrap=("reason",)
        )


def run_model(args: argparse.Namespace) -> int:
    """``kernel-probe model SPEC``: trace the model, print its call sites."""
    traced = trace_with_notes(
        args.spec, precision=args.precision, trust=args.trust, timeout=args.timeout
    )
    for note in traced.notes:
        output.info(f"note: {note}")
    if args.json:
        body = {"notes": list(traced.notes), **traced.model.to_dict()}
        output.print_json(output.with_failure(body, None))
    else:
        render(traced.model)
    return 0


# ---- check-model ---------------------------------------------------------------------------------
def add_check_model_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe check-model``."""
    p.add_argument("spec", metavar="SPEC", help=_SPEC)
    p.add_argument("--lock", required=True, metavar="PATH", help="the lock to apply")
    steps = f"SGD steps compared after the first forward and backward (default {DEFAULT_STEPS})"
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N", help=steps)
    limit = f"seconds the child may take in all (default {DEFAULT_TIMEOUT:g})"
    p.add_argument("--timeout", help=limit, **_TIMEOUT)
    where = (
        "the device the check runs on: cpu or cuda (default: the one the lock was probed on, "
        "the CPU for a CPU lock; exit 3 where it is not here)"
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="", help=where)
    untimed = "the verdict only: skip the paired timing of the training step (up to 20 s)"
    p.add_argument("--no-timing", action="store_true", help=untimed)
    output.add_trust_argument(p)


def _g(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"


def timing_line(result: Check) -> str:
    """``1.12x per step (0.93 -> 0.83 s, 95% interval 1.05-1.20x over 10 rounds)``."""
    t = result.timing
    if not t:
        asked = NOT_TIMED in result.notes  # --no-timing: said once, in its note
        return (
            "not timed: --no-timing"
            if asked
            else (f"not timed: {result.why or 'the model with the lock raised in its step'}")
        )
    low, high = t["interval"]
    return (
        f"{t['ratio']:.2f}x per step ({t['written']:.3g} -> {t['applied']:.3g} s, 95% interval "
        f"{low:.2f}-{high:.2f}x over {t['rounds']} rounds)"
    )


def render_check(result: Check) -> None:
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
        device=args.device, timing=not args.no_timing,
    )  # fmt: skip
    if args.json:
        output.print_json(output.with_failure(result.to_dict(), None))
    else:
        render_check(result)
    return ExitCode.MISMATCH if result.verdict == "diverging" else ExitCode.OK
