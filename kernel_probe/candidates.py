"""Where a candidate is declared (plain data, imported only in the worker), and the one parser of
declarations: the built-ins are ``kernel_lock/registry.toml``'s ``[[candidate]]`` tables, in a
site profile's form (:func:`read_candidates`)."""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from kernel_lock import registry as lock_registry
from kernel_lock import toml
from kernel_lock.slots import SPECS, slot_name_fix
from kernel_lock.slots import semantics as known_semantics
from kernel_lock.slots.linear import LIBRARIES, device_of
from kernel_lock.trust import private
from kernel_probe.errors import UsageError
from kernel_probe.tables import TableReader


@dataclass(frozen=True)
class Candidate:
    """One implementation offered for slots: its class, how to build it (``args``/``kwargs`` are
    templates: ``"$eps"`` is the canonical value ``eps``), where it runs (``archs``: per device
    type, "sm_80+" = that or newer), how to install it (``install``: per device type, "": no
    build), its torch.nn twin; ``blas``: a Linear's BLAS library on a GPU."""

    id: str
    slots: tuple[str, ...]
    semantics: str
    target: str
    args: tuple[Any, ...] = ("$normalized_shape",)  # positional constructor arguments (dimensions)
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # pinned in the lock
    build_kwargs: Mapping[str, Any] = field(default_factory=dict)  # only while probing
    distribution: str = ""  # "" = ships with torch
    specifier: str = ""
    module: str = ""
    devices: tuple[str, ...] = ()  # () = any device torch runs on
    archs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    install: Mapping[str, str] = field(default_factory=dict)
    compiled: bool = False  # torch.compile inside: expensive on CPU, JIT time reported apart
    twin_target: str = ""
    twin_kwargs: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""
    source: str = "builtin"  # builtin | entry-point:<name> | command-line | profile:<name>
    blas: str = ""

    def pinned_kwargs(self, canonical: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments the lock pins, with the canonical values filled in."""
        return self._pinned(self.kwargs, canonical)

    def pinned_twin_kwargs(self, canonical: Mapping[str, Any]) -> dict[str, Any]:
        """The twin's keyword arguments, with the canonical values filled in."""
        return self._pinned(self.twin_kwargs, canonical) if self.twin_target else {}

    def _pinned(self, templates: Mapping[str, Any], canonical: Mapping[str, Any]) -> dict[str, Any]:
        filled = {k: fill(v, canonical) for k, v in templates.items()}
        return filled | {k: v for k, v in self.optional(canonical).items() if k not in filled}

    def optional(self, canonical: Mapping[str, Any]) -> dict[str, Any]:
        """Its slots' keywords pinned only where the model sets them (``SlotSpec.optional``: the
        value differs from the slot's own), whatever the declaration's templates say."""
        return {
            name: canonical[name]
            for spec in (SPECS[s] for s in self.slots if s in SPECS)
            for name in spec.optional
            if name in canonical and canonical[name] != spec.canonical.get(name)
        }

    def to_json(self) -> dict[str, Any]:
        """The candidate as a JSON object (the worker's requests carry it)."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Candidate:
        """The candidate from :meth:`to_json`'s object, lists back to tuples."""
        d = {**d, **{key: tuple(d.get(key, ())) for key in ("slots", "args", "devices")}}
        d["archs"] = {k: tuple(v) for k, v in dict(d.get("archs") or {}).items()}
        return cls(**d)

    def arch_problem(self, device: str, arch: str) -> str | None:
        """Why it cannot run on a ``device`` GPU of ``arch``; None when it can (or arch unknown)."""
        wanted = tuple(self.archs.get(device, ()))
        if not wanted or not arch or any(arch_satisfies(arch, w) for w in wanted):
            return None
        return f"needs a GPU arch {' or '.join(wanted)} on {device}; this one is {arch}"

    def install_hint(self, device: str) -> str:
        """How to install the candidate's library for ``device``; '' where there is no build."""
        if device in self.install:
            return self.install[device]
        return f"pip install {self.distribution}" if self.distribution else ""


def arch_satisfies(arch: str, wanted: str) -> bool:
    """``'sm_90'`` satisfies ``'sm_80+'`` and ``'sm_90'``; gfx archs match exactly."""
    arch = arch.split(":", 1)[0]
    if wanted.endswith("+"):
        base = wanted[:-1]
        prefix = base.rstrip("0123456789")
        tail = arch[len(prefix) :].rstrip("af")  # sm_90a: arch-specific build of sm_90
        return arch.startswith(prefix) and tail.isdigit() and int(tail) >= int(base[len(prefix) :])
    return arch == wanted


# The one syntax of GPU archs (a candidate's ``archs``, a profile's ``requires.device-arch``):
# ``sm_XY`` (``sm_90a``: arch-specific), ``sm_XY+`` = that or newer; ``gfxNNN`` exactly (unordered)
GPU_ARCH_SYNTAX = {
    "cuda": re.compile(r"sm_[0-9]{2,3}[af]?\+?", re.ASCII),
    "rocm": re.compile(r"gfx[0-9a-f]{3,4}", re.ASCII),
}


def gpu_arch_problem(name: str, device_types: Collection[str] = ("cuda", "rocm")) -> str | None:
    """Why ``name`` is not a GPU arch of one of ``device_types`` (None when it is)."""
    for kind in device_types:
        if kind in GPU_ARCH_SYNTAX and GPU_ARCH_SYNTAX[kind].fullmatch(name):
            return None
    hint = ""
    if capability := re.fullmatch(r"([0-9]{1,2})\.([0-9])", name):
        hint = f" (compute capability {name} is written 'sm_{capability[1]}{capability[2]}')"
    if name.startswith("gfx") and name.endswith("+"):
        hint = " (gfx archs match exactly: list each one)"
    for kind in device_types:
        if kind not in GPU_ARCH_SYNTAX:
            return f"{name!r}: no GPU arch names are known for device type {kind!r}"
        other = "rocm" if kind == "cuda" else "cuda"
        if GPU_ARCH_SYNTAX[other].fullmatch(name):
            return f"{name!r} is a {other} arch, not a {kind} one"
    return f"{name!r} is not a GPU arch like 'sm_90', 'sm_80+' (that or newer) or 'gfx90a'{hint}"


def fill(value: Any, canonical: Mapping[str, Any]) -> Any:
    """``value`` with each ``$name`` replaced by the canonical configuration's ``name``."""
    if isinstance(value, str) and value.startswith("$"):
        return canonical[value[1:]]
    if isinstance(value, (list, tuple)):
        return type(value)(fill(v, canonical) for v in value)
    return value


# ---- reading declarations: the built-ins' data file and a profile's [[candidate]] tables ---------
# the keys of a [[candidate]] table: Candidate's fields, dashed, but where it was offered (source)
CANDIDATE_KEYS = tuple(f.name.replace("_", "-") for f in fields(Candidate) if f.name != "source")
DEVICE_TYPES = ("cuda", "rocm", "xpu", "mps", "cpu")
# a target refused before any work, as in a lock
PRIVATE = "has a private or __main__ component: it is never imported (importing a module's "
PRIVATE += "__main__ runs it)"


def read_candidates(
    r: TableReader, d: Mapping[str, Any], *, source: str, reserved: Collection[str] = ()
) -> tuple[Candidate, ...]:
    """Every ``[[candidate]]`` table of ``d``; ``reserved``: ids that may not be declared again."""
    tables = d.get("candidate", [])
    if not isinstance(tables, list) or not all(isinstance(x, dict) for x in tables):
        raise r.err("candidate", "expected an array of tables ([[candidate]])")
    out: list[Candidate] = []
    for i, table in enumerate(tables):
        cand = parse_candidate(r, table, f"candidate[{i}].", source=source, reserved=reserved)
        if any(c.id == cand.id for c in out):
            raise r.err(f"candidate[{i}].id", f"{cand.id!r} is declared twice")
        out.append(cand)
    return tuple(out)


def _scalars(r: TableReader, value: Any, key: str, *, table: bool) -> Any:
    """A [[candidate]]'s args (a list) or kwargs (a table): strings, finite numbers, booleans."""
    if not isinstance(value, dict if table else list):
        raise r.err(key, f"expected {'a table' if table else 'a list'}, got {type(value).__name__}")
    items: Iterable[tuple[Any, Any]] = (
        value.items() if isinstance(value, dict) else enumerate(value)
    )
    for k, v in items:
        if table and not (isinstance(k, str) and k.isidentifier()):
            raise r.err(f"{key}.{k}", "a keyword argument name must be a Python identifier")
        ok = (
            isinstance(v, (str, bool))
            or (isinstance(v, int) and -(1 << 63) <= v < (1 << 63))
            or (isinstance(v, float) and math.isfinite(v))
        )
        if not ok:
            said = f"expected a string, a finite number or a boolean, got {type(v).__name__}"
            raise r.err(f"{key}.{k}" if table else f"{key}[{k}]", f"{said} {v!r:.40}")
    return value


def parse_candidate(
    r: TableReader, c: Mapping[str, Any], where: str, *, source: str, reserved: Collection[str] = ()
) -> Candidate:
    """One ``[[candidate]]`` table. Omitted keys take the slot's defaults
    (``kernel_lock.slots``)."""
    r.no_unknown(c, CANDIDATE_KEYS, where)
    cid = r.string(c, "id", where, required=True)
    if cid in reserved:
        raise r.err(
            f"{where}id",
            f"{cid!r} is a built-in candidate's id: a profile may not redefine it",
            fix="give the site's implementation its own id, e.g. 'site.fast_layer_norm'",
        )
    if not re.fullmatch(r"[A-Za-z0-9][\w.:-]*", cid, re.ASCII):
        raise r.err(f"{where}id", f"{cid!r}: use letters, digits, '.', ':', '_' and '-'")
    slots = r.strings(c, "slots", where)
    if not slots or any(s not in SPECS for s in slots):
        raise r.err(f"{where}slots", f"expected a list of slots from {', '.join(SPECS)}")
    spec = SPECS[slots[0]]
    semantics = r.string(c, "semantics", where, default=spec.semantics)
    target = _target(r, r.string(c, "target", where, required=True), f"{where}target")
    specifier = r.string(c, "specifier", where, default="") or ""
    if specifier:
        r.specifier(specifier, f"{where}specifier")
    args = _scalars(r, c.get("args", list(spec.call_args)), f"{where}args", table=False)
    kwargs = _scalars(r, c.get("kwargs", spec.call_kwargs), f"{where}kwargs", table=True)
    build_kwargs = _scalars(r, c.get("build-kwargs", {}), f"{where}build-kwargs", table=True)
    twin_kwargs = _scalars(r, c.get("twin-kwargs", {}), f"{where}twin-kwargs", table=True)
    if semantics not in known_semantics():
        said = f"{semantics!r} is not one of {', '.join(known_semantics())}"
        raise r.err(f"{where}semantics", said)
    archs_table = r.table(c, "archs", DEVICE_TYPES, where)
    archs = {kind: r.strings(archs_table, kind, f"{where}archs.") for kind in archs_table}
    for kind, name in ((kind, name) for kind, names in archs.items() for name in names):
        if problem := gpu_arch_problem(name, (kind,)):
            raise r.err(f"{where}archs.{kind}", problem)
    blas = _blas(r, r.string(c, "blas", where, default="") or "", slots, semantics, where)
    install_table = r.table(c, "install", DEVICE_TYPES, where)
    return Candidate(
        id=cid,
        slots=slots,
        semantics=semantics,
        target=target,
        args=tuple(args),
        kwargs=dict(kwargs),
        build_kwargs=dict(build_kwargs),
        distribution=r.string(c, "distribution", where, default="") or "",
        specifier=specifier,
        module=r.string(c, "module", where, default=target.split(".")[0]) or "",
        devices=r.strings(c, "devices", where),
        archs=archs,
        install={k: r.string(install_table, k, f"{where}install.") or "" for k in install_table},
        compiled=r.boolean(c, "compiled", where),
        twin_target=r.string(c, "twin-target", where, default="") or "",
        twin_kwargs=dict(twin_kwargs),
        note=r.string(c, "note", where, default="") or "",
        source=source,
        blas=blas,
    )


def _target(r: TableReader, target: str, key: str) -> str:
    """A dotted import path, refused before any work when private (as --candidate and a lock)."""
    if not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$", target):
        raise r.err(key, f"{target!r} is not a dotted import path")
    if private(target):
        fix = "name a public class of an importable library, e.g. mylib.FastLayerNorm"
        raise r.err(key, f"{target!r} {PRIVATE}", fix=fix)
    return target


def _blas(r: TableReader, blas: str, slots: tuple[str, ...], semantics: str, where: str) -> str:
    """A BLAS library kernel-lock knows, for a Linear candidate only."""
    if not blas:
        return ""
    if not device_of(blas):
        known = ", ".join(f"{'/'.join(pair)} ({kind})" for kind, pair in LIBRARIES.items())
        raise r.err(f"{where}blas", f"{blas!r} is not a BLAS library kernel-lock knows: {known}")
    if slots != ("Linear",) or semantics != "linear":
        said = "only a Linear candidate runs under a BLAS library"
        raise r.err(f"{where}blas", said, fix="remove `blas`")
    return blas


def load_candidates(
    path: str | os.PathLike[str], *, source: str = "builtin"
) -> tuple[Candidate, ...]:
    """The ``[[candidate]]`` entries of a data file in ``kernel_lock/registry.toml``'s form."""
    r = TableReader(str(path))
    try:
        d = toml.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise r.err("", f"cannot read: {exc}") from None
    except (toml.TOMLDecodeError, ValueError) as exc:
        raise r.err("", f"not valid TOML: {exc}") from None
    r.no_unknown(d, ("library", "candidate"), "")
    return read_candidates(r, d, source=source)


@functools.cache
def builtin() -> tuple[Candidate, ...]:
    """The built-in candidates: kernel_lock's registry's, read on first use."""
    return load_candidates(lock_registry.path())


def default_for(slot: str) -> Candidate:
    """The candidate for the class a slot resolves to when the lock does not pin it: a built-in,
    or for a slot another package declares, one of that package's candidates."""
    target = SPECS[slot].default_target
    for cand in builtin():
        if cand.slots == (slot,) and cand.target == target:
            return cand
    found = [c for c in from_entry_points()[0] if slot in c.slots and c.target == target]
    if not found:
        fix = "the package that declares the slot offers its default class as a candidate"
        raise UsageError(f"no candidate of the {slot} slot is its default class {target}", fix=fix)
    return found[0]


_SPEC = re.compile(r"^(?P<slot>[A-Za-z]+)=(?P<target>[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+)$")


def from_command_line(text: str) -> Candidate:
    """``SLOT=dotted.path.Class``: a third-party class offered for a slot, judged like any other
    (its semantics assumed the slot's, its module trusted in the lock)."""
    m = _SPEC.match(text.strip())
    if not m:
        example = "e.g. LayerNorm=mylib.FastLayerNorm"
        raise UsageError(f"--candidate {text!r}: expected SLOT=dotted.path.Class, {example}")
    slot, target = m.group("slot"), m.group("target")
    if slot not in SPECS:
        raise UsageError(f"--candidate {text!r}: unknown slot {slot!r}; {slot_name_fix(slot)}")
    if private(target):
        fix = "offer a public class of an importable library, e.g. LayerNorm=mylib.FastLayerNorm"
        raise UsageError(f"--candidate {text!r}: {target!r} {PRIVATE}", fix=fix)
    default = default_for(slot)
    return Candidate(
        id=f"custom:{target}",
        slots=(slot,),
        semantics=SPECS[slot].semantics,
        target=target,
        args=SPECS[slot].call_args,
        kwargs=dict(SPECS[slot].call_kwargs),
        module=target.split(".")[0],
        twin_target=default.twin_target,
        twin_kwargs=default.twin_kwargs,
        source="command-line",
    )


def local_modules(candidates: Iterable[Candidate]) -> list[str]:
    """The top-level modules of the ``--candidate``s: the only ones a worker may find in the
    working directory (never on its path)."""
    return sorted({c.module for c in candidates if c.source == "command-line"})


def from_entry_points() -> tuple[list[Candidate], list[str]]:
    """Third-party candidates from the ``kernel_probe.probe.candidates`` entry points (a Candidate,
    a list, or a callable returning either); a broken plug-in is reported, never stops the probe."""
    found: list[Candidate] = []
    problems: list[str] = []
    for ep in metadata.entry_points(group="kernel_probe.probe.candidates"):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, Candidate):
                obj = obj()
            items = [obj] if isinstance(obj, Candidate) else list(obj)
            for item in items:
                if not isinstance(item, Candidate):
                    said = f"expected kernel_probe.candidates.Candidate, got {type(item).__name__}"
                    raise TypeError(said)
                found.append(replace(item, source=f"entry-point:{ep.name}"))
        except Exception as exc:  # a plug-in's bug must not stop the probe; it is reported
            problems.append(f"entry point {ep.name!r} ({ep.value}): {type(exc).__name__}: {exc}")
    return found, problems


def registry(
    extra: Iterable[Candidate] = (), *, entry_points: bool = True
) -> tuple[list[Candidate], list[str]]:
    """All candidates: built-in, plug-ins, then extras (command line, profile). Ids are unique."""
    plugins, problems = from_entry_points() if entry_points else ([], [])
    out: dict[str, Candidate] = {}
    for cand in (*builtin(), *plugins, *extra):
        if cand.semantics not in known_semantics():
            problems.append(f"candidate {cand.id}: unknown semantics {cand.semantics!r}")
            continue
        out[cand.id] = cand  # later sources override earlier ones with the same id
    return list(out.values()), problems


def for_slot(candidates: Iterable[Candidate], slot: str) -> list[Candidate]:
    """The candidates offered for ``slot``, in declaration order."""
    return [c for c in candidates if slot in c.slots]


def canonical_for(
    slot: str,
    *,
    hidden: int,
    rows: int | None = None,
    out_features: int | None = None,
    device: str = "cpu",
    param_dtype: str = "float32",
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Every value a template may name, for one slot at one size."""
    c = {**SPECS[slot].canonical, **(overrides or {})}
    c.update(normalized_shape=hidden, hidden=hidden, in_features=hidden)
    c.update(out_features=out_features or hidden, device=device, param_dtype=param_dtype)
    return c
