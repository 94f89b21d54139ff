"""Run the correctness kernels for every candidate of every slot, isolated, and time the accepted
ones.

Per candidate: what rules it out before anything is imported, the import (its own time budget: a
library that hangs on import costs ``IMPORT_TIMEOUT``), then the checks (``CHECK_TIMEOUT``, more for
torch.compile candidates, whose first calls compile), then, for the probe, the timing in the same
worker. Every verdict is the verdict module's (``judge``); this module only orchestrates: which
worker runs what, in which order, with which budget. ``check_and_time`` is the one loop that both
``kernel-probe check`` (no timing) and the probe (``pipeline``) run.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, cast

from kernel_lock.slots import DTYPES, dtype_named
from kernel_probe import slots as slot_behaviour
from kernel_probe.candidates import Candidate, default_for, for_slot
from kernel_probe.isolation.protocol import (
    INTERPRETED,
    CheckReply,
    CheckRequest,
    ImportReply,
    ImportRequest,
    TimeRequest,
    TimingProgressMessage,
    TryReply,
    TryRequest,
)
from kernel_probe.isolation.worker import Worker, WorkerDied, WorkerPool
from kernel_probe.probe import judge, repetitions
from kernel_probe.probe.choose import beats_default
from kernel_probe.probe.judge import Policy
from kernel_probe.probe.limits import CHECK_TIMEOUT, COMPILED_FACTOR, IMPORT_TIMEOUT, TIMING_TIMEOUT
from kernel_probe.probe.report import Problem, Report, ReportBase, report_base, static_problem

P = ParamSpec("P")


def parse_dtype(text: str) -> str:
    """The torch name of a dtype the command line names by its short or torch name (exit 2 if
    neither)."""
    from kernel_probe.errors import UsageError

    name = dtype_named(text)
    if name is None:
        shorts, names = ", ".join(d.short for d in DTYPES.values()), ", ".join(DTYPES)
        raise UsageError(f"unknown dtype {text!r}: use one of {shorts} (or {names})")
    return name


def dtype_plan(
    dtypes: Iterable[str], regimes: Iterable[str] = ("true", "mixed")
) -> list[tuple[str, str]]:
    """(dtype, regime) pairs: float32 only runs "true"; low precision runs plain and under
    autocast."""
    return [(d, r) for d in dtypes for r in regimes if not (d == "float32" and r == "mixed")]


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
    GPU's (``sm_90``, ``gfx90a``), checked against the candidate's ``archs``.

    Three steps, each once: what rules it out before anything is imported, what its worker says
    of it (:func:`_measure`: the worker's calls only), then the verdict on that (:func:`_verdict`:
    the judge's calls only)."""
    base = report_base(cand, slot, device)
    problem = static_problem(cand, slot, device, arch, with_compile=with_compile, detail=True)
    if problem is None:
        problem = slot_behaviour.slot(slot).static_problem(cand, canonical or {})
    if problem is not None and not problem.try_it:
        return Report(status=problem.status, reasons=[problem.reason], **base)
    said = _measure(
        cand,
        slot,
        device,
        worker,
        dtypes=tuple(plan),
        canonical=canonical,
        hidden=hidden,
        baseline=baseline,
        import_timeout=import_timeout,
        timeout=timeout,
        tried=problem is not None,
    )
    return _verdict(said, cand, slot, device, problem, base, canonical, policy)


@dataclass(frozen=True)
class _Said:
    """What a candidate's worker said of it, before any verdict: the reply to each request made
    (a candidate installed here that declares other devices is only tried), or how the worker died
    at the last one (``died``; an import or a check within ``budget`` s)."""

    tried: TryReply | None = None
    imported: ImportReply | None = None
    raw: CheckReply | None = None
    died: WorkerDied | None = None
    budget: float = 0.0


def _measure(
    cand: Candidate,
    slot: str,
    device: str,
    worker: Worker,
    *,
    dtypes: tuple[tuple[str, str], ...],
    canonical: Mapping[str, Any] | None,
    hidden: int | None,
    baseline: Candidate | None,
    import_timeout: float,
    timeout: float,
    tried: bool,
) -> _Said:
    """The worker's part of a check: the candidate tried once (``tried``: within the import's and
    the check's budgets together), or imported and, where that went well, checked at ``dtypes``
    (``timeout``, more for a torch.compile candidate, whose first calls compile)."""
    if tried:
        try:
            reply = worker.call(
                TryRequest(candidate=cand, slot=slot, device=device), import_timeout + timeout
            )
        except WorkerDied as exc:
            return _Said(died=exc)
        return _Said(tried=reply)
    try:
        imported = worker.call(ImportRequest(target=cand.target), import_timeout)
    except WorkerDied as exc:
        return _Said(died=exc, budget=import_timeout)
    if imported.tampered or not imported.ok:
        return _Said(imported=imported)
    budget = timeout * (COMPILED_FACTOR if cand.compiled else 1)
    try:
        # hidden: e.g. 64 (anemoi's QueryNorm/KeyNorm normalise over head_dim); baseline: the
        # reference torch.nn class (tests: a reference with CUDA's autocast policy)
        request = CheckRequest(
            candidate=cand,
            slot=slot,
            device=device,
            dtypes=dtypes,
            canonical=dict(canonical or {}),
            hidden=hidden,
            baseline=baseline,
        )
        raw = worker.call(request, budget)
    except WorkerDied as exc:
        return _Said(imported=imported, died=exc, budget=budget)
    return _Said(imported=imported, raw=raw)


def _verdict(
    said: _Said,
    cand: Candidate,
    slot: str,
    device: str,
    problem: Problem | None,
    base: ReportBase,
    canonical: Mapping[str, Any] | None,
    policy: Policy,
) -> Report:
    """The verdict on what the worker said (``_measure``), the judge's and the slots' verdict
    modules' (``problem``: why a tried candidate cannot be the kernel it is declared to be)."""

    def stopped(problem: Problem) -> Report:
        return Report(status=problem.status, reasons=[problem.reason], **base)

    if problem is not None:  # tried: it runs here, or how it fails
        if said.tried is None:
            assert said.died is not None
            why = f"{problem.reason}; trying it {said.died.status}: {said.died.reason}"
            return Report(status="unavailable", reasons=[why], **base)
        reason = judge.judge_tried(problem, cand, said.tried)
        return Report(
            status="unavailable", reasons=[reason], interpreted=said.tried.interpreted, **base
        )
    if said.imported is None:
        assert said.died is not None
        died, budget = said.died, ("import", said.budget)
        return stopped(judge.died(died.status, died.reason, f"importing {cand.target}", budget))
    if said.imported.tampered:
        return stopped(judge.tampered(f"importing {cand.target}", said.imported.tampered))
    if not said.imported.ok:
        return stopped(judge.failed_import(cand.target, said.imported.kind, said.imported.error))
    raw = said.raw
    if raw is None:
        assert said.died is not None
        died = said.died
        return stopped(judge.died(died.status, died.reason, "checks", ("check", said.budget)))
    if raw.tampered:
        return stopped(judge.tampered(f"running {cand.target}", raw.tampered))
    report = slot_behaviour.slot(slot).judge(raw, cand, device, base, canonical or {}, policy)
    if raw.interpreted:  # said on the report and on every verdict it carries
        report.interpreted = True
        report.verdicts = [
            dataclasses.replace(v, notes=(INTERPRETED, *v.notes)) for v in report.verdicts
        ]
    return report


@dataclass(frozen=True)
class Checks:
    """How every candidate is checked: the device, the (dtype, regime) rows, the budgets and the
    policy."""

    device: str
    plan: list[tuple[str, str]]
    arch: str = ""
    timeout: float = CHECK_TIMEOUT
    import_timeout: float = IMPORT_TIMEOUT
    with_compile: bool = False
    canonical: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per slot
    hidden: int | None = None
    policy: Policy = Policy()
    baselines: Mapping[str, Candidate] = field(default_factory=dict)  # per slot


def _no_progress(
    slot: str, cid: str, shapes: Sequence[str], message: TimingProgressMessage | None
) -> None:
    """``Timing.progress`` where nobody listens."""


@dataclass(frozen=True)
class Timing:
    """How the probe times each accepted candidate after its check, in the same worker."""

    shapes: tuple[str, ...]
    dtype: str
    regime: str
    reps: int
    # (slot, candidate id, the shapes it is timed at, None when its timing starts, else the
    # worker's progress message): ``Events.timing``
    progress: Callable[[str, str, Sequence[str], TimingProgressMessage | None], None] = _no_progress
    # per slot, the shapes it is timed at where not ``shapes`` (Plan.timed_at)
    timed_at: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # fixed: ``reps`` calls for every accepted candidate (``--reps`` given); else only what can
    # change the choice (kernel_probe.probe.repetitions), within ``budget_s`` per slot (None: the
    # device's)
    fixed: bool = False
    budget_s: float | None = None


@dataclass
class Checked:
    """One candidate for one slot after ``check_and_time``: its report, its timing rows (None when
    it was not timed) and the seconds its check and its timing took."""

    slot: str
    report: Report
    timings: list[dict[str, Any]] | None = (
        None  # the timing rows (``TimingRow``), as the lock records them
    )
    check_seconds: float = 0.0
    time_seconds: float = 0.0


def check_and_time(
    per_slot: Mapping[str, Sequence[Candidate]],
    checks: Checks,
    pool: WorkerPool,
    *,
    timing: Timing | None = None,
    refuse: Callable[[str, Candidate], str | None] = lambda slot, cand: None,
    checking: Callable[[str, str, int, int], None] = lambda slot, cid, index, total: None,
) -> Iterator[Checked]:
    """Every candidate of every slot checked, in its worker (torch's own share one, every other gets
    a fresh one), and with ``timing`` the accepted ones timed there too. ``refuse``: why a candidate
    is skipped without being checked (a profile that does not allow it); ``checking(slot, id, index,
    total)`` before each candidate (1-based)."""
    total = sum(len(cands) for cands in per_slot.values())
    index = 0
    # every library whose candidates will run starts its worker now and imports the first of them
    # while torch's own are checked (a library's import is seconds: liger-kernel's 4 s on 2 cores)
    pool.prepare(
        ahead=[
            c for slot, cands in per_slot.items() for c in cands if _runs(c, slot, checks, refuse)
        ]
    )
    for slot, cands in per_slot.items():
        done: list[tuple[Candidate, Checked]] = []
        for cand in cands:
            index += 1
            checking(slot, cand.id, index, total)
            why = refuse(slot, cand)
            if why:
                base = report_base(cand, slot, checks.device)
                checked = Checked(slot, Report(status="skipped", reasons=[why], **base))
            else:
                with pool.worker_for(cand) as worker:
                    checked = _check(cand, slot, checks, worker)
            if timing is None:
                yield checked
            else:
                done.append((cand, checked))
        if timing is not None:
            # every candidate of the slot is checked first: how many are accepted decides how much
            # timing can change the choice (kernel_probe.probe.repetitions)
            _time_slot(slot, done, checks, pool, timing)
            yield from (checked for _, checked in done)


def _runs(
    cand: Candidate, slot: str, checks: Checks, refuse: Callable[[str, Candidate], str | None]
) -> bool:
    """Whether checking ``cand`` will start its worker (not refused, not stopped before it)."""
    if refuse(slot, cand):
        return False
    problem = static_problem(
        cand, slot, checks.device, checks.arch, with_compile=checks.with_compile, detail=True
    )
    return problem is None or problem.try_it


def _time_slot(
    slot: str,
    done: Sequence[tuple[Candidate, Checked]],
    checks: Checks,
    pool: WorkerPool,
    timing: Timing,
) -> None:
    """The slot's accepted candidates timed in their workers: the default first, then the others
    decided against its samples; one sole accepted candidate gets one measured call."""
    timeable = [
        (c, d) for c, d in done if d.report.status == "accepted" and not d.report.interpreted
    ]
    default_id = default_for(slot).id
    # stable: the declared order after the default
    timeable.sort(key=lambda pair: pair[0].id != default_id)
    budget = (
        timing.budget_s
        if timing.budget_s is not None
        else repetitions.SLOT_BUDGET_S[_kind(checks.device)]
    )
    spent = 0.0
    against: dict[str, list[float]] | None = None
    first_options: dict[str, Any] = {}
    for i, (cand, checked) in enumerate(timeable):
        warmup = min(3, timing.reps) if checks.device != "cpu" or timing.fixed else 1
        options: dict[str, Any] = {
            "reps": timing.reps,
            "warmup": warmup,
            "min_seconds": 0.2 if checks.device != "cpu" else 0.0,
        }
        if timing.fixed:
            options["mode"] = "fixed"
        elif len(timeable) == 1:
            options["mode"] = "sole"
        else:
            share = max(budget - spent, 0.0) / (len(timeable) - i)
            options.update(
                mode="adaptive", budget_s=share, against=against if cand.id != default_id else None
            )
        with pool.worker_for(cand) as worker:
            _time(cand, slot, checks, worker, timing, checked, options)
        spent += checked.time_seconds
        if cand.id == default_id and checked.timings:
            against = {r["shape"]: list(r["samples"]) for r in checked.timings if r.get("samples")}
            first_options = options
    if timeable and timeable[0][0].id == default_id and len(timeable) > 1:
        _rematch(slot, timeable, checks, pool, timing, first_options)


def _rematch(
    slot: str,
    timeable: Sequence[tuple[Candidate, Checked]],
    checks: Checks,
    pool: WorkerPool,
    timing: Timing,
    options: Mapping[str, Any],
) -> None:
    """When a candidate beat the default's first run, the default is timed again, after every
    other candidate, with its first run's options, and each shape keeps the faster of its two runs
    (``timed = "rematch"``). The first candidate timed in a worker pays for what only warms up later
    (thread pools, the allocator, clocks): on a loaded 2-core CPU torch.sdpa, timed first, came out
    1.36x slower than torch.sdpa.flash, the same kernel there. So a candidate replaces the default
    only by beating it both before and after its own timing."""
    default_cand, default = timeable[0]
    shapes = timing.timed_at.get(slot, timing.shapes)
    if timing.fixed or not default.timings or default.report.status != "accepted":
        return
    winner = next(
        (
            cand.id
            for cand, checked in timeable[1:]
            if checked.report.status == "accepted"
            and beats_default(checked.timings, default.timings, shapes)
        ),
        None,
    )
    if winner is None:
        return
    first, first_seconds = default.timings, default.time_seconds
    with pool.worker_for(default_cand) as worker:
        _time(default_cand, slot, checks, worker, timing, default, options)
    default.time_seconds += first_seconds
    if default.report.status != "accepted" or not default.timings:
        default.timings = first  # its failure is in its report: the rule-out is the judge's
        return
    default.timings = faster_runs(first, default.timings)


def faster_runs(
    first: Sequence[Mapping[str, Any]], second: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per shape, the row of the faster of two runs of the default (an error row never wins), each
    marked ``timed = "rematch"``.

    >>> a = [{"shape": "8x4", "median_ms": 2.0, "timed": "baseline"}]
    >>> b = [{"shape": "8x4", "median_ms": 1.5, "timed": "baseline"}]
    >>> faster_runs(a, b)
    [{'shape': '8x4', 'median_ms': 1.5, 'timed': 'rematch'}]
    >>> faster_runs(a, [{"shape": "8x4", "error": "RuntimeError: out of memory"}])[0]["median_ms"]
    2.0
    """
    again = {r["shape"]: r for r in second if "error" not in r}
    out: list[dict[str, Any]] = []
    for row in first:
        other = again.get(row["shape"])
        if other is not None and ("error" in row or other["median_ms"] < row["median_ms"]):
            row = other
        out.append({**row, "timed": "rematch"} if "error" not in row else dict(row))
    return out


def _kind(device: str) -> str:
    return "cpu" if device == "cpu" else "gpu"


def _check(cand: Candidate, slot: str, checks: Checks, worker: Worker) -> Checked:
    """One candidate checked in its worker."""
    t0 = time.perf_counter()
    report = check_candidate(
        cand,
        slot,
        checks.device,
        checks.plan,
        worker,
        arch=checks.arch,
        timeout=checks.timeout,
        import_timeout=checks.import_timeout,
        with_compile=checks.with_compile,
        canonical=checks.canonical.get(slot),
        hidden=checks.hidden,
        policy=checks.policy,
        baseline=checks.baselines.get(slot),
    )
    return Checked(slot, report, check_seconds=time.perf_counter() - t0)


def _time(
    cand: Candidate,
    slot: str,
    checks: Checks,
    worker: Worker,
    timing: Timing,
    done: Checked,
    options: Mapping[str, Any],
) -> None:
    """One accepted candidate timed in its worker (``options``: ``timing.time_candidate``'s)."""
    report = done.report
    t1 = time.perf_counter()
    shapes = timing.timed_at.get(slot, timing.shapes)
    timing.progress(slot, cand.id, shapes, None)
    request = TimeRequest(
        candidate=cand,
        slot=slot,
        device=checks.device,
        shapes=shapes,
        dtype=timing.dtype,
        regime=timing.regime,
        progress=True,
        canonical=dict(checks.canonical.get(slot) or {}),
        options=dict(options),
    )
    try:
        reply = worker.call(
            request, TIMING_TIMEOUT, on_progress=lambda m: timing.progress(slot, cand.id, shapes, m)
        )
        if not reply.tampered:
            done.timings = [cast(dict[str, Any], row) for row in reply.rows]
        judge.judge_timing(report, reply)
    except WorkerDied as exc:
        judge.judge_timing_died(report, exc.status, exc.reason)
    done.time_seconds = time.perf_counter() - t1


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
    """Verdicts for every candidate of every slot (``check_and_time`` without timing)."""
    checks = Checks(
        device,
        plan,
        arch=arch,
        timeout=timeout,
        import_timeout=import_timeout,
        with_compile=with_compile,
        canonical=canonical or {},
        hidden=hidden,
        policy=policy,
        baselines=baselines or {},
    )
    per_slot = {slot: for_slot(candidates, slot) for slot in slots}
    out: dict[str, list[Report]] = {slot: [] for slot in per_slot}
    own = workers is None
    pool = workers or WorkerPool()
    try:
        checking = (
            (lambda slot, cid, index, total: progress(slot, cid)) if progress else (lambda *_: None)
        )
        for done in check_and_time(per_slot, checks, pool, checking=checking):
            out[done.slot].append(done.report)
        return out
    finally:
        if own:
            pool.close()
