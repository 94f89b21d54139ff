"""The detection layer (kernel_probe.detect): simulated machines, fake libraries, real metadata."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from importlib import metadata
from types import SimpleNamespace

import pytest

from kernel_lock.fingerprint import host as fp_host
from kernel_lock.fingerprint import nvml as fp_nvml
from kernel_lock.fingerprint import visible as fp_visible
from kernel_lock.fingerprint import with_torch
from kernel_probe.detect import accelerators, host, importcheck, libraries, site, torchbuild
from kernel_probe.detect import report as env_report
from kernel_probe.detect import triton as triton_info
from kernel_probe.detect.libraries import KnownLibrary


# ---- simulated torch modules ----------------------------------------------------------------
def props(name, major=0, minor=0, *, gcn=None, memory=64 * 2**30, sms=110):
    p = SimpleNamespace(name=name, major=major, minor=minor, total_memory=memory, multi_processor_count=sms)
    if gcn is not None:
        p.gcnArchName = gcn
    return p


def fake_torch(*, cuda=None, hip=None, devices=(), arch_list=(), mps=False, xpu=()):
    """A torch-shaped object: enough of torch.version / cuda / backends.mps / xpu for detection."""
    devices = list(devices)

    def no_cuda_init(*_):
        raise AssertionError("this call would initialise CUDA")

    cuda_ns = SimpleNamespace(
        is_available=lambda: bool(devices),
        device_count=lambda: len(devices),
        get_device_properties=(lambda i: devices[i]) if devices else no_cuda_init,
        get_device_capability=(lambda i: (devices[i].major, devices[i].minor)) if devices else no_cuda_init,
        get_device_name=(lambda i: devices[i].name) if devices else no_cuda_init,
        get_arch_list=lambda: list(arch_list),
    )
    xpu_ns = SimpleNamespace(
        is_available=lambda: bool(xpu), device_count=lambda: len(xpu), get_device_properties=lambda i: xpu[i]
    )
    return SimpleNamespace(
        __version__="2.6.0+fake",
        version=SimpleNamespace(cuda=cuda, hip=hip, xpu=None, git_version="abc", debug=False),
        cuda=cuda_ns,
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: mps)),
        xpu=xpu_ns,
    )


H100 = dict(
    cuda="12.4", devices=[props("NVIDIA H100 80GB HBM3", 9, 0, sms=132)] * 4, arch_list=["sm_80", "sm_86", "sm_90"]
)
MI250X = dict(
    hip="6.2.41133-dd7f95766",
    devices=[props("AMD Radeon Graphics", 9, 0, gcn="gfx90a:sramecc+:xnack-")] * 8,
    arch_list=["gfx90a", "gfx942"],
)
MPS = dict(mps=True)
CPU: dict = {}


REAL_NVML_DEVICES = fp_nvml.nvml_devices


@pytest.fixture(autouse=True)
def no_nvml(monkeypatch):
    """Simulations must not see a real NVML that a GPU machine may have."""
    monkeypatch.setattr(fp_nvml, "nvml_devices", lambda: None)


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
    primary = with_torch.device_facts(torch)
    devices = accelerators.detect_accelerators(torch, primary, nvml=lambda: None)
    assert primary["type"] == kind and primary["arch"] == arch and primary["count"] == count
    assert len(devices) == count
    assert {d["type"] for d in devices} == {kind}
    assert {d["arch"] for d in devices} == {arch}
    if vendor is not None:
        assert primary["vendor"] == vendor and {d["vendor"] for d in devices} == {vendor}
    else:  # the CPU vendor is this host's CPU vendor (archspec, else /proc/cpuinfo), never a GPU's
        assert primary["vendor"] == fp_host.cpu_vendor() and primary["vendor"] not in ("nvidia", "apple")
    fp = with_torch.current(torch, device=lambda _t: primary)
    assert fp["device-type"] == kind and fp["device-arch"] == arch


def test_mi250x_is_not_taken_for_hopper():
    torch = fake_torch(**MI250X)
    primary = with_torch.device_facts(torch)
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
    fp = with_torch.current(torch, device=lambda _t: primary)
    assert fp["torch-hip"] == MI250X["hip"] and fp["torch-cuda"] == ""


def test_h100_details_and_coverage():
    torch = fake_torch(**H100)
    devices = accelerators.detect_accelerators(torch, with_torch.device_facts(torch), nvml=lambda: None)
    assert devices[0]["capability"] == [9, 0]
    assert devices[0]["multiprocessors"] == 132
    assert devices[0]["memory_bytes"] == 64 * 2**30
    assert devices[0]["torch_build_covers"] == {"covered": True, "how": "sass", "detail": "torch ships SASS for sm_90"}


def test_nvml_answers_without_touching_torch_cuda(monkeypatch):
    """With NVML, neither device_facts nor the device list calls torch.cuda.get_device_properties."""
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
    monkeypatch.setattr(fp_nvml, "nvml_devices", lambda: listed)
    torch = fake_torch(cuda="12.6")  # no devices: any torch.cuda device query raises AssertionError
    primary = with_torch.device_facts(torch)
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
    assert [(d["index"], d["nvml_index"], d["arch"]) for d in devices] == [(0, 1, "sm_90"), (1, 0, "sm_80")]
    assert devices[0]["name"] == "NVIDIA H100 80GB HBM3" and devices[0]["memory_bytes"] == 80 * 2**30
    assert devices[0]["driver"] == "550.54.15" and devices[0]["cuda_driver"] == "12.4"
    assert calls == ["init", "shutdown"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert REAL_NVML_DEVICES() is None  # nothing visible: let torch answer (it will say: no GPU)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bb,0")
    assert REAL_NVML_DEVICES() is None  # UUIDs and ordinals mixed: not read with certainty, torch answers


def test_nvml_failures_are_not_errors(monkeypatch):
    _, module = fake_pynvml(GPUS, init_error=RuntimeError("NVMLError_LibraryNotFound"))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert REAL_NVML_DEVICES() is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import raises
    assert REAL_NVML_DEVICES() is None


def test_xpu_machine():
    torch = fake_torch(
        xpu=[SimpleNamespace(name="Intel(R) Data Center GPU Max 1550", driver_version="1.3", total_memory=128 * 2**30)]
    )
    primary = with_torch.device_facts(torch)
    devices = accelerators.detect_accelerators(torch, primary, nvml=lambda: None)
    assert primary["vendor"] == "intel" and devices[0]["type"] == "xpu" and devices[0]["driver"] == "1.3"


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
        ("sm_100", ["sm_90a", "compute_90a"], False, "none"),  # arch-specific code never carries over
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
    assert fp_visible.visible_nvml_indices(visible, uuids) == expected


def test_driver_version_from_proc_file(tmp_path, monkeypatch):
    f = tmp_path / "version"
    f.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n")
    monkeypatch.setitem(fp_host.DRIVER_FILES, "cuda", (str(f), fp_host.DRIVER_FILES["cuda"][1]))
    assert fp_host.driver_version("cuda") == "550.54.15"
    rocm_pattern = fp_host.DRIVER_FILES["rocm"][1]
    monkeypatch.setitem(fp_host.DRIVER_FILES, "rocm", (str(tmp_path / "missing"), rocm_pattern))
    assert fp_host.driver_version("rocm") == ""
    assert fp_host.driver_version("cpu") == ""


# ---- host -----------------------------------------------------------------------------------
def _arch(name, vendor, generic):
    return SimpleNamespace(name=name, vendor=vendor, generic=SimpleNamespace(name=generic))


@pytest.mark.parametrize(
    "cpu, expected",
    [
        (
            _arch("zen3", "AuthenticAMD", "x86_64_v3"),
            {"microarch": "zen3", "generic": "x86_64_v3", "vendor": "AuthenticAMD", "model_known": True},
        ),
        (
            _arch("neoverse_v2", "ARM", "armv9.0a"),
            {"microarch": "neoverse_v2", "generic": "armv9.0a", "vendor": "ARM", "model_known": True},
        ),
        (
            _arch("x86_64_v4", "generic", "x86_64_v4"),
            {"microarch": "x86_64_v4", "generic": "x86_64_v4", "vendor": "generic", "model_known": False},
        ),
        (None, {"microarch": "unknown", "generic": None, "vendor": None, "model_known": False}),
    ],
)
def test_cpu_model(cpu, expected):
    assert host.cpu_model(cpu) == expected


def test_host_on_this_machine():
    h = host.detect_host()
    assert h["cpu"]["arch"] and h["cpu"]["cores"] >= 1
    assert h["cpu"]["microarch"] == fp_host.cpu_microarch()
    assert h["python"]["version"].count(".") == 2
    if os.path.exists("/proc/meminfo"):
        assert h["memory"]["total_bytes"] > 2**20


# ---- torch build ----------------------------------------------------------------------------
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


# ---- child-process import checks ------------------------------------------------------------
FAKES = {
    "fake_abort": "import os\nos.abort()\n",
    "fake_hang": "import time\ntime.sleep(1000)\n",
    "fake_raise": "x = 1\nraise RuntimeError('libcudart.so.12: cannot open shared object file')\n",
    "fake_print": "print('hello from fake_print')\nvalue = 42\n",
    "fake_exit": "import os\nos._exit(3)\n",
}


@pytest.fixture
def fakes(tmp_path):
    for name, source in FAKES.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(source)
    return tmp_path


@pytest.mark.parametrize(
    "module, status, reason_has",
    [
        ("fake_abort", "crashed", "SIGABRT"),
        ("fake_raise", "error", "RuntimeError: libcudart.so.12"),
        ("fake_print", "ok", "imported"),
        ("fake_exit", "crashed", "exited with code 3"),
        ("no_such_module_here", "error", "ModuleNotFoundError"),
    ],
)
def test_check_import_classifies_fakes(fakes, module, status, reason_has):
    result = importcheck.check_import(module, timeout=30, extra_paths=[str(fakes)])
    assert result["status"] == status
    assert reason_has in result["reason"]
    assert 0 < result["seconds"] < 30  # a child ran (the checker's own failure says 0.0), within the timeout


def test_check_import_reports_where_it_crashed_and_raised(fakes):
    crashed = importcheck.check_import("fake_abort", timeout=30, extra_paths=[str(fakes)])
    assert "fake_abort" in crashed["reason"] and "Fatal Python error" in crashed["stderr"]
    raised = importcheck.check_import("fake_raise", timeout=30, extra_paths=[str(fakes)])
    assert raised["where"].endswith(os.path.join("fake_raise", "__init__.py") + ":2")


def test_check_import_keeps_library_stdout_apart(fakes):
    result = importcheck.check_import("fake_print", timeout=30, extra_paths=[str(fakes)])
    assert result["status"] == "ok" and result["stdout"] == "hello from fake_print"
    assert result["file"].endswith(os.path.join("fake_print", "__init__.py"))


@pytest.mark.slow
def test_check_import_times_out_and_kills(fakes):
    result = importcheck.check_import("fake_hang", timeout=2, extra_paths=[str(fakes)])
    assert result["status"] == "timeout"
    assert "2 s" in result["reason"]
    assert 2 <= result["seconds"] < 15


def test_check_import_ignores_the_working_directory(fakes, monkeypatch):
    """A folder in the caller's cwd is not "installed": the child drops '' from sys.path."""
    monkeypatch.chdir(fakes)
    assert importcheck.check_import("fake_print", timeout=30)["status"] == "error"


@pytest.mark.parametrize(
    "returncode, answer, stdout, stderr, timed_out, status, reason_has",
    [
        (0, {"ok": True, "seconds": 0.1}, "", "", False, "ok", "imported"),
        (0, {"ok": True, "seconds": 0.1}, "noise\n", "", False, "ok", "imported"),
        (1, None, "", "Traceback...\nSystemExit: 1\n", False, "crashed", "exited with code 1"),
        (0, {"ok": False, "type": "OSError", "message": "bad .so"}, "", "", False, "error", "OSError: bad .so"),
        (-11, None, "", "Fatal Python error: Segmentation fault\n", False, "crashed", "SIGSEGV during import"),
        (-6, {"ok": True}, "", "", False, "crashed", "at interpreter exit"),
        (None, None, "", "", True, "timeout", "did not finish"),
        (0, None, "", "", False, "error", "no result"),
        (0, {"ok": True, "modul": "x"}, "", "", False, "error", "unknown key(s) 'modul'"),
    ],
)
def test_classify(returncode, answer, stdout, stderr, timed_out, status, reason_has):
    from kernel_probe.isolation.child import ChildResult

    child = ChildResult(
        "ok" if answer is not None else "crashed",
        value=answer,
        returncode=returncode,
        seconds=1.0,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
    )
    out = importcheck.classify(child, timeout=5)
    assert out["status"] == status and reason_has in out["reason"]
    if "noise" in stdout:
        assert out["stdout"] == "noise"


@pytest.mark.slow
def test_import_checks_run_concurrently(fakes):
    requests = {f"hang{i}": importcheck.ImportRequest("fake_hang") for i in range(3)}
    checks = importcheck.ImportChecks(requests, timeout=2, extra_paths=[str(fakes)])
    results = checks.results()
    assert {r["status"] for r in results.values()} == {"timeout"}
    # three 2-second timeouts in parallel, not one after the other
    assert max(r["seconds"] for r in results.values()) < 5.5


# ---- libraries: metadata, variants ----------------------------------------------------------
def make_dist(root, name, version, files=(), summary=""):
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n")
    lines = []
    for rel, content in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        lines.append(f"{rel},sha256={digest},{len(content)}")
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    return info


def write_pkg(root, module, files):
    for rel, content in files.items():
        path = root / module / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


APEX = next(lib for lib in libraries.known_libraries() if lib.name == "apex")
TE = next(lib for lib in libraries.known_libraries() if lib.name == "transformer-engine")


def test_pypi_apex_is_not_nvidia_apex(tmp_path):
    write_pkg(tmp_path, "apex", {"__init__.py": "# Pyramid toolkit\n", "views.py": ""})
    make_dist(
        tmp_path,
        "apex",
        "0.9.10",
        summary="Toolkit for Pyramid, a Pylons Project, to add Authentication and Authorization",
    )
    located = libraries.locate(APEX, [str(tmp_path)])
    entry = libraries.report(located, None)
    assert entry["installed"] and entry["version"] == "0.9.10" and entry["distribution"] == "apex"
    assert entry["variant"] == "unrelated"
    assert entry["identified_as"].startswith("not apex")
    assert entry["import"]["status"] == "skipped" and "not apex" in entry["import"]["reason"]
    assert libraries.import_requests({"apex": located}) == {}  # never imported


def test_nvidia_apex_is_recognised_by_its_module(tmp_path):
    write_pkg(tmp_path, "apex", {"__init__.py": "", "normalization/__init__.py": "class FusedLayerNorm: pass\n"})
    make_dist(tmp_path, "apex", "0.1")
    located = libraries.locate(APEX, [str(tmp_path)])
    assert located.variant.key == "nvidia"
    requests = libraries.import_requests({"apex": located})
    assert requests == {"apex": importcheck.ImportRequest("apex.normalization")}
    result = importcheck.check_import(requests["apex"], timeout=30, extra_paths=[str(tmp_path)])
    entry = libraries.report(located, result)
    assert entry["identified_as"] == "NVIDIA apex (CUDA)" and entry["import"]["status"] == "ok"


@pytest.mark.parametrize(
    "files, variant",
    [
        ({"__init__.py": "# This file was modified for portability to AMDGPU\nimport os\n"}, "rocm-fork"),
        ({"__init__.py": "", "_rocm_init.py": ""}, "rocm-fork"),
        ({"__init__.py": "# Copyright (c) NVIDIA CORPORATION\n"}, "nvidia"),
    ],
)
def test_transformer_engine_variant(tmp_path, files, variant):
    write_pkg(tmp_path, "transformer_engine", files)
    make_dist(tmp_path, "transformer-engine", "2.4.0")
    located = libraries.locate(TE, [str(tmp_path)])
    assert located.variant.key == variant and located.distributions == {"transformer-engine": "2.4.0"}


def test_distribution_without_module_is_not_installed(tmp_path):
    make_dist(tmp_path, "quack-kernels", "0.6.5")
    lib = KnownLibrary("quack-kernels", ("quack-kernels",), "quack_not_here_module", "quack_not_here_module")
    entry = libraries.report(libraries.locate(lib, [str(tmp_path)]), None)
    assert not entry["installed"] and entry["version"] == "0.6.5"
    assert entry["import"]["status"] == "not-installed" and "quack-kernels is installed" in entry["import"]["reason"]


def test_known_libraries_table_is_well_formed():
    names = [lib.name for lib in libraries.known_libraries()]
    assert len(names) == len(set(names))
    assert {"liger-kernel", "transformer-engine", "apex", "flash-attn", "quack-kernels", "kernels"} <= set(names)
    for lib in libraries.known_libraries():
        assert lib.check == lib.module or lib.check.startswith(lib.module + ".")
        if lib.variants:  # the last variant is the default, every other one has a marker
            assert lib.variants[-1].is_default
            assert not any(v.is_default for v in lib.variants[:-1])


# ---- triton: which distribution owns the files ----------------------------------------------
def _triton_tree(root, init: bytes, lib: bytes):
    (root / "triton" / "_C").mkdir(parents=True)
    (root / "triton" / "__init__.py").write_bytes(init)
    (root / "triton" / "_C" / "libtriton.so").write_bytes(lib)


ROCM_INIT, ROCM_LIB = b"__version__ = '3.1.0'\n# rocm\n", b"\x7fELF rocm build" * 10
CUDA_INIT, CUDA_LIB = b"__version__ = '3.1.0'\n", b"\x7fELF cuda build" * 20


@pytest.mark.parametrize("last_installed", ["pytorch-triton-rocm", "triton"])
def test_cuda_triton_beside_pytorch_triton_rocm(tmp_path, last_installed):
    init, lib = (ROCM_INIT, ROCM_LIB) if last_installed == "pytorch-triton-rocm" else (CUDA_INIT, CUDA_LIB)
    _triton_tree(tmp_path, init, lib)
    make_dist(
        tmp_path,
        "pytorch-triton-rocm",
        "3.1.0",
        [("triton/__init__.py", ROCM_INIT), ("triton/_C/libtriton.so", ROCM_LIB)],
    )
    make_dist(tmp_path, "triton", "3.1.0", [("triton/__init__.py", CUDA_INIT), ("triton/_C/libtriton.so", CUDA_LIB)])
    located = triton_info.locate([str(tmp_path)])
    facts = triton_info.report(located, None, torch_build="rocm", device_arch="gfx90a")
    assert facts["provider"] == last_installed
    assert facts["distributions"]["triton"]["built_for"] == ["cuda"]  # this fake's RECORD lists no backends/
    assert facts["distributions"]["pytorch-triton-rocm"]["built_for"] == ["hip"]
    assert facts["conflict"] and "pytorch-triton-rocm" in facts["conflict"]
    assert facts["matches_torch_build"] is (last_installed == "pytorch-triton-rocm")
    # without an import check the backend is inferred from torch's build, and says so
    assert (facts["backend"], facts["arch"], facts["target_source"]) == ("hip", "gfx90a", "torch build")
    assert facts["import"]["status"] == "skipped"


def test_triton_target_from_the_runtime_wins():
    located = triton_info.LocatedTriton("/x/triton", {"pytorch-triton-rocm": "3.1.0"}, ("pytorch-triton-rocm",), "")
    imported = {
        "status": "ok",
        "reason": "imported",
        "seconds": 1.0,
        "target": {"backend": "hip", "arch": "gfx90a:sramecc+:xnack-", "warp_size": 64},
    }
    facts = triton_info.report(located, imported, torch_build="rocm", device_arch="gfx90a")
    assert (facts["backend"], facts["arch"], facts["warp_size"]) == ("hip", "gfx90a", 64)
    assert facts["target_source"] == "runtime" and facts["conflict"] is None and facts["matches_torch_build"]
    cuda = dict(imported, target={"backend": "cuda", "arch": "90", "warp_size": 32})
    assert triton_info.report(located, cuda, torch_build="cuda", device_arch="sm_90")["arch"] == "sm_90"


def test_triton_on_this_machine_matches_metadata():
    facts = triton_info.report(triton_info.locate(), None, torch_build="cpu", device_arch="")
    try:
        version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        pytest.skip("no triton distribution here")
    assert facts["installed"] and facts["provider"] == "triton" and facts["version"] == version


# ---- site -----------------------------------------------------------------------------------
def test_site_signals(tmp_path):
    systemname = tmp_path / "systemname"
    systemname.write_text("juwelsbooster\n")
    markers = site.SITE_MARKERS + (
        site.SiteMarker("file", str(systemname), "JSC"),
        site.SiteMarker("file", str(tmp_path / "absent"), "nowhere"),
    )
    env = {
        "LUMI_STACK_NAME": "LUMI",
        "SLURM_JOB_ID": "123",
        "SLURM_CLUSTER_NAME": "lumi",
        "HOME": "/users/x",
        "SLURM_SECRET_UNLISTED": "x",
    }
    s = site.detect_site(env, hostname="nid005123", markers=markers)
    assert s["hostname"] == "nid005123"
    assert s["slurm"] == {"SLURM_CLUSTER_NAME": "lumi", "SLURM_JOB_ID": "123"}
    signals = {m["signal"]: m["value"] for m in s["markers"]}
    assert signals["env:LUMI_STACK_NAME"] == "LUMI"
    assert signals[f"file:{systemname}"] == "juwelsbooster"
    assert not any("absent" in k for k in signals)


def test_site_markers_cover_the_issue_list():
    names = {m.name for m in site.SITE_MARKERS}
    wanted = {"LUMI_STACK_NAME", "SYSTEMNAME", "/etc/FZJ/systemname", "CLUSTER_NAME", "NERSC_HOST", "BSC_MACHINE"}
    assert wanted <= names


# ---- the whole report -----------------------------------------------------------------------
def test_detect_without_import_checks_is_plain_data():
    report = env_report.detect(import_checks=False)
    assert tuple(report) == env_report.TOP_LEVEL_KEYS
    assert report["schema"] == env_report.SCHEMA
    assert json.loads(json.dumps(report)) == report
    assert report["fingerprint"] == with_torch.current()  # the lock's own code, same answer
    assert report["device"]["type"] == report["fingerprint"]["device-type"]
    assert all(lib["import"]["status"] in ("skipped", "not-installed") for lib in report["libraries"].values())
    assert report["errors"] == []


def test_detect_survives_a_broken_torch(monkeypatch):
    broken = fake_torch(**H100)
    broken.cuda.device_count = lambda: (_ for _ in ()).throw(RuntimeError("CUDA driver initialization failed"))
    report = env_report.detect(import_checks=False, torch=broken, nvml=lambda: None)
    assert report["device"]["type"] == "cpu"
    assert any("CUDA driver initialization failed" in e["error"] for e in report["errors"])
    json.dumps(report)


@pytest.mark.slow
def test_detect_reports_every_broken_library_and_goes_on(fakes):
    table = tuple(KnownLibrary(name, (name,), name, name) for name in FAKES)
    report = env_report.detect(
        import_checks=True,
        timeout=3,
        extra_paths=[str(fakes)],
        table=table,
        torch=fake_torch(**MI250X),
        nvml=lambda: None,
    )
    status = {name: lib["import"]["status"] for name, lib in report["libraries"].items()}
    assert status == {
        "fake_abort": "crashed",
        "fake_hang": "timeout",
        "fake_raise": "error",
        "fake_print": "ok",
        "fake_exit": "crashed",
    }
    assert all(report["libraries"][n]["import"]["reason"] for n in FAKES)
    assert report["device"]["vendor"] == "amd" and report["device"]["arch"] == "gfx90a"
    assert report["fingerprint"]["device-arch"] == "gfx90a"
    json.dumps(report)


@pytest.mark.slow
def test_liger_kernel_installed_and_importable_here():
    try:
        version = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        pytest.skip("liger-kernel is not installed here")
    lib = next(lib for lib in libraries.known_libraries() if lib.name == "liger-kernel")
    report = env_report.detect(import_checks=True, table=(lib,))
    entry = report["libraries"]["liger-kernel"]
    assert entry["installed"] and entry["version"] == version
    assert entry["import"]["status"] == "ok", entry["import"]
    assert entry["location"].endswith("liger_kernel")


def test_cancel_kills_running_checks_at_once(fakes):
    checks = importcheck.ImportChecks(
        {"hang": importcheck.ImportRequest("fake_hang")}, timeout=120, extra_paths=[str(fakes)]
    )
    checks.cancel()
    result = checks.results()["hang"]  # without cancel() this would wait 120 s
    assert result["status"] == "crashed" and "SIGKILL" in result["reason"]
    assert result["seconds"] < 30
