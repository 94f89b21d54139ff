"""The host: OS, Python, CPU (archspec microarchitecture), cores and memory. No torch needed."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from kernel_lock import host as fingerprint_host
from kernel_probe.detect import cpumath


def _os_release() -> str | None:
    """PRETTY_NAME from /etc/os-release (Linux), e.g. 'Rocky Linux 8.9 (Green Obsidian)'."""
    try:
        with open("/etc/os-release", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"') or None
    except OSError:
        pass
    return None


def cpu_model(host: Any | None) -> dict[str, Any]:
    """archspec's view of the CPU. ``host`` is an archspec ``Microarchitecture`` (or None).

    archspec answers an unknown model with its generic level (``x86_64_v4``, vendor ``generic``):
    that is reported as ``model_known: false``, not as an error.
    """
    if host is None:
        return {"microarch": "unknown", "generic": None, "vendor": None, "model_known": False}
    generic = getattr(host, "generic", None)
    vendor = str(getattr(host, "vendor", "") or "")
    return {
        "microarch": str(host.name),
        "generic": str(getattr(generic, "name", generic)) if generic is not None else None,
        "vendor": vendor or None,
        "model_known": vendor.lower() != "generic",
    }


def _brand() -> str | None:
    try:
        import archspec.cpu

        return archspec.cpu.brand_string() or None
    except Exception:  # archspec missing or unable to read the brand: the name is then unknown
        return None


def _usable_cores() -> int | None:
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        return None
    try:
        return len(getter(0))  # what Slurm/cgroups let this process use, not the whole node
    except OSError:
        return None


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _cgroup_memory_limit() -> int | None:
    """The memory limit of this process's cgroup (a Slurm job's allocation), if any."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="utf-8") as fh:
                value = fh.read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < (1 << 60):  # cgroup v1 writes a huge number for "none"
            return int(value)
        return None
    return None


def memory() -> dict[str, int | None]:
    """Total and available memory and the cgroup limit, in bytes (None where the system does not
    say)."""
    info = _meminfo()
    total = info.get("MemTotal")
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = None
    return {
        "total_bytes": total,
        "available_bytes": info.get("MemAvailable"),
        "cgroup_limit_bytes": _cgroup_memory_limit(),
    }


def detect_host() -> dict[str, Any]:
    """The host's facts: operating system, Python, CPU, memory."""
    return {
        "os": {
            "platform": sys.platform,
            "system": platform.system(),
            "release": platform.release(),
            "distribution": _os_release(),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            "prefix": sys.prefix,
            "virtualenv": sys.prefix != sys.base_prefix,
        },
        "cpu": {
            "arch": platform.machine().lower(),
            **cpu_model(fingerprint_host.archspec_host()),
            "brand": _brand(),
            "cores": os.cpu_count(),
            "usable_cores": _usable_cores(),
            "matmul": cpumath.matmul(),  # bf16 / fp16 matmul native or emulated (issue 38)
        },
        "memory": memory(),
    }
