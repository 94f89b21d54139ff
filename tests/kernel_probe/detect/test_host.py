"""kernel_probe.detect.host: OS, Python, CPU model and memory; the driver version read from
/proc; native or emulated bf16 / fp16 matmul, from CPU flags and oneDNN's ISA ceiling (tables of
flags as /proc/cpuinfo writes them), and the probe's up-front warning; the site signals (hostname,
Slurm variables and site markers, as found)."""

from __future__ import annotations

import os
import socket
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
    monkeypatch.setattr(host.fp_host, "archspec_host", lambda: None)
    h = host.detect_host()
    assert list(h) == ["os", "python", "cpu", "memory"]
    assert h["python"]["virtualenv"] is (sys.prefix != sys.base_prefix)
    assert h["python"]["executable"] == sys.executable
    # no archspec answer
    assert h["cpu"]["microarch"] == "unknown" and h["cpu"]["model_known"] is False
    assert h["os"]["platform"] == sys.platform


# ---- CPU matmul: native or emulated -----------------------------------------------------------
AVX2_ONLY = "fpu sse sse2 avx avx2 fma f16c"  # f16c converts, it does not multiply
SAPPHIRE = AVX2_ONLY + " avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8"
COOPER = AVX2_ONLY + " avx512f avx512_bf16"
GRAVITON3 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm"


@pytest.mark.parametrize(
    "flags, env, bf16, fp16",
    [
        (AVX2_ONLY, {}, (False, ""), (False, "")),
        (COOPER, {}, (True, "AVX-512 BF16"), (False, "")),
        (SAPPHIRE, {}, (True, "AMX BF16"), (True, "AVX-512 FP16")),
        (GRAVITON3, {}, (True, "ARM BF16"), (True, "ARM FP16")),
        (
            SAPPHIRE,
            {"ONEDNN_MAX_CPU_ISA": "AVX2"},
            (False, ""),
            (False, ""),
        ),  # oneDNN kept below the path
        (SAPPHIRE, {"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"}, (True, "AVX-512 BF16"), (False, "")),
        (
            SAPPHIRE,
            {"DNNL_MAX_CPU_ISA": "AVX512_CORE_AMX"},
            (True, "AMX BF16"),
            (True, "AVX-512 FP16"),
        ),
        (SAPPHIRE, {"ONEDNN_MAX_CPU_ISA": "ALL"}, (True, "AMX BF16"), (True, "AVX-512 FP16")),
        (
            GRAVITON3,
            {"ONEDNN_MAX_CPU_ISA": "AVX2"},
            (True, "ARM BF16"),
            (True, "ARM FP16"),
        ),  # an x86 ceiling
    ],
)
def test_native_or_emulated_by_flags_and_onednn_ceiling(flags, env, bf16, fp16):
    got = host.matmul(flags.split(), env)
    assert (got["bfloat16"]["native"], got["bfloat16"]["path"]) == bf16
    assert (got["float16"]["native"], got["float16"]["path"]) == fp16
    for fact in got.values():
        assert fact["why"]  # every answer says why
        if env and not fact["native"] and "avx512_bf16" in flags:
            assert "ONEDNN_MAX_CPU_ISA" in fact["why"]


def test_flags_come_from_the_first_flags_or_features_line():
    text = "processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert host.cpu_flags(text) == {"fpu", "avx2", "avx512_bf16"}
    assert host.cpu_flags("processor : 0\nFeatures : fp asimd bf16\n") == {"fp", "asimd", "bf16"}
    assert host.cpu_flags("nothing here\n") is None


def test_unreadable_flags_are_unknown_not_emulated(monkeypatch):
    monkeypatch.setattr(host, "cpu_flags", lambda cpuinfo=None: None)
    got = host.matmul(env={})
    assert got["bfloat16"]["native"] is None and "/proc/cpuinfo" in got["bfloat16"]["why"]
    assert host.emulated_warning("bfloat16", got) is None  # nothing is claimed that was not read
    assert host.describe(got["bfloat16"]).startswith("unknown: ")


def test_the_warning_is_for_an_emulated_dtype_only():
    emulated = host.matmul(AVX2_ONLY.split(), {})
    line = host.emulated_warning("bfloat16", emulated)
    assert line is not None and line.startswith(
        "bfloat16 matmul is emulated on this CPU (the CPU has none of "
    )
    assert host.describe(emulated["bfloat16"]).startswith("emulated: ")
    native = host.matmul(SAPPHIRE.split(), {})
    assert host.emulated_warning("bfloat16", native) is None
    assert host.emulated_warning("float32", emulated) is None
    assert host.describe(native["bfloat16"]) == "native: AMX BF16"


def test_this_machine_reads_the_same_flags_as_proc_cpuinfo():
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        text = fh.read()
    assert host.cpu_flags() == host.cpu_flags(text)


# ---- site signals ------------------------------------------------------------------------------


def test_site_signals(tmp_path):
    systemname = tmp_path / "systemname"
    systemname.write_text("juwelsbooster\n")
    markers = host.SITE_MARKERS + (
        host.SiteMarker("file", str(systemname), "JSC"),
        host.SiteMarker("file", str(tmp_path / "absent"), "nowhere"),
    )
    env = {
        "LUMI_STACK_NAME": "LUMI",
        "SLURM_JOB_ID": "123",
        "SLURM_CLUSTER_NAME": "lumi",
        "HOME": "/users/x",
        "SLURM_SECRET_UNLISTED": "x",
    }
    s = host.detect_site(env, hostname="nid005123", markers=markers)
    assert s["hostname"] == "nid005123"
    assert s["slurm"] == {"SLURM_CLUSTER_NAME": "lumi", "SLURM_JOB_ID": "123"}
    signals = {m["signal"]: m["value"] for m in s["markers"]}
    assert signals["env:LUMI_STACK_NAME"] == "LUMI"
    assert signals[f"file:{systemname}"] == "juwelsbooster"
    assert not any("absent" in k for k in signals)


def test_site_markers_cover_the_issue_list():
    names = {m.name for m in host.SITE_MARKERS}
    wanted = {
        "LUMI_STACK_NAME",
        "SYSTEMNAME",
        "/etc/FZJ/systemname",
        "CLUSTER_NAME",
        "NERSC_HOST",
        "BSC_MACHINE",
    }
    assert wanted <= names


# ---- marker files: read safely, first line only ------------------------------------------------
@pytest.mark.parametrize(
    "content, value",
    [
        ("juwelsbooster\n", "juwelsbooster"),
        ("  jurecadc  \nsecond line\n", "jurecadc"),
        ("no newline", "no newline"),
        ("\nsecond line only\n", None),  # an empty first line says nothing
        ("", None),
        ("   \n", None),
    ],
)
def test_read_marker_takes_the_first_line(tmp_path, content, value):
    path = tmp_path / "systemname"
    path.write_text(content)
    assert host.read_marker(str(path)) == (value, "")
    assert host.read_marker(str(path))[0] == value


def test_read_marker_of_an_absent_file_is_silent(tmp_path):
    assert host.read_marker(str(tmp_path / "absent")) == (None, "")


def test_read_marker_refuses_a_directory(tmp_path):
    value, why = host.read_marker(str(tmp_path))
    assert value is None and why.startswith("is a directory, not a") and why.endswith(": not read")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_read_marker_never_blocks_on_a_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    value, why = host.read_marker(str(fifo))
    assert value is None and "not a regular file" in why and why.endswith(": not read")


def test_read_marker_refuses_a_file_over_its_limit(tmp_path):
    path = tmp_path / "big"
    path.write_text("x" * 100 + "\n")
    value, why = host.read_marker(str(path), limit=10)
    assert value is None and "more than the 10" in why
    assert host.read_marker(str(path), limit=200) == ("x" * 100, "")


def test_read_marker_replaces_undecodable_bytes(tmp_path):
    path = tmp_path / "m"
    path.write_bytes(b"lumi\xff\n")
    assert host.read_marker(str(path)) == ("lumi\ufffd", "")


# ---- detect_site -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env, markers",
    [
        ({}, []),
        ({"NERSC_HOST": "perlmutter"}, [("env:NERSC_HOST", "perlmutter", "NERSC (perlmutter)")]),
        ({"NERSC_HOST": ""}, []),  # set but empty: no signal
        (
            {"BSC_MACHINE": "mn5", "CLUSTER_NAME": "daint"},  # in the table's order, not the env's
            [
                ("env:CLUSTER_NAME", "daint", "CSCS Alps (daint, clariden, santis)"),
                ("env:BSC_MACHINE", "mn5", "BSC (mn5)"),
            ],
        ),
    ],
)
def test_detect_site_env_markers(env, markers):
    env_only = tuple(m for m in host.SITE_MARKERS if m.kind == "env")
    found = host.detect_site(env, hostname="h", markers=env_only)["markers"]
    assert [(m["signal"], m["value"], m["hint"]) for m in found] == markers


def test_detect_site_keeps_only_the_listed_slurm_variables():
    env = {name: str(i) for i, name in enumerate(host.SLURM_VARIABLES)} | {
        "SLURM_JOB_NAME": "secret",
        "PATH": "/x",
    }
    slurm = host.detect_site(env, hostname="h", markers=())["slurm"]
    # every one, in the table's order, nothing else
    assert list(slurm) == list(host.SLURM_VARIABLES)


def test_detect_site_defaults_to_this_host_and_environment(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    s = host.detect_site(markers=())
    assert s["hostname"] == socket.gethostname()
    assert s["slurm"]["SLURM_JOB_ID"] == "4242"


# ---- the load seen while a candidate is timed ----------------------------------------------------
def test_cpu_seconds_reads_every_process_with_its_parent(tmp_path):
    # after the name: state, ppid, pgrp, session, tty, tpgid, flags, 4 fault counts, utime, stime
    for pid, stat in (
        (1, "1 (init) S 0 1 1 0 -1 0 0 0 0 0 200 100 0 0"),
        (42, "42 (a (b) c) R 1 1 1 0 -1 0 0 0 0 0 50 25 0 0"),
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat + "\n")
    (tmp_path / "self").mkdir()
    got = host.cpu_seconds(str(tmp_path))
    tick = os.sysconf("SC_CLK_TCK")
    assert got == {1: (0, 300 / tick), 42: (1, 75 / tick)}  # a name with spaces and parentheses
    assert host.cpu_seconds(str(tmp_path / "nowhere")) == {}


def test_a_busy_process_outside_the_probe_is_seen_and_the_probes_own_are_not():
    import time

    load = host.Load()
    deadline = time.perf_counter() + 0.3
    while time.perf_counter() < deadline:  # this process is busy: it is ours, never counted
        pass
    seen = load.seen()
    assert set(seen) == {"load_average", "busy_processes"} and seen["busy_processes"] >= 0
    assert host.busy_others({}, {os.getpid(): (1, 10.0)}, 1.0) == 0
    assert host.busy_others({}, {os.getpid() + 10**6: (1, 10.0)}, 1.0) == 1


def test_on_a_gpu_the_other_processes_computing_there_are_seen(monkeypatch):
    monkeypatch.setattr(fp_host, "nvml_compute_pids", lambda: [os.getpid(), 10**7])
    assert host.Load(gpu=True).seen()["gpu_processes"] == 1  # the probe's own is not another's
    monkeypatch.setattr(fp_host, "nvml_compute_pids", lambda: None)
    assert "gpu_processes" not in host.Load(gpu=True).seen()  # NVML cannot say: not recorded
