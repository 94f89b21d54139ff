"""The environment fingerprint: which facts a lock pins, how to read them cheaply, how to compare them.

This module is the one place that computes the fingerprint; ``kernel_probe``'s detection reuses it,
so the probe and the runtime can never disagree about what "this machine" is. Reading it must stay
cheap: no kernel library is imported (versions come from package metadata), and on NVIDIA the device
facts come from NVML when it is installed, so no CUDA context is created just to check a lock.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import DeviceVisibilityError, Difference
from .versions import release


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
    "torch-rocm": FieldSpec(
        str,
        "compatible",
        "version",
        "ROCm version torch was built with (torch.version.rocm, torch >= 2.10), '' if none",
    ),
    "device-type": FieldSpec(str, "exact", "text", "cpu, cuda, rocm, mps or xpu"),
    "device-vendor": FieldSpec(str, "exact", "text", "nvidia, amd, apple, intel, or the CPU vendor"),
    "device-name": FieldSpec(str, "exact", "text", "device name as the driver reports it"),
    "device-arch": FieldSpec(str, "exact", "text", "sm_90, gfx90a, ...; '' on CPU"),
    "device-features": FieldSpec(
        str,
        "exact",
        "text",
        "ROCm target features from gcnArchName (sramecc+:xnack-); '' elsewhere: an xnack+ run is not an xnack- one",
    ),
    "device-count": FieldSpec(int, "ignore", "count", "number of devices of that type"),
    "driver": FieldSpec(str, "compatible", "version", "GPU driver version, '' when it cannot be read cheaply"),
    "numerics-env": FieldSpec(
        str,
        "exact",
        "text",
        "environment variables that change what kernels compute, as "
        "VAR=value;... ('' when none is set; see NUMERICS_ENV)",
    ),
}

# Environment variables that change the numbers kernels produce or which kernels run (recorded in
# the fingerprint as numerics-env, exact): on ROCm, rocBLAS's and MIOpen's alternate fp16 paths
# (PyTorch's numerical-accuracy notes: reduced-precision fp16 on MI200), XNACK (unified-memory
# retries; another code object), TunableOp's GEMM selection and the hipBLASLt preference.
NUMERICS_ENV = (
    "ROCBLAS_INTERNAL_FP16_ALT_IMPL",
    "MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL",
    "HSA_XNACK",
    "PYTORCH_TUNABLEOP_ENABLED",
    "TORCH_BLAS_PREFER_HIPBLASLT",
)

# device names that say nothing about the device (libdrm's amdgpu.ids missing or old)
GENERIC_DEVICE_NAMES = ("AMD Radeon Graphics",)


def numerics_env(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return ";".join(f"{name}={env[name]}" for name in NUMERICS_ENV if name in env)


def device_name_note(current: Mapping[str, Any]) -> str | None:
    """A note when the device name identifies nothing (empty or generic): the arch does."""
    name = str(current.get("device-name", ""))
    if current.get("device-type") not in ("cuda", "rocm"):
        return None
    if not name or name in GENERIC_DEVICE_NAMES:
        return (
            f"the device name is {name!r}, which does not identify the device (libdrm's amdgpu.ids is missing "
            f"or old in this environment); it is identified by its arch {current.get('device-arch')!r}"
        )
    return None


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
    e, f = release(str(expected)), release(str(found))
    if not e or not f:
        return expected == found
    return e[:2] == f[:2]


def compare(
    expected: Mapping[str, Any],
    found: Mapping[str, Any],
    libraries_expected: Mapping[str, Any],
    libraries_found: Mapping[str, str | None],
) -> list[Difference]:
    """Every field where ``found`` does not satisfy the lock's ``expected`` (EnvField objects)."""
    diffs = []
    for name, spec in expected.items():
        if name not in FIELDS:
            continue  # written by a newer kernel-probe: reported by the loader, not checked (see unchecked_fields)
        kind = FIELDS[name].kind
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


def unchecked_fields(expected: Mapping[str, Any]) -> list[str]:
    """The lock's environment fields this kernel_lock does not know, and so does not check."""
    return [name for name in expected if name not in FIELDS]


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


def archspec_host() -> Any | None:
    """archspec's ``Microarchitecture`` for this CPU, or None when archspec is missing or fails.

    archspec caches the answer, so every caller (fingerprint, ``kernel-probe env``) sees the same one.
    An unknown CPU model is not a failure: archspec returns its generic level (vendor "generic").
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
    host = archspec_host()
    return "unknown" if host is None else str(host.name)


def normalize_gcn_arch(name: str) -> str:
    """'gfx90a:sramecc+:xnack-' -> 'gfx90a' (ROCm appends target features after colons)."""
    return name.split(":", 1)[0].strip()


def gcn_features(name: str) -> str:
    """'gfx90a:sramecc+:xnack-' -> 'sramecc+:xnack-' (the target features, which change code objects)."""
    return name.partition(":")[2].strip()


def _entries(value: str) -> list[str]:
    return [entry.strip() for entry in value.split(",")]


def physical_devices(device_type: str, env: Mapping[str, str] | None = None) -> list[str] | None:
    """The node-level id of each device this process sees, in torch's order; None when nothing restricts it.

    ROCm applies ``ROCR_VISIBLE_DEVICES`` first (node ids or UUIDs), then ``HIP_VISIBLE_DEVICES``
    (or ``CUDA_VISIBLE_DEVICES``), whose indices count within what ROCR left; CUDA applies
    ``CUDA_VISIBLE_DEVICES``. With LUMI's per-rank ``ROCR_VISIBLE_DEVICES=$SLURM_LOCALID`` every
    rank sees one device 0, and only this tells them apart. An entry that cannot be mapped is
    ``'?'``. On ROCm, a HIP list longer than the ROCR list is the contradiction torch refuses
    (``device_count()`` raises "HIP_VISIBLE_DEVICES contains more devices than
    ROCR_VISIBLE_DEVICES"): raised here as ``DeviceVisibilityError`` naming both values.
    """
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
                f"{hip_name}={hip!r} names {len(chosen)} device(s) but ROCR_VISIBLE_DEVICES={rocr!r} leaves "
                f"only {len(base)}: the HIP list indexes into the ROCR list, so which GPU this process uses is "
                "undefined (torch refuses to count devices)",
                key=hip_name,
                fix=f"set one of them: unset {hip_name} (ROCR_VISIBLE_DEVICES alone selects node devices), or "
                f"give {hip_name} indices 0..{len(base) - 1} into ROCR_VISIBLE_DEVICES's list",
            )
        return [base[int(e)] if e.isdigit() and int(e) < len(base) else "?" for e in chosen]
    if device_type == "cuda":
        visible = env.get("CUDA_VISIBLE_DEVICES")
        return None if visible is None else _entries(visible)
    return None


_PLAIN_INDEX = re.compile(r"[0-9]+", re.ASCII)


def rocm_visible_indices(env: Mapping[str, str], count: int) -> list[int] | None:
    """Node indices (KFD GPU order) of the GPUs HIP will see, in HIP's order, among ``count`` GPUs; None
    where ROCm's reading is not certain, so the caller asks torch.

    ROCR_VISIBLE_DEVICES selects node GPUs first; HIP_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES) then
    indexes into what ROCR left. Only lists of distinct plain indices within range are read here: UUIDs,
    repeats, signs, spaces, out-of-range or empty items (whose handling differs between ROCr, HIP and
    torch's parser) are left to torch, and so is CUDA_VISIBLE_DEVICES beside ROCR_VISIBLE_DEVICES (HIP
    honours it, torch's parser does not). Contradictory variables raise as :func:`physical_devices` does.
    """
    physical_devices("rocm", env)  # raises DeviceVisibilityError on a HIP list longer than ROCR's
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    hip = env.get("HIP_VISIBLE_DEVICES")
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if rocr is not None and hip is None and cuda is not None:
        return None

    def indices(value: str, limit: int) -> list[int] | None:
        items = value.split(",")
        if not all(_PLAIN_INDEX.fullmatch(i) for i in items):
            return None
        out = [int(i) for i in items]
        return out if len(set(out)) == len(out) and all(i < limit for i in out) else None

    base = list(range(count)) if rocr is None else indices(rocr, count)
    if base is None:
        return None
    chosen = hip if hip is not None else cuda
    if chosen is None:
        return base
    picked = indices(chosen, len(base))
    return None if picked is None else [base[i] for i in picked]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_ORDINAL = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _ordinal(item: str) -> int | None:
    """The leading integer of one CUDA_VISIBLE_DEVICES item as CUDA reads it (strtoul-like: ``0gpu`` is 0,
    ``+1`` is 1, ``-1`` and a non-number are -1, which ends the list); None where that reading is not
    certain (a lone sign, ``-0``), so the caller asks torch."""
    m = _ORDINAL.match(item)
    if m is None:
        return None if item[:1] in ("+", "-") else -1
    text = m.group(0)
    if text.startswith("-"):
        return -1 if text.strip("-0") else None
    return int(text)


def cuda_visible_entries(visible: str) -> list[int] | list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA parses it, before it is matched against the devices: ordinals, or
    ``GPU-`` / ``MIG-`` UUIDs (full or a prefix). Items are read in order up to the first invalid one
    (a negative or non-numeric item, or one without the list's UUID prefix); a repeated item means no
    device at all (``0,0`` -> []). None where a rule is not certain: :func:`_ordinal`'s cases, and
    ordinals and UUIDs mixed in one list (torch's parser stops at the first of the other kind; CUDA's
    documentation does not say).
    The reference for these rules is torch's own parser (``torch.cuda._parse_visible_devices``): the
    tests compare the two over a corpus of values."""
    for prefix in ("GPU-", "MIG-"):
        if visible.startswith(prefix):
            uuids: list[str] = []
            for item in visible.split(","):
                if item in uuids:
                    return []
                if not item.startswith(prefix):
                    if item.strip()[:1].isdigit() or item.startswith(("GPU-", "MIG-")):
                        return None  # ordinals or the other UUID kind after UUIDs: CUDA's reading is not certain
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
    """NVML indices of the devices CUDA will see, in CUDA's order (NVML ignores CUDA_VISIBLE_DEVICES).

    ``visible`` is the value of CUDA_VISIBLE_DEVICES (None when unset); ``uuids`` are NVML's device
    UUIDs by NVML index. Parsed by :func:`cuda_visible_entries`; an ordinal at or beyond the device
    count, or a UUID prefix that matches no device or several, ends the list; the same device twice
    means none. MIG entries cannot be mapped from the parent GPU list, and an uncertain reading is
    not guessed: None means "ask torch instead".
    """
    if visible is None:
        return list(range(len(uuids)))
    entries = cuda_visible_entries(visible)
    if entries is None or (entries and isinstance(entries[0], str) and entries[0].startswith("MIG-")):
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


def _nvml_devices() -> dict[str, Any] | None:
    """The primary NVIDIA device via NVML (name, arch, count, driver), or None if NVML is unavailable."""
    devices = nvml_devices()
    if not devices:
        return None
    first = devices[0]
    return {"name": first["name"], "arch": first["arch"], "count": len(devices), "driver": first["driver"]}


# Where the kernel driver states its version: one small file read, no library, no device context.
_DRIVER_FILES = {
    "cuda": ("/proc/driver/nvidia/version", re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]*)")),
    "rocm": ("/sys/module/amdgpu/version", re.compile(r"([0-9][0-9.]*)")),
}


def driver_version(device_type: str) -> str:
    """The GPU kernel driver's version from its /proc or /sys file; '' when there is none."""
    entry = _DRIVER_FILES.get(device_type)
    if entry is None:
        return ""
    path, pattern = entry
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            match = pattern.search(fh.read(4096))
    except OSError:
        return ""
    return match.group(1) if match else ""


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
                "driver": driver_version("rocm"),
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
                "driver": driver_version("cuda"),
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


_CPU_VENDORS = {"authenticamd": "amd", "genuineintel": "intel", "arm": "arm", "0x41": "arm", "0x4e": "nvidia"}


def _cpu_vendor() -> str:
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


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def import_torch() -> Any:
    """``import torch``, or :class:`KernelUnavailable` saying why it failed (a torch whose compiled
    libraries are missing or broken is no machine a lock is current on)."""
    try:
        import torch
    except Exception as exc:  # ImportError, OSError from the dynamic loader, anything its __init__ raises
        from .errors import KernelUnavailable

        raise KernelUnavailable(
            f"`import torch` fails here: {type(exc).__name__}: {exc}",
            key="environment.torch",
            fix="repair or reinstall torch in this environment (pip install --force-reinstall torch)",
        ) from None
    return torch


def current(torch: Any | None = None, *, device: Callable[[Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The fingerprint fields of this machine, as plain values keyed like ``FIELDS``."""
    if torch is None:
        torch = import_torch()
    dev = (device or device_facts)(torch)
    return {
        "python": platform.python_version(),
        "os": sys.platform if sys.platform != "linux" else "linux",
        "arch": platform.machine().lower(),
        "cpu-microarch": cpu_microarch(),
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


# Where torch is imported already (a training or inference process), asking it costs nothing and is
# what a lock was written from; tests turn this off to read the files in a process that has torch.
USE_IMPORTED_TORCH = True


def for_check(checked: Iterable[str] | None = None) -> dict[str, Any]:
    """The fingerprint a check compares with a lock: from torch where it is imported already, else
    read without importing it (``kernel_lock.torchless``), which falls back to torch for a fact in
    ``checked`` (default: all) that it cannot read with certainty, saying which and why at DEBUG."""
    if USE_IMPORTED_TORCH and "torch" in sys.modules:
        return current()
    from . import torchless

    return torchless.current(checked)


def device_here() -> dict[str, Any]:
    """``device_facts`` of this machine, by the same rule as :func:`for_check` (torch-free where torch
    is not imported and every device fact can be read without it)."""
    if not (USE_IMPORTED_TORCH and "torch" in sys.modules):
        from . import torchless

        facts = torchless.device()
        if facts is not None:
            return facts
    return device_facts(import_torch())
