"""Triton: which distribution provides the ``triton`` package, which backends it carries, and
whether it is the one torch was built with (from metadata and files; nothing is imported).

Several distributions install the same ``triton`` package (PyPI's ``triton`` carries both the CUDA
and the AMD backend from 3.x; ``pytorch-triton-rocm`` is what torch's ROCm wheel pins): the last
installed wins, the wheel RECORDs tell which owns the files. The active target needs Triton's
runtime, asked in the import-check child only where a GPU may be; elsewhere it costs 1.5 s to end
in "0 active drivers", so the backend is inferred from torch's build (``target_not_asked``).
"""

from __future__ import annotations

import base64
import glob
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from kernel_lock.host import normalize_gcn_arch
from kernel_probe.detect.libraries import NOT_RUN, installed, module_location, search_path
from kernel_probe.isolation.protocol import ImportCheckRequest

MODULE = "triton"
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


def gpu_device_nodes(root: str | os.PathLike[str] = "/") -> list[str]:
    """The GPU device nodes under ``root`` (tests pass a folder of fakes)."""
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
        if len(parts) > 3 and parts[:2] == [MODULE, "backends"] and parts[2] in BACKEND_DIRECTORIES:
            found.add(BACKEND_DIRECTORIES[parts[2]])
    return sorted(found) or [TRITON_DISTRIBUTIONS[name]]


def torch_pin(path: Sequence[str] = ()) -> tuple[str, str] | None:
    """(distribution, version) of the Triton torch's wheel pins (``Requires-Dist:
    pytorch-triton-rocm==3.1.0+...``)."""
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
    """Whether the recorded ``__init__.py`` hash and ``_C/*`` sizes match the disk (None: none)."""
    checked = 0
    for entry in dist.files or ():
        rel = str(entry).replace("\\", "/")
        hashed = rel == f"{MODULE}/__init__.py" and getattr(entry.hash, "mode", "") == "sha256"
        sized = rel.startswith(f"{MODULE}/_C/") and entry.size is not None
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


def locate(extra_paths: Sequence[str] = ()) -> LocatedTriton:
    """Where Triton is installed, its distributions' versions and backends (no import)."""
    location = module_location(MODULE, extra_paths)
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


def import_request(location: str | None, *, target: bool = True) -> ImportCheckRequest | None:
    """The import check of Triton at ``location`` (None: not installed, no check); ``target``: the
    child also asks Triton's runtime for its target."""
    if location is None:
        return None
    return ImportCheckRequest(module=MODULE, probe="triton-target" if target else "")


def report(
    located: LocatedTriton,
    imported: Mapping[str, Any] | None,
    *,
    torch_build: str,
    device_arch: str,
    not_asked: str | None = None,
) -> dict[str, Any]:
    """The JSON-ready triton section (keys documented in docs/env.md); ``not_asked``: why the import
    check did not ask the runtime for a target (``target_not_asked``)."""
    dists = located.distributions
    provider = located.owners[0] if len(located.owners) == 1 else None
    built_for = {n: located.backends.get(n) or [TRITON_DISTRIBUTIONS[n]] for n in dists}
    conflict = None
    if len(dists) > 1:
        listed = ", ".join(
            f"{n} {dists[n]} (backends: {', '.join(b)})" for n, b in built_for.items()
        )
        conflict = (
            f"several distributions install the same 'triton' package: {listed}; the one "
            f"installed last owns the files (now: {provider or 'unknown'})"
        )
    wanted = BACKEND_FOR_TORCH_BUILD.get(torch_build)
    provider_backends = built_for.get(provider) if provider else None
    pin, matches_pin, pin_problem = located.torch_pin, None, None
    if pin is not None and provider is not None:
        matches_pin = provider == pin[0] and dists.get(provider, "") == pin[1]
        if not matches_pin:
            pin_problem = (
                f"torch was built with {pin[0]}=={pin[1]}, but the 'triton' package in use comes "
                f"from {provider} {dists.get(provider, '')}: Triton kernels (liger, "
                f"torch.compile) may fail to compile or behave differently; reinstall "
                f"{pin[0]}=={pin[1]} last"
            )
    status = {k: v for k, v in (imported or NOT_RUN).items() if k not in ("target", "target_error")}
    if not located.installed:
        status = {"status": "not-installed", "reason": "module not found", "seconds": None}
    # the active backend, arch and warp size: Triton's runtime's, else inferred from torch's build
    target = (imported or {}).get("target")
    found: dict[str, Any] = dict(backend=None, arch=None, warp_size=None, target_source=None)
    if target:
        backend = str(target.get("backend") or "")
        raw = str(target.get("arch") or "")
        raw = f"sm_{raw}" if backend == "cuda" and raw.isdigit() else raw
        raw = normalize_gcn_arch(raw) if backend == "hip" else raw
        found.update(backend=backend or None, arch=raw or None, warp_size=target.get("warp_size"))
        found["target_source"] = "runtime"
    elif located.installed and wanted is not None:
        found.update(backend=wanted, arch=device_arch or None, target_source="torch build")
    found["target_error"] = imported.get("target_error") if imported and not target else None
    return {
        "installed": located.installed,
        "location": located.location,
        "provider": provider,
        "provider_candidates": list(located.owners),
        "provider_evidence": located.owner_evidence or None,
        "version": dists.get(provider) if provider else None,
        "distributions": {n: {"version": v, "built_for": built_for[n]} for n, v in dists.items()},
        "conflict": conflict,
        "matches_torch_build": (
            None if wanted is None or provider_backends is None else wanted in provider_backends
        ),
        "torch_requires": f"{pin[0]}=={pin[1]}" if pin else None,
        "matches_torch_pin": matches_pin,
        "torch_pin_problem": pin_problem,
        **found,
        "target_not_asked": not_asked if imported is not None and not target else None,
        "import": status,
    }
