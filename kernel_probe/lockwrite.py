"""Turning choices into a lock, and writing it safely while other ranks may be doing the same."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kernel_lock.fingerprint import FIELDS, library_versions
from kernel_lock.lock import Candidate as RejectedCandidate
from kernel_lock.lock import EnvField, Environment, KernelLock, Requirement, Slot, Twin

from . import __version__
from .candidates import SLOT_SEMANTICS, CANONICAL
from .checker import Report
from .choose import Choice
from .errors import ProbeError


def environment(current: Mapping[str, Any], libraries: Mapping[str, str]) -> Environment:
    fields = {}
    for name, spec in FIELDS.items():
        match = spec.default_match
        if name == "cpu-microarch" and current.get("device-type") == "cpu":
            match = "exact"  # on a CPU lock, the CPU *is* the device the timings were made on
        fields[name] = EnvField(value=current[name], match=match)
    libs = {name: EnvField(value=version, match="compatible") for name, version in sorted(libraries.items())}
    return Environment(fields=fields, libraries=libs)


def _round(x: float | None, digits: int = 4) -> float | None:
    if x is None:
        return None
    return float(f"{x:.{digits}g}")


def _evidence(report: Report) -> list[dict[str, Any]]:
    rows = []
    for v in report.verdicts:
        row: dict[str, Any] = {"device": v.device, "dtype": v.dtype, "regime": v.regime, "status": v.status}
        if v.worst_ratio is not None:
            row["worst-error-ratio"] = _round(v.worst_ratio, 3)
        row["failed"] = list(v.failed)
        if v.out_dtype:
            row["out-dtype"] = v.out_dtype
        if v.deterministic is not None:
            row["deterministic"] = v.deterministic
        rows.append(row)
    return rows


def _timing(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        row: dict[str, Any] = {"implementation": r["implementation"], "shape": r["shape"], "dtype": r["dtype"],
                               "regime": r["regime"]}  # fmt: skip
        if "error" in r:
            row["error"] = r["error"]
        else:
            row.update({"median-ms": _round(r["median_ms"]), "spread": _round(r["spread"], 2), "gbps": _round(r["gbps"]),
                        "copy-percent": _round(r["copy_percent"], 3), "compile-s": _round(r["compile_s"], 3)})  # fmt: skip
            if "tflops" in r:
                row["tflops"] = _round(r["tflops"])
        out.append(row)
    return out


def build_lock(choices: Mapping[str, Choice], reports: Mapping[str, list[Report]],
               timings: Mapping[str, Mapping[str, list[Mapping[str, Any]]]], current: Mapping[str, Any], *,
               precision: str, canonical: Mapping[str, Mapping[str, Any]] | None = None,
               profile: Mapping[str, Any] | None = None, provenance: Mapping[str, Any] | None = None) -> KernelLock:  # fmt: skip
    slots: dict[str, Slot] = {}
    distributions: set[str] = set()
    trusted: set[str] = set()
    for slot, choice in choices.items():
        cand = choice.report.candidate
        assert cand is not None
        values = {**CANONICAL[slot], **((canonical or {}).get(slot) or {})}
        requires = ()
        if cand.distribution:
            requires = (Requirement(cand.distribution, cand.specifier, cand.module.split(".")[0]),)
            distributions.add(cand.distribution)
        if cand.source != "builtin":
            trusted.add(cand.target.split(".")[0])
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
            RejectedCandidate(r.id, r.target, r.status, tuple(_rejection_reasons(r, choice)))
            for r in reports[slot]
            if r.id != cand.id
        )
        slots[slot] = Slot(
            name=slot,
            implementation=cand.id,
            target=cand.target,
            semantics=SLOT_SEMANTICS[slot],
            kwargs=cand.pinned_kwargs(values),
            requires=requires,
            devices=cand.devices,
            twin=twin,
            reason=choice.reason,
            changes=tuple(choice.report.changes),
            evidence=tuple(_evidence(choice.report)),
            timing=tuple(_timing([row for rid in sorted(timings.get(slot, {})) for row in timings[slot][rid]])),
            rejected=rejected,
        )
    versions = library_versions(sorted(distributions))
    libraries = {name: v for name, v in versions.items() if v is not None}
    lock = KernelLock(
        created_by=f"kernel-probe {__version__}",
        created_at=dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        environment=environment(current, libraries),
        slots=slots,
        precision=precision,
        trusted_modules=tuple(sorted(trusted)),
        profile=dict(profile or {}),
        provenance=dict(provenance or {}),
    )
    return lock.sealed()


def _rejection_reasons(report: Report, choice: Choice) -> list[str]:
    if report.status == "accepted":
        score = choice.scores.get(report.id)
        if score is None:
            return ["accepted, not timed"] if not report.reasons else report.reasons
        if score >= 1.0:
            return [f"accepted; {score:.2f}x the default's time (geometric mean over the shapes)"]
        return [f"accepted; {1 / score:.2f}x faster than the default, but {choice.report.id} was chosen ({choice.how})"]
    return list(report.reasons) or [report.status]


def inputs_digest(inputs: Mapping[str, Any]) -> str:
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def check_writable(path: Path) -> None:
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.exists():
        raise ProbeError(f"{path}: the directory {directory} does not exist",
                         fix=f"create it (mkdir -p {directory}) or choose another --out")  # fmt: skip
    if not directory.is_dir():
        raise ProbeError(f"{path}: {directory} is not a directory", fix="choose another --out")
    if path.is_dir():
        raise ProbeError(f"{path} is a directory", fix=f"use --out {path / 'kernel-lock.toml'}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ProbeError(f"{path}: cannot write in {directory} (permission denied)",
                         fix="choose a writable --out, or fix the directory's permissions")  # fmt: skip


@contextmanager
def exclusive(path: Path, timeout: float) -> Iterator[bool]:
    """Hold a cross-process lock for ``path`` (file ``.<name>.lock`` beside it). Yields False when
    the file system refuses file locks (some parallel file systems), so the caller can say so."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(path.parent / f".{path.name}.lock"), timeout=timeout)
    try:
        lock.acquire()
    except Timeout:
        raise ProbeError(f"{path}: another kernel-probe held the lock for more than {timeout:.0f} s",
                         fix="wait for it, or raise --lock-timeout") from None  # fmt: skip
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
