"""Triton: which distribution provides the ``triton`` package, which backends it carries, and
whether it is the one torch was built with.

Several distributions install the same ``triton`` package: ``triton`` from PyPI,
``pytorch-triton-rocm`` / ``triton-rocm`` from the PyTorch ROCm index, ``pytorch-triton`` (CUDA
nightlies), ``pytorch-triton-xpu``. Which backends a distribution carries is read from its own
RECORD (``triton/backends/nvidia``, ``triton/backends/amd``): PyPI's ``triton`` 3.x ships both, so
it *does* target a ROCm GPU. The real risk is another one: installing a library that depends on
plain ``triton`` puts a second Triton beside the one torch was built with (its wheel pins it:
``pytorch-triton-rocm==3.1.0+...``); their files overwrite each other, whichever was installed last
wins, and its version may not be the one torch's compiler expects. Which distribution owns the files
is read from the wheel RECORDs: the owner's recorded hash of ``triton/__init__.py`` and sizes of
``triton/_C/*`` match the disk.

The active backend and target arch need Triton's runtime driver: that runs in the import-check child
(``triton.runtime.driver.active.get_current_target()``). Without import checks the backend is
inferred from the torch build and marked so. Asking the driver imports torch and looks for every GPU
runtime (1.5 s of CPU on a 2-core node, only to end in "0 active drivers" where there is no GPU): on
a node with no GPU device node at all (``GPU_DEVICE_NODES``) and torch seeing only the CPU, it is
not asked, the report says why (``target_not_asked``), and the backend is inferred as without import
checks. Where either shows a device, it is asked.
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
from kernel_probe.detect.importcheck import ImportRequest
from kernel_probe.detect.libraries import find_distribution, module_location, search_path

MODULE = "triton"

# distribution -> the backend its builds target when its RECORD lists no triton/backends/ (Triton
# 2.x)
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

# triton/backends/<directory> -> the backend name Triton's runtime reports
BACKEND_DIRECTORIES = {"nvidia": "cuda", "amd": "hip", "intel": "xpu"}


# the device nodes a GPU driver creates (NVIDIA, AMD's KFD, a DRM render node: Intel and AMD GPUs):
# without any of them no Triton backend can find a device
GPU_DEVICE_NODES = ("dev/nvidia*", "dev/kfd", "dev/dri/renderD*")
NO_GPU = "no GPU device on this node"


def gpu_device_nodes(root: str | os.PathLike[str] = "/") -> list[str]:
    """The GPU device nodes under ``root`` (``GPU_DEVICE_NODES``; tests pass a folder of fakes)."""
    return sorted(
        p for pattern in GPU_DEVICE_NODES for p in glob.glob(os.path.join(os.fspath(root), pattern))
    )


def target_not_asked(device_nodes: Sequence[str], device_type: str) -> str | None:
    """Why Triton's runtime is not asked for a target (None: ask it): no GPU device node and torch
    sees only the CPU (``device_type``: the primary device's type, as the lock fingerprint sees
    it)."""
    if device_nodes or device_type != "cpu":
        return None
    patterns = ", ".join("/" + p for p in GPU_DEVICE_NODES)
    return f"{NO_GPU} (none of {patterns}, and torch sees only the CPU)"


def backends_of(dist: metadata.Distribution, name: str) -> list[str]:
    """The backends a Triton distribution carries, from its RECORD
    (``triton/backends/<dir>/...``)."""
    found = set()
    for entry in dist.files or ():
        parts = str(entry).replace("\\", "/").split("/")
        if (
            len(parts) > 3
            and parts[0] == MODULE
            and parts[1] == "backends"
            and parts[2] in BACKEND_DIRECTORIES
        ):
            found.add(BACKEND_DIRECTORIES[parts[2]])
    return sorted(found) or [TRITON_DISTRIBUTIONS[name]]


def torch_pin(path: Sequence[str] = ()) -> tuple[str, str] | None:
    """(distribution, version) of the Triton torch's wheel pins (``Requires-Dist:
    pytorch-triton-rocm==3.1.0+...``)."""
    from packaging.requirements import InvalidRequirement, Requirement

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
    # installed: name -> backends it carries
    backends: dict[str, list[str]] = field(default_factory=dict)
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
    """Do this distribution's recorded files match what is on disk? None when it records nothing
    usable."""
    root = os.path.dirname(package_dir)
    checked = 0
    for entry in dist.files or ():
        rel = str(entry).replace("\\", "/")
        probe_hash = (
            rel == f"{MODULE}/__init__.py"
            and entry.hash is not None
            and entry.hash.mode == "sha256"
        )
        probe_size = rel.startswith(f"{MODULE}/_C/") and entry.size is not None
        if not (probe_hash or probe_size):
            continue
        path = os.path.join(root, *rel.split("/"))
        try:
            if probe_size and entry.size is not None and os.path.getsize(path) != int(entry.size):
                return False
            if probe_hash and entry.hash is not None and _record_hash(path) != entry.hash.value:
                return False
        except OSError:
            return False
        checked += 1
    return True if checked else None


def locate(extra_paths: Sequence[str] = ()) -> LocatedTriton:
    """Where Triton is installed, its distributions' versions and backends, without importing it."""
    path = search_path(extra_paths)
    location = module_location(MODULE, extra_paths)
    found: dict[str, metadata.Distribution] = {}
    for name in TRITON_DISTRIBUTIONS:
        dist = find_distribution(name, path)
        if dist is not None:
            found[name] = dist
    versions = {name: str(dist.version) for name, dist in found.items()}
    backends = {name: backends_of(dist, name) for name, dist in found.items()}
    pin = torch_pin(extra_paths)
    if location is None or not os.path.isdir(location) or not found:
        return LocatedTriton(location, versions, backends=backends, torch_pin=pin)
    verdicts = {name: _matches_disk(dist, location) for name, dist in found.items()}
    owners = tuple(name for name, ok in verdicts.items() if ok)
    if owners:
        evidence = "RECORD hash/size matches the files on disk"
    elif len(found) == 1:
        owners, evidence = (
            tuple(found),
            "the only triton distribution installed (its RECORD could not confirm it)",
        )
    else:
        evidence = "no installed distribution's RECORD matches the files on disk"
    return LocatedTriton(location, versions, owners, evidence, backends, pin)


def import_request(location: str | None, *, target: bool = True) -> ImportRequest | None:
    """The import check of Triton at ``location`` (None: not installed, no check); ``target``: the
    child also asks Triton's runtime for its target."""
    if location is None:
        return None
    return ImportRequest(MODULE, probe="triton-target" if target else "")


def _normalize_arch(backend: str, arch: str) -> str:
    if backend == "cuda" and arch.isdigit():
        return f"sm_{arch}"
    if backend == "hip":
        return normalize_gcn_arch(arch)
    return arch


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
        name: located.backends.get(name) or [TRITON_DISTRIBUTIONS[name]]
        for name in located.distributions
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
    matches_torch = (
        None if (wanted is None or provider_backends is None) else wanted in provider_backends
    )
    pin = located.torch_pin
    version_matches = None
    pin_problem = None
    if pin is not None and provider is not None:
        pinned_dist, pinned_version = pin
        have = located.distributions.get(provider, "")
        version_matches = provider == pinned_dist and have == pinned_version
        if not version_matches:
            pin_problem = (
                f"torch was built with {pinned_dist}=={pinned_version}, but the 'triton' package "
                f"in use comes from {provider} {have}: Triton kernels (liger, torch.compile) may "
                "fail to compile or behave differently; reinstall "
                f"{pinned_dist}=={pinned_version} last"
            )

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
        "distributions": {
            n: {"version": v, "built_for": built_for[n]} for n, v in located.distributions.items()
        },
        "conflict": conflict,
        "matches_torch_build": matches_torch,
        "torch_requires": f"{pin[0]}=={pin[1]}" if pin else None,
        "matches_torch_pin": version_matches,
        "torch_pin_problem": pin_problem,
        "backend": backend,
        "arch": arch,
        "warp_size": warp_size,
        "target_source": source,
        "target_error": target_error,
        "target_not_asked": not_asked
        if imported is not None and not imported.get("target")
        else None,
        "import": status,
    }
