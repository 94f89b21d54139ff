"""kernel_probe.detect.host (CPU matmul): native or emulated bf16 / fp16 matmul, from CPU flags
and oneDNN's ISA ceiling (tables of flags as /proc/cpuinfo writes them), and the probe's up-front
warning.

The public names used: ``cpu_flags``, ``matmul``, ``emulated_warning``, ``describe``.
"""

from __future__ import annotations

import pytest

from kernel_probe.detect import host

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
