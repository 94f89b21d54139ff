"""Job start: which rank of a job probes, and how the others take its lock (docs/probe.md "Many
ranks at job start"): the prober leaves a job marker beside the lock; each node's local rank 0
copies it to a node-local file the node's other ranks wait on. Without a launcher, with
``--probe-per rank`` or a read-only folder, each rank probes alone."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import kernel_lock
from kernel_lock.errors import ExitCode, LockError, LockMismatch
from kernel_lock.files import UnsafeFile, UnsafeWrite, private_dir, read_regular, write_file
from kernel_lock.lock import MAX_BYTES
from kernel_lock.tables import ReadError, get_int, get_literal, get_text, refuse_unknown
from kernel_probe.errors import InputFileError, NodeDiffers, ProbeError, UsageError
from kernel_probe.probe.pipeline import ProbeResult, probe_or_reuse
from kernel_probe.probe.planning import Events, Plan, ProbeRequest, plan
from kernel_probe.ranks import PROBE_PER, JobRank, RankVariableError, detect

NODE_DIR_ENV = "KERNEL_PROBE_NODE_DIR"
WATCH = (0.1, 5.0)  # the node's watcher on the shared directory: first delay, cap (s)
LOCAL = (0.05, 1.0)  # the other ranks, on the node-local file
FALLBACK = (30.0, 300.0)  # the other ranks' rare look at the shared directory
STALE_MARKER_S = 7 * 24 * 3600  # the next prober removes other jobs' markers older than this
OUTCOMES = ("written", "reused", "failed")
Outcome = Literal["written", "reused", "failed"]
EXIT_CODES = tuple(int(c) for c in ExitCode)  # the documented table: a marker's code is one of them


class RankFailed(ProbeError):
    """The probing rank failed: every waiting rank fails with its message and exit code."""

    def __init__(self, message: str, exit_code: int, *, fix: str | None = None):
        super().__init__(message, fix=fix)
        self.exit_code = exit_code


class WaitTimeout(ProbeError):
    """The probing rank wrote no marker in time (exit 1)."""


class MarkerError(InputFileError):
    """A job marker that is not what kernel-probe writes (exit 5), naming the file and the key."""


@dataclass(frozen=True)
class Marker:
    """What the probing rank decided for this start of the job."""

    outcome: Outcome
    job: str
    by: str  # the probing rank, described
    host: str
    digest: str = ""  # the lock's content digest
    inputs: str = ""  # the probe's inputs digest (provenance.inputs)
    problem: str = ""  # outcome "failed": the error, its exit code and fix
    exit_code: int = ExitCode.OK
    fix: str = ""

    def to_json(self) -> str:
        """The marker as the JSON text written next to the lock."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> Marker:
        """The marker in ``data``, every key checked by the typed reader; ReadError."""
        if not isinstance(data, dict):
            raise ReadError(f"expected a JSON object, got {type(data).__name__}")
        refuse_unknown(data, tuple(cls.__dataclass_fields__))
        outcome = get_literal(data, "outcome", OUTCOMES)
        code = get_int(data, "exit_code", 0, 255, default=0)
        if code not in EXIT_CODES:
            codes = ", ".join(map(str, EXIT_CODES))
            raise ReadError(f"{code} is not a documented exit code ({codes})", "exit_code")
        if (outcome == "failed") != (code != 0):
            said = f"outcome {outcome!r} with exit code {code}: a failure has a non-zero code"
            raise ReadError(said, "exit_code")
        keys = ("job", "by", "host", "digest", "inputs", "problem", "fix")
        limits = {k: 200 if k in ("job", "digest", "inputs") else 4096 for k in keys}
        text = {k: get_text(data, k, "", limit=limits[k]) or "" for k in keys}
        if not text["job"]:
            raise ReadError("required key is missing", "job")
        return cls(outcome=outcome, exit_code=code, **text)  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, text: str, where: Path) -> Marker:
        """The marker in ``text`` (the file ``where``); MarkerError names the file and key."""
        try:
            return cls.from_dict(json.loads(text))
        except (ValueError, RecursionError) as exc:
            read = exc if isinstance(exc, ReadError) else None
            raise MarkerError(
                "not a job marker kernel-probe wrote: "
                + (read.problem if read else f"not valid JSON ({exc})"),
                path=str(where),
                key=(read.key if read else "") or None,
                fix=f"remove {where} and start the job again",
            ) from None


def failure_marker(rank: JobRank, exc: BaseException) -> Marker:
    """The marker a prober leaves when it fails, so that no rank waits for it until the timeout."""
    code, fix = int(ExitCode.FAILURE), ""
    if isinstance(exc, LockError):
        problem, code, fix = exc.problem, exc.exit_code, exc.fix or ""
    elif isinstance(exc, KeyboardInterrupt):
        problem = "interrupted"
    else:
        problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    who = (rank.key, rank.describe(), socket.gethostname())
    return Marker("failed", *who, problem=problem, exit_code=code, fix=fix)


def marker_path(out: Path, rank: JobRank) -> Path:
    """The job marker of ``rank``'s job next to the lock ``out``."""
    return out.parent / f".{out.name}.job-{rank.key}"


def claim_path(out: Path, rank: JobRank) -> Path:
    """The file whose exclusive creation elects the rank that probes (``--probe-per node-type``)."""
    return out.parent / f".{out.name}.job-{rank.key}.claim"


def node_dir(out: Path, rank: JobRank) -> Path:
    """The node-local directory this job's ranks on one node share for ``out``."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    root = os.environ.get(NODE_DIR_ENV) or os.environ.get("TMPDIR") or shm
    tag = hashlib.sha256(f"{out}\0{rank.key}".encode()).hexdigest()[:16]
    return Path(root) / f"kernel-probe-{os.getuid()}" / tag


def node_type(device: Mapping[str, Any]) -> str:
    """A file-name-safe name for this node's kind of device: ``cuda-sm90-8-1a2b3c4d``."""
    # "" and absent alike: the torch-free reader says features = "" where torch's says nothing
    keys = ("type", "vendor", "name", "arch", "features", "count")
    facts = {k: device.get(k) or "" for k in keys}
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:8]
    what = f"{facts['type']}-{facts['arch'] or facts['name'] or ''}-{facts['count'] or 0}"
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", what).strip("-").lower() + "-" + digest


def backoff(first: float, cap: float, rng: random.Random) -> Iterator[float]:
    """Sleeps doubling from ``first`` to ``cap``, each jittered by +-20 % (ranks not in step)."""
    delay = first
    while True:
        yield delay * rng.uniform(0.8, 1.2)
        delay = min(delay * 2, cap)


def _read(path: Path) -> str | None:
    try:
        raw = read_regular(path, MAX_BYTES)
    except FileNotFoundError:
        return None
    except UnsafeFile as exc:
        fix = f"remove {path}: kernel-probe writes it as a regular file"
        raise InputFileError(exc.problem, path=str(path), fix=fix) from None
    return raw.decode("utf-8", errors="replace")  # not UTF-8: its digest tells


def claim(out: Path, rank: JobRank) -> bool:
    """Claim the probe of ``out`` for this job (``--probe-per node-type``): True for the one rank
    whose exclusive create succeeds (atomic on NFS v3+, Lustre and GPFS; no file lock needed)."""
    try:
        text = f"{rank.describe()} on {socket.gethostname()}\n"
        write_file(claim_path(out, rank), text, exclusive=True)
    except FileExistsError:
        return False
    return True


def publish(out: Path, rank: JobRank, marker: Marker, lock_text: str | None) -> None:
    """The prober's last step: the job marker beside the lock, its node's local copy; then other
    jobs' markers older than ``STALE_MARKER_S`` are removed."""
    prefix, mine, now = f".{out.name}.job-", marker_path(out, rank).name, time.time()
    stale = []
    try:
        for entry in os.scandir(out.parent):
            if entry.name.startswith(prefix) and not entry.name.startswith(mine):
                with contextlib.suppress(OSError):
                    if now - entry.stat(follow_symlinks=False).st_mtime > STALE_MARKER_S:
                        stale.append(entry.path)
    except OSError:
        stale = []
    write_file(marker_path(out, rank), marker.to_json())
    _publish_local(out, rank, marker, lock_text)
    for path in stale:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _publish_local(out: Path, rank: JobRank, marker: Marker, lock_text: str | None) -> None:
    local = node_dir(out, rank)
    payload = json.dumps({"marker": json.loads(marker.to_json()), "lock": lock_text})
    try:
        folder = private_dir(private_dir(local.parent) / local.name)
        write_file(folder / "ready", payload, mode=0o600)
    except (OSError, UnsafeWrite):
        pass  # the node's other ranks then find the marker on the shared directory (their fallback)


def wait(
    out: Path,
    rank: JobRank,
    *,
    mode: str,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Marker, str]:
    """Wait for the prober's marker for this job: (marker, lock text); :class:`RankFailed` when the
    prober failed, :class:`WaitTimeout` when nothing came within ``timeout`` seconds."""
    rng, start = random.Random(f"{rank.key}/{rank.rank}"), clock()
    local_ready = node_dir(out, rank) / "ready"
    watch, fallback = backoff(*(WATCH if rank.node_leader else LOCAL), rng), backoff(*FALLBACK, rng)
    next_shared = start if rank.node_leader else start + next(fallback)
    while True:
        found = _from_shared(out, rank) if rank.node_leader else _from_local(local_ready, rank)
        if found is None and not rank.node_leader and clock() >= next_shared:
            found = _from_shared(out, rank)
            next_shared = clock() + next(fallback)
        if found is not None:
            marker, lock_text = found
            if marker.outcome == "failed":
                said = f"{out}: {marker.by} (on {marker.host}) failed, so this rank has no lock"
                code = marker.exit_code or ExitCode.FAILURE
                raise RankFailed(f"{said}: {marker.problem}", code, fix=marker.fix or None)
            return marker, lock_text
        waited = clock() - start
        if waited >= timeout:
            job = f"{rank.launcher} job {rank.job} (attempt {rank.attempt})"
            who = f"rank 0 of {job}"
            if mode != "job":
                claimed = _read(claim_path(out, rank))
                who = f"the rank that claimed {out.name} for this node type in {job}" + (
                    f" ({claimed.strip()})" if claimed else " (no rank claimed it)"
                )
            raise WaitTimeout(
                f"{out}: {who} wrote no job marker ({marker_path(out, rank).name}) within "
                f"{timeout:.0f} s; this is {rank.describe()}",
                fix="look in that rank's output for why it stopped; start the job again, or "
                "raise --lock-timeout",
            )
        sleep(min(next(watch), max(0.0, timeout - waited)))


def _from_shared(out: Path, rank: JobRank) -> tuple[Marker, str] | None:
    marker_file = marker_path(out, rank)
    try:
        text = _read(marker_file)
        if text is None:
            return None
        marker = Marker.from_json(text, marker_file)
        if marker.job != rank.key:
            raise MarkerError(
                f"this marker is for job {marker.job!r:.140}, not this one ({rank.key}): never "
                "taken for it",
                path=str(marker_file),
                key="job",
                fix=f"remove {marker_file} and start the job again",
            )
        lock_text = "" if marker.outcome == "failed" else _read(out) or ""
    except OSError as exc:
        raise ProbeError(
            f"{marker_file}: cannot read this job's marker or its lock: {exc.strerror or exc}",
            fix="check the permissions of the lock's directory (every rank must read it)",
        ) from None
    if rank.node_leader:  # this node's other ranks take it from here
        _publish_local(out, rank, marker, lock_text)
    return marker, lock_text


def _from_local(ready: Path, rank: JobRank) -> tuple[Marker, str] | None:
    try:
        # made by someone else, or opened to others: never read
        private_dir(ready.parent.parent, create=False)
        private_dir(ready.parent, create=False)
        text = _read(ready)
    except (OSError, UnsafeWrite, InputFileError):
        return None
    if text is None:
        return None
    try:
        data = json.loads(text)
        lock = data.get("lock") or ""
        if not isinstance(lock, str) or set(data) - {"marker", "lock"}:
            return None
        marker = Marker.from_dict(data.get("marker"))
        return (marker, lock) if marker.job == rank.key else None
    except (ValueError, RecursionError, AttributeError):
        # half a file cannot be seen (atomic rename); anything else: wait for the shared one
        return None


def run(request: ProbeRequest, events: Events | None = None) -> ProbeResult:
    """Reuse the lock at ``request.out`` if it is current, else probe and write it; with a launcher,
    one rank probes and the others take its lock. ``check_only`` writes nothing and raises
    :class:`StaleLock` (exit 3) when the lock is not current."""
    events = events or Events()
    t_start = time.perf_counter()
    rank = None if request.check_only else _job_rank(request.probe_per or "job", events)
    try:
        p = plan(request, events)
    except BaseException as exc:
        if rank is not None and rank.rank == 0 and request.probe_per in (None, "job"):
            _fail_for_all(Path(os.path.abspath(request.out)), rank, exc)  # none waits for it
        raise
    mode = request.probe_per or (p.profile.probe_per if p.profile else None) or "job"
    given = _expand_out(request, p, mode)
    if rank is None or mode == "rank" or _read_only(given):
        return probe_or_reuse(request, p, given, events, t_start)
    out = Path(os.path.abspath(given))  # the marker sits beside the path as given, not a link's
    # job: rank 0; node-type: of each node's watching rank, the one whose exclusive create wins
    if not (rank.rank == 0 if mode == "job" else rank.node_leader and claim(out, rank)):
        return _take_lock(out, given, p, rank, mode, request.lock_timeout, t_start)
    unlocked = (
        f"{given.parent}: this file system does not do file locks: the ranks of this job still "
        f"probe once (they wait for this rank's job marker), but another job probing {given.name} "
        "at the same time is not kept apart (each write stays atomic: a reader sees one whole lock)"
    )
    try:
        result = probe_or_reuse(request, p, given, events, t_start, unlocked=unlocked)
    except BaseException as exc:
        _fail_for_all(out, rank, exc)
        raise
    outcome: Outcome = "reused" if result.reused else "written"
    who = (rank.key, rank.describe(), socket.gethostname())
    marker = Marker(outcome, *who, result.lock.compute_digest(), p.digest)
    publish(out, rank, marker, result.lock.dumps())
    return result


def _read_only(out: Path) -> bool:
    try:
        return bool(os.statvfs(os.path.dirname(os.path.realpath(out)) or ".").f_flag & os.ST_RDONLY)
    except OSError:
        return False


def fail_before_plan(
    out: str | Path, probe_per: str | None, check_only: bool, exc: BaseException
) -> None:
    """A request refused before it is planned: as rank 0 of a job whose rank 0 probes, publish the
    failed marker, so the waiting ranks fail at once."""
    if check_only or probe_per not in (None, "job"):
        return
    try:
        rank = detect().rank
    except ValueError:
        return  # the launcher's variables are unreadable: no job to tell
    if rank is not None and rank.rank == 0:
        _fail_for_all(Path(os.path.abspath(out)), rank, exc)


def _fail_for_all(out: Path, rank: JobRank, exc: BaseException) -> None:
    if "{node-type}" in str(out):
        return  # no rank has claimed a kind of node yet: none waits
    try:
        publish(out, rank, failure_marker(rank, exc), None)
    except (OSError, LockError):
        pass  # the others time out, naming this rank


def _expand_out(request: ProbeRequest, p: Plan, mode: str) -> Path:
    text = str(request.out)
    if "{node-type}" in text:
        return Path(text.replace("{node-type}", node_type(p.device)))
    if mode == "node-type":
        raise UsageError(
            f"--probe-per node-type writes one lock per kind of node, but --out {text} "
            "names no {node-type}",
            fix="use e.g. --out 'kernel-lock.{node-type}.toml' (the path is printed, and "
            "in --json as 'lock')",
        )
    return request.out


def _job_rank(mode: str, events: Events) -> JobRank | None:
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


def _take_lock(
    out: Path, given: Path, p: Plan, rank: JobRank, mode: str, timeout: float, t_start: float
) -> ProbeResult:
    marker, text = wait(out, rank, mode=mode, timeout=timeout)
    lock: kernel_lock.KernelLock | None = None
    try:
        lock = kernel_lock.loads(text, path=str(given), emit_warnings=False, trust=p.trust)
    except LockError as exc:
        problem = exc.problem
    if lock is None or lock.compute_digest() != marker.digest:
        why = "(its digest differs): another job or process replaced it"
        raise ProbeError(
            f"{given} is not the lock {marker.by} wrote for this job "
            + (f"({problem})" if lock is None else why),
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
    seconds = time.perf_counter() - t_start
    return ProbeResult(given, lock, True, p, seconds=seconds, source=marker.by)
