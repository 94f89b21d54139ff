"""Run the correctness kernels for every candidate of every slot, isolated, and collect verdicts.

Per candidate: the import (its own time budget: a library that hangs on import costs
``IMPORT_TIMEOUT``), then the checks (``CHECK_TIMEOUT``, more for torch.compile candidates, whose
first calls compile), then the verdict: the rows judged by ``judge``, and the candidate-level facts
decided here — a state dict with no mapping onto torch.nn's, an initialisation that differs.
"""

from __future__ import annotations

import functools
import importlib.util
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, ParamSpec, TypedDict

from kernel_lock.slots import SLOT_SEMANTICS
from kernel_probe.isolation.protocol import INTERPRETED, CheckReply, CheckRequest, ImportRequest, TryRequest
from kernel_probe.isolation.worker import Worker, WorkerDied, WorkerPool
from kernel_probe.probe.candidates import Candidate, for_slot
from kernel_probe.probe.judge import Policy, Verdict, judge_row, worst_status
from kernel_probe.probe.layout import Layout
from kernel_probe.probe.limits import CHECK_TIMEOUT, COMPILED_FACTOR, IMPORT_TIMEOUT  # noqa: F401 (still importable from here)

P = ParamSpec("P")

DTYPE_NAMES = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
}
ALL_DTYPES = ("float32", "bfloat16", "float16")


def parse_dtype(text: str) -> str:
    from kernel_probe.errors import UsageError

    key = text.strip().lower()
    if key not in DTYPE_NAMES:
        raise UsageError(f"unknown dtype {text!r}: use one of fp32, bf16, fp16 (or float32, bfloat16, float16)")
    return DTYPE_NAMES[key]


def dtype_plan(dtypes: Iterable[str], regimes: Iterable[str] = ("true", "mixed")) -> list[tuple[str, str]]:
    """(dtype, regime) pairs: float32 only runs "true"; low precision runs plain and under autocast."""
    plan = []
    for d in dtypes:
        for r in regimes:
            if d == "float32" and r == "mixed":
                continue
            plan.append((d, r))
    return plan


class ReportBase(TypedDict):
    """What every ``Report`` on one candidate for one slot shares, whatever the verdict."""

    id: str
    target: str
    slot: str
    semantics: str
    device: str
    source: str
    candidate: Candidate


@dataclass
class Report:
    """Everything the probe knows about one candidate for one slot on one device."""

    id: str
    target: str
    slot: str
    semantics: str
    device: str
    status: str
    reasons: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    source: str = "builtin"
    candidate: Candidate | None = None
    seconds: float | None = None  # wall time of this candidate's import and checks
    migration: tuple[str, ...] = ()  # its state dict onto torch.nn's (the layout's rules)
    changes: list[str] = field(default_factory=list)  # accepted changes besides numbers, recorded in the lock
    interpreted: bool = False  # its Triton kernels ran in Triton's interpreter: never timed, never locked
    blas: str = ""  # a Linear on a GPU: the BLAS library it was checked under (kernel_lock.blas)
    blas_default: str = ""  # the library torch picked by itself in the probe's worker

    @property
    def deterministic(self) -> bool | None:
        """True when every measured row was bitwise repeatable; None when nothing was measured."""
        measured = [v.deterministic for v in self.verdicts if v.deterministic is not None]
        return all(measured) if measured else None

    @property
    def twin(self) -> dict[str, Any]:
        """The twin check of the first accepted row (they agree across rows in practice)."""
        for v in self.verdicts:
            if v.status == "accepted" and v.twin:
                return v.twin
        return {}

    def worst_ratio(self) -> float | None:
        ratios = [v.worst_ratio for v in self.verdicts if v.worst_ratio is not None]
        return max(ratios) if ratios else None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "target": self.target,
            "device": self.device,
            "status": self.status,
            "reasons": self.reasons,
            "source": self.source,
            "worst_error_ratio": self.worst_ratio(),
            "deterministic": self.deterministic,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "migration": list(self.migration),
            "changes": list(self.changes),
            "interpreted": self.interpreted,
            "blas": self.blas,
            "twin": self.twin,
            "evidence": [v.to_json() for v in self.verdicts],
        }


def installed(cand: Candidate, device: str = "") -> str | None:
    """None if the candidate's library is present (by metadata / find_spec, no import); else why not,
    with the way to install it for ``device`` (or that there is none)."""
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
    hint = cand.install_hint(device)
    return f"not installed: {what}" + (f" ({hint})" if hint else f" (no build for {device})" if device else "")


def static_problem(
    cand: Candidate, slot: str, device: str, arch: str = "", *, with_compile: bool = False
) -> tuple[str, str] | None:
    """(status, reason) when ``cand`` certainly cannot be checked for ``slot`` here, from what is known
    without importing anything (semantics, device type, GPU arch, installed, torch.compile on CPU);
    None when it is worth checking. The command line uses it to refuse a --pin before any work."""
    expected = SLOT_SEMANTICS[slot]
    if cand.semantics != expected:
        return "rejected", f"semantics: {cand.semantics} != {expected}"
    if cand.devices and device not in cand.devices:
        return "unavailable", f"runs on {', '.join(cand.devices)}; this device is {device}"
    wrong_arch = cand.arch_problem(device, arch)
    if wrong_arch:
        return "unavailable", wrong_arch
    missing = installed(cand, device)
    if missing:
        return "unavailable", missing
    if cand.compiled and device == "cpu" and not with_compile:
        return "skipped", (
            "torch.compile candidates are not probed on CPU by default (each shape and dtype costs "
            "seconds of C++ compilation); pass --with-compile to include them"
        )
    return None


def _is_installed(cand: Candidate) -> bool:
    return installed(cand) is None


def _with_reasons(report: Report) -> Report:
    reasons: list[str] = []
    for v in report.verdicts:
        if v.status != "accepted":
            for r in v.reasons:
                line = f"{v.dtype}/{v.regime}: {r}"
                if line not in reasons:
                    reasons.append(line)
    report.reasons = reasons + report.reasons
    return report


def _timed(check: Callable[P, Report]) -> Callable[P, Report]:
    """``check`` with the wall time it took recorded in the report's ``seconds``."""

    @functools.wraps(check)
    def timed(*args: P.args, **kwargs: P.kwargs) -> Report:
        start = time.perf_counter()
        report = check(*args, **kwargs)
        report.seconds = time.perf_counter() - start
        return report

    return timed


@_timed
def check_candidate(
    cand: Candidate,
    slot: str,
    device: str,
    plan: list[tuple[str, str]],
    worker: Worker,
    *,
    arch: str = "",
    timeout: float = CHECK_TIMEOUT,
    import_timeout: float = IMPORT_TIMEOUT,
    with_compile: bool = False,
    canonical: Mapping[str, Any] | None = None,
    hidden: int | None = None,
    policy: Policy = Policy(),
    baseline: Candidate | None = None,
) -> Report:
    """The verdict on one candidate for one slot; ``seconds`` says how long it took. ``arch`` is the
    GPU's (``sm_90``, ``gfx90a``), checked against the candidate's ``archs``."""
    base = ReportBase(
        id=cand.id,
        target=cand.target,
        slot=slot,
        semantics=cand.semantics,
        device=device,
        source=cand.source,
        candidate=cand,
    )
    expected = SLOT_SEMANTICS[slot]
    if cand.semantics != expected:
        return Report(status="rejected", reasons=[f"semantics: {cand.semantics} != {expected}"], **base)
    # what the hardware rules out comes before "not installed": no advice to install what cannot run here
    if cand.devices and device not in cand.devices:
        why = f"runs on {', '.join(cand.devices)}; this device is {device}"
        if cand.blas:  # a BLAS library belongs to its platform: nothing to learn from trying it here
            return Report(
                status="unavailable", reasons=[f"{why} ({cand.blas} is a {cand.devices[0]} BLAS library)"], **base
            )
        if not _is_installed(cand):
            return Report(status="unavailable", reasons=[why + " (and it is not installed)"], **base)
        interpreted = False
        try:
            tried = worker.call(TryRequest(candidate=cand, slot=slot, device=device), import_timeout + timeout)
            interpreted = tried.interpreted
            if interpreted:
                why += " (tried under Triton's interpreter, TRITON_INTERPRET=1)"
            if tried.ran:
                why += (
                    "; it ran here, but "
                    + (cand.note or "not as the kernel it is declared to be")
                    + ", so it is not offered"
                )
            else:
                why += f"; trying it raised {tried.error}"
        except WorkerDied as exc:
            why += f"; trying it {exc.status}: {exc.reason}"
        return Report(status="unavailable", reasons=[why], interpreted=interpreted, **base)
    wrong_arch = cand.arch_problem(device, arch)
    if wrong_arch:
        installed_note = "" if _is_installed(cand) else " (and it is not installed)"
        return Report(status="unavailable", reasons=[wrong_arch + installed_note], **base)
    missing = installed(cand, device)
    if missing:
        return Report(status="unavailable", reasons=[missing], **base)
    if cand.compiled and device == "cpu" and not with_compile:
        status, reason = static_problem(cand, slot, device, arch, with_compile=with_compile) or ("skipped", "")
        return Report(status=status, reasons=[reason], **base)
    try:
        imported = worker.call(ImportRequest(target=cand.target), import_timeout)
    except WorkerDied as exc:
        return Report(
            status=exc.status,
            reasons=[
                f"importing {cand.target}: {exc.reason} (import budget {import_timeout:g} s)"
                if exc.status == "timeout"
                else exc.reason
            ],
            **base,
        )
    if imported.tampered:
        return Report(status="rejected", reasons=[_tampered(f"importing {cand.target}", imported.tampered)], **base)
    if not imported.ok:
        status = "unavailable" if imported.kind == "import" else "crashed"
        return Report(status=status, reasons=[f"import of {cand.target} failed: {imported.error}"], **base)
    budget = timeout * (COMPILED_FACTOR if cand.compiled else 1)
    try:
        # hidden: e.g. 64 (anemoi's QueryNorm/KeyNorm normalise over head_dim); baseline: the reference
        # torch.nn class (tests: a reference with CUDA's autocast policy)
        request = CheckRequest(
            candidate=cand,
            slot=slot,
            device=device,
            dtypes=tuple(plan),
            canonical=dict(canonical or {}),
            hidden=hidden,
            baseline=baseline,
        )
        raw = worker.call(request, budget)
    except WorkerDied as exc:
        reason = f"checks: {exc.reason} (check budget {budget:g} s)" if exc.status == "timeout" else exc.reason
        return Report(status=exc.status, reasons=[reason], **base)
    if raw.tampered:
        return Report(status="rejected", reasons=[_tampered(f"running {cand.target}", raw.tampered)], **base)
    report = judge_candidate(raw, cand, slot, device, policy, base)
    if raw.interpreted:  # said on the report and on every verdict it carries
        report.interpreted = True
        for v in report.verdicts:
            v.notes.insert(0, INTERPRETED)
    return report


def _tampered(what: str, names: Iterable[str]) -> str:
    return (
        f"{what} replaced torch's own {', '.join(names)}: a library that patches torch changes the maths of "
        "every other layer (and of the reference it is judged against), so it is refused"
    )


def judge_candidate(
    raw: CheckReply, cand: Candidate, slot: str, device: str, policy: Policy, base: ReportBase
) -> Report:
    """The verdict from the worker's measurements: candidate-level facts first, then the rows."""
    phase = raw.phase
    if phase == "import":
        status = "unavailable" if raw.kind == "import" else "crashed"
        return Report(status=status, reasons=[f"import of {cand.target} failed: {raw.error}"], **base)
    if phase == "baseline":
        return Report(status="skipped", reasons=[raw.error], **base)
    if phase == "build":
        return Report(status="crashed", reasons=[f"building {cand.target} raised {raw.error}"], **base)
    if phase == "blas":
        return Report(status="unavailable", reasons=[f"BLAS library: {raw.error}"], **base)
    layout = Layout.from_json(raw.layout or {})
    if not layout.ok:
        return Report(status="rejected", reasons=[f"layout: {layout.problem()}"], **base)
    verdicts = [judge_row(cand.id, device, cand.semantics, row, policy) for row in raw.rows]
    report = Report(
        status=worst_status([v.status for v in verdicts]),
        verdicts=verdicts,
        migration=layout.rules,
        blas=raw.blas,
        blas_default=raw.blas_default,
        **base,
    )
    report = _with_reasons(report)
    init = list(raw.init)
    if init:
        if policy.allow_init_change:
            report.changes.extend(f"initialisation: {d} (accepted with --allow-init-change)" for d in init)
        else:
            report.reasons.insert(
                0,
                "initialisation differs from torch.nn's, so every model trained from scratch "
                f"changes: {'; '.join(init)} (pass --allow-init-change to accept and record it)",
            )
            if report.status == "accepted":
                report.status = "rejected"
    for v in verdicts:
        for change in v.changes:
            line = f"{v.dtype}/{v.regime}: {change}"
            if line not in report.changes:
                report.changes.append(line)
    return report


def check_all(
    slots: Iterable[str],
    candidates: list[Candidate],
    device: str,
    plan: list[tuple[str, str]],
    *,
    arch: str = "",
    timeout: float = CHECK_TIMEOUT,
    import_timeout: float = IMPORT_TIMEOUT,
    with_compile: bool = False,
    workers: WorkerPool | None = None,
    canonical: Mapping[str, Mapping[str, Any]] | None = None,
    hidden: int | None = None,
    policy: Policy = Policy(),
    baselines: Mapping[str, Candidate] | None = None,
    progress: Callable[[str, str], None] | None = None,
) -> dict[str, list[Report]]:
    """Verdicts for every candidate of every slot: torch's own share one worker, every other
    candidate gets a fresh one (``WorkerPool``)."""
    own = workers is None
    pool = workers or WorkerPool()
    try:
        pool.prepare()  # start it now: its start-up (importing torch) is no candidate's time
        out: dict[str, list[Report]] = {}
        for slot in slots:
            out[slot] = []
            for cand in for_slot(candidates, slot):
                if progress:
                    progress(slot, cand.id)
                with pool.worker_for(cand) as worker:
                    out[slot].append(
                        check_candidate(
                            cand,
                            slot,
                            device,
                            plan,
                            worker,
                            arch=arch,
                            timeout=timeout,
                            import_timeout=import_timeout,
                            with_compile=with_compile,
                            canonical=(canonical or {}).get(slot),
                            hidden=hidden,
                            policy=policy,
                            baseline=(baselines or {}).get(slot),
                        )
                    )
        return out
    finally:
        if own:
            pool.close()
