"""Where a verdict is decided: raw measurements in, (status, reasons) out.

The tolerance model. A candidate is judged against the error torch.nn itself makes in the same
dtype, regime and device, on the same input, measured against the same float64 reference:

    tolerance = FACTOR * error(torch.nn) + FLOOR(dtype)        FACTOR = 4, FLOOR = 2 * eps(dtype)

so a kernel may be a few times less accurate than torch.nn (a different reduction order, one extra
rounding), but not qualitatively worse, and the floor (two units of the dtype's machine epsilon,
relative to the largest reference value) keeps exact-ish cases from demanding bit equality. One
atol per dtype cannot do this: torch.nn's own bf16 dweight error on rows of tiny variance is ~0.25
while its fp32 output error is ~1e-7. Errors are normwise relative: max|got - ref| / max|ref|.

Besides errors, these flags fail a candidate outright: it modified its input, or its backward modified
grad_output (a residual's gradient would be corrupted).

An output dtype different from torch.nn's in the same regime is judged by its consequence (norms):
the errors of the two small blocks a norm sits in — pre-norm ``x + Linear(Norm(x))`` and post-norm
``Norm(x + Linear(x))`` — against float64, under the same tolerance model. Within it, the candidate is
accepted with a note naming the dtype difference and the block error ratios; beyond it, rejected with
the block's figures. ``Policy.strict_dtype`` (``--strict-dtype``) rejects any dtype difference, as does
a slot without blocks (Linear).

Also recorded, not judged here: whether two runs are bitwise equal (``deterministic``). Decided per
candidate in ``checker``: the parameter layout and the initialisation.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from kernel_lock.slots import CONFUSABLE, STATUSES
from kernel_probe.isolation.protocol import (
    ALT_PREFIX,
    FLAG_GRAD_OUTPUT_MODIFIED,
    FLAG_INPUT_MODIFIED,
    FLAG_OUTPUT_DTYPE,
    MeasurementRow,
    ShapeCheck,
)

FACTOR = 4.0
EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}

HINTS = {
    "tiny-variance": "rows whose variance is below eps: is eps the one pinned, and added where torch adds it?",
    "large-mean": "large mean, small spread: catastrophic cancellation in the variance",
    "large-magnitude": "large values: overflow in low precision",
    "non-contiguous-3d": "3-D, non-contiguous input with padded rows",
    "sequence": "several inputs in a row: state kept between calls",
    "residual": "y = f(x) + skip",
    "random": "plain random input",
}
_DTYPE_PROBLEM = re.compile(
    r"not implemented for|unsupported (data)?type|unsupported dtype|dtype.*not supported|expected .*dtype", re.I
)


def floor(dtype: str) -> float:
    return 2.0 * EPS.get(dtype, EPS["float32"])


@dataclass(frozen=True)
class Policy:
    """What the user accepts besides numbers: a changed initialisation, an output dtype judged by consequence."""

    allow_init_change: bool = False  # --allow-init-change: accept (and record) a different initialisation
    strict_dtype: bool = False  # --strict-dtype: any output dtype difference rejects


def tolerance(base: float, dtype: str) -> float:
    """The tolerance model: FACTOR x torch.nn's error + FLOOR(dtype)."""
    return FACTOR * base + floor(dtype)


def ratio(got: float, base: float, dtype: str) -> tuple[float, float]:
    """(got / tolerance, tolerance) under the tolerance model."""
    tol = tolerance(base, dtype)
    return (got / tol if tol > 0 else float("inf")), tol


@dataclass
class Verdict:
    """One (candidate, device, dtype, regime): status, reasons, and the numbers behind them."""

    candidate: str
    device: str
    dtype: str
    regime: str
    status: str
    reasons: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    worst_ratio: float | None = None
    out_dtype: str = ""
    twin: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    deterministic: bool | None = None  # two runs bitwise equal (None: not measured)
    changes: list[str] = field(default_factory=list)  # accepted, but the model changes besides numbers (recorded)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def judge_row(candidate: str, device: str, semantics: str, row: MeasurementRow, policy: Policy = Policy()) -> Verdict:
    v = Verdict(candidate, device, row["dtype"], row["regime"], "accepted", out_dtype=row.get("out_dtype", ""))
    if "skipped" in row:
        v.status, v.reasons = "skipped", [row["skipped"]]
        return v
    if "exception" in row:
        message = row["exception"]
        v.status = "unavailable" if _DTYPE_PROBLEM.search(message) else "crashed"
        v.reasons = [f"raised {message}"]
        return v
    worst = 0.0
    alt_ok = None
    for case, tensors in row.get("cases", {}).items():
        bad = []
        for tensor, (got, base) in tensors.items():
            r, tol = ratio(got, base, row["dtype"])
            if tensor.startswith(ALT_PREFIX):
                alt_ok = (alt_ok is not False) and r <= 1.0
                continue
            worst = max(worst, r)
            if r > 1.0:
                v.failed.append(f"{case}:{tensor}")
                bad.append(f"{tensor} error {got:.3g} > tolerance {tol:.3g}")
        if bad:  # one line per failing case, naming what that case is about
            v.reasons.append(f"{case} ({HINTS.get(case, case)}): {', '.join(bad)}")
    v.worst_ratio = worst
    if "nondeterministic" in row:
        v.deterministic = row["nondeterministic"] is None
        if not v.deterministic:
            v.notes.append(f"not deterministic: {row['nondeterministic']}")
    flags = row.get("flags", {})
    if FLAG_GRAD_OUTPUT_MODIFIED in flags:
        v.failed.append(FLAG_GRAD_OUTPUT_MODIFIED)
        v.reasons.insert(
            0,
            f"backward modifies grad_output in place (seen on {flags[FLAG_GRAD_OUTPUT_MODIFIED]}): "
            "gradients of other branches, e.g. a residual, are corrupted",
        )
    if FLAG_INPUT_MODIFIED in flags:
        v.failed.append(FLAG_INPUT_MODIFIED)
        v.reasons.insert(0, f"modifies its input (seen on {flags[FLAG_INPUT_MODIFIED]})")
    if FLAG_OUTPUT_DTYPE in flags:
        _judge_dtype(v, row, flags[FLAG_OUTPUT_DTYPE], policy)
    if v.failed:
        v.status = "rejected"
        y_failed = any(f.endswith(":y") for f in v.failed)
        if semantics in CONFUSABLE and y_failed and alt_ok:
            alt = CONFUSABLE[semantics]
            v.reasons.insert(0, f"semantics: {alt} != {semantics} (its output matches a {alt} reference)")
    v.twin = dict(row.get("twin") or {})
    v.errors = {case: dict(t) for case, t in row.get("cases", {}).items()}
    return v


def _judge_dtype(v: Verdict, row: MeasurementRow, what: str, policy: Policy) -> None:
    """An output dtype different from torch.nn's: judged by its consequence in the blocks, or strictly."""
    regime = "under autocast" if row["regime"] == "mixed" else "in plain " + row["dtype"]
    blocks = row.get("blocks")
    if policy.strict_dtype or not blocks:
        why = "--strict-dtype" if policy.strict_dtype else "no block check for this slot"
        v.failed.append(FLAG_OUTPUT_DTYPE)
        v.reasons.insert(0, f"output dtype {what} {regime} ({why})")
        return
    figures, bad = [], []
    for kind, tensors in blocks.items():
        if "error" in tensors:
            bad.append(f"the {kind} block raised {tensors['error']}")
            continue
        worst = 0.0
        for tensor, (got, base) in tensors.items():
            r, tol = ratio(got, base, row["dtype"])
            worst = max(worst, r)
            if r > 1.0:
                bad.append(f"{kind} block {tensor} error {got:.3g} > tolerance {tol:.3g} (torch.nn's {base:.3g})")
        figures.append(f"{kind} block error ratio {worst:.2f}")
    if bad:
        v.failed.append(FLAG_OUTPUT_DTYPE)
        v.reasons.insert(0, f"output dtype {what} {regime} changes the blocks a norm sits in: {'; '.join(bad)}")
        return
    change = f"output dtype {what} {regime}: accepted by consequence ({', '.join(figures)}; <= 1 passes)"
    v.notes.append(change)
    v.changes.append(change)


@dataclass(frozen=True)
class ShapeVerdict:
    """The check at one timed shape: ``reason`` is empty when it passed; ``worst_ratio`` is the
    largest error / tolerance over y, dx, dweight and dbias (None when nothing was measured)."""

    shape: str
    reason: str
    worst_ratio: float | None
    sampled: int = 0

    @property
    def ok(self) -> bool:
        return not self.reason


def judge_shape(shape: str, dtype: str, regime: str, check: ShapeCheck) -> ShapeVerdict:
    """The verdict of the check at a timed shape (``atshape``), under the same tolerance model as the
    correctness kernels: a candidate wrong only at the model's size is rejected, naming the shape and
    the first wrong row. A check that could not run rejects too: nothing vouches for that size."""
    where = f"at the model's shape {shape} ({dtype}, regime {regime})"
    if "error" in check:
        return ShapeVerdict(shape, f"{where}: the check against float64 could not run: {check['error']}", None)
    worst, bad = 0.0, []
    for tensor, (got, base) in check.get("errors", {}).items():
        r, tol = ratio(got, base, dtype)
        worst = max(worst, r)
        if r > 1.0:
            bad.append(f"{tensor} error {got:.3g} > tolerance {tol:.3g} (torch.nn's {base:.3g})")
    sampled = int(check.get("sampled", 0))
    if not bad:
        return ShapeVerdict(shape, "", worst, sampled)
    if "first_bad_row" in check:
        last_good = check.get("last_good_row", -1)
        row = (
            f"first bad row {check['first_bad_row']} of {check.get('rows', '?')} ("
            + (f"the sampled rows up to {last_good} are right; " if last_good >= 0 else "")
            + f"{sampled} rows sampled)"
        )
    else:  # only a parameter gradient, a sum over the sampled rows, is wrong
        row = f"the sum over the {sampled} sampled rows is wrong, every sampled row's output and input gradient right"
    reached = check.get("boundaries") or []
    near = f"; boundaries reached: {', '.join(reached)}" if reached else ""
    return ShapeVerdict(
        shape, f"{where}: wrong at this size, right at the check shapes: {row}; {', '.join(bad)}{near}", worst, sampled
    )


def worst_status(statuses: list[str]) -> str:
    present = [s for s in STATUSES if s in statuses]  # worst first
    if not present:
        return "skipped"
    real = [s for s in present if s != "skipped"]
    return real[0] if real else "skipped"
