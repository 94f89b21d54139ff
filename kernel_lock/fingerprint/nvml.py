"""NVIDIA's devices through NVML (nvidia-ml-py), without creating a CUDA context.

NVML is an optional shortcut: when it is missing or fails, the callers read the device another way.
"""

from __future__ import annotations

import os
from typing import Any

from .visible import visible_nvml_indices

__all__ = [
    "nvml_devices",
    "primary",
]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_devices() -> list[dict[str, Any]] | None:
    """Every CUDA-visible NVIDIA GPU via NVML (nvidia-ml-py), without creating a CUDA context.

    One dict per device, in CUDA's order: index, nvml_index, name, arch (sm_XY), capability,
    uuid, memory_bytes, driver (kernel driver version) and cuda_driver (the newest CUDA the driver
    supports). None when NVML is not installed, has no library or no devices, or fails in any way:
    NVML is an optional shortcut, never a reason for the fingerprint to fail.
    """
    try:
        import pynvml
    except Exception:  # not installed, or a broken/deprecated shim
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver library (NVMLError_LibraryNotFound), no permission, ...
        return None
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        order = visible_nvml_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids)
        if not order:
            return None
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
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def primary() -> dict[str, Any] | None:
    """The primary NVIDIA device via NVML (name, arch, count, driver), or None if NVML is
    unavailable."""
    devices = nvml_devices()
    if not devices:
        return None
    first = devices[0]
    return {
        "name": first["name"],
        "arch": first["arch"],
        "count": len(devices),
        "driver": first["driver"],
    }
