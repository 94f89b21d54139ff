"""Whether this CPU multiplies bf16 and fp16 matrices natively, or torch emulates it (slowly).

Facts as data: the CPU flags (``/proc/cpuinfo``: x86 ``flags``, ARM ``Features``) that give a native
path, and oneDNN's ISA ceiling (``ONEDNN_MAX_CPU_ISA``), which can keep torch's CPU matmuls from a
path the hardware has. Without a native path a bf16 GEMM is computed through float32 conversions
element by element: on an AVX2-only CPU one forward+backward of a 2048x1024x1024 Linear takes
seconds instead of milliseconds, which is what a bf16-mixed probe's timing then measures. No torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

# flag -> (what it is, the dtype it makes native); the first flag present names the path
NATIVE_FLAGS: dict[str, tuple[tuple[str, str], ...]] = {
    "bfloat16": (("amx_bf16", "AMX BF16"), ("avx512_bf16", "AVX-512 BF16"), ("bf16", "ARM BF16")),
    "float16": (("amx_fp16", "AMX FP16"), ("avx512_fp16", "AVX-512 FP16"), ("fphp", "ARM FP16")),
}
# oneDNN's ISA names, lowest first, and the lowest that reaches each native path
# (https://uxlfoundation.github.io/oneDNN/dev_guide_cpu_dispatcher_control.html)
ONEDNN_ISAS = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX512_CORE_FP16",
    "AVX512_CORE_AMX",
    "AVX10_1_512_AMX",
    "AVX512_CORE_AMX_FP16",
    "AVX10_1_512_AMX_FP16",
)
ONEDNN_NEEDS = {
    "AMX BF16": "AVX512_CORE_AMX",
    "AVX-512 BF16": "AVX512_CORE_BF16",
    "AMX FP16": "AVX512_CORE_AMX_FP16",
    "AVX-512 FP16": "AVX10_1_512",
}
ONEDNN_ALIASES = {"AVX512_CORE_FP16": "AVX10_1_512", "AVX10_1_512_AMX": "AVX512_CORE_AMX"}


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The CPU's feature flags (the first ``flags`` or ``Features`` line); None when unreadable."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                cpuinfo = fh.read(1 << 20)
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return None


def _isa_rank(name: str) -> int | None:
    name = ONEDNN_ALIASES.get(name, name)
    return ONEDNN_ISAS.index(name) if name in ONEDNN_ISAS else None


def matmul(
    flags: Iterable[str] | None = None, env: Mapping[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per low-precision dtype: ``native`` (True, False, or None when the flags are unreadable),
    ``path`` (the flag's name, e.g. "AMX BF16") and ``why`` (the path, or why there is none)."""
    flagset = cpu_flags() if flags is None else set(flags)
    env = os.environ if env is None else env
    ceiling = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    out: dict[str, dict[str, Any]] = {}
    for dtype, paths in NATIVE_FLAGS.items():
        if flagset is None:
            out[dtype] = {
                "native": None,
                "path": "",
                "why": "the CPU's flags could not be read (/proc/cpuinfo)",
            }
            continue
        have = [name for flag, name in paths if flag in flagset]
        wanted = ", ".join(name for _, name in paths)
        if not have:
            out[dtype] = {"native": False, "path": "", "why": f"the CPU has none of {wanted}"}
            continue
        rank = _isa_rank(ceiling) if ceiling and ceiling not in ("ALL", "DEFAULT") else None
        usable = [
            n
            for n in have
            if rank is None or n not in ONEDNN_NEEDS or rank >= (_isa_rank(ONEDNN_NEEDS[n]) or 0)
        ]
        if not usable:
            out[dtype] = {
                "native": False,
                "path": "",
                "why": f"the CPU has {', '.join(have)}, but ONEDNN_MAX_CPU_ISA={ceiling} keeps "
                "oneDNN from it",
            }
            continue
        out[dtype] = {"native": True, "path": usable[0], "why": f"{usable[0]}"}
    return out


def emulated_warning(
    dtype: str, facts: Mapping[str, Mapping[str, Any]] | None = None
) -> str | None:
    """The line a CPU probe prints before any work when ``dtype``'s matmuls are emulated here."""
    facts = matmul() if facts is None else facts
    fact = facts.get(dtype)
    if fact is None or fact["native"] is not False:
        return None
    return (
        f"{dtype} matmul is emulated on this CPU ({fact['why']}): a {dtype} Linear's timing "
        "measures the emulation (seconds per call at the default shape), so only the calls that "
        "can change a choice are made; the time of one call follows once it is measured"
    )


def describe(fact: Mapping[str, Any]) -> str:
    """``native: AMX BF16``, ``emulated: the CPU has none of ...``, ``unknown: ...``."""
    return {True: "native", False: "emulated", None: "unknown"}[fact["native"]] + f": {fact['why']}"
