"""The kernel-lock file's schema, format v1: frozen objects, their TOML keys, and their validation.

The layout is documented in ``docs/lock-format.md``. Each table is a frozen, keyword-only, slotted
dataclass whose fields declare their TOML key, their typed reader and when they are left out, in the
field's metadata (:func:`kernel_lock.format.tables.toml_key`); the fields' order is the canonical
key order. One generic pair reads and writes every table
(:func:`kernel_lock.format.tables.from_dict` and ``to_dict``), each nested table read inside
:meth:`Context.at`, so an error names its dotted key as it unwinds. Whether a target may be imported
is :mod:`kernel_lock.trust`'s to say; reading and writing files is :mod:`kernel_lock.lock`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import Any, Literal, TypeVar, cast, get_args

from ..errors import LockFormatError
from ..fingerprint import FIELDS, Match
from ..slots import STATUSES, SlotSpec, Status, semantics
from ..trust import DOTTED, MODULE, check_target
from .reading import ReadError, context, get, get_choice, get_required, get_tables, join, type_name
from .tables import (
    EMPTY,
    FIX_MISSING,
    NONE,
    REST,
    Table,
    from_dict,
    one_of,
    strings,
    text,
    to_dict,
    toml_key,
)

__all__ = [
    "DIGEST",
    "INT64",
    "LOCK_VERSION",
    "MATCH_RULES",
    "MAX_WARNINGS",
    "STATE_DICT",
    "VERSION",
    "Candidate",
    "Context",
    "EnvField",
    "Environment",
    "Match",
    "Requirement",
    "Scalar",
    "Slot",
    "StateDict",
    "Twin",
    "choice",
    "read_slot",
    "record",
    "record_table",
    "required",
    "table",
    "tables",
]

# 1.1: accepted-changes, rename/transpose migrations; 1.2: environment torch-rocm, device-features,
# numerics-env; 1.3: slots.Linear.blas, and the timing rows' check at the model's shape
# (checked-rows, worst-error-ratio)
LOCK_VERSION = "1.3"
MATCH_RULES: tuple[Match, ...] = get_args(Match)
StateDict = Literal[
    "interchangeable", "migrate", "incompatible"
]  # a twin's state dict against the pinned class's
STATE_DICT: tuple[StateDict, ...] = get_args(StateDict)

DIGEST = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
VERSION = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})", re.ASCII)
MAX_WARNINGS = 20  # per lock: 300k unknown keys are one summary, not 300k lines
INT64 = 1 << 63

_T = TypeVar("_T")
Scalar = (str, int, float, bool)


class Context:
    """The state of reading one lock: the file, the table being read, the trust granted, and the
    warnings to report once parsing succeeds."""

    def __init__(self, path: str | None, granted: Sequence[str] = (), check_targets: bool = True):
        self.path = path
        self.warnings: list[str] = []
        self.dropped = 0
        self.granted = tuple(granted)
        self.requested: tuple[str, ...] = ()
        self.check_targets = check_targets
        self.where: list[str] = []

    @contextmanager
    def at(self, key: str) -> Iterator[None]:
        """Read the table at ``key`` (relative to the current one): warnings and errors name it."""
        self.where.append(key)
        try:
            with context(key):
                yield
        finally:
            self.where.pop()

    def objects(
        self, d: Mapping[str, Any], key: str, build: Callable[[Mapping[str, Any]], _T]
    ) -> tuple[_T, ...]:
        """The array of tables at ``key``, each built by ``build`` at ``key[i]``."""
        out = []
        for i, table in enumerate(get_tables(d, key)):
            with self.at(f"{key}[{i}]"):
                out.append(build(table))
        return tuple(out)

    def object(
        self, d: Mapping[str, Any], key: str, build: Callable[[Mapping[str, Any]], _T]
    ) -> _T | None:
        """The table at ``key`` built by ``build`` (None when absent)."""
        table = get(d, key, dict)
        if table is None:
            return None
        with self.at(key):
            return build(table)

    def warn(self, key: str, problem: str) -> None:
        """A warning about ``key`` (relative to the current table), kept until parsing succeeds."""
        if len(self.warnings) >= MAX_WARNINGS:
            self.dropped += 1
            return
        self.warnings.append(
            f"{self.path or '<lock>'}: '{reduce(join, [*self.where, key])}': {problem}"
        )

    def unknown(self, d: Mapping[str, Any], known: Sequence[str], what: str = "key") -> None:
        """Warn about each key of ``d`` not in ``known`` (a newer writer's, ignored)."""
        for key in d:
            if key not in known:
                self.warn(key, f"unknown {what}, ignored (written by a newer kernel-probe?)")

    def check(self, target: str, key: str, what: str = "target") -> None:
        """A target the lock names: on the allow-list (or, for a lock only printed, a dotted
        path)."""
        try:
            if self.check_targets:
                check_target(target, self.granted, requested=self.requested, what=what)
            elif not DOTTED.fullmatch(target):
                raise LockFormatError(
                    f"{target!r} is not a dotted import path like 'torch.nn.LayerNorm'"
                )
        except LockFormatError as exc:
            raise ReadError(exc.problem, key, exc.fix, kind=type(exc)) from None

    def finished_warnings(self) -> list[str]:
        """The warnings, capped at ``MAX_WARNINGS`` plus a line counting the rest."""
        more = (
            [f"{self.path or '<lock>'}: ... and {self.dropped} more warning(s) like these"]
            if self.dropped
            else []
        )
        return self.warnings + more


def required(d: Mapping[str, Any], key: str, typ: Any = str) -> Any:
    """A key the lock must have; missing, the fix points at docs/lock-format.md."""
    return get_required(d, key, typ, fix=FIX_MISSING.format(key=key))


def choice(
    d: Mapping[str, Any], key: str, choices: Sequence[str], default: str | None = None
) -> str:
    """A string among ``choices`` (required unless there is a ``default``)."""
    return get_choice(d, key, choices, default, fix=FIX_MISSING.format(key=key))


def _value_problem(value: Any, *, finite: bool) -> str | None:
    """Why a scalar from the file cannot be used: integers beyond 64 bits, non-finite numbers."""
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return (
            f"integer {str(value)[:20]}... is beyond 64 bits"
            if len(str(value)) > 20
            else f"integer {value} is beyond 64 bits"
        )
    if finite and isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    return None


def _kwargs(d: Mapping[str, Any], key: str) -> dict[str, Any]:
    values = get(d, key, dict, default={})
    for name, value in values.items():
        where = f"{key}.{name}"
        if not name.isidentifier() or not name.isascii():
            raise ReadError("a keyword argument name must be a Python identifier", where)
        ok = isinstance(value, Scalar) or (
            isinstance(value, list)
            and all(isinstance(v, Scalar) and not isinstance(v, list) for v in value)
        )
        if not ok:
            raise ReadError(
                "constructor kwargs must be strings, numbers, booleans or lists of them, got "
                f"{type(value).__name__}",
                where,
            )
        for v in value if isinstance(value, list) else [value]:
            problem = _value_problem(v, finite=True)
            if problem:
                raise ReadError(problem, where, fix="pin a finite value (e.g. eps = 1e-5)")
    return dict(values)


def record(d: Mapping[str, Any]) -> dict[str, Any]:
    """Evidence and timing rows: free-form flat records, but every value must be TOML-writable."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(v, Scalar):
                    raise ReadError(
                        "evidence values must be strings, numbers or booleans", f"{key}.{k}"
                    )
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if not isinstance(v, Scalar):
                    raise ReadError(
                        "evidence values must be strings, numbers or booleans", f"{key}[{i}]"
                    )
        elif not isinstance(value, Scalar):
            raise ReadError(f"unsupported value of type {type(value).__name__}", key)
        for v in (
            value.values()
            if isinstance(value, dict)
            else value
            if isinstance(value, list)
            else [value]
        ):
            problem = _value_problem(v, finite=False)
            if problem:
                raise ReadError(problem, key)
        out[key] = value
    return out


# ---- the fields' readers (each called with the reading state, the table, the key, the values)
def _env_value(ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]) -> str | int:
    value = get(d, key, (str, int))
    if value is None:
        raise ReadError("required key is missing", key)
    return cast("str | int", value)


def _target(ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]) -> str:
    """A class the lock names: required, and on the allow-list (or a dotted path, for a lock only
    printed)."""
    target = required(d, key)
    ctx.check(target, key)
    return target


def _specifier(ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]) -> str:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    spec = get(d, key, str, default="")
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        raise ReadError(
            f"{spec!r} is not a PEP 440 version specifier like '>=0.8,<0.9'", key
        ) from None
    return spec


def _module(ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]) -> str:
    module = get(d, key, str, default="")
    if module and not MODULE.fullmatch(module):
        raise ReadError(f"{module!r} is not a module name", key)
    if module and ctx.check_targets:
        # looked up by its top-level name on the file system only, never imported; still, a lock
        # names only modules the allow-list covers
        ctx.check(module if "." in module else module + ".x", key, what="requirement module")
    return module


def _max_error(ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]) -> float | None:
    max_error = get(d, key, float)
    if max_error is not None and (not math.isfinite(max_error) or max_error < 0):
        raise ReadError("must be a non-negative finite number", key)
    return cast("float | None", max_error)


def _kwargs_field(
    ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]
) -> dict[str, Any]:
    return _kwargs(d, key)


def _records(
    ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]
) -> tuple[Mapping[str, Any], ...]:
    """Evidence and timing rows: an array of :func:`record` tables."""
    return ctx.objects(d, key, record)


def record_table(
    ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]
) -> Mapping[str, Any]:
    """A free-form flat table (``[profile]``, ``[provenance]``): empty when absent."""
    return ctx.object(d, key, record) or {}


def tables(
    cls: type[_T],
) -> Callable[[Context, Mapping[str, Any], str, Mapping[str, Any]], tuple[_T, ...]]:
    """An array of ``cls`` tables (empty when absent), each read at ``key[i]``."""
    return lambda ctx, d, key, _: ctx.objects(d, key, lambda t: from_dict(cls, ctx, t))


def table(
    cls: type[_T],
) -> Callable[[Context, Mapping[str, Any], str, Mapping[str, Any]], _T | None]:
    """A ``cls`` table (None when absent), read at ``key``."""
    return lambda ctx, d, key, _: ctx.object(d, key, lambda t: from_dict(cls, ctx, t))


def _semantics(ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]) -> str:
    return str(one_of(semantics())(ctx, d, key, _))


# ---- the tables ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class EnvField(Table):
    """One fingerprint field: the value seen when the lock was written, and how strictly it must
    match."""

    value: str | int = field(metadata=toml_key("value", _env_value))
    match: Match = field(
        default="exact", metadata=toml_key("match", one_of(MATCH_RULES, default="exact"))
    )


def _env_field(ctx: Context, d: Any) -> EnvField:
    if not isinstance(d, dict):
        raise ReadError('expected a table like { value = "...", match = "exact" }')
    return from_dict(EnvField, ctx, d)


def _env_fields(
    ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]
) -> dict[str, EnvField]:
    """``[environment]``'s named fields: every key but ``libraries``, in file order."""
    fields = {}
    for name, value in d.items():
        if name == "libraries":
            continue
        if name not in FIELDS:
            ctx.warn(
                name, "unknown environment field, not checked (written by a newer kernel-probe?)"
            )
        with ctx.at(name):
            fields[name] = _env_field(ctx, value)
            expected = FIELDS.get(name)
            if expected is not None and not isinstance(fields[name].value, expected.type):
                got = type(fields[name].value).__name__
                raise ReadError(f"expected {type_name(expected.type)}, got {got}", "value")
    return fields


def _env_fields_out(fields: Mapping[str, EnvField]) -> dict[str, Any]:
    """The named fields, the known ones in their catalogue order, then the others sorted."""
    order = list(FIELDS) + sorted(k for k in fields if k not in FIELDS)
    return {k: fields[k].to_dict() for k in order if k in fields}


def _libraries(
    ctx: Context, d: Mapping[str, Any], key: str, _: Mapping[str, Any]
) -> dict[str, EnvField]:
    libraries = {}
    with ctx.at(key):
        for name, v in get(d, key, dict, default={}).items():
            with ctx.at(name):
                libraries[name] = _env_field(ctx, v)
                if not isinstance(libraries[name].value, str):
                    raise ReadError("a library version must be a string", "value")
    return libraries


@dataclass(frozen=True, kw_only=True, slots=True)
class Environment(Table):
    """The fingerprint: named fields, plus the versions of the libraries the chosen kernels need."""

    fields: Mapping[str, EnvField] = field(
        default_factory=dict, metadata=toml_key(REST, _env_fields, write=_env_fields_out)
    )
    libraries: Mapping[str, EnvField] = field(
        default_factory=dict,
        metadata=toml_key(
            "libraries",
            _libraries,
            omit=EMPTY,
            write=lambda libs: {k: libs[k].to_dict() for k in sorted(libs)},
        ),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Requirement(Table):
    """A distribution a slot's implementation needs: name + PEP 440 specifier, and the module it
    provides."""

    name: str = field(metadata=toml_key("name", text(required=True)))
    specifier: str = field(default="", metadata=toml_key("specifier", _specifier))
    module: str = field(default="", metadata=toml_key("module", _module, omit=EMPTY))


@dataclass(frozen=True, kw_only=True, slots=True)
class Twin(Table):
    """The portable torch.nn equivalent used for inference where the training library is absent."""

    target: str = field(metadata=toml_key("target", _target))
    kwargs: Mapping[str, Any] = field(
        default_factory=dict, metadata=toml_key("kwargs", _kwargs_field)
    )
    state_dict: StateDict = field(
        default="interchangeable",
        metadata=toml_key("state-dict", one_of(STATE_DICT, default="interchangeable")),
    )
    migration: tuple[str, ...] = field(
        default=(), metadata=toml_key("migration", strings, omit=EMPTY)
    )
    max_error: float | None = field(
        default=None, metadata=toml_key("max-error", _max_error, omit=NONE)
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate(Table):
    """A candidate that was considered for a slot and not chosen, with the verdict and its
    reasons."""

    implementation: str = field(metadata=toml_key("implementation", text(required=True)))
    target: str = field(default="", metadata=toml_key("target", text()))
    status: Status = field(metadata=toml_key("status", one_of(STATUSES)))
    reasons: tuple[str, ...] = field(default=(), metadata=toml_key("reasons", strings))


@dataclass(frozen=True, kw_only=True, slots=True)
class Slot(Table):
    """What the lock pins for one slot. Its fields' order is the canonical key order of
    ``[slots.<name>]``; the slot's own keys (``SlotSpec.keys``: ``extra``) are written after the key
    each names."""

    name: str  # the slot's table name, not a key inside it
    implementation: str = field(metadata=toml_key("implementation", text(required=True)))
    target: str = field(metadata=toml_key("target", _target))
    semantics: str = field(metadata=toml_key("semantics", _semantics))
    kwargs: Mapping[str, Any] = field(
        default_factory=dict, metadata=toml_key("kwargs", _kwargs_field)
    )
    requires: tuple[Requirement, ...] = field(
        default=(), metadata=toml_key("requires", tables(Requirement))
    )
    devices: tuple[str, ...] = field(default=(), metadata=toml_key("devices", strings))
    reason: str = field(default="", metadata=toml_key("reason", text()))
    # what the implementation changes besides numbers, accepted explicitly
    changes: tuple[str, ...] = field(
        default=(), metadata=toml_key("accepted-changes", strings, omit=EMPTY)
    )
    twin: Twin | None = field(default=None, metadata=toml_key("twin", table(Twin), omit=NONE))
    evidence: tuple[Mapping[str, Any], ...] = field(
        default=(), metadata=toml_key("evidence", _records, omit=EMPTY)
    )
    timing: tuple[Mapping[str, Any], ...] = field(
        default=(), metadata=toml_key("timing", _records, omit=EMPTY)
    )
    rejected: tuple[Candidate, ...] = field(
        default=(), metadata=toml_key("rejected", tables(Candidate), omit=EMPTY)
    )
    extra: Mapping[str, Any] = field(default_factory=dict)  # the slot's own keys, by key

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready table: the generic keys, each followed by the slot's keys written after
        it."""
        out: dict[str, Any] = {}
        keys = _spec(self.name).keys
        for name, value in to_dict(self).items():
            out[name] = value
            for k in keys:
                if k.after == name and k.name in self.extra and not k.omit(self.extra[k.name]):
                    out[k.name] = k.write(self.extra[k.name])
        return out


def _spec(name: str) -> SlotSpec:
    from ..slots import SPECS

    return SPECS[name]


def read_slot(ctx: Context, name: str, d: Any, spec: SlotSpec) -> Slot:
    """The slot ``name``'s table, read at ``slots.<name>``: its semantics must be the slot's, a key
    of another slot's is refused."""
    if not isinstance(d, dict):
        raise ReadError("expected a table")
    from ..slots import SPECS

    others = [k for s in SPECS.values() if s is not spec for k in s.keys]
    slot = from_dict(Slot, ctx, d, known=[k.name for k in (*spec.keys, *others)], name=name)
    for k in others:
        k.refuse(name, d)
    extra = {k.name: k.read(ctx, d, k.name) for k in spec.keys}
    slot = replace(slot, extra={k: v for k, v in extra.items() if v is not None})
    expected = spec.semantics
    if slot.semantics != expected:
        raise ReadError(
            f"slot {name} needs semantics {expected!r}, the lock pins {slot.semantics!r} "
            "(an RMSNorm is not a LayerNorm: it drops the mean and the bias)",
            "semantics",
            fix=f"pin a {expected} implementation for {name}, or move this entry to the "
            "matching slot",
        )
    return slot
