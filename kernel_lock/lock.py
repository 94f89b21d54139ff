"""The kernel-lock file, format v1: frozen objects built from a TOML mapping, and back.

The layout is documented in ``docs/lock-format.md``. Parsing follows the pylock reader in
``packaging``: small typed getters raise one error type carrying the dotted key path, each object has
a ``_from_dict`` classmethod, and ``to_dict`` gives the TOML-ready mapping in canonical key order.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from . import _toml, registry
from .blas import ALL as BLAS_LIBRARIES
from .blas import Blas, device_of
from .errors import BadEnvironmentVariable, LockFormatError, LockVersionError, LockWarning, TargetNotAllowed

# declared in kernel_lock.slots; still importable from here (kernel_lock.lock.MODES, kernel_lock.SLOTS)
from .slots import MODES, PRECISIONS, SEMANTICS, SLOTS, STATUSES, slot_name_fix

# 1.1: accepted-changes, rename/transpose migrations; 1.2: environment torch-rocm, device-features, numerics-env;
# 1.3: slots.Linear.blas, and the timing rows' check at the model's shape (checked-rows, worst-error-ratio)
LOCK_VERSION = "1.3"
MATCH_RULES = ("exact", "compatible", "ignore")
STATE_DICT = ("interchangeable", "migrate", "incompatible")

# The modules a lock may name without declaring them trusted come from the registry
# (kernel_lock/registry.toml: torch, kernel_lock.adapters and every built-in candidate's import root);
# anything else is refused before import.

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", re.ASCII)
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
_VERSION = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})", re.ASCII)
MAX_BYTES = 8 << 20  # a lock is a few kB; anything this large is not one
MAX_WARNINGS = 20  # per lock: 300k unknown keys are one summary, not 300k lines
INT64 = 1 << 63
TRUST_ENV = "KERNEL_LOCK_TRUST"  # modules the caller trusts beyond the built-in allow-list

_T = TypeVar("_T")
Scalar = (str, int, float, bool)


class _Ctx:
    """Where we are while parsing: the file, the trust granted, and warnings to report once parsing succeeds."""

    def __init__(self, path: str | None, granted: Sequence[str] = (), check_targets: bool = True):
        self.path = path
        self.warnings: list[str] = []
        self.granted = tuple(granted)
        self.requested: tuple[str, ...] = ()
        self.check_targets = check_targets

    def error(self, key: str, problem: str, fix: str | None = None) -> LockFormatError:
        return LockFormatError(problem, path=self.path, key=key, fix=fix)

    def warn(self, key: str, problem: str) -> None:
        self.dropped = getattr(self, "dropped", 0)
        if len(self.warnings) >= MAX_WARNINGS:
            self.dropped += 1
            return
        self.warnings.append(f"{self.path or '<lock>'}: '{key}': {problem}")

    def check(self, target: str, key: str, what: str = "target") -> None:
        if self.check_targets:
            check_target(target, self.granted, path=self.path, key=key, requested=self.requested, what=what)
        elif not _DOTTED.fullmatch(target):
            raise self.error(key, f"{target!r} is not a dotted import path like 'torch.nn.LayerNorm'")

    def finished_warnings(self) -> list[str]:
        dropped = getattr(self, "dropped", 0)
        more = [f"{self.path or '<lock>'}: ... and {dropped} more warning(s) like these"] if dropped else []
        return self.warnings + more


def _type_name(t: Any) -> str:
    if isinstance(t, tuple):
        return " or ".join(_type_name(x) for x in t)
    return {str: "string", int: "integer", float: "float", bool: "boolean", dict: "table", list: "array"}.get(
        t, t.__name__
    )


def _get(ctx: _Ctx, d: Mapping[str, Any], key: str, typ: Any, path: str, default: Any = None) -> Any:
    value = d.get(key)
    if value is None:
        return default
    # TOML booleans are ints to Python; never accept one where the other is meant
    if isinstance(value, bool) and typ is not bool and not (isinstance(typ, tuple) and bool in typ):
        raise ctx.error(f"{path}{key}", f"expected {_type_name(typ)}, got boolean {value!r}")
    if typ is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, typ):
        raise ctx.error(f"{path}{key}", f"expected {_type_name(typ)}, got {type(value).__name__} {value!r:.60}")
    return value


def _required(ctx: _Ctx, d: Mapping[str, Any], key: str, typ: Any, path: str) -> Any:
    value = _get(ctx, d, key, typ, path)
    if value is None:
        raise ctx.error(f"{path}{key}", "required key is missing", fix=f"add `{key} = ...` (see docs/lock-format.md)")
    return value


def _choice(
    ctx: _Ctx, d: Mapping[str, Any], key: str, choices: Sequence[str], path: str, default: str | None = None
) -> str:
    value = _get(ctx, d, key, str, path) if default is not None else _required(ctx, d, key, str, path)
    if value is None:
        assert default is not None  # without a default, _required has raised on a missing key
        return default
    if value not in choices:
        raise ctx.error(f"{path}{key}", f"{value!r} is not one of {', '.join(choices)}")
    return value


def _strings(ctx: _Ctx, d: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
    values = _get(ctx, d, key, list, path, default=[])
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise ctx.error(f"{path}{key}[{i}]", f"expected string, got {type(v).__name__}")
    return tuple(values)


def _tables(ctx: _Ctx, d: Mapping[str, Any], key: str, path: str) -> list[tuple[str, Mapping[str, Any]]]:
    values = _get(ctx, d, key, list, path, default=[])
    out: list[tuple[str, Mapping[str, Any]]] = []
    for i, v in enumerate(values):
        if not isinstance(v, dict):
            raise ctx.error(f"{path}{key}[{i}]", f"expected table, got {type(v).__name__}")
        out.append((f"{path}{key}[{i}].", v))
    return out


def _unknown_keys(ctx: _Ctx, d: Mapping[str, Any], known: Sequence[str], path: str) -> None:
    for key in d:
        if key not in known:
            ctx.warn(f"{path}{key}", "unknown key, ignored (written by a newer kernel-probe?)")


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


def _kwargs(ctx: _Ctx, d: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
    values = _get(ctx, d, key, dict, path, default={})
    for name, value in values.items():
        if not name.isidentifier() or not name.isascii():
            raise ctx.error(f"{path}{key}.{name}", "a keyword argument name must be a Python identifier")
        ok = isinstance(value, Scalar) or (
            isinstance(value, list) and all(isinstance(v, Scalar) and not isinstance(v, list) for v in value)
        )
        if not ok:
            raise ctx.error(
                f"{path}{key}.{name}",
                f"constructor kwargs must be strings, numbers, booleans or lists of them, got {type(value).__name__}",
            )
        for v in value if isinstance(value, list) else [value]:
            problem = _value_problem(v, finite=True)
            if problem:
                raise ctx.error(f"{path}{key}.{name}", problem, fix="pin a finite value (e.g. eps = 1e-5)")
    return dict(values)


def granted_trust(trust: Iterable[str] = ()) -> tuple[str, ...]:
    """The modules the caller trusts: ``trust`` and ``$KERNEL_LOCK_TRUST`` (comma- or colon-separated)."""
    names = [str(t) for t in trust]
    env = os.environ.get(TRUST_ENV, "")
    names += [n for n in re.split(r"[,:\s]+", env) if n]
    for name in names:
        if not _MODULE.fullmatch(name) or any(part.startswith("_") for part in name.split(".")):
            source = f"${TRUST_ENV}" if name not in trust else "trust"
            raise BadEnvironmentVariable(
                f"{source}: {name!r} is not a public module name",
                key=TRUST_ENV if source != "trust" else None,
                fix="list top-level packages, e.g. KERNEL_LOCK_TRUST=site_kernels",
            )
    return tuple(dict.fromkeys(names))


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def _under(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


def check_target(
    target: str,
    trusted: Sequence[str] = (),
    *,
    path: str | None = None,
    key: str | None = None,
    requested: Sequence[str] = (),
    what: str = "target",
) -> None:
    """Refuse a target outside the allow-list. Runs before anything is imported.

    The allow-list is ``registry.allowed_roots()`` plus the modules the *caller* trusts (``trusted``: the API's
    ``trust=``, ``$KERNEL_LOCK_TRUST``, ``--trust``); the lock's own ``trusted-modules``
    (``requested``) are only a request, named in the error with how to grant it. A path with a
    private or ``__main__`` component is never imported (importing a ``__main__`` runs it).
    """
    if not isinstance(target, str) or not _DOTTED.fullmatch(target):
        raise LockFormatError(f"{target!r} is not a dotted import path like 'torch.nn.LayerNorm'", path=path, key=key)
    if _private(target):
        raise TargetNotAllowed(
            f"{what} {target!r} has a private or __main__ component: it is never imported (importing a module's "
            "__main__ runs it)",
            path=path,
            key=key,
            fix="name a public class, e.g. torch.nn.LayerNorm",
        )
    if target.startswith("kernel_lock.adapters.") and "__" in target:
        from .adapter_names import generic_kernel  # a generic adapter imports the kernel its name carries

        inner = generic_kernel(target)
        if inner is not None:
            check_target(inner, trusted, path=path, key=key, requested=requested, what=f"{what} (inside {target})")
    if any(_under(target, root) for root in (*registry.OWN_ROOTS, *trusted)):
        return  # torch's own classes need no registry read (a few ms at every import of a lock)
    allowed = registry.allowed_roots()
    if any(_under(target, root) for root in allowed):
        return
    asked = next((m for m in requested if _under(target, m)), None)
    if asked is not None:
        raise TargetNotAllowed(
            f"{what} {target!r} is in {asked!r}, which the lock asks to trust (trusted-modules) but which was not "
            "granted; nothing was imported",
            path=path,
            key=key,
            fix=f"if you trust {asked!r}, grant it: `--trust {asked}` on kernel-probe's command line, "
            f"{TRUST_ENV}={asked} in the environment, or kernel_lock.load(path, trust=[{asked!r}])",
        )
    raise TargetNotAllowed(
        f"{what} {target!r} is not in the import allow-list ({', '.join(allowed)}); nothing was imported",
        path=path,
        key=key,
        fix=f"if you trust that module, grant it: `--trust MODULE`, {TRUST_ENV}=MODULE, or kernel_lock.load(path, "
        "trust=[...]) (a lock's own trusted-modules only asks)",
    )


@dataclass(frozen=True)
class EnvField:
    """One fingerprint field: the value seen when the lock was written, and how strictly it must match."""

    value: str | int
    match: str = "exact"

    @classmethod
    def _from_dict(cls, ctx: _Ctx, d: Any, path: str) -> EnvField:
        if not isinstance(d, dict):
            raise ctx.error(path.rstrip("."), 'expected a table like { value = "...", match = "exact" }')
        value = _get(ctx, d, "value", (str, int), path)
        if value is None:
            raise ctx.error(f"{path}value", "required key is missing")
        _unknown_keys(ctx, d, ("value", "match"), path)
        return cls(value=value, match=_choice(ctx, d, "match", MATCH_RULES, path, default="exact"))

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "match": self.match}


@dataclass(frozen=True)
class Environment:
    """The fingerprint: named fields, plus the versions of the libraries the chosen kernels need."""

    fields: Mapping[str, EnvField] = field(default_factory=dict)
    libraries: Mapping[str, EnvField] = field(default_factory=dict)

    @classmethod
    def _from_dict(cls, ctx: _Ctx, d: Mapping[str, Any], path: str) -> Environment:
        from .fingerprint import FIELDS  # the field catalogue lives beside the code that computes it

        fields = {}
        for key, value in d.items():
            if key == "libraries":
                continue
            if key not in FIELDS:
                ctx.warn(f"{path}{key}", "unknown environment field, not checked (written by a newer kernel-probe?)")
            fields[key] = EnvField._from_dict(ctx, value, f"{path}{key}.")
            expected = FIELDS.get(key)
            if expected is not None and not isinstance(fields[key].value, expected.type):
                raise ctx.error(
                    f"{path}{key}.value",
                    f"expected {_type_name(expected.type)}, got {type(fields[key].value).__name__}",
                )
        libs = _get(ctx, d, "libraries", dict, path, default={})
        libraries = {name: EnvField._from_dict(ctx, v, f"{path}libraries.{name}.") for name, v in libs.items()}
        for name, lib in libraries.items():
            if not isinstance(lib.value, str):
                raise ctx.error(f"{path}libraries.{name}.value", "a library version must be a string")
        return cls(fields=fields, libraries=libraries)

    def to_dict(self) -> dict[str, Any]:
        from .fingerprint import FIELDS

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

    @classmethod
    def _from_dict(cls, ctx: _Ctx, d: Mapping[str, Any], path: str) -> Requirement:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        name = _required(ctx, d, "name", str, path)
        spec = _get(ctx, d, "specifier", str, path, default="")
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise ctx.error(
                f"{path}specifier", f"{spec!r} is not a PEP 440 version specifier like '>=0.8,<0.9'"
            ) from None
        module = _get(ctx, d, "module", str, path, default="")
        if module and not _MODULE.fullmatch(module):
            raise ctx.error(f"{path}module", f"{module!r} is not a module name")
        if module and ctx.check_targets:
            # looked up by its top-level name on the file system only, never imported; still, a lock
            # names only modules the allow-list covers
            ctx.check(module if "." in module else module + ".x", f"{path}module", what="requirement module")
        _unknown_keys(ctx, d, ("name", "specifier", "module"), path)
        return cls(name=name, specifier=spec, module=module)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "specifier": self.specifier}
        if self.module:
            out["module"] = self.module
        return out


@dataclass(frozen=True)
class Twin:
    """The portable torch.nn equivalent used for inference where the training library is absent."""

    target: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    state_dict: str = "interchangeable"
    migration: tuple[str, ...] = ()
    max_error: float | None = None

    @classmethod
    def _from_dict(cls, ctx: _Ctx, d: Mapping[str, Any], path: str) -> Twin:
        target = _required(ctx, d, "target", str, path)
        ctx.check(target, f"{path}target")
        max_error = _get(ctx, d, "max-error", float, path)
        if max_error is not None and (not math.isfinite(max_error) or max_error < 0):
            raise ctx.error(f"{path}max-error", "must be a non-negative finite number")
        _unknown_keys(ctx, d, ("target", "kwargs", "state-dict", "migration", "max-error"), path)
        return cls(
            target=target,
            kwargs=_kwargs(ctx, d, "kwargs", path),
            state_dict=_choice(ctx, d, "state-dict", STATE_DICT, path, default="interchangeable"),
            migration=_strings(ctx, d, "migration", path),
            max_error=max_error,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "kwargs": dict(self.kwargs), "state-dict": self.state_dict}
        if self.migration:
            out["migration"] = list(self.migration)
        if self.max_error is not None:
            out["max-error"] = self.max_error
        return out


def _record(ctx: _Ctx, d: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Evidence and timing rows: free-form flat records, but every value must be TOML-writable."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(v, Scalar):
                    raise ctx.error(f"{path}{key}.{k}", "evidence values must be strings, numbers or booleans")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if not isinstance(v, Scalar):
                    raise ctx.error(f"{path}{key}[{i}]", "evidence values must be strings, numbers or booleans")
        elif not isinstance(value, Scalar):
            raise ctx.error(f"{path}{key}", f"unsupported value of type {type(value).__name__}")
        for v in value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]:
            problem = _value_problem(v, finite=False)
            if problem:
                raise ctx.error(f"{path}{key}", problem)
        out[key] = value
    return out


def _blas(ctx: _Ctx, slot: str, d: Mapping[str, Any] | None, path: str) -> Blas | None:
    """``slots.Linear.blas``: the library (and the build's default) of the same vendor, Linear only."""
    if d is None:
        return None
    if slot != "Linear":
        raise ctx.error(path.rstrip("."), f"only the Linear slot records a BLAS library, not {slot}", fix="remove it")
    _unknown_keys(ctx, d, ("library", "build-default"), path)
    library = _choice(ctx, d, "library", BLAS_LIBRARIES, path)
    default = _choice(ctx, d, "build-default", ("", *BLAS_LIBRARIES), path, default="")
    if default and device_of(default) != device_of(library):
        raise ctx.error(
            f"{path}build-default",
            f"{default!r} is a {device_of(default)} library, {library!r} a {device_of(library)} one",
            fix="both name libraries of the same GPU vendor (cublas/cublaslt, or rocblas/hipblaslt)",
        )
    return Blas(library, default)


@dataclass(frozen=True)
class Candidate:
    """A candidate that was considered for a slot and not chosen, with the verdict and its reasons."""

    implementation: str
    target: str
    status: str
    reasons: tuple[str, ...] = ()

    @classmethod
    def _from_dict(cls, ctx: _Ctx, d: Mapping[str, Any], path: str) -> Candidate:
        _unknown_keys(ctx, d, ("implementation", "target", "status", "reasons"), path)
        return cls(
            implementation=_required(ctx, d, "implementation", str, path),
            target=_get(ctx, d, "target", str, path, default=""),
            status=_choice(ctx, d, "status", STATUSES, path),
            reasons=_strings(ctx, d, "reasons", path),
        )

    def to_dict(self) -> dict[str, Any]:
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

    _KEYS = (
        "implementation",
        "target",
        "semantics",
        "kwargs",
        "requires",
        "devices",
        "blas",
        "reason",
        "accepted-changes",
        "twin",
        "evidence",
        "timing",
        "rejected",
    )

    @classmethod
    def _from_dict(cls, ctx: _Ctx, name: str, d: Any) -> Slot:
        path = f"slots.{name}."
        if not isinstance(d, dict):
            raise ctx.error(f"slots.{name}", "expected a table")
        target = _required(ctx, d, "target", str, path)
        ctx.check(target, f"{path}target")
        twin_d = _get(ctx, d, "twin", dict, path)
        _unknown_keys(ctx, d, cls._KEYS, path)
        slot = cls(
            name=name,
            implementation=_required(ctx, d, "implementation", str, path),
            target=target,
            semantics=_choice(ctx, d, "semantics", SEMANTICS, path),
            kwargs=_kwargs(ctx, d, "kwargs", path),
            requires=tuple(Requirement._from_dict(ctx, r, p) for p, r in _tables(ctx, d, "requires", path)),
            devices=_strings(ctx, d, "devices", path),
            twin=Twin._from_dict(ctx, twin_d, f"{path}twin.") if twin_d is not None else None,
            reason=_get(ctx, d, "reason", str, path, default=""),
            changes=_strings(ctx, d, "accepted-changes", path),
            evidence=tuple(_record(ctx, r, p) for p, r in _tables(ctx, d, "evidence", path)),
            timing=tuple(_record(ctx, r, p) for p, r in _tables(ctx, d, "timing", path)),
            rejected=tuple(Candidate._from_dict(ctx, r, p) for p, r in _tables(ctx, d, "rejected", path)),
            blas=_blas(ctx, name, _get(ctx, d, "blas", dict, path), f"{path}blas."),
        )
        expected = {"LayerNorm": "layer_norm", "RMSNorm": "rms_norm", "Linear": "linear"}[name]
        if slot.semantics != expected:
            raise ctx.error(
                f"{path}semantics",
                f"slot {name} needs semantics {expected!r}, the lock pins {slot.semantics!r} "
                "(an RMSNorm is not a LayerNorm: it drops the mean and the bias)",
                fix=f"pin a {expected} implementation for {name}, or move this entry to the matching slot",
            )
        return slot

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "implementation": self.implementation,
            "target": self.target,
            "semantics": self.semantics,
            "kwargs": dict(self.kwargs),
            "requires": [r.to_dict() for r in self.requires],
            "devices": list(self.devices),
        }
        if self.blas is not None:
            out["blas"] = self.blas.to_dict()
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
        version = _required(ctx, d, "lock-version", str, "")
        m = _VERSION.fullmatch(version)
        if not m:
            raise ctx.error("lock-version", f"{version!r} is not a MAJOR.MINOR version like {LOCK_VERSION!r}")
        major, minor = int(m.group(1)), int(m.group(2))
        ours_major, ours_minor = (int(x) for x in LOCK_VERSION.split("."))
        if major != ours_major:
            raise LockVersionError(
                f"lock-version {version} is not supported (this kernel_lock reads {ours_major}.x)",
                path=path,
                key="lock-version",
                fix="upgrade kernel-probe to read newer locks, or re-run `kernel-probe --force` to write a "
                f"{LOCK_VERSION} lock"
                if major > ours_major
                else "re-run `kernel-probe --force` to write a current lock",
            )
        if minor > ours_minor:
            ctx.warn("lock-version", f"minor version {version} is newer than {LOCK_VERSION}; unknown keys are ignored")
        _unknown_keys(ctx, d, cls._KEYS, "")
        trusted = _strings(ctx, d, "trusted-modules", "")
        for i, module in enumerate(trusted):
            if not _MODULE.fullmatch(module) or _private(module):
                raise ctx.error(f"trusted-modules[{i}]", f"{module!r} is not a module name")
        ctx.requested = trusted  # a request only: the caller grants trust
        slots_d = _get(ctx, d, "slots", dict, "", default={})
        slots = {}
        for name, value in slots_d.items():
            if name not in SLOTS:
                raise ctx.error(f"slots.{name}", f"unknown slot {name!r}", fix=slot_name_fix(name))
            slots[name] = Slot._from_dict(ctx, name, value)
        digest = _get(ctx, d, "digest", str, "", default="")
        if digest and not _DIGEST.fullmatch(digest):
            raise ctx.error("digest", f"{digest!r} is not 'sha256:<64 hex digits>'")
        lock = cls(
            lock_version=version,
            created_by=_required(ctx, d, "created-by", str, ""),
            created_at=_get(ctx, d, "created-at", str, "", default=""),
            mode=_choice(ctx, d, "mode", MODES, "", default="training"),
            precision=_choice(ctx, d, "precision", ("", *PRECISIONS), "", default=""),
            trusted_modules=trusted,
            profile=_record(ctx, _get(ctx, d, "profile", dict, "", default={}), "profile."),
            environment=Environment._from_dict(ctx, _get(ctx, d, "environment", dict, "", default={}), "environment."),
            slots=slots,
            provenance=_record(ctx, _get(ctx, d, "provenance", dict, "", default={}), "provenance."),
            digest=digest,
            path=path,
            granted=ctx.granted,
        )
        if strict and not lock.environment.fields:
            raise ctx.error(
                "environment",
                "the lock has no [environment]: it would match any machine",
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
                raise ctx.error(
                    "digest",
                    problem,
                    fix="re-run `kernel-probe --force`, or accept the edit with `kernel-probe rehash LOCK`",
                )
            ctx.warn("digest", problem + " (accept the edit with `kernel-probe rehash LOCK`)")
        return replace(lock, warnings=tuple(ctx.finished_warnings()), intact=intact)

    # ---- serialisation --------------------------------------------------------------------
    def to_dict(self, *, with_digest: bool = True) -> dict[str, Any]:
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
        return _toml.dumps(self.to_dict())

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a temp file in the same directory, fsync, then rename over the target."""
        atomic_write_text(Path(path), self.dumps())

    # ---- resolution (kept in resolve.py; thin methods here so the lock is the entry point) --
    def verify(
        self, mode: str | None = None, *, current: Mapping[str, Any] | None = None, targets: str | None = None
    ) -> list[str]:
        from .resolve import verify

        return verify(self, mode=mode, current=current, targets=targets)

    def factory(self, slot: str, mode: str | None = None, **options: Any):
        from .resolve import factory

        return factory(self, slot, mode=mode, **options)

    def resolve_all(self, mode: str | None = None) -> dict[str, Any]:
        from .resolve import factory

        return {name: factory(self, name, mode=mode) for name in self.slots}


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temp file in the same directory, fsync, rename.

    A symbolic link at ``path`` is written *through* (its target is replaced, the link stays, so a
    shared lock others link to stays shared). Anything there that is not a regular file (a directory,
    a FIFO, a device) is refused, never replaced.
    """
    import stat
    import tempfile

    path = Path(os.path.realpath(path))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        from ._files import kind

        raise LockFormatError(
            f"is {kind(mode)}, not a regular file: not replaced",
            path=str(path),
            fix="write the lock to a regular file path",
        )
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:  # the folder is missing, read-only, or not a folder: nothing was written
        why = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be written to ({exc.strerror})"
        raise LockFormatError(
            f"cannot write the lock: the folder {directory} {why}; nothing was written",
            path=str(path),
            fix="create the folder first, or give a path in a folder you can write to",
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


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
