"""The accelerators torch can use here, one entry per device, and whether torch's build covers them.

The vendor decision is made once, in ``kernel_lock.fingerprint.device_facts``: ROCm is
told apart by ``torch.version.hip``, never by compute capability (an MI250X reports (9, 0), like an
H100). This module takes that primary-device answer and fills in the per-device details for the same
kind. ``torch`` is any object shaped like the torch module, so tests pass ``SimpleNamespace`` fakes
for ``torch.version``, ``torch.cuda``, ``torch.backends.mps`` and ``torch.xpu``.

NVIDIA details come from NVML first (no CUDA context); only without NVML does this read
``torch.cuda.get_device_properties``, which initialises CUDA in this process.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from kernel_lock import fingerprint, host

_SM = re.compile(r"^(sm|compute)_(\d+)([a-z]?)$")

# kernel_lock.host.nvml_devices, or a stand-in: the NVIDIA devices NVML sees, or None
NvmlList = Callable[[], "list[dict[str, Any]] | None"]


def _sm_version(number: str) -> tuple[int, int]:
    """'90' -> (9, 0); '100' -> (10, 0); '121' -> (12, 1)."""
    return int(number[:-1]), int(number[-1])


def _entry_version(entry: str) -> tuple[int, int]:
    """'sm_90' / 'compute_90' -> (9, 0), for an arch-list entry already known to match ``_SM``."""
    m = _SM.match(entry)
    assert m is not None
    return _sm_version(m.group(2))


def torch_arch_list(torch: Any) -> list[str]:
    """The device code targets torch was compiled for (``sm_90``, ``compute_90``, ``gfx90a``,
    ...)."""
    cuda = getattr(torch, "cuda", None)
    get = getattr(cuda, "get_arch_list", None)
    if get is None:
        return []
    try:
        return [str(a) for a in get()]
    except Exception:  # an old or broken build; "unknown" is then the honest answer
        return []


def torch_build_covers(device_arch: str, arch_list: Sequence[str]) -> dict[str, Any]:
    """Will torch's own kernels run on ``device_arch``? A predicted "no kernel image" when not.

    ``how`` is ``sass`` (exact device code), ``binary-compatible`` (SASS of an older minor of the
    same major), ``ptx-jit`` (PTX the driver compiles at first launch), ``code-object`` (AMD
    exact match), ``none`` (not covered), ``unknown`` or ``not-applicable``.
    """
    if not device_arch:
        return {"covered": None, "how": "not-applicable", "detail": "no GPU arch"}
    if not arch_list:
        return {
            "covered": None,
            "how": "unknown",
            "detail": "torch reports no compiled device arch list",
        }
    built = ", ".join(arch_list)
    if device_arch.startswith("gfx"):
        targets = {host.normalize_gcn_arch(a) for a in arch_list}
        if device_arch in targets:
            return {
                "covered": True,
                "how": "code-object",
                "detail": f"torch ships code objects for {device_arch}",
            }
        if any(t.endswith("-generic") for t in targets):
            return {
                "covered": None,
                "how": "unknown",
                "detail": f"torch was built for {built}; whether a generic target covers "
                f"{device_arch} is not checked",
            }
        return {
            "covered": False,
            "how": "none",
            "detail": f"torch was built for {built}, not {device_arch}: expect 'HIP error: "
            "invalid device function'",
        }
    device = _SM.match(device_arch)
    if device is None or device.group(1) != "sm":
        return {
            "covered": None,
            "how": "unknown",
            "detail": f"unrecognised device arch {device_arch!r}",
        }
    want = _sm_version(device.group(2))
    sass, ptx = [], []
    for entry in arch_list:
        m = _SM.match(entry)
        if m is None:
            continue
        have, suffix = _sm_version(m.group(2)), m.group(3)
        if m.group(1) == "sm":
            if have == want:
                return {"covered": True, "how": "sass", "detail": f"torch ships SASS for {entry}"}
            # SASS runs on later minors of the same major, except arch-specific ("a") builds
            if suffix != "a" and have[0] == want[0] and have[1] <= want[1]:
                sass.append(entry)
        elif suffix != "a" and have <= want:
            ptx.append(entry)
    sass.sort(key=_entry_version)
    ptx.sort(key=_entry_version)
    if sass:
        return {
            "covered": True,
            "how": "binary-compatible",
            "detail": f"runs {sass[-1]} SASS (same major, older minor)",
        }
    if ptx:
        return {
            "covered": True,
            "how": "ptx-jit",
            "detail": f"covered via PTX JIT from {ptx[-1]}: the driver compiles at first "
            "launch (slow start)",
        }
    return {
        "covered": False,
        "how": "none",
        "detail": f"torch was built for {built}, not {device_arch}: expect "
        "'no kernel image is available for execution on the device'",
    }


def _device(
    kind: str, vendor: str, index: int, name: str, arch: str, **extra: Any
) -> dict[str, Any]:
    entry = {
        "type": kind,
        "vendor": vendor,
        "index": index,
        "name": name,
        "arch": arch,
        "capability": None,
        "gcn_arch_name": None,
        "memory_bytes": None,
        "multiprocessors": None,
        "uuid": None,
        "driver": "",
        "cuda_driver": "",
        "source": "torch",
        "physical": None,
        "notes": [],
    }
    entry.update(extra)
    return entry


def _uuid(props: Any) -> str | None:
    value = getattr(props, "uuid", None)
    return None if value is None else str(value)


def _cuda_devices(torch: Any, primary: dict[str, Any], nvml: NvmlList) -> list[dict[str, Any]]:
    listed = nvml()
    if listed:
        return [
            _device(
                "cuda",
                "nvidia",
                d["index"],
                d["name"],
                d["arch"],
                capability=list(d["capability"]),
                memory_bytes=d.get("memory_bytes"),
                uuid=d.get("uuid"),
                driver=d.get("driver", ""),
                cuda_driver=d.get("cuda_driver", ""),
                source="nvml",
            )
            for d in listed
        ]
    cuda = torch.cuda
    driver = primary.get("driver") or host.driver_version("cuda")
    out = []
    for i in range(int(cuda.device_count())):
        props = cuda.get_device_properties(i)
        major, minor = int(props.major), int(props.minor)
        out.append(
            _device(
                "cuda",
                "nvidia",
                i,
                str(props.name),
                f"sm_{major}{minor}",
                capability=[major, minor],
                memory_bytes=_int(getattr(props, "total_memory", None)),
                multiprocessors=_int(getattr(props, "multi_processor_count", None)),
                uuid=_uuid(props),
                driver=driver,
            )
        )
    return out


def _rocm_devices(torch: Any, primary: dict[str, Any]) -> list[dict[str, Any]]:
    cuda = torch.cuda
    driver = primary.get("driver") or host.driver_version("rocm")
    out = []
    for i in range(int(cuda.device_count())):
        props = cuda.get_device_properties(i)
        raw = str(getattr(props, "gcnArchName", "") or "")
        name = str(props.name)
        notes = []
        if name in fingerprint.GENERIC_DEVICE_NAMES or not name:
            notes.append(
                f"generic device name {name!r} (libdrm amdgpu.ids missing or old): identify it "
                "by arch"
            )
        out.append(
            _device(
                "rocm",
                "amd",
                i,
                name,
                host.normalize_gcn_arch(raw),
                gcn_arch_name=raw or None,
                memory_bytes=_int(getattr(props, "total_memory", None)),
                multiprocessors=_int(getattr(props, "multi_processor_count", None)),
                uuid=_uuid(props),
                driver=driver,
                notes=notes,
            )
        )
    return out


def _mps_devices(torch: Any, primary: dict[str, Any]) -> list[dict[str, Any]]:
    memory = None
    mps = getattr(torch, "mps", None)
    if mps is not None and hasattr(mps, "recommended_max_memory"):
        try:
            memory = int(mps.recommended_max_memory())
        except Exception:  # older torch, or MPS refuses: memory is then unknown
            memory = None
    return [_device("mps", "apple", 0, primary["name"], "", memory_bytes=memory)]


def _xpu_devices(torch: Any) -> list[dict[str, Any]]:
    xpu = torch.xpu
    out = []
    for i in range(int(xpu.device_count())):
        props = xpu.get_device_properties(i)
        out.append(
            _device(
                "xpu",
                "intel",
                i,
                str(getattr(props, "name", "Intel XPU")),
                "",
                memory_bytes=_int(getattr(props, "total_memory", None)),
                driver=str(getattr(props, "driver_version", "") or ""),
            )
        )
    return out


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def detect_accelerators(
    torch: Any, primary: dict[str, Any], *, nvml: NvmlList = host.nvml_devices
) -> list[dict[str, Any]]:
    """Every device of the primary device's kind, each with ``torch_build_covers``.

    ``primary`` is ``kernel_lock.fingerprint.device_facts(torch)``. On a CPU-only machine
    the list holds one ``cpu`` entry. ``physical`` is the device's node-level id when a visibility
    variable renumbers devices (``kernel_lock.host.physical_devices``), None otherwise.
    """
    kind = primary["type"]
    if kind == "cuda":
        devices = _cuda_devices(torch, primary, nvml)
    elif kind == "rocm":
        devices = _rocm_devices(torch, primary)
    elif kind == "mps":
        devices = _mps_devices(torch, primary)
    elif kind == "xpu":
        devices = _xpu_devices(torch)
    else:
        devices = []
    if not devices:  # CPU, or a GPU kind whose enumeration came back empty
        devices = [
            _device(kind, primary["vendor"], 0, primary["name"], primary["arch"], source="host")
        ]
    arch_list = torch_arch_list(torch) if kind in ("cuda", "rocm") else []
    physical = host.physical_devices(kind)
    for device in devices:
        if physical is not None and device["type"] == kind and device["index"] < len(physical):
            device["physical"] = physical[device["index"]]
        device["torch_build_covers"] = torch_build_covers(device["arch"], arch_list)
    return devices
