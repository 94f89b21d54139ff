"""The torch-free fingerprint: equal to the torch-based one here, right on NVIDIA and AMD driver
trees (real layouts, values from public sources), and never running torch's code to read its
build."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernel_lock import fingerprint, host, torchless
from kernel_lock.errors import DeviceVisibilityError
from tests.conftest import ROOT


@pytest.fixture(autouse=True)
def read_the_files(monkeypatch):
    """pytest has torch imported, where a check would ask it: read the files, as a job start
    does."""
    monkeypatch.setattr(torchless, "USE_IMPORTED_TORCH", False)


# --- torch builds (torch/version.py as torch's own build writes it: annotated assignments) --------

CPU_BUILD = (
    "from typing import Optional\n__version__ = '2.13.0+cpu'\ncuda: Optional[str] = "
    "None\nhip: Optional[str] = None\n"
)
# torch.version.cuda "12.4": the cu124 wheels; HIP "6.2.41133-dd7f95766": torch.version.hip of a
# ROCm 6.2 wheel as printed in linkedin/Liger-Kernel#538 (/work/shared/research/sites.md, "PyTorch")
CUDA_BUILD = textwrap.dedent("""\
    from typing import Optional

    __all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
    __version__ = '2.5.1+cu124'
    debug = False
    cuda: Optional[str] = '12.4'
    git_version = 'a8d6afb511a69687bbb2b7e88a3cf67917e1697e'
    hip: Optional[str] = None
    rocm: Optional[str] = None
    xpu: Optional[str] = None
    """)
ROCM_BUILD = (
    CUDA_BUILD.replace("'2.5.1+cu124'", "'2.5.1+rocm6.2'")
    .replace("cuda: Optional[str] = '12.4'", "cuda: Optional[str] = None")
    .replace("hip: Optional[str] = None", "hip: Optional[str] = '6.2.41133-dd7f95766'")
)
CUDA13_BUILD = CUDA_BUILD.replace("'12.4'", "'13.0'")


def build_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "torch-version.py"
    path.write_text(text)
    return path


# --- driver trees ---------------------------------------------------------------------------------


def _write(root: Path, rel: str, text: str | bytes = "") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def nvidia_tree(root: Path, *, version_line: str, model: str, count: int) -> Path:
    """/proc/driver/nvidia as the driver writes it. Layout: NVIDIA driver README, "Using the /proc
    File System Interface" (gpus/domain:bus:device.function/information) and nv_procfs_read_gpu_info
    in NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/nv-procfs.c (field names and tab
    layout)."""
    _write(
        root,
        "proc/driver/nvidia/version",
        f"NVRM version: {version_line}\nGCC version:  gcc version 12.3.0\n",
    )
    for i in range(count):
        bus = f"0000:{0x19 + 0x20 * i:02x}:00.0"  # illustrative bus ids, one per GPU
        _write(
            root,
            f"proc/driver/nvidia/gpus/{bus}/information",
            f"Model: \t\t {model}\nIRQ:   \t\t {300 + i}\nGPU UUID: \t "
            f"GPU-{i:08x}-1111-2222-3333-444444444444\nVideo BIOS: \t 96.00.74.00.01\nBus Type: "
            "\t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t "
            f"{bus}\nDevice Minor: \t {i}\nGPU Excluded:\t No\n",
        )
        _write(root, f"dev/nvidia{i}")
    _write(root, "dev/nvidiactl")
    _write(
        root,
        "etc/ld.so.cache",
        b"glibc-ld.so.cache1.1\x00libcuda.so.1\x00/usr/lib/x86_64-linux-gnu/libcuda.so.1\x00",
    )
    return root


def h100_node(root: Path) -> Path:
    # "NVIDIA H100 80GB HBM3": the name nvidia-smi and torch report for an H100 SXM5 (guilbaults/
    # TrailblazingTurtle#73; /work/shared/research/performance.md "1x H100 80GB HBM3"); 8 per HGX
    # node. 550.163.01: an R550 datacenter driver (NVIDIA/gpu-operator#1409); the proprietary
    # module's line "NVIDIA UNIX x86_64 Kernel Module  <version>  <build date>"
    # (nix-community/nixGL#220, "old format").
    return nvidia_tree(
        root,
        version_line="NVIDIA UNIX x86_64 Kernel Module  550.163.01  Fri Mar 14 00:00:00 UTC 2025",
        model="NVIDIA H100 80GB HBM3",
        count=8,
    )


def a100_node(root: Path) -> Path:
    # "NVIDIA A100-SXM4-40GB" with driver 580.126.09 (nvidia-smi in
    # bottlerocket-os/bottlerocket-core-kit#834); the open module's line "NVIDIA UNIX Open Kernel
    # Module for x86_64  <version>  Release Build  (...)" (nix-community/nixGL#121 and #186)
    return nvidia_tree(
        root,
        version_line="NVIDIA UNIX Open Kernel Module for x86_64  580.126.09  Release Build  "
        "(dvs-builder@U16-A24-9-2)",
        model="NVIDIA A100-SXM4-40GB",
        count=8,
    )


def gh200_node(root: Path) -> Path:
    # GH200 needs the open kernel module (NVIDIA/cloud-native-docs#6), whose aarch64 line reads
    # "NVIDIA UNIX Open Kernel Module for aarch64  <version>  Release Build"
    # (nix-community/nixGL#139); 580.126.20: an aarch64 datacenter driver for Grace nodes
    # (Azure/azhpc-images#536). "NVIDIA GH200 120GB": Alps (CSCS NCCL page) and Isambard-AI
    # (sites.md, "SMI tools"); 4 GH200 per Alps node.
    return nvidia_tree(
        root,
        version_line="NVIDIA UNIX Open Kernel Module for aarch64  580.126.20  Release Build  "
        "(dvs-builder@U22-I3-AE18-09-3)",
        model="NVIDIA GH200 120GB",
        count=4,
    )


def mi250x_node(root: Path) -> Path:
    """A LUMI-G / Frontier node: 4 MI250X = 8 GCDs, each a KFD GPU node (LUMI guide
    docs/hardware/lumig.md; OLCF Frontier guide). Properties file layout "name value" per line,
    gfx_target_version inside it (ROCm/rocm-cli#343; kernel's kfd_topology.c); the 64-core EPYC 7A53
    in NPS4 gives 4 CPU nodes first (a GPU at node 4 in rocminfo, ROCm/rocm_smi_lib#160)."""
    nodes = "sys/class/kfd/kfd/topology/nodes"
    for n in range(4):
        _write(
            root,
            f"{nodes}/{n}/properties",
            "cpu_cores_count 16\nsimd_count 0\nmem_banks_count 1\ncaches_count "
            "0\nio_links_count 9\n"
            "gfx_target_version 0\nvendor_id 0\ndevice_id 0\nlocation_id 0\ndrm_render_minor 0\n",
        )
    for g in range(8):
        # simd_count 440 = 110 CUs per GCD (LUMI guide) x 4 SIMDs per CU (rocminfo,
        # rocm_smi_lib#160); gfx_target_version 90010 = gfx90a; device_id 29708 = 0x740c, "Chip ID:
        # 29708(0x740c)" of an MI250X in rocminfo (ROCm/aiter#179); vendor_id 4098 = 0x1002 (AMD's
        # PCI vendor id)
        _write(
            root,
            f"{nodes}/{4 + g}/properties",
            "cpu_cores_count 0\nsimd_count 440\nmem_banks_count 1\ncaches_count "
            "104\nio_links_count 8\nmax_waves_per_simd 8\nlds_size_in_kb 64\nwave_front_size "
            "64\narray_count 8\nsimd_arrays_per_engine 1\ncu_per_simd_array 14\nsimd_per_cu "
            "4\ngfx_target_version 90010\nvendor_id 4098\ndevice_id 29708\nlocation_id "
            f"{0xC100 + 0x100 * g}\ndrm_render_minor {128 + g}\nnum_xcc 1\n",
        )
    _write(root, "sys/class/kfd/kfd/topology/generation_id", "1\n")
    # "ROCk module version 6.10.5 is loaded" (rocminfo in ROCm/aiter#179): the DKMS amdgpu's version
    # file
    _write(root, "sys/module/amdgpu/version", "6.10.5\n")
    _write(root, "dev/kfd")
    return root


def run(tmp_path, build: str, root: Path, env: dict[str, str] | None = None):
    return torchless.fingerprint(env=env or {}, root=root, version_file=build_file(tmp_path, build))


def device(fields) -> tuple:
    return tuple(
        fields[k]
        for k in (
            "device-type",
            "device-vendor",
            "device-name",
            "device-arch",
            "device-count",
            "driver",
        )
    )


# --- (a) this machine -----------------------------------------------------------------------------


def test_equals_the_torch_based_fingerprint_here():
    fields, notes = torchless.fingerprint()
    assert notes.complete, notes.fallbacks
    assert list(fields) == list(fingerprint.FIELDS)
    current = fingerprint.current()
    for name in fingerprint.FIELDS:
        assert fields[name] == current[name], name


def test_no_torch_module_is_imported():
    code = (
        "import sys, json, kernel_lock.torchless as t; f, n = t.fingerprint(); "
        "print(json.dumps({'torch': sorted(m for m in sys.modules if m == 'torch' or "
        "m.startswith('torch.')), 'complete': n.complete}))"
    )
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert json.loads(proc.stdout) == {"torch": [], "complete": True}
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert not {n for n in imported if n == "torch" or n.startswith("torch.")}


# --- (b) NVIDIA and AMD driver trees --------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "env", "expected"),
    [
        (
            h100_node,
            {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
            ("cuda", "nvidia", "NVIDIA H100 80GB HBM3", "sm_90", 4, "550.163.01"),
        ),
        (
            a100_node,
            {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
            ("cuda", "nvidia", "NVIDIA A100-SXM4-40GB", "sm_80", 8, "580.126.09"),
        ),
        (
            gh200_node,
            {"CUDA_VISIBLE_DEVICES": "2"},
            ("cuda", "nvidia", "NVIDIA GH200 120GB", "sm_90", 1, "580.126.20"),
        ),
        # a UUID prefix selects a GPU as an index does; the list stops at the first entry that
        # selects none
        (
            h100_node,
            {"CUDA_VISIBLE_DEVICES": "GPU-00000003,GPU-zz,GPU-0"},
            ("cuda", "nvidia", "NVIDIA H100 80GB HBM3", "sm_90", 1, "550.163.01"),
        ),
        (
            h100_node,
            {"CUDA_VISIBLE_DEVICES": "1,9,2"},
            ("cuda", "nvidia", "NVIDIA H100 80GB HBM3", "sm_90", 1, "550.163.01"),
        ),
    ],
)
def test_nvidia_nodes(tmp_path, node, env, expected):
    fields, notes = run(tmp_path, CUDA_BUILD, node(tmp_path / "root"), env)
    assert notes.complete, notes.fallbacks
    assert device(fields) == expected
    assert (
        fields["torch-cuda"] == "12.4"
        and fields["torch"] == "2.5.1"
        and fields["device-features"] == ""
    )


@pytest.mark.parametrize("hidden", ["-1", ""])
def test_nvidia_all_hidden_is_the_cpu(tmp_path, hidden):
    fields, notes = run(
        tmp_path, CUDA_BUILD, h100_node(tmp_path / "root"), {"CUDA_VISIBLE_DEVICES": hidden}
    )
    assert notes.complete and fields["device-type"] == "cpu" and fields["device-count"] == 1


def _fallback_fields(tmp_path, root: Path, env, build=CUDA_BUILD) -> dict[str, str]:
    fields, notes = run(tmp_path, build, root, env)
    # never a value torch might contradict
    assert all(fields[name] is None for name in notes.fallbacks)
    return dict(notes.fallbacks)


def test_nvidia_without_visibility_variable_falls_back(tmp_path):
    # a device cgroup may hide GPUs /proc lists; only CUDA_VISIBLE_DEVICES says what this job was
    # given
    falls = _fallback_fields(tmp_path, h100_node(tmp_path / "root"), {})
    assert {"device-type", "device-count", "device-name"} <= set(
        falls
    ) and "CUDA_VISIBLE_DEVICES" in falls["device-type"]


def test_nvidia_mig_falls_back(tmp_path):
    root = a100_node(tmp_path / "root")
    # MIG user guide, "Device Nodes and Capabilities":
    # /proc/driver/nvidia/capabilities/gpu0/mig/gi1/access
    _write(
        root,
        "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access",
        "DeviceFileMinor: 12\nDeviceFileMode: 292\n",
    )
    assert set(_fallback_fields(tmp_path, root, {"CUDA_VISIBLE_DEVICES": "0"})) >= {
        "device-name",
        "device-count",
    }
    root2 = a100_node(tmp_path / "root2")
    falls = _fallback_fields(
        tmp_path, root2, {"CUDA_VISIBLE_DEVICES": "MIG-2f2b1e3c-6a50-5a4b-8b3a-5e0b0c3d2e1f"}
    )
    assert "device-count" in falls


def test_nvidia_driver_older_than_torchs_cuda_falls_back(tmp_path):
    # torch built with CUDA 13 needs a >= 580 driver (NVIDIA CUDA Compatibility guide, table 1)
    falls = _fallback_fields(
        tmp_path, h100_node(tmp_path / "root"), {"CUDA_VISIBLE_DEVICES": "0"}, CUDA13_BUILD
    )
    assert "device-type" in falls and "550.163.01" in falls["device-type"]


def test_nvidia_unknown_model_falls_back(tmp_path):
    root = nvidia_tree(
        tmp_path / "root",
        version_line="NVIDIA UNIX x86_64 Kernel Module  550.163.01  x",
        model="NVIDIA L40S",
        count=2,
    )  # not in the sourced table
    falls = _fallback_fields(tmp_path, root, {"CUDA_VISIBLE_DEVICES": "0"})
    assert set(falls) >= {"device-name", "device-arch"} and "device-type" not in falls


def test_nvidia_mixed_models_fall_back(tmp_path):
    root = h100_node(tmp_path / "root")
    info = next((root / "proc/driver/nvidia/gpus").iterdir()) / "information"
    info.write_text(info.read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"))
    assert "device-name" in _fallback_fields(tmp_path, root, {"CUDA_VISIBLE_DEVICES": "0"})


@pytest.mark.parametrize("missing", ["proc/driver/nvidia", "dev/nvidiactl", "etc/ld.so.cache"])
def test_cuda_build_without_reachable_driver_falls_back(tmp_path, missing):
    import shutil

    root = h100_node(tmp_path / "root")
    target = root / missing
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    assert "device-type" in _fallback_fields(tmp_path, root, {"CUDA_VISIBLE_DEVICES": "0"})


def test_nvml_is_taken_when_it_answers(tmp_path, monkeypatch):
    monkeypatch.setattr(
        host,
        "nvml_primary",
        lambda: {
            "name": "NVIDIA H100 80GB HBM3",
            "arch": "sm_90",
            "count": 8,
            "driver": "550.163.01",
        },
    )
    fields, notes = torchless.fingerprint(version_file=build_file(tmp_path, CUDA_BUILD))
    assert notes.complete and notes.sources["device"] == "NVML"
    assert device(fields) == ("cuda", "nvidia", "NVIDIA H100 80GB HBM3", "sm_90", 8, "550.163.01")


@pytest.mark.parametrize(
    ("env", "count"),
    [
        ({}, 8),
        ({"ROCR_VISIBLE_DEVICES": "3"}, 1),  # LUMI's per-rank ROCR_VISIBLE_DEVICES=$SLURM_LOCALID
        ({"ROCR_VISIBLE_DEVICES": "2,3,4", "HIP_VISIBLE_DEVICES": "0,1"}, 2),
        ({"HIP_VISIBLE_DEVICES": "0,1,2,3"}, 4),
        ({"CUDA_VISIBLE_DEVICES": "5,6"}, 2),
    ],
)
def test_mi250x_node(tmp_path, env, count):
    fields, notes = run(tmp_path, ROCM_BUILD, mi250x_node(tmp_path / "root"), env)
    assert (
        fields["device-type"],
        fields["device-vendor"],
        fields["device-arch"],
        fields["device-count"],
        fields["driver"],
    ) == ("rocm", "amd", "gfx90a", count, "6.10.5")
    assert fields["torch-hip"] == "6.2.41133-dd7f95766" and fields["torch-cuda"] == ""
    # the marketing name (libdrm's amdgpu.ids) and the sramecc/xnack features are the runtime's to
    # say
    assert set(notes.fallbacks) == {"device-name", "device-features"}
    assert "0x740c" in notes.fallbacks["device-name"]
    assert fields["device-name"] is None and fields["device-features"] is None


def test_mi250x_contradictory_visibility_raises_like_torch(tmp_path):
    with pytest.raises(DeviceVisibilityError):
        run(
            tmp_path,
            ROCM_BUILD,
            mi250x_node(tmp_path / "root"),
            {"ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0,1"},
        )


@pytest.mark.parametrize(
    "env",
    [
        {"ROCR_VISIBLE_DEVICES": "9"},
        {"ROCR_VISIBLE_DEVICES": "GPU-124d13ccd7b050e5"},
        {"ROCR_VISIBLE_DEVICES": "1,1"},
    ],
)
def test_mi250x_unmappable_visibility_falls_back(tmp_path, env):
    assert "device-count" in _fallback_fields(
        tmp_path, mi250x_node(tmp_path / "root"), env, ROCM_BUILD
    )


def test_mi250x_override_gfx_falls_back(tmp_path):
    falls = _fallback_fields(
        tmp_path, mi250x_node(tmp_path / "root"), {"HSA_OVERRIDE_GFX_VERSION": "9.4.2"}, ROCM_BUILD
    )
    assert "device-arch" in falls


def test_rocm_build_on_a_node_without_amdgpu_is_the_cpu(tmp_path):
    fields, notes = run(tmp_path, ROCM_BUILD, tmp_path / "empty")
    assert (
        notes.complete
        and fields["device-type"] == "cpu"
        and fields["torch-hip"] == "6.2.41133-dd7f95766"
    )


def test_rocm_build_without_dev_kfd_falls_back(tmp_path):
    root = mi250x_node(tmp_path / "root")
    (root / "dev/kfd").unlink()
    assert "device-type" in _fallback_fields(tmp_path, root, {}, ROCM_BUILD)


def test_cpu_build_on_a_gpu_node_is_the_cpu(tmp_path):
    fields, notes = run(
        tmp_path, CPU_BUILD, h100_node(tmp_path / "root"), {"CUDA_VISIBLE_DEVICES": "0"}
    )
    assert notes.complete and fields["device-type"] == "cpu" and fields["driver"] == ""


@pytest.mark.parametrize(
    ("value", "gfx"),
    [
        (90010, "gfx90a"),
        (90402, "gfx942"),
        (90008, "gfx908"),
        (110000, "gfx1100"),
        (100300, "gfx1030"),
        (90500, "gfx950"),
    ],
)
def test_gfx_names(value, gfx):
    assert torchless.gfx_name(value) == gfx


# --- (c) torch's build from its version.py, never executed ----------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CUDA_BUILD, {"__version__": "2.5.1+cu124", "cuda": "12.4", "hip": None}),
        (ROCM_BUILD, {"cuda": None, "hip": "6.2.41133-dd7f95766"}),
        ("__version__ = '2.1.0'\ndebug = False\ncuda = '11.8'\nhip = None\n", {"cuda": "11.8"}),
    ],
)
def test_version_file_is_read_as_data(text, expected):
    values = fingerprint.parse_version_file(text)
    assert {k: values.get(k) for k in expected} == expected


HOSTILE = [
    "__version__ = '2.5.1'\ncuda = __import__('os').system('touch {marker}')\n",
    "import os\nos.system('touch {marker}')\n__version__ = '2.5.1'\ncuda = '12.4'\n",
    "__version__ = '2.5.1'\ncuda = '12.4'\nif True:\n    open('{marker}', 'w')\n",
    "__version__ = '2.5.1'\ncuda: str = open('{marker}', 'w').name\n",
    "def f():\n    pass\n__version__ = '2.5.1'\ncuda = '12.4'\n",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_version_file_with_code_is_not_run(tmp_path, template):
    marker = tmp_path / "ran"
    with pytest.raises(ValueError):
        fingerprint.parse_version_file(template.format(marker=marker))
    fields, notes = torchless.fingerprint(
        env={}, root=tmp_path, version_file=build_file(tmp_path, template.format(marker=marker))
    )
    assert not marker.exists()
    assert {"torch-cuda", "torch", "device-type"} <= set(notes.fallbacks) and fields[
        "torch-cuda"
    ] is None


def _fake_distribution(site: Path, version_py: str, marker: Path) -> None:
    """An installed torch whose __init__ leaves a mark if anything imports it."""
    _write(site, "torch/__init__.py", f"open({str(marker)!r}, 'w').write('imported')\n")
    _write(site, "torch/version.py", version_py)
    # the compiled parts `import torch` needs (kernel_lock.torchless looks for them,
    # empty files will do)
    for part in (
        "_C.abi3.so",
        "lib/libc10.so",
        "lib/libtorch_cpu.so",
        "lib/libtorch_python.so",
        "lib/libtorch_cuda.so",
    ):
        _write(site, f"torch/{part}", b"")
    _write(
        site,
        "torch-2.5.1+cu124.dist-info/METADATA",
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.5.1+cu124\n",
    )
    _write(site, "torch-2.5.1+cu124.dist-info/RECORD", "torch/__init__.py,,\ntorch/version.py,,\n")


def _in_subprocess(site: Path) -> dict:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import "
        "kernel_lock.torchless as t; f, n = t.fingerprint(env={}, root=sys.argv[2]); "
        "print(json.dumps({'fields': f, 'fallbacks': dict(n.fallbacks), 'torch': 'torch' in "
        "sys.modules}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(site), str(site / "no-drivers")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return json.loads(proc.stdout)


def test_fake_distribution_is_read_without_import(tmp_path):
    marker = tmp_path / "imported"
    _fake_distribution(tmp_path / "site", CUDA_BUILD, marker)
    out = _in_subprocess(tmp_path / "site")
    assert not marker.exists() and out["torch"] is False
    assert (
        out["fields"]["torch"] == "2.5.1"
        and out["fields"]["torch-cuda"] == "12.4"
        and out["fields"]["torch-hip"] == ""
    )
    # a CUDA build with no driver files: whether CUDA would load the driver is torch's to say
    assert "device-type" in out["fallbacks"] and "torch" not in out["fallbacks"]


def test_fake_distribution_with_hostile_version_file(tmp_path):
    marker = tmp_path / "imported"
    ran = tmp_path / "ran"
    _fake_distribution(tmp_path / "site", HOSTILE[0].format(marker=ran), marker)
    out = _in_subprocess(tmp_path / "site")
    assert not marker.exists() and not ran.exists() and out["torch"] is False
    assert out["fields"]["torch-cuda"] is None and "plain data" in out["fallbacks"]["torch-cuda"]


def test_distribution_and_version_file_disagree(tmp_path):
    marker = tmp_path / "imported"
    _fake_distribution(tmp_path / "site", CUDA_BUILD.replace("2.5.1", "2.6.0"), marker)
    out = _in_subprocess(tmp_path / "site")
    assert "torch" in out["fallbacks"] and out["fields"]["torch"] is None


def test_notes_blocking_keeps_only_checked_fields():
    notes = torchless.Notes(fallbacks={"device-count": "x", "device-name": "y"})
    assert notes.blocking(["device-name", "torch"]) == {"device-name": "y"} and not notes.complete


def test_current_falls_back_to_torch_only_for_checked_fields(tmp_path, monkeypatch, caplog):
    import logging

    fields, _ = torchless.fingerprint()
    partial = {**fields, "device-count": None}
    notes = torchless.Notes(fallbacks={"device-count": "a device cgroup may hide GPUs"})
    monkeypatch.setattr(torchless, "fingerprint", lambda: (partial, notes))
    monkeypatch.setattr(fingerprint, "current", lambda: {"from": "torch"})
    with caplog.at_level(logging.DEBUG, logger="kernel_lock.torchless"):
        assert torchless.current(checked=["torch", "device-type"]) is partial
        assert torchless.current() == {"from": "torch"}
    assert "device-count: needs torch (a device cgroup may hide GPUs)" in caplog.text


def test_device_is_shaped_like_device_facts():
    import torch

    expected = fingerprint.device_facts(torch)
    got = torchless.device()
    assert got is not None and {k: got[k] for k in expected} == expected and got["features"] == ""
