"""The host without torch: OS, Python, CPU (archspec; native or emulated bf16/fp16 matmul: without a
native path a bf16 Linear's timing measures an emulation, seconds per call), memory, and the site
signals (hostname, Slurm variables, site markers) as found; which site it is, the profiles decide.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from kernel_lock import host as fp_host
from kernel_lock.files import UnsafeFile, read_regular

# per dtype, (flag in /proc/cpuinfo, the path it gives); the first flag present names the path
NATIVE_FLAGS: dict[str, tuple[tuple[str, str], ...]] = {
    "bfloat16": (("amx_bf16", "AMX BF16"), ("avx512_bf16", "AVX-512 BF16"), ("bf16", "ARM BF16")),
    "float16": (("amx_fp16", "AMX FP16"), ("avx512_fp16", "AVX-512 FP16"), ("fphp", "ARM FP16")),
}
# oneDNN's ISA names, lowest first, and the lowest that reaches each native path
# (https://uxlfoundation.github.io/oneDNN/dev_guide_cpu_dispatcher_control.html)
ONEDNN_ISAS = (
    ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")
    + ("AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX512_CORE_AMX")
    + ("AVX10_1_512_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16")
)
ONEDNN_NEEDS = {"AMX BF16": "AVX512_CORE_AMX", "AVX-512 BF16": "AVX512_CORE_BF16"}
ONEDNN_NEEDS |= {"AMX FP16": "AVX512_CORE_AMX_FP16", "AVX-512 FP16": "AVX10_1_512"}
ONEDNN_ALIASES = {"AVX512_CORE_FP16": "AVX10_1_512", "AVX10_1_512_AMX": "AVX512_CORE_AMX"}


class SiteMarker(NamedTuple):
    """A variable or file (its first line) a site sets; ``hint``: the site it usually means."""

    kind: str  # "env" or "file"
    name: str
    hint: str


_JSC = "JSC (juwelsbooster, jurecadc, jupiter)"
SITE_MARKERS: tuple[SiteMarker, ...] = (
    SiteMarker("env", "LUMI_STACK_NAME", "LUMI (CSC)"),
    SiteMarker("env", "LUMI_STACK_PARTITION", "LUMI (CSC)"),
    SiteMarker("env", "SYSTEMNAME", _JSC),
    SiteMarker("file", "/etc/FZJ/systemname", _JSC),
    SiteMarker("env", "CLUSTER_NAME", "CSCS Alps (daint, clariden, santis)"),
    SiteMarker("env", "NERSC_HOST", "NERSC (perlmutter)"),
    SiteMarker("env", "BSC_MACHINE", "BSC (mn5)"),
    SiteMarker("env", "HPCPERM", "ECMWF Atos HPC2020"),
    SiteMarker("env", "ALL_CCFRWORK", "IDRIS Jean Zay"),
    SiteMarker("env", "PROJECTDIR", "Isambard-AI (BriCS), among others"),
)
# the Slurm variables worth keeping with a lock: cluster, job, partition and GPU allocation
SLURM_VARIABLES = (
    ("SLURM_CLUSTER_NAME", "SLURM_JOB_ID", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT")
    + ("SLURM_JOB_QOS", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_PROCID")
    + ("SLURM_LOCALID", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS")
    + ("SLURM_STEP_GPUS",)
)
MARKER_BYTES = 64 << 10  # a marker file is one short line


def read_lines(path: str) -> list[str]:
    """The lines of the text file at ``path`` (its first MiB); none when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(1 << 20).splitlines()
    except OSError:
        return []


def _os_release() -> str | None:
    found = (
        ln.split("=", 1)[1] for ln in read_lines("/etc/os-release") if ln.startswith("PRETTY_NAME=")
    )
    return next(found, "").strip().strip('"') or None


def cpu_model(host: Any | None) -> dict[str, Any]:
    """archspec's view of the CPU (``host``: a ``Microarchitecture`` or None); an unknown model is
    ``model_known: false``."""
    if host is None:
        return {"microarch": "unknown", "generic": None, "vendor": None, "model_known": False}
    generic, vendor = getattr(host, "generic", None), str(getattr(host, "vendor", "") or "")
    generic = str(getattr(generic, "name", generic)) if generic is not None else None
    return dict(microarch=str(host.name), generic=generic, vendor=vendor or None) | {
        "model_known": vendor.lower() != "generic"
    }


def _brand() -> str | None:
    try:
        import archspec.cpu  # optional, and slow to import

        return archspec.cpu.brand_string() or None
    except Exception:  # archspec missing or unable to read the brand: the name is then unknown
        return None


def usable_cores() -> int | None:
    """The CPUs this process may run on (what Slurm/cgroups allow, not the node), or None."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(ValueError, IndexError):
        for key, _, rest in (line.partition(":") for line in read_lines("/proc/meminfo")):
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def _cgroup_memory_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="utf-8") as fh:
                value = fh.read().strip()
        except OSError:
            continue
        # cgroup v1 writes a huge number for "no limit"
        return int(value) if value.isdigit() and int(value) < (1 << 60) else None
    return None


def memory() -> dict[str, int | None]:
    """Total and available memory and the cgroup limit (a Slurm job's allocation), in bytes."""
    info = _meminfo()
    total = info.get("MemTotal")
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = None
    return {
        "total_bytes": total,
        "available_bytes": info.get("MemAvailable"),
        "cgroup_limit_bytes": _cgroup_memory_limit(),
    }


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The CPU's feature flags (the first ``flags`` or ``Features`` line); None when unreadable."""
    lines = read_lines("/proc/cpuinfo") if cpuinfo is None else cpuinfo.splitlines()
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return None


def _isa_rank(name: str) -> int | None:
    name = ONEDNN_ALIASES.get(name, name)
    return ONEDNN_ISAS.index(name) if name in ONEDNN_ISAS else None


def _reaches(rank: int | None, path: str) -> bool:  # an ISA ceiling of rank (None: none)
    return rank is None or path not in ONEDNN_NEEDS or rank >= (_isa_rank(ONEDNN_NEEDS[path]) or 0)


def matmul(
    flags: Iterable[str] | None = None, env: Mapping[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per low-precision dtype: ``native`` (None: flags unreadable), ``path`` and ``why``; an
    ``ONEDNN_MAX_CPU_ISA`` below the path's ISA keeps oneDNN from it."""
    flagset = cpu_flags() if flags is None else set(flags)
    env = os.environ if env is None else env
    ceiling = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    rank = _isa_rank(ceiling) if ceiling not in ("", "ALL", "DEFAULT") else None
    out: dict[str, dict[str, Any]] = {}
    for dtype, paths in NATIVE_FLAGS.items():
        have = [name for flag, name in paths if flagset is not None and flag in flagset]
        usable = [n for n in have if _reaches(rank, n)]
        why = usable[0] if usable else f"the CPU has none of {', '.join(n for _, n in paths)}"
        if flagset is None:
            why = "the CPU's flags could not be read (/proc/cpuinfo)"
        elif have and not usable:
            why = f"the CPU has {', '.join(have)}, but ONEDNN_MAX_CPU_ISA={ceiling} keeps oneDNN "
            why += "from it"
        native = None if flagset is None else bool(usable)
        out[dtype] = {"native": native, "path": usable[0] if usable else "", "why": why}
    return out


def emulated_warning(
    dtype: str, facts: Mapping[str, Mapping[str, Any]] | None = None
) -> str | None:
    """The line a CPU probe prints before any work when ``dtype``'s matmuls are emulated here."""
    fact = (matmul() if facts is None else facts).get(dtype)
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


def detect_host() -> dict[str, Any]:
    """The host's facts: operating system, Python, CPU, memory."""
    return {
        "os": {
            "platform": sys.platform,
            "system": platform.system(),
            "release": platform.release(),
            "distribution": _os_release(),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            "prefix": sys.prefix,
            "virtualenv": sys.prefix != sys.base_prefix,
        },
        "cpu": {
            "arch": platform.machine().lower(),
            **cpu_model(fp_host.archspec_host()),
            "brand": _brand(),
            "cores": os.cpu_count(),
            "usable_cores": usable_cores(),
            "matmul": matmul(),  # issue 38
        },
        "memory": memory(),
    }


def read_marker(path: str, limit: int = MARKER_BYTES) -> tuple[str | None, str]:
    """(The first line of the marker file at ``path`` or None, why it was not read: '' if absent or
    read); a regular file only, non-blocking, at most ``limit`` bytes."""
    try:
        data = read_regular(path, limit)
    except FileNotFoundError:
        return None, ""
    except UnsafeFile as exc:
        return None, f"{exc.problem}: not read"
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    return data.decode("utf-8", errors="replace").partition("\n")[0].strip() or None, ""


def detect_site(
    env: Mapping[str, str] | None = None,
    *,
    hostname: str | None = None,
    markers: tuple[SiteMarker, ...] = SITE_MARKERS,
) -> dict[str, Any]:
    """The hostname, the Slurm variables set and the site markers found."""
    env = os.environ if env is None else env
    seen = ((m, env.get(m.name) if m.kind == "env" else read_marker(m.name)[0]) for m in markers)
    found = [{"signal": f"{m.kind}:{m.name}", "value": v, "hint": m.hint} for m, v in seen if v]
    return {
        "hostname": hostname if hostname is not None else socket.gethostname(),
        "slurm": {name: env[name] for name in SLURM_VARIABLES if name in env},
        "markers": found,
    }


# ---- what else runs here while a candidate is timed ----------------------------------------------
BUSY_SHARE = 0.1  # a process that used this share of a core over a timed block counts as busy


def cpu_seconds(root: str = "/proc") -> dict[int, tuple[int, float]]:
    """Every process's (parent pid, CPU seconds used so far, all threads) from ``/proc/<pid>/stat``;
    {} where there is no /proc."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[int, float]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if not name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"{root}/{name}/stat", "rb") as fh:
                    text = fh.read(4096).decode("ascii", "replace")
                fields = text[text.rfind(")") + 2 :].split()  # the name may hold spaces, parens
                out[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return out


def busy_others(
    before: Mapping[int, tuple[int, float]],
    after: Mapping[int, tuple[int, float]],
    seconds: float,
    root: int | None = None,
) -> int:
    """The processes outside ``root``'s tree (default: this process, its workers and theirs) that
    used ``BUSY_SHARE`` of a core or more between the two readings, ``seconds`` apart.

    >>> before = {1: (0, 5.0), 10: (1, 0.0), 11: (10, 0.0), 20: (1, 0.0)}
    >>> after = {1: (0, 5.0), 10: (1, 1.0), 11: (10, 1.0), 20: (1, 0.9), 21: (1, 0.5)}
    >>> busy_others(before, after, 1.0, root=10)  # 20 and 21 (new); 10 and 11 are ours
    2
    """
    ours = _tree(after, os.getpid() if root is None else root)
    floor = BUSY_SHARE * max(seconds, 1e-9)
    used = {pid: cpu - before.get(pid, (0, 0.0))[1] for pid, (_, cpu) in after.items()}
    return sum(1 for pid, cpu in used.items() if pid not in ours and cpu >= floor)


def _tree(processes: Mapping[int, tuple[int, float]], root: int) -> set[int]:
    """``root`` and every process descending from it."""
    ours, grew = {root}, True
    while grew:
        more = {pid for pid, (parent, _) in processes.items() if parent in ours} - ours
        ours, grew = ours | more, bool(more)
    return ours


class Load:
    """What else ran on the machine over a timed block: made before it, ``seen()`` after it;
    ``gpu``: also the other processes NVML sees computing on the GPU (where it can say)."""

    def __init__(self, gpu: bool = False) -> None:
        self.gpu, self.started, self.before = gpu, time.perf_counter(), cpu_seconds()

    def seen(self) -> dict[str, float | int]:
        """The 1-minute load average now, the other busy processes since the start, and on a GPU
        the other processes computing on it now."""
        seconds, after = time.perf_counter() - self.started, cpu_seconds()
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        out: dict[str, float | int] = {"load_average": round(load, 2)}
        out["busy_processes"] = busy_others(self.before, after, seconds)
        pids = fp_host.nvml_compute_pids() if self.gpu else None
        if pids is not None:
            out["gpu_processes"] = len(set(pids) - _tree(after, os.getpid()))
        return out
