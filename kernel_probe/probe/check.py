"""Check every candidate of every slot in its worker, and time the accepted ones there: which
worker runs what, in which order, with which budget (verdicts are the judge's). ``check_and_time``
is the one loop of both ``kernel-probe check`` and the probe.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, cast

from kernel_lock.slots import DTYPES, dtype_named
from kernel_probe import slots as slot_behaviour
from kernel_probe.candidates import Candidate, default_for, for_slot, local_modules
from kernel_probe.detect import host
from kernel_probe.errors import UsageError
from kernel_probe.isolation.protocol import (
    INTERPRETED,
    CheckRequest,
    ImportReply,
    ImportRequest,
    TimeRequest,
    TimingProgressMessage,
    TryRequest,
)
from kernel_probe.isolation.worker import Worker, WorkerDied, WorkerPool
from kernel_probe.probe import judge, repetitions
from kernel_probe.probe.judge import Policy, stopped
from kernel_probe.probe.limits import CHECK_TIMEOUT, COMPILED_FACTOR, IMPORT_TIMEOUT, TIMING_TIMEOUT
from kernel_probe.probe.report import Report, report_base, static_problem

P = ParamSpec("P")


def parse_dtype(text: str) -> str:
    """The torch name of a dtype named by its short or torch name (exit 2 if neither)."""
    name = dtype_named(text)
    if name is None:
        shorts, names = ", ".join(d.short for d in DTYPES.values()), ", ".join(DTYPES)
        raise UsageError(f"unknown dtype {text!r}: use one of {shorts} (or {names})")
    return name


def dtype_plan(
    dtypes: Iterable[str], regimes: Iterable[str] = ("true", "mixed")
) -> list[tuple[str, str]]:
    """(dtype, regime) pairs: float32 only runs "true"; low precision plain and under autocast."""
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
    """The verdict on one candidate for one slot, timed (``baseline``: torch.nn's class, tests)."""
    base = report_base(cand, slot, device)
    canonical = canonical or {}
    problem = static_problem(cand, slot, device, arch, with_compile=with_compile, detail=True)
    if problem is None:
        problem = slot_behaviour.slot(slot).static_problem(cand, canonical)
    if problem is not None and problem.try_it:  # installed here, declared for other devices
        try:
            trying = TryRequest(candidate=cand.to_json(), slot=slot, device=device)
            tried = worker.call(trying, import_timeout + timeout)
        except WorkerDied as exc:
            why = f"{problem.reason}; trying it {exc.status}: {exc.reason}"
            return Report(status="unavailable", reasons=[why], **base)
        why = judge.judge_tried(problem, cand, tried)
        return Report(status="unavailable", reasons=[why], interpreted=tried.interpreted, **base)
    if problem is not None:
        return stopped(problem, base)
    try:
        imported: ImportReply = worker.call(ImportRequest(target=cand.target), import_timeout)
    except WorkerDied as exc:
        what, budget = f"importing {cand.target}", ("import", import_timeout)
        return stopped(judge.died(exc.status, exc.reason, what, budget), base)
    if imported.tampered:
        return stopped(judge.tampered(f"importing {cand.target}", imported.tampered), base)
    if not imported.ok:
        return stopped(judge.failed_import(cand.target, imported.kind, imported.error), base)
    seconds = timeout * (COMPILED_FACTOR if cand.compiled else 1)
    request = CheckRequest(
        candidate=cand.to_json(),
        slot=slot,
        device=device,
        dtypes=tuple(plan),
        canonical=dict(canonical),
        hidden=hidden,
        baseline=None if baseline is None else baseline.to_json(),
    )
    try:
        raw = worker.call(request, seconds)
    except WorkerDied as exc:
        return stopped(judge.died(exc.status, exc.reason, "checks", ("check", seconds)), base)
    if raw.tampered:
        return stopped(judge.tampered(f"running {cand.target}", raw.tampered), base)
    report = slot_behaviour.slot(slot).judge(raw, cand, device, base, canonical, policy)
    if raw.interpreted:  # said on the report and on every verdict it carries
        report.interpreted = True
        report.verdicts = [
            dataclasses.replace(v, notes=(INTERPRETED, *v.notes)) for v in report.verdicts
        ]
    return report


@dataclass(frozen=True)
class Checks:
    """How every candidate is checked: the device, the (dtype, regime) rows, budgets, policy."""

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


# (slot, candidate id, its shapes, None when its timing starts, else the worker's progress message)
OnTiming = Callable[[str, str, Sequence[str], TimingProgressMessage | None], None]


@dataclass(frozen=True)
class Timing:
    """How the probe times each accepted candidate after its check, in its worker. ``timed_at``: a
    slot's own shapes; ``fixed``: ``reps`` calls each (``--reps``), else what can change the choice
    (``repetitions``) within ``budget_s`` per slot (None: the device's); ``weights``: a model's
    calls per forward at each shape, per slot (the rounds' ratios are of the model's time)."""

    shapes: tuple[str, ...]
    dtype: str
    regime: str
    reps: int
    progress: OnTiming = lambda slot, cid, shapes, message: None
    timed_at: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    fixed: bool = False
    budget_s: float | None = None
    weights: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # a model's, per slot


@dataclass
class Checked:
    """One candidate after ``check_and_time``: report, timing rows (None: not timed), seconds."""

    slot: str
    report: Report
    timings: list[dict[str, Any]] | None = None
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
    """Every candidate checked in its worker (torch's own share one), with ``timing`` the accepted
    ones timed there. ``refuse``: why one is skipped unchecked; ``checking(slot, id, index,
    total)`` before each (1-based)."""
    total = sum(len(cands) for cands in per_slot.values())
    index = 0
    # every library that will run starts its worker now and imports its first candidate while
    # torch's own are checked (liger-kernel's import: 4 s on 2 cores)
    ahead = [c for slot, cands in per_slot.items() for c in cands if _runs(c, slot, checks, refuse)]
    pool.prepare(ahead=ahead)
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
                same = {k: v for k, v in vars(checks).items() if k not in ("device", "plan")}
                same.update(
                    canonical=checks.canonical.get(slot), baseline=same.pop("baselines").get(slot)
                )
                with pool.worker_for(cand) as worker:
                    t0 = time.perf_counter()
                    report = check_candidate(cand, slot, checks.device, checks.plan, worker, **same)
                    checked = Checked(slot, report, check_seconds=time.perf_counter() - t0)
            if timing is None:
                yield checked
            else:
                done.append((cand, checked))
        if timing is not None:  # how many are accepted decides how much timing can change
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
    """The slot's accepted candidates timed: a sole one once (nothing to compare); else each other
    against the default in paired rounds (``repetitions``), the default first in the first."""
    default_id = default_for(slot).id
    timeable = [
        (c, d) for c, d in done if d.report.status == "accepted" and not d.report.interpreted
    ]
    timeable.sort(key=lambda pair: pair[0].id != default_id)  # stable: declared order after it
    gpu = checks.device != "cpu"
    warmup = min(3, timing.reps) if gpu or timing.fixed else 1
    first: dict[str, Any] = {"reps": timing.reps, "warmup": warmup, "mode": "fixed"}
    first["min_seconds"] = 0.2 if gpu else 0.0
    timer = _SlotTimer(slot, checks, pool, timing)
    if len(timeable) == 1:
        timer.time(*timeable[0], first if timing.fixed else first | {"mode": "sole"})
    elif timeable:
        n = repetitions.block(timing.reps)
        first.update(reps=n, max_reps=n, min_seconds=0.0)
        later = first | {"warmup": 0, "check": False, "first": False}
        timer.rounds(timeable, (first, later))


@dataclass(frozen=True)
class _SlotTimer:
    """Where and how one slot's accepted candidates are timed."""

    slot: str
    checks: Checks
    pool: WorkerPool
    timing: Timing

    @property
    def shapes(self) -> tuple[str, ...]:
        return self.timing.timed_at.get(self.slot, self.timing.shapes)

    def rounds(
        self,
        timeable: Sequence[tuple[Candidate, Checked]],
        options: tuple[dict[str, Any], dict[str, Any]],
    ) -> None:
        """Paired rounds: per round, per candidate still undecided, a block of the default and one
        of it (the order swapped every round), until each is decided or futile (``--reps N``: N
        calls each, in ``MIN_ROUNDS`` rounds at least, all of them) or the slot's budget ends."""
        (base_cand, base), rest = timeable[0], list(timeable[1:])
        timing, weights = self.timing, self.timing.weights.get(self.slot)
        kind = "gpu" if self.checks.device != "cpu" else "cpu"
        budget = repetitions.SLOT_BUDGET_S[kind] if timing.budget_s is None else timing.budget_s
        rounds = repetitions.MAX_ROUNDS
        if timing.fixed:  # N calls, in at least the rounds an interval takes (fewer decide nothing)
            rounds = max(repetitions.MIN_ROUNDS, -(-timing.reps // options[0]["reps"]))
        started, how = time.perf_counter(), "fixed" if timing.fixed else "max-rounds"
        for r in range(rounds):
            for cand, checked in rest:
                pair = [(base_cand, base), (cand, checked)][:: -1 if r % 2 else 1]
                got = {c.id: self.time(c, d, options[d.timings is not None]) for c, d in pair}
                _pair(checked, got[base_cand.id], got[cand.id])
            rest = [(c, d) for c, d in rest if _timed_ok(d)]
            if not timing.fixed:
                rest = [(c, d) for c, d in rest if not _settled(d, self.shapes, weights)]
            if not timing.fixed and time.perf_counter() - started >= budget:
                how = "budget"
            if not rest or not _timed_ok(base) or how == "budget":
                break
        for _, checked in timeable[1:]:
            left = timing.fixed or any(checked is d for _, d in rest)
            said = how if left else _settled(checked, self.shapes, weights) or how
            for row in checked.timings or ():
                row["timed"] = said
        for row in base.timings or ():
            row["timed"] = "default"

    def time(
        self, cand: Candidate, done: Checked, options: Mapping[str, Any]
    ) -> list[dict[str, Any]] | None:
        """One accepted candidate timed in its worker (``options``: ``timing.time_candidate``'s),
        with the load seen meanwhile; its rows merged into ``done``'s (``merged``) and returned
        (None: no rows; the report says why)."""
        t1, slot, timing, shapes = time.perf_counter(), self.slot, self.timing, self.shapes
        first = done.timings is None  # later rounds' blocks are not announced: one line each
        if first:
            timing.progress(slot, cand.id, shapes, None)
        request = TimeRequest(
            candidate=cand.to_json(),
            slot=slot,
            device=self.checks.device,
            shapes=tuple(shapes),
            dtype=timing.dtype,
            regime=timing.regime,
            options=dict(options),
            progress=first,
            canonical=dict(self.checks.canonical.get(slot) or {}),
        )
        rows = None
        with self.pool.worker_for(cand) as worker:
            load = host.Load(gpu=self.checks.device != "cpu")
            try:
                reply = worker.call(
                    request,
                    TIMING_TIMEOUT,
                    on_progress=lambda m: timing.progress(slot, cand.id, shapes, m),
                )
                if not reply.tampered:
                    seen = load.seen()
                    rows = [{**cast(dict[str, Any], row), **seen} for row in reply.rows]
                judge.judge_timing(done.report, reply)
            except WorkerDied as exc:
                judge.judge_timing_died(done.report, exc.status, exc.reason)
        done.time_seconds += time.perf_counter() - t1
        if rows is not None:
            done.timings = rows if done.timings is None else merged(done.timings, rows)
        return rows


def _timed_ok(checked: Checked) -> bool:
    return (
        checked.report.status == "accepted"
        and bool(checked.timings)
        and all("error" not in row for row in checked.timings or ())
    )


def _settled(checked: Checked, shapes: Sequence[str], weights: Mapping[str, int] | None) -> str:
    """Why no more rounds: "decided", "futile" (``Ratio.futile``); "" while more could decide."""
    ratio = repetitions.paired(checked.timings or (), shapes, weights)
    if ratio is None:
        return ""
    return "decided" if ratio.decided else "futile" if ratio.futile else ""


def _pair(
    checked: Checked, base: list[dict[str, Any]] | None, own: list[dict[str, Any]] | None
) -> None:
    """One round's pair of blocks, per shape: the default's block median and the candidate's (ms),
    appended to the candidate's row's ``pairs``."""
    if not base or not own or not checked.timings:
        return
    medians = [
        {r["shape"]: 1e3 * statistics.median(r["samples"]) for r in rows if r.get("samples")}
        for rows in (base, own)
    ]
    for row in checked.timings:
        shape = row["shape"]
        if shape in medians[0] and shape in medians[1] and "error" not in row:
            row.setdefault("pairs", []).append([medians[0][shape], medians[1][shape]])


RATES = ("gbps", "tflops", "copy_percent")  # a row's figures that are some amount / its median


def merged(
    rows: Sequence[Mapping[str, Any]], block: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A candidate's rows with one more block's samples, per shape: the median, spread and count
    of all, the rates rescaled to that median, the most load seen; an error in either is the row.

    >>> a = [{"shape": "8x4", "samples": [0.002], "median_ms": 2.0, "gbps": 3.0}]
    >>> b = [{"shape": "8x4", "samples": [0.004, 0.004], "median_ms": 4.0, "busy_processes": 1}]
    >>> m = merged(a, b)[0]
    >>> m["median_ms"], m["reps"], m["gbps"], m["busy_processes"]
    (4.0, 3, 1.5, 1)
    """
    more = {r["shape"]: r for r in block}
    out: list[dict[str, Any]] = []
    for row in rows:
        extra = more.get(row["shape"])
        if extra is None or "error" in row or "error" in extra:
            out.append(dict(row if extra is None or "error" in row else extra))
            continue
        samples = [*row["samples"], *extra["samples"]]
        median = 1e3 * statistics.median(samples)
        new = {**row, "samples": samples, "median_ms": median, "reps": len(samples)}
        new["spread"] = repetitions.spread(samples)
        new.update({k: row[k] * row["median_ms"] / median for k in RATES if k in row})
        for key in ("load_average", "busy_processes", "gpu_processes"):
            if key in extra:
                new[key] = max(row.get(key, 0), extra[key])
        out.append(new)
    return out


def check_all(
    slots: Iterable[str],
    candidates: list[Candidate],
    device: str,
    plan: list[tuple[str, str]],
    *,
    workers: WorkerPool | None = None,
    progress: Callable[[str, str], None] | None = None,
    **options: Any,
) -> dict[str, list[Report]]:
    """Verdicts for every candidate of every slot; ``options``: :class:`Checks`' fields."""
    checks = Checks(device, plan, **{k: v for k, v in options.items() if v is not None})
    per_slot = {slot: for_slot(candidates, slot) for slot in slots}
    out: dict[str, list[Report]] = {slot: [] for slot in per_slot}
    pool = workers or WorkerPool(local=local_modules(candidates))
    try:
        for done in check_and_time(
            per_slot,
            checks,
            pool,
            checking=lambda slot, cid, index, total: progress(slot, cid) if progress else None,
        ):
            out[done.slot].append(done.report)
        return out
    finally:
        if workers is None:
            pool.close()
