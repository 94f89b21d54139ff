"""The environment fingerprint: which facts a lock pins, how to read them cheaply, how to compare them.

This module is the one place that computes the fingerprint; ``kernel_probe``'s detection reuses it,
so the probe and the runtime can never disagree about what "this machine" is. Reading it must stay
cheap: no kernel library is imported (versions come from package metadata), and on NVIDIA the device
facts come from NVML when it is installed, so no CUDA context is created just to check a lock.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import Difference


@dataclass(frozen=True)
class FieldSpec:
    type: type | tuple[type, ...]
    default_match: str
    kind: str  # "version" compares release numbers; "text" compares strings; "count" integers
    doc: str


FIELDS: dict[str, FieldSpec] = {
    "python": FieldSpec(str, "compatible", "version", "Python version (compatible: same major.minor)"),
    "os": FieldSpec(str, "exact", "text", "operating system, lower case (linux, darwin, windows)"),
    "arch": FieldSpec(str, "exact", "text", "CPU architecture (x86_64, aarch64)"),
    "cpu-microarch": FieldSpec(str, "ignore", "text", "CPU microarchitecture from archspec (zen3, neoverse_v2)"),
    "torch": FieldSpec(str, "compatible", "version", "torch version (compatible: same major.minor)"),
    "torch-cuda": FieldSpec(str, "compatible", "version", "CUDA version torch was built with, '' if none"),
    "torch-hip": FieldSpec(str, "compatible", "version", "HIP (ROCm) version torch was built with, '' if none"),
    "device-type": FieldSpec(str, "exact", "text", "cpu, cuda, rocm, mps or xpu"),
    "device-vendor": FieldSpec(str, "exact", "text", "nvidia, amd, apple, intel, or the CPU vendor"),
    "device-name": FieldSpec(str, "exact", "text", "device name as the driver reports it"),
    "device-arch": FieldSpec(str, "exact", "text", "sm_90, gfx90a, ...; '' on CPU"),
    "device-count": FieldSpec(int, "ignore", "count", "number of devices of that type"),
    "driver": FieldSpec(str, "compatible", "version", "GPU driver version, '' when it cannot be read cheaply"),
}

# distribution name -> top-level module, for the libraries a lock may pin
LIBRARY_MODULES = {
    "torch": "torch",
    "liger-kernel": "liger_kernel",
    "transformer-engine": "transformer_engine",
    "transformer-engine-torch": "transformer_engine",
    "apex": "apex",
    "flash-attn": "flash_attn",
    "quack-kernels": "quack",
    "triton": "triton",
    "pytorch-triton-rocm": "triton",
}


def _release(version: str) -> tuple[int, ...]:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release
    except InvalidVersion:
        parts = []
        for piece in version.split("+")[0].split("."):
            if not piece.isdigit():
                break
            parts.append(int(piece))
        return tuple(parts)


def field_matches(kind: str, rule: str, expected: Any, found: Any) -> bool:
    """Does ``found`` satisfy ``expected`` under ``rule``?

    ``compatible`` on a version means the same major.minor (a patch or driver bump keeps the lock
    valid; a torch minor or CUDA minor does not). On text and counts it means equal.
    """
    if rule == "ignore":
        return True
    if rule == "exact" or kind != "version":
        return expected == found
    if expected == "" or found == "":
        return expected == found
    e, f = _release(str(expected)), _release(str(found))
    if not e or not f:
        return expected == found
    return e[:2] == f[:2]


def compare(expected: Mapping[str, Any], found: Mapping[str, Any], libraries_expected: Mapping[str, Any],
            libraries_found: Mapping[str, str | None]) -> list[Difference]:
    """Every field where ``found`` does not satisfy the lock's ``expected`` (EnvField objects)."""
    diffs = []
    for name, spec in expected.items():
        kind = FIELDS[name].kind if name in FIELDS else "text"
        value = found.get(name)
        if not field_matches(kind, spec.match, spec.value, value):
            diffs.append(Difference(name, spec.value, value, spec.match))
    for name, spec in libraries_expected.items():
        value = libraries_found.get(name)
        if value is None:
            if spec.match != "ignore":
                diffs.append(Difference(f"libraries.{name}", spec.value, "not installed", spec.match))
        elif not field_matches("version", spec.match, spec.value, value):
            diffs.append(Difference(f"libraries.{name}", spec.value, value, spec.match))
    return diffs


def library_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed distribution versions from package metadata (nothing is imported)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_microarch() -> str:
    try:
        import archspec.cpu
    except ImportError:
        return "unknown"
    try:
        return str(archspec.cpu.host().name)
    except Exception:  # archspec raises on CPUs it has no entry for; that is a fact, not an error
        return "unknown"


def normalize_gcn_arch(name: str) -> str:
    """'gfx90a:sramecc+:xnack-' -> 'gfx90a' (ROCm appends target features after colons)."""
    return name.split(":", 1)[0].strip()


def _nvml_devices() -> dict[str, Any] | None:
    """NVIDIA facts via NVML (nvidia-ml-py), which does not create a CUDA context. None if unavailable."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except Exception:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(_visible_index())
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and visible.strip() != "":
            count = len([v for v in visible.split(",") if v.strip() and not v.strip().startswith("-")])
        return {"name": name, "arch": f"sm_{major}{minor}", "count": count, "driver": driver}
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _visible_index() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def device_facts(torch: Any) -> dict[str, Any]:
    """Type, vendor, name, arch, count and driver of the primary accelerator (or the CPU).

    ROCm is told apart by ``torch.version.hip``, never by compute capability: an MI250X reports
    (9, 0), like a Hopper GPU. Its arch comes from ``gcnArchName``.
    """
    hip = getattr(torch.version, "hip", None)
    cuda_mod = getattr(torch, "cuda", None)
    if hip:
        if cuda_mod is not None and cuda_mod.is_available() and cuda_mod.device_count() > 0:
            props = cuda_mod.get_device_properties(0)
            return {
                "type": "rocm",
                "vendor": "amd",
                "name": str(props.name),
                "arch": normalize_gcn_arch(str(getattr(props, "gcnArchName", ""))),
                "count": int(cuda_mod.device_count()),
                "driver": "",
            }
    elif getattr(torch.version, "cuda", None) and cuda_mod is not None:
        nvml = _nvml_devices()
        if nvml is not None:
            return {"type": "cuda", "vendor": "nvidia", **nvml}
        if cuda_mod.is_available() and cuda_mod.device_count() > 0:
            major, minor = cuda_mod.get_device_capability(0)
            return {
                "type": "cuda",
                "vendor": "nvidia",
                "name": str(cuda_mod.get_device_name(0)),
                "arch": f"sm_{major}{minor}",
                "count": int(cuda_mod.device_count()),
                "driver": "",
            }
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is not None and mps.is_available():
        return {"type": "mps", "vendor": "apple", "name": "Apple MPS", "arch": "", "count": 1, "driver": ""}
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and hasattr(xpu, "is_available") and xpu.is_available() and xpu.device_count() > 0:
        props = xpu.get_device_properties(0)
        return {
            "type": "xpu",
            "vendor": "intel",
            "name": str(getattr(props, "name", "Intel XPU")),
            "arch": "",
            "count": int(xpu.device_count()),
            "driver": str(getattr(props, "driver_version", "")),
        }
    return {"type": "cpu", "vendor": _cpu_vendor(), "name": _cpu_name(), "arch": "", "count": 1, "driver": ""}


def _cpu_vendor() -> str:
    try:
        import archspec.cpu

        return str(archspec.cpu.host().vendor).lower()
    except Exception:
        return "unknown"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def current(torch: Any | None = None, *, device: Callable[[Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The fingerprint fields of this machine, as plain values keyed like ``FIELDS``."""
    if torch is None:
        import torch as torch_module

        torch = torch_module
    dev = (device or device_facts)(torch)
    return {
        "python": platform.python_version(),
        "os": sys.platform if sys.platform != "linux" else "linux",
        "arch": platform.machine().lower(),
        "cpu-microarch": cpu_microarch(),
        "torch": str(torch.__version__).split("+")[0],
        "torch-cuda": str(getattr(torch.version, "cuda", None) or ""),
        "torch-hip": str(getattr(torch.version, "hip", None) or ""),
        "device-type": dev["type"],
        "device-vendor": dev["vendor"],
        "device-name": dev["name"],
        "device-arch": dev["arch"],
        "device-count": int(dev["count"]),
        "driver": dev.get("driver", ""),
    }
