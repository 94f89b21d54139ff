"""What the GPU benchmarks share: their shapes, the machine they ran on, and how they write results.

One home for the GPU run's sizes (``gpu_all.py``, ``gpu_choice.py`` and ``anemoi_step.py`` read them
here) and for the environment record every result file carries, so the report can tell a GPU run
from a smoke run on a CPU and never present one as the other.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

# the anemoi O96-like processor (40320 nodes x 1024 channels), an O96 + o1280-ish token count, and a
# wide-channel shape where the kernels' per-row cost changes (the anchor's shapes,
# ../shared/anchors)
GPU_SHAPES = ("40320x1024", "542080x1024", "32768x4096")
# the same three aspect ratios (anemoi, many rows, wide rows), small enough for a 2-core CPU
SMOKE_SHAPES = ("640x64", "4096x64", "256x256")
# bf16 as anemoi trains (under autocast, float32 parameters) and float32 (the anchor's float32 rows
# are directly comparable). bf16-true (plain bfloat16 modules, the anchor's bf16 rows) is one more
# probe of about 85 s on an H200, which the 8-minute run has no room for: `gpu_choice.py --precision
# bf16-true`.
PRECISIONS = ("bf16-mixed", "32-true")
SMOKE_LABEL = "SMOKE (CPU-sized shapes on a CPU; not GPU results)"


def smoke_threads(smoke: bool) -> None:
    """A smoke run on a shared CPU: one OpenMP thread per process (inherited by the probe's
    workers). Several processes each spinning on every core slow each other down by 5-10x; the
    figures of a smoke run are labelled as such anyway. Call before torch is imported."""
    if smoke:
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (
        out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    )


def environment(smoke: bool) -> dict[str, Any]:
    """The machine and software a result was measured with (imports torch)."""
    import torch

    cuda = torch.cuda.is_available()
    env: dict[str, Any] = {
        "smoke": smoke,
        "label": SMOKE_LABEL if smoke else "GPU run",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "hip_runtime": getattr(torch.version, "hip", None),
        "device": torch.cuda.get_device_name(0)
        if cuda
        else f"CPU ({os.cpu_count()} cores, {platform.machine()})",
        "device_type": "cuda" if cuda else "cpu",
        "driver": _driver() if cuda else None,
        "triton": _version("triton") or _version("pytorch-triton-rocm"),
        "liger_kernel": _version("liger-kernel"),
        "transformer_engine": _version("transformer-engine")
        or _version("transformer-engine-torch"),
        "anemoi_models": _version("anemoi-models"),
    }
    if cuda:
        props = torch.cuda.get_device_properties(0)
        env["capability"] = f"sm_{props.major}{props.minor}"
        env["memory_gib"] = round(props.total_memory / 2**30, 1)
    return env


def write_json(path: Path, data: Any) -> None:
    """Written whole or not at all: a part killed at its time limit leaves no half file."""
    from kernel_lock.files import write_file

    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(data, indent=1, default=str) + "\n")  # the one safe writer
