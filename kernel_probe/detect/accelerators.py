"""What torch was built with, and each accelerator it can use here (the vendor decided once, by
``kernel_lock.fingerprint.device_facts``; NVIDIA devices from NVML first, no CUDA context).
``torch``: anything shaped like the torch module."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from kernel_lock import fingerprint
from kernel_lock import host as lock_host

# kernel_lock.host.nvml_devices, or a stand-in: the NVIDIA devices NVML sees, or None
NvmlList = Callable[[], "list[dict[str, Any]] | None"]

# report key, then the path under the torch module ("()": called); switches that change results or
# their reproducibility; None where this torch has no such switch
MATH_FLAGS: tuple[tuple[str, ...], ...] = tuple(
    tuple(line.split())
    for line in """
    float32_matmul_precision get_float32_matmul_precision()
    matmul_allow_tf32 backends.cuda.matmul.allow_tf32
    cudnn_allow_tf32 backends.cudnn.allow_tf32
    matmul_fp32_precision backends.cuda.matmul.fp32_precision
    cudnn_fp32_precision backends.cudnn.fp32_precision
    matmul_allow_fp16_reduced_precision_reduction backends.cuda.matmul.\
allow_fp16_reduced_precision_reduction
    matmul_allow_bf16_reduced_precision_reduction backends.cuda.matmul.\
allow_bf16_reduced_precision_reduction
    matmul_allow_fp16_accumulation backends.cuda.matmul.allow_fp16_accumulation
    deterministic_algorithms are_deterministic_algorithms_enabled()
    deterministic_warn_only is_deterministic_algorithms_warn_only_enabled()
    cudnn_enabled backends.cudnn.enabled
    cudnn_deterministic backends.cudnn.deterministic
    cudnn_benchmark backends.cudnn.benchmark
    preferred_blas_library backends.cuda.preferred_blas_library()
    flash_sdp_enabled backends.cuda.flash_sdp_enabled()
    mem_efficient_sdp_enabled backends.cuda.mem_efficient_sdp_enabled()
    cudnn_sdp_enabled backends.cuda.cudnn_sdp_enabled()
    math_sdp_enabled backends.cuda.math_sdp_enabled()
    """.strip().splitlines()
)
# variables that change what torch or its kernels compute, or where they run (NVIDIA_TF32_OVERRIDE=0
# disables TF32 whatever torch says; HSA_OVERRIDE_GFX_VERSION makes a GPU report another arch)
NUMERICS_ENV = (
    ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG")
    + ("CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
    + ("ROCR_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION", "PYTORCH_CUDA_ALLOC_CONF")
    + ("PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "TORCH_CUDNN_SDPA_ENABLED")
    + ("TORCH_BLAS_PREFER_HIPBLASLT", "MIOPEN_USER_DB_PATH", "TRITON_CACHE_DIR")
    + ("FLASH_ATTENTION_TRITON_AMD_ENABLE",)
)
_SM = re.compile(r"^(sm|compute)_(\d+)([a-z]?)$")


def failure(exc: BaseException) -> str:
    """``Type: message``: how the report states an exception."""
    return f"{type(exc).__name__}: {exc}"


def _attr(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj


def _read(torch: Any, path: str) -> Any:
    obj = _attr(torch, path.removesuffix("()"))
    if obj is None:
        return None
    try:
        value = obj() if path.endswith("()") else obj
    except Exception:  # a flag this build cannot answer (e.g. no CUDA): unknown, not an error
        return None
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    name = getattr(value, "name", None)  # enums such as _BlasBackend.Cublas
    return str(name) if name is not None else str(value)


def build_kind(torch: Any) -> str:
    """cuda, rocm, xpu or cpu: the GPU runtime torch was built for (MPS is in every macOS build)."""
    version = getattr(torch, "version", None)
    for attr, kind in (("hip", "rocm"), ("cuda", "cuda"), ("xpu", "xpu")):
        if getattr(version, attr, None):
            return kind
    return "cpu"


def _dotted(parts: Any) -> str | None:
    try:
        return ".".join(str(int(p)) for p in tuple(parts)[:3])
    except (TypeError, ValueError):
        return None


def dnn_library(torch: Any) -> dict[str, Any]:
    """cuDNN (MIOpen on ROCm): the version loaded, and the one torch was compiled against."""
    library = "miopen" if build_kind(torch) == "rocm" else "cudnn"
    out: dict[str, Any] = dict(library=library, version=None, compiled=None, available=False)
    out["error"] = None
    is_available, cudnn = _attr(torch, "backends.cudnn.is_available"), _attr(torch, "_C._cudnn")
    try:
        out["available"] = bool(is_available()) if is_available else False
        if cudnn is not None and out["available"]:
            out["version"] = _dotted(cudnn.getRuntimeVersion())
            out["compiled"] = _dotted(cudnn.getCompileVersion())
    except Exception as exc:  # a loader problem is exactly the kind of fact this report is for
        out["error"] = failure(exc)
    return out


def collectives_library(torch: Any) -> dict[str, Any]:
    """NCCL (RCCL on ROCm): the version torch uses; None on builds without it."""
    kind = build_kind(torch)
    out: dict[str, Any] = dict(library="rccl" if kind == "rocm" else "nccl", version=None)
    out["error"] = None
    try:
        if kind in ("cuda", "rocm"):
            nccl = _attr(torch, "cuda.nccl") or importlib.import_module(
                f"{torch.__name__}.cuda.nccl"
            )
            out["version"] = ".".join(str(p) for p in nccl.version())
    except Exception as exc:  # built without NCCL, or the library failed to load
        out["error"] = failure(exc)
    return out


def torch_arch_list(torch: Any) -> list[str]:
    """The device code targets torch was compiled for (``sm_90``, ``compute_90``, ``gfx90a``)."""
    get = _attr(torch, "cuda.get_arch_list")
    try:
        return [] if get is None else [str(a) for a in get()]
    except Exception:  # an old or broken build; "unknown" is then the honest answer
        return []


def detect_torch_build(torch: Any) -> dict[str, Any]:
    """The torch build's facts: version, location, build kind, toolkits, libraries, math flags."""
    version = getattr(torch, "version", None)
    return {
        "version": str(getattr(torch, "__version__", "")),
        "location": os.path.dirname(str(getattr(torch, "__file__", "") or "")) or None,
        "build": build_kind(torch),
        **{key: getattr(version, key, None) for key in ("cuda", "hip", "rocm", "xpu")},
        "git": getattr(version, "git_version", None),
        "debug": getattr(version, "debug", None),
        "arch_list": torch_arch_list(torch),
        "cxx11_abi": _read(torch, "compiled_with_cxx11_abi()"),
        "dnn": dnn_library(torch),
        "collectives": collectives_library(torch),
        "cpu_capability": _read(torch, "backends.cpu.get_cpu_capability()"),
        "math": {key: _read(torch, path) for key, path in MATH_FLAGS},
        "environment": {name: os.environ[name] for name in NUMERICS_ENV if name in os.environ},
    }


def _sm(number: str) -> tuple[int, int]:
    return int(number[:-1]), int(number[-1])  # '90' -> (9, 0); '121' -> (12, 1)


def torch_build_covers(device_arch: str, arch_list: Sequence[str]) -> dict[str, Any]:
    """Will torch's own kernels run on ``device_arch``? ``how``: ``sass``,
    ``binary-compatible`` (an older minor's SASS), ``ptx-jit`` (compiled at first launch),
    ``code-object`` (AMD), ``none``, ``unknown`` or ``not-applicable``."""

    def covers(covered: bool | None, how: str, detail: str) -> dict[str, Any]:
        return {"covered": covered, "how": how, "detail": detail}

    if not device_arch:
        return covers(None, "not-applicable", "no GPU arch")
    if not arch_list:
        return covers(None, "unknown", "torch reports no compiled device arch list")
    built = f"torch was built for {', '.join(arch_list)}"
    if device_arch.startswith("gfx"):
        targets = {lock_host.normalize_gcn_arch(a) for a in arch_list}
        if device_arch in targets:
            return covers(True, "code-object", f"torch ships code objects for {device_arch}")
        if any(t.endswith("-generic") for t in targets):
            why = f"{built}; whether a generic target covers {device_arch} is not checked"
            return covers(None, "unknown", why)
        why = f"{built}, not {device_arch}: expect 'HIP error: invalid device function'"
        return covers(False, "none", why)
    device = _SM.match(device_arch)
    if device is None or device.group(1) != "sm":
        return covers(None, "unknown", f"unrecognised device arch {device_arch!r}")
    want, sass, ptx = _sm(device.group(2)), [], []
    for entry in arch_list:
        if (m := _SM.match(entry)) is None:
            continue
        have, suffix = _sm(m.group(2)), m.group(3)
        if m.group(1) == "sm" and have == want:
            return covers(True, "sass", f"torch ships SASS for {entry}")
        # SASS runs on later minors of the same major, except arch-specific ("a") builds
        if m.group(1) == "sm" and suffix != "a" and have[0] == want[0] and have[1] <= want[1]:
            sass.append((have, entry))
        elif m.group(1) != "sm" and suffix != "a" and have <= want:
            ptx.append((have, entry))
    if sass:
        newest = sorted(sass, key=lambda e: e[0])[-1][1]
        return covers(True, "binary-compatible", f"runs {newest} SASS (same major, older minor)")
    if ptx:
        newest = sorted(ptx, key=lambda e: e[0])[-1][1]
        why = f"covered via PTX JIT from {newest}: the driver compiles at first launch (slow start)"
        return covers(True, "ptx-jit", why)
    why = f"{built}, not {device_arch}: expect 'no kernel image is available for execution on the "
    return covers(False, "none", why + "device'")


def _device(
    kind: str, vendor: str, index: int, name: str, arch: str, **extra: Any
) -> dict[str, Any]:
    entry: dict[str, Any] = dict(type=kind, vendor=vendor, index=index, name=name, arch=arch)
    entry.update(capability=None, gcn_arch_name=None, memory_bytes=None, multiprocessors=None)
    entry.update(uuid=None, driver="", cuda_driver="", source="torch", physical=None, notes=[])
    return {**entry, **extra}


def _int(obj: Any, name: str) -> int | None:
    try:
        return int(getattr(obj, name))
    except (AttributeError, TypeError, ValueError):
        return None


def _devices(torch: Any, primary: dict[str, Any], nvml: NvmlList) -> list[dict[str, Any]]:
    kind, out = primary["type"], []
    if kind == "cuda" and (listed := nvml()):
        for d in listed:
            extra = {key: d.get(key) for key in ("memory_bytes", "uuid")}
            extra.update(driver=d.get("driver", ""), cuda_driver=d.get("cuda_driver", ""))
            extra.update(source="nvml", capability=list(d["capability"]))
            out.append(_device("cuda", "nvidia", d["index"], d["name"], d["arch"], **extra))
        return out
    if kind == "mps":
        try:
            memory = int(torch.mps.recommended_max_memory())
        except Exception:  # older torch, or MPS refuses: memory is then unknown
            memory = None
        return [_device("mps", "apple", 0, primary["name"], "", memory_bytes=memory)]
    if kind == "xpu":
        for i in range(int(torch.xpu.device_count())):
            props = torch.xpu.get_device_properties(i)
            name = str(getattr(props, "name", "Intel XPU"))
            driver = str(getattr(props, "driver_version", "") or "")
            memory = _int(props, "total_memory")
            out.append(_device("xpu", "intel", i, name, "", memory_bytes=memory, driver=driver))
        return out
    if kind not in ("cuda", "rocm"):
        return out
    driver = primary.get("driver") or lock_host.driver_version(kind)
    for i in range(int(torch.cuda.device_count())):
        props = torch.cuda.get_device_properties(i)
        uuid, name = getattr(props, "uuid", None), str(props.name)
        facts: dict[str, Any] = dict(uuid=None if uuid is None else str(uuid), driver=driver)
        facts.update(memory_bytes=_int(props, "total_memory"))
        facts.update(multiprocessors=_int(props, "multi_processor_count"))
        if kind == "cuda":
            major, minor = int(props.major), int(props.minor)
            facts["capability"] = [major, minor]
            out.append(_device(kind, "nvidia", i, name, f"sm_{major}{minor}", **facts))
            continue
        raw = str(getattr(props, "gcnArchName", "") or "")
        if name in fingerprint.GENERIC_DEVICE_NAMES or not name:
            facts["notes"] = [
                f"generic device name {name!r} (libdrm amdgpu.ids missing or old): identify it "
                "by arch"
            ]
        arch = lock_host.normalize_gcn_arch(raw)
        out.append(_device(kind, "amd", i, name, arch, gcn_arch_name=raw or None, **facts))
    return out


def detect_accelerators(
    torch: Any, primary: dict[str, Any], *, nvml: NvmlList = lock_host.nvml_devices
) -> list[dict[str, Any]]:
    """Every device of the primary device's kind (one ``cpu`` entry without one), each with
    ``torch_build_covers``; ``physical``: the node-level id under a visibility variable, or None."""
    kind = primary["type"]
    # CPU, or a GPU kind whose enumeration came back empty
    devices = _devices(torch, primary, nvml) or [
        _device(kind, primary["vendor"], 0, primary["name"], primary["arch"], source="host")
    ]
    arch_list = torch_arch_list(torch) if kind in ("cuda", "rocm") else []
    physical = lock_host.physical_devices(kind)
    for device in devices:
        if physical is not None and device["type"] == kind and device["index"] < len(physical):
            device["physical"] = physical[device["index"]]
        device["torch_build_covers"] = torch_build_covers(device["arch"], arch_list)
    return devices
