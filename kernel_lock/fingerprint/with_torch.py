"""The fingerprint as an imported torch reports it: what a lock is written from.

``current(torch)`` gives every field of ``fields.FIELDS``; ``device_facts(torch)`` the primary
accelerator's. torch is imported here only when the caller did not pass it (:func:`import_torch`).
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from typing import Any

from . import host, nvml
from .fields import numerics_env
from .host import gcn_features, normalize_gcn_arch
from .visible import physical_devices

__all__ = [
    "current",
    "device_facts",
    "import_torch",
]


def device_facts(torch: Any) -> dict[str, Any]:
    """Type, vendor, name, arch, count and driver of the primary accelerator (or the CPU).

    ROCm is told apart by ``torch.version.hip``, never by compute capability: an MI250X reports
    (9, 0), like a Hopper GPU. Its arch comes from ``gcnArchName``. Raises ``DeviceVisibilityError``
    when the ROCm visibility variables contradict each other (see ``physical_devices``).
    """
    hip = getattr(torch.version, "hip", None)
    cuda_mod = getattr(torch, "cuda", None)
    if hip:
        physical_devices("rocm")  # contradictory visibility variables are an error, not "no GPU"
        if cuda_mod is not None and cuda_mod.is_available() and cuda_mod.device_count() > 0:
            props = cuda_mod.get_device_properties(0)
            gcn = str(getattr(props, "gcnArchName", ""))
            return {
                "type": "rocm",
                "vendor": "amd",
                "name": str(props.name),
                "arch": normalize_gcn_arch(gcn),
                "features": gcn_features(gcn),
                "count": int(cuda_mod.device_count()),
                "driver": host.driver_version("rocm"),
            }
    elif getattr(torch.version, "cuda", None) and cuda_mod is not None:
        first = nvml.primary()
        if first is not None:
            return {"type": "cuda", "vendor": "nvidia", **first}
        if cuda_mod.is_available() and cuda_mod.device_count() > 0:
            major, minor = cuda_mod.get_device_capability(0)
            return {
                "type": "cuda",
                "vendor": "nvidia",
                "name": str(cuda_mod.get_device_name(0)),
                "arch": f"sm_{major}{minor}",
                "count": int(cuda_mod.device_count()),
                "driver": host.driver_version("cuda"),
            }
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is not None and mps.is_available():
        return {
            "type": "mps",
            "vendor": "apple",
            "name": "Apple MPS",
            "arch": "",
            "count": 1,
            "driver": "",
        }
    xpu = getattr(torch, "xpu", None)
    if (
        xpu is not None
        and hasattr(xpu, "is_available")
        and xpu.is_available()
        and xpu.device_count() > 0
    ):
        props = xpu.get_device_properties(0)
        return {
            "type": "xpu",
            "vendor": "intel",
            "name": str(getattr(props, "name", "Intel XPU")),
            "arch": "",
            "count": int(xpu.device_count()),
            "driver": str(getattr(props, "driver_version", "")),
        }
    return {
        "type": "cpu",
        "vendor": host.cpu_vendor(),
        "name": host.cpu_name(),
        "arch": "",
        "count": 1,
        "driver": "",
    }


def import_torch() -> Any:
    """``import torch``, or :class:`KernelUnavailable` saying why it failed (a torch whose compiled
    libraries are missing or broken is no machine a lock is current on)."""
    try:
        import torch
    # ImportError, OSError from the dynamic loader, anything its __init__ raises
    except Exception as exc:
        from ..errors import KernelUnavailable

        raise KernelUnavailable(
            f"`import torch` fails here: {type(exc).__name__}: {exc}",
            key="environment.torch",
            fix="repair or reinstall torch in this environment (pip install --force-reinstall "
            "torch)",
        ) from None
    return torch


def current(
    torch: Any | None = None, *, device: Callable[[Any], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The fingerprint fields of this machine, as plain values keyed like ``FIELDS``."""
    if torch is None:
        torch = import_torch()
    dev = (device or device_facts)(torch)
    return {
        "python": platform.python_version(),
        "os": sys.platform if sys.platform != "linux" else "linux",
        "arch": platform.machine().lower(),
        "cpu-microarch": host.cpu_microarch(),
        "torch": str(torch.__version__).split("+")[0],
        "torch-cuda": str(getattr(torch.version, "cuda", None) or ""),
        "torch-hip": str(getattr(torch.version, "hip", None) or ""),
        "torch-rocm": str(getattr(torch.version, "rocm", None) or ""),
        "device-type": dev["type"],
        "device-vendor": dev["vendor"],
        "device-name": dev["name"],
        "device-arch": dev["arch"],
        "device-features": dev.get("features", ""),
        "device-count": int(dev["count"]),
        "driver": dev.get("driver", ""),
        "numerics-env": numerics_env(),
    }
