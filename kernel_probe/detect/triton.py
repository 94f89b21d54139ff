"""Triton: which distribution provides the ``triton`` package, and for which backend.

Several distributions install the same ``triton`` package: ``triton`` from PyPI (built for CUDA),
``pytorch-triton-rocm`` / ``triton-rocm`` from the PyTorch ROCm index, ``pytorch-triton`` (CUDA
nightlies), ``pytorch-triton-xpu``. Installing a library that depends on plain ``triton`` into a
ROCm environment puts the CUDA build beside the ROCm one; their files overwrite each other and
whichever was installed last wins. Which one that is can be read cheaply from the wheel RECORDs:
the owner's recorded hash of ``triton/__init__.py`` and sizes of ``triton/_C/*`` match the disk.

The active backend and target arch need Triton's runtime driver: that runs in the import-check
child (``triton.runtime.driver.active.get_current_target()``). Without import checks the backend
is inferred from the torch build and marked so.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from kernel_lock.fingerprint import normalize_gcn_arch

from .importcheck import ImportRequest
from .libraries import find_distribution, module_location, search_path

MODULE = "triton"

# distribution -> the backend that build targets
TRITON_DISTRIBUTIONS: dict[str, str] = {
    "triton": "cuda",
    "pytorch-triton": "cuda",
    "pytorch-triton-rocm": "hip",
    "triton-rocm": "hip",
    "pytorch-triton-xpu": "xpu",
    "triton-xpu": "xpu",
}

# torch's build -> the Triton backend that build needs
BACKEND_FOR_TORCH_BUILD = {"cuda": "cuda", "rocm": "hip", "xpu": "xpu"}


@dataclass(frozen=True)
class LocatedTriton:
    location: str | None  # the triton package directory `import triton` would load
    distributions: dict[str, str] = field(default_factory=dict)  # installed: name -> version
    owners: tuple[str, ...] = ()  # distributions whose RECORD matches the files on disk
    owner_evidence: str = ""

    @property
    def installed(self) -> bool:
        return self.location is not None


def _record_hash(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _matches_disk(dist: metadata.Distribution, package_dir: str) -> bool | None:
    """Do this distribution's recorded files match what is on disk? None when it records nothing usable."""
    root = os.path.dirname(package_dir)
    checked = 0
    for entry in dist.files or ():
        rel = str(entry).replace("\\", "/")
        probe_hash = rel == f"{MODULE}/__init__.py" and entry.hash is not None and entry.hash.mode == "sha256"
        probe_size = rel.startswith(f"{MODULE}/_C/") and entry.size is not None
        if not (probe_hash or probe_size):
            continue
        path = os.path.join(root, *rel.split("/"))
        try:
            if probe_size and os.path.getsize(path) != int(entry.size):
                return False
            if probe_hash and _record_hash(path) != entry.hash.value:
                return False
        except OSError:
            return False
        checked += 1
    return True if checked else None


def locate(extra_paths: Sequence[str] = ()) -> LocatedTriton:
    path = search_path(extra_paths)
    location = module_location(MODULE, extra_paths)
    found: dict[str, metadata.Distribution] = {}
    for name in TRITON_DISTRIBUTIONS:
        dist = find_distribution(name, path)
        if dist is not None:
            found[name] = dist
    versions = {name: str(dist.version) for name, dist in found.items()}
    if location is None or not os.path.isdir(location) or not found:
        return LocatedTriton(location, versions)
    verdicts = {name: _matches_disk(dist, location) for name, dist in found.items()}
    owners = tuple(name for name, ok in verdicts.items() if ok)
    if owners:
        evidence = "RECORD hash/size matches the files on disk"
    elif len(found) == 1:
        owners, evidence = tuple(found), "the only triton distribution installed (its RECORD could not confirm it)"
    else:
        evidence = "no installed distribution's RECORD matches the files on disk"
    return LocatedTriton(location, versions, owners, evidence)


def import_request(located: LocatedTriton) -> ImportRequest | None:
    return ImportRequest(MODULE, probe="triton-target") if located.installed else None


def _normalize_arch(backend: str, arch: str) -> str:
    if backend == "cuda" and arch.isdigit():
        return f"sm_{arch}"
    if backend == "hip":
        return normalize_gcn_arch(arch)
    return arch


def report(located: LocatedTriton, imported: Mapping[str, Any] | None, *, torch_build: str,
           device_arch: str) -> dict[str, Any]:
    """The JSON-ready triton section (keys documented in docs/env.md)."""
    provider = located.owners[0] if len(located.owners) == 1 else None
    built_for = {name: TRITON_DISTRIBUTIONS[name] for name in located.distributions}
    backends = sorted(set(built_for.values()))
    conflict = None
    if len(backends) > 1:
        listed = ", ".join(f"{n} (built for {b})" for n, b in built_for.items())
        conflict = (f"several Triton builds install the same 'triton' package: {listed}; the one installed last "
                    f"owns the files (now: {provider or 'unknown'})")
    wanted = BACKEND_FOR_TORCH_BUILD.get(torch_build)
    provider_backend = TRITON_DISTRIBUTIONS.get(provider) if provider else None
    matches_torch = None if (wanted is None or provider_backend is None) else provider_backend == wanted

    backend = arch = warp_size = None
    source = None
    target_error = None
    if imported is not None and imported.get("target"):
        target = imported["target"]
        backend = str(target.get("backend") or "") or None
        arch = _normalize_arch(backend or "", str(target.get("arch") or "")) or None
        warp_size = target.get("warp_size")
        source = "runtime"
    else:
        if imported is not None:
            target_error = imported.get("target_error")
        if located.installed and wanted is not None:
            backend, arch, source = wanted, device_arch or None, "torch build"
    status: dict[str, Any]
    if not located.installed:
        status = {"status": "not-installed", "reason": "module not found", "seconds": None}
    elif imported is None:
        status = {"status": "skipped", "reason": "import checks were not run", "seconds": None}
    else:
        status = {k: v for k, v in imported.items() if k not in ("target", "target_error")}
    return {
        "installed": located.installed,
        "location": located.location,
        "provider": provider,
        "provider_candidates": list(located.owners),
        "provider_evidence": located.owner_evidence or None,
        "version": located.distributions.get(provider) if provider else None,
        "distributions": {n: {"version": v, "built_for": built_for[n]} for n, v in located.distributions.items()},
        "conflict": conflict,
        "matches_torch_build": matches_torch,
        "backend": backend,
        "arch": arch,
        "warp_size": warp_size,
        "target_source": source,
        "target_error": target_error,
        "import": status,
    }
