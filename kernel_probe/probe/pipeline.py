"""The probe as a library: a typed request in, a typed result out.

    result = pipeline.run(ProbeRequest(out=Path("kernel-lock.toml"), shapes=("40320x1024",)))
    result.lock.slots["LayerNorm"].implementation

``run`` detects the machine, applies the site profile, checks every candidate in an isolated worker,
times the accepted ones, chooses per slot and writes the lock (or reuses the current one) under a
file lock. Nothing here prints: what a person should see is sent to an :class:`Events` object (the
command line renders it; the default ignores it), and every failure the user can act on is a
``LockError`` with its exit code. ``kernel_probe.commands.probe`` only parses arguments into a
:class:`ProbeRequest` and renders the :class:`ProbeResult`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kernel_lock
from kernel_lock.errors import KernelUnavailable, LockError, LockFormatError, LockMismatch
from kernel_lock.slots import PRECISIONS, SLOTS
from kernel_probe.errors import ForcedUnusable, InputFileError, NodeDiffers, ProbeError, StaleLock, UsageError
from kernel_probe.probe.limits import CHECK_TIMEOUT, IMPORT_TIMEOUT, TIMING_TIMEOUT
from kernel_probe.probe.shapes import parse_shape

if TYPE_CHECKING:  # the warm path (a current lock) imports none of the probe's machinery
    from kernel_probe.isolation.protocol import TimingProgressMessage
    from kernel_probe.jobstart.ranks import JobRank
    from kernel_probe.probe.candidates import Candidate
    from kernel_probe.probe.check import Report
    from kernel_probe.probe.choose import Choice

DEFAULT_SHAPES = {"gpu": ("40320x1024", "542080x1024"), "cpu": ("2048x1024",)}
DEFAULT_REPS = {"gpu": 20, "cpu": 5}
DEFAULT_PRECISION = "bf16-mixed"
CPU_LARGE_ELEMENTS = 16 * 1024 * 1024  # 8x the CPU default shape: beyond it, timing on a CPU takes minutes


@dataclass(frozen=True)
class ProbeRequest:
    """What to probe; every field has the command line's default. Empty ``shapes``/``slots`` mean the
    profile's or the defaults; ``candidates`` are extra ``SLOT=dotted.path.Class`` offers."""

    out: Path = Path("kernel-lock.toml")
    shapes: tuple[str, ...] = ()
    precision: str | None = None
    slots: tuple[str, ...] = ()
    pins: Mapping[str, str] = field(default_factory=dict)
    prefers: Mapping[str, str] = field(default_factory=dict)
    candidates: tuple[str, ...] = ()
    plugins: bool = True
    profile: str | None = None
    profiles_dirs: tuple[str, ...] = ()
    reps: int | None = None
    deterministic: bool = False
    with_compile: bool = False
    allow_init_change: bool = False
    strict_dtype: bool = False
    timeout: float = CHECK_TIMEOUT
    import_timeout: float = IMPORT_TIMEOUT
    force: bool = False
    check_only: bool = False
    lock_timeout: float = 1800.0
    command: str = "kernel-probe"  # recorded in the lock's provenance
    # who probes where the launcher names this process's rank (kernel_probe.jobstart.ranks): "job" (rank 0),
    # "node-type" (one rank per kind of node; --out names {node-type}), "rank" (each rank under the file lock);
    # None: the profile's [policy] probe-per, else "job"
    probe_per: str | None = None


@dataclass(frozen=True)
class Plan:
    """What a request means on this machine, decided before any candidate runs."""

    request: ProbeRequest
    device: Mapping[str, Any]
    profile: Any  # kernel_probe.profiles.format.Profile | None
    matched: str
    candidates: tuple[Candidate, ...]
    problems: tuple[str, ...]  # candidates that could not be offered (broken plug-ins)
    slots: tuple[str, ...]
    shapes: tuple[str, ...]
    shapes_from: str  # "" (asked for), "profile NAME" or "defaults"
    precision: str
    reps: int
    deterministic: bool
    digest: str  # of the inputs: a lock probed with other inputs is not reused
    trust: tuple[str, ...]

    @property
    def dtype(self) -> str:
        return PRECISIONS[self.precision].dtype

    @property
    def regime(self) -> str:
        return PRECISIONS[self.precision].regime


@dataclass
class ProbeResult:
    lock_path: Path
    lock: kernel_lock.KernelLock
    reused: bool
    plan: Plan
    seconds: float = 0.0
    choices: dict[str, Choice] = field(default_factory=dict)
    reports: dict[str, list[Report]] = field(default_factory=dict)
    timings: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    check_seconds: float = 0.0
    time_seconds: float = 0.0
    source: str = ""  # reused: who wrote the lock for this job ("" when it was there already)


class Events:
    """What a probe tells a person while it runs. The defaults ignore everything; the command line
    subclasses it to print."""

    def note(self, text: str) -> None:
        """Something worth a line (the profile auto-detected, ...)."""

    def warn(self, text: str) -> None:
        """Something the user should act on that does not stop the probe."""

    def begin(self, total: int) -> None:
        """Checking starts: ``total`` candidates."""

    def checking(self, slot: str, cand_id: str, index: int, total: int) -> None:
        """Candidate ``index`` (1-based) of ``total`` is being checked."""

    def timing(self, slot: str, cand_id: str, shapes: Sequence[str], message: TimingProgressMessage | None) -> None:
        """A candidate's timing started (``message`` None) or progressed (a worker progress message)."""

    def done(self) -> None:
        """Checking and timing are over (also after an error)."""


def large_shape_warning(device_type: str, shapes: Sequence[str], reps: int) -> str | None:
    """On a CPU, the warning that GPU-sized shapes take minutes to time, and what to do instead."""
    if device_type != "cpu":
        return None
    large = [s for s in shapes if parse_shape(s)[0] * parse_shape(s)[1] > CPU_LARGE_ELEMENTS]
    if not large:
        return None
    return (
        f"{', '.join(large)} {'is a GPU-sized shape' if len(large) == 1 else 'are GPU-sized shapes'}: on a CPU, "
        f"timing every accepted candidate ({reps} repetitions, plus warm-up) can take minutes; progress follows "
        f"per shape and repetition. For a CPU lock use the CPU default ({DEFAULT_SHAPES['cpu'][0]}: drop --shape), "
        "or lower --reps"
    )


def detect_device() -> dict[str, Any]:
    """This machine's device facts (``fingerprint.with_torch.device_facts``): read without torch where every one
    of them can be (``kernel_lock.fingerprint.torchless``), else from torch."""
    from kernel_lock.fingerprint.here import device_here

    return device_here()


def gather_candidates(offered: Sequence[str], extra: Sequence[Candidate] = (), *, plugins: bool = True):
    """(the registry with ``extra`` and the ``SLOT=dotted.path.Class`` offers, problems)."""
    from kernel_probe.probe import candidates as cands

    return cands.registry([*extra, *(cands.from_command_line(text) for text in offered)], entry_points=plugins)


def plan(request: ProbeRequest, events: Events | None = None) -> Plan:
    """Decide what ``request`` means here, refusing every bad argument before any work (exit 2), a
    node the profile rules out (exit 4) and a pin that cannot run here (exit 3)."""
    events = events or Events()
    try:
        for s in request.shapes:
            parse_shape(s)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if request.reps is not None and request.reps < 1:
        raise UsageError("--reps must be at least 1")
    if request.precision is not None and request.precision not in PRECISIONS:
        raise UsageError(f"unknown precision {request.precision!r}", fix=f"use one of {', '.join(PRECISIONS)}")
    if request.check_only and request.force:
        raise UsageError("--check and --force contradict each other")
    slots = tuple(request.slots) or SLOTS
    device = detect_device()
    profile, matched = _apply_profile(request, device, events)
    candidates, problems = gather_candidates(
        request.candidates, list(profile.candidates) if profile else [], plugins=request.plugins
    )
    from kernel_probe.isolation.protocol import interpreter_requested

    if interpreter_requested():
        problems = [
            *problems,
            "TRITON_INTERPRET is set: Triton kernels run in Triton's interpreter, not compiled; a candidate whose "
            "kernels ran interpreted is labelled so, never timed and never written to the lock",
        ]
    check_forced(
        request.pins, request.prefers, slots, candidates, device, profile=profile, with_compile=request.with_compile
    )
    kind = "cpu" if device["type"] == "cpu" else "gpu"
    if request.shapes:
        shapes, shapes_from = tuple(request.shapes), ""
    elif profile and profile.shapes:
        shapes, shapes_from = tuple(profile.shapes), f"profile {profile.name}"
    else:
        shapes, shapes_from = DEFAULT_SHAPES[kind], "defaults"
    precision = request.precision or (profile.precision if profile and profile.precision else DEFAULT_PRECISION)
    deterministic = request.deterministic or bool(profile and profile.deterministic)
    inputs = {
        "precision": precision,
        "shapes": list(shapes),
        "slots": list(slots),
        "pins": dict(request.pins),
        "prefers": dict(request.prefers),
        "candidates": sorted(f"{c.id}={c.target}" for c in candidates),
        "with_compile": request.with_compile,
        "profile": profile.digest if profile else None,
        "deterministic": deterministic,
        "allow_init_change": request.allow_init_change,
        "strict_dtype": request.strict_dtype,
    }
    from kernel_probe.probe.write import inputs_digest, trusted_roots

    return Plan(
        request,
        device,
        profile,
        matched,
        tuple(candidates),
        tuple(problems),
        slots,
        shapes,
        shapes_from,
        precision,
        request.reps or DEFAULT_REPS[kind],
        deterministic,
        inputs_digest(inputs),
        trusted_roots(candidates),
    )


def _apply_profile(request: ProbeRequest, device: Mapping[str, Any], events: Events):
    """Load the profile (or auto-detect it), enforce its requirements (exit 4 on unmet)."""
    if not request.profile:
        return None, ""
    from kernel_lock.fingerprint import here
    from kernel_probe.profiles import requirements

    profile, matched, notes = requirements.choose(request.profile, list(request.profiles_dirs), device)
    for note in notes:
        events.note(f"profile {request.profile}: {note}")
    if profile is None:
        events.note("profile auto: no profile's site signals matched this machine; none applied")
        return None, ""
    if request.profile == "auto":
        events.note(f"profile auto: {profile.name} (matched {matched})")
    else:  # named: a node that its site signals place at another site is not this profile's
        seen, seen_by, _ = requirements.choose("auto", list(request.profiles_dirs), device)
        requirements.other_site(profile, seen, seen_by)
    libs = requirements.library_facts(requirements.required_libraries(profile))
    for warning in requirements.enforce(profile, here.for_check(), libs):
        events.warn(warning)
    return profile, matched


def check_forced(
    pins: Mapping[str, str],
    prefers: Mapping[str, str],
    slots: Sequence[str],
    candidates: Sequence[Candidate],
    device: Mapping[str, Any],
    *,
    profile: Any = None,
    with_compile: bool = False,
) -> None:
    """Every --pin/--prefer checked before any work: the slot is probed, the id is a candidate of it
    (exit 2), the profile allows it (exit 2), and it can run here as far as is known without importing
    it (exit 3, with the reason and how to install it)."""
    from kernel_probe.probe.candidates import for_slot

    for flag, forced in (("--pin", pins), ("--prefer", prefers)):
        for slot, cid in forced.items():
            said = f"{flag} {slot}={cid}"
            if slot not in slots:
                raise UsageError(
                    f"{said}: but --slot limits this probe to {', '.join(slots)}",
                    fix=f"add --slot {slot}, or drop {said}",
                )
            ids = [c.id for c in for_slot(candidates, slot)]
            if cid not in ids:
                raise UsageError(
                    f"{said}: {cid!r} is not a candidate for {slot} (known: {', '.join(ids)})",
                    fix=f"use one of those ids, or offer your own class with --candidate {slot}=module.Class",
                )
            sp = profile.slots.get(slot) if profile else None
            if sp is not None and sp.allowed and cid not in sp.allowed:
                raise UsageError(
                    f"{said}: profile {profile.name} does not allow it for {slot} (allowed: {', '.join(sp.allowed)})",
                    fix=f"drop {said}, or use a profile that allows it",
                )
            from kernel_probe.probe.check import (
                static_problem,
            )  # only when something is forced: the checker is not light

            cand = next(c for c in for_slot(candidates, slot) if c.id == cid)
            problem = static_problem(cand, slot, device["type"], device.get("arch") or "", with_compile=with_compile)
            if problem:
                status, reason = problem
                fix = (
                    "add --with-compile"
                    if status == "skipped"
                    else f"drop {said}, or run on a machine where it can run"
                )
                raise ForcedUnusable(
                    f"{said}: the candidate is {status} on this machine: {reason}",
                    fix=fix + "; a pinned or preferred kernel is never silently replaced",
                )


def reusable(
    path: Path, digest: str, trust: Sequence[str] = (), profile: Any = None
) -> tuple[kernel_lock.KernelLock | None, str]:
    """(the lock, "") if it can be reused; (None, why not) otherwise. Raises for a corrupt lock.

    ``trust``: the libraries of this run's own candidates (the command line, the profile, plug-ins):
    offering them is the grant a lock written for them needs."""
    if not path.exists():
        return None, f"{path} does not exist"
    try:
        lock = kernel_lock.load(path, emit_warnings=False, trust=tuple(trust))
    except LockError as exc:
        raise InputFileError(
            f"the existing lock is not valid: {exc.problem}",
            path=str(path),
            key=exc.key,
            fix="re-run with --force to replace it (nothing was overwritten)",
        ) from None
    if not lock.intact:
        raise InputFileError(
            "the existing lock was edited by hand (its digest does not match)",
            path=str(path),
            fix="re-run with --force to replace it, or accept the edit with `kernel-probe rehash`",
        )
    if lock.provenance.get("inputs") != digest:
        from kernel_probe.profiles.requirements import profile_change

        changed = profile_change(lock.profile, profile)
        return None, changed or "it was probed with other options (shapes, precision, candidates, pins or profile)"
    try:
        # each slot's class and kwargs as `verify` and `factory` would judge them: from the tables where
        # they know the class, else imported in a child process (kernel_lock.resolve.confirm_targets)
        lock.verify(targets="child")
    except LockMismatch as exc:
        return None, "this machine differs: " + "; ".join(str(d) for d in exc.differences)
    except LockFormatError as exc:
        raise InputFileError(
            f"the existing lock is not valid: {exc.problem}",
            path=str(path),
            key=exc.key,
            fix=(exc.fix + "; or " if exc.fix else "") + "re-run with --force to replace it (nothing was overwritten)",
        ) from None
    except KernelUnavailable as exc:
        return None, exc.problem
    return lock, ""


def run(request: ProbeRequest, events: Events | None = None) -> ProbeResult:
    """Reuse the lock at ``request.out`` if it is current, else probe and write it (atomically, under a
    file lock, so many ranks starting at once produce one lock). ``check_only`` writes nothing and
    raises :class:`StaleLock` (exit 3) when the lock is not current."""
    events = events or Events()
    t_start = time.perf_counter()
    rank = None if request.check_only else _job_rank(request.probe_per or "job", events)
    try:
        p = plan(request, events)
    except BaseException as exc:
        if rank is not None and rank.rank == 0 and request.probe_per in (None, "job"):
            _fail_for_all(Path(os.path.abspath(request.out)), rank, exc)  # no rank waits for a plan that failed
        raise
    mode = request.probe_per or (p.profile.probe_per if p.profile else None) or "job"
    given = _expand_out(request, p, mode)
    if rank is not None and mode != "rank":
        return _run_ranked(request, p, given, rank, mode, events, t_start)
    return _probe_or_reuse(request, p, given, events, t_start)


def _fail_for_all(out: Path, rank: JobRank, exc: BaseException) -> None:
    """The probing rank's failure, left as its job marker so that every waiting rank fails at once."""
    from kernel_probe.jobstart import handoff

    if "{node-type}" in str(out):
        return  # no rank has claimed a kind of node yet: none waits
    try:
        handoff.publish(out, rank, handoff.failure_marker(rank, exc), None)
    except (OSError, LockError):
        pass  # the others time out, naming this rank


def _expand_out(request: ProbeRequest, p: Plan, mode: str) -> Path:
    """``--out`` with ``{node-type}`` replaced by this node's (``handoff.node_type``)."""
    text = str(request.out)
    if "{node-type}" not in text:
        if mode == "node-type":
            raise UsageError(
                f"--probe-per node-type writes one lock per kind of node, but --out {text} names no {{node-type}}",
                fix="use e.g. --out 'kernel-lock.{node-type}.toml' (the path is printed, and in --json as 'lock')",
            )
        return request.out
    from kernel_probe.jobstart.handoff import node_type

    return Path(text.replace("{node-type}", node_type(p.device)))


def _job_rank(mode: str, events: Events) -> JobRank | None:
    """This process's rank and job (``kernel_probe.jobstart.ranks``), or None: no launcher variables, or
    ``--probe-per rank``."""
    from kernel_probe.jobstart.handoff import PROBE_PER
    from kernel_probe.jobstart.ranks import RankVariableError, detect

    if mode not in PROBE_PER:
        raise UsageError(f"--probe-per {mode!r}: use one of {', '.join(PROBE_PER)}")
    if mode == "rank":
        return None
    try:
        found = detect()
    except RankVariableError as exc:
        raise UsageError(
            f"launcher variables: {exc}",
            fix="correct or unset the variable, or pass --probe-per rank to ignore the launcher's variables",
        ) from None
    for note in found.notes:
        events.note(f"launcher variables: {note}")
    return found.rank


def _run_ranked(
    request: ProbeRequest, p: Plan, given: Path, rank: JobRank, mode: str, events: Events, t_start: float
) -> ProbeResult:
    """One rank probes (rank 0, or per node type the rank that claims it) and leaves a job marker;
    the others wait for the marker of this job and take its lock (``kernel_probe.jobstart.handoff``)."""
    import socket

    from kernel_probe.jobstart import handoff

    out = Path(os.path.abspath(given))  # the marker sits beside the path as given (a link is not followed)
    # job: rank 0; node-type: of each node's watching rank, the one whose exclusive create wins
    prober = rank.rank == 0 if mode == "job" else rank.node_leader and handoff.claim(out, rank)
    if prober:
        try:
            result = _probe_or_reuse(request, p, given, events, t_start, ranked=True)
        except BaseException as exc:
            _fail_for_all(out, rank, exc)
            raise
        written = result.lock
        outcome = "reused" if result.reused else "written"
        marker = handoff.Marker(
            outcome, rank.key, rank.describe(), socket.gethostname(), written.compute_digest(), p.digest
        )
        handoff.publish(out, rank, marker, written.dumps())
        return result
    marker, text = handoff.wait(out, rank, mode=mode, timeout=request.lock_timeout)
    lock: kernel_lock.KernelLock | None = None
    try:
        lock = kernel_lock.loads(text, path=str(given), emit_warnings=False, trust=p.trust)
    except LockError as exc:
        problem = exc.problem
    if lock is None or lock.compute_digest() != marker.digest:
        raise ProbeError(
            f"{given} is not the lock {marker.by} wrote for this job"
            + (f" ({problem})" if lock is None else " (its digest differs): another job or process replaced it"),
            fix="give each job its own --out, or start the job again",
        )
    if marker.inputs != p.digest:
        raise UsageError(
            f"{marker.by} probed {given} with other options than this rank (shapes, precision, slots, "
            "candidates, pins or profile)",
            fix="start every rank with the same kernel-probe arguments",
        )
    try:
        lock.verify()
    except LockMismatch as exc:
        raise NodeDiffers(
            f"{given} was probed by {marker.by} on {marker.host}, and this node differs from it: "
            + "; ".join(str(d) for d in exc.differences),
            fix="probe one lock per kind of node: --probe-per node-type --out 'kernel-lock.{node-type}.toml'",
        ) from None
    return ProbeResult(given, lock, True, p, seconds=time.perf_counter() - t_start, source=marker.by)


def _probe_or_reuse(
    request: ProbeRequest, p: Plan, given: Path, events: Events, t_start: float, *, ranked: bool = False
) -> ProbeResult:
    """Reuse the lock at ``given`` if current, else probe and write it under the file lock."""
    from kernel_probe.probe.write import check_writable, exclusive

    out = given if request.check_only else check_writable(given)  # a symbolic link is written through
    if not request.force:
        lock, why = reusable(out, p.digest, p.trust, p.profile)
        if lock is not None:
            return ProbeResult(out, lock, True, p, seconds=time.perf_counter() - t_start)
        if request.check_only:
            raise StaleLock(
                f"{out} is stale or missing: {why}", fix="run `kernel-probe` (without --check) to probe and write it"
            )
    with exclusive(out, request.lock_timeout) as locked:
        if not locked and ranked:
            events.warn(
                f"{out.parent}: this file system does not do file locks: the ranks of this job still probe once "
                f"(they wait for this rank's job marker), but another job probing {out.name} at the same time is "
                "not kept apart (each write stays atomic: a reader sees one whole lock)"
            )
        elif not locked:
            events.warn(
                f"{out.parent}: this file system does not do file locks, so concurrent probes of {out.name} are "
                "not kept apart (each write stays atomic: a reader sees one whole lock); under a launcher that "
                "sets rank variables (Slurm, torchrun, MPI) one rank probes without them"
            )
        if not request.force:  # another rank may have written it while we waited
            lock, _ = reusable(out, p.digest, p.trust, p.profile)
            if lock is not None:
                return ProbeResult(out, lock, True, p, seconds=time.perf_counter() - t_start)
        for problem in p.problems:
            events.warn(problem)
        result = probe(p, events)
        result.lock.dump(out)
    result.lock_path = out
    result.seconds = time.perf_counter() - t_start
    return result


def probe(p: Plan, events: Events | None = None) -> ProbeResult:
    """Check every candidate, time the accepted ones, choose per slot and build the lock (not written)."""
    from kernel_lock.fingerprint import with_torch
    from kernel_probe.probe.candidates import for_slot
    from kernel_probe.probe.judge import Policy
    from kernel_probe.probe.write import build_lock

    events = events or Events()
    warning = large_shape_warning(p.device["type"], p.shapes, p.reps)
    if warning:
        events.warn(warning)
    # fp32 as a sanity baseline, plus the regime the model trains in
    rows = [("float32", "true")] + ([(p.dtype, p.regime)] if p.dtype != "float32" else [])
    policy = Policy(allow_init_change=p.request.allow_init_change, strict_dtype=p.request.strict_dtype)
    per_slot = {s: for_slot(p.candidates, s) for s in p.slots}
    total = sum(len(v) for v in per_slot.values())
    # lock: None only while probing; build_lock sets it below, so a returned ProbeResult always has one
    result = ProbeResult(
        p.request.out,
        None,  # type: ignore[arg-type]
        False,
        p,
        reports={s: [] for s in p.slots},
        timings={s: {} for s in p.slots},
    )
    from kernel_probe.isolation.worker import WorkerPool

    events.begin(total)
    try:
        with WorkerPool() as pool:
            pool.prepare()  # torch's own worker, started before any library is imported
            index = 0
            for slot, cands in per_slot.items():
                for cand in cands:
                    index += 1
                    events.checking(slot, cand.id, index, total)
                    result.reports[slot].append(_check_and_time(p, pool, cand, slot, rows, policy, result, events))
    finally:
        events.done()
    result.choices = choose_all(p, result.reports, result.timings)
    provenance: dict[str, Any] = {
        "inputs": p.digest,
        "command": p.request.command,
        "shapes": list(p.shapes),
        "check-seconds": round(result.check_seconds, 2),
        "time-seconds": round(result.time_seconds, 2),
    }
    if p.deterministic:
        provenance["deterministic"] = True
    result.lock = build_lock(
        result.choices,
        result.reports,
        result.timings,
        with_torch.current(),
        precision=p.precision,
        provenance=provenance,
        profile=p.profile.lock_record(p.matched) if p.profile else None,
    )
    return result


def _check_and_time(
    p: Plan, pool, cand: Candidate, slot: str, rows, policy, result: ProbeResult, events: Events
) -> Report:
    """One candidate checked, then (if accepted) timed, in the same worker: torch's, or the library's own."""
    from kernel_probe.isolation.protocol import TimeRequest
    from kernel_probe.isolation.worker import WorkerDied
    from kernel_probe.probe.check import Report, check_candidate

    device = p.device["type"]
    allowed = p.profile.slots[slot].allowed if p.profile and slot in p.profile.slots else ()
    if allowed and cand.id not in allowed:
        return Report(
            cand.id,
            cand.target,
            slot,
            cand.semantics,
            device,
            "skipped",
            [f"not allowed by profile {p.profile.name}"],
            source=cand.source,
            candidate=cand,
        )
    with pool.worker_for(cand) as worker:
        t0 = time.perf_counter()
        r = check_candidate(
            cand,
            slot,
            device,
            rows,
            worker,
            arch=p.device["arch"],
            timeout=p.request.timeout,
            import_timeout=p.request.import_timeout,
            with_compile=p.request.with_compile,
            policy=policy,
        )
        t1 = time.perf_counter()
        result.check_seconds += t1 - t0
        if r.status != "accepted" or r.interpreted:  # an interpreted run is never timed (nor chosen)
            return r
        events.timing(slot, cand.id, p.shapes, None)
        request = TimeRequest(
            candidate=cand,
            slot=slot,
            device=device,
            shapes=tuple(p.shapes),
            dtype=p.dtype,
            regime=p.regime,
            progress=True,
            options={"reps": p.reps, "warmup": min(3, p.reps), "min_seconds": 0.2 if device != "cpu" else 0.0},
        )
        try:
            reply = worker.call(
                request, TIMING_TIMEOUT, on_progress=lambda m: events.timing(slot, cand.id, p.shapes, m)
            )
            if reply.tampered:
                r.status = "rejected"
                r.reasons = [f"while timing it replaced torch's own {', '.join(reply.tampered)}"] + r.reasons
            else:
                result.timings[slot][r.id] = list(reply.rows)
                _judge_at_shapes(r, reply.rows)
        except WorkerDied as exc:
            r.status, r.reasons = exc.status, [f"while timing: {exc.reason}"] + r.reasons
        result.time_seconds += time.perf_counter() - t1
    return r


def _judge_at_shapes(report: Report, rows: Sequence[Mapping[str, Any]]) -> None:
    """A candidate wrong at a timed shape (the check after timing, ``atshape``) is rejected, the shape
    and the first wrong row named first among its reasons; its timings stay in the lock's record."""
    from kernel_probe.probe.judge import judge_shape

    for row in rows:
        if "check" not in row:
            continue
        verdict = judge_shape(row["shape"], row["dtype"], row["regime"], row["check"])
        if not verdict.ok:
            report.status = "rejected"
            report.reasons.insert(0, verdict.reason)


def choose_all(
    p: Plan, reports: Mapping[str, list[Report]], timings: Mapping[str, Mapping[str, list]]
) -> dict[str, Choice]:
    """Per slot: the command line's pin/prefer, else the profile's policy, else the rule (choose.py)."""
    from kernel_probe.probe.candidates import default_for
    from kernel_probe.probe.choose import choose

    choices = {}
    for slot in p.slots:
        sp = p.profile.slots.get(slot) if p.profile else None
        if slot in p.request.pins or slot in p.request.prefers or sp is None:
            forced: dict[str, Any] = dict(pin=p.request.pins.get(slot), prefer=p.request.prefers.get(slot))
        else:
            forced = dict(
                pin=sp.pin, prefer=list(sp.preferred), origin=f"profile {p.profile.name}", strict_prefer=False
            )
        choices[slot] = choose(
            slot,
            reports[slot],
            dict(timings[slot]),
            list(p.shapes),
            p.dtype,
            default_for(slot).id,
            deterministic=p.deterministic,
            **forced,
        )
    return choices
