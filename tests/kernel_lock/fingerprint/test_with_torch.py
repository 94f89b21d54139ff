"""kernel_lock.fingerprint.current: the fingerprint as torch reports it, on fake torch modules
that describe a ROCm, CUDA, MPS, XPU or CPU machine (no accelerator needed), and on the real CPU
torch."""

from __future__ import annotations

import builtins
import platform
import sys
from types import SimpleNamespace as NS

import pytest

from kernel_lock import fingerprint, host
from kernel_lock.errors import DeviceVisibilityError, KernelUnavailable


@pytest.fixture(autouse=True)
def machine(monkeypatch):
    """No visibility variable, no NVML, a known driver and CPU: what the fakes do not describe."""
    for name in (
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        *fingerprint.NUMERICS_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(host, "nvml_primary", lambda: None)
    monkeypatch.setattr(
        host,
        "driver_version",
        lambda device: {"cuda": "550.54.15", "rocm": "6.8.5"}.get(device, ""),
    )
    monkeypatch.setattr(host, "cpu_vendor", lambda: "amd")
    monkeypatch.setattr(host, "cpu_name", lambda: "AMD EPYC 7A53")
    monkeypatch.setattr(host, "cpu_microarch", lambda: "zen3")


def _cuda(count=2, **props):
    return NS(
        is_available=lambda: count > 0,
        device_count=lambda: count,
        get_device_properties=lambda i: NS(**props),
        get_device_capability=lambda i: (9, 0),
        get_device_name=lambda i: "NVIDIA H100 80GB HBM3",
    )


def fake_torch(
    *, hip=None, cuda=None, rocm=None, cuda_mod=None, mps=False, xpu=None, version="2.7.1+rocm6.2.4"
):
    return NS(
        __version__=version,
        version=NS(hip=hip, cuda=cuda, rocm=rocm),
        cuda=cuda_mod,
        backends=NS(mps=NS(is_available=lambda: mps)),
        xpu=xpu,
    )


MI250X = _cuda(count=8, name="AMD Instinct MI250X", gcnArchName="gfx90a:sramecc+:xnack-")
CPU = {
    "type": "cpu",
    "vendor": "amd",
    "name": "AMD EPYC 7A53",
    "arch": "",
    "count": 1,
    "driver": "",
}

# (the fake torch, the device facts)
DEVICES = [
    (
        fake_torch(hip="6.2.41134-65d174c3e", cuda_mod=MI250X),
        {
            "type": "rocm",
            "vendor": "amd",
            "name": "AMD Instinct MI250X",
            "arch": "gfx90a",
            "features": "sramecc+:xnack-",
            "count": 8,
            "driver": "6.8.5",
        },
    ),
    (fake_torch(hip="6.2", cuda_mod=_cuda(count=0)), CPU),  # a ROCm build without a GPU
    (
        fake_torch(cuda="12.4", cuda_mod=_cuda(count=4)),  # NVML absent: torch says
        {
            "type": "cuda",
            "vendor": "nvidia",
            "name": "NVIDIA H100 80GB HBM3",
            "arch": "sm_90",
            "count": 4,
            "driver": "550.54.15",
        },
    ),
    (fake_torch(cuda="12.4", cuda_mod=_cuda(count=0)), CPU),
    (
        fake_torch(cuda=None, cuda_mod=_cuda(count=4)),
        CPU,
    ),  # a CPU build: its cuda module is not asked
    (
        fake_torch(mps=True),
        {
            "type": "mps",
            "vendor": "apple",
            "name": "Apple MPS",
            "arch": "",
            "count": 1,
            "driver": "",
        },
    ),
    (
        fake_torch(
            xpu=NS(
                is_available=lambda: True,
                device_count=lambda: 2,
                get_device_properties=lambda i: NS(name="Intel Max 1550", driver_version="1.3"),
            )
        ),
        {
            "type": "xpu",
            "vendor": "intel",
            "name": "Intel Max 1550",
            "arch": "",
            "count": 2,
            "driver": "1.3",
        },
    ),
    (fake_torch(xpu=NS(is_available=lambda: True, device_count=lambda: 0)), CPU),
    (fake_torch(xpu=NS()), CPU),  # an xpu module without is_available
    (fake_torch(), CPU),
]


@pytest.mark.parametrize("torch,facts", DEVICES)
def test_device_facts(torch, facts):
    assert fingerprint.device_facts(torch) == facts


def test_nvml_is_asked_first_on_a_cuda_build(monkeypatch):
    first = {"name": "NVIDIA A100-SXM4-80GB", "arch": "sm_80", "count": 8, "driver": "535.1"}
    monkeypatch.setattr(host, "nvml_primary", lambda: first)
    torch = fake_torch(cuda="12.4", cuda_mod=_cuda(count=4))
    assert fingerprint.device_facts(torch) == {"type": "cuda", "vendor": "nvidia", **first}


def test_contradicting_rocm_visibility_is_an_error(monkeypatch):
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0,1")
    with pytest.raises(DeviceVisibilityError, match="HIP_VISIBLE_DEVICES"):
        fingerprint.device_facts(fake_torch(hip="6.2", cuda_mod=MI250X))


def test_current_of_a_fake_rocm_torch(monkeypatch):
    monkeypatch.setenv("HSA_XNACK", "1")
    torch = fake_torch(hip="6.2.41134-65d174c3e", rocm="6.2.4", cuda_mod=MI250X)
    got = fingerprint.current(torch)
    assert list(got) == list(fingerprint.FIELDS)
    assert got == {
        "python": platform.python_version(),
        "os": sys.platform,
        "arch": platform.machine().lower(),
        "cpu-microarch": "zen3",
        "torch": "2.7.1",
        "torch-cuda": "",
        "torch-hip": "6.2.41134-65d174c3e",
        "torch-rocm": "6.2.4",
        "device-type": "rocm",
        "device-vendor": "amd",
        "device-name": "AMD Instinct MI250X",
        "device-arch": "gfx90a",
        "device-features": "sramecc+:xnack-",
        "device-count": 8,
        "driver": "6.8.5",
        "numerics-env": "HSA_XNACK=1",
    }


def test_current_takes_the_device_reader_it_is_given():
    got = fingerprint.current(
        fake_torch(version="2.6.0"),
        device=lambda t: {
            "type": "cuda",
            "vendor": "nvidia",
            "name": "x",
            "arch": "sm_90",
            "count": "2",
        },
    )
    assert got["device-count"] == 2 and got["device-features"] == "" and got["driver"] == ""
    assert got["torch"] == "2.6.0" and got["torch-hip"] == "" and got["torch-rocm"] == ""


def test_current_of_the_installed_torch():
    import torch

    got = fingerprint.current()
    assert got["torch"] == torch.__version__.split("+")[0] and got["device-type"] in (
        "cpu",
        "cuda",
        "rocm",
        "mps",
        "xpu",
    )
    assert fingerprint.import_torch() is torch


@pytest.mark.parametrize(
    "error", [ImportError("libtorch_cpu.so: cannot open"), OSError("bad ELF"), RuntimeError("x")]
)
def test_a_torch_that_fails_to_import(monkeypatch, error):
    real = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "torch":
            raise error
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(KernelUnavailable) as exc:
        fingerprint.import_torch()
    assert exc.value.problem == f"`import torch` fails here: {type(error).__name__}: {error}"
    assert exc.value.key == "environment.torch" and "reinstall torch" in exc.value.fix
