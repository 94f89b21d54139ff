"""kernel_probe.detect.accelerators: every device as data (simulated machines, NVML,
CUDA_VISIBLE_DEVICES), and whether torch's build carries code for a device."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from kernel_lock import fingerprint, host
from kernel_probe.detect import accelerators
from tests.kernel_probe.detect.cases import CPU, H100, MI250X, MPS, fake_torch

pytestmark = pytest.mark.usefixtures("no_nvml")


REAL_NVML_DEVICES = host.nvml_devices


@pytest.mark.parametrize(
    "machine, kind, vendor, arch, count",
    [
        (H100, "cuda", "nvidia", "sm_90", 4),
        (MI250X, "rocm", "amd", "gfx90a", 8),
        (MPS, "mps", "apple", "", 1),
        (CPU, "cpu", None, "", 1),
    ],
    ids=["cuda-h100", "rocm-mi250x", "mps", "cpu"],
)
def test_simulated_machines_vendor_and_arch(machine, kind, vendor, arch, count):
    torch = fake_torch(**machine)
    primary = fingerprint.device_facts(torch)
    devices = accelerators.detect_accelerators(torch, primary, nvml=lambda: None)
    assert primary["type"] == kind and primary["arch"] == arch and primary["count"] == count
    assert len(devices) == count
    assert {d["type"] for d in devices} == {kind}
    assert {d["arch"] for d in devices} == {arch}
    if vendor is not None:
        assert primary["vendor"] == vendor and {d["vendor"] for d in devices} == {vendor}
    else:  # the CPU vendor is this host's CPU vendor (archspec, else /proc/cpuinfo), never a GPU's
        assert primary["vendor"] == host.cpu_vendor() and primary["vendor"] not in (
            "nvidia",
            "apple",
        )
    fp = fingerprint.current(torch, device=lambda _t: primary)
    assert fp["device-type"] == kind and fp["device-arch"] == arch


def test_mi250x_is_not_taken_for_hopper():
    torch = fake_torch(**MI250X)
    primary = fingerprint.device_facts(torch)
    devices = accelerators.detect_accelerators(torch, primary, nvml=lambda: None)
    first = devices[0]
    # capability (9, 0) is Hopper's too: nothing about this device may say sm_90 or nvidia
    assert first["arch"] == "gfx90a" and first["arch"] != "sm_90"
    assert first["vendor"] == "amd" and first["type"] == "rocm"
    assert first["capability"] is None
    assert first["gcn_arch_name"] == "gfx90a:sramecc+:xnack-"
    assert any("generic device name" in note for note in first["notes"])
    assert first["torch_build_covers"]["covered"] is True
    assert first["torch_build_covers"]["how"] == "code-object"
    fp = fingerprint.current(torch, device=lambda _t: primary)
    assert fp["torch-hip"] == MI250X["hip"] and fp["torch-cuda"] == ""


def test_h100_details_and_coverage():
    torch = fake_torch(**H100)
    devices = accelerators.detect_accelerators(
        torch, fingerprint.device_facts(torch), nvml=lambda: None
    )
    assert devices[0]["capability"] == [9, 0]
    assert devices[0]["multiprocessors"] == 132
    assert devices[0]["memory_bytes"] == 64 * 2**30
    assert devices[0]["torch_build_covers"] == {
        "covered": True,
        "how": "sass",
        "detail": "torch ships SASS for sm_90",
    }


def test_nvml_answers_without_touching_torch_cuda(monkeypatch):
    """With NVML, neither device_facts nor the device list calls
    torch.cuda.get_device_properties."""
    listed = [
        {
            "index": 0,
            "nvml_index": 2,
            "name": "NVIDIA GH200 120GB",
            "arch": "sm_90",
            "capability": [9, 0],
            "uuid": "GPU-1234",
            "memory_bytes": 96 * 2**30,
            "driver": "565.57.01",
            "cuda_driver": "12.7",
        }
    ]
    monkeypatch.setattr(host, "nvml_devices", lambda: listed)
    torch = fake_torch(cuda="12.6")  # no devices: any torch.cuda device query raises AssertionError
    primary = fingerprint.device_facts(torch)
    assert primary == {
        "type": "cuda",
        "vendor": "nvidia",
        "name": "NVIDIA GH200 120GB",
        "arch": "sm_90",
        "count": 1,
        "driver": "565.57.01",
    }
    devices = accelerators.detect_accelerators(torch, primary, nvml=lambda: listed)
    assert devices[0]["source"] == "nvml" and devices[0]["cuda_driver"] == "12.7"
    assert devices[0]["torch_build_covers"]["how"] == "unknown"  # this fake torch lists no arch


def fake_pynvml(gpus, *, init_error=None):
    """An nvidia-ml-py stand-in: ``gpus`` are (name, (major, minor), uuid, memory) by NVML index."""
    calls = []

    def init():
        calls.append("init")
        if init_error:
            raise init_error

    return calls, SimpleNamespace(
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: gpus[h][2],
        nvmlDeviceGetName=lambda h: gpus[h][0].encode(),  # old bindings return bytes
        nvmlDeviceGetCudaComputeCapability=lambda h: gpus[h][1],
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=gpus[h][3]),
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlSystemGetCudaDriverVersion_v2=lambda: 12040,
    )


GPUS = [
    ("NVIDIA A100-SXM4-40GB", (8, 0), "GPU-aaaa", 40 * 2**30),
    ("NVIDIA H100 80GB HBM3", (9, 0), "GPU-bbbb", 80 * 2**30),
]


def test_nvml_devices_follow_cuda_visible_devices(monkeypatch):
    calls, module = fake_pynvml(GPUS)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bb,GPU-a")
    devices = REAL_NVML_DEVICES()
    assert [(d["index"], d["nvml_index"], d["arch"]) for d in devices] == [
        (0, 1, "sm_90"),
        (1, 0, "sm_80"),
    ]
    assert (
        devices[0]["name"] == "NVIDIA H100 80GB HBM3" and devices[0]["memory_bytes"] == 80 * 2**30
    )
    assert devices[0]["driver"] == "550.54.15" and devices[0]["cuda_driver"] == "12.4"
    assert calls == ["init", "shutdown"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert REAL_NVML_DEVICES() is None  # nothing visible: let torch answer (it will say: no GPU)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bb,0")
    # UUIDs and ordinals mixed: not read with certainty, torch answers
    assert REAL_NVML_DEVICES() is None


def test_nvml_failures_are_not_errors(monkeypatch):
    _, module = fake_pynvml(GPUS, init_error=RuntimeError("NVMLError_LibraryNotFound"))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert REAL_NVML_DEVICES() is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import raises
    assert REAL_NVML_DEVICES() is None


def test_xpu_machine():
    torch = fake_torch(
        xpu=[
            SimpleNamespace(
                name="Intel(R) Data Center GPU Max 1550",
                driver_version="1.3",
                total_memory=128 * 2**30,
            )
        ]
    )
    primary = fingerprint.device_facts(torch)
    devices = accelerators.detect_accelerators(torch, primary, nvml=lambda: None)
    assert (
        primary["vendor"] == "intel"
        and devices[0]["type"] == "xpu"
        and devices[0]["driver"] == "1.3"
    )


@pytest.mark.parametrize(
    "device, arch_list, covered, how",
    [
        ("sm_90", ["sm_80", "sm_90"], True, "sass"),
        ("sm_86", ["sm_80"], True, "binary-compatible"),
        ("sm_89", ["sm_80", "sm_86"], True, "binary-compatible"),
        ("sm_90", ["sm_70", "sm_80", "compute_80"], True, "ptx-jit"),
        ("sm_120", ["sm_90", "sm_100", "compute_100"], True, "ptx-jit"),
        ("sm_90", ["sm_70", "sm_80"], False, "none"),
        ("sm_80", ["sm_90"], False, "none"),
        (
            "sm_100",
            ["sm_90a", "compute_90a"],
            False,
            "none",
        ),  # arch-specific code never carries over
        ("sm_75", ["sm_80", "compute_80"], False, "none"),  # PTX of a newer arch cannot JIT down
        ("gfx90a", ["gfx90a", "gfx942"], True, "code-object"),
        ("gfx90a", ["gfx90a:xnack-"], True, "code-object"),
        ("gfx90a", ["gfx942", "gfx950"], False, "none"),
        ("gfx90a", ["gfx9-generic"], None, "unknown"),
        ("sm_90", [], None, "unknown"),
        ("", ["sm_90"], None, "not-applicable"),
    ],
)
def test_torch_build_covers(device, arch_list, covered, how):
    verdict = accelerators.torch_build_covers(device, arch_list)
    assert (verdict["covered"], verdict["how"]) == (covered, how)
    assert verdict["detail"]
    if how == "ptx-jit":
        assert "PTX JIT" in verdict["detail"]


@pytest.mark.parametrize(
    "visible, uuids, expected",
    [
        (None, ["GPU-a", "GPU-b"], [0, 1]),
        ("1", ["GPU-a", "GPU-b"], [1]),
        ("1,0", ["GPU-a", "GPU-b"], [1, 0]),
        ("", ["GPU-a", "GPU-b"], []),
        ("-1", ["GPU-a", "GPU-b"], []),
        ("0,7,1", ["GPU-a", "GPU-b"], [0]),  # CUDA stops at the first invalid entry
        ("GPU-bb", ["GPU-aa11", "GPU-bb22"], [1]),
        ("GPU-", ["GPU-aa11", "GPU-bb22"], []),  # an ambiguous prefix is invalid
        ("0,0", ["GPU-a"], []),  # a repeated ordinal means no device
        ("0gpu", ["GPU-a"], [0]),  # CUDA reads the leading integer
        ("MIG-12345", ["GPU-a"], None),
    ],
)
def test_visible_nvml_indices(visible, uuids, expected):
    assert host.visible_nvml_indices(visible, uuids) == expected


# ---- torch's arch list -------------------------------------------------------------------------
def _raises():
    raise RuntimeError("CUDA driver version is insufficient")


@pytest.mark.parametrize(
    "torch, expected",
    [
        (
            SimpleNamespace(cuda=SimpleNamespace(get_arch_list=lambda: ["sm_80", "sm_90"])),
            ["sm_80", "sm_90"],
        ),
        (SimpleNamespace(cuda=SimpleNamespace(get_arch_list=lambda: ("gfx90a",))), ["gfx90a"]),
        (SimpleNamespace(cuda=SimpleNamespace(get_arch_list=lambda: [])), []),
        (
            SimpleNamespace(cuda=SimpleNamespace(get_arch_list=_raises)),
            [],
        ),  # a broken build: unknown
        (SimpleNamespace(cuda=SimpleNamespace()), []),  # an old torch without the call
        (SimpleNamespace(), []),
    ],
)
def test_torch_arch_list(torch, expected):
    assert accelerators.torch_arch_list(torch) == expected


@pytest.mark.parametrize(
    "device, arch_list, how, detail",
    [
        ("sm_86", ["sm_80", "sm_86"], "sass", "torch ships SASS for sm_86"),
        (
            "sm_89",
            ["sm_80", "sm_86", "sm_90"],
            "binary-compatible",
            "runs sm_86 SASS (same major, older minor)",
        ),
        (
            "sm_90",
            ["compute_70", "compute_80", "sm_75"],
            "ptx-jit",
            "covered via PTX JIT from compute_80",
        ),
        (
            "sm_90",
            ["sm_90-future", "sm_80"],
            "none",
            "torch was built for sm_90-future, sm_80, not sm_90",
        ),
        ("sm_90", ["sm_80"], "none", "no kernel image is available"),
        ("gfx942", ["gfx90a"], "none", "'HIP error: invalid device function'"),
        ("compute_90", ["sm_90"], "unknown", "unrecognised device arch 'compute_90'"),
        ("ampere", ["sm_80"], "unknown", "unrecognised device arch 'ampere'"),
    ],
)
def test_torch_build_covers_says_why(device, arch_list, how, detail):
    verdict = accelerators.torch_build_covers(device, arch_list)
    assert verdict["how"] == how and detail in verdict["detail"]
