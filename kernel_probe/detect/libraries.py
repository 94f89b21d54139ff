"""Which kernel libraries are installed, and what they really are, from package metadata and files
only: nothing is imported here (``importcheck`` does, in children). Knowledge is data: the
``[[library]]`` tables of ``kernel_lock/registry.toml`` (distributions, module, the module whose
import proves it usable, ``variants`` recognised from its files); adding a library is adding one.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

from kernel_lock import registry
from kernel_probe.tables import TableReader

if TYPE_CHECKING:  # the import checks' machinery is not loaded by a staleness check (the warm path)
    from kernel_probe.isolation.protocol import ImportCheckRequest

LIBRARY_KEYS = ("name", "distributions", "module", "check", "about", "variant")
VARIANT_KEYS = ("key", "label", "has-any", "text-in", "usable")
NOT_RUN = {"status": "skipped", "reason": "import checks were not run", "seconds": None}


@dataclass(frozen=True)
class Variant:
    """What a module can turn out to be: a path of ``has_any`` exists under the package, or a file
    of ``text_in`` holds its text; with neither it matches anything (the default, last)."""

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
        r.no_unknown(lib, LIBRARY_KEYS, where)
        variants = []
        for j, v in enumerate(lib.get("variant", [])):
            at = f"{where}variant[{j}]."
            r.no_unknown(v, VARIANT_KEYS, at)
            text_in = v.get("text-in", [])
            if not all(
                isinstance(x, list) and len(x) == 2 and all(isinstance(s, str) for s in x)
                for x in text_in
            ):
                raise r.err(f"{at}text-in", "expected a list of [file, text] pairs")
            variants.append(
                Variant(
                    r.string(v, "key", at, required=True),
                    r.string(v, "label", at, required=True),
                    has_any=r.strings(v, "has-any", at),
                    text_in=tuple((f, t) for f, t in text_in),
                    usable=r.boolean(v, "usable", at, default=True),
                )
            )
        libs.append(
            KnownLibrary(
                r.string(lib, "name", where, required=True),
                r.strings(lib, "distributions", where),
                r.string(lib, "module", where, required=True),
                r.string(lib, "check", where, required=True),
                variants=tuple(variants),
                about=r.string(lib, "about", where, default=""),
            )
        )
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
    """Where ``import module`` (top-level) would load from, found without importing anything:
    ``extra_paths`` first (as on the child's PYTHONPATH), then the normal finders."""
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


def import_requests(located: Mapping[str, Located]) -> dict[str, ImportCheckRequest]:
    """The child imports worth running: installed libraries that are what they claim to be."""
    from kernel_probe.isolation.protocol import ImportCheckRequest  # not on the warm path

    return {
        name: ImportCheckRequest(module=loc.library.check)
        for name, loc in located.items()
        if loc.installed and (loc.variant is None or loc.variant.usable)
    }


def report(located: Located, imported: Mapping[str, Any] | None) -> dict[str, Any]:
    """The JSON-ready entry for one library (keys documented in docs/env.md)."""
    lib, variant = located.library, located.variant
    if not located.installed:
        reason = "module not found"
        if located.distributions:
            reason = (
                f"distribution {located.distribution} is installed but module "
                f"{lib.module!r} is not importable"
            )
        status: dict[str, Any] = {"status": "not-installed", "reason": reason, "seconds": None}
    elif variant is not None and not variant.usable:
        status = {"status": "skipped", "reason": variant.label, "seconds": None}
    else:
        status = dict(NOT_RUN if imported is None else imported)
    return {
        "installed": located.installed,
        "version": located.distributions.get(located.distribution or "", None),
        "distribution": located.distribution,
        "distributions": dict(located.distributions),
        "module": lib.module,
        "location": located.location,
        "variant": variant.key if variant else None,
        "identified_as": variant.label if variant else None,
        "check_module": lib.check,
        "import": status,
    }


def by_library(candidates: Sequence[Any]) -> dict[str, list[str]]:
    """Registry library name -> the ids of the candidates of ``candidates`` that come from it."""
    modules = {lib.module: lib.name for lib in known_libraries()}
    out: dict[str, list[str]] = {}
    for c in candidates:
        if name := modules.get(c.module or registry.import_root(c.target)):
            out.setdefault(name, []).append(c.id)
    return out


def installed_for(candidates: Sequence[Any]) -> dict[str, str]:
    """Of the registry's libraries, those a candidate comes from, with what is installed now: its
    version ("installed" without metadata), or "". No import: the lock records it
    (``provenance.libraries``), and a library installed or removed since makes the lock stale."""
    out = {}
    for name in sorted(by_library(candidates)):
        found = locate(known(name))  # type: ignore[arg-type]  # by_library names known ones
        version = found.distributions[found.distribution] if found.distribution else "installed"
        out[name] = version if found.installed else ""
    return out


def library_change(
    recorded: Mapping[str, Any], now: Mapping[str, str], judged: Mapping[str, Sequence[str]]
) -> str | None:
    """Why a lock whose probe saw the libraries ``recorded`` is stale now (``now``: installed_for;
    ``judged``: library -> its candidates' ids, to name them)."""
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
