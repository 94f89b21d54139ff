"""The kernel-lock file's schema, format v1: frozen objects, their TOML keys, and their validation.

The layout is documented in ``docs/lock-format.md``. Each object's TOML keys are written here only:
its ``_KEYS`` (canonical order, and the keys a reader knows), its ``_from_dict`` (built with the typed
getters of :mod:`kernel_lock.reading`, each nested table read inside :meth:`Context.at`, so an error
names its dotted key as it unwinds) and its ``to_dict`` (the TOML-ready mapping in canonical order).
Whether a target may be imported is :mod:`kernel_lock.trust`'s to say; reading and writing files is
:mod:`kernel_lock.lock`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Literal, TypeVar, cast, get_args

from ..errors import LockFormatError
from ..trust import DOTTED, MODULE, check_target
from .activations import read_function
from .blas import ALL as BLAS_LIBRARIES
from .blas import Blas, device_of
from .reading import ReadError, context, get, get_choice, get_required, get_strings, get_tables, join, type_name
from .slots import SEMANTICS, SLOT_SEMANTICS, STATUSES, Status

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
    "record",
    "required",
]

# 1.1: accepted-changes, rename/transpose migrations; 1.2: environment torch-rocm, device-features, numerics-env;
# 1.3: slots.Linear.blas, and the timing rows' check at the model's shape (checked-rows, worst-error-ratio)
LOCK_VERSION = "1.3"
Match = Literal["exact", "compatible", "ignore"]  # how strictly a fingerprint field must match
MATCH_RULES: tuple[Match, ...] = get_args(Match)
StateDict = Literal["interchangeable", "migrate", "incompatible"]  # a twin's state dict against the pinned class's
STATE_DICT: tuple[StateDict, ...] = get_args(StateDict)

DIGEST = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
VERSION = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})", re.ASCII)
MAX_WARNINGS = 20  # per lock: 300k unknown keys are one summary, not 300k lines
INT64 = 1 << 63
_FIX_MISSING = "add `{key} = ...` (see docs/lock-format.md)"

_T = TypeVar("_T")
Scalar = (str, int, float, bool)


class Context:
    """The state of reading one lock: the file, the table being read, the trust granted, and the warnings
    to report once parsing succeeds."""

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

    def objects(self, d: Mapping[str, Any], key: str, build: Callable[[Mapping[str, Any]], _T]) -> tuple[_T, ...]:
        """The array of tables at ``key``, each built by ``build`` at ``key[i]``."""
        out = []
        for i, table in enumerate(get_tables(d, key)):
            with self.at(f"{key}[{i}]"):
                out.append(build(table))
        return tuple(out)

    def object(self, d: Mapping[str, Any], key: str, build: Callable[[Mapping[str, Any]], _T]) -> _T | None:
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
        self.warnings.append(f"{self.path or '<lock>'}: '{reduce(join, [*self.where, key])}': {problem}")

    def unknown(self, d: Mapping[str, Any], known: Sequence[str], what: str = "key") -> None:
        """Warn about each key of ``d`` not in ``known`` (a newer writer's, ignored)."""
        for key in d:
            if key not in known:
                self.warn(key, f"unknown {what}, ignored (written by a newer kernel-probe?)")

    def check(self, target: str, key: str, what: str = "target") -> None:
        """A target the lock names: on the allow-list (or, for a lock only printed, a dotted path)."""
        try:
            if self.check_targets:
                check_target(target, self.granted, requested=self.requested, what=what)
            elif not DOTTED.fullmatch(target):
                raise LockFormatError(f"{target!r} is not a dotted import path like 'torch.nn.LayerNorm'")
        except LockFormatError as exc:
            raise ReadError(exc.problem, key, exc.fix, kind=type(exc)) from None

    def finished_warnings(self) -> list[str]:
        """The warnings, capped at ``MAX_WARNINGS`` plus a line counting the rest."""
        more = [f"{self.path or '<lock>'}: ... and {self.dropped} more warning(s) like these"] if self.dropped else []
        return self.warnings + more


def required(d: Mapping[str, Any], key: str, typ: Any = str) -> Any:
    """A key the lock must have; missing, the fix points at docs/lock-format.md."""
    return get_required(d, key, typ, fix=_FIX_MISSING.format(key=key))


def choice(d: Mapping[str, Any], key: str, choices: Sequence[str], default: str | None = None) -> str:
    """A string among ``choices`` (required unless there is a ``default``)."""
    return get_choice(d, key, choices, default, fix=_FIX_MISSING.format(key=key))


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
            isinstance(value, list) and all(isinstance(v, Scalar) and not isinstance(v, list) for v in value)
        )
        if not ok:
            raise ReadError(
                f"constructor kwargs must be strings, numbers, booleans or lists of them, got {type(value).__name__}",
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
                    raise ReadError("evidence values must be strings, numbers or booleans", f"{key}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if not isinstance(v, Scalar):
                    raise ReadError("evidence values must be strings, numbers or booleans", f"{key}[{i}]")
        elif not isinstance(value, Scalar):
            raise ReadError(f"unsupported value of type {type(value).__name__}", key)
        for v in value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]:
            problem = _value_problem(v, finite=False)
            if problem:
                raise ReadError(problem, key)
        out[key] = value
    return out


@dataclass(frozen=True)
class EnvField:
    """One fingerprint field: the value seen when the lock was written, and how strictly it must match."""

    value: str | int
    match: Match = "exact"

    _KEYS = ("value", "match")

    @classmethod
    def _from_dict(cls, ctx: Context, d: Any) -> EnvField:
        if not isinstance(d, dict):
            raise ReadError('expected a table like { value = "...", match = "exact" }')
        value = get(d, "value", (str, int))
        if value is None:
            raise ReadError("required key is missing", "value")
        ctx.unknown(d, cls._KEYS)
        return cls(value=value, match=cast(Match, choice(d, "match", MATCH_RULES, default="exact")))

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready table."""
        return {"value": self.value, "match": self.match}


@dataclass(frozen=True)
class Environment:
    """The fingerprint: named fields, plus the versions of the libraries the chosen kernels need."""

    fields: Mapping[str, EnvField] = field(default_factory=dict)
    libraries: Mapping[str, EnvField] = field(default_factory=dict)

    @classmethod
    def _from_dict(cls, ctx: Context, d: Mapping[str, Any]) -> Environment:
        from ..fingerprint.fields import FIELDS  # the field catalogue lives beside the code that computes it

        fields = {}
        for key, value in d.items():
            if key == "libraries":
                continue
            if key not in FIELDS:
                ctx.warn(key, "unknown environment field, not checked (written by a newer kernel-probe?)")
            with ctx.at(key):
                fields[key] = EnvField._from_dict(ctx, value)
                expected = FIELDS.get(key)
                if expected is not None and not isinstance(fields[key].value, expected.type):
                    got = type(fields[key].value).__name__
                    raise ReadError(f"expected {type_name(expected.type)}, got {got}", "value")
        libraries = {}
        with ctx.at("libraries"):
            for name, v in get(d, "libraries", dict, default={}).items():
                with ctx.at(name):
                    libraries[name] = EnvField._from_dict(ctx, v)
                    if not isinstance(libraries[name].value, str):
                        raise ReadError("a library version must be a string", "value")
        return cls(fields=fields, libraries=libraries)

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready ``[environment]`` table, the known fields in their catalogue order."""
        from ..fingerprint.fields import FIELDS

        order = list(FIELDS) + sorted(k for k in self.fields if k not in FIELDS)
        out: dict[str, Any] = {k: self.fields[k].to_dict() for k in order if k in self.fields}
        if self.libraries:
            out["libraries"] = {k: self.libraries[k].to_dict() for k in sorted(self.libraries)}
        return out


@dataclass(frozen=True)
class Requirement:
    """A distribution a slot's implementation needs: name + PEP 440 specifier, and the module it provides."""

    name: str
    specifier: str = ""
    module: str = ""

    _KEYS = ("name", "specifier", "module")

    @classmethod
    def _from_dict(cls, ctx: Context, d: Mapping[str, Any]) -> Requirement:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        name = required(d, "name")
        spec = get(d, "specifier", str, default="")
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise ReadError(f"{spec!r} is not a PEP 440 version specifier like '>=0.8,<0.9'", "specifier") from None
        module = get(d, "module", str, default="")
        if module and not MODULE.fullmatch(module):
            raise ReadError(f"{module!r} is not a module name", "module")
        if module and ctx.check_targets:
            # looked up by its top-level name on the file system only, never imported; still, a lock
            # names only modules the allow-list covers
            ctx.check(module if "." in module else module + ".x", "module", what="requirement module")
        ctx.unknown(d, cls._KEYS)
        return cls(name=name, specifier=spec, module=module)

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready ``[[slots.X.requires]]`` table."""
        out: dict[str, Any] = {"name": self.name, "specifier": self.specifier}
        if self.module:
            out["module"] = self.module
        return out


@dataclass(frozen=True)
class Twin:
    """The portable torch.nn equivalent used for inference where the training library is absent."""

    target: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    state_dict: StateDict = "interchangeable"
    migration: tuple[str, ...] = ()
    max_error: float | None = None

    _KEYS = ("target", "kwargs", "state-dict", "migration", "max-error")

    @classmethod
    def _from_dict(cls, ctx: Context, d: Mapping[str, Any]) -> Twin:
        target = required(d, "target")
        ctx.check(target, "target")
        max_error = get(d, "max-error", float)
        if max_error is not None and (not math.isfinite(max_error) or max_error < 0):
            raise ReadError("must be a non-negative finite number", "max-error")
        ctx.unknown(d, cls._KEYS)
        return cls(
            target=target,
            kwargs=_kwargs(d, "kwargs"),
            state_dict=cast(StateDict, choice(d, "state-dict", STATE_DICT, default="interchangeable")),
            migration=get_strings(d, "migration"),
            max_error=max_error,
        )

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready ``[slots.X.twin]`` table."""
        out: dict[str, Any] = {"target": self.target, "kwargs": dict(self.kwargs), "state-dict": self.state_dict}
        if self.migration:
            out["migration"] = list(self.migration)
        if self.max_error is not None:
            out["max-error"] = self.max_error
        return out


def _blas(ctx: Context, slot: str, d: Mapping[str, Any]) -> Blas:
    """``slots.Linear.blas``: the library (and the build's default) of the same vendor, Linear only."""
    if slot != "Linear":
        raise ReadError(f"only the Linear slot records a BLAS library, not {slot}", fix="remove it")
    ctx.unknown(d, ("library", "build-default"))
    library = choice(d, "library", BLAS_LIBRARIES)
    default = choice(d, "build-default", ("", *BLAS_LIBRARIES), default="")
    if default and device_of(default) != device_of(library):
        raise ReadError(
            f"{default!r} is a {device_of(default)} library, {library!r} a {device_of(library)} one",
            "build-default",
            fix="both name libraries of the same GPU vendor (cublas/cublaslt, or rocblas/hipblaslt)",
        )
    return Blas(library, default)


def _gate(slot: str, d: Mapping[str, Any]) -> str:
    """``slots.GatedMLP.gate``: the formula of the ``mlp_implementation`` its kwargs pin, both required
    and agreeing (an edited implementation with the old formula is a lock that contradicts itself)."""
    from .gating import GATED, formula

    gate = get(d, "gate", str, default="")
    if slot != "GatedMLP":
        if gate:
            raise ReadError(f"only the GatedMLP slot records a gate formula, not {slot}", "gate", fix="remove it")
        return ""
    kwargs = d.get("kwargs")
    implementation = kwargs.get("mlp_implementation") if isinstance(kwargs, Mapping) else None
    if implementation not in GATED:
        raise ReadError(
            f"mlp_implementation {implementation!r} is not a gated MLP",
            "kwargs.mlp_implementation",
            fix=f"pin one of {', '.join(GATED)} (anemoi's 'mlp' has no GatedMLP layer)",
        )
    want = formula(implementation)
    if gate != want:
        raise ReadError(
            f"{gate!r} is not what mlp_implementation {implementation!r} computes ({want!r})" if gate else "missing",
            "gate",
            fix=f'write gate = "{want}", or pin the mlp_implementation whose formula this is',
        )
    return gate


@dataclass(frozen=True)
class Candidate:
    """A candidate that was considered for a slot and not chosen, with the verdict and its reasons."""

    implementation: str
    target: str
    status: Status
    reasons: tuple[str, ...] = ()

    _KEYS = ("implementation", "target", "status", "reasons")

    @classmethod
    def _from_dict(cls, ctx: Context, d: Mapping[str, Any]) -> Candidate:
        ctx.unknown(d, cls._KEYS)
        return cls(
            implementation=required(d, "implementation"),
            target=get(d, "target", str, default=""),
            status=cast(Status, choice(d, "status", STATUSES)),
            reasons=get_strings(d, "reasons"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready ``[[slots.X.rejected]]`` table."""
        return {
            "implementation": self.implementation,
            "target": self.target,
            "status": self.status,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class Slot:
    """What the lock pins for one slot (LayerNorm, RMSNorm or Linear)."""

    name: str
    implementation: str
    target: str
    semantics: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    requires: tuple[Requirement, ...] = ()
    devices: tuple[str, ...] = ()
    twin: Twin | None = None
    reason: str = ""
    evidence: tuple[Mapping[str, Any], ...] = ()
    timing: tuple[Mapping[str, Any], ...] = ()
    rejected: tuple[Candidate, ...] = ()
    changes: tuple[str, ...] = ()  # what the implementation changes besides numbers, accepted explicitly
    blas: Blas | None = None  # Linear on a GPU: the BLAS library it was checked and timed under (kernel_lock.blas)
    gate: str = ""  # GatedMLP: the formula its mlp_implementation computes (kernel_lock.gating)
    function: str = ""  # Activation: the model's function the candidates were checked against (activations)

    _KEYS = (
        "implementation",
        "target",
        "semantics",
        "function",
        "kwargs",
        "requires",
        "devices",
        "blas",
        "gate",
        "reason",
        "accepted-changes",
        "twin",
        "evidence",
        "timing",
        "rejected",
    )

    @classmethod
    def _from_dict(cls, ctx: Context, name: str, d: Any) -> Slot:
        """The slot ``name``'s table, read at ``slots.<name>``."""
        if not isinstance(d, dict):
            raise ReadError("expected a table")
        target = required(d, "target")
        ctx.check(target, "target")
        get(d, "twin", dict)
        ctx.unknown(d, cls._KEYS)
        slot = cls(
            name=name,
            implementation=required(d, "implementation"),
            target=target,
            semantics=choice(d, "semantics", SEMANTICS),
            kwargs=_kwargs(d, "kwargs"),
            requires=ctx.objects(d, "requires", lambda r: Requirement._from_dict(ctx, r)),
            devices=get_strings(d, "devices"),
            twin=ctx.object(d, "twin", lambda t: Twin._from_dict(ctx, t)),
            reason=get(d, "reason", str, default=""),
            changes=get_strings(d, "accepted-changes"),
            evidence=ctx.objects(d, "evidence", record),
            timing=ctx.objects(d, "timing", record),
            rejected=ctx.objects(d, "rejected", lambda r: Candidate._from_dict(ctx, r)),
            blas=ctx.object(d, "blas", lambda b: _blas(ctx, name, b)),
            gate=_gate(name, d),
            function=read_function(name, d),
        )
        expected = SLOT_SEMANTICS[name]
        if slot.semantics != expected:
            raise ReadError(
                f"slot {name} needs semantics {expected!r}, the lock pins {slot.semantics!r} "
                "(an RMSNorm is not a LayerNorm: it drops the mean and the bias)",
                "semantics",
                fix=f"pin a {expected} implementation for {name}, or move this entry to the matching slot",
            )
        return slot

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready ``[slots.<name>]`` table."""
        out: dict[str, Any] = {
            "implementation": self.implementation,
            "target": self.target,
            "semantics": self.semantics,
            **({"function": self.function} if self.function else {}),
            "kwargs": dict(self.kwargs),
            "requires": [r.to_dict() for r in self.requires],
            "devices": list(self.devices),
        }
        if self.blas is not None:
            out["blas"] = self.blas.to_dict()
        if self.gate:
            out["gate"] = self.gate
        out["reason"] = self.reason
        if self.changes:
            out["accepted-changes"] = list(self.changes)
        if self.twin is not None:
            out["twin"] = self.twin.to_dict()
        if self.evidence:
            out["evidence"] = [dict(e) for e in self.evidence]
        if self.timing:
            out["timing"] = [dict(t) for t in self.timing]
        if self.rejected:
            out["rejected"] = [c.to_dict() for c in self.rejected]
        return out
