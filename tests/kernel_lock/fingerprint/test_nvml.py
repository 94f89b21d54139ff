"""kernel_lock.host (NVML): NVIDIA's devices through a fake pynvml (no GPU, no NVML needed)."""

from __future__ import annotations

import sys
import types

import pytest

from kernel_lock import host

UUIDS = ["GPU-aaaa1111", "GPU-bbbb2222"]


def fake_pynvml(
    *, fail: str | None = None, uuids=UUIDS, bytes_text=False, cuda=12040
) -> types.ModuleType:
    """A pynvml whose function named ``fail`` raises; two H100s by default."""
    m = types.ModuleType("pynvml")
    m.calls = []

    def fn(name, result):
        def call(*args):
            m.calls.append(name)
            if name == fail:
                raise RuntimeError(f"NVMLError in {name}")
            return result(*args) if callable(result) else result

        setattr(m, name, call)

    text = (lambda s: s.encode()) if bytes_text else (lambda s: s)
    fn("nvmlInit", None)
    fn("nvmlShutdown", None)
    fn("nvmlDeviceGetCount", len(uuids))
    fn("nvmlDeviceGetHandleByIndex", lambda i: i)
    fn("nvmlDeviceGetUUID", lambda h: text(uuids[h]))
    fn("nvmlSystemGetDriverVersion", text("550.54.15"))
    fn("nvmlSystemGetCudaDriverVersion_v2", cuda)
    fn("nvmlDeviceGetCudaComputeCapability", lambda h: (9, 0) if h == 0 else (8, 0))
    fn("nvmlDeviceGetMemoryInfo", lambda h: types.SimpleNamespace(total=(80 + h) << 30))
    fn("nvmlDeviceGetName", lambda h: text(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"][h]))
    return m


@pytest.fixture
def pynvml(monkeypatch):
    def install(module):
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


@pytest.mark.parametrize("bytes_text", [False, True])  # older nvidia-ml-py returns bytes
def test_every_device_in_cuda_order(pynvml, bytes_text):
    m = pynvml(fake_pynvml(bytes_text=bytes_text))
    devices = host.nvml_devices()
    assert devices == [
        {
            "index": 0,
            "nvml_index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "arch": "sm_90",
            "capability": [9, 0],
            "uuid": "GPU-aaaa1111",
            "memory_bytes": 80 << 30,
            "driver": "550.54.15",
            "cuda_driver": "12.4",
        },
        {
            "index": 1,
            "nvml_index": 1,
            "name": "NVIDIA A100-SXM4-80GB",
            "arch": "sm_80",
            "capability": [8, 0],
            "uuid": "GPU-bbbb2222",
            "memory_bytes": 81 << 30,
            "driver": "550.54.15",
            "cuda_driver": "12.4",
        },
    ]
    assert m.calls[0] == "nvmlInit" and m.calls[-1] == "nvmlShutdown"
    assert host.nvml_primary() == {
        "name": "NVIDIA H100 80GB HBM3",
        "arch": "sm_90",
        "count": 2,
        "driver": "550.54.15",
    }


@pytest.mark.parametrize(
    "visible,order",
    [
        ("1", [1]),
        ("1,0", [1, 0]),
        ("GPU-bbbb", [1]),
        ("0,7", [0]),
        ("", None),
        ("MIG-xyz", None),
        ("0,0", None),
    ],
)
def test_cuda_visible_devices_orders_and_hides(pynvml, monkeypatch, visible, order):
    pynvml(fake_pynvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    devices = host.nvml_devices()
    if order is None:
        assert devices is None  # nothing visible, or an uncertain reading: the caller asks torch
    else:
        assert [d["nvml_index"] for d in devices] == order and [
            d["index"] for d in devices
        ] == list(range(len(order)))


@pytest.mark.parametrize(
    "fail",
    [
        "nvmlInit",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlSystemGetDriverVersion",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetName",
    ],
)
def test_any_failure_is_none_and_nvml_is_shut_down(pynvml, fail):
    m = pynvml(fake_pynvml(fail=fail))
    assert host.nvml_devices() is None and host.nvml_primary() is None
    assert ("nvmlShutdown" in m.calls) is (fail != "nvmlInit")


@pytest.mark.parametrize(
    "fail,key,value",
    [
        ("nvmlSystemGetCudaDriverVersion_v2", "cuda_driver", ""),
        ("nvmlDeviceGetMemoryInfo", "memory_bytes", None),
    ],
)
def test_optional_facts_left_out(pynvml, fail, key, value):
    pynvml(fake_pynvml(fail=fail))
    devices = host.nvml_devices()
    assert (
        len(devices) == 2
        and all(d[key] == value for d in devices)
        and devices[0]["arch"] == "sm_90"
    )


def test_a_failing_shutdown_is_ignored(pynvml):
    pynvml(fake_pynvml(fail="nvmlShutdown"))
    assert len(host.nvml_devices()) == 2


@pytest.mark.parametrize(
    "cuda,text", [(12040, "12.4"), (11080, "11.8"), (13000, "13.0"), (12090, "12.9")]
)
def test_cuda_driver_version(pynvml, cuda, text):
    pynvml(fake_pynvml(cuda=cuda))
    assert host.nvml_devices()[0]["cuda_driver"] == text


def test_no_pynvml_or_no_device(pynvml):
    pynvml(None)  # not installed: importing it raises
    assert host.nvml_devices() is None and host.nvml_primary() is None
    pynvml(fake_pynvml(uuids=[]))
    assert host.nvml_devices() is None and host.nvml_primary() is None


def test_the_processes_computing_on_the_first_visible_gpu(pynvml, monkeypatch):
    """What the probe's timing records as other work on the GPU (nvidia-smi's process list)."""
    m = fake_pynvml()
    procs = {0: [11, 12], 1: [13]}
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=p) for p in procs[h]
    ]
    pynvml(m)
    assert host.nvml_compute_pids() == [11, 12]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", UUIDS[1])  # the second one is CUDA's first
    assert host.nvml_compute_pids() == [13]
    pynvml(fake_pynvml(fail="nvmlInit"))
    assert host.nvml_compute_pids() is None  # NVML cannot say: nothing recorded
