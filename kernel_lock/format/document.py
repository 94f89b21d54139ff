"""The lock document: its top-level keys, the version and digest rules, and the TOML-ready mapping
back.

:class:`LockDocument` is everything a kernel lock *is* (the data);
:class:`kernel_lock.lock.KernelLock` adds what it *does* (verify, resolve), so the resolver can take
a document without importing the module that imports it. The tables inside (slots, environment) are
:mod:`kernel_lock.format.schema`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar, cast

from ..errors import LockFormatError, LockVersionError
from ..files import atomic_write_text
from ..slots import MODES, PRECISIONS, SPECS, Mode, slot_name_fix, spec_of
from ..trust import granted_trust, module_name
from . import toml as _toml
from .graph_attention import TABLE as GRAPH_ATTENTION
from .graph_attention import GraphAttention
from .reading import ReadError, get, get_strings
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
from .tables import EMPTY, NONE, from_dict, one_of, text, to_dict, toml_key

__all__ = [
    "SEAL",
    "LockDocument",
]

_L = TypeVar("_L", bound="LockDocument")
SEAL = "digest"  # the one top-level key the digest does not cover: itself


def _trusted(ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]) -> tuple[str, ...]:
    """``trusted-modules``: module names the lock asks the caller to trust (a request only)."""
    trusted = get_strings(d, key)
    for i, module in enumerate(trusted):
        if not module_name(module):
            raise ReadError(f"{module!r} is not a module name", f"{key}[{i}]")
    ctx.requested = trusted  # a request only: the caller grants trust
    return trusted


def _digest(ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]) -> str:
    digest = get(d, key, str, default="")
    if digest and not DIGEST.fullmatch(digest):
        raise ReadError(f"{digest!r} is not 'sha256:<64 hex digits>'", key)
    return cast(str, digest)


def _environment(
    ctx: Context, d: Mapping[str, Any], key: str, so_far: Mapping[str, Any]
) -> Environment:
    return table(Environment)(ctx, d, key, so_far) or Environment()


def _slots(ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]) -> dict[str, Slot]:
    """``[slots.<name>]``: each a slot kernel_lock knows (or one a trusted package declares)."""
    slots = {}
    tables = get(d, key, dict, default={})
    with ctx.at(key):
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


def _slots_out(slots: Mapping[str, Slot]) -> dict[str, Any]:
    """The slots in kernel_lock's order of slots."""
    return {name: slots[name].to_dict() for name in SPECS if name in slots}


@dataclass(frozen=True, kw_only=True, slots=True)
class LockDocument:
    """A parsed, validated kernel lock's content. Build with ``kernel_lock.load`` / ``loads``; write
    with :meth:`dumps` / :meth:`dump`. The fields' order is the lock's canonical key order."""

    lock_version: str = field(
        default=LOCK_VERSION, metadata=toml_key("lock-version", text(required=True))
    )
    created_by: str = field(metadata=toml_key("created-by", text(required=True)))
    created_at: str = field(default="", metadata=toml_key("created-at", text(), omit=EMPTY))
    mode: Mode = field(
        default="training", metadata=toml_key("mode", one_of(MODES, default="training"))
    )
    precision: str = field(
        default="",
        metadata=toml_key("precision", one_of(("", *PRECISIONS), default=""), omit=EMPTY),
    )
    trusted_modules: tuple[str, ...] = field(
        default=(), metadata=toml_key("trusted-modules", _trusted)
    )
    digest: str = field(default="", metadata=toml_key(SEAL, _digest))
    profile: Mapping[str, Any] = field(
        default_factory=dict, metadata=toml_key("profile", record_table, omit=EMPTY)
    )
    environment: Environment = field(metadata=toml_key("environment", _environment))
    slots: Mapping[str, Slot] = field(metadata=toml_key("slots", _slots, write=_slots_out))
    # [graph-attention]: anemoi's GraphTransformer backend
    graph_attention: GraphAttention | None = field(
        default=None, metadata=toml_key(GRAPH_ATTENTION, table(GraphAttention), omit=NONE)
    )
    provenance: Mapping[str, Any] = field(
        default_factory=dict, metadata=toml_key("provenance", record_table, omit=EMPTY)
    )
    path: str | None = field(default=None, compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    intact: bool = field(default=True, compare=False)
    # modules the caller trusted when loading it
    granted: tuple[str, ...] = field(default=(), compare=False)
    # the modes this process has verified the lock for (kernel_lock.resolve: the fingerprint once
    # per lock); not an argument, so a copy (``replace``) starts unverified
    verified_modes: set[str] = field(init=False, default_factory=set, compare=False, repr=False)

    # ---- construction ---------------------------------------------------------------------
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
            return cls._read(ctx, d, strict)
        except ReadError as exc:  # the dotted key was completed as it unwound; now the file
            kind = (
                exc.kind
                if exc.kind is not None and issubclass(exc.kind, LockFormatError)
                else LockFormatError
            )
            raise kind(exc.problem, path=path, key=exc.key or None, fix=exc.fix) from None

    @classmethod
    def _read(cls: type[_L], ctx: Context, d: Mapping[str, Any], strict: bool) -> _L:
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
        lock = from_dict(cls, ctx, d, path=ctx.path, granted=ctx.granted)
        digest = lock.digest
        if strict and not lock.environment.fields:
            raise ReadError(
                "the lock has no [environment]: it would match any machine",
                "environment",
                fix="re-run `kernel-probe --force` on the machine it is for (it writes the "
                "fingerprint)",
            )
        intact = True
        if not digest:
            ctx.warn(
                "digest",
                "the lock has no digest, so hand edits cannot be detected (run `kernel-probe "
                "rehash`)",
            )
            intact = False
        elif digest != lock.compute_digest():
            intact = False
            problem = (
                "the content does not match the digest: the lock was edited by hand "
                "after kernel-probe wrote it"
            )
            if strict:
                raise ReadError(
                    problem,
                    "digest",
                    fix="re-run `kernel-probe --force`, or accept the edit with `kernel-probe "
                    "rehash LOCK`",
                )
            ctx.warn("digest", problem + " (accept the edit with `kernel-probe rehash LOCK`)")
        return replace(lock, warnings=tuple(ctx.finished_warnings()), intact=intact)

    # ---- serialisation --------------------------------------------------------------------
    def to_dict(self, *, with_digest: bool = True) -> dict[str, Any]:
        """The TOML-ready mapping in canonical key order (``with_digest=False``: what the digest
        covers)."""
        return to_dict(self, without=() if with_digest else (SEAL,))

    def covered(self) -> dict[str, Any]:
        """What the digest covers, by construction: everything :meth:`dumps` writes but the seal
        itself (``SEAL``). A table added to the schema and written is covered without anyone
        remembering to."""
        return {key: value for key, value in self.to_dict().items() if key != SEAL}

    def compute_digest(self) -> str:
        """sha256 of the canonical JSON of :meth:`covered` (every table the lock writes but the
        digest)."""
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
        atomic_write_text(Path(path), self.dumps())
