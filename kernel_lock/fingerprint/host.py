"""Facts of this host read without torch: the CPU (archspec, /proc/cpuinfo), the GPU driver's
version file, and ROCm's arch names. ``with_torch`` and ``torchless`` both take them from here."""

from __future__ import annotations

import platform
import re
from typing import Any

__all__ = [
    "DRIVER_FILES",
    "archspec_host",
    "cpu_microarch",
    "cpu_name",
    "cpu_vendor",
    "driver_version",
    "gcn_features",
    "normalize_gcn_arch",
]


def archspec_host() -> Any | None:
    """archspec's ``Microarchitecture`` for this CPU, or None when archspec is missing or fails.

    archspec caches the answer, so every caller (fingerprint, ``kernel-probe env``) sees the same
    one. An unknown CPU model is not a failure: archspec returns its generic level (vendor
    "generic").
    """
    try:
        import archspec.cpu
    except ImportError:
        return None
    try:
        return archspec.cpu.host()
    except Exception:  # archspec raises on CPUs it has no entry for; that is a fact, not an error
        return None


def cpu_microarch() -> str:
    """archspec's name for this CPU (zen3, neoverse_v2), or 'unknown'."""
    host = archspec_host()
    return "unknown" if host is None else str(host.name)


def normalize_gcn_arch(name: str) -> str:
    """'gfx90a:sramecc+:xnack-' -> 'gfx90a' (ROCm appends target features after colons)."""
    return name.split(":", 1)[0].strip()


def gcn_features(name: str) -> str:
    """'gfx90a:sramecc+:xnack-' -> 'sramecc+:xnack-' (the target features, which change code
    objects)."""
    return name.partition(":")[2].strip()


# Where the kernel driver states its version: one small file read, no library, no device context.
DRIVER_FILES = {
    "cuda": (
        "/proc/driver/nvidia/version",
        re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]*)"),
    ),
    "rocm": ("/sys/module/amdgpu/version", re.compile(r"([0-9][0-9.]*)")),
}


def driver_version(device_type: str) -> str:
    """The GPU kernel driver's version from its /proc or /sys file; '' when there is none."""
    entry = DRIVER_FILES.get(device_type)
    if entry is None:
        return ""
    path, pattern = entry
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
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


def cpu_vendor() -> str:
    """archspec's vendor, or /proc/cpuinfo's vendor_id when archspec only knows a generic level."""
    host = archspec_host()
    vendor = "" if host is None else str(host.vendor).lower()
    if vendor and vendor != "generic":
        return {"authenticamd": "amd", "genuineintel": "intel"}.get(vendor, vendor)
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("vendor_id", "cpu implementer"):
                    raw = line.split(":", 1)[1].strip().lower()
                    return _CPU_VENDORS.get(raw, raw)
    except OSError:
        pass
    return vendor or "unknown"


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
