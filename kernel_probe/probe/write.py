"""Turning choices into a lock, and writing it safely while other ranks may be doing the same."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_lock.fingerprint.fields import FIELDS, library_versions
from kernel_lock.format.graph_attention import GraphAttention
from kernel_lock.format.schema import Candidate as RejectedCandidate
from kernel_lock.format.schema import EnvField, Environment, Requirement, Slot, Twin
from kernel_lock.lock import KernelLock
from kernel_lock.slots import SPECS
from kernel_probe import __version__
from kernel_probe import slots as slot_behaviour
from kernel_probe.errors import ProbeError, UsageError

if TYPE_CHECKING:  # annotations only: writing a lock, or reusing one, imports no checker
    from kernel_probe.probe.choose import Choice
    from kernel_probe.probe.report import Report


def environment(current: Mapping[str, Any], libraries: Mapping[str, str]) -> Environment:
    """The lock's fingerprint from this machine's facts, each with its match rule."""
    fields = {}
    for name, spec in FIELDS.items():
        match = spec.default_match
        if name == "cpu-microarch" and current.get("device-type") == "cpu":
            match = "exact"  # on a CPU lock, the CPU *is* the device the timings were made on
        if name == "device-name" and current.get("device-type") == "rocm":
            # the same MI250X GCD reads "AMD Instinct MI250X", "... / MI250" or "AMD Radeon
            # Graphics" depending on libdrm's amdgpu.ids (pytorch PR #147791): arch and features
            # identify it
            match = "ignore"
        if name == "numerics-env" and current.get("device-type") == "cpu":
            match = (
                "ignore"  # GPU math libraries' settings: recorded, but they change nothing on a CPU
            )
        fields[name] = EnvField(value=current[name], match=match)
    libs = {
        name: EnvField(value=version, match="compatible")
        for name, version in sorted(libraries.items())
    }
    return Environment(fields=fields, libraries=libs)


def _round(x: float | None, digits: int = 4) -> float | None:
    if x is None:
        return None
    return float(f"{x:.{digits}g}")


def _evidence(report: Report) -> list[dict[str, Any]]:
    rows = []
    extra = slot_behaviour.slot(report.slot).evidence(report)  # the slot's own fields per dtype
    for v in report.verdicts:
        row: dict[str, Any] = {
            "device": v.device,
            "dtype": v.dtype,
            "regime": v.regime,
            "status": v.status,
        }
        if v.worst_ratio is not None:
            row["worst-error-ratio"] = _round(v.worst_ratio, 3)
        row["failed"] = list(v.failed)
        if v.out_dtype:
            row["out-dtype"] = v.out_dtype
        if v.deterministic is not None:
            row["deterministic"] = v.deterministic
        if v.ratios:  # Attention: per output, the largest error / tolerance over the cases
            outputs = dict.fromkeys(o for case in v.ratios.values() for o in case)
            row["error-ratios"] = {
                o: _round(max(case.get(o, 0.0) for case in v.ratios.values()), 3) for o in outputs
            }
        # Attention: what each option really does (measured once, in float32)
        if report.capabilities:
            row["capabilities"] = dict(report.capabilities)
        row.update(extra(v.dtype))
        rows.append(row)
    return rows


def _timing(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    from kernel_probe.probe.tolerance import judge_shape

    out = []
    for r in rows:
        row: dict[str, Any] = {
            "implementation": r["implementation"],
            "shape": r["shape"],
            "dtype": r["dtype"],
            "regime": r["regime"],
        }
        if "blas" in r:  # a Linear on a GPU: the BLAS library it was timed under
            row["blas"] = r["blas"]
        if "error" in r:
            row["error"] = r["error"]
        else:
            row.update(
                {
                    "median-ms": _round(r["median_ms"]),
                    "spread": _round(r["spread"], 2),
                    "gbps": _round(r["gbps"]),
                    "compile-s": _round(r["compile_s"], 3),
                }
            )
            # the timed calls, and how their number was decided (kernel_probe.probe.repetitions)
            if "reps" in r:
                row["reps"] = r["reps"]
            if "timed" in r:
                row["timed"] = r["timed"]
            if "copy_percent" in r:  # GPUs only
                row["copy-percent"] = _round(r["copy_percent"], 3)
            if "tflops" in r:
                row["tflops"] = _round(r["tflops"])
            if "peak_bytes" in r:  # Attention on a GPU: peak memory of one fwd+bwd
                row["peak-bytes"] = int(r["peak_bytes"])
        if "check" in r:  # the check at this shape against float64 (kernel_probe.probe.atshape)
            verdict = judge_shape(r["shape"], r["dtype"], r["regime"], r["check"])
            row["checked-rows"] = verdict.sampled
            if verdict.worst_ratio is not None:
                row["worst-error-ratio"] = _round(verdict.worst_ratio, 3)
        out.append(row)
    return out


def build_lock(
    choices: Mapping[str, Choice],
    reports: Mapping[str, list[Report]],
    timings: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
    current: Mapping[str, Any],
    *,
    precision: str,
    canonical: Mapping[str, Mapping[str, Any]] | None = None,
    profile: Mapping[str, Any] | None = None,
    provenance: Mapping[str, Any] | None = None,
    graph_attention: GraphAttention | None = None,
) -> KernelLock:
    """The lock from the choices, verdicts and timings: slots, evidence, rejected candidates and
    fingerprint."""
    slots: dict[str, Slot] = {}
    distributions: set[str] = set()
    trusted: set[str] = set()
    for slot, choice in choices.items():
        cand = choice.report.candidate
        assert cand is not None
        values = {**SPECS[slot].canonical, **((canonical or {}).get(slot) or {})}
        requires: tuple[Requirement, ...] = ()
        if cand.distribution:
            requires = (
                Requirement(
                    name=cand.distribution,
                    specifier=cand.specifier,
                    module=cand.module.split(".")[0],
                ),
            )
            distributions.add(cand.distribution)
        trusted.update(trusted_roots([cand]))
        twin = None
        tw = choice.report.twin
        if cand.twin_target:
            twin = Twin(
                target=cand.twin_target,
                kwargs=cand.pinned_twin_kwargs(values),
                state_dict=tw.get("state_dict", "incompatible"),
                migration=tuple(tw.get("migration", ())),
                max_error=_round(tw["max_error"], 3) if "max_error" in tw else None,
            )
        rejected = tuple(
            RejectedCandidate(
                implementation=r.id,
                target=r.target,
                status=r.status,
                reasons=tuple(_rejection_reasons(r, choice)),
            )
            for r in reports[slot]
            if r.id != cand.id
        )
        slots[slot] = Slot(
            name=slot,
            implementation=cand.id,
            target=cand.target,
            semantics=SPECS[slot].semantics,
            kwargs=cand.pinned_kwargs(values),
            requires=requires,
            devices=cand.devices,
            twin=twin,
            reason=choice.reason,
            changes=tuple(choice.report.changes),
            evidence=tuple(_evidence(choice.report)),
            timing=tuple(
                _timing(
                    [row for rid in sorted(timings.get(slot, {})) for row in timings[slot][rid]]
                )
            ),
            rejected=rejected,
            extra=slot_behaviour.slot(slot).lock_keys(
                values, cand.pinned_kwargs(values), choice.report
            ),
        )
    versions = library_versions(sorted(distributions))
    libraries = {name: v for name, v in versions.items() if v is not None}
    lock = KernelLock(
        created_by=f"kernel-probe {__version__}",
        created_at=dt.datetime.now(dt.timezone.utc)
        .replace(microsecond=0)
        .isoformat()
        .replace("+00:00", "Z"),
        environment=environment(current, libraries),
        slots=slots,
        precision=precision,
        trusted_modules=tuple(sorted(trusted)),
        profile=dict(profile or {}),
        provenance=dict(provenance or {}),
        graph_attention=graph_attention,
    )
    return lock.sealed()


def trusted_roots(candidates: Iterable[Any]) -> tuple[str, ...]:
    """The top-level packages of candidates that are not built in: what a lock written for them asks
    to trust, and what the run that offered them grants."""
    return tuple(sorted({c.target.split(".")[0] for c in candidates if c.source != "builtin"}))


def _rejection_reasons(report: Report, choice: Choice) -> list[str]:
    if report.status == "accepted":
        score = choice.scores.get(report.id)
        if score is None:
            return ["accepted, not timed"] if not report.reasons else report.reasons
        if score >= 1.0:
            return [f"accepted; {score:.2f}x the default's time (geometric mean over the shapes)"]
        return [
            f"accepted; {1 / score:.2f}x faster than the default, but {choice.report.id} was "
            f"chosen ({choice.how})"
        ]
    return list(report.reasons) or [report.status]


def inputs_digest(inputs: Mapping[str, Any]) -> str:
    """sha256 of the probe's inputs as canonical JSON (``provenance.inputs``: reuse when
    unchanged)."""
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def check_writable(path: Path) -> Path:
    """The real path a lock at ``path`` is written to (a symbolic link is written through); a
    UsageError (exit 2) naming the problem and the fix when ``path`` cannot take a lock, or cannot
    be written: called only when a probe will write (reusing a current lock needs no write
    access)."""
    real = resolve_out(path)
    directory = real.parent
    exists = real.exists()
    if os.access(directory, os.W_OK | os.X_OK) and (not exists or os.access(real, os.W_OK)):
        return real
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:  # EROFS: no permission would help
        raise UsageError(
            f"--out {path}: {directory} is on a read-only file system, and the lock "
            + (
                "is not current, so it must be probed again and written"
                if exists
                else "does not exist yet"
            ),
            fix="choose an --out on a writable file system (e.g. --out $TMPDIR/kernel-lock.toml), "
            "or probe where the lock is built and ship the current lock",
        )
    what = (
        f"{real} (permission denied)"
        if exists and os.access(directory, os.W_OK)
        else f"in {directory} (permission denied)"
    )
    raise UsageError(
        f"--out {path}: cannot write {what}",
        fix="choose a writable --out, or fix the permissions",
    )


def resolve_out(path: Path) -> Path:
    """The real path of the lock at ``path`` (a symbolic link is followed), once it is known to be a
    place a lock can be: a UsageError (exit 2) for an empty name, a missing directory, a directory
    or a special file. Needs no write access: a current lock in a read-only directory is reused."""
    import stat

    text = str(path)
    if not text.strip():
        raise UsageError("--out is empty", fix="name the lock file, e.g. --out kernel-lock.toml")
    real = Path(os.path.realpath(path))
    directory = real.parent
    try:
        name_max = os.pathconf(directory if directory.is_dir() else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if len(os.fsencode(file_lock_path(real).name)) > name_max:
        raise UsageError(
            f"--out {text}: the file name is too long for this file system ({len(real.name)} "
            "characters)",
            fix="choose a shorter name",
        )
    if not directory.exists():
        raise UsageError(
            f"--out {text}: the directory {directory} does not exist",
            fix=f"create it (mkdir -p {directory}) or choose another --out",
        )
    if not directory.is_dir():
        raise UsageError(
            f"--out {text}: {directory} is not a directory", fix="choose another --out"
        )
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UsageError(
            f"--out {text}: cannot look at it: {exc.strerror}", fix="choose another --out"
        ) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(
            f"--out {text} is a directory", fix=f"use --out {path / 'kernel-lock.toml'}"
        )
    if mode is not None and not stat.S_ISREG(mode):
        from kernel_lock.trust.files import kind

        raise UsageError(
            f"--out {text} is {kind(mode)}, not a regular file: it is never replaced (not even "
            "with --force)",
            fix="choose a regular file path for the lock",
        )
    return real


# errnos meaning "this file system does not do file locks" (some parallel file systems), not
# "denied"
_NO_LOCKING = {"ENOLCK", "EOPNOTSUPP", "ENOTSUP", "ENOSYS", "EINVAL"}


def file_lock_path(path: Path) -> Path:
    """The file lock concurrent probes of ``path`` share: ``.<name>.lock`` beside it
    (.gitignore'd)."""
    return path.parent / f".{path.name}.lock"


def _wait_reports(first: float = 10.0, every: float = 60.0) -> Iterator[float]:
    """When a waiting probe says how long it has waited: after 10 s, 30 s, 60 s, then every
    minute."""
    yield first
    yield 30.0
    at = 60.0
    while True:
        yield at
        at += every


@contextmanager
def exclusive(
    path: Path,
    timeout: float,
    waiting: Callable[[str], None] | None = None,
    *,
    reports: Iterable[float] | None = None,
) -> Iterator[bool]:
    """Hold a cross-process lock for ``path`` (file ``.<name>.lock`` beside it). Yields False when
    the file system does not do file locks (some parallel file systems), so the caller can say so;
    a lock file this user may not open (left by another user in a shared directory) is an error.

    When another process holds it, ``waiting`` is told once what is waited for, on which file and
    for how long at most, then how long it has waited at each of ``reports`` (seconds; default 10,
    30, 60, then every minute)."""
    import errno
    import time

    from filelock import FileLock, Timeout

    lock_path = file_lock_path(path)
    lock = FileLock(str(lock_path), timeout=timeout)
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if waiting is None:
                lock.acquire()
            else:
                waiting(
                    f"waiting for another kernel-probe writing {path}: its file lock {lock_path} "
                    f"is held; waiting up to {timeout:.0f} s (--lock-timeout), then this probe "
                    "reuses its lock if current"
                )
                start = time.monotonic()
                for at in reports if reports is not None else _wait_reports():
                    left = timeout - (time.monotonic() - start)
                    if left <= 0:
                        raise
                    try:
                        lock.acquire(timeout=max(0.0, min(left, at - (time.monotonic() - start))))
                        break
                    except Timeout:
                        waited = time.monotonic() - start
                        if waited >= timeout:
                            raise
                        waiting(
                            f"still waiting for the file lock of {path}: {waited:.0f} s of at "
                            f"most {timeout:.0f} s"
                        )
                else:
                    lock.acquire(timeout=max(0.0, timeout - (time.monotonic() - start)))
    except Timeout:
        raise ProbeError(
            f"{path}: another kernel-probe held the lock for more than {timeout:.0f} s",
            fix="wait for it, or raise --lock-timeout",
        ) from None
    except PermissionError:
        owner = ""
        try:
            owner = f" (owned by uid {os.stat(lock_path).st_uid}; you are uid {os.getuid()})"
        except OSError:
            pass
        raise UsageError(
            f"--out {path}: cannot open its lock file {lock_path}{owner}: permission denied, so "
            "concurrent probes of this lock could not be kept apart",
            fix=f"remove the stale {lock_path} (or ask its owner to), or choose another --out",
        ) from None
    except OSError as exc:
        if errno.errorcode.get(exc.errno or 0, "") not in _NO_LOCKING:
            raise ProbeError(
                f"{path}: cannot take its file lock {lock_path}: {exc.strerror or exc}",
                fix="check the directory, or choose another --out",
            ) from None
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
