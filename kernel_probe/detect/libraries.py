"""Which kernel libraries are installed, what they really are, and whether they import.

Knowledge is data: ``KNOWN_LIBRARIES`` says, for each library, the distribution names it ships
under, its top-level module, the module whose import proves it usable, and how to recognise what
the module really is (``variants``) from its files, without importing it. Adding a library is
adding a row.

The metadata part (``locate``) reads package metadata and the file system only; the import part
runs in child processes (``importcheck``), so nothing here imports a kernel library in-process.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from .importcheck import ImportRequest


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
        return not self.has_any and not self.text_in


@dataclass(frozen=True)
class KnownLibrary:
    name: str  # the key in the report
    distributions: tuple[str, ...]  # distribution names it is installed under, preferred first
    module: str  # top-level import name
    check: str  # the module imported in the child: the one whose classes a lock would use
    variants: tuple[Variant, ...] = ()  # first match wins; empty: whatever the module is
    about: str = ""


KNOWN_LIBRARIES: tuple[KnownLibrary, ...] = (
    KnownLibrary(
        "liger-kernel", ("liger-kernel", "liger-kernel-nightly"), "liger_kernel", "liger_kernel.transformers",
        about="Triton kernels (LigerLayerNorm, LigerRMSNorm); needs >= 0.4.0 on AMD",
    ),
    KnownLibrary(
        "transformer-engine",
        # tealite: the ROCm fork's "lite" wheels (its transformer_engine/__init__.py reads that name)
        ("transformer-engine", "transformer-engine-torch", "transformer-engine-cu12", "transformer-engine-cu13",
         "tealite"),
        "transformer_engine", "transformer_engine.pytorch",
        variants=(
            # ROCm/TransformerEngine marks its files "modified for portability to AMDGPU"; newer
            # releases also ship _rocm_init.py. Both are read from disk, nothing is imported.
            Variant("rocm-fork", "ROCm fork (ROCm/TransformerEngine)", has_any=("_rocm_init.py",),
                    text_in=(("__init__.py", "portability to AMDGPU"),)),
            Variant("nvidia", "NVIDIA TransformerEngine (CUDA)"),
        ),
        about="fused LayerNorm/RMSNorm/Linear (NVIDIA's, or AMD's ROCm fork under the same names)",
    ),
    KnownLibrary(
        "apex", ("apex",), "apex", "apex.normalization",
        variants=(
            # NVIDIA apex is not on PyPI; it is built from source and still calls itself "apex".
            # The PyPI distribution "apex" is an unrelated Pyramid web toolkit: only the module
            # tells them apart.
            # AMD's fork (github.com/ROCm/apex) builds its extensions with a DeepSpeed-style op_builder
            # and says so in apex/git_version_info.py ("Modified for ROCm Apex").
            Variant("rocm-fork", "ROCm fork (ROCm/apex)", has_any=("op_builder", "git_version_info_installed.py"),
                    text_in=(("git_version_info.py", "ROCm Apex"),)),
            Variant("nvidia", "NVIDIA apex (CUDA)", has_any=("normalization", "normalization.py")),
            Variant("unrelated", "not apex (an unrelated package named apex, e.g. the PyPI "
                    "Pyramid toolkit)", usable=False),
        ),
        about="apex (NVIDIA's, or AMD's ROCm fork): FusedLayerNorm, FusedRMSNorm",
    ),
    KnownLibrary("flash-attn", ("flash-attn",), "flash_attn", "flash_attn",
                 about="FlashAttention (Dao-AILab, or the ROCm fork); also ships Triton layer norms"),
    KnownLibrary("quack-kernels", ("quack-kernels",), "quack", "quack",
                 about="CuTe-DSL kernels; H100/B200 only, CUDA >= 12.9"),
    KnownLibrary("kernels", ("kernels",), "kernels", "kernels", about="Hugging Face kernel hub loader"),
)


@dataclass(frozen=True)
class Located:
    """What metadata and the file system say about one library, before any import."""

    library: KnownLibrary
    distributions: dict[str, str] = field(default_factory=dict)  # name -> version, those installed
    location: str | None = None  # the package directory (or module file) that `import` would load
    variant: Variant | None = None

    @property
    def installed(self) -> bool:
        return self.location is not None

    @property
    def distribution(self) -> str | None:
        return next(iter(self.distributions), None)


def search_path(extra_paths: Sequence[str] = ()) -> list[str]:
    return [str(p) for p in extra_paths] + list(sys.path)


def find_distribution(name: str, path: Sequence[str]) -> metadata.Distribution | None:
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
    path = search_path(extra_paths)
    versions: dict[str, str] = {}
    for name in library.distributions:
        dist = find_distribution(name, path)
        if dist is not None:
            versions[name] = str(dist.version)
    location = module_location(library.module, extra_paths)
    variant = recognise(library.variants, location) if location and library.variants else None
    return Located(library, versions, location, variant)


def locate_all(table: Sequence[KnownLibrary] = KNOWN_LIBRARIES, extra_paths: Sequence[str] = ()) -> dict[str, Located]:
    return {lib.name: locate(lib, extra_paths) for lib in table}


def import_requests(located: Mapping[str, Located]) -> dict[str, ImportRequest]:
    """The child imports worth running: installed libraries that are what they claim to be."""
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
            reason = f"distribution {located.distribution} is installed but module {lib.module!r} is not importable"
        status: dict[str, Any] = {"status": "not-installed", "reason": reason, "seconds": None}
    elif located.variant is not None and not located.variant.usable:
        status = {"status": "skipped", "reason": located.variant.label, "seconds": None}
    elif imported is None:
        status = {"status": "skipped", "reason": "import checks were not run", "seconds": None}
    else:
        status = dict(imported)
    return {
        "installed": located.installed,
        "version": located.distributions.get(located.distribution) if located.distribution else None,
        "distribution": located.distribution,
        "distributions": dict(located.distributions),
        "module": lib.module,
        "location": located.location,
        "variant": located.variant.key if located.variant else None,
        "identified_as": located.variant.label if located.variant else None,
        "check_module": lib.check,
        "import": status,
    }
