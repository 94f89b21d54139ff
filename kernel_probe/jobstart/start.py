"""Job start: which rank of a job probes, and how the others take its lock (the command's entry
point).

    from kernel_probe.jobstart.start import run
    result = run(ProbeRequest(out=Path("kernel-lock.toml")))

``run`` plans the request (``kernel_probe.probe.planning``), reads this process's rank from the
launcher's variables (``ranks``), and then either probes or reuses the lock itself
(``kernel_probe.probe.pipeline.probe_or_reuse``: no launcher, ``--probe-per rank``, a read-only
folder) or takes part in the job's hand-off: the probing rank (rank 0, or per node type the one that
claims it) probes and publishes a job marker, the others wait for that marker and take its lock
(``handoff``). The probe itself knows nothing of ranks: commands -> jobstart -> probe.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import kernel_lock
from kernel_lock.errors import LockError, LockMismatch
from kernel_probe.errors import NodeDiffers, ProbeError, UsageError
from kernel_probe.jobstart.ranks import JobRank, RankVariableError, detect
from kernel_probe.probe.pipeline import ProbeResult, probe_or_reuse
from kernel_probe.probe.planning import Events, Plan, ProbeRequest, plan

__all__ = ["fail_before_plan", "run"]


def run(request: ProbeRequest, events: Events | None = None) -> ProbeResult:
    """Reuse the lock at ``request.out`` if it is current, else probe and write it (atomically,
    under a file lock, so many ranks starting at once produce one lock). ``check_only`` writes
    nothing and raises :class:`StaleLock` (exit 3) when the lock is not current."""
    events = events or Events()
    t_start = time.perf_counter()
    rank = None if request.check_only else _job_rank(request.probe_per or "job", events)
    try:
        p = plan(request, events)
    except BaseException as exc:
        if rank is not None and rank.rank == 0 and request.probe_per in (None, "job"):
            # no rank waits for a plan that failed
            _fail_for_all(Path(os.path.abspath(request.out)), rank, exc)
        raise
    mode = request.probe_per or (p.profile.probe_per if p.profile else None) or "job"
    given = _expand_out(request, p, mode)
    if rank is not None and mode != "rank" and not _read_only(given):
        return _run_ranked(request, p, given, rank, mode, events, t_start)
    return probe_or_reuse(request, p, given, events, t_start)


def _read_only(out: Path) -> bool:
    """Whether ``out``'s directory is on a read-only file system: there no rank can write a lock or
    a job marker, so each rank reuses the lock itself when it is current (and fails naming the file
    system when it is not), without waiting for a marker nobody can write."""
    try:
        return bool(os.statvfs(os.path.dirname(os.path.realpath(out)) or ".").f_flag & os.ST_RDONLY)
    except OSError:
        return False


def fail_before_plan(
    out: str | Path, probe_per: str | None, check_only: bool, exc: BaseException
) -> None:
    """A request refused before it is planned (a bad argument): where this is rank 0 of a job whose
    rank 0 probes, its failed marker is published, so the waiting ranks fail at once with its exit
    code."""
    if check_only or probe_per not in (None, "job"):
        return
    try:
        rank = detect().rank
    except ValueError:
        return  # the launcher's variables are unreadable: no job to tell
    if rank is not None and rank.rank == 0:
        _fail_for_all(Path(os.path.abspath(out)), rank, exc)


def _fail_for_all(out: Path, rank: JobRank, exc: BaseException) -> None:
    """The probing rank's failure, left as its job marker so that every waiting rank fails at
    once."""
    from kernel_probe.jobstart import handoff

    if "{node-type}" in str(out):
        return  # no rank has claimed a kind of node yet: none waits
    try:
        marker = handoff.failure_marker(rank, exc)
        handoff.publish(out, rank, marker, None)
    except (OSError, LockError):
        pass  # the others time out, naming this rank


def _expand_out(request: ProbeRequest, p: Plan, mode: str) -> Path:
    """``--out`` with ``{node-type}`` replaced by this node's (``handoff.node_type``)."""
    text = str(request.out)
    if "{node-type}" not in text:
        if mode == "node-type":
            raise UsageError(
                f"--probe-per node-type writes one lock per kind of node, but --out {text} "
                "names no {node-type}",
                fix="use e.g. --out 'kernel-lock.{node-type}.toml' (the path is printed, and "
                "in --json as 'lock')",
            )
        return request.out
    from kernel_probe.jobstart.handoff import node_type

    return Path(text.replace("{node-type}", node_type(p.device)))


def _job_rank(mode: str, events: Events) -> JobRank | None:
    """This process's rank and job (``kernel_probe.jobstart.ranks``), or None: no launcher
    variables, or ``--probe-per rank``."""
    from kernel_probe.jobstart.handoff import PROBE_PER

    if mode not in PROBE_PER:
        raise UsageError(f"--probe-per {mode!r}: use one of {', '.join(PROBE_PER)}")
    if mode == "rank":
        return None
    try:
        found = detect()
    except RankVariableError as exc:
        raise UsageError(
            f"launcher variables: {exc}",
            fix="correct or unset the variable, or pass --probe-per rank to ignore the "
            "launcher's variables",
        ) from None
    for note in found.notes:
        events.note(f"launcher variables: {note}")
    return found.rank


def _run_ranked(
    request: ProbeRequest,
    p: Plan,
    given: Path,
    rank: JobRank,
    mode: str,
    events: Events,
    t_start: float,
) -> ProbeResult:
    """One rank probes (rank 0, or per node type the rank that claims it) and leaves a job marker;
    the others wait for the marker of this job and take its lock
    (``kernel_probe.jobstart.handoff``)."""
    import socket

    from kernel_probe.jobstart import handoff

    # the marker sits beside the path as given (a link is not followed)
    out, unlocked = Path(os.path.abspath(given)), _unlocked(given)
    # job: rank 0; node-type: of each node's watching rank, the one whose exclusive create wins
    prober = rank.rank == 0 if mode == "job" else rank.node_leader and handoff.claim(out, rank)
    if prober:
        try:
            result = probe_or_reuse(request, p, given, events, t_start, unlocked=unlocked)
        except BaseException as exc:
            _fail_for_all(out, rank, exc)
            raise
        written = result.lock
        outcome: handoff.Outcome = "reused" if result.reused else "written"
        marker = handoff.Marker(
            outcome,
            rank.key,
            rank.describe(),
            socket.gethostname(),
            written.compute_digest(),
            p.digest,
        )
        handoff.publish(out, rank, marker, written.dumps())
        return result
    return _take_lock(out, given, p, rank, mode, request.lock_timeout, t_start)


def _take_lock(
    out: Path, given: Path, p: Plan, rank: JobRank, mode: str, timeout: float, t_start: float
) -> ProbeResult:
    """A waiting rank's part: the probing rank's marker for this job (``out``: the path as given,
    absolute), then its lock at ``given``, taken only if it is the lock the marker names, probed
    with this rank's inputs, and this node is the one it was probed for."""
    from kernel_probe.jobstart import handoff

    marker, text = handoff.wait(out, rank, mode=mode, timeout=timeout)
    lock: kernel_lock.KernelLock | None = None
    try:
        lock = kernel_lock.loads(text, path=str(given), emit_warnings=False, trust=p.trust)
    except LockError as exc:
        problem = exc.problem
    if lock is None or lock.compute_digest() != marker.digest:
        raise ProbeError(
            f"{given} is not the lock {marker.by} wrote for this job"
            + (
                f" ({problem})"
                if lock is None
                else " (its digest differs): another job or process replaced it"
            ),
            fix="give each job its own --out, or start the job again",
        )
    if marker.inputs != p.digest:
        raise UsageError(
            f"{marker.by} probed {given} with other options than this rank (shapes, precision, "
            "slots, candidates, pins or profile)",
            fix="start every rank with the same kernel-probe arguments",
        )
    try:
        lock.verify()
    except LockMismatch as exc:
        raise NodeDiffers(
            f"{given} was probed by {marker.by} on {marker.host}, and this node differs from it: "
            + "; ".join(str(d) for d in exc.differences),
            fix="probe one lock per kind of node: --probe-per node-type --out "
            "'kernel-lock.{node-type}.toml'",
        ) from None
    return ProbeResult(
        given, lock, True, p, seconds=time.perf_counter() - t_start, source=marker.by
    )


def _unlocked(given: Path) -> str:
    """The warning of a probing rank whose folder does not do file locks."""
    return (
        f"{given.parent}: this file system does not do file locks: the ranks of this job still "
        f"probe once (they wait for this rank's job marker), but another job probing {given.name} "
        "at the same time is not kept apart (each write stays atomic: a reader sees one whole "
        "lock)"
    )
