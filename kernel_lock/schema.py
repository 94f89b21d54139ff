"""The lock's tables, format v1 (``docs/lock-format.md``): frozen dataclasses whose fields
declare their TOML key, reader and omission, in canonical key order."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import Any, Literal, TypeVar, get_args

from .errors import LockFormatError, TargetNotAllowed
from .fingerprint import FIELDS, Match
from .slots import (
    SPECS,
    STATUSES,
    SlotSpec,
    Status,
    computation_fix,
    computation_problem,
    semantics,
)
from .slots.base import NONE_VALUE
from .tables import (
    EMPTY,
    FIX_MISSING,
    NONE,
    REST,
    Raw,
    ReadError,
    Table,
    context,
    from_dict,
    get,
    get_required,
    get_tables,
    identifier,
    identifiers,
    join,
    non_negative,
    one_of,
    plain,
    refuse_controls,
    strings,
    text,
    to_dict,
    toml_field,
    type_name,
    value_problem,
)
from .toml import toml_value
from .trust import DOTTED, MODULE, check_target

__all__ = [
    "LOCK_VERSION",
    "MATCH_RULES",
    "Candidate",
    "Context",
    "EnvField",
    "Environment",
    "Requirement",
    "Slot",
    "Twin",
    "record",
    "required",
    "sha256",
    "table",
    "tables",
]

# 1.1: accepted-changes, migrations; 1.2: torch-rocm, device-features, numerics-env; 1.3: blas
LOCK_VERSION = "1.4"
MATCH_RULES: tuple[Match, ...] = get_args(Match)
# a twin's state dict against the pinned class's
StateDict = Literal["interchangeable", "migrate", "incompatible"]
STATE_DICT: tuple[StateDict, ...] = get_args(StateDict)
DIGEST = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
VERSION = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})", re.ASCII)
_MAX_WARNINGS = 20  # per lock: 300k unknown keys are one summary, not 300k lines
_SCALAR = (str, int, float, bool)
_T = TypeVar("_T")


class Context:
    """The state of reading one lock: file, current table, trust granted, warnings."""

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

    def objects(self, d: Raw, key: str, build: Callable[[Raw], _T]) -> tuple[_T, ...]:
        """The array of tables at ``key``, each built by ``build`` at ``key[i]``."""
        out = []
        for i, table in enumerate(get_tables(d, key)):
            with self.at(f"{key}[{i}]"):
                out.append(build(table))
        return tuple(out)

    def object(self, d: Raw, key: str, build: Callable[[Raw], _T]) -> _T | None:
        """The table at ``key`` built by ``build`` (None when absent)."""
        table = get(d, key, dict)
        if table is None:
            return None
        with self.at(key):
            return build(table)

    def warn(self, key: str, problem: str) -> None:
        """A warning about ``key`` (relative to the current table), kept until parsing succeeds."""
        if len(self.warnings) >= _MAX_WARNINGS:
            self.dropped += 1
            return
        where = reduce(join, [*self.where, key])
        self.warnings.append(f"{self.path or '<lock>'}: '{where}': {problem}")

    def unknown(self, d: Raw, known: Sequence[str], what: str = "key") -> None:
        """Warn about each key of ``d`` not in ``known`` (a newer writer's, ignored)."""
        for key in d:
            if key not in known:
                self.warn(key, f"unknown {what}, ignored (written by a newer kernel-probe?)")

    def check(self, target: str, key: str, what: str = "target") -> None:
        """A target the lock names: on the allow-list (or, for a lock only printed, dotted)."""
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
        """The warnings, capped, plus a line counting the rest."""
        more = f"{self.path or '<lock>'}: ... and {self.dropped} more warning(s) like these"
        return self.warnings + ([more] if self.dropped else [])


def required(d: Raw, key: str, typ: Any = str) -> Any:
    """A key the lock must have; missing, the fix points at docs/lock-format.md."""
    return get_required(d, key, typ, fix=FIX_MISSING.format(key=key))


def _kwargs(ctx: Context, d: Raw, key: str, _: Raw) -> dict[str, Any]:
    values = get(d, key, dict, default={})
    for name, value in values.items():
        where = f"{key}.{name}"
        if not name.isidentifier() or not name.isascii():
            raise ReadError("a keyword argument name must be a Python identifier", where)
        if not all(isinstance(v, _SCALAR) for v in _listed(value)):
            raise ReadError(
                "constructor kwargs must be strings, numbers, booleans or lists of them, got "
                f"{type(value).__name__}",
                where,
            )
    return plain_values(values, key, "pin a finite value (e.g. eps = 1e-5)")


def plain_values(values: Raw, key: str, fix: str) -> dict[str, Any]:
    """``values``, each (or each item of a list) a finite number within 64 bits or a name (a
    string without control characters: never a line of a rendered file)."""
    for name, value in values.items():
        for v in _listed(value):
            if isinstance(v, str):
                refuse_controls(v, f"{key}.{name}")
            problem = value_problem(v, finite=True)
            if problem:
                raise ReadError(problem, f"{key}.{name}", fix=fix)
    return dict(values)


def _written_kwargs(kwargs: Raw) -> dict[str, Any]:
    """The kwargs as TOML takes them: a None (RMSNorm's eps=None) written ``NONE_VALUE``."""
    return {name: NONE_VALUE if v is None else plain(v) for name, v in kwargs.items()}


def _nones(spec: SlotSpec, kwargs: Raw) -> dict[str, Any]:
    """The kwargs with ``NONE_VALUE`` read as None where the slot's keyword takes None."""
    takes = {name for name, p in spec.params.items() if p.none}
    return {k: None if k in takes and v == NONE_VALUE else v for k, v in kwargs.items()}


def record(d: Raw) -> dict[str, Any]:
    """Evidence and timing rows: free-form flat records whose values are all TOML-writable."""
    for key, value in d.items():
        if isinstance(value, (dict, list)):
            pairs = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in pairs:
                if not isinstance(v, _SCALAR):
                    where = f"{key}.{k}" if isinstance(value, dict) else f"{key}[{k}]"
                    raise ReadError("evidence values must be strings, numbers or booleans", where)
        elif not isinstance(value, _SCALAR):
            raise ReadError(f"unsupported value of type {type(value).__name__}", key)
        for v in value.values() if isinstance(value, dict) else _listed(value):
            problem = value_problem(v, finite=False)
            if problem:
                raise ReadError(problem, key)
    return dict(d)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# ---- the fields' readers (each called with the reading state, the table, the key, the values)
def _target(ctx: Context, d: Raw, key: str, _: Raw) -> str:
    """A class the lock names: required, and on the allow-list."""
    target = required(d, key)
    ctx.check(target, key)
    return target


def _specifier(ctx: Context, d: Raw, key: str, _: Raw) -> str:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet  # only where a slot requires

    spec = get(d, key, str, default="")
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        raise ReadError(
            f"{spec!r} is not a PEP 440 version specifier like '>=0.8,<0.9'", key
        ) from None
    return spec


def _module(ctx: Context, d: Raw, key: str, _: Raw) -> str:
    module = get(d, key, str, default="")
    if module and not MODULE.fullmatch(module):
        raise ReadError(f"{module!r} is not a module name", key)
    if module and ctx.check_targets:
        # looked up on the file system only, never imported; still only allow-listed modules
        ctx.check(module if "." in module else module + ".x", key, what="requirement module")
    return module


def sha256(*, required: bool = False) -> Callable[[Context, Raw, str, Raw], str]:
    """A ``sha256:<64 hex digits>`` digest (``""`` when absent, unless ``required``)."""

    def read(ctx: Context, d: Raw, key: str, _: Raw) -> str:
        digest = get(d, key, str, default="")
        if (digest or required) and not DIGEST.fullmatch(digest):
            raise ReadError(f"{digest!r} is not 'sha256:<64 hex digits>'", key)
        return str(digest)

    return read


def _records(ctx: Context, d: Raw, key: str, _: Raw) -> tuple[Raw, ...]:
    return ctx.objects(d, key, record)


def record_table(ctx: Context, d: Raw, key: str, _: Raw) -> Raw:
    """A free-form flat table (``[profile]``, ``[provenance]``): empty when absent."""
    return ctx.object(d, key, record) or {}


def tables(cls: type[_T]) -> Callable[[Context, Raw, str, Raw], tuple[_T, ...]]:
    """An array of ``cls`` tables (empty when absent), each read at ``key[i]``."""
    return lambda ctx, d, key, _: ctx.objects(d, key, lambda t: from_dict(cls, ctx, t))


def table(cls: type[_T]) -> Callable[[Context, Raw, str, Raw], _T | None]:
    """A ``cls`` table (None when absent), read at ``key``."""
    return lambda ctx, d, key, _: ctx.object(d, key, lambda t: from_dict(cls, ctx, t))


# ---- the tables ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class EnvField(Table):
    """One fingerprint field: the value seen when locking, and how strictly it must match."""

    value: str | int = toml_field("value", lambda ctx, d, k, _: get_required(d, k, (str, int)))
    match: Match = toml_field("match", one_of(MATCH_RULES, default="exact"), "exact")


def _env_field(ctx: Context, name: str, d: Any, typ: Any, problem: str | None = None) -> EnvField:
    with ctx.at(name):
        if not isinstance(d, dict):
            raise ReadError('expected a table like { value = "...", match = "exact" }')
        env = from_dict(EnvField, ctx, d)
        if typ is not None and not isinstance(env.value, typ):
            got = type(env.value).__name__
            raise ReadError(problem or f"expected {type_name(typ)}, got {got}", "value")
    return env


def _env_fields(ctx: Context, d: Raw, key: str, _: Raw) -> dict[str, EnvField]:
    """``[environment]``'s named fields: every key but ``libraries``, in file order."""
    fields = {}
    for name, value in d.items():
        if name == "libraries":
            continue
        if name not in FIELDS:
            ctx.warn(
                name, "unknown environment field, not checked (written by a newer kernel-probe?)"
            )
        fields[name] = _env_field(ctx, name, value, FIELDS[name].type if name in FIELDS else None)
    return fields


def _env_fields_out(fields: Mapping[str, EnvField]) -> dict[str, Any]:
    """The known fields in their catalogue order, then the others sorted."""
    order = list(FIELDS) + sorted(k for k in fields if k not in FIELDS)
    return {k: fields[k].to_dict() for k in order if k in fields}


def _libraries(ctx: Context, d: Raw, key: str, _: Raw) -> dict[str, EnvField]:
    with ctx.at(key):
        return {
            name: _env_field(ctx, name, v, str, "a library version must be a string")
            for name, v in get(d, key, dict, default={}).items()
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Environment(Table):
    """The fingerprint: named fields, plus the versions of the libraries the chosen kernels need."""

    fields: Mapping[str, EnvField] = toml_field(
        REST, _env_fields, factory=dict, write=_env_fields_out
    )
    libraries: Mapping[str, EnvField] = toml_field(
        "libraries",
        _libraries,
        factory=dict,
        omit=EMPTY,
        write=lambda libs: {k: libs[k].to_dict() for k in sorted(libs)},
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Requirement(Table):
    """A distribution a slot needs: name, PEP 440 specifier, the module it provides."""

    name: str = toml_field("name", identifier(required=True))
    specifier: str = toml_field("specifier", _specifier, "")
    module: str = toml_field("module", _module, "", omit=EMPTY)


@dataclass(frozen=True, kw_only=True, slots=True)
class Twin(Table):
    """The portable torch.nn equivalent used for inference where the training library is absent."""

    target: str = toml_field("target", _target)
    kwargs: Raw = toml_field("kwargs", _kwargs, factory=dict, write=_written_kwargs)
    state_dict: StateDict = toml_field(
        "state-dict", one_of(STATE_DICT, default="interchangeable"), "interchangeable"
    )
    migration: tuple[str, ...] = toml_field("migration", strings, (), omit=EMPTY)
    max_error: float | None = toml_field("max-error", non_negative, None, omit=NONE)


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate(Table):
    """A candidate considered for a slot and not chosen, with the verdict and its reasons."""

    implementation: str = toml_field("implementation", identifier(required=True))
    target: str = toml_field("target", text(), "")
    status: Status = toml_field("status", one_of(STATUSES))
    reasons: tuple[str, ...] = toml_field("reasons", strings, ())


def _semantics(ctx: Context, d: Raw, key: str, so_far: Raw) -> str:
    return str(one_of(semantics())(ctx, d, key, so_far))


@dataclass(frozen=True, kw_only=True, slots=True)
class Slot(Table):
    """What the lock pins for one slot; the slot's own keys are written after the key each names."""

    name: str  # the slot's table name, not a key inside it
    implementation: str = toml_field("implementation", identifier(required=True))
    target: str = toml_field("target", _target)
    semantics: str = toml_field("semantics", _semantics)
    kwargs: Raw = toml_field("kwargs", _kwargs, factory=dict, write=_written_kwargs)
    requires: tuple[Requirement, ...] = toml_field("requires", tables(Requirement), ())
    devices: tuple[str, ...] = toml_field("devices", identifiers, ())
    reason: str = toml_field("reason", text(), "")
    # what the implementation changes besides numbers, accepted explicitly
    changes: tuple[str, ...] = toml_field("accepted-changes", strings, (), omit=EMPTY)
    twin: Twin | None = toml_field("twin", table(Twin), None, omit=NONE)
    evidence: tuple[Raw, ...] = toml_field("evidence", _records, (), omit=EMPTY)
    timing: tuple[Raw, ...] = toml_field("timing", _records, (), omit=EMPTY)
    rejected: tuple[Candidate, ...] = toml_field("rejected", tables(Candidate), (), omit=EMPTY)
    extra: Raw = field(default_factory=dict)  # the slot's own keys, by key

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready table: each generic key followed by the slot's keys written after it."""
        out: dict[str, Any] = {}
        keys = SPECS[self.name].keys
        for name, value in to_dict(self).items():
            out[name] = value
            for k in keys:
                if k.after == name and k.name in self.extra and not k.omit(self.extra[k.name]):
                    out[k.name] = k.write(self.extra[k.name])
        return out


def read_slot(ctx: Context, name: str, d: Any, spec: SlotSpec) -> Slot:
    """The slot ``name``'s table: its semantics must be the slot's; other slots' keys refused."""
    if not isinstance(d, dict):
        raise ReadError("expected a table")
    others = [k for s in SPECS.values() if s is not spec for k in s.keys]
    slot = from_dict(Slot, ctx, d, known=[k.name for k in (*spec.keys, *others)], name=name)
    for k in others:
        k.refuse(name, d)
    extra = {k.name: v for k in spec.keys if (v := k.read(ctx, d, k.name)) is not None}
    twin = slot.twin and replace(slot.twin, kwargs=_nones(spec, slot.twin.kwargs))
    slot = replace(slot, extra=extra, kwargs=_nones(spec, slot.kwargs), twin=twin)
    if slot.semantics != spec.semantics:
        raise ReadError(
            f"slot {name} needs semantics {spec.semantics!r}, the lock pins {slot.semantics!r} "
            "(an RMSNorm is not a LayerNorm: it drops the mean and the bias)",
            "semantics",
            fix=f"pin a {spec.semantics} implementation for {name}, or move this entry to the "
            "matching slot",
        )
    judged = [("", slot.target, slot.kwargs)] + (
        [("twin.", twin.target, twin.kwargs)] if twin else []
    )
    for at, _, kwargs in judged:
        _typed(spec, kwargs, f"{at}kwargs")
    for at, target, kwargs in judged:  # what it computes, told without importing
        problem = computation_problem(slot, target, kwargs, twin=bool(at))
        if problem:
            raise ReadError(
                f"slot {name}: {problem}: the model's maths would change",
                f"{at}target",
                fix=computation_fix(bool(at)),
                kind=TargetNotAllowed,
            )
    return slot


def _typed(spec: SlotSpec, kwargs: Raw, key: str) -> None:
    """Each keyword the slot declares (``SlotSpec.params``) of its type and in its range."""
    for name, value in kwargs.items():
        param = spec.params.get(name)
        problem = param.problem(value) if param is not None else None
        if param is not None and problem:
            value = spec.canonical.get(name)  # its default; None written as NONE_VALUE
            said = (
                toml_value(NONE_VALUE if value is None else value) if name in spec.canonical else ""
            )
            raise ReadError(
                f"{spec.name}'s {name}: {problem}",
                f"{key}.{name}",
                fix=f"{name} must be {param.what}" + (f", e.g. {name} = {said}" if said else ""),
            )
