"""This machine's fingerprint read without importing torch (its ``version.py``, the drivers'
/proc and /sys files, NVML). A field not read with certainty is None, named in
``Notes.fallbacks``, and the caller asks torch: it never guesses."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import fingerprint as fp
from . import host
from .fingerprint import DEVICE_FIELDS, DEVICE_KEYS, FIELDS, TorchBuild, Unsettled, release

__all__ = [
    "USE_IMPORTED_TORCH",
    "Notes",
    "current",
    "device",
    "device_here",
    "fingerprint",
    "for_check",
    "gfx_name",
]

log = logging.getLogger(__name__)

# asking an imported torch costs nothing and is what a lock was written from (tests turn it off)
USE_IMPORTED_TORCH = True


def for_check(checked: Iterable[str] | None = None) -> dict[str, Any]:
    """The fingerprint a check compares: an imported torch's, else :func:`current`."""
    if USE_IMPORTED_TORCH and "torch" in sys.modules:
        return fp.current()
    return current(checked)


def device_here() -> dict[str, Any]:
    """``fingerprint.device_facts`` of this machine, by the rule of :func:`for_check`."""
    if not (USE_IMPORTED_TORCH and "torch" in sys.modules):
        facts = device()
        if facts is not None:
            return facts
    return fp.device_facts(fp.import_torch())


# ---- the devices, from the drivers' files ------------------------------------------------------

# Compute capability by the driver's device name, sourced from developer.nvidia.com/cuda-gpus;
# older drivers drop the "NVIDIA " prefix. Adding a GPU is adding a line.
NVIDIA_ARCH_BY_NAME: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(NVIDIA )?A100\b"), "sm_80"),
    (re.compile(r"^(NVIDIA )?H100\b"), "sm_90"),
    (re.compile(r"^(NVIDIA )?H200\b"), "sm_90"),
    (re.compile(r"^(NVIDIA )?GH200\b"), "sm_90"),
)

# The oldest driver each CUDA major runs on (NVIDIA's "CUDA Compatibility" guide, table 1):
# below it torch.cuda.is_available() is False; an unlisted major is not guessed.
MIN_DRIVER_FOR_CUDA: dict[int, tuple[int, ...]] = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}


@dataclass(frozen=True)
class Notes:
    """What the torch-free read could not settle (``fallbacks``) and each fact's ``sources``."""

    fallbacks: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether every field was read without torch."""
        return not self.fallbacks

    def blocking(self, checked: Iterable[str]) -> dict[str, str]:
        """The fallbacks among ``checked`` (e.g. the lock's fields not matched by ``ignore``)."""
        wanted = set(checked)
        return {name: why for name, why in self.fallbacks.items() if name in wanted}

    def lines(self) -> list[str]:
        """One line per source and per fallback, for ``--debug``."""
        out = [f"{name}: read from {where}" for name, where in self.sources.items()]
        return out + [f"{name}: needs torch ({why})" for name, why in self.fallbacks.items()]


def _read(path: Path, limit: int = 65536) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read(limit)


def _facts(*values: Any) -> dict[str, Any]:
    """Device facts keyed like ``fingerprint.device_facts``'s (``DEVICE_KEYS``)."""
    return dict(zip(DEVICE_KEYS, values, strict=True))


def _cpu_device() -> dict[str, Any]:
    """The CPU as ``fingerprint.device_facts`` gives it on a CPU-only torch."""
    return _facts("cpu", host.cpu_vendor(), host.cpu_name(), "", "", 1, "")


def _nvidia_proc_gpus(root: Path) -> list[dict[str, str]]:
    """One dict per ``/proc/driver/nvidia/gpus/<bus>/information``, in bus order."""
    gpus = []
    for entry in sorted((root / "proc/driver/nvidia/gpus").iterdir(), key=lambda p: p.name.lower()):
        info = {"bus": entry.name}
        for line in _read(entry / "information").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                info[key.strip()] = value.strip()
        gpus.append(info)
    return gpus


def _mig_instances(root: Path) -> bool:
    """Whether any GPU has MIG instances: CUDA then names and counts MIG devices."""
    caps = root / "proc/driver/nvidia/capabilities"
    try:
        return any(
            gi.name.startswith("gi") for gpu in caps.glob("gpu*") for gi in (gpu / "mig").iterdir()
        )
    except OSError:
        return False


def _libcuda_findable(root: Path, env: Mapping[str, str]) -> bool:
    """Whether the dynamic loader finds libcuda.so.1 (a container may see /proc only)."""
    for folder in filter(None, env.get("LD_LIBRARY_PATH", "").split(":")):
        if (Path(folder) / "libcuda.so.1").exists():
            return True
    try:
        with open(root / "etc/ld.so.cache", "rb") as fh:
            return b"libcuda.so.1\x00" in fh.read()
    except OSError:
        return False


def _nvidia_from_proc(
    build: TorchBuild, env: Mapping[str, str], root: Path
) -> tuple[dict[str, Any], dict[str, str]]:
    unsure = tuple(name for name in DEVICE_FIELDS if name != "device-features")
    if not (root / "proc/driver/nvidia/gpus").is_dir():
        raise Unsettled(
            unsure,
            f"torch is built for CUDA {build.cuda} but {root / 'proc/driver/nvidia'} lists no "
            "GPU (the driver may load on first use, or this is WSL): only torch can tell",
        )
    driver = host.driver_version("cuda", root)
    major = release(build.cuda)[:1]
    need = MIN_DRIVER_FOR_CUDA.get(major[0]) if major else None
    if need is None or not driver or release(driver) < need:
        raise Unsettled(
            unsure,
            f"driver {driver or '(unreadable)'} against torch's CUDA {build.cuda}: whether "
            "torch can use the GPU is not certain",
        )
    if not (root / "dev/nvidiactl").exists() or not _libcuda_findable(root, env):
        raise Unsettled(
            unsure,
            "the driver is loaded but /dev/nvidiactl or libcuda.so.1 is not reachable here "
            "(a container without the GPU?)",
        )
    if "CUDA_VISIBLE_DEVICES" not in env:
        # /proc lists every GPU of the node; a device cgroup may hide some from CUDA
        raise Unsettled(
            unsure,
            "CUDA_VISIBLE_DEVICES is unset and NVML is not available: a device cgroup may hide "
            "GPUs that /proc lists",
        )
    if _mig_instances(root):
        raise Unsettled(unsure, "MIG instances exist: CUDA names and counts MIG devices, not GPUs")
    try:
        gpus = [g for g in _nvidia_proc_gpus(root) if g.get("GPU Excluded", "No") != "Yes"]
    except OSError as exc:
        raise Unsettled(unsure, f"the driver's GPU list cannot be read: {exc}") from None
    uuids = [g.get("GPU UUID", "") for g in gpus]
    order = host.visible_nvml_indices(env.get("CUDA_VISIBLE_DEVICES"), uuids)
    if order is None:
        raise Unsettled(
            unsure,
            "CUDA_VISIBLE_DEVICES names MIG devices, or is read differently by CUDA and torch's "
            "parser (ordinals and UUIDs mixed, a lone sign, -0)",
        )
    if not order:
        return _cpu_device(), {}  # CUDA sees no device: torch reports the CPU
    device = _facts("cuda", "nvidia", None, None, "", len(order), driver)
    models = {g.get("Model", "") for g in gpus}
    if len(models) != 1:
        why = (
            f"the GPUs differ ({sorted(models)}): which one CUDA calls device 0 depends on "
            "its device order"
        )
        return device, {"device-name": why, "device-arch": why}
    name = models.pop()
    arch = next((sm for pattern, sm in NVIDIA_ARCH_BY_NAME if pattern.search(name)), None)
    if arch is None:
        why = (
            f"{name!r} is not in the table of sourced GPU names (NVIDIA_ARCH_BY_NAME): its arch, "
            "and whether CUDA names it the same, are not known"
        )
        return device, {"device-name": why, "device-arch": why}
    return {**device, "name": name, "arch": arch}, {}


def _nvidia(
    build: TorchBuild, env: Mapping[str, str], root: Path, sources: dict[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    same_env = env is os.environ or env.get("CUDA_VISIBLE_DEVICES") == os.environ.get(
        "CUDA_VISIBLE_DEVICES"
    )
    if root == Path("/") and same_env:
        first = host.nvml_primary()  # exactly what fingerprint.current() takes on a CUDA build
        if first is not None:
            sources["device"] = "NVML"
            return {"type": "cuda", "vendor": "nvidia", "features": "", **first}, {}
    sources["device"] = str(root / "proc/driver/nvidia")
    return _nvidia_from_proc(build, env, root)


def gfx_name(target_version: int) -> str:
    """KFD's ``gfx_target_version`` as an LLVM target: 90010 -> gfx90a, 90402 -> gfx942."""
    major, rest = divmod(target_version, 10000)
    minor, stepping = divmod(rest, 100)
    if major <= 0 or minor > 9 or stepping > 15:
        raise ValueError(
            f"gfx_target_version {target_version} is not major*10000 + minor*100 + stepping"
        )
    return f"gfx{major}{minor}{stepping:x}"


def _properties(path: Path) -> dict[str, int]:
    out = {}
    for line in _read(path).splitlines():
        key, _, value = line.strip().partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value.strip())
    return out


def _kfd_gpus(root: Path) -> list[dict[str, int]]:
    """The GPU nodes of the KFD topology in node order (HIP's); CPU nodes have no SIMDs."""
    base = root / "sys/class/kfd/kfd/topology/nodes"
    gpus = []
    for node in sorted((p for p in base.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        try:
            props = _properties(node / "properties")
        except PermissionError:
            # a node this process's device cgroup may not use
            raise Unsettled(
                DEVICE_FIELDS, f"{node / 'properties'} is not readable (device cgroup)"
            ) from None
        except OSError as exc:
            raise Unsettled(DEVICE_FIELDS, f"the KFD topology cannot be read: {exc}") from None
        if props.get("simd_count", 0) > 0:
            gpus.append(props)
    return gpus


def _amd(
    build: TorchBuild, env: Mapping[str, str], root: Path, sources: dict[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    sources["device"] = str(root / "sys/class/kfd/kfd/topology")
    host.physical_devices("rocm", env)  # raises on contradictory variables, as device_facts does
    if not (root / "sys/class/kfd/kfd/topology/nodes").is_dir():
        if (root / "dev/kfd").exists():
            raise Unsettled(DEVICE_FIELDS, "/dev/kfd exists but the KFD topology cannot be read")
        return _cpu_device(), {}  # no amdgpu compute driver: torch reports the CPU
    gpus = _kfd_gpus(root)
    if not gpus:
        return _cpu_device(), {}
    if not (root / "dev/kfd").exists():
        raise Unsettled(
            DEVICE_FIELDS,
            "the node has AMD GPUs but /dev/kfd is not here (a container without them?)",
        )
    visible = host.rocm_visible_indices(env, len(gpus))
    if visible is None:
        raise Unsettled(
            DEVICE_FIELDS,
            "the visibility variables are not lists of distinct GPU node indices in range (UUIDs, "
            "repeats, signs, spaces and invalid items are left to HIP): only torch can tell which "
            "GPUs it sees",
        )
    driver = host.driver_version("rocm", root)
    device = _facts("rocm", "amd", None, None, None, len(visible), driver)
    unsure = {
        "device-name": "the marketing name comes from the amdgpu.ids table the runtime loads "
        f"(PCI device id 0x{gpus[visible[0]].get('device_id', 0):04x}), not from the KFD",
        "device-features": "sramecc/xnack come from the runtime (ECC mode, HSA_XNACK, "
        "amdgpu.noretry)",
    }
    targets = {gpus[i].get("gfx_target_version", 0) for i in visible}
    if len(targets) != 1:
        unsure["device-arch"] = f"the visible GPUs differ (gfx_target_version {sorted(targets)})"
    elif "HSA_OVERRIDE_GFX_VERSION" in env:
        unsure["device-arch"] = (
            "HSA_OVERRIDE_GFX_VERSION is set: the runtime reports that target instead"
        )
    else:
        try:
            device["arch"] = gfx_name(targets.pop())
        except ValueError as exc:
            unsure["device-arch"] = str(exc)
    return device, unsure


def _device(
    build: TorchBuild, env: Mapping[str, str], root: Path, sources: dict[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The device facts ``device_facts`` would give, and those only torch can settle."""
    if not sys.platform.startswith("linux"):
        raise Unsettled(
            DEVICE_FIELDS,
            f"{sys.platform}: MPS, CUDA or XPU availability is only known to torch here",
        )
    if build.hip:
        return _amd(build, env, root, sources)
    if build.cuda:
        return _nvidia(build, env, root, sources)
    if build.xpu:
        raise Unsettled(
            DEVICE_FIELDS,
            f"torch is built for XPU ({build.xpu}): whether it sees an Intel GPU is torch's to say",
        )
    sources["device"] = "a CPU-only torch on Linux: the CPU (/proc/cpuinfo and archspec)"
    return _cpu_device(), {}


# ---- the whole read ------------------------------------------------------------------------------


def fingerprint(
    env: Mapping[str, str] | None = None,
    root: str | os.PathLike[str] = "/",
    *,
    version_file: Path | None = None,
) -> tuple[dict[str, Any], Notes]:
    """Every field of ``fingerprint.FIELDS`` read without torch, and the :class:`Notes`
    (``root``: where /proc, /sys and /dev are). Raises where ``fingerprint.current()`` does."""
    env = os.environ if env is None else env
    fallbacks: dict[str, str] = {}
    sources: dict[str, str] = {
        "python, os, arch, cpu-microarch": "this interpreter and archspec",
        "numerics-env": "the environment",
    }
    build: TorchBuild | None = None
    device: dict[str, Any] = {}
    try:
        build = fp.torch_build(version_file)
        sources["torch, torch-cuda, torch-hip, torch-rocm"] = build.path
        disagreement = None if version_file is not None else fp.metadata_agrees(build)
        if disagreement:
            fallbacks["torch"] = disagreement
        if not build.version:
            fallbacks["torch"] = f"{build.path} has no __version__ string"
        device, unsure = _device(build, env, Path(root), sources)
        for name, why in unsure.items():
            fallbacks.setdefault(name, why)
    except Unsettled as exc:
        for name in exc.fields:
            fallbacks.setdefault(name, exc.why)
    versions = (build.version, build.cuda, build.hip, build.rocm) if build else None
    fields = fp.fields_of(versions, device, env)
    for name in FIELDS:
        if name in fallbacks or name not in fields:
            fields[name] = None
            fallbacks.setdefault(name, "not read (see the other fallbacks)")
    return {name: fields[name] for name in FIELDS}, Notes(fallbacks, sources)


def current(checked: Iterable[str] | None = None) -> dict[str, Any]:
    """The fingerprint for a check: torch-free when every field in ``checked`` was read with
    certainty, else ``fingerprint.current()``; fallbacks logged at DEBUG."""
    fields, notes = fingerprint()
    blocking = dict(notes.fallbacks) if checked is None else notes.blocking(checked)
    for line in notes.lines():
        log.debug("torch-free fingerprint: %s", line)
    if not blocking:
        return fields
    log.debug(
        "torch-free fingerprint incomplete (%s): reading it with torch", ", ".join(sorted(blocking))
    )
    return fp.current()


def device() -> dict[str, Any] | None:
    """This machine's device facts torch-free, or None when any needs torch (logged)."""
    fields, notes = fingerprint()
    missing = notes.blocking(DEVICE_FIELDS)
    for name, why in missing.items():
        log.debug("torch-free device facts: %s needs torch (%s)", name, why)
    return None if missing else _facts(*(fields[name] for name in DEVICE_FIELDS))
