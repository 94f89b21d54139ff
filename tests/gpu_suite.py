"""The GPU suite's work (tests/test_gpu.py), written for any device so that its code paths also run,
on torch.nn's candidates, on a CPU (tests/test_gpu_kit.py).

Everything goes through the project's own machinery: the registry's candidates, ``check_all`` in the
isolated workers (forward and backward against float64, every hard input, each row of ``ROWS``), and
the timing workers (``TimeRequest``, ``kernel_probe/probe/timing.py``). Added to the registry: liger's
RMSNorm with its *default* ``in_place=True``, which the registry pins off because its backward
overwrites grad_output; the checks must reject it for exactly that.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kernel_lock.slots import PRECISIONS, SLOTS
from kernel_probe.probe.candidates import Candidate, registry
from kernel_probe.probe.check import check_all, dtype_plan
from kernel_probe.probe.report import Report

# float32, bf16-true, bf16-mixed: the precision regimes a model trains in
ROWS = dtype_plan(["float32", "bfloat16"])
TIMED = ("32-true", "bf16-true", "bf16-mixed")
IN_PLACE_ID = "liger.rms_norm.in_place"


def candidates(only: Iterable[str] | None = None) -> list[Candidate]:
    """The built-in registry plus liger's RMSNorm with ``in_place=True`` (``only``: these ids)."""
    cands, problems = registry([], entry_points=False)
    assert problems == [], problems
    liger = next(c for c in cands if c.id == "liger.rms_norm")
    in_place = dataclasses.replace(liger, id=IN_PLACE_ID, kwargs={**liger.kwargs, "in_place": True})
    out = [*cands, in_place]
    return [c for c in out if only is None or c.id in set(only)]


def verdicts(device: str, arch: str, cands: list[Candidate], *, timeout: float = 120.0) -> dict[str, Report]:
    """Every candidate checked in every row of ``ROWS`` (torch.compile included), by id."""
    from kernel_probe.isolation.worker import WorkerPool

    with WorkerPool() as pool:
        reports = check_all(SLOTS, cands, device, ROWS, arch=arch, with_compile=True, timeout=timeout, workers=pool)
    return {r.id: r for rs in reports.values() for r in rs}


def timings(device: str, reports: Mapping[str, Report], shape: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Each accepted candidate timed at ``shape`` in every precision of ``TIMED``: id -> precision -> row."""
    from kernel_probe.isolation.protocol import TimeRequest
    from kernel_probe.isolation.worker import WorkerPool
    from kernel_probe.probe.limits import TIMING_TIMEOUT

    out: dict[str, dict[str, dict[str, Any]]] = {}
    with WorkerPool() as pool:
        pool.prepare()
        for r in reports.values():
            if r.status != "accepted" or r.candidate is None:
                continue
            with pool.worker_for(r.candidate) as worker:
                for precision in TIMED:
                    dtype, regime = PRECISIONS[precision]
                    request = TimeRequest(
                        candidate=r.candidate,
                        slot=r.slot,
                        device=device,
                        shapes=(shape,),
                        dtype=dtype,
                        regime=regime,
                        options={"reps": 10, "warmup": 3, "min_seconds": 0.0},
                    )
                    reply = worker.call(request, TIMING_TIMEOUT)
                    assert not reply.tampered, (r.id, reply.tampered)
                    out.setdefault(r.id, {})[precision] = dict(reply.rows[0])
    return out


def autocast_dtypes(reports: Mapping[str, Report]) -> dict[str, str]:
    """Every accepted candidate's output dtype under autocast (the mixed row), by id."""
    return {
        cid: v.out_dtype
        for cid, r in reports.items()
        if r.status == "accepted"
        for v in r.verdicts
        if v.regime == "mixed" and v.status == "accepted"
    }


def record(path: Path, device: str, reports: Mapping[str, Report], times: Mapping[str, Any]) -> Path:
    """What the suite saw, for the benchmark report (``KP_GPU_OUT``): verdicts, dtypes, timings."""
    data = {
        "device": device,
        "candidates": {
            cid: {
                "slot": r.slot,
                "status": r.status,
                "reasons": r.reasons[:3],
                "changes": r.changes,
                "rows": {f"{v.dtype}/{v.regime}": {"status": v.status, "out_dtype": v.out_dtype} for v in r.verdicts},
            }
            for cid, r in reports.items()
        },
        "autocast_out_dtype": autocast_dtypes(reports),
        "timings": times,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path
