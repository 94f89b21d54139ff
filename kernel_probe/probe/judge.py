"""Where a verdict is decided: raw measurements in, (status, reasons) out (docs/checks.md).

Outputs by the tolerance model (``tolerance``); an input or grad_output modified in place fails;
another output dtype by its consequence in the blocks a norm sits in; repeatability is recorded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kernel_lock.slots import STATUSES, Status, confusable
from kernel_probe.candidates import Candidate
from kernel_probe.errors import ProbeError
from kernel_probe.isolation.protocol import (
    ALT_PREFIX,
    FLAG_GRAD_OUTPUT_MODIFIED,
    FLAG_INPUT_MODIFIED,
    FLAG_OUTPUT_DTYPE,
    CheckReply,
    ImportKind,
    MeasurementRow,
    TimeReply,
    TryReply,
)
from kernel_probe.probe import lifecycle
from kernel_probe.probe.layout import Layout
from kernel_probe.probe.report import Problem, Report, ReportBase, Verdict
from kernel_probe.probe.tolerance import Excess, judge_output, judge_shape, ratio

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
    **lifecycle.HINTS,  # as training and inference use a kernel (issue 55), every slot's
}
_DTYPE_PROBLEM = re.compile(
    r"not implemented for|unsupported (data)?type|unsupported dtype|dtype.*not "
    r"supported|expected .*dtype",
    re.I,
)


@dataclass(frozen=True)
class Policy:
    """What the user accepts besides numbers (``--allow-init-change``, ``--strict-dtype``,
    ``--allow-approximation``: an Activation computing an approximation of the model's function)."""

    allow_init_change: bool = False
    strict_dtype: bool = False
    allow_approximation: bool = False


# ---- the rows ------------------------------------------------------------------------------------
class UnjudgedRow(ProbeError):
    """A measured row with no case to judge and no flag that fails it: no verdict is made up."""

    def __init__(self, candidate: str, dtype: str, regime: str):
        self.candidate = candidate
        super().__init__(
            f"{candidate}: its {dtype}/{regime} row has no measured case, so no verdict can be "
            "reached on it",
            fix="a bug of the check that measured it: re-run with --debug and report it",
        )


@dataclass(frozen=True)
class Findings:
    """What the compared outputs of a row's cases say, each under ``judge_output``."""

    worst: float | None  # the largest statistic / tolerance (None: no case measured)
    failed: tuple[str, ...]  # ``case:output`` of each output over its tolerance
    reasons: tuple[str, ...]  # one line per failing case
    statistics: dict[str, float]  # per statistic (max, rms, bias): the worst ratio
    ratios: dict[str, dict[str, float]]  # with a slot's own max tolerance: case -> output -> ratio


def judge_cases(
    row: MeasurementRow,
    hints: Mapping[str, str],
    *,
    max_tolerance: Callable[[str, float, str, str], float] | None = None,
    baseline: str = "torch.nn's",
) -> Findings:
    """Every case's outputs of ``row``; ``max_tolerance(output, base, dtype, case)``: a slot's
    own."""
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
            own = None if max_tolerance is None else max_tolerance(tensor, errors[1], dtype, case)
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


def unmeasured(
    candidate: str,
    device: str,
    row: MeasurementRow,
    refused: re.Pattern[str] | None,
    *,
    say_unavailable: bool = False,
) -> Verdict | None:
    """The verdict on a row without measurements: skipped (torch itself cannot run it), or where
    the candidate raised, unavailable when ``refused`` matches the message, else crashed."""
    where = (candidate, device, row["dtype"], row["regime"])
    if "skipped" in row:
        return Verdict(*where, "skipped", reasons=(row["skipped"],))
    if "exception" not in row:
        return None
    message = row["exception"]
    refusal = refused is not None and refused.search(message)
    status: Status = "unavailable" if refusal else "crashed"
    said = f"raised {message}"
    if say_unavailable and refusal:  # the project's words first, what the library said as detail
        said = f"cannot run these inputs here; it {said}"
    return Verdict(*where, status, reasons=(said,))


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
    """A measured row: rejected when an output is over its tolerance or a flag (``failed``,
    ``failed_first``) fails it, else accepted; :class:`UnjudgedRow` where neither was judged."""
    all_failed = (*failed_first, *found.failed, *failed)
    if not row.get("cases") and not all_failed:
        raise UnjudgedRow(candidate, row["dtype"], row["regime"])
    spread = row.get("nondeterministic")  # None: bitwise repeatable (absent: not measured)
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
        notes=(*((f"not deterministic: {spread}",) if spread is not None else ()), *notes),
        errors={case: dict(t) for case, t in row.get("cases", {}).items()},
        deterministic=spread is None if "nondeterministic" in row else None,
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
    """One measured row: errors, flags; ``also``: a slot's own failing (flag, reason)."""
    v = unmeasured(candidate, device, row, _DTYPE_PROBLEM)
    if v is not None:
        return v
    found = judge_cases(row, HINTS)
    flags = row.get("flags", {})
    failed: list[str] = []
    reasons: list[str] = []
    changes: list[str] = []

    def fail(flag: str, reason: str) -> None:
        failed.append(flag)
        reasons.insert(0, reason)

    if FLAG_GRAD_OUTPUT_MODIFIED in flags:
        fail(
            FLAG_GRAD_OUTPUT_MODIFIED,
            f"backward modifies grad_output in place (seen on {flags[FLAG_GRAD_OUTPUT_MODIFIED]}): "
            "gradients of other branches, e.g. a residual, are corrupted",
        )
    if FLAG_INPUT_MODIFIED in flags:
        fail(FLAG_INPUT_MODIFIED, f"modifies its input (seen on {flags[FLAG_INPUT_MODIFIED]})")
    if FLAG_OUTPUT_DTYPE in flags:
        rejection, change = _judge_dtype(row, flags[FLAG_OUTPUT_DTYPE], policy)
        if rejection:
            fail(FLAG_OUTPUT_DTYPE, rejection)
        else:
            changes.append(change)
    alt = confusable(semantics)
    if alt and any(f.endswith(":y") for f in found.failed) and _matches_alternative(row):
        reasons.insert(0, f"semantics: {alt} != {semantics} (its output matches a {alt} reference)")
    for flag, reason in also:
        fail(flag, reason)
    return row_verdict(
        candidate,
        device,
        row,
        found,
        failed=failed,
        reasons=reasons,
        notes=(*changes, *notes),
        changes=changes,
        out_dtype=row.get("out_dtype", ""),
    )


def _matches_alternative(row: MeasurementRow) -> bool | None:
    """Whether every output compared to an alternative reference is within its tolerance."""
    ok = None
    for tensors in row.get("cases", {}).values():
        for tensor, errors in tensors.items():
            if tensor.startswith(ALT_PREFIX):
                ok = (ok is not False) and ratio(errors[0], errors[1], row["dtype"])[0] <= 1.0
    return ok


def _judge_dtype(row: MeasurementRow, what: str, policy: Policy) -> tuple[str, str]:
    """Another output dtype than torch.nn's: (the rejection, '') or ('', the accepted change)."""
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
                bad.append(f"{kind} block {Excess(tensor, 'max', got, tol, base)}")
        figures.append(f"{kind} block error ratio {worst:.2f}")
    said = f"output dtype {what} {regime}"
    if bad:
        return f"{said} changes the blocks a norm sits in: {'; '.join(bad)}", ""
    return "", f"{said}: accepted by consequence ({', '.join(figures)}; <= 1 passes)"


def worst_status(statuses: Sequence[Status]) -> Status:
    """The worst of the rows' statuses (``STATUSES``: worst first); skipped when none."""
    real = [s for s in STATUSES if s in statuses and s != "skipped"]
    return real[0] if real else "skipped"


def row_reasons(verdicts: Sequence[Verdict], *, regime: bool = True) -> list[str]:
    """The reasons of the rows not accepted, each once, prefixed by its dtype (and regime)."""
    reasons: list[str] = []
    for v in verdicts:
        for r in v.reasons if v.status != "accepted" else ():
            line = f"{v.dtype}/{v.regime}: {r}" if regime else f"{v.dtype}: {r}"
            if line not in reasons:
                reasons.append(line)
    return reasons


def report_of(verdicts: Sequence[Verdict], base: ReportBase, **more: Any) -> Report:
    """A candidate's report from its rows' verdicts: the worst of their statuses, their reasons."""
    status = worst_status([v.status for v in verdicts])
    return Report(
        status=status, reasons=row_reasons(verdicts), verdicts=list(verdicts), **base, **more
    )


# ---- in the worker: trying, dying, tampering, importing ------------------------------------------
def judge_tried(problem: Problem, cand: Candidate, tried: TryReply) -> str:
    """The reason of a candidate on a device it does not declare, with what trying it showed."""
    why = problem.reason
    if tried.interpreted:
        why += " (tried under Triton's interpreter, TRITON_INTERPRET=1)"
    if tried.ran:
        what = cand.note or "not as the kernel it is declared to be"
        return f"{why}; it ran here, but {what}, so it is not offered"
    return why + f"; trying it raised {tried.error}"


def died(
    status: Literal["crashed", "timeout"], reason: str, what: str, budget: tuple[str, float]
) -> Problem:
    """A worker that crashed or timed out while ``what`` ran; a timeout names its budget."""
    if status == "timeout":
        reason = f"{what}: {reason} ({budget[0]} budget {budget[1]:g} s)"
    return Problem(status, reason)


def tampered(what: str, names: Iterable[str]) -> Problem:
    """A library that replaced torch's own functions while ``what`` ran: refused."""
    return Problem(
        "rejected",
        f"{what} replaced torch's own {', '.join(names)}: a library that patches torch changes "
        "the maths of every other layer (and of the reference it is judged against), so it is "
        "refused",
    )


def failed_import(target: str, kind: ImportKind, error: str) -> Problem:
    """An import that raised: an ImportError means the library is absent, anything else broken."""
    status: Status = "unavailable" if kind == "import" else "crashed"
    return Problem(status, f"import of {target} failed: {error}")


def stopped(problem: Problem, base: ReportBase) -> Report:
    """The report on a candidate whose check stopped before any row."""
    return Report(status=problem.status, reasons=[problem.reason], **base)


# ---- the candidate -------------------------------------------------------------------------------
def judge_candidate(
    raw: CheckReply, cand: Candidate, slot: str, device: str, policy: Policy, base: ReportBase
) -> Report:
    """The verdict from the worker's measurements: the candidate's facts, then its rows."""
    early = _early_stop(raw, cand)
    if early is not None:
        return stopped(early, base)
    # a slot that does not measure its state dict's layout says none
    layout = Layout.from_json(raw.layout) if raw.layout is not None else Layout(True)
    if not layout.ok:
        return Report(status="rejected", reasons=[f"layout: {layout.problem()}"], **base)
    verdicts = [judge_row(cand.id, device, cand.semantics, row, policy) for row in raw.rows]
    report = report_of(
        verdicts, base, migration=layout.rules, blas=raw.blas, blas_default=raw.blas_default
    )
    init = list(raw.init)  # a changed initialisation: rejected, unless the policy accepts it
    if init and policy.allow_init_change:
        report.changes.extend(
            f"initialisation: {d} (accepted with --allow-init-change)" for d in init
        )
    elif init:
        report.reasons.insert(
            0,
            "initialisation differs from torch.nn's, so every model trained from scratch "
            f"changes: {'; '.join(init)} (pass --allow-init-change to accept and record it)",
        )
        report.status = "rejected" if report.status == "accepted" else report.status
    for v in verdicts:
        for change in v.changes:
            line = f"{v.dtype}/{v.regime}: {change}"
            if line not in report.changes:
                report.changes.append(line)
    return report


def _early_stop(raw: CheckReply, cand: Candidate) -> Problem | None:
    """The verdict of a check that stopped before any row (``raw.phase``)."""
    if raw.phase == "import":
        return failed_import(cand.target, raw.kind, raw.error)
    stops: dict[str, tuple[Status, str]] = {
        "baseline": ("skipped", raw.error),
        "build": ("crashed", f"building {cand.target} raised {raw.error}"),
        "blas": ("unavailable", f"BLAS library: {raw.error}"),
    }
    return Problem(*stops[raw.phase]) if raw.phase in stops else None


# ---- after timing --------------------------------------------------------------------------------
def judge_timing(report: Report, reply: TimeReply) -> None:
    """Tampering while timed rejects; so does a wrong check at a timed shape (its reason first)."""
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
