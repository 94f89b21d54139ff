"""kernel_probe.detect.host: OS, Python, CPU model and memory; the driver version read from /proc."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from kernel_lock.fingerprint import host as fp_host
from kernel_probe.detect import host


def test_driver_version_from_proc_file(tmp_path, monkeypatch):
    f = tmp_path / "version"
    f.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n")
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
