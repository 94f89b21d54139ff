"""Which kernel libraries are installed, what they really are, and whether they import.

Knowledge is data: ``known_libraries()`` says, for each library, the distribution names it ships
under, its top-level module, the module whose import proves it usable, and how to recognise what the
module really is (``variants``) from its files, without importing it. It is read from the
``[[library]]`` tables of kernel_lock's registry (``kernel_lock/registry.toml``): adding a library
is adding a table there.

The metadata part (``locate``) reads package metadata and the file system only; the import part
runs in child processes (``importcheck``), so nothing here imports a kernel library in-process.
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
    from kernel_probe.detect.importcheck import ImportRequest


@dataclass(frozen=True)
class Variant:
    """One thing a module name can turn out to be, recognised from its files.

    It matches when any path in ``has_any`` exists under the package directory, or any
    ``(file, text)`` in ``text_in`` names a file there that contains the text. A variant with
    neither matches anything: put it last, as the default.
    """

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
    """A kernel library the report looks for (a ``[[library]]`` of
    ``kernel_lock/registry.toml``)."""

    name: str  # the key in the report
    distributions: tuple[str, ...]  # distribution names it is installed under, preferred first
    module: str  # top-level import name
    check: str  # the module imported in the child: the one whose classes a lock would use
    variants: tuple[Variant, ...] = ()  # first match wins; empty: whatever the module is
    about: str = ""


LIBRARY_KEYS = ("name", "distributions", "module", "check", "about", "variant")
VARIANT_KEYS = ("key", "label", "has-any", "text-in", "usable")


def read_libraries(r: TableReader, d: Mapping[str, Any]) -> tuple[KnownLibrary, ...]:
    """The ``[[library]]`` tables of a registry file (``kernel_lock/registry.toml``)."""
    libs = []
    for i, lib in enumerate(d.get("library", [])):
        where = f"library[{i}]."
        r.no_unknown(lib, LIBRARY_KEYS, where)
        variants = []
        for j, v in enumerate(lib.get("variant", [])):
            vwhere = f"{where}variant[{j}]."
            r.no_unknown(v, VARIANT_KEYS, vwhere)
            text_in = v.get("text-in", [])
            if not all(
                isinstance(x, list) and len(x) == 2 and all(isinstance(s, str) for s in x)
                for x in text_in
            ):
                raise r.err(f"{vwhere}text-in", "expected a list of [file, text] pairs")
            variants.append(
                Variant(
                    str(r.string(v, "key", vwhere, required=True)),
                    str(r.string(v, "label", vwhere, required=True)),
                    has_any=r.strings(v, "has-any", vwhere),
                    text_in=tuple((f, s) for f, s in text_in),
                    usable=r.boolean(v, "usable", vwhere, default=True),
                )
            )
        libs.append(
            KnownLibrary(
                str(r.string(lib, "name", where, required=True)),
                r.strings(lib, "distributions", where),
                str(r.string(lib, "module", where, required=True)),
                str(r.string(lib, "check", where, required=True)),
                variants=tuple(variants),
                about=r.string(lib, "about", where, default="") or "",
            )
        )
    return tuple(libs)


# every library kernel-probe reports on, from kernel_lock's registry (one [[library]] table each)
@functools.cache
def known_libraries() -> tuple[KnownLibrary, ...]:
    """Every library kernel-probe reports on: the ``[[library]]`` tables of kernel_lock's registry,
    read on first use."""
    return read_libraries(TableReader(str(registry.path())), registry.data())


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


def find_distribution(name: str, path: Sequence[str]) -> metadata.Distribution | None:
    """The installed distribution ``name`` on ``path``, or None (nothing imported)."""
    for dist in metadata.distributions(name=name, path=list(path)):
        return dist
    return None


def module_location(module: str, extra_paths: Sequence[str] = ()) -> str | None:
    """Where ``import module`` (top-level) would load from, found without importing anything.

    ``extra_paths`` come first, as they will on the child's PYTHONPATH; then the normal finders
    (which also know editable installs).
    """
    spec = None
    if extra_paths:
        spec = importlib.machinery.PathFinder.find_spec(module, [str(p) for p in extra_paths])
    if spec is None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a broken finder or a module with __spec__ = None
            spec = None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        locations = list(spec.submodule_search_locations)
        if locations:
            return str(locations[0])
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
        if base is None:
            continue
        if any(os.path.exists(os.path.join(base, rel)) for rel in variant.has_any):
            return variant
        if any(_contains(os.path.join(base, rel), text) for rel, text in variant.text_in):
            return variant
    return None


def locate(library: KnownLibrary, extra_paths: Sequence[str] = ()) -> Located:
    """Where ``library`` is installed, its distributions' versions and its variant, without
    importing it."""
    path = search_path(extra_paths)
    versions: dict[str, str] = {}
    for name in library.distributions:
        dist = find_distribution(name, path)
        if dist is not None:
            versions[name] = str(dist.version)
    location = module_location(library.module, extra_paths)
    variant = recognise(library.variants, location) if location and library.variants else None
    return Located(library, versions, location, variant)


def locate_all(
    table: Sequence[KnownLibrary] | None = None, extra_paths: Sequence[str] = ()
) -> dict[str, Located]:
    """Where each library of ``table`` (default: :func:`known_libraries`) is installed, by name."""
    return {
        lib.name: locate(lib, extra_paths)
        for lib in (known_libraries() if table is None else table)
    }


def import_requests(located: Mapping[str, Located]) -> dict[str, ImportRequest]:
    """The child imports worth running: installed libraries that are what they claim to be."""
    from kernel_probe.detect.importcheck import ImportRequest

    return {
        name: ImportRequest(loc.library.check)
        for name, loc in located.items()
        if loc.installed and (loc.variant is None or loc.variant.usable)
    }


def report(located: Located, imported: Mapping[str, Any] | None) -> dict[str, Any]:
    """The JSON-ready entry for one library (keys documented in docs/env.md)."""
    lib = located.library
    if not located.installed:
        reason = "module not found"
        if located.distributions:
            reason = (
                f"distribution {located.distribution} is installed but module "
                f"{lib.module!r} is not importable"
            )
        status: dict[str, Any] = {"status": "not-installed", "reason": reason, "seconds": None}
    elif located.variant is not None and not located.variant.usable:
        status = {"status": "skipped", "reason": located.variant.label, "seconds": None}
    elif imported is None:
        status = {"status": "skipped", "reason": "import checks were not run", "seconds": None}
    else:
        status = dict(imported)
    return {
        "installed": located.installed,
        "version": located.distributions.get(located.distribution)
        if located.distribution
        else None,
        "distribution": located.distribution,
        "distributions": dict(located.distributions),
        "module": lib.module,
        "location": located.location,
        "variant": located.variant.key if located.variant else None,
        "identified_as": located.variant.label if located.variant else None,
        "check_module": lib.check,
        "import": status,
    }


def by_library(candidates: Sequence[Any]) -> dict[str, list[str]]:
    """Registry library name -> the ids of the candidates of ``candidates`` that come from it."""
    modules = {lib.module: lib.name for lib in known_libraries()}
    out: dict[str, list[str]] = {}
    for c in candidates:
        name = modules.get(c.module or registry.import_root(c.target))
        if name:
            out.setdefault(name, []).append(c.id)
    return out


def installed_for(candidates: Sequence[Any]) -> dict[str, str]:
    """Of the registry's libraries, those a candidate of ``candidates`` comes from, each with what
    is installed now: its version ("installed" when no distribution metadata names it), or "" when
    it is not installed.

    Read from metadata and the file system only (no import, no torch): the probe records it in the
    lock (``provenance.libraries``), and a lock probed before a library was installed or removed is
    stale."""
    out = {}
    for name in by_library(candidates):
        found = locate(next(lib for lib in known_libraries() if lib.name == name))
        out[name] = (
            (found.distributions[found.distribution] if found.distribution else "installed")
            if found.installed
            else ""
        )
    return dict(sorted(out.items()))


def library_change(
    recorded: Mapping[str, Any], now: Mapping[str, str], judged: Mapping[str, Sequence[str]]
) -> str | None:
    """Why a lock whose probe saw the libraries ``recorded`` is stale now (``now``:
    :func:`installed_for`): a library installed since, or removed since; ``judged``: library -> its
    candidates' ids, to name them."""
    changes = []
    for name, version in now.items():
        before = recorded.get(name)
        if not isinstance(before, str) or bool(before) == bool(version):
            continue
        ids = ", ".join(judged.get(name, ())) or "its candidates"
        if version:
            changes.append(
                f"{name} is installed now ({version}) but was not when the lock was probed: "
                f"{ids} never judged"
            )
        else:
            changes.append(
                f"{name} ({before}) was installed when the lock was probed and is not now: "
                f"{ids} judged on it"
            )
    return "; ".join(changes) or None
