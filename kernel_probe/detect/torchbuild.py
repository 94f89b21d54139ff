"""What torch was built with, which vendor libraries it loaded, and the switches that change
numerics.

Nothing here starts CUDA: versions come from ``torch.version`` and the loaded cuDNN/MIOpen and
NCCL/RCCL libraries, flags from ``torch.backends``. On ROCm the "cudnn" backend is MIOpen and
"nccl" is RCCL; the report names the real library.
"""

from __future__ import annotations

import os
from typing import Any

from kernel_probe.detect.accelerators import torch_arch_list

# (report key, path under the torch module; a trailing "()" calls it). Absent on a given torch
# version -> None. Each of these changes results or their reproducibility.
MATH_FLAGS: tuple[tuple[str, str], ...] = (
    ("float32_matmul_precision", "get_float32_matmul_precision()"),
    ("matmul_allow_tf32", "backends.cuda.matmul.allow_tf32"),
    ("cudnn_allow_tf32", "backends.cudnn.allow_tf32"),
    ("matmul_fp32_precision", "backends.cuda.matmul.fp32_precision"),
    ("cudnn_fp32_precision", "backends.cudnn.fp32_precision"),
    (
        "matmul_allow_fp16_reduced_precision_reduction",
        "backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
    ),
    (
        "matmul_allow_bf16_reduced_precision_reduction",
        "backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
    ),
    ("matmul_allow_fp16_accumulation", "backends.cuda.matmul.allow_fp16_accumulation"),
    ("deterministic_algorithms", "are_deterministic_algorithms_enabled()"),
    ("deterministic_warn_only", "is_deterministic_algorithms_warn_only_enabled()"),
    ("cudnn_enabled", "backends.cudnn.enabled"),
    ("cudnn_deterministic", "backends.cudnn.deterministic"),
    ("cudnn_benchmark", "backends.cudnn.benchmark"),
    ("preferred_blas_library", "backends.cuda.preferred_blas_library()"),
    ("flash_sdp_enabled", "backends.cuda.flash_sdp_enabled()"),
    ("mem_efficient_sdp_enabled", "backends.cuda.mem_efficient_sdp_enabled()"),
    ("cudnn_sdp_enabled", "backends.cuda.cudnn_sdp_enabled()"),
    ("math_sdp_enabled", "backends.cuda.math_sdp_enabled()"),
)

# Environment variables that change what torch or its kernels compute, or where they run.
NUMERICS_ENV: tuple[str, ...] = (
    "NVIDIA_TF32_OVERRIDE",  # 0 disables TF32 in cuBLAS/cuDNN whatever torch's flags say
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUBLAS_WORKSPACE_CONFIG",  # needed for deterministic cuBLAS
    "CUDA_LAUNCH_BLOCKING",  # a leftover 1 costs a lot of multi-GPU speed
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HSA_OVERRIDE_GFX_VERSION",  # makes a GPU report another gfx arch
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
    "TORCH_CUDNN_SDPA_ENABLED",
    "TORCH_BLAS_PREFER_HIPBLASLT",
    "MIOPEN_USER_DB_PATH",
    "TRITON_CACHE_DIR",
    "FLASH_ATTENTION_TRITON_AMD_ENABLE",
)


def _read(torch: Any, path: str) -> Any:
    call = path.endswith("()")
    obj = torch
    for part in path.removesuffix("()").split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    try:
        value = obj() if call else obj
    except Exception:  # a flag this build cannot answer (e.g. no CUDA): unknown, not an error
        return None
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    name = getattr(value, "name", None)  # enums such as _BlasBackend.Cublas
    return str(name) if name is not None else str(value)


def build_kind(torch: Any) -> str:
    """cuda, rocm, xpu or cpu: the GPU runtime torch was built for (MPS is in every macOS build)."""
    version = getattr(torch, "version", None)
    if getattr(version, "hip", None):
        return "rocm"
    if getattr(version, "cuda", None):
        return "cuda"
    if getattr(version, "xpu", None):
        return "xpu"
    return "cpu"


def _dotted(parts: Any) -> str | None:
    try:
        return ".".join(str(int(p)) for p in tuple(parts)[:3])
    except (TypeError, ValueError):
        return None


def dnn_library(torch: Any) -> dict[str, Any]:
    """cuDNN (or MIOpen on ROCm): the version actually loaded, and the one torch was compiled
    against."""
    library = "miopen" if build_kind(torch) == "rocm" else "cudnn"
    out: dict[str, Any] = {
        "library": library,
        "version": None,
        "compiled": None,
        "available": False,
        "error": None,
    }
    backend = getattr(getattr(torch, "backends", None), "cudnn", None)
    is_available = getattr(backend, "is_available", None)
    try:
        out["available"] = bool(is_available()) if is_available else False
    except Exception as exc:  # a loader problem is exactly the kind of fact this report is for
        out["error"] = f"{type(exc).__name__}: {exc}"
    cudnn = getattr(getattr(torch, "_C", None), "_cudnn", None)
    if cudnn is not None and out["available"]:
        try:
            out["version"] = _dotted(cudnn.getRuntimeVersion())
            out["compiled"] = _dotted(cudnn.getCompileVersion())
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def collectives_library(torch: Any) -> dict[str, Any]:
    """NCCL (RCCL on ROCm) version torch uses; None on builds without it."""
    library = "rccl" if build_kind(torch) == "rocm" else "nccl"
    out: dict[str, Any] = {"library": library, "version": None, "error": None}
    if build_kind(torch) not in ("cuda", "rocm"):
        return out
    nccl = getattr(getattr(torch, "cuda", None), "nccl", None)
    if nccl is None:
        try:
            import importlib

            nccl = importlib.import_module(f"{torch.__name__}.cuda.nccl")
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            return out
    try:
        out["version"] = ".".join(str(p) for p in nccl.version())
    except Exception as exc:  # built without NCCL, or the library failed to load
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def detect_torch_build(torch: Any) -> dict[str, Any]:
    """The torch build's facts: version, location, build kind, CUDA/HIP/ROCm/XPU versions."""
    version = getattr(torch, "version", None)
    return {
        "version": str(getattr(torch, "__version__", "")),
        "location": os.path.dirname(str(getattr(torch, "__file__", "") or "")) or None,
        "build": build_kind(torch),
        "cuda": getattr(version, "cuda", None),
        "hip": getattr(version, "hip", None),
        "rocm": getattr(version, "rocm", None),
        "xpu": getattr(version, "xpu", None),
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
