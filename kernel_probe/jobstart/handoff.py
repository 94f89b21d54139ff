"""Many ranks, one probe, a quiet shared file system: how the ranks of one job share the probe.

Where the launcher says which rank of which job a process is (``kernel_probe.jobstart.ranks``), one
rank probes (rank 0; or, with ``--probe-per node-type``, the first node of each node type to claim
it) and the others wait for *its* answer, with no file lock and no polling storm:

- The prober writes the lock atomically (as always), then a **job marker** beside it,
  ``.<lock name>.job-<launcher>-<job>-a<attempt>``: JSON with the outcome (written, reused or
  failed, with the error), the lock's content digest and the probe's inputs digest. The marker, not
  the lock, is what the others wait for, so a lock left by an earlier job or attempt is never taken
  for this one's, and the lock's own format and digest are untouched.
- On each node one rank (local rank 0) watches the shared directory: one ``open`` of the marker per
  check, with jittered backoff from 0.1 s doubling to 5 s. When the marker is there it reads the
  lock once, checks its digest against the marker's and copies both to a node-local file (under
  ``$KERNEL_PROBE_NODE_DIR``, else ``$TMPDIR``, else ``/dev/shm``, else ``/tmp``).
- The node's other ranks wait on that node-local file (backoff 0.05 s to 1 s), touching the shared
  directory only as a fallback (at 30 s, then doubling to 5 min), in case the node-local directory
  is not shared by the ranks of a node after all or the watching rank died.

Shared-directory operations during a cold start are then about nodes x (checks to reach the 5 s cap,
+ probe seconds / 5) instead of ranks x probe seconds x 20 (filelock's 0.05 s poll): see
docs/probe.md for the measured figures and the formula.
"""

from __future__ import annotations

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

from kernel_lock.errors import ExitCode
from kernel_lock.files import UnsafeFile, UnsafeWrite, private_dir, read_regular, write_file
from kernel_lock.format.reading import ReadError, get_int, get_literal, get_text, refuse_unknown
from kernel_lock.lock import MAX_BYTES
from kernel_probe.errors import InputFileError, ProbeError
from kernel_probe.jobstart.ranks import JobRank

NODE_DIR_ENV = "KERNEL_PROBE_NODE_DIR"
WATCH = (0.1, 5.0)  # the node's watcher on the shared directory: first delay, cap (s)
LOCAL = (0.05, 1.0)  # the other ranks, on the node-local file
FALLBACK = (30.0, 300.0)  # the other ranks' rare look at the shared directory
STALE_MARKER_S = (
    7 * 24 * 3600
)  # markers of other jobs older than this are removed by the next prober
PROBE_PER = ("job", "node-type", "rank")


class RankFailed(ProbeError):
    """The probing rank failed: every waiting rank fails with its message and exit code."""

    def __init__(self, message: str, exit_code: int, *, fix: str | None = None):
        super().__init__(message, fix=fix)
        self.exit_code = exit_code


class WaitTimeout(ProbeError):
    """The probing rank wrote no marker in time (exit 1)."""


OUTCOMES = ("written", "reused", "failed")
Outcome = Literal["written", "reused", "failed"]
EXIT_CODES = tuple(int(c) for c in ExitCode)  # the documented table: a marker's code is one of them


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
        """The typed reader (``kernel_lock.format.reading``): every key checked, unknown keys
        refused; ReadError."""
        if not isinstance(data, dict):
            raise ReadError(f"expected a JSON object, got {type(data).__name__}")
        refuse_unknown(data, tuple(cls.__dataclass_fields__))
        outcome = get_literal(data, "outcome", OUTCOMES)
        code = get_int(data, "exit_code", 0, 255, default=0)
        assert code is not None
        if code not in EXIT_CODES:
            raise ReadError(
                f"{code} is not a documented exit code ({', '.join(map(str, EXIT_CODES))})",
                "exit_code",
            )
        if (outcome == "failed") != (code != 0):
            raise ReadError(
                f"outcome {outcome!r} with exit code {code}: a failure has a non-zero code",
                "exit_code",
            )
        text = {
            k: get_text(data, k, "", limit=200 if k in ("job", "digest", "inputs") else 4096) or ""
            for k in ("job", "by", "host", "digest", "inputs", "problem", "fix")
        }
        if not text["job"]:
            raise ReadError("required key is missing", "job")
        return cls(outcome=outcome, exit_code=code, **text)  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, text: str, where: Path) -> Marker:
        """The marker in ``text`` (the file ``where``); MarkerError names the file and key when it
        is not one."""
        try:
            return cls.from_dict(json.loads(text))
        except (ValueError, RecursionError) as exc:
            key = exc.key if isinstance(exc, ReadError) else ""
            problem = exc.problem if isinstance(exc, ReadError) else f"not valid JSON ({exc})"
            raise MarkerError(
                f"not a job marker kernel-probe wrote: {problem}",
                path=str(where),
                key=key or None,
                fix=f"remove {where} and start the job again",
            ) from None


class MarkerError(InputFileError):
    """A job marker that is not what kernel-probe writes (exit 5), naming the file and the key."""


def marker_path(out: Path, rank: JobRank) -> Path:
    """The job marker of ``rank``'s job next to the lock ``out``."""
    return out.parent / f".{out.name}.job-{rank.key}"


def claim_path(out: Path, rank: JobRank) -> Path:
    """The file whose exclusive creation elects the rank that probes (``--probe-per node-type``)."""
    return out.parent / f".{out.name}.job-{rank.key}.claim"


def node_dir(out: Path, rank: JobRank, env: Mapping[str, str] | None = None) -> Path:
    """The node-local directory this job's ranks on one node share for ``out``."""
    env = os.environ if env is None else env
    root = (
        env.get(NODE_DIR_ENV)
        or env.get("TMPDIR")
        or ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    )
    tag = hashlib.sha256(f"{out}\0{rank.key}".encode()).hexdigest()[:16]
    return Path(root) / f"kernel-probe-{os.getuid()}" / tag


def node_type(device: Mapping[str, Any]) -> str:
    """A file-name-safe name for this node's kind of device: ``cuda-sm90-8-1a2b3c4d``."""
    # "" and absent alike: the torch-free reader says features = "" where torch's says nothing
    facts = {
        k: device.get(k) or "" for k in ("type", "vendor", "name", "arch", "features", "count")
    }
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:8]
    what = f"{facts['type']}-{facts['arch'] or facts['name'] or ''}-{facts['count'] or 0}"
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", what).strip("-").lower() + "-" + digest


def backoff(first: float, cap: float, rng: random.Random) -> Iterator[float]:
    """Sleeps doubling from ``first`` to ``cap``, each jittered by +-20 % so ranks do not move in
    step."""
    delay = first
    while True:
        yield delay * rng.uniform(0.8, 1.2)
        delay = min(delay * 2, cap)


def _read(path: Path) -> str | None:
    """The text at ``path``; None if it is not there (one ``open`` when it is not). Read as every
    input is (kernel_lock.files): a FIFO, a device or a huge file where a marker or lock
    should be is an error naming it (exit 5), never a rank that hangs or fills its memory."""
    try:
        raw = read_regular(path, MAX_BYTES)
    except FileNotFoundError:
        return None
    except UnsafeFile as exc:
        raise InputFileError(
            exc.problem,
            path=str(path),
            fix=f"remove {path}: kernel-probe writes it as a regular file",
        ) from None
    return raw.decode("utf-8", errors="replace")  # not UTF-8: its digest tells


def claim(out: Path, rank: JobRank) -> bool:
    """Claim the probe of ``out`` for this job (``--probe-per node-type``): True for the one rank
    whose exclusive create succeeds (O_EXCL is atomic on NFS v3+, Lustre and GPFS; no file lock
    needed)."""
    try:
        write_file(
            claim_path(out, rank), f"{rank.describe()} on {socket.gethostname()}\n", exclusive=True
        )
    except FileExistsError:
        return False
    return True


def publish(out: Path, rank: JobRank, marker: Marker, lock_text: str | None) -> None:
    """The prober's last step, composed before anything is written: the job marker beside the lock,
    then its node's local copy; then the markers of other jobs older than ``STALE_MARKER_S`` are
    removed."""
    shared, local = marker_path(out, rank), node_dir(out, rank)
    payload, stale = _local_payload(marker, lock_text), _stale_markers(out, rank)
    write_file(shared, marker.to_json())
    try:
        folder = private_dir(private_dir(local.parent) / local.name)
        write_file(folder / "ready", payload, mode=0o600)
    except (OSError, UnsafeWrite):
        pass  # the node's other ranks then find the marker on the shared directory (their fallback)
    for path in stale:
        try:
            os.unlink(path)
        except OSError:
            pass


def _publish_local(out: Path, rank: JobRank, marker: Marker, lock_text: str | None) -> None:
    """The node-local copy of the marker and its lock (a node's watcher, once it has read them)."""
    local, payload = node_dir(out, rank), _local_payload(marker, lock_text)
    try:
        folder = private_dir(private_dir(local.parent) / local.name)
        write_file(folder / "ready", payload, mode=0o600)
    except (OSError, UnsafeWrite):
        pass  # the node's other ranks then find the marker on the shared directory (their fallback)


def _local_payload(marker: Marker, lock_text: str | None) -> str:
    """The node-local copy's text: the marker and the lock's text together."""
    return json.dumps({"marker": json.loads(marker.to_json()), "lock": lock_text})


def _stale_markers(out: Path, rank: JobRank) -> list[str]:
    """The markers of other jobs beside ``out`` older than ``STALE_MARKER_S``."""
    prefix, mine = f".{out.name}.job-", marker_path(out, rank).name
    now = time.time()
    try:
        entries = list(os.scandir(out.parent))
    except OSError:
        return []
    stale = []
    for entry in entries:
        if not entry.name.startswith(prefix) or entry.name.startswith(mine):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime > STALE_MARKER_S:
                stale.append(entry.path)
        except OSError:
            pass
    return stale


def _who(out: Path, rank: JobRank, mode: str) -> str:
    job = f"{rank.launcher} job {rank.job} (attempt {rank.attempt})"
    if mode == "job":
        return f"rank 0 of {job}"
    claimed = _read(claim_path(out, rank))
    return f"the rank that claimed {out.name} for this node type in {job}" + (
        f" ({claimed.strip()})" if claimed else " (no rank claimed it)"
    )


def wait(
    out: Path,
    rank: JobRank,
    *,
    mode: str,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Marker, str]:
    """Wait for the prober's marker for this job; (the marker, the lock's text). Raises
    :class:`RankFailed` when the prober failed, :class:`WaitTimeout` (naming the rank that should
    have written it and the job) when nothing came within ``timeout`` seconds."""
    rng = random.Random(f"{rank.key}/{rank.rank}")
    start = clock()
    local_ready = node_dir(out, rank) / "ready"
    if rank.node_leader:
        watch, fallback = backoff(*WATCH, rng), None
    else:
        watch = backoff(*LOCAL, rng)
        fallback, next_shared = backoff(*FALLBACK, rng), start
        next_shared += next(fallback)
    while True:
        if rank.node_leader:
            found = _from_shared(out, rank)
        else:
            found = _from_local(local_ready, rank)
            if found is None and clock() >= next_shared:
                found = _from_shared(out, rank)
                next_shared = clock() + next(fallback)  # type: ignore[arg-type]
        if found is not None:
            return _outcome(out, *found)
        waited = clock() - start
        if waited >= timeout:
            raise WaitTimeout(
                f"{out}: {_who(out, rank, mode)} wrote no job marker "
                f"({marker_path(out, rank).name}) within {timeout:.0f} s; this is "
                f"{rank.describe()}",
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


def _outcome(out: Path, marker: Marker, lock_text: str) -> tuple[Marker, str]:
    if marker.outcome == "failed":
        raise RankFailed(
            f"{out}: {marker.by} (on {marker.host}) failed, so this rank has no lock: "
            f"{marker.problem}",
            marker.exit_code or ExitCode.FAILURE,
            fix=marker.fix or None,
        )
    return marker, lock_text


def failure_marker(rank: JobRank, exc: BaseException) -> Marker:
    """The marker a prober leaves when it fails, so that no rank waits for it until the timeout."""
    from kernel_lock.errors import LockError

    if isinstance(exc, LockError):
        return Marker(
            "failed",
            rank.key,
            rank.describe(),
            socket.gethostname(),
            problem=exc.problem,
            exit_code=exc.exit_code,
            fix=exc.fix or "",
        )
    if isinstance(exc, KeyboardInterrupt):
        return Marker(
            "failed",
            rank.key,
            rank.describe(),
            socket.gethostname(),
            problem="interrupted",
            exit_code=ExitCode.FAILURE,
        )
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return Marker(
        "failed",
        rank.key,
        rank.describe(),
        socket.gethostname(),
        problem=text,
        exit_code=ExitCode.FAILURE,
    )
