"""kernel_probe.detect.host: OS, Python, CPU model and memory; the driver version read from
/proc."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from kernel_lock import host as fp_host
from kernel_probe.detect import host


def test_driver_version_from_proc_file(tmp_path, monkeypatch):
    f = tmp_path / "version"
    f.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n"
    )
    monkeypatch.setitem(fp_host.DRIVER_FILES, "cuda", (str(f), fp_host.DRIVER_FILES["cuda"][1]))
    assert fp_host.driver_version("cuda") == "550.54.15"
    rocm_pattern = fp_host.DRIVER_FILES["rocm"][1]
    monkeypatch.setitem(fp_host.DRIVER_FILES, "rocm", (str(tmp_path / "missing"), rocm_pattern))
    assert fp_host.driver_version("rocm") == ""
    assert fp_host.driver_version("cpu") == ""


def _arch(name, vendor, generic):
    return SimpleNamespace(name=name, vendor=vendor, generic=SimpleNamespace(name=generic))


@pytest.mark.parametrize(
    "cpu, expected",
    [
        (
            _arch("zen3", "AuthenticAMD", "x86_64_v3"),
            {
                "microarch": "zen3",
                "generic": "x86_64_v3",
                "vendor": "AuthenticAMD",
                "model_known": True,
            },
        ),
        (
            _arch("neoverse_v2", "ARM", "armv9.0a"),
            {
                "microarch": "neoverse_v2",
                "generic": "armv9.0a",
                "vendor": "ARM",
                "model_known": True,
            },
        ),
        (
            _arch("x86_64_v4", "generic", "x86_64_v4"),
            {
                "microarch": "x86_64_v4",
                "generic": "x86_64_v4",
                "vendor": "generic",
                "model_known": False,
            },
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


def test_cpu_model_takes_a_generic_level_given_as_a_name():
    cpu = SimpleNamespace(name="power9le", vendor="IBM", generic="ppc64le")
    assert host.cpu_model(cpu) == {
        "microarch": "power9le",
        "generic": "ppc64le",
        "vendor": "IBM",
        "model_known": True,
    }
    no_generic = SimpleNamespace(name="a64fx", vendor="Fujitsu", generic=None)
    assert host.cpu_model(no_generic)["generic"] is None


# ---- memory ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "meminfo, cgroup, expected",
    [
        (
            {"MemTotal": 512 * 2**30, "MemAvailable": 400 * 2**30},
            None,
            {
                "total_bytes": 512 * 2**30,
                "available_bytes": 400 * 2**30,
                "cgroup_limit_bytes": None,
            },
        ),
        (
            {"MemTotal": 512 * 2**30},
            64 * 2**30,  # a Slurm job's allocation
            {"total_bytes": 512 * 2**30, "available_bytes": None, "cgroup_limit_bytes": 64 * 2**30},
        ),
    ],
)
def test_memory_from_meminfo_and_cgroup(monkeypatch, meminfo, cgroup, expected):
    monkeypatch.setattr(host, "_meminfo", lambda: meminfo)
    monkeypatch.setattr(host, "_cgroup_memory_limit", lambda: cgroup)
    assert host.memory() == expected


def test_memory_without_proc_meminfo_asks_sysconf(monkeypatch):
    monkeypatch.setattr(host, "_meminfo", dict)
    monkeypatch.setattr(host, "_cgroup_memory_limit", lambda: None)
    sizes = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1000}
    monkeypatch.setattr(host.os, "sysconf", sizes.__getitem__)
    assert host.memory()["total_bytes"] == 4096 * 1000

    def unsupported(_name):
        raise ValueError("unrecognized configuration name")

    monkeypatch.setattr(host.os, "sysconf", unsupported)
    assert host.memory() == {
        "total_bytes": None,
        "available_bytes": None,
        "cgroup_limit_bytes": None,
    }


def test_detect_host_shape(monkeypatch):
    monkeypatch.setattr(host.fingerprint_host, "archspec_host", lambda: None)
    h = host.detect_host()
    assert list(h) == ["os", "python", "cpu", "memory"]
    assert h["python"]["virtualenv"] is (sys.prefix != sys.base_prefix)
    assert h["python"]["executable"] == sys.executable
    # no archspec answer
    assert h["cpu"]["microarch"] == "unknown" and h["cpu"]["model_known"] is False
    assert h["os"]["platform"] == sys.platform
