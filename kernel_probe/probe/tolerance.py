"""How far from float64 a result may be (docs/checks.md): against torch.nn's own normwise error on
the same input, ``tolerance = FACTOR * error(torch.nn) + FLOOR(dtype)``; RMS and mean signed error
likewise (``limits``); and the check at the timed shapes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kernel_lock.slots import DTYPES
from kernel_probe.isolation.protocol import ErrorStats, ShapeCheck

FACTOR = 4.0
K_SIGMA = 6.0  # standard errors: P(|Z| > 6) = 2.0e-9 per group (docs/checks.md)
STATISTICS = {"max": "error", "rms": "RMS error", "bias": "bias (mean signed error)"}


def floor(dtype: str) -> float:
    """FLOOR(dtype): two units of the dtype's machine epsilon (float32's for a dtype not probed).

    >>> floor("bfloat16"), floor("float16")  # 2 x 2**-7, 2 x 2**-10
    (0.015625, 0.001953125)
    >>> floor("int8") == floor("float32") == 2 * 2**-23
    True
    """
    return 2.0 * DTYPES.get(dtype, DTYPES["float32"]).eps


def tolerance(base: float, dtype: str) -> float:
    """The tolerance model: FACTOR x torch.nn's error + FLOOR(dtype).

    >>> tolerance(0.25, "bfloat16")  # torch.nn's bf16 error 0.25: up to 4 x that, plus two eps
    1.015625
    >>> tolerance(0.0, "float32") == floor("float32")  # torch.nn exact: the floor alone, never 0
    True
    """
    return FACTOR * base + floor(dtype)


def ratio(got: float, base: float, dtype: str) -> tuple[float, float]:
    """(got / tolerance, tolerance) under the tolerance model; <= 1 passes.

    >>> ratio(1.015625, 0.25, "bfloat16")  # exactly at the tolerance: passes
    (1.0, 1.015625)
    >>> ratio(2.03125, 0.25, "bfloat16")[0]  # twice the tolerance: fails
    2.0
    """
    tol = tolerance(base, dtype)
    return (got / tol if tol > 0 else float("inf")), tol


@dataclass(frozen=True)
class Limits:
    """The tolerances of one compared output, per statistic (normwise, like the errors)."""

    max: float
    rms: float = math.inf
    bias: float = math.inf


def rms_floor(dtype: str, ref_rms: float, terms: int = 0) -> float:
    """The RMS of a uniform error of two eps relative to each element (one rounding to ``dtype``),
    and of ``terms`` more such float32 roundings, independent (a reduction's accumulator: a sum of
    ``terms`` products in float32 is off by ~sqrt(terms) roundings).

    >>> rms_floor("float32", 1.0, 3) == 2 * rms_floor("float32", 1.0)  # sqrt(1 + 3)
    True
    >>> rms_floor("bfloat16", 1.0, 128) / rms_floor("bfloat16", 1.0) < 1.0001  # its own rounding
    True
    """
    eps, eps32 = floor(dtype) / 2.0, floor("float32") / 2.0
    return 2.0 * math.sqrt(eps**2 + terms * eps32**2) * ref_rms / math.sqrt(3.0)


def limits(dtype: str, base_max: float, stats: ErrorStats | None = None) -> Limits:
    """One output's tolerances from torch.nn's statistics: the model for the max; FACTOR x its RMS
    plus ``rms_floor`` (with the slot's ``terms``, none by default); FACTOR x its bias plus K_SIGMA
    standard errors of a mean over ``n`` elements. Without ``stats`` only the max is judged.

    >>> limits("bfloat16", 0.25)
    Limits(max=1.015625, rms=inf, bias=inf)
    """
    tol_max = tolerance(base_max, dtype)
    if stats is None:
        return Limits(tol_max)
    eps = floor(dtype) / 2.0
    rms = FACTOR * stats["rms"][1] + rms_floor(dtype, stats["ref_rms"], stats.get("terms", 0))
    # the standard error of a group's mean: the larger noise of the two, and at least one rounding's
    noise = math.sqrt(
        stats["sd"][0] ** 2 + stats["sd"][1] ** 2 + (eps * stats["ref_rms"]) ** 2 / 12.0
    )
    if "bias" not in stats:  # not judged (a view's case, inuse.py)
        return Limits(tol_max, rms)
    bias = FACTOR * stats["bias"][1] + K_SIGMA * noise / math.sqrt(max(int(stats["n"]), 1))
    return Limits(tol_max, rms, bias)


@dataclass(frozen=True)
class Excess:
    """One statistic of one output over its tolerance."""

    tensor: str
    statistic: str  # a STATISTICS key
    got: float
    tol: float
    base: float  # the baseline's same statistic
    baseline: str = "torch.nn's"

    def __str__(self) -> str:
        return (
            f"{self.tensor} {STATISTICS[self.statistic]} {self.got:.3g} > tolerance "
            f"{self.tol:.3g} ({self.baseline} {self.base:.3g})"
        )


def judge_output(
    tensor: str,
    errors: Sequence[float],
    stats: ErrorStats | None,
    dtype: str,
    ratios: dict[str, float] | None = None,
    max_tolerance: float | None = None,
    baseline: str = "torch.nn's",
) -> tuple[float, list[Excess]]:
    """One output: (worst statistic / tolerance, <= 1 passes; those over)."""
    lim = limits(dtype, errors[1], stats)
    if max_tolerance is not None:
        lim = dataclasses.replace(lim, max=max_tolerance)
    judged = [("max", errors[0], errors[1], lim.max)]
    if stats is not None:
        judged += [("rms", stats["rms"][0], stats["rms"][1], lim.rms)]
        if "bias" in stats:
            judged += [("bias", stats["bias"][0], stats["bias"][1], lim.bias)]
    worst, over = 0.0, []
    for statistic, got, base, tol in judged:
        r = got / tol if tol > 0 and math.isfinite(got) else math.inf
        worst = max(worst, r)
        if ratios is not None:
            ratios[statistic] = max(ratios.get(statistic, 0.0), r)
        if r > 1.0:
            over.append(Excess(tensor, statistic, got, tol, base, baseline))
    return worst, over


@dataclass(frozen=True)
class ShapeVerdict:
    """The check at one timed shape: ``reason`` empty when it passed (None ratio: unmeasured)."""

    shape: str
    reason: str
    worst_ratio: float | None
    sampled: int = 0

    @property
    def ok(self) -> bool:
        """Whether the check at this shape passed."""
        return not self.reason


def judge_shape(shape: str, dtype: str, regime: str, check: ShapeCheck) -> ShapeVerdict:
    """The check at a timed shape (``atshape``): wrong or unchecked rejects, naming the row."""
    where = f"at the model's shape {shape} ({dtype}, regime {regime})"
    if "error" in check:
        why = f"{where}: the check against float64 could not run: {check['error']}"
        return ShapeVerdict(shape, why, None)
    worst, bad = 0.0, []  # type: tuple[float, list[str]]
    stats = check.get("stats", {})
    for tensor, errors in check.get("errors", {}).items():
        r, over = judge_output(tensor, errors, stats.get(tensor), dtype)
        worst = max(worst, r)
        bad.extend(map(str, over))
    sampled = int(check.get("sampled", 0))
    if not bad:
        return ShapeVerdict(shape, "", worst, sampled)
    if "first_bad_row" in check:
        last_good = check.get("last_good_row", -1)
        what = f", its {check['first_bad_statistic']}" if check.get("first_bad_statistic") else ""
        row = (
            f"first bad row {check['first_bad_row']} of {check.get('rows', '?')}{what} ("
            + (f"the sampled rows up to {last_good} are right; " if last_good >= 0 else "")
            + f"{sampled} rows sampled)"
        )
    else:  # only a parameter gradient, a sum over the sampled rows, is wrong
        row = (
            f"the sum over the {sampled} sampled rows is wrong, every sampled row's output "
            "and input gradient right"
        )
    reached = check.get("boundaries") or []
    near = f"; boundaries reached: {', '.join(reached)}" if reached else ""
    why = f"{where}: wrong at this size, right at the check shapes: {row}; {', '.join(bad)}{near}"
    return ShapeVerdict(shape, why, worst, sampled)
