"""Where a verdict is decided: raw measurements in, (status, reasons) out.

The tolerance model. A candidate is judged against the error torch.nn itself makes in the same
dtype, regime and device, on the same input, measured against the same float64 reference:

    tolerance = FACTOR * error(torch.nn) + FLOOR(dtype)        FACTOR = 4, FLOOR = 2 * eps(dtype)

so a kernel may be a few times less accurate than torch.nn (a different reduction order, one extra
rounding), but not qualitatively worse, and the floor (two units of the dtype's machine epsilon,
relative to the largest reference value) keeps exact-ish cases from demanding bit equality. One
atol per dtype cannot do this: torch.nn's own bf16 dweight error on rows of tiny variance is ~0.25
while its fp32 output error is ~1e-7. Errors are normwise relative: max|got - ref| / max|ref|.

Besides the max error, two more statistics of every compared output (y, dx, dweight, dbias, dskip),
per row for what is row-local (an output row, its input gradient) and per tensor for parameter
gradients, each against torch.nn's same statistic (``limits``; derived in docs/checks.md):

    RMS error      <= FACTOR * RMS(torch.nn) + FLOOR(dtype) * RMS(reference) / sqrt(3)
    |mean error|   <= FACTOR * |mean error|(torch.nn) + K_SIGMA * (the RMS tolerance) / sqrt(n)

Rounding error is unbiased and a bug's is often not: a row shifted by 0.05 in bf16 is within 4x
torch.nn's max error (half an ulp at the largest outputs), but its mean over 256 elements is ~100
standard errors of rounding. The RMS rule bounds the candidate's noise at FACTOR x torch.nn's, so a
group mean beyond K_SIGMA of that noise's standard errors (plus FACTOR x torch.nn's own worst bias,
for the errors shared along a row, e.g. a rounded mean or weight) is a bias, not rounding: with
K_SIGMA = 6 a correct kernel is flagged with probability below 2e-9 per group (~1e-5 per candidate
over every group of every row checked).

Besides errors, these flags fail a candidate outright: it modified its input, or its backward
modified grad_output (a residual's gradient would be corrupted).

An output dtype different from torch.nn's in the same regime is judged by its consequence (norms):
the errors of the two small blocks a norm sits in — pre-norm ``x + Linear(Norm(x))`` and post-norm
``Norm(x + Linear(x))`` — against float64, under the same tolerance model. Within it, the candidate
is accepted with a note naming the dtype difference and the block error ratios; beyond it, rejected
with the block's figures. ``Policy.strict_dtype`` (``--strict-dtype``) rejects any dtype difference,
as does a slot without blocks (Linear).

Also recorded, not failed on: whether two runs are bitwise equal (``deterministic``).

The candidate-level rules live here too, so that every rule that turns measurements into a verdict
has one home: what rules a candidate out before anything is imported (``static_problem``), an import
or a run that replaced torch's own functions (tampering), a worker that died or ran out of time, a
state dict with no mapping onto torch.nn's (layout), an initialisation that differs, and the check
at the timed shapes (``judge_timing``). The checker (``check``) only orchestrates.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal

from kernel_lock.slots import DTYPES, SPECS, STATUSES, Status, confusable
from kernel_probe.candidates import Candidate
from kernel_probe.errors import ProbeError
from kernel_probe.isolation.protocol import (
    ALT_PREFIX,
    FLAG_GRAD_OUTPUT_MODIFIED,
    FLAG_INPUT_MODIFIED,
    FLAG_OUTPUT_DTYPE,
    CheckReply,
    ErrorStats,
    ImportKind,
    MeasurementRow,
    ShapeCheck,
    TimeReply,
    TryReply,
)
from kernel_probe.probe.layout import Layout
from kernel_probe.probe.report import Report, ReportBase, Verdict

FACTOR = 4.0

HINTS = {
    "tiny-variance": "rows whose variance is below eps: is eps the one pinned, and added where "
    "torch adds it?",
    "large-mean": "large mean, small spread: catastrophic cancellation in the variance",
    "large-magnitude": "large values: overflow in low precision",
    "non-contiguous-3d": "3-D, non-contiguous input with padded rows",
    "sequence": "several inputs in a row: state kept between calls",
    "residual": "y = f(x) + skip",
    "random": "plain random input",
    # the Activation slot's (kernel_probe.probe.activation.HINTS says the same)
    "gelu-gap": "|x| in 0.5..4: where GELU's erf and tanh forms differ most",
    "tiny": "|x| from 1e-6 to 1e-2: relative accuracy near zero",
    "non-contiguous": "a non-contiguous (transposed) 3-D view",
}
_DTYPE_PROBLEM = re.compile(
    r"not implemented for|unsupported (data)?type|unsupported dtype|dtype.*not "
    r"supported|expected .*dtype",
    re.I,
)


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


@dataclass(frozen=True)
class Policy:
    """What the user accepts besides numbers: a changed initialisation, an output dtype judged by
    consequence."""

    allow_init_change: bool = (
        False  # --allow-init-change: accept (and record) a different initialisation
    )
    strict_dtype: bool = False  # --strict-dtype: any output dtype difference rejects
    # --allow-approximation: accept (and record) an Activation computing an approximation of the
    # model's function (a tanh GELU for an erf one), judged against the function it computes
    allow_approximation: bool = False


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


def limits(dtype: str, base_max: float, stats: ErrorStats | None = None) -> Limits:
    """The tolerances of one compared output from torch.nn's statistics (``stats[...][1]``) in the
    same dtype, regime and input: the tolerance model for the max error; FACTOR x torch.nn's RMS
    plus the RMS of a uniform error of two eps relative to each element (the floor, at the
    reference's RMS rather than its max: rounding is relative to each value) for the RMS; for the
    bias FACTOR x torch.nn's bias plus K_SIGMA standard errors of a mean over ``n`` elements whose
    RMS is the RMS tolerance. Without ``stats`` only the max is judged. One rule for every slot's
    outputs.

    >>> limits("bfloat16", 0.25)
    Limits(max=1.015625, rms=inf, bias=inf)
    """
    tol_max = tolerance(base_max, dtype)
    if stats is None:
        return Limits(tol_max)
    eps = floor(dtype) / 2.0
    rms = FACTOR * stats["rms"][1] + 2.0 * eps * stats["ref_rms"] / math.sqrt(3.0)
    # the standard error of a group's mean: the larger noise of the two, and at least one rounding's
    noise = math.sqrt(
        stats["sd"][0] ** 2 + stats["sd"][1] ** 2 + (eps * stats["ref_rms"]) ** 2 / 12.0
    )
    bias = FACTOR * stats["bias"][1] + K_SIGMA * noise / math.sqrt(max(int(stats["n"]), 1))
    return Limits(tol_max, rms, bias)


@dataclass(frozen=True)
class Excess:
    """One statistic of one output over its tolerance."""

    tensor: str
    statistic: str  # a STATISTICS key
    got: float
    tol: float
    base: float  # torch.nn's same statistic
    # whose statistic ``base`` is (Attention: torch's math path's and fused ordering's)
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
    """One compared output: the worst statistic / tolerance ratio (<= 1 passes) and the statistics
    over; ``ratios``, when given, keeps the worst ratio per statistic. ``max_tolerance``: a slot's
    own tolerance of the max error (Attention's, attention_verdict.tolerance) instead of the
    norms'."""
    lim = limits(dtype, errors[1], stats)
    if max_tolerance is not None:
        lim = dataclasses.replace(lim, max=max_tolerance)
    judged = [("max", errors[0], errors[1], lim.max)]
    if stats is not None:
        judged += [
            ("rms", stats["rms"][0], stats["rms"][1], lim.rms),
            ("bias", stats["bias"][0], stats["bias"][1], lim.bias),
        ]
    worst, over = 0.0, []
    for statistic, got, base, tol in judged:
        r = got / tol if tol > 0 and math.isfinite(got) else math.inf
        worst = max(worst, r)
        if ratios is not None:
            ratios[statistic] = max(ratios.get(statistic, 0.0), r)
        if r > 1.0:
            over.append(Excess(tensor, statistic, got, tol, base, baseline))
    return worst, over


class UnjudgedRow(ProbeError):
    """A measured row with no case to judge and no flag that fails it: no verdict can be reached, so
    none is made up (a row is never accepted by default)."""

    def __init__(self, candidate: str, dtype: str, regime: str):
        self.candidate = candidate
        super().__init__(
            f"{candidate}: its {dtype}/{regime} row has no measured case, so no verdict can be "
            "reached on it",
            fix="a bug of the check that measured it: re-run with --debug and report it",
        )


@dataclass(frozen=True)
class Findings:
    """What the compared outputs of a row's cases say, each case under the one rule
    (``judge_output``)."""

    # the largest statistic / tolerance over every output (None: no case measured)
    worst: float | None
    failed: tuple[str, ...]  # ``case:output`` of each output over its tolerance
    reasons: tuple[str, ...]  # one line per failing case, naming what that case is about
    statistics: dict[str, float]  # per statistic (max, rms, bias): the worst ratio
    ratios: dict[str, dict[str, float]]  # with a slot's own max tolerance: case -> output -> ratio


def judge_cases(
    row: MeasurementRow,
    hints: Mapping[str, str],
    *,
    max_tolerance: Callable[[str, float, str], float] | None = None,
    baseline: str = "torch.nn's",
) -> Findings:
    """Every case's compared outputs of ``row`` by ``judge_output`` (the outputs of an alternative
    reference, ``ALT_PREFIX``, are not judged). ``max_tolerance(output, base, dtype)``: a slot's own
    tolerance of the max error (attention's), with the ratios kept per case and output."""
    dtype = row["dtype"]
    worst, failed, reasons = 0.0, [], []
    statistics: dict[str, float] = {}
    ratios: dict[str, dict[str, float]] = {}
    for case, tensors in row.get("cases", {}).items():
        bad: list[str] = []
        per: dict[str, float] = {}
        case_stats = row.get("stats", {}).get(case, {})
        for tensor, errors in tensors.items():
            if tensor.startswith(ALT_PREFIX):
                continue
            own = None if max_tolerance is None else max_tolerance(tensor, errors[1], dtype)
            r, over = judge_output(
                tensor, errors, case_stats.get(tensor), dtype, statistics, own, baseline
            )
            per[tensor] = r
            worst = max(worst, r)
            if over:
                failed.append(f"{case}:{tensor}")
                bad.extend(map(str, over))
        if max_tolerance is not None:
            ratios[case] = per
        if bad:
            reasons.append(f"{case} ({hints.get(case, case)}): {', '.join(bad)}")
    return Findings(
        worst if row.get("cases") else None, tuple(failed), tuple(reasons), statistics, ratios
    )


def determinism(row: MeasurementRow) -> tuple[bool | None, tuple[str, ...]]:
    """The row's bitwise-repeat measurement: (deterministic, a note with the spread when two
    identical runs differed); (None, ()) when not measured. Every slot's verdict records it the same
    way."""
    if "nondeterministic" not in row:
        return None, ()
    spread = row["nondeterministic"]
    return spread is None, () if spread is None else (f"not deterministic: {spread}",)


def unmeasured(
    candidate: str,
    device: str,
    row: MeasurementRow,
    refused: re.Pattern[str] | None,
    *,
    say_unavailable: bool = False,
) -> Verdict | None:
    """The verdict on a row with no measurements: skipped where torch itself cannot run it; where
    the candidate raised, unavailable when the message is a refusal (``refused``: this dtype or
    configuration is not supported) and crashed otherwise. None: the row was measured."""
    where = (candidate, device, row["dtype"], row["regime"])
    if "skipped" in row:
        return Verdict(*where, "skipped", reasons=(row["skipped"],))
    if "exception" in row:
        message = row["exception"]
        status: Status = (
            "unavailable" if refused is not None and refused.search(message) else "crashed"
        )
        unavailable = say_unavailable and status == "unavailable"
        return Verdict(
            *where,
            status,
            reasons=(f"unavailable: {message}" if unavailable else f"raised {message}",),
        )
    return None


def row_verdict(
    candidate: str,
    device: str,
    row: MeasurementRow,
    found: Findings,
    *,
    failed: Sequence[str] = (),
    failed_first: Sequence[str] = (),
    reasons: Sequence[str] = (),
    notes: Sequence[str] = (),
    changes: Sequence[str] = (),
    twin: bool = True,
    out_dtype: str = "",
) -> Verdict:
    """The verdict on a measured row, built once: rejected when an output of its cases is over its
    tolerance or a flag fails it (``failed``: after the cases' in the record, ``failed_first``:
    before; ``reasons``: theirs, first), accepted otherwise. A row with no case and no failure
    raises :class:`UnjudgedRow`: nothing vouches for it, and it is never accepted by default."""
    all_failed = (*failed_first, *found.failed, *failed)
    if not row.get("cases") and not all_failed:
        raise UnjudgedRow(candidate, row["dtype"], row["regime"])
    deterministic, spread = determinism(row)
    return Verdict(
        candidate,
        device,
        row["dtype"],
        row["regime"],
        "rejected" if all_failed else "accepted",
        reasons=(*reasons, *found.reasons),
        failed=all_failed,
        worst_ratio=found.worst,
        statistics=found.statistics,
        out_dtype=out_dtype,
        twin=dict(row.get("twin") or {}) if twin else {},
        notes=(*spread, *notes),
        errors={case: dict(t) for case, t in row.get("cases", {}).items()},
        deterministic=deterministic,
        changes=tuple(changes),
        ratios=found.ratios,
    )


def judge_row(
    candidate: str,
    device: str,
    semantics: str,
    row: MeasurementRow,
    policy: Policy = Policy(),
    *,
    also: Sequence[tuple[str, str]] = (),
    notes: Sequence[str] = (),
) -> Verdict:
    """The verdict on one measured (dtype, regime): errors against the tolerance model, then the
    flags. ``also``: a slot's own failing flags, (flag, reason), its reason first; ``notes``: a
    slot's own."""
    v = unmeasured(candidate, device, row, _DTYPE_PROBLEM)
    if v is not None:
        return v
    found = judge_cases(row, HINTS)
    alt_ok = None
    for tensors in row.get("cases", {}).values():
        for tensor, errors in tensors.items():
            if tensor.startswith(ALT_PREFIX):
                r, _ = ratio(errors[0], errors[1], row["dtype"])
                alt_ok = (alt_ok is not False) and r <= 1.0
    flags = row.get("flags", {})
    failed: list[str] = []
    reasons: list[str] = []
    extra_notes: list[str] = []
    changes: list[str] = []
    if FLAG_GRAD_OUTPUT_MODIFIED in flags:
        failed.append(FLAG_GRAD_OUTPUT_MODIFIED)
        reasons.insert(
            0,
            f"backward modifies grad_output in place (seen on {flags[FLAG_GRAD_OUTPUT_MODIFIED]}): "
            "gradients of other branches, e.g. a residual, are corrupted",
        )
    if FLAG_INPUT_MODIFIED in flags:
        failed.append(FLAG_INPUT_MODIFIED)
        reasons.insert(0, f"modifies its input (seen on {flags[FLAG_INPUT_MODIFIED]})")
    if FLAG_OUTPUT_DTYPE in flags:
        rejection, change = _judge_dtype(row, flags[FLAG_OUTPUT_DTYPE], policy)
        if rejection:
            failed.append(FLAG_OUTPUT_DTYPE)
            reasons.insert(0, rejection)
        else:
            extra_notes.append(change)
            changes.append(change)
    y_failed = any(f.endswith(":y") for f in found.failed)
    alt = confusable(semantics)
    if alt and y_failed and alt_ok:
        reasons.insert(0, f"semantics: {alt} != {semantics} (its output matches a {alt} reference)")
    for flag, reason in also:
        failed.append(flag)
        reasons.insert(0, reason)
    return row_verdict(
        candidate,
        device,
        row,
        found,
        failed=failed,
        reasons=reasons,
        notes=(*extra_notes, *notes),
        changes=changes,
        out_dtype=row.get("out_dtype", ""),
    )


def _judge_dtype(row: MeasurementRow, what: str, policy: Policy) -> tuple[str, str]:
    """An output dtype different from torch.nn's, judged by its consequence in the blocks, or
    strictly: (the rejection's reason, '') or ('', the accepted change)."""
    regime = "under autocast" if row["regime"] == "mixed" else "in plain " + row["dtype"]
    blocks = row.get("blocks")
    if policy.strict_dtype or not blocks:
        why = "--strict-dtype" if policy.strict_dtype else "no block check for this slot"
        return f"output dtype {what} {regime} ({why})", ""
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
                bad.append(
                    f"{kind} block {tensor} error {got:.3g} > tolerance {tol:.3g} (torch.nn's "
                    f"{base:.3g})"
                )
        figures.append(f"{kind} block error ratio {worst:.2f}")
    if bad:
        return (
            f"output dtype {what} {regime} changes the blocks a norm sits in: {'; '.join(bad)}",
            "",
        )
    return (
        "",
        f"output dtype {what} {regime}: accepted by consequence ({', '.join(figures)}; <= 1 "
        "passes)",
    )


@dataclass(frozen=True)
class ShapeVerdict:
    """The check at one timed shape: ``reason`` is empty when it passed; ``worst_ratio`` is the
    largest statistic / tolerance (max, RMS, bias) over y, dx, dweight and dbias (None when nothing
    was measured)."""

    shape: str
    reason: str
    worst_ratio: float | None
    sampled: int = 0

    @property
    def ok(self) -> bool:
        """Whether the check at this shape passed."""
        return not self.reason


def judge_shape(shape: str, dtype: str, regime: str, check: ShapeCheck) -> ShapeVerdict:
    """The verdict of the check at a timed shape (``atshape``), under the same tolerance model as
    the correctness kernels: a candidate wrong only at the model's size is rejected, naming the
    shape and the first wrong row. A check that could not run rejects too: nothing vouches for that
    size."""
    where = f"at the model's shape {shape} ({dtype}, regime {regime})"
    if "error" in check:
        return ShapeVerdict(
            shape, f"{where}: the check against float64 could not run: {check['error']}", None
        )
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
    return ShapeVerdict(
        shape,
        f"{where}: wrong at this size, right at the check shapes: {row}; {', '.join(bad)}{near}",
        worst,
        sampled,
    )


def worst_status(statuses: Sequence[Status]) -> Status:
    """The worst of the statuses of a candidate's rows (``STATUSES`` is worst first); skipped when
    none."""
    present = [s for s in STATUSES if s in statuses]  # worst first
    if not present:
        return "skipped"
    real = [s for s in present if s != "skipped"]
    return real[0] if real else "skipped"


# ---- before anything is imported -----------------------------------------------------------------
def installed(cand: Candidate, device: str = "") -> str | None:
    """None if the candidate's library is present (by metadata / find_spec, no import); else why
    not, with the way to install it for ``device`` (or that there is none)."""
    if cand.distribution:
        try:
            metadata.version(cand.distribution)
            return None
        except metadata.PackageNotFoundError:
            if cand.module and importlib.util.find_spec(cand.module.split(".")[0]) is not None:
                return None
        what = cand.distribution
    elif cand.module and importlib.util.find_spec(cand.module.split(".")[0]) is None:
        what = f"no module {cand.module.split('.')[0]!r}"
    else:
        return None
    # the user's own class: no registry entry says how to install it
    if cand.source == "command-line":
        return (
            f"not importable: {what} on this Python's path (offered as "
            f"{cand.slots[0]}={cand.target}; "
            "install its package or put its directory on PYTHONPATH, and check the dotted path)"
        )
    hint = cand.install_hint(device)
    return f"not installed: {what}" + (
        f" ({hint})" if hint else f" (no build for {device})" if device else ""
    )


@dataclass(frozen=True)
class Problem:
    """Why a candidate gets ``status`` without being checked; ``try_it``: it is installed but
    declares other devices, and trying it in a worker says how it fails here (or that it runs
    something else)."""

    status: Status
    reason: str
    try_it: bool = False


def static_problem(
    cand: Candidate,
    slot: str,
    device: str,
    arch: str = "",
    *,
    with_compile: bool = False,
    detail: bool = False,
) -> Problem | None:
    """Why ``cand`` certainly cannot be checked for ``slot`` here, from what is known without
    importing anything (semantics, device type, GPU arch, installed, torch.compile on CPU); None
    when it is worth checking. The command line uses it to refuse a --pin before any work; the
    checker with ``detail``, which also says where a candidate ruled out by the hardware is not
    installed either."""
    expected = SPECS[slot].semantics
    if cand.semantics != expected:
        return Problem("rejected", f"semantics: {cand.semantics} != {expected}")

    def absent() -> str:
        return " (and it is not installed)" if detail and installed(cand) is not None else ""

    # what the hardware rules out comes before "not installed": no advice to install what cannot run
    # here
    if cand.devices and device not in cand.devices:
        why = f"runs on {', '.join(cand.devices)}; this device is {device}"
        # a BLAS library belongs to its platform: nothing to learn from trying it here
        if detail and cand.blas:
            return Problem(
                "unavailable", f"{why} ({cand.blas} is a {cand.devices[0]} BLAS library)"
            )
        note = absent()
        return Problem("unavailable", why + note, try_it=detail and not note)
    wrong_arch = cand.arch_problem(device, arch)
    if wrong_arch:
        return Problem("unavailable", wrong_arch + absent())
    missing = installed(cand, device)
    if missing:
        return Problem("unavailable", missing)
    if cand.compiled and device == "cpu" and not with_compile:
        return Problem(
            "skipped",
            "torch.compile candidates are not probed on CPU by default (each shape and dtype costs "
            "seconds of C++ compilation); pass --with-compile to include them",
        )
    return None


def judge_tried(problem: Problem, cand: Candidate, tried: TryReply) -> str:
    """The reason of a candidate on a device it does not declare, with what trying it here
    showed."""
    why = problem.reason
    if tried.interpreted:
        why += " (tried under Triton's interpreter, TRITON_INTERPRET=1)"
    if tried.ran:
        return (
            why
            + "; it ran here, but "
            + (cand.note or "not as the kernel it is declared to be")
            + ", so it is not offered"
        )
    return why + f"; trying it raised {tried.error}"


# ---- in the worker: dying, tampering, importing --------------------------------------------------
def died(
    status: Literal["crashed", "timeout"], reason: str, what: str, budget: tuple[str, float]
) -> Problem:
    """A worker that crashed or ran out of time while ``what`` ran ("importing X", "checks"): its
    status, and for a timeout the budget it ran out of, (its name, seconds)."""
    return Problem(
        status,
        f"{what}: {reason} ({budget[0]} budget {budget[1]:g} s)" if status == "timeout" else reason,
    )


def tampered(what: str, names: Iterable[str]) -> Problem:
    """A library that replaced torch's own functions while ``what`` ran: refused."""
    return Problem(
        "rejected",
        f"{what} replaced torch's own {', '.join(names)}: a library that patches torch changes "
        "the maths of "
        "every other layer (and of the reference it is judged against), so it is refused",
    )


def failed_import(target: str, kind: ImportKind, error: str) -> Problem:
    """An import of ``target`` that raised: an ImportError (``kind`` "import") means the library is
    absent, anything else that it is broken."""
    return Problem(
        "unavailable" if kind == "import" else "crashed", f"import of {target} failed: {error}"
    )


# ---- the candidate: its layout, its initialisation, its rows -------------------------------------
def judge_candidate(
    raw: CheckReply, cand: Candidate, slot: str, device: str, policy: Policy, base: ReportBase
) -> Report:
    """The verdict from the worker's measurements: candidate-level facts first, then the rows."""
    early = _early_stop(raw, cand)
    if early is not None:
        return stopped(early, base)
    # a slot that does not measure its state dict's layout against its default class says none
    layout = Layout.from_json(raw.layout) if raw.layout is not None else Layout(True)
    if not layout.ok:
        return Report(status="rejected", reasons=[f"layout: {layout.problem()}"], **base)
    verdicts = [judge_row(cand.id, device, cand.semantics, row, policy) for row in raw.rows]
    report = report_of(
        verdicts, base, migration=layout.rules, blas=raw.blas, blas_default=raw.blas_default
    )
    _judge_init(report, list(raw.init), policy)
    for v in verdicts:
        for change in v.changes:
            line = f"{v.dtype}/{v.regime}: {change}"
            if line not in report.changes:
                report.changes.append(line)
    return report


def _early_stop(raw: CheckReply, cand: Candidate) -> Problem | None:
    """The verdict of a check that stopped before any row (``raw.phase``); None when it did not."""
    if raw.phase == "import":
        return failed_import(cand.target, raw.kind, raw.error)
    if raw.phase == "baseline":
        return Problem("skipped", raw.error)
    if raw.phase == "build":
        return Problem("crashed", f"building {cand.target} raised {raw.error}")
    if raw.phase == "blas":
        return Problem("unavailable", f"BLAS library: {raw.error}")
    return None


def row_reasons(verdicts: Sequence[Verdict], *, regime: bool = True) -> list[str]:
    """The reasons of the rows that were not accepted, each once, prefixed by its dtype (and
    regime)."""
    reasons: list[str] = []
    for v in verdicts:
        if v.status != "accepted":
            for r in v.reasons:
                line = f"{v.dtype}/{v.regime}: {r}" if regime else f"{v.dtype}: {r}"
                if line not in reasons:
                    reasons.append(line)
    return reasons


def report_of(verdicts: Sequence[Verdict], base: ReportBase, **more: Any) -> Report:
    """A candidate's report from its rows' verdicts: the worst of their statuses, their reasons."""
    return Report(
        status=worst_status([v.status for v in verdicts]),
        reasons=row_reasons(verdicts),
        verdicts=list(verdicts),
        **base,
        **more,
    )


def stopped(problem: Problem, base: ReportBase) -> Report:
    """The report on a candidate whose check stopped before any row (an import that failed, ...)."""
    return Report(status=problem.status, reasons=[problem.reason], **base)


def _judge_init(report: Report, init: list[str], policy: Policy) -> None:
    """An initialisation that differs from torch.nn's changes every model trained from scratch:
    rejected, unless the policy accepts (and records) it."""
    if not init:
        return
    if policy.allow_init_change:
        report.changes.extend(
            f"initialisation: {d} (accepted with --allow-init-change)" for d in init
        )
        return
    report.reasons.insert(
        0,
        "initialisation differs from torch.nn's, so every model trained from scratch "
        f"changes: {'; '.join(init)} (pass --allow-init-change to accept and record it)",
    )
    if report.status == "accepted":
        report.status = "rejected"


# ---- after timing --------------------------------------------------------------------------------
def judge_timing(report: Report, reply: TimeReply) -> None:
    """A candidate that replaced torch's own functions while timed is rejected; one wrong at a timed
    shape (the check after timing, ``atshape``) too, the shape and the first wrong row named first
    among its reasons (its timings stay in the lock's record)."""
    if reply.tampered:
        report.status = "rejected"
        report.reasons.insert(
            0, f"while timing it replaced torch's own {', '.join(reply.tampered)}"
        )
        return
    for row in reply.rows:
        if "check" not in row:
            continue
        verdict = judge_shape(row["shape"], row["dtype"], row["regime"], row["check"])
        if not verdict.ok:
            report.status = "rejected"
            report.reasons.insert(0, verdict.reason)


def judge_timing_died(report: Report, status: Literal["crashed", "timeout"], reason: str) -> None:
    """A worker that crashed or ran out of time while timing: its status, the reason first."""
    report.status = status
    report.reasons.insert(0, f"while timing: {reason}")
