"""kernel_probe.detect.torchbuild: what torch was built with, its DNN and collectives libraries, the math flags."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from kernel_probe.detect import torchbuild
from tests.kernel_probe.detect.cases import CPU, H100, MI250X, MPS, fake_torch


def test_torch_build_on_this_machine():
    import torch

    t = torchbuild.detect_torch_build(torch)
    assert t["version"] == torch.__version__
    assert t["build"] == torchbuild.build_kind(torch)
    assert set(t["math"]) == {key for key, _ in torchbuild.MATH_FLAGS}
    assert t["math"]["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert t["math"]["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
    assert t["arch_list"] == torch.cuda.get_arch_list()
    json.dumps(t)


def test_torch_build_follows_math_flags():
    import torch

    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert torchbuild.detect_torch_build(torch)["math"]["float32_matmul_precision"] == "medium"
    finally:
        torch.set_float32_matmul_precision(old)


def test_rocm_build_names_miopen_and_rccl():
    torch = fake_torch(**MI250X)
    torch.cuda.nccl = SimpleNamespace(version=lambda: (2, 18, 3))
    torch._C = SimpleNamespace(
        _cudnn=SimpleNamespace(getRuntimeVersion=lambda: (3, 2, 0), getCompileVersion=lambda: (3, 2, 0))
    )
    torch.backends.cudnn = SimpleNamespace(is_available=lambda: True)
    t = torchbuild.detect_torch_build(torch)
    assert t["build"] == "rocm"
    assert t["dnn"] == {"library": "miopen", "version": "3.2.0", "compiled": "3.2.0", "available": True, "error": None}
    assert t["collectives"] == {"library": "rccl", "version": "2.18.3", "error": None}
    assert t["arch_list"] == ["gfx90a", "gfx942"]


@pytest.mark.parametrize("machine, kind", [(H100, "cuda"), (MI250X, "rocm"), (CPU, "cpu"), (MPS, "cpu")])
def test_build_kind(machine, kind):
    assert torchbuild.build_kind(fake_torch(**machine)) == kind
