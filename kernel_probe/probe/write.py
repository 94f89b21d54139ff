"""Turning choices into a lock, and writing it safely while other ranks may be doing the same: the
lock's path checked, and a file lock beside it."""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from itertools import chain, count
from pathlib import Path
from typing import Any

from kernel_lock.files import SpecialFile, refuse_special
from kernel_lock.fingerprint import FIELDS, Match, library_versions
from kernel_lock.graph_attention import GraphAttention
from kernel_lock.lock import KernelLock
from kernel_lock.model import Model
from kernel_lock.schema import Candidate as RejectedCandidate
from kernel_lock.schema import EnvField, Environment, Requirement, Slot, Twin
from kernel_lock.slots import SPECS
from kernel_probe import __version__
from kernel_probe import slots as slot_behaviour
from kernel_probe.errors import ProbeError, UsageError
from kernel_probe.probe import repetitions
from kernel_probe.probe.choose import Choice
from kernel_probe.probe.report import Report
from kernel_probe.probe.tolerance import judge_shape

# (field, device type) -> its match rule where not the field's default
_MATCH: dict[tuple[str, str], Match] = {
    ("cpu-microarch", "cpu"): "exact",  # on a CPU lock, the CPU *is* the device timed on
    # one MI250X GCD reads "AMD Instinct MI250X", "... / MI250" or "AMD Radeon Graphics" by
    # libdrm's amdgpu.ids (pytorch PR #147791): arch and features identify it
    ("device-name", "rocm"): "ignore",
    ("numerics-env", "cpu"): "ignore",  # GPU math libraries' settings: they change nothing here
}


def environment(current: Mapping[str, Any], libraries: Mapping[str, str]) -> Environment:
    """The lock's fingerprint from this machine's facts, each with its match rule."""
    kind = current.get("device-type") or ""
    fields = {
        name: EnvField(value=current[name], match=_MATCH.get((name, kind), spec.default_match))
        for name, spec in FIELDS.items()
    }
    libs = {n: EnvField(value=v, match="compatible") for n, v in sorted(libraries.items())}
    return Environment(fields=fields, libraries=libs)


def now() -> str:
    """The lock's ``created-at``: UTC, to the second."""
    stamp = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    return stamp.isoformat().replace("+00:00", "Z")


def _round(x: float | None, digits: int | None = 4) -> float | None:
    return x if x is None or digits is None else float(f"{x:.{digits}g}")


def _evidence(report: Report) -> list[dict[str, Any]]:
    """The lock's evidence rows: one per verdict, with the slot's own fields."""
    rows = []
    extra = slot_behaviour.slot(report.slot).evidence(report)
    for v in report.verdicts:
        row: dict[str, Any] = {"device": v.device, "dtype": v.dtype, "regime": v.regime}
        row["status"] = v.status
        if v.worst_ratio is not None:
            row["worst-error-ratio"] = _round(v.worst_ratio, 3)
        row["failed"] = list(v.failed)
        if v.out_dtype:
            row["out-dtype"] = v.out_dtype
        if v.deterministic is not None:
            row["deterministic"] = v.deterministic
        if v.ratios:  # per output, the largest error / tolerance over the cases
            outputs = dict.fromkeys(o for case in v.ratios.values() for o in case)
            row["error-ratios"] = {
                o: _round(max(case.get(o, 0.0) for case in v.ratios.values()), 3) for o in outputs
            }
        if report.capabilities:  # what each option really does (measured once, in float32)
            row["capabilities"] = dict(report.capabilities)
        row.update(extra(v.dtype))
        rows.append(row)
    return rows


# timing row keys the lock records as they are (rounded to 4, 2 or 3 digits), besides the error
_TIMED = {"median_ms": 4, "spread": 2, "gbps": 4, "compile_s": 3}
_IF_TIMED = {"reps": None, "timed": None, "copy_percent": 3, "tflops": 4}
_IF_TIMED |= {"load_average": 3, "busy_processes": None, "gpu_processes": None}


def _timing(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The lock's timing rows, with the check at each shape's figures."""
    out = []
    for r in rows:
        row: dict[str, Any] = {k: r[k] for k in ("implementation", "shape", "dtype", "regime")}
        if "blas" in r:  # a Linear on a GPU: the BLAS library it was timed under
            row["blas"] = r["blas"]
        if "error" in r:
            row["error"] = r["error"]
        else:
            row.update({k.replace("_", "-"): _round(r[k], d) for k, d in _TIMED.items()})
            for key, digits in _IF_TIMED.items():
                if key in r:
                    row[key.replace("_", "-")] = _round(r[key], digits)
            if "peak_bytes" in r:  # Attention on a GPU: peak memory of one fwd+bwd
                row["peak-bytes"] = int(r["peak_bytes"])
            row.update(_paired(r))
        if "check" in r:  # the check at this shape against float64
            verdict = judge_shape(r["shape"], r["dtype"], r["regime"], r["check"])
            row["checked-rows"] = verdict.sampled
            if verdict.worst_ratio is not None:
                row["worst-error-ratio"] = _round(verdict.worst_ratio, 3)
        out.append(row)
    return out


def _paired(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's ratio to the default at its shape from its paired rounds, with the interval."""
    got = repetitions.paired([row], [row["shape"]]) if row.get("pairs") else None
    if got is None:
        return {}
    out: dict[str, Any] = {"ratio": _round(got.ratio, 3)}
    if got.interval is not None:
        out["interval"] = [_round(x, 3) for x in got.interval]
    return out | {"rounds": got.rounds}


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
    model: Model | None = None,
) -> KernelLock:
    """The sealed lock from the choices, verdicts and timings (``model``: the trace of the model
    it was probed for, its ``[model]`` table)."""
    slots = {
        slot: _slot(slot, choice, reports[slot], timings.get(slot, {}), (canonical or {}).get(slot))
        for slot, choice in choices.items()
    }
    chosen = [c.report.candidate for c in choices.values() if c.report.candidate is not None]
    distributions = sorted({c.distribution for c in chosen if c.distribution})
    libraries = {n: v for n, v in library_versions(distributions).items() if v is not None}
    lock = KernelLock(
        created_by=f"kernel-probe {__version__}",
        created_at=now(),
        environment=environment(current, libraries),
        slots=slots,
        precision=precision,
        trusted_modules=trusted_roots(chosen),
        profile=dict(profile or {}),
        provenance=dict(provenance or {}),
        graph_attention=graph_attention,
        model=model,
    )
    return lock.sealed()


def _slot(
    slot: str,
    choice: Choice,
    reports: Sequence[Report],
    timings: Mapping[str, Sequence[Mapping[str, Any]]],
    canonical: Mapping[str, Any] | None,
) -> Slot:
    """One slot's entry: the chosen candidate pinned, its twin, evidence, timings, the others."""
    cand = choice.report.candidate
    assert cand is not None
    values = {**SPECS[slot].canonical, **(canonical or {})}
    requires: tuple[Requirement, ...] = ()
    if cand.distribution:
        module = cand.module.split(".")[0]
        requires = (Requirement(name=cand.distribution, specifier=cand.specifier, module=module),)
    twin, tw = None, choice.report.twin
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
        for r in reports
        if r.id != cand.id
    )
    kwargs = cand.pinned_kwargs(values)
    return Slot(
        name=slot,
        implementation=cand.id,
        target=cand.target,
        semantics=SPECS[slot].semantics,
        kwargs=kwargs,
        requires=requires,
        devices=cand.devices,
        twin=twin,
        reason=choice.reason,
        changes=tuple(choice.report.changes),
        evidence=tuple(_evidence(choice.report)),
        timing=tuple(_timing([row for rid in sorted(timings) for row in timings[rid]])),
        rejected=rejected,
        extra=slot_behaviour.slot(slot).lock_keys(values, kwargs, choice.report),
    )


def trusted_roots(candidates: Iterable[Any]) -> tuple[str, ...]:
    """The top-level packages of candidates not built in: what a lock for them asks to trust."""
    return tuple(sorted({c.target.split(".")[0] for c in candidates if c.source != "builtin"}))


def _rejection_reasons(report: Report, choice: Choice) -> list[str]:
    if report.status != "accepted":
        return list(report.reasons) or [report.status]
    score, ratio = choice.scores.get(report.id), choice.ratios.get(report.id)
    if score is None:
        return ["accepted, not timed"] if not report.reasons else report.reasons
    over = "the model's time in the slot" if choice.weighted else "geometric mean over the shapes"
    if ratio is None:  # the default itself, or no default to compare with
        return [f"accepted; {score:.2f}x the default's time ({over})"]
    said = f"accepted; {ratio.verdict}: {ratio.said()} against the default ({over})"
    but = f", but {choice.report.id} was chosen ({choice.how})" if ratio.verdict == "faster" else ""
    return [said + but]


def inputs_digest(inputs: Mapping[str, Any]) -> str:
    """sha256 of the probe's inputs as canonical JSON (``provenance.inputs``)."""
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def check_writable(path: Path) -> Path:
    """The real path a lock at ``path`` is written to, or a UsageError (exit 2) with the fix."""
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
        state = "is not current, so it must be probed again and written"
        state = state if exists else "does not exist yet"
        raise UsageError(
            f"--out {path}: {directory} is on a read-only file system, and the lock {state}",
            fix="choose an --out on a writable file system (e.g. --out $TMPDIR/kernel-lock.toml), "
            "or probe where the lock is built and ship the current lock",
        )
    denied = exists and os.access(directory, os.W_OK)
    what = f"{real} (permission denied)" if denied else f"in {directory} (permission denied)"
    raise UsageError(
        f"--out {path}: cannot write {what}", fix="choose a writable --out, or fix the permissions"
    )


def resolve_out(path: Path) -> Path:
    """The real path of the lock at ``path`` (links followed), or a UsageError (exit 2)."""
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
        mode = os.stat(path).st_mode  # links followed: /dev/stdout names the pipe, not its path
    except FileNotFoundError:
        return real
    except OSError as exc:
        raise UsageError(
            f"--out {text}: cannot look at it: {exc.strerror}", fix="choose another --out"
        ) from None
    if stat.S_ISDIR(mode):
        raise UsageError(
            f"--out {text} is a directory", fix=f"use --out {path / 'kernel-lock.toml'}"
        )
    try:
        refuse_special(path, "--out")
    except SpecialFile as exc:  # check_writable's callers expect a UsageError
        raise UsageError(exc.problem, path=exc.path, fix=exc.fix) from None
    return real


# errnos meaning "this file system does not do file locks" (some parallel file systems)
_NO_LOCKING = {"ENOLCK", "EOPNOTSUPP", "ENOTSUP", "ENOSYS", "EINVAL"}


def file_lock_path(path: Path) -> Path:
    """The file lock concurrent probes of ``path`` share: ``.<name>.lock`` beside it."""
    return path.parent / f".{path.name}.lock"


@contextmanager
def exclusive(
    path: Path,
    timeout: float,
    waiting: Callable[[str], None] | None = None,
    *,
    reports: Iterable[float] | None = None,
) -> Iterator[bool]:
    """Hold a cross-process lock for ``path`` (``file_lock_path``); yields False where the file
    system has no file locks; one this user may not open is an error. While another holds it,
    ``waiting`` is told so, then how long at each of ``reports`` (default: 10 s, 30 s, 60 s, then
    every minute)."""
    from filelock import FileLock, Timeout  # a probe that writes: not the warm path

    lock_path = file_lock_path(path)
    lock = FileLock(str(lock_path), timeout=timeout)
    try:
        _acquire(lock, path, timeout, waiting, reports)
    except Timeout:
        raise ProbeError(
            f"{path}: another kernel-probe held the lock for more than {timeout:.0f} s",
            fix="wait for it, or raise --lock-timeout",
        ) from None
    except PermissionError:
        owner = ""
        with suppress(OSError):
            owner = f" (owned by uid {os.stat(lock_path).st_uid}; you are uid {os.getuid()})"
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


def _acquire(
    lock: Any,
    path: Path,
    timeout: float,
    waiting: Callable[[str], None] | None,
    reports: Iterable[float] | None,
) -> None:
    """Take ``lock`` within ``timeout`` s, telling ``waiting`` while another process holds it."""
    from filelock import Timeout  # a probe that writes: not the warm path

    try:
        lock.acquire(timeout=0)
        return
    except Timeout:
        if waiting is None:
            lock.acquire()
            return
    waiting(
        f"waiting for another kernel-probe writing {path}: its file lock {file_lock_path(path)} "
        f"is held; waiting up to {timeout:.0f} s (--lock-timeout), then this probe reuses its "
        "lock if current"
    )
    start = time.monotonic()
    for at in reports if reports is not None else chain((10.0, 30.0), count(60.0, 60.0)):
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            raise Timeout(str(file_lock_path(path)))
        try:
            lock.acquire(timeout=max(0.0, min(left, at - (time.monotonic() - start))))
            return
        except Timeout:
            waited = time.monotonic() - start
            if waited >= timeout:
                raise
            waiting(
                f"still waiting for the file lock of {path}: {waited:.0f} s of at most "
                f"{timeout:.0f} s"
            )
    lock.acquire(timeout=max(0.0, timeout - (time.monotonic() - start)))
