"""The kernel lock: the document (its top-level keys, version and digest rules), :class:`KernelLock`
(the document plus verify and resolve), and the entry points that read one (:func:`load`,
:func:`loads`); ``KernelLock.dumps`` / ``dump`` write it.

A lock is read from a regular file of at most ``MAX_BYTES`` (``kernel_lock.files``), parsed as
TOML, then validated by its tables (:mod:`kernel_lock.schema`); which targets may be imported is
:mod:`kernel_lock.trust`'s. Resolution is :mod:`kernel_lock.resolve`'s, reached through the methods.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar, cast

from . import toml as _toml
from .errors import LockFormatError, LockVersionError, LockWarning
from .files import UnsafeFile, read_regular, write_file
from .graph_attention import TABLE as GRAPH_ATTENTION
from .graph_attention import GraphAttention
from .schema import (
    DIGEST,
    LOCK_VERSION,
    VERSION,
    Context,
    Environment,
    Slot,
    read_slot,
    record_table,
    required,
    table,
)
from .slots import MODES, PRECISIONS, SPECS, Mode, slot_name_fix, spec_of
from .tables import EMPTY, NONE, ReadError, from_dict, get, get_strings, one_of, text, to_dict
from .tables import toml_key as key
from .trust import granted_trust, module_name

__all__ = [
    "MAX_BYTES",
    "SEAL",
    "KernelLock",
    "load",
    "loads",
]

MAX_BYTES = 8 << 20  # a lock is a few kB; anything this large is not one
SEAL = "digest"  # the one top-level key the digest does not cover: itself
_L = TypeVar("_L", bound="LockDocument")
_REHASH = "re-run `kernel-probe --force`, or accept the edit with `kernel-probe rehash LOCK`"


def _trusted(ctx: Context, d: Mapping[str, Any], k: str, _: Mapping[str, Any]) -> tuple[str, ...]:
    """``trusted-modules``: module names the lock asks the caller to trust (a request only)."""
    trusted = get_strings(d, k)
    for i, module in enumerate(trusted):
        if not module_name(module):
            raise ReadError(f"{module!r} is not a module name", f"{k}[{i}]")
    ctx.requested = trusted  # a request only: the caller grants trust
    return trusted


def _digest(ctx: Context, d: Mapping[str, Any], k: str, _: Mapping[str, Any]) -> str:
    digest = get(d, k, str, default="")
    if digest and not DIGEST.fullmatch(digest):
        raise ReadError(f"{digest!r} is not 'sha256:<64 hex digits>'", k)
    return cast(str, digest)


def _environment(ctx: Context, d: Mapping[str, Any], k: str, so_far: Any) -> Environment:
    return table(Environment)(ctx, d, k, so_far) or Environment()


def _slots(ctx: Context, d: Mapping[str, Any], k: str, _: Mapping[str, Any]) -> dict[str, Slot]:
    """``[slots.<name>]``: each a slot kernel_lock knows (or one a trusted package declares)."""
    slots, tables = {}, get(d, k, dict, default={})
    with ctx.at(k):
        for name, value in tables.items():
            try:
                spec = spec_of(name, ctx.granted)
            except LockFormatError as exc:
                raise ReadError(exc.problem, name, exc.fix) from None
            if spec is None:
                raise ReadError(f"unknown slot {name!r}", name, fix=slot_name_fix(name))
            with ctx.at(name):
                slots[name] = read_slot(ctx, name, value, spec)
    return slots


@dataclass(frozen=True, kw_only=True, slots=True)
class LockDocument:
    """A parsed, validated kernel lock's content (the fields' order is the canonical key order);
    :class:`KernelLock` adds what it does, so the resolver can take a document without importing
    this module."""

    lock_version: str = field(
        default=LOCK_VERSION, metadata=key("lock-version", text(required=True))
    )
    created_by: str = field(metadata=key("created-by", text(required=True)))
    created_at: str = field(default="", metadata=key("created-at", text(), omit=EMPTY))
    mode: Mode = field(default="training", metadata=key("mode", one_of(MODES, default="training")))
    precision: str = field(
        default="", metadata=key("precision", one_of(("", *PRECISIONS), default=""), omit=EMPTY)
    )
    trusted_modules: tuple[str, ...] = field(default=(), metadata=key("trusted-modules", _trusted))
    digest: str = field(default="", metadata=key(SEAL, _digest))
    profile: Mapping[str, Any] = field(
        default_factory=dict, metadata=key("profile", record_table, omit=EMPTY)
    )
    environment: Environment = field(metadata=key("environment", _environment))
    slots: Mapping[str, Slot] = field(
        metadata=key("slots", _slots, write=lambda s: {n: s[n].to_dict() for n in SPECS if n in s})
    )
    # [graph-attention]: anemoi's GraphTransformer backend
    graph_attention: GraphAttention | None = field(
        default=None, metadata=key(GRAPH_ATTENTION, table(GraphAttention), omit=NONE)
    )
    provenance: Mapping[str, Any] = field(
        default_factory=dict, metadata=key("provenance", record_table, omit=EMPTY)
    )
    path: str | None = field(default=None, compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    intact: bool = field(default=True, compare=False)
    granted: tuple[str, ...] = field(default=(), compare=False)  # the modules the caller trusted
    # the modes this process has verified the lock for (kernel_lock.resolve: the fingerprint once
    # per lock); not an argument, so a copy (``replace``) starts unverified
    verified_modes: set[str] = field(init=False, default_factory=set, compare=False, repr=False)

    @classmethod
    def _from_dict(
        cls: type[_L],
        d: Mapping[str, Any],
        path: str | None = None,
        *,
        strict: bool = False,
        trust: Sequence[str] = (),
        check_targets: bool = True,
    ) -> _L:
        ctx = Context(path, granted_trust(trust), check_targets)
        try:
            _check_version(ctx, d)
            lock = from_dict(cls, ctx, d, path=ctx.path, granted=ctx.granted)
            intact = _check_digest(ctx, lock, strict)
        except ReadError as exc:  # the dotted key was completed as it unwound; now the file
            kind = exc.kind if exc.kind and issubclass(exc.kind, LockFormatError) else None
            raise (kind or LockFormatError)(
                exc.problem, path=path, key=exc.key or None, fix=exc.fix
            ) from None
        return replace(lock, warnings=tuple(ctx.finished_warnings()), intact=intact)

    def to_dict(self, *, with_digest: bool = True) -> dict[str, Any]:
        """The TOML-ready mapping in canonical key order (``with_digest=False``: what the digest
        covers)."""
        return to_dict(self, without=() if with_digest else (SEAL,))

    def covered(self) -> dict[str, Any]:
        """What the digest covers, by construction: everything :meth:`dumps` writes but ``SEAL``
        (a table added to the schema and written is covered without anyone remembering to)."""
        return {k: value for k, value in self.to_dict().items() if k != SEAL}

    def compute_digest(self) -> str:
        """sha256 of the canonical JSON of :meth:`covered`."""
        blob = json.dumps(self.covered(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()

    def sealed(self: _L) -> _L:
        """A copy whose digest matches its content (what kernel-probe writes)."""
        return replace(self, digest=self.compute_digest(), intact=True)

    def dumps(self) -> str:
        """The lock as TOML text, keys in canonical order."""
        return _toml.dumps(self.to_dict())

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a temp file in the same directory, fsync, then rename over the
        target."""
        write_file(path, self.dumps(), through_link=True)


def _check_version(ctx: Context, d: Mapping[str, Any]) -> None:
    version = required(d, "lock-version")
    m = VERSION.fullmatch(version)
    if not m:
        raise ReadError(
            f"{version!r} is not a MAJOR.MINOR version like {LOCK_VERSION!r}", "lock-version"
        )
    major, minor = int(m.group(1)), int(m.group(2))
    ours_major, ours_minor = (int(x) for x in LOCK_VERSION.split("."))
    if major != ours_major:
        raise LockVersionError(
            f"lock-version {version} is not supported (this kernel_lock reads {ours_major}.x)",
            path=ctx.path,
            key="lock-version",
            fix="upgrade kernel-probe to read newer locks, or re-run `kernel-probe "
            f"--force` to write a {LOCK_VERSION} lock"
            if major > ours_major
            else "re-run `kernel-probe --force` to write a current lock",
        )
    if minor > ours_minor:
        ctx.warn(
            "lock-version",
            f"minor version {version} is newer than {LOCK_VERSION}; unknown keys are ignored",
        )


def _check_digest(ctx: Context, lock: LockDocument, strict: bool) -> bool:
    """Whether the digest seals the content; a lock without one, or edited, is warned about (an
    error with ``strict``, as is a lock without an environment)."""
    if strict and not lock.environment.fields:
        raise ReadError(
            "the lock has no [environment]: it would match any machine",
            "environment",
            fix="re-run `kernel-probe --force` on the machine it is for (it writes the "
            "fingerprint)",
        )
    if not lock.digest:
        ctx.warn(
            "digest",
            "the lock has no digest, so hand edits cannot be detected (run `kernel-probe rehash`)",
        )
        return False
    if lock.digest == lock.compute_digest():
        return True
    problem = (
        "the content does not match the digest: the lock was edited by hand after kernel-probe "
        "wrote it"
    )
    if strict:
        raise ReadError(problem, "digest", fix=_REHASH)
    ctx.warn("digest", problem + " (accept the edit with `kernel-probe rehash LOCK`)")
    return False


class KernelLock(LockDocument):
    """A parsed, validated kernel lock. Build with :func:`load` / :func:`loads`; write with
    :meth:`dumps`; check this machine with :meth:`verify`; build the pinned classes with
    :meth:`factory`."""

    __slots__ = ()

    def verify(
        self,
        mode: str | None = None,
        *,
        current: Mapping[str, Any] | None = None,
        targets: str | None = None,
    ) -> list[str]:
        """Check this machine against the lock (``kernel_lock.resolve.verify``); its warnings."""
        from .resolve import verify  # resolve imports torch-heavy paths lazily; and this module

        return verify(self, mode=mode, current=current, targets=targets)

    def factory(self, slot: str, mode: str | None = None, **options: Any):
        """The class the lock pins for ``slot``, verified (``kernel_lock.resolve.factory``)."""
        from .resolve import factory  # cycle: resolve reads locks

        return factory(self, slot, mode=mode, **options)

    def resolve_all(self, mode: str | None = None) -> dict[str, Any]:
        """Every slot's class, by slot name."""
        from .resolve import factory  # cycle: resolve reads locks

        return {name: factory(self, name, mode=mode) for name in self.slots}


def _fail(where: str, problem: str, fix: str | None = None) -> LockFormatError:
    return LockFormatError(problem, path=where, fix=fix)


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
    # the file reader's limit, for every source of lock text (a file, a checkpoint, a rank's report)
    size = (
        len(text)
        if isinstance(text, bytes) or len(text) > MAX_BYTES
        else len(text.encode("utf-8", "replace"))
    )
    if size > MAX_BYTES:
        raise _fail(
            where,
            f"is {size} bytes, more than the {MAX_BYTES} this input may have",
            "pass the right lock; a real one is a few kB",
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(
                where,
                f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                "a lock is a TOML text file written by kernel-probe",
            ) from None
    try:
        data = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise _fail(
            where,
            f"not valid TOML: {exc}",
            "restore the file from version control or re-run `kernel-probe --force`",
        ) from None
    except (ValueError, RecursionError) as exc:  # e.g. a NUL byte, absurd nesting
        raise _fail(where, f"not valid TOML: {exc}") from None
    try:
        lock = KernelLock._from_dict(
            data, path=where, strict=strict, trust=trust, check_targets=check_targets
        )
    except RecursionError:
        raise _fail(where, "nesting too deep") from None
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
    """Read and validate the lock at ``path`` (a regular file of at most 8 MiB). See
    :func:`loads`."""
    where = str(Path(path))
    try:
        raw = read_regular(path, MAX_BYTES)
    except FileNotFoundError:
        raise _fail(
            where,
            "no such file",
            "run `kernel-probe --out PATH` on this machine to write one, or check the path",
        ) from None
    except UnsafeFile as exc:
        directory = "directory" in exc.problem
        fix = f"pass the lock file itself, e.g. {Path(path) / 'kernel-lock.toml'}"
        raise _fail(where, exc.problem, fix if directory else exc.fix or None) from None
    except OSError as exc:
        raise _fail(
            where, f"cannot read: {exc.strerror}", "check the path and its permissions"
        ) from None
    return loads(
        raw,
        path=where,
        strict=strict,
        emit_warnings=emit_warnings,
        trust=trust,
        check_targets=check_targets,
    )
