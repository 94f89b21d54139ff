"""Where an Activation verdict is decided: the rows by the project's one rule, then the function.

Every row (dtype, regime) is judged by ``judge.judge_row``: the max error, the RMS error and the
bias of ``y`` and ``dx`` against the float64 reference of the model's declared function, relative to
torch.nn's own implementation of that function in the same dtype (docs/checks.md), and the flags (an
input or a grad_output modified in place rejects).

Then the function. The worker measures which function the candidate's float32 output matches
(``CheckReply.computes``). One that computes another function than the model declares is rejected
with a reason naming both and their largest difference, measured in float64 (for GELU's erf and tanh
forms 4.7e-4, near |x| = 2.7). An approximation of the declared function
(``activations.APPROXIMATIONS``: gelu-tanh for gelu-erf, or the reverse) is accepted only under
``Policy.allow_approximation`` (``--allow-approximation``): its rows are then judged against the
function it computes, and the change is recorded (the lock's ``accepted-changes``).

Before anything is imported, a registered candidate whose class is known to compute another function
(``activations.function_of``: torch.nn.SiLU for a gelu-erf model) is skipped with that reason
(``static_problem``): it cannot be the model's activation, and checking it costs time.
"""

from __future__ import annotations

import dataclasses
import math

from kernel_lock.slots.activation import (
    ACTIVATION_FUNCTIONS,
    OTHER_FUNCTION,
    function_of,
    is_approximation,
)
from kernel_probe.candidates import Candidate
from kernel_probe.isolation.protocol import FLAG_NOT_ELEMENTWISE, CheckReply, MeasurementRow
from kernel_probe.probe.judge import Policy, Problem
from kernel_probe.probe.report import Report, ReportBase

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


def _difference(declared: str, computes: str) -> str:
    measured = gap(declared, computes)
    if measured is None:
        return f"computes {computes}, not the model's {declared}"
    return (
        f"computes {computes}, not the model's {declared}: the two differ by up to "
        f"{measured[0]:.2g} (near |x| = {measured[1]:.3g}, measured in float64)"
    )


def static_problem(cand: Candidate, declared: str) -> Problem | None:
    """A registered candidate whose class computes another function than the model declares (not an
    approximation of it): skipped before anything is imported. None when it is worth checking."""
    known = function_of(cand.target, cand.kwargs)
    if known is None or known == declared or is_approximation(known, declared):
        return None
    return Problem(
        "skipped",
        f"{cand.target} computes {known}; the model's Activation is {declared} (--activation "
        "names the model's function)",
    )


def _as_computed(row: MeasurementRow) -> MeasurementRow:
    """The row with its errors against the function the candidate computes in place of the declared
    one."""
    out = dict(row)
    if "approx_cases" in row:
        out["cases"], out["stats"] = row["approx_cases"], row.get("approx_stats", {})
    return MeasurementRow(**out)  # type: ignore[typeddict-item]


def judge(
    raw: CheckReply, cand: Candidate, device: str, base: ReportBase, declared: str, policy: Policy
) -> Report:
    """The Activation verdict from the worker's measurements."""
    from kernel_probe.probe import judge as rules

    if raw.phase == "import":
        return rules.stopped(rules.failed_import(cand.target, raw.kind, raw.error), base)
    if raw.phase == "build":
        return rules.stopped(Problem("crashed", f"building {cand.target} raised {raw.error}"), base)
    computes = raw.computes
    other = bool(computes) and computes != declared
    approximation = other and is_approximation(declared, computes)
    allowed = approximation and policy.allow_approximation
    change = (
        f"approximation: {_difference(declared, computes)} (accepted with --allow-approximation)"
    )
    rows = [_as_computed(r) for r in raw.rows] if allowed else list(raw.rows)
    verdicts = [
        rules.judge_row(
            cand.id,
            device,
            "activation",
            row,
            policy,
            # the slot's own flag: an output of another shape is no activation
            also=[(FLAG_NOT_ELEMENTWISE, shape)]
            if (shape := row.get("flags", {}).get(FLAG_NOT_ELEMENTWISE))
            else (),
            notes=[change] if allowed else (),
        )
        for row in rows
    ]
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
        report.reasons.insert(
            0, f"function: its float32 forward matches none of {', '.join(ACTIVATION_FUNCTIONS)}"
        )
    return report
