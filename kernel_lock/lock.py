"""The kernel lock as a whole: :class:`KernelLock`, and the entry points that read and write one.

``load`` / ``loads`` read a lock (a regular file of at most ``MAX_BYTES``, TOML, then validated);
``KernelLock.dumps`` / ``dump`` write it back (atomically, ``kernel_lock._files``). The tables inside
a lock and their keys are :mod:`kernel_lock.schema`'s; the typed getters :mod:`kernel_lock.reading`'s;
which targets may be imported :mod:`kernel_lock.trust`'s. Here: the top-level keys, the version and
digest rules, and turning a :class:`~kernel_lock.reading.ReadError` into a ``LockFormatError`` that
names the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import _toml
from ._files import atomic_write_text
from .errors import LockFormatError, LockVersionError, LockWarning
from .reading import ReadError, get, get_strings
from .schema import (
    _DIGEST,
    _VERSION,
    LOCK_VERSION,
    Environment,
    Slot,
    _choice,
    _Ctx,
    _record,
    _required,
)
from .slots import MODES, PRECISIONS, SLOTS, slot_name_fix
from .trust import granted_trust, module_name

MAX_BYTES = 8 << 20  # a lock is a few kB; anything this large is not one


@dataclass(frozen=True)
class KernelLock:
    """A parsed, validated kernel lock. Build with :func:`load` / :func:`loads`; write with :meth:`dumps`."""

    created_by: str
    environment: Environment
    slots: Mapping[str, Slot]
    lock_version: str = LOCK_VERSION
    created_at: str = ""
    mode: str = "training"
    precision: str = ""
    trusted_modules: tuple[str, ...] = ()
    profile: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)
    digest: str = ""
    path: str | None = field(default=None, compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    intact: bool = field(default=True, compare=False)
    granted: tuple[str, ...] = field(default=(), compare=False)  # modules the caller trusted when loading it

    _KEYS = (
        "lock-version",
        "created-by",
        "created-at",
        "mode",
        "precision",
        "trusted-modules",
        "digest",
        "profile",
        "environment",
        "slots",
        "provenance",
    )

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def _from_dict(
        cls,
        d: Mapping[str, Any],
        path: str | None = None,
        *,
        strict: bool = False,
        trust: Sequence[str] = (),
        check_targets: bool = True,
    ) -> KernelLock:
        ctx = _Ctx(path, granted_trust(trust), check_targets)
        try:
            return cls._read(ctx, d, strict)
        except ReadError as exc:  # the dotted key was completed as it unwound; now the file
            kind = exc.kind if exc.kind is not None and issubclass(exc.kind, LockFormatError) else LockFormatError
            raise kind(exc.problem, path=path, key=exc.key or None, fix=exc.fix) from None

    @classmethod
    def _read(cls, ctx: _Ctx, d: Mapping[str, Any], strict: bool) -> KernelLock:
        version = _required(d, "lock-version")
        m = _VERSION.fullmatch(version)
        if not m:
            raise ReadError(f"{version!r} is not a MAJOR.MINOR version like {LOCK_VERSION!r}", "lock-version")
        major, minor = int(m.group(1)), int(m.group(2))
        ours_major, ours_minor = (int(x) for x in LOCK_VERSION.split("."))
        if major != ours_major:
            raise LockVersionError(
                f"lock-version {version} is not supported (this kernel_lock reads {ours_major}.x)",
                path=ctx.path,
                key="lock-version",
                fix="upgrade kernel-probe to read newer locks, or re-run `kernel-probe --force` to write a "
                f"{LOCK_VERSION} lock"
                if major > ours_major
                else "re-run `kernel-probe --force` to write a current lock",
            )
        if minor > ours_minor:
            ctx.warn("lock-version", f"minor version {version} is newer than {LOCK_VERSION}; unknown keys are ignored")
        ctx.unknown(d, cls._KEYS)
        trusted = get_strings(d, "trusted-modules")
        for i, module in enumerate(trusted):
            if not module_name(module):
                raise ReadError(f"{module!r} is not a module name", f"trusted-modules[{i}]")
        ctx.requested = trusted  # a request only: the caller grants trust
        slots = {}
        slots_d = get(d, "slots", dict, default={})
        with ctx.at("slots"):
            for name, value in slots_d.items():
                if name not in SLOTS:
                    raise ReadError(f"unknown slot {name!r}", name, fix=slot_name_fix(name))
                with ctx.at(name):
                    slots[name] = Slot._from_dict(ctx, name, value)
        digest = get(d, "digest", str, default="")
        if digest and not _DIGEST.fullmatch(digest):
            raise ReadError(f"{digest!r} is not 'sha256:<64 hex digits>'", "digest")
        lock = cls(
            lock_version=version,
            created_by=_required(d, "created-by"),
            created_at=get(d, "created-at", str, default=""),
            mode=_choice(d, "mode", MODES, default="training"),
            precision=_choice(d, "precision", ("", *PRECISIONS), default=""),
            trusted_modules=trusted,
            profile=ctx.object(d, "profile", _record) or {},
            environment=ctx.object(d, "environment", lambda e: Environment._from_dict(ctx, e)) or Environment(),
            slots=slots,
            provenance=ctx.object(d, "provenance", _record) or {},
            digest=digest,
            path=ctx.path,
            granted=ctx.granted,
        )
        if strict and not lock.environment.fields:
            raise ReadError(
                "the lock has no [environment]: it would match any machine",
                "environment",
                fix="re-run `kernel-probe --force` on the machine it is for (it writes the fingerprint)",
            )
        intact = True
        if not digest:
            ctx.warn("digest", "the lock has no digest, so hand edits cannot be detected (run `kernel-probe rehash`)")
            intact = False
        elif digest != lock.compute_digest():
            intact = False
            problem = "the content does not match the digest: the lock was edited by hand after kernel-probe wrote it"
            if strict:
                raise ReadError(
                    problem,
                    "digest",
                    fix="re-run `kernel-probe --force`, or accept the edit with `kernel-probe rehash LOCK`",
                )
            ctx.warn("digest", problem + " (accept the edit with `kernel-probe rehash LOCK`)")
        return replace(lock, warnings=tuple(ctx.finished_warnings()), intact=intact)

    # ---- serialisation --------------------------------------------------------------------
    def to_dict(self, *, with_digest: bool = True) -> dict[str, Any]:
        """The TOML-ready mapping in canonical key order (``with_digest=False``: what the digest covers)."""
        out: dict[str, Any] = {"lock-version": self.lock_version, "created-by": self.created_by}
        if self.created_at:
            out["created-at"] = self.created_at
        out["mode"] = self.mode
        if self.precision:
            out["precision"] = self.precision
        out["trusted-modules"] = list(self.trusted_modules)
        if with_digest:
            out["digest"] = self.digest
        if self.profile:
            out["profile"] = dict(self.profile)
        out["environment"] = self.environment.to_dict()
        out["slots"] = {name: self.slots[name].to_dict() for name in SLOTS if name in self.slots}
        if self.provenance:
            out["provenance"] = dict(self.provenance)
        return out

    def compute_digest(self) -> str:
        """sha256 of the canonical JSON of the content (the digest itself excluded)."""
        blob = json.dumps(self.to_dict(with_digest=False), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()

    def sealed(self) -> KernelLock:
        """A copy whose digest matches its content (what kernel-probe writes)."""
        return replace(self, digest=self.compute_digest(), intact=True)

    def dumps(self) -> str:
        """The lock as TOML text, keys in canonical order."""
        return _toml.dumps(self.to_dict())

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a temp file in the same directory, fsync, then rename over the target."""
        atomic_write_text(Path(path), self.dumps())

    # ---- resolution (kept in resolve.py; thin methods here so the lock is the entry point) --
    def verify(
        self, mode: str | None = None, *, current: Mapping[str, Any] | None = None, targets: str | None = None
    ) -> list[str]:
        """Check this machine against the lock (``kernel_lock.resolve.verify``); the warnings it returns."""
        from .resolve import verify

        return verify(self, mode=mode, current=current, targets=targets)

    def factory(self, slot: str, mode: str | None = None, **options: Any):
        """The class the lock pins for ``slot``, verified (``kernel_lock.resolve.factory``)."""
        from .resolve import factory

        return factory(self, slot, mode=mode, **options)

    def resolve_all(self, mode: str | None = None) -> dict[str, Any]:
        """Every slot's class, by slot name."""
        from .resolve import factory

        return {name: factory(self, name, mode=mode) for name in self.slots}


def loads(
    text: str | bytes,
    *,
    path: str | None = None,
    strict: bool = False,
    emit_warnings: bool = True,
    trust: Sequence[str] = (),
    check_targets: bool = True,
) -> KernelLock:
    """Parse and validate lock text. Any problem raises a :class:`LockError` subclass.

    ``trust``: modules you trust beyond the built-in allow-list (also ``$KERNEL_LOCK_TRUST``); the
    lock's own ``trusted-modules`` only ask for it. ``strict``: a hand-edited lock, or one without
    an environment, is an error. ``check_targets=False`` parses without the allow-list (for printing
    a lock; nothing resolves without the allow-list anyway).
    """
    where = path or "<lock>"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LockFormatError(
                f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                path=where,
                fix="a lock is a TOML text file written by kernel-probe",
            ) from None
    try:
        data = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise LockFormatError(
            f"not valid TOML: {exc}",
            path=where,
            fix="restore the file from version control or re-run `kernel-probe --force`",
        ) from None
    except (ValueError, RecursionError) as exc:  # e.g. a NUL byte, absurd nesting
        raise LockFormatError(f"not valid TOML: {exc}", path=where) from None
    try:
        lock = KernelLock._from_dict(data, path=where, strict=strict, trust=trust, check_targets=check_targets)
    except RecursionError:
        raise LockFormatError("nesting too deep", path=where) from None
    if emit_warnings:
        for message in lock.warnings:
            warnings.warn(message, LockWarning, stacklevel=3)
    return lock


def load(
    path: str | os.PathLike[str],
    *,
    strict: bool = False,
    emit_warnings: bool = True,
    trust: Sequence[str] = (),
    check_targets: bool = True,
) -> KernelLock:
    """Read and validate the lock at ``path`` (a regular file of at most 8 MiB). See :func:`loads`."""
    from ._files import UnsafeFile, read_regular

    p = Path(path)
    where = str(p)
    try:
        raw = read_regular(p, MAX_BYTES)
    except FileNotFoundError:
        raise LockFormatError(
            "no such file",
            path=where,
            fix="run `kernel-probe --out PATH` on this machine to write one, or check the path",
        ) from None
    except UnsafeFile as exc:
        fix = f"pass the lock file itself, e.g. {p / 'kernel-lock.toml'}" if "directory" in exc.problem else exc.fix
        raise LockFormatError(exc.problem, path=where, fix=fix or None) from None
    except OSError as exc:
        raise LockFormatError(
            f"cannot read: {exc.strerror}", path=where, fix="check the path and its permissions"
        ) from None
    return loads(raw, path=where, strict=strict, emit_warnings=emit_warnings, trust=trust, check_targets=check_targets)
