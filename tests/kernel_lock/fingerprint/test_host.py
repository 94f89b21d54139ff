"""kernel_lock.host: the CPU, the driver's version file and ROCm arch names, read from
fakes of archspec and of the /proc and /sys files (this machine's own are not what is tested)."""

from __future__ import annotations

import builtins
import sys
import types

import pytest

from kernel_lock import host


@pytest.mark.parametrize(
    "name,arch,features",
    [
        ("gfx90a:sramecc+:xnack-", "gfx90a", "sramecc+:xnack-"),
        ("gfx942", "gfx942", ""),
        (" gfx1100 ", "gfx1100", ""),
        ("gfx90a:xnack+", "gfx90a", "xnack+"),
        ("", "", ""),
    ],
)
def test_gcn_arch_and_features(name, arch, features):
    assert host.normalize_gcn_arch(name) == arch
    assert host.gcn_features(name) == features


@pytest.fixture
def proc_files(tmp_path, monkeypatch):
    """Redirect the module's reads of absolute paths to files under tmp_path ({path: text}); a path
    not given does not exist."""
    files: dict[str, str] = {}

    def fake_open(path, *args, **kwargs):
        path = str(path)
        if path not in files:
            raise FileNotFoundError(path)
        real = tmp_path / path.strip("/").replace("/", "_")
        real.write_text(files[path])
        return builtins.open(real, *args, **kwargs)

    monkeypatch.setattr(host, "open", fake_open, raising=False)
    return files


# (device type, file, its text, the version read)
DRIVERS = [
    (
        "cuda",
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n",
        "550.54.15",
    ),
    (
        "cuda",
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build\n",
        "580.65.06",
    ),
    ("cuda", "/proc/driver/nvidia/version", "garbage\n", ""),
    ("rocm", "/sys/module/amdgpu/version", "6.8.5\n", "6.8.5"),
    ("rocm", "/sys/module/amdgpu/version", "\n", ""),
]


@pytest.mark.parametrize("device,path,text,version", DRIVERS)
def test_driver_version(proc_files, device, path, text, version):
    proc_files[path] = text
    assert host.driver_version(device) == version


@pytest.mark.parametrize("device", ["cuda", "rocm", "cpu", "mps", ""])
def test_driver_version_without_its_file(proc_files, device):
    assert host.driver_version(device) == ""


def _archspec(monkeypatch, name=None, vendor=None, raises=False):
    """A fake archspec.cpu whose host() is (name, vendor), or raises; name None: archspec not
    installed."""
    if name is None and not raises:
        monkeypatch.setitem(sys.modules, "archspec", None)
        monkeypatch.setitem(sys.modules, "archspec.cpu", None)
        return

    def host_():
        if raises:
            raise ValueError("no entry for this CPU")
        return types.SimpleNamespace(name=name, vendor=vendor)

    cpu = types.ModuleType("archspec.cpu")
    cpu.host = host_
    pkg = types.ModuleType("archspec")
    pkg.cpu = cpu
    monkeypatch.setitem(sys.modules, "archspec", pkg)
    monkeypatch.setitem(sys.modules, "archspec.cpu", cpu)


@pytest.mark.parametrize(
    "name,vendor,raises,microarch",
    [
        ("zen3", "AuthenticAMD", False, "zen3"),
        ("neoverse_v2", "ARM", False, "neoverse_v2"),
        (None, None, False, "unknown"),  # archspec not installed
        (None, None, True, "unknown"),  # archspec fails on this CPU
    ],
)
def test_cpu_microarch(monkeypatch, name, vendor, raises, microarch):
    _archspec(monkeypatch, name, vendor, raises)
    assert host.cpu_microarch() == microarch
    assert (host.archspec_host() is None) is (name is None)


CPUINFO_X86 = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
)
CPUINFO_ARM = "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"
CPUINFO_GRACE = "processor\t: 0\nCPU implementer\t: 0x4e\n"


@pytest.mark.parametrize(
    "name,vendor,cpuinfo,expected",
    [
        ("zen3", "AuthenticAMD", None, "amd"),
        ("sapphirerapids", "GenuineIntel", None, "intel"),
        ("neoverse_v2", "ARM", None, "arm"),
        ("x86_64_v3", "generic", CPUINFO_X86, "intel"),  # a generic level: /proc/cpuinfo says
        ("aarch64", "generic", CPUINFO_ARM, "arm"),
        ("aarch64", "generic", CPUINFO_GRACE, "nvidia"),
        ("aarch64", "generic", "CPU implementer\t: 0x99\n", "0x99"),  # unknown code: as written
        ("x86_64", "generic", None, "generic"),  # nothing better to say
        (None, None, CPUINFO_X86, "intel"),  # no archspec
        (None, None, None, "unknown"),
        (None, None, "processor\t: 0\n", "unknown"),
    ],
)
def test_cpu_vendor(monkeypatch, proc_files, name, vendor, cpuinfo, expected):
    _archspec(monkeypatch, name, vendor)
    if cpuinfo is not None:
        proc_files["/proc/cpuinfo"] = cpuinfo
    assert host.cpu_vendor() == expected


@pytest.mark.parametrize(
    "cpuinfo,expected",
    [
        (CPUINFO_X86, "Intel(R) Xeon(R) Platinum 8480+"),
        ("system type\t: x\ncpu model\t: MIPS 24Kc\n", "MIPS 24Kc"),
        ("Hardware\t: BCM2835\n", "BCM2835"),
    ],
)
def test_cpu_name_from_cpuinfo(proc_files, cpuinfo, expected):
    proc_files["/proc/cpuinfo"] = cpuinfo
    assert host.cpu_name() == expected


@pytest.mark.parametrize(
    "processor,machine,expected",
    [("i386", "x86_64", "i386"), ("", "arm64", "arm64"), ("", "", "unknown")],
)
def test_cpu_name_without_cpuinfo(monkeypatch, proc_files, processor, machine, expected):
    # no model line, or none at all
    proc_files["/proc/cpuinfo"] = CPUINFO_ARM if processor == "i386" else ""
    if processor != "i386":
        del proc_files["/proc/cpuinfo"]
    monkeypatch.setattr(host.platform, "processor", lambda: processor)
    monkeypatch.setattr(host.platform, "machine", lambda: machine)
    assert host.cpu_name() == expected
