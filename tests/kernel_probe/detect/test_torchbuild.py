"""kernel_probe.detect.accelerators (the torch build): what torch was built with, its DNN and
collectives libraries, the math flags."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from kernel_probe.detect import accelerators
from tests.kernel_probe.detect.cases import CPU, H100, MI250X, MPS, fake_torch


def test_torch_build_on_this_machine():
    import torch

    t = accelerators.detect_torch_build(torch)
    assert t["version"] == torch.__version__
    assert t["build"] == accelerators.build_kind(torch)
    assert set(t["math"]) == {key for key, _ in accelerators.MATH_FLAGS}
    assert t["math"]["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert t["math"]["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
    assert t["arch_list"] == torch.cuda.get_arch_list()
    json.dumps(t)


def test_torch_build_follows_math_flags():
    import torch

    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert (
            accelerators.detect_torch_build(torch)["math"]["float32_matmul_precision"] == "medium"
        )
    finally:
        torch.set_float32_matmul_precision(old)


def test_rocm_build_names_miopen_and_rccl():
    torch = fake_torch(**MI250X)
    torch.cuda.nccl = SimpleNamespace(version=lambda: (2, 18, 3))
    torch._C = SimpleNamespace(
        _cudnn=SimpleNamespace(
            getRuntimeVersion=lambda: (3, 2, 0), getCompileVersion=lambda: (3, 2, 0)
        )
    )
    torch.backends.cudnn = SimpleNamespace(is_available=lambda: True)
    t = accelerators.detect_torch_build(torch)
    assert t["build"] == "rocm"
    assert t["dnn"] == {
        "library": "miopen",
        "version": "3.2.0",
        "compiled": "3.2.0",
        "available": True,
        "error": None,
    }
    assert t["collectives"] == {"library": "rccl", "version": "2.18.3", "error": None}
    assert t["arch_list"] == ["gfx90a", "gfx942"]


@pytest.mark.parametrize(
    "machine, kind", [(H100, "cuda"), (MI250X, "rocm"), (CPU, "cpu"), (MPS, "cpu")]
)
def test_build_kind(machine, kind):
    assert accelerators.build_kind(fake_torch(**machine)) == kind


# ---- the DNN and collectives libraries ---------------------------------------------------------
def _cudnn_torch(machine, *, available=lambda: True, runtime=(9, 1, 0), compiled=(9, 0, 0)):
    torch = fake_torch(**machine)
    torch.backends.cudnn = SimpleNamespace(is_available=available)
    torch._C = SimpleNamespace(
        _cudnn=SimpleNamespace(
            getRuntimeVersion=lambda: runtime, getCompileVersion=lambda: compiled
        )
    )
    return torch


def _raise(exc):
    def raising(*_a):
        raise exc

    return raising


@pytest.mark.parametrize(
    "torch, expected",
    [
        (
            _cudnn_torch(H100),
            {
                "library": "cudnn",
                "version": "9.1.0",
                "compiled": "9.0.0",
                "available": True,
                "error": None,
            },
        ),
        (
            _cudnn_torch(H100, available=lambda: False),  # not loaded: its versions are not asked
            {
                "library": "cudnn",
                "version": None,
                "compiled": None,
                "available": False,
                "error": None,
            },
        ),
        (
            _cudnn_torch(H100, available=_raise(OSError("libcudnn.so.9: cannot open"))),
            {
                "library": "cudnn",
                "version": None,
                "compiled": None,
                "available": False,
                "error": "OSError: libcudnn.so.9: cannot open",
            },
        ),
        (
            # a version that is not numbers: unknown, not an error
            _cudnn_torch(H100, runtime=("x",)),
            {
                "library": "cudnn",
                "version": None,
                "compiled": "9.0.0",
                "available": True,
                "error": None,
            },
        ),
        (
            fake_torch(**CPU),  # no torch.backends.cudnn at all
            {
                "library": "cudnn",
                "version": None,
                "compiled": None,
                "available": False,
                "error": None,
            },
        ),
    ],
    ids=["loaded", "not-available", "loader-error", "odd-version", "absent"],
)
def test_dnn_library(torch, expected):
    assert accelerators.dnn_library(torch) == expected


def test_dnn_library_reports_a_version_call_that_fails():
    torch = _cudnn_torch(MI250X)
    torch._C._cudnn.getRuntimeVersion = _raise(RuntimeError("MIOpen not loaded"))
    out = accelerators.dnn_library(torch)
    assert out["library"] == "miopen" and out["error"] == "RuntimeError: MIOpen not loaded"


def _nccl_torch(machine, version):
    torch = fake_torch(**machine)
    torch.cuda.nccl = SimpleNamespace(version=version)
    return torch


@pytest.mark.parametrize(
    "torch, expected",
    [
        (
            _nccl_torch(H100, lambda: (2, 21, 5)),
            {"library": "nccl", "version": "2.21.5", "error": None},
        ),
        (
            _nccl_torch(MI250X, lambda: (2, 18, 3)),
            {"library": "rccl", "version": "2.18.3", "error": None},
        ),
        (
            _nccl_torch(H100, _raise(RuntimeError("built without NCCL"))),
            {"library": "nccl", "version": None, "error": "RuntimeError: built without NCCL"},
        ),
        (
            _nccl_torch(CPU, lambda: (2, 21, 5)),
            {"library": "nccl", "version": None, "error": None},
        ),  # not asked
        (fake_torch(**MPS), {"library": "nccl", "version": None, "error": None}),
    ],
    ids=["nccl", "rccl", "fails", "cpu-build", "mps"],
)
def test_collectives_library(torch, expected):
    assert accelerators.collectives_library(torch) == expected


def test_collectives_library_imports_torch_cuda_nccl_when_not_loaded():
    torch = fake_torch(**H100)
    torch.__name__ = "no_such_torch_here"
    out = accelerators.collectives_library(torch)
    assert out["version"] is None and out["error"].startswith("ModuleNotFoundError: ")


# ---- flags and variables -----------------------------------------------------------------------
def test_an_unanswerable_flag_is_none_and_an_enum_reads_as_its_name():
    torch = fake_torch(**H100)
    torch.get_float32_matmul_precision = _raise(RuntimeError("no CUDA"))
    torch.backends.cuda = SimpleNamespace(
        preferred_blas_library=lambda: SimpleNamespace(name="Cublaslt")
    )
    torch.are_deterministic_algorithms_enabled = lambda: True
    math = accelerators.detect_torch_build(torch)["math"]
    assert math["float32_matmul_precision"] is None
    assert math["preferred_blas_library"] == "Cublaslt"
    assert math["deterministic_algorithms"] is True
    assert math["cudnn_benchmark"] is None  # this fake torch has no backends.cudnn


def test_the_variables_that_change_numerics_are_recorded(monkeypatch):
    for name in accelerators.NUMERICS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "9.0.10")
    monkeypatch.setenv("SOME_OTHER_VARIABLE", "x")
    env = accelerators.detect_torch_build(fake_torch(**MI250X))["environment"]
    assert env == {"NVIDIA_TF32_OVERRIDE": "0", "HSA_OVERRIDE_GFX_VERSION": "9.0.10"}


@pytest.mark.parametrize(
    "version, kind",
    [
        (SimpleNamespace(cuda="12.4", hip="6.2"), "rocm"),  # hip wins: ROCm builds may set both
        (SimpleNamespace(cuda=None, hip=None, xpu="20250001"), "xpu"),
        (SimpleNamespace(), "cpu"),
        (None, "cpu"),
    ],
)
def test_build_kind_from_torch_version(version, kind):
    assert accelerators.build_kind(SimpleNamespace(version=version)) == kind
