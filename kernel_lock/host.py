"""Facts of this host read without torch: the CPU, the GPU driver's version, ROCm arch
names, the visible devices, NVIDIA's devices through NVML. An uncertain reading is None."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .errors import DeviceVisibilityError

T = TypeVar("T")

__all__ = [
    "DRIVER_FILES",
    "archspec_host",
    "cpu_microarch",
    "cpu_name",
    "cpu_vendor",
    "driver_version",
    "fields",
    "gcn_features",
    "normalize_gcn_arch",
    "nvml_compute_pids",
    "nvml_devices",
    "nvml_primary",
    "physical_devices",
    "rocm_visible_indices",
    "visible_nvml_indices",
]


def archspec_host() -> Any | None:
    """archspec's ``Microarchitecture`` for this CPU, or None when archspec fails."""
    try:
        import archspec.cpu

        return archspec.cpu.host()
    except Exception:  # not installed, or no entry for this CPU: a fact, not an error
        return None


def cpu_microarch() -> str:
    """archspec's name for this CPU (zen3, neoverse_v2), or 'unknown'."""
    host = archspec_host()
    return "unknown" if host is None else str(host.name)


def normalize_gcn_arch(name: str) -> str:
    """'gfx90a:sramecc+:xnack-' -> 'gfx90a' (ROCm appends target features after colons)."""
    return name.split(":", 1)[0].strip()


def gcn_features(name: str) -> str:
    """'gfx90a:sramecc+:xnack-' -> 'sramecc+:xnack-' (the target features: other code objects)."""
    return name.partition(":")[2].strip()


# Where the kernel driver states its version: one small file read, no library, no device context.
DRIVER_FILES = {
    "cuda": (
        "/proc/driver/nvidia/version",
        re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]*)"),
    ),
    "rocm": ("/sys/module/amdgpu/version", re.compile(r"([0-9][0-9.]*)")),
}


def driver_version(device_type: str, root: str | os.PathLike[str] = "/") -> str:
    """The GPU kernel driver's version from its /proc or /sys file (under ``root``); '' if none."""
    if device_type not in DRIVER_FILES:
        return ""
    path, pattern = DRIVER_FILES[device_type]
    try:
        with open(os.path.join(root, path.lstrip("/")), encoding="utf-8", errors="replace") as fh:
            match = pattern.search(fh.read(4096))
    except OSError:
        return ""
    return match.group(1) if match else ""


_CPU_VENDORS = {
    "authenticamd": "amd",
    "genuineintel": "intel",
    "arm": "arm",
    "0x41": "arm",
    "0x4e": "nvidia",
}


def _cpuinfo(matches: Any) -> str | None:
    """The value of the first /proc/cpuinfo line ``matches`` (given the line), or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if matches(line)), None)
    except OSError:
        return None


def cpu_vendor() -> str:
    """archspec's vendor, or /proc/cpuinfo's vendor_id when archspec only knows a generic level."""
    host = archspec_host()
    vendor = "" if host is None else str(host.vendor).lower()
    if vendor and vendor != "generic":
        return _CPU_VENDORS.get(vendor, vendor)
    keys = ("vendor_id", "cpu implementer")
    raw = _cpuinfo(lambda line: line.split(":", 1)[0].strip().lower() in keys)
    if raw is not None:
        return _CPU_VENDORS.get(raw.lower(), raw.lower())
    return vendor or "unknown"


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` says."""
    name = _cpuinfo(lambda line: line.lower().startswith(("model name", "cpu model", "hardware")))
    return name if name is not None else platform.processor() or platform.machine() or "unknown"


def fields() -> dict[str, Any]:
    """The fingerprint's fields of this interpreter and CPU: python, os, arch, cpu-microarch."""
    return {
        "python": platform.python_version(),
        "os": sys.platform,
        "arch": platform.machine().lower(),
        "cpu-microarch": cpu_microarch(),
    }


# ---- the visible devices: CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES --------
def _entries(value: str) -> list[str]:
    return [entry.strip() for entry in value.split(",")]


def physical_devices(device_type: str, env: Mapping[str, str] | None = None) -> list[str] | None:
    """The node-level id of each device this process sees, in torch's order (``'?'``:
    not mapped); None when unrestricted. On ROCm the HIP list indexes ROCR's; a longer HIP list
    raises ``DeviceVisibilityError``, as torch refuses it."""
    env = os.environ if env is None else env
    if device_type == "rocm":
        rocr = env.get("ROCR_VISIBLE_DEVICES")
        hip_name = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in env else "CUDA_VISIBLE_DEVICES"
        hip = env.get(hip_name)
        if rocr is None:
            return None if hip is None else _entries(hip)
        base = _entries(rocr)
        if hip is None:
            return base
        chosen = _entries(hip)
        if len(chosen) > len(base) and hip_name == "HIP_VISIBLE_DEVICES":
            raise DeviceVisibilityError(
                f"{hip_name}={hip!r} names {len(chosen)} device(s) but "
                f"ROCR_VISIBLE_DEVICES={rocr!r} leaves only {len(base)}: the HIP list indexes "
                "into the ROCR list, so which GPU this process uses is undefined (torch refuses "
                "to count devices)",
                key=hip_name,
                fix=f"set one of them: unset {hip_name} (ROCR_VISIBLE_DEVICES alone selects "
                "node devices), or "
                f"give {hip_name} indices 0..{len(base) - 1} into ROCR_VISIBLE_DEVICES's list",
            )
        return [base[int(e)] if e.isdigit() and int(e) < len(base) else "?" for e in chosen]
    if device_type == "cuda":
        visible = env.get("CUDA_VISIBLE_DEVICES")
        return None if visible is None else _entries(visible)
    return None


_PLAIN_INDEX = re.compile(r"[0-9]+", re.ASCII)


def _indices(value: str, limit: int) -> list[int] | None:
    """Distinct plain indices below ``limit``, else None."""
    items = value.split(",")
    if not all(_PLAIN_INDEX.fullmatch(i) for i in items):
        return None
    out = [int(i) for i in items]
    return out if len(set(out)) == len(out) and all(i < limit for i in out) else None


def rocm_visible_indices(env: Mapping[str, str], count: int) -> list[int] | None:
    """KFD node indices of the GPUs HIP will see, in HIP's order; None where
    not certain (only distinct in-range plain indices are read; CUDA_VISIBLE_DEVICES beside
    ROCR_VISIBLE_DEVICES too: HIP honours it, torch does not)."""
    physical_devices("rocm", env)  # raises DeviceVisibilityError on a HIP list longer than ROCR's
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    hip = env.get("HIP_VISIBLE_DEVICES")
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if rocr is not None and hip is None and cuda is not None:
        return None
    base = list(range(count)) if rocr is None else _indices(rocr, count)
    chosen = hip if hip is not None else cuda
    if base is None or chosen is None:
        return base
    picked = _indices(chosen, len(base))
    return None if picked is None else [base[i] for i in picked]


_ORDINAL = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _ordinal(item: str) -> int | None:
    """One CUDA_VISIBLE_DEVICES item as CUDA reads it (strtoul-like; -1 ends the list);
    None where uncertain (a lone sign, ``-0``)."""
    m = _ORDINAL.match(item)
    if m is None:
        return None if item[:1] in ("+", "-") else -1
    text = m.group(0)
    if text.startswith("-"):
        return -1 if text.strip("-0") else None
    return int(text)


def cuda_visible_entries(visible: str) -> list[int] | list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA parses it (checked against torch's parser):
    ordinals or UUIDs up to the first invalid item; a repeat: no device; None where uncertain."""
    for prefix in ("GPU-", "MIG-"):
        if visible.startswith(prefix):
            uuids: list[str] = []
            for item in visible.split(","):
                if item in uuids:
                    return []
                if not item.startswith(prefix):
                    if item.strip()[:1].isdigit() or item.startswith(("GPU-", "MIG-")):
                        return None  # ordinals or the other UUID kind after UUIDs: not certain
                    break
                uuids.append(item)
            return uuids
    ordinals: list[int] = []
    for item in visible.split(","):
        if item.strip().startswith(("GPU-", "MIG-")):
            return None  # a UUID after ordinals: CUDA's reading is not certain
        x = _ordinal(item.strip())
        if x is None:
            return None
        if x in ordinals:
            return []
        if x < 0:
            break
        ordinals.append(x)
    return ordinals


def visible_nvml_indices(visible: str | None, uuids: list[str]) -> list[int] | None:
    """NVML indices of the devices CUDA will see, in CUDA's order; None where uncertain."""
    if visible is None:
        return list(range(len(uuids)))
    entries = cuda_visible_entries(visible)
    if entries is None or (
        entries and isinstance(entries[0], str) and entries[0].startswith("MIG-")
    ):
        return None
    out: list[int] = []
    for entry in entries:
        if isinstance(entry, int):
            if entry >= len(uuids):
                break
            index = entry
        else:
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
            if index in out:
                return []
        out.append(index)
    return out


# ---- NVIDIA's devices through NVML: an optional shortcut, never a reason to fail -----------------
def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml(body: Callable[[Any, list[Any], list[int], list[str]], T]) -> T | None:
    """``body(pynvml, handles, order, uuids)`` inside an NVML session (``order``: the NVML indices
    of the CUDA-visible devices, in CUDA order); None when NVML or the body fails."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # not installed, a broken shim, no driver library, no permission, ...
        return None
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        order = visible_nvml_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids)
        return body(pynvml, handles, order, uuids) if order else None
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def nvml_devices() -> list[dict[str, Any]] | None:
    """Every CUDA-visible NVIDIA GPU via NVML (no CUDA context); None when NVML fails."""
    return _nvml(_devices)


def _devices(
    pynvml: Any, handles: list[Any], order: list[int], uuids: list[str]
) -> list[dict[str, Any]]:
    driver = _text(pynvml.nvmlSystemGetDriverVersion())
    try:
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
        cuda_driver = f"{cuda // 1000}.{cuda % 1000 // 10}"
    except Exception:
        cuda_driver = ""
    devices = []
    for cuda_index, nvml_index in enumerate(order):
        handle = handles[nvml_index]
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        try:
            memory: int | None = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        except Exception:
            memory = None
        devices.append(
            {
                "index": cuda_index,
                "nvml_index": nvml_index,
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "arch": f"sm_{major}{minor}",
                "capability": [int(major), int(minor)],
                "uuid": uuids[nvml_index],
                "memory_bytes": memory,
                "driver": driver,
                "cuda_driver": cuda_driver,
            }
        )
    return devices


def nvml_compute_pids() -> list[int] | None:
    """The processes computing on the first CUDA-visible NVIDIA GPU, as ``nvidia-smi`` lists them
    (NVML, no CUDA context); None when NVML cannot say."""
    return _nvml(
        lambda pynvml, handles, order, _: [
            int(p.pid) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handles[order[0]])
        ]
    )


def nvml_primary() -> dict[str, Any] | None:
    """The primary NVIDIA device via NVML (name, arch, count, driver), or None."""
    devices = nvml_devices()
    if not devices:
        return None
    d = devices[0]
    return {"name": d["name"], "arch": d["arch"], "count": len(devices), "driver": d["driver"]}
