"""The Activation slot in the probe: the model's function (``--activation``), checked against and
recorded; the verdict: every row by the one rule, then the function the candidate computes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kernel_lock.model import Site
from kernel_lock.slots import activation
from kernel_lock.slots.activation import (
    ACTIVATION_FUNCTIONS,
    OTHER_FUNCTION,
    approximation_change,
    declared_function,
    function_of,
    is_approximation,
)
from kernel_probe.errors import UsageError
from kernel_probe.isolation.protocol import FLAG_NOT_ELEMENTWISE, CheckReply, MeasurementRow

from .base import Option, Slot

if TYPE_CHECKING:
    from kernel_probe.candidates import Candidate
    from kernel_probe.probe.judge import Policy, Problem
    from kernel_probe.probe.report import Report, ReportBase, Verdict

__all__ = ["ACTIVATION"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_FORMULAS = {
    "gelu-erf": lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))),
    "gelu-tanh": lambda x: 0.5 * x * (1.0 + math.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1.0 + math.exp(-x)),
    "relu": lambda x: max(x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)),
}
assert tuple(_FORMULAS) == ACTIVATION_FUNCTIONS


def gap(a: str, b: str) -> tuple[float, float] | None:
    """(the largest |a(x) - b(x)| over x in [-8, 8] on a grid of 1e-3, in float64, and where) for
    two known functions; None when either is a declared other."""
    fa, fb = _FORMULAS.get(a), _FORMULAS.get(b)
    if fa is None or fb is None:
        return None
    return max((abs(fa(i / 1000) - fb(i / 1000)), abs(i / 1000)) for i in range(-8000, 8001))


def _gap(declared: str, computes: str) -> str:
    measured = gap(declared, computes)
    if measured is None:
        return ""
    return (
        f": the two differ by up to {measured[0]:.2g} (near |x| = {measured[1]:.3g}, measured in "
        "float64)"
    )


def _difference(declared: str, computes: str) -> str:
    return f"computes {computes}, not the model's {declared}{_gap(declared, computes)}"


def static_problem(cand: Candidate, declared: str) -> Problem | None:
    """A registered candidate whose class computes another function than the model declares (not an
    approximation of it): skipped before anything is imported. None when it is worth checking."""
    from kernel_probe.probe.report import Problem  # the judge imports the candidates' parser

    known = function_of(cand.target, cand.kwargs)
    if known is None or known == declared or is_approximation(known, declared):
        return None
    return Problem(
        "skipped",
        f"{cand.target} computes {known}; the model's Activation is {declared} (--activation "
        "names the model's function)",
    )


def judge(
    raw: CheckReply, cand: Candidate, device: str, base: ReportBase, declared: str, policy: Policy
) -> Report:
    """The Activation verdict from the worker's measurements."""
    from kernel_probe.probe import judge as rules  # reason: ~70 ms the light commands skip

    if (early := rules._early_stop(raw, cand)) is not None:  # its import or its build raised
        return rules.stopped(early, base)
    computes = raw.computes
    other = bool(computes) and computes != declared
    approximation = other and is_approximation(declared, computes)
    allowed = approximation and policy.allow_approximation
    # the lock's reader knows it by its beginning (``approximation_change``)
    change = (
        f"{approximation_change(declared, computes)}{_gap(declared, computes)} (accepted with "
        "--allow-approximation)"
    )
    notes = [change] if allowed else ()

    def verdict(row: MeasurementRow) -> Verdict:
        if allowed and "approx_cases" in row:  # its errors against the function it computes
            cases, stats = row["approx_cases"], row.get("approx_stats", {})
            row = dict(row, cases=cases, stats=stats)  # type: ignore[assignment]
        shape = row.get("flags", {}).get(FLAG_NOT_ELEMENTWISE)  # an output of another shape
        also = [(FLAG_NOT_ELEMENTWISE, shape)] if shape else ()  # is no activation
        return rules.judge_row(cand.id, device, "activation", row, policy, also=also, notes=notes)

    verdicts = [verdict(row) for row in raw.rows]
    report = rules.report_of(verdicts, base)
    if allowed:
        report.changes.append(change)
    elif other:
        hint = "; pass --allow-approximation to accept it and record it" if approximation else ""
        report.reasons.insert(0, f"function: {_difference(declared, computes)}{hint}")
        if report.status in ("accepted", "skipped"):
            report.status = "rejected"
        # a row right for the function it computes is wrong for the model's
        report.verdicts = [
            dataclasses.replace(v, status="rejected", failed=(*v.failed, "function"))
            if v.status == "accepted"
            else v
            for v in verdicts
        ]
    elif not computes and report.status == "rejected" and not declared.startswith(OTHER_FUNCTION):
        known = ", ".join(ACTIVATION_FUNCTIONS)
        report.reasons.insert(0, f"function: its float32 forward matches none of {known}")
    return report


class Activation(Slot):
    """An elementwise function of one tensor, no parameters."""

    kernels = "kernel_probe.slots.activation_kernels"
    option_key = "function"  # the reference every candidate is checked against, in the lock
    option = Option(
        "--activation",
        "the model's activation function, the Activation slot's reference: gelu-erf "
        "(torch.nn.GELU, the default), gelu-tanh, silu, relu, sigmoid, or other:module.Class for "
        "another (e.g. other:anemoi.models.layers.activations.Sine; its class is the reference); "
        "the lock records it",
        metavar="FUNCTION",
    )

    def refuse(self, declared: str) -> None:
        """A function the slot does not know."""
        problem = activation.function_problem(declared)
        if problem:
            raise UsageError(
                f"--activation {problem}",
                fix="name the model's activation function, e.g. --activation gelu-erf",
            )

    def static_problem(self, cand: Candidate, canonical: Mapping[str, Any]) -> Problem | None:
        """A registered class known to compute another function."""
        return static_problem(cand, declared_function(canonical))

    def judge(self, raw, cand, device, base, canonical, policy) -> Report:
        """The rows by the one rule, then the function it computes."""
        return judge(raw, cand, device, base, declared_function(canonical), policy)

    def traced(self, site: Site) -> tuple[dict[str, Any], str]:
        """The site's function, where the slot knows it."""
        values, why = super().traced(site)
        problem = activation.function_problem(str(values.get("function", "")))
        return values, why or (f"function: {problem}" if problem else "")


ACTIVATION = Activation(activation.ACTIVATION)
