"""Which kernel libraries and which Triton are installed, and what they really are, read from
package metadata and the file system only: nothing here imports them (``importcheck`` does).

Knowledge is data: the ``[[library]]`` tables of ``kernel_lock/registry.toml`` say, per library,
the distributions it ships under, its module, the module whose import proves it usable and how to
recognise what the module really is from its files (``variants``).

Several distributions install the same ``triton`` package (PyPI's ``triton``, which carries both
the CUDA and the AMD backend from 3.x; ``pytorch-triton-rocm``, ``pytorch-triton``, ...). A library
that depends on plain ``triton`` puts a second Triton beside the one torch's wheel pins; whichever
was installed last owns the files, which is read from the wheel RECORDs (the hash of
``triton/__init__.py``, the sizes of ``triton/_C/*``). The active backend and arch need Triton's
runtime, asked in the import-check child; only where a GPU may be (a GPU device node, or torch sees
a device): elsewhere asking costs 1.5 s of CPU to end in "0 active drivers". Otherwise the backend
is inferred from torch's build, and said so.
"""

from __future__ import annotations

import base64
import functools
import glob
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

from kernel_lock.fingerprint.host import normalize_gcn_arch
from kernel_lock.trust import registry
from kernel_probe.tables import TableReader

if TYPE_CHECKING:  # the import checks' machinery is not loaded by a staleness check (the warm path)
    from kernel_probe.isolation.protocol import ImportCheckRequest

LIBRARY_KEYS = ("name", "distributions", "module", "check", "about", "variant")
VARIANT_KEYS = ("key", "label", "has-any", "text-in", "usable")
TRITON = "triton"
# distribution -> the backend its builds target when its RECORD lists no triton/backends/ (2.x)
TRITON_DISTRIBUTIONS: dict[str, str] = {
    "triton": "cuda",
    "pytorch-triton": "cuda",
    "pytorch-triton-rocm": "hip",
    "triton-rocm": "hip",
    "pytorch-triton-xpu": "xpu",
    "triton-xpu": "xpu",
}
BACKEND_FOR_TORCH_BUILD = {"cuda": "cuda", "rocm": "hip", "xpu": "xpu"}
BACKEND_DIRECTORIES = {"nvidia": "cuda", "amd": "hip", "intel": "xpu"}  # triton/backends/<dir>
# the device nodes of a GPU driver (NVIDIA, AMD's KFD, a DRM render node): without any of them no
# Triton backend can find a device
GPU_DEVICE_NODES = ("dev/nvidia*", "dev/kfd", "dev/dri/renderD*")
NO_GPU = "no GPU device on this node"
NOT_RUN = {"status": "skipped", "reason": "import checks were not run", "seconds": None}


@dataclass(frozen=True)
class Variant:
    """One thing a module name can turn out to be: it matches when a path of ``has_any`` exists
    under the package, or a ``(file, text)`` of ``text_in`` names a file there holding the text;
    with neither it matches anything (the default, last)."""

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


def _variant(r: TableReader, v: Mapping[str, Any], where: str) -> Variant:
    r.no_unknown(v, VARIANT_KEYS, where)
    text_in = v.get("text-in", [])
    if not all(
        isinstance(x, list) and len(x) == 2 and all(isinstance(s, str) for s in x) for x in text_in
    ):
        raise r.err(f"{where}text-in", "expected a list of [file, text] pairs")
    return Variant(
        str(r.string(v, "key", where, required=True)),
        str(r.string(v, "label", where, required=True)),
        has_any=r.strings(v, "has-any", where),
        text_in=tuple((f, s) for f, s in text_in),
        usable=r.boolean(v, "usable", where, default=True),
    )


def read_libraries(r: TableReader, d: Mapping[str, Any]) -> tuple[KnownLibrary, ...]:
    """The ``[[library]]`` tables of a registry file (``kernel_lock/registry.toml``)."""
    libs = []
    for i, lib in enumerate(d.get("library", [])):
        where = f"library[{i}]."
        r.no_unknown(lib, LIBRARY_KEYS, where)
        variants = [
            _variant(r, v, f"{where}variant[{j}].") for j, v in enumerate(lib.get("variant", []))
        ]
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


@functools.cache
def known_libraries() -> tuple[KnownLibrary, ...]:
    """Every library kernel-probe reports on: the registry's ``[[library]]`` tables, read once."""
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
    return next(iter(metadata.distributions(name=name, path=list(path))), None)


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


def _installed(names: Sequence[str], path: Sequence[str]) -> dict[str, metadata.Distribution]:
    found = {name: find_distribution(name, path) for name in names}
    return {name: dist for name, dist in found.items() if dist is not None}


def locate(library: KnownLibrary, extra_paths: Sequence[str] = ()) -> Located:
    """Where ``library`` is installed, its distributions' versions and its variant, without
    importing it."""
    found = _installed(library.distributions, search_path(extra_paths))
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
        name = modules.get(c.module or registry.import_root(c.target))
        if name:
            out.setdefault(name, []).append(c.id)
    return out


def installed_for(candidates: Sequence[Any]) -> dict[str, str]:
    """Of the registry's libraries, those a candidate comes from, each with what is installed now:
    its version ("installed" without distribution metadata), or "" when it is not installed.

    From metadata and the file system only (no import, no torch): the probe records it in the lock
    (``provenance.libraries``), and a lock probed before a library was installed or removed is
    stale."""
    out = {}
    for name in by_library(candidates):
        found = locate(next(lib for lib in known_libraries() if lib.name == name))
        version = found.distributions[found.distribution] if found.distribution else "installed"
        out[name] = version if found.installed else ""
    return dict(sorted(out.items()))


def library_change(
    recorded: Mapping[str, Any], now: Mapping[str, str], judged: Mapping[str, Sequence[str]]
) -> str | None:
    """Why a lock whose probe saw the libraries ``recorded`` is stale now (``now``:
    :func:`installed_for`): a library installed or removed since; ``judged``: library -> its
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


# ---- Triton ----------------------------------------------------------------------------------
def gpu_device_nodes(root: str | os.PathLike[str] = "/") -> list[str]:
    """The GPU device nodes under ``root`` (``GPU_DEVICE_NODES``; tests pass a folder of fakes)."""
    base = os.fspath(root)
    return sorted(p for pattern in GPU_DEVICE_NODES for p in glob.glob(os.path.join(base, pattern)))


def target_not_asked(device_nodes: Sequence[str], device_type: str) -> str | None:
    """Why Triton's runtime is not asked for a target (None: ask it): no GPU device node and torch
    (``device_type``: the primary device's type) sees only the CPU."""
    if device_nodes or device_type != "cpu":
        return None
    patterns = ", ".join("/" + p for p in GPU_DEVICE_NODES)
    return f"{NO_GPU} (none of {patterns}, and torch sees only the CPU)"


def backends_of(dist: metadata.Distribution, name: str) -> list[str]:
    """The backends a Triton distribution carries, from its RECORD (``triton/backends/<dir>/``)."""
    found = set()
    for entry in dist.files or ():
        parts = str(entry).replace("\\", "/").split("/")
        if len(parts) > 3 and parts[:2] == [TRITON, "backends"] and parts[2] in BACKEND_DIRECTORIES:
            found.add(BACKEND_DIRECTORIES[parts[2]])
    return sorted(found) or [TRITON_DISTRIBUTIONS[name]]


def torch_pin(path: Sequence[str] = ()) -> tuple[str, str] | None:
    """(distribution, version) of the Triton torch's wheel pins (``Requires-Dist:
    pytorch-triton-rocm==3.1.0+...``)."""
    from packaging.requirements import InvalidRequirement, Requirement  # only env needs it

    dist = find_distribution("torch", search_path(path))
    for text in (dist.requires or []) if dist is not None else []:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() in TRITON_DISTRIBUTIONS:
            pinned = [s.version for s in req.specifier if s.operator in ("==", "===")]
            if pinned:
                return req.name.lower(), pinned[0]
    return None


@dataclass(frozen=True)
class LocatedTriton:
    """Where Triton is installed, the distributions that own it and torch's pin, found without
    importing it."""

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
    """Whether the distribution's recorded files match the disk; None when it records none
    usable."""
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
    """Where Triton is installed, its distributions' versions and backends, without importing it."""
    location = module_location(TRITON, extra_paths)
    found = _installed(tuple(TRITON_DISTRIBUTIONS), search_path(extra_paths))
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


def triton_request(location: str | None, *, target: bool = True) -> ImportCheckRequest | None:
    """The import check of Triton at ``location`` (None: not installed, no check); ``target``: the
    child also asks Triton's runtime for its target."""
    from kernel_probe.isolation.protocol import ImportCheckRequest  # not on the warm path

    if location is None:
        return None
    return ImportCheckRequest(module=TRITON, probe="triton-target" if target else "")


def _pin_problem(located: LocatedTriton, provider: str | None) -> tuple[bool | None, str | None]:
    if located.torch_pin is None or provider is None:
        return None, None
    dist, version = located.torch_pin
    have = located.distributions.get(provider, "")
    if provider == dist and have == version:
        return True, None
    return False, (
        f"torch was built with {dist}=={version}, but the 'triton' package in use comes from "
        f"{provider} {have}: Triton kernels (liger, torch.compile) may fail to compile or behave "
        f"differently; reinstall {dist}=={version} last"
    )


def _target(
    located: LocatedTriton, imported: Mapping[str, Any] | None, wanted: str | None, arch: str
) -> dict[str, Any]:
    """The active backend, arch and warp size: Triton's runtime's, else inferred from torch."""
    out: dict[str, Any] = dict(backend=None, arch=None, warp_size=None, target_source=None)
    target = (imported or {}).get("target")
    if target:
        backend = str(target.get("backend") or "")
        raw = str(target.get("arch") or "")
        raw = f"sm_{raw}" if backend == "cuda" and raw.isdigit() else raw
        raw = normalize_gcn_arch(raw) if backend == "hip" else raw
        out.update(backend=backend or None, arch=raw or None, warp_size=target.get("warp_size"))
        out["target_source"] = "runtime"
    elif located.installed and wanted is not None:
        out.update(backend=wanted, arch=arch or None, target_source="torch build")
    out["target_error"] = imported.get("target_error") if imported and not target else None
    return out


def triton_report(
    located: LocatedTriton,
    imported: Mapping[str, Any] | None,
    *,
    torch_build: str,
    device_arch: str,
    not_asked: str | None = None,
) -> dict[str, Any]:
    """The JSON-ready triton section (keys documented in docs/env.md); ``not_asked``: why the import
    check did not ask the runtime for a target (``target_not_asked``)."""
    provider = located.owners[0] if len(located.owners) == 1 else None
    built_for = {
        n: located.backends.get(n) or [TRITON_DISTRIBUTIONS[n]] for n in located.distributions
    }
    conflict = None
    if len(located.distributions) > 1:
        listed = ", ".join(
            f"{n} {located.distributions[n]} (backends: {', '.join(b)})"
            for n, b in built_for.items()
        )
        conflict = (
            f"several distributions install the same 'triton' package: {listed}; the one "
            f"installed last owns the files (now: {provider or 'unknown'})"
        )
    wanted = BACKEND_FOR_TORCH_BUILD.get(torch_build)
    provider_backends = built_for.get(provider) if provider else None
    matches_pin, pin_problem = _pin_problem(located, provider)
    pin = located.torch_pin
    if not located.installed:
        status = {"status": "not-installed", "reason": "module not found", "seconds": None}
    elif imported is None:
        status = dict(NOT_RUN)
    else:
        status = {k: v for k, v in imported.items() if k not in ("target", "target_error")}
    return {
        "installed": located.installed,
        "location": located.location,
        "provider": provider,
        "provider_candidates": list(located.owners),
        "provider_evidence": located.owner_evidence or None,
        "version": located.distributions.get(provider) if provider else None,
        "distributions": {
            n: {"version": v, "built_for": built_for[n]} for n, v in located.distributions.items()
        },
        "conflict": conflict,
        "matches_torch_build": None
        if wanted is None or provider_backends is None
        else wanted in provider_backends,
        "torch_requires": f"{pin[0]}=={pin[1]}" if pin else None,
        "matches_torch_pin": matches_pin,
        "torch_pin_problem": pin_problem,
        **_target(located, imported, wanted, device_arch),
        "target_not_asked": not_asked
        if imported is not None and not imported.get("target")
        else None,
        "import": status,
    }
