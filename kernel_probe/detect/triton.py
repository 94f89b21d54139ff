"""Triton: which distribution provides the ``triton`` package, which backends it carries, and
whether it is the one torch was built with (from metadata and files; nothing is imported).

Several distributions install the same ``triton`` package (PyPI's ``triton`` carries both the CUDA
and the AMD backend from 3.x; ``pytorch-triton-rocm`` is what torch's ROCm wheel pins). A library
depending on plain ``triton`` puts a second one beside torch's: their files overwrite each other,
the last installed wins, and which one owns them is told by the wheel RECORDs. The active backend
and arch need Triton's runtime, asked in the import-check child only where a GPU may be (a GPU
device node, or torch sees a device): elsewhere it costs 1.5 s of CPU to end in "0 active drivers",
so the backend is inferred from torch's build, and the report says why (``target_not_asked``).
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
        if req.name.lower() in TRITON_DISTRIBUTIONS:
            pinned = [s.version for s in req.specifier if s.operator in ("==", "===")]
            if pinned:
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
    matches = None if wanted is None or provider_backends is None else wanted in provider_backends
    matches_pin, pin_problem = _pin_problem(located, provider)
    pin = located.torch_pin
    given = NOT_RUN if imported is None else imported
    status = {k: v for k, v in given.items() if k not in ("target", "target_error")}
    if not located.installed:
        status = {"status": "not-installed", "reason": "module not found", "seconds": None}
    no_target = imported is not None and not imported.get("target")
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
        "matches_torch_build": matches,
        "torch_requires": f"{pin[0]}=={pin[1]}" if pin else None,
        "matches_torch_pin": matches_pin,
        "torch_pin_problem": pin_problem,
        **_target(located, imported, wanted, device_arch),
        "target_not_asked": not_asked if no_target else None,
        "import": status,
    }
