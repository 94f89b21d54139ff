"""Which kernel libraries and which Triton are installed, and what they really are, from package
metadata and files only (nothing imported). The libraries are the ``[[library]]`` tables of
``kernel_lock/registry.toml``. Several distributions install the same ``triton`` package (PyPI's
``triton``, ``pytorch-triton-rocm``, ...): the last installed owns the files; their RECORDs tell."""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from kernel_lock import registry
from kernel_probe.tables import TableReader

TRITON = "triton"  # the module
# distribution -> the backend its builds target when its RECORD lists no triton/backends/ (2.x)
TRITON_DISTRIBUTIONS: dict[str, str] = {
    **dict.fromkeys(("triton", "pytorch-triton"), "cuda"),
    **dict.fromkeys(("pytorch-triton-rocm", "triton-rocm"), "hip"),
    **dict.fromkeys(("pytorch-triton-xpu", "triton-xpu"), "xpu"),
}
BACKEND_DIRECTORIES = {"nvidia": "cuda", "amd": "hip", "intel": "xpu"}  # triton/backends/<dir>


@dataclass(frozen=True)
class Variant:
    """What a module can turn out to be: a path of ``has_any`` exists under the package, or a file
    of ``text_in`` holds its text; with neither it is the default (last)."""

    key: str
    label: str
    has_any: tuple[str, ...] = ()
    text_in: tuple[tuple[str, str], ...] = ()
    usable: bool = True  # False: a namesake, not the library we mean; its import is not checked

    @property
    def is_default(self) -> bool:
        """Whether this variant is the fallback (it has no recognising condition)."""
        return not self.has_any and not self.text_in


@dataclass(frozen=True)
class KnownLibrary:
    """A kernel library the report looks for (a ``[[library]]`` of the registry)."""

    name: str  # the key in the report
    distributions: tuple[str, ...]  # distribution names it is installed under, preferred first
    module: str  # top-level import name
    check: str  # the module imported in the child: the one whose classes a lock would use
    variants: tuple[Variant, ...] = ()  # first match wins; empty: whatever the module is
    about: str = ""


def read_libraries(r: TableReader, d: Mapping[str, Any]) -> tuple[KnownLibrary, ...]:
    """The ``[[library]]`` tables of a registry file (``kernel_lock/registry.toml``)."""
    libs = []
    for i, lib in enumerate(d.get("library", [])):
        where = f"library[{i}]."
        r.no_unknown(lib, ("name", "distributions", "module", "check", "about", "variant"), where)
        variants = []
        for j, v in enumerate(lib.get("variant", [])):
            at = f"{where}variant[{j}]."
            r.no_unknown(v, ("key", "label", "has-any", "text-in", "usable"), at)
            text_in = v.get("text-in", [])
            if not all(
                isinstance(x, list) and len(x) == 2 and all(isinstance(s, str) for s in x)
                for x in text_in
            ):
                raise r.err(f"{at}text-in", "expected a list of [file, text] pairs")
            key, label = (r.string(v, k, at, required=True) for k in ("key", "label"))
            has_any, usable = r.strings(v, "has-any", at), r.boolean(v, "usable", at, default=True)
            variants.append(Variant(key, label, has_any, tuple(map(tuple, text_in)), usable))
        name = r.string(lib, "name", where, required=True)
        dists = r.strings(lib, "distributions", where)
        module, check = (r.string(lib, k, where, required=True) for k in ("module", "check"))
        about = r.string(lib, "about", where, default="")
        libs.append(KnownLibrary(name, dists, module, check, tuple(variants), about))
    return tuple(libs)


@functools.cache
def known_libraries() -> tuple[KnownLibrary, ...]:
    """Every library kernel-probe reports on: the registry's ``[[library]]`` tables, read once."""
    return read_libraries(TableReader(str(registry.path())), registry.data())


def known(name: str) -> KnownLibrary | None:
    """The registry's library ``name``, or None."""
    return next((lib for lib in known_libraries() if lib.name == name), None)


@dataclass(frozen=True)
class Located:
    """What metadata and the file system say about one library, before any import."""

    library: KnownLibrary
    distributions: dict[str, str] = field(default_factory=dict)  # name -> version, those installed
    location: str | None = None  # the package directory (or module file) that `import` would load
    variant: Variant | None = None

    @property
    def installed(self) -> bool:
        """Whether the library's module was found on the path."""
        return self.location is not None

    @property
    def distribution(self) -> str | None:
        """The first of the library's distributions installed, if any."""
        return next(iter(self.distributions), None)


def search_path(extra_paths: Sequence[str] = ()) -> list[str]:
    """Where to look for distributions and modules: ``extra_paths`` first, then ``sys.path``."""
    return [str(p) for p in extra_paths] + list(sys.path)


def module_location(module: str, extra_paths: Sequence[str] = ()) -> str | None:
    """Where ``import module`` (top-level) would load from, found without importing anything,
    ``extra_paths`` first (as on the child's PYTHONPATH)."""
    spec = None
    if extra_paths:
        spec = importlib.machinery.PathFinder.find_spec(module, [str(p) for p in extra_paths])
    if spec is None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a broken finder or a module with __spec__ = None
            return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return str(list(spec.submodule_search_locations)[0])
    return str(spec.origin) if spec.origin else None


def _contains(path: str, text: str, limit: int = 65536) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return text in fh.read(limit)
    except OSError:
        return False


def recognise(variants: Sequence[Variant], location: str) -> Variant | None:
    """The first variant whose marker files are present under ``location`` (a package directory)."""
    base = location if os.path.isdir(location) else None
    for variant in variants:
        if variant.is_default:
            return variant
        if base is not None and (
            any(os.path.exists(os.path.join(base, rel)) for rel in variant.has_any)
            or any(_contains(os.path.join(base, rel), text) for rel, text in variant.text_in)
        ):
            return variant
    return None


def installed(names: Sequence[str], path: Sequence[str]) -> dict[str, metadata.Distribution]:
    """The distributions of ``names`` installed on ``path``, by name (nothing imported)."""
    found = {n: next(iter(metadata.distributions(name=n, path=list(path))), None) for n in names}
    return {n: d for n, d in found.items() if d is not None}


def locate(library: KnownLibrary, extra_paths: Sequence[str] = ()) -> Located:
    """Where ``library`` is installed, its distributions' versions and its variant (no import)."""
    found = installed(library.distributions, search_path(extra_paths))
    location = module_location(library.module, extra_paths)
    variant = recognise(library.variants, location) if location and library.variants else None
    return Located(library, {n: str(d.version) for n, d in found.items()}, location, variant)


def locate_all(
    table: Sequence[KnownLibrary] | None = None, extra_paths: Sequence[str] = ()
) -> dict[str, Located]:
    """Where each library of ``table`` (default: :func:`known_libraries`) is installed, by name."""
    libs = known_libraries() if table is None else table
    return {lib.name: locate(lib, extra_paths) for lib in libs}


def by_library(candidates: Sequence[Any]) -> dict[str, list[str]]:
    """Registry library name -> the ids of the candidates of ``candidates`` that come from it, by
    top-level package (``apex.normalization``'s library is ``apex``)."""
    modules = {lib.module: lib.name for lib in known_libraries()}
    out: dict[str, list[str]] = {}
    for c in candidates:
        if name := modules.get(registry.import_root(c.module or c.target)):
            out.setdefault(name, []).append(c.id)
    return out


def installed_for(candidates: Sequence[Any]) -> dict[str, str]:
    """Of the registry's libraries, those a candidate comes from, with what is installed now: its
    version ("installed" without metadata), or "" (the lock's ``provenance.libraries``)."""
    out = {}
    for name in sorted(by_library(candidates)):
        found = locate(known(name))  # type: ignore[arg-type]  # by_library names known ones
        version = next(iter(found.distributions.values()), "installed")
        out[name] = version if found.installed else ""
    return out


def library_change(
    recorded: Mapping[str, Any], now: Mapping[str, str], judged: Mapping[str, Sequence[str]]
) -> str | None:
    """Why a lock whose probe saw the libraries ``recorded`` is stale now (``now``: installed_for;
    ``judged``: library -> its candidates' ids)."""
    changes = []
    for name, version in now.items():
        before = recorded.get(name)
        if not isinstance(before, str) or bool(before) == bool(version):
            continue
        ids = ", ".join(judged.get(name, ())) or "its candidates"
        changes.append(
            f"{name} is installed now ({version}) but was not when the lock was probed: "
            f"{ids} never judged"
            if version
            else f"{name} ({before}) was installed when the lock was probed and is not now: "
            f"{ids} judged on it"
        )
    return "; ".join(changes) or None


def backends_of(dist: metadata.Distribution, name: str) -> list[str]:
    """The backends a Triton distribution carries, from its RECORD (``triton/backends/<dir>/``)."""
    found = set()
    for entry in dist.files or ():
        parts = str(entry).replace("\\", "/").split("/")
        if len(parts) > 3 and parts[:2] == [TRITON, "backends"] and parts[2] in BACKEND_DIRECTORIES:
            found.add(BACKEND_DIRECTORIES[parts[2]])
    return sorted(found) or [TRITON_DISTRIBUTIONS[name]]


def torch_pin(path: Sequence[str] = ()) -> tuple[str, str] | None:
    """(distribution, version) of the Triton torch's wheel pins (``Requires-Dist``), or None."""
    from packaging.requirements import InvalidRequirement, Requirement  # only ``env`` needs it

    dist = installed(("torch",), search_path(path)).get("torch")
    for text in (dist.requires or []) if dist is not None else []:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        pinned = [s.version for s in req.specifier if s.operator in ("==", "===")]
        if req.name.lower() in TRITON_DISTRIBUTIONS and pinned:
            return req.name.lower(), pinned[0]
    return None


@dataclass(frozen=True)
class LocatedTriton:
    """Where Triton is installed, the distributions that own it and torch's pin (no import)."""

    location: str | None  # the triton package directory `import triton` would load
    distributions: dict[str, str] = field(default_factory=dict)  # installed: name -> version
    owners: tuple[str, ...] = ()  # distributions whose RECORD matches the files on disk
    owner_evidence: str = ""
    backends: dict[str, list[str]] = field(default_factory=dict)  # installed: name -> backends
    torch_pin: tuple[str, str] | None = None  # what torch's wheel requires: (distribution, version)

    @property
    def installed(self) -> bool:
        """Whether Triton's module was found on the path."""
        return self.location is not None


def _record_hash(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _matches_disk(dist: metadata.Distribution, package_dir: str) -> bool | None:
    checked = 0
    for entry in dist.files or ():
        rel = str(entry).replace("\\", "/")
        hashed = rel == f"{TRITON}/__init__.py" and getattr(entry.hash, "mode", "") == "sha256"
        sized = rel.startswith(f"{TRITON}/_C/") and entry.size is not None
        if not (hashed or sized):
            continue
        path = os.path.join(os.path.dirname(package_dir), *rel.split("/"))
        try:
            if sized and entry.size is not None and os.path.getsize(path) != int(entry.size):
                return False
            if hashed and entry.hash is not None and _record_hash(path) != entry.hash.value:
                return False
        except OSError:
            return False
        checked += 1
    return True if checked else None


def locate_triton(extra_paths: Sequence[str] = ()) -> LocatedTriton:
    """Where Triton is installed, its distributions' versions and backends (no import)."""
    location = module_location(TRITON, extra_paths)
    found = installed(tuple(TRITON_DISTRIBUTIONS), search_path(extra_paths))
    versions = {name: str(dist.version) for name, dist in found.items()}
    backends = {name: backends_of(dist, name) for name, dist in found.items()}
    pin = torch_pin(extra_paths)
    if location is None or not os.path.isdir(location) or not found:
        return LocatedTriton(location, versions, backends=backends, torch_pin=pin)
    owners = tuple(name for name, dist in found.items() if _matches_disk(dist, location))
    evidence = "no installed distribution's RECORD matches the files on disk"
    if owners:
        evidence = "RECORD hash/size matches the files on disk"
    elif len(found) == 1:
        owners = tuple(found)
        evidence = "the only triton distribution installed (its RECORD could not confirm it)"
    return LocatedTriton(location, versions, owners, evidence, backends, pin)
