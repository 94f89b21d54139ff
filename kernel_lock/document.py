"""The lock document: its top-level keys, the version and digest rules, the TOML text.
``KernelLock`` adds what a lock does, so the resolver takes a document without a cycle."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from . import toml as _toml
from .errors import LockFormatError, LockVersionError
from .files import write_file
from .graph_attention import TABLE as GRAPH_ATTENTION
from .graph_attention import GraphAttention
from .model import TABLE as MODEL
from .model import Model
from .schema import (
    LOCK_VERSION,
    VERSION,
    Context,
    Environment,
    Slot,
    read_slot,
    record_table,
    required,
    sha256,
    table,
)
from .slots import MODES, PRECISIONS, SPECS, slot_name_fix, spec_of
from .slots.base import Mode
from .tables import (
    EMPTY,
    NONE,
    Raw,
    ReadError,
    canonical,
    from_dict,
    get,
    get_strings,
    one_of,
    text,
    to_dict,
    toml_field,
)
from .trust import granted_trust, module_name

__all__ = ["SEAL", "LockDocument"]

SEAL = "digest"  # the one top-level key the digest does not cover: itself
_L = TypeVar("_L", bound="LockDocument")
_REHASH = "re-run `kernel-probe --force`, or accept the edit with `kernel-probe rehash LOCK`"


def _trusted(ctx: Context, d: Raw, k: str, _: Raw) -> tuple[str, ...]:
    """``trusted-modules``: module names the lock asks the caller to trust (a request only)."""
    trusted = get_strings(d, k)
    for i, module in enumerate(trusted):
        if not module_name(module):
            raise ReadError(f"{module!r} is not a module name", f"{k}[{i}]")
    ctx.requested = trusted  # a request only: the caller grants trust
    return trusted


def _environment(ctx: Context, d: Raw, k: str, so_far: Any) -> Environment:
    return table(Environment)(ctx, d, k, so_far) or Environment()


def _slots(ctx: Context, d: Raw, k: str, _: Raw) -> dict[str, Slot]:
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
    """A parsed, validated kernel lock's content, fields in canonical key order."""

    lock_version: str = toml_field("lock-version", text(required=True), LOCK_VERSION)
    created_by: str = toml_field("created-by", text(required=True))
    created_at: str = toml_field("created-at", text(), "", omit=EMPTY)
    mode: Mode = toml_field("mode", one_of(MODES, default="training"), "training")
    precision: str = toml_field("precision", one_of(("", *PRECISIONS), default=""), "", omit=EMPTY)
    trusted_modules: tuple[str, ...] = toml_field("trusted-modules", _trusted, ())
    digest: str = toml_field(SEAL, sha256(), "")
    profile: Raw = toml_field("profile", record_table, factory=dict, omit=EMPTY)
    environment: Environment = toml_field("environment", _environment)
    slots: Mapping[str, Slot] = toml_field(
        "slots", _slots, write=lambda s: {n: s[n].to_dict() for n in SPECS if n in s}
    )
    # [graph-attention]: anemoi's GraphTransformer backend
    graph_attention: GraphAttention | None = toml_field(
        GRAPH_ATTENTION, table(GraphAttention), None, omit=NONE
    )
    # [model]: the model the lock was probed for, as traced (``kernel-probe --model``)
    model: Model | None = toml_field(MODEL, table(Model), None, omit=NONE)
    provenance: Raw = toml_field("provenance", record_table, factory=dict, omit=EMPTY)
    path: str | None = field(default=None, compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    intact: bool = field(default=True, compare=False)
    granted: tuple[str, ...] = field(default=(), compare=False)  # the modules the caller trusted
    # the modes verified in this process; not an argument, so a copy starts unverified
    verified_modes: set[str] = field(init=False, default_factory=set, compare=False, repr=False)

    @classmethod
    def _from_dict(
        cls: type[_L],
        d: Raw,
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
        """The TOML-ready mapping (``with_digest=False``: what the digest covers)."""
        return to_dict(self, without=() if with_digest else (SEAL,))

    def covered(self) -> dict[str, Any]:
        """What the digest covers, by construction: all :meth:`dumps` writes but ``SEAL``."""
        return {k: value for k, value in self.to_dict().items() if k != SEAL}

    def compute_digest(self) -> str:
        """sha256 of the canonical JSON of :meth:`covered`."""
        blob = canonical(self.covered())
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()

    def sealed(self: _L) -> _L:
        """A copy whose digest matches its content (what kernel-probe writes)."""
        return replace(self, digest=self.compute_digest(), intact=True)

    def dumps(self) -> str:
        """The lock as TOML text, keys in canonical order."""
        return _toml.dumps(self.to_dict())

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a temp file beside the target, fsync, read back, rename."""
        write_file(path, self.dumps(), through_link=True, check=partial(self.reads_back, path))

    def reads_back(self, where: str | os.PathLike[str], raw: bytes) -> None:
        """Refuse lock text that the reader refuses or reads as another lock: ``loads(dumps(x))
        == x``, compared as the digest compares (a nan equal to itself)."""
        try:
            again = type(self)._from_dict(
                _toml.loads(raw.decode("utf-8")),
                str(where),
                trust=self.granted,
                check_targets=False,
            )
        except (LockFormatError, ValueError) as exc:
            problem, key = getattr(exc, "problem", str(exc)), getattr(exc, "key", None)
        else:
            key = _differs(self.to_dict(), again.to_dict())
            if key is None:
                return
            problem = "it reads back as another value"
        raise LockFormatError(
            f"the lock as written does not read back: {problem}; nothing was written",
            path=str(where),
            key=key,
            fix="a value it holds cannot be written as TOML the reader accepts: fix the input it "
            "came from (or report it as a kernel-probe bug)",
        )


def _differs(a: Any, b: Any, key: str = "") -> str | None:
    """The first dotted key whose value differs between ``a`` and ``b`` (None: equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = (_differs(a.get(k), b.get(k), f"{key}.{k}" if key else k) for k in {**a, **b})
        return next((k for k in found if k is not None), None)
    same = canonical(a) == canonical(b)
    return None if same else key or "<lock>"


def _check_version(ctx: Context, d: Raw) -> None:
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
    """Warn on a missing or broken digest (an error with ``strict``, as no environment)."""
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
