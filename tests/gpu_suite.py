"""The GPU suite's work (tests/test_gpu.py), written for any device so that its code paths also run,
on torch.nn's candidates, on a CPU (tests/test_gpu_kit.py).

Everything goes through the project's own machinery: the registry's candidates, ``check_all`` in the
isolated workers (forward and backward against float64, every hard input, each row of ``ROWS``), and
the timing workers (``TimeRequest``, ``kernel_probe/probe/timing.py``). Added to the registry:
liger's RMSNorm with its *default* ``in_place=True``, which the registry pins off because its
backward overwrites grad_output; the checks must reject it for exactly that.

The attention part (``attention``; ``python -m tests.gpu_suite --out DIR [--smoke]``, a part of
``benchmarks/gpu_all.py``): torch's SDPA and each of its backends forced one by one, and flash-attn
2/3/4 (each reported unavailable with its reason where it does not import), checked forward and
backward in float16 and bfloat16, then timed forward + backward at anemoi's O96 processor geometry
(``ATTENTION_GPU``) with the peak memory of each candidate (``torch.cuda.max_memory_allocated``, the
timing rows' ``peak_bytes``); ``--smoke`` at ``ATTENTION_SMOKE`` on any device (no peak memory off
CUDA). Before it, the graph-attention work (``tests/gpu_graph_attention.py``, issue 39): anemoi's
Triton GraphTransformer kernel and the PyG path checked against float64 (#1027's sharp softmax) and
timed at the O96-era processor graph, written to ``DIR/graph-attention.json``.

The gated-MLP part (``gated_mlp``; run by the same command after the attention part, in the same
process, so it costs no second start): anemoi's GatedMLPLayer against ``GATED_IDS`` (torch's gate
and liger's fused one) for swiglu and geglu, checked forward and backward (every parameter gradient,
the state-dict round trip through anemoi's own layer) at anemoi's shape (1024 in,
``compute_mlp_hidden_dim(1024, 2.67)`` out) in float32 and bf16 (plain and under autocast), then the
accepted ones timed forward + backward at ``GATED_GPU`` (O96's 40,320 nodes x 1024 channels) in
bf16-mixed. liger's geglu is rejected for its tanh GELU; ``--smoke``: the same at 96 in and
``GATED_SMOKE`` in float32 on any device.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kernel_lock.slots import PRECISIONS, SLOTS
from kernel_probe.candidates import Candidate, registry
from kernel_probe.isolation.protocol import TimeRequest
from kernel_probe.isolation.worker import Worker, WorkerPool
from kernel_probe.probe.check import check_all, dtype_plan
from kernel_probe.probe.limits import TIMING_TIMEOUT
from kernel_probe.probe.report import Report

# float32, bf16-true, bf16-mixed: the precision regimes a model trains in
ROWS = dtype_plan(["float32", "bfloat16"])
TIMED = ("32-true", "bf16-true", "bf16-mixed")
TIMING = {"reps": 10, "warmup": 3, "min_seconds": 0.0}
IN_PLACE_ID = "liger.rms_norm.in_place"

# the attention part: anemoi's O96 processor (16 heads of 128 over 40,320 nodes, its presets' 512
# window)
ATTENTION_GPU = "16x128x40320:window=512"
ATTENTION_SMOKE = "2x32x128:window=8"
ATTENTION_IDS = (
    "torch.sdpa",
    "torch.sdpa.math",
    "torch.sdpa.flash",
    "torch.sdpa.efficient",
    "torch.sdpa.cudnn",
    "flash_attn.v2",
    "flash_attn.v3",
    "flash_attn.v4",
)
ATTENTION_ROWS = [("float16", "true"), ("bfloat16", "true")]
ATTENTION_TIMING = {"reps": 5, "warmup": 1, "min_seconds": 0.0}  # at O96 one fwd+bwd is 0.05-1 s


def candidates(only: Iterable[str] | None = None) -> list[Candidate]:
    """The built-in registry plus liger's RMSNorm with ``in_place=True`` (``only``: these ids)."""
    cands, problems = registry([], entry_points=False)
    assert problems == [], problems
    liger = next(c for c in cands if c.id == "liger.rms_norm")
    in_place = dataclasses.replace(liger, id=IN_PLACE_ID, kwargs={**liger.kwargs, "in_place": True})
    out = [*cands, in_place]
    return [c for c in out if only is None or c.id in set(only)]


def verdicts(
    device: str, arch: str, cands: list[Candidate], *, timeout: float = 120.0
) -> dict[str, Report]:
    """Every candidate checked in every row of ``ROWS`` (torch.compile included), by id."""
    with WorkerPool() as pool:
        reports = check_all(
            SLOTS, cands, device, ROWS, arch=arch, with_compile=True, timeout=timeout, workers=pool
        )
    return {r.id: r for rs in reports.values() for r in rs}


def timings(
    device: str, reports: Mapping[str, Report], shape: str
) -> dict[str, dict[str, dict[str, Any]]]:
    """Each accepted candidate timed at ``shape`` in every precision of ``TIMED``: id -> precision
    -> row."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    with WorkerPool() as pool:
        pool.prepare()
        for r in reports.values():
            if r.status != "accepted" or r.candidate is None:
                continue
            with pool.worker_for(r.candidate) as worker:
                for precision in TIMED:
                    out.setdefault(r.id, {})[precision] = timed(
                        worker, r, device, shape, PRECISIONS[precision], TIMING
                    )
    return out


def timed(
    worker: Worker,
    r: Report,
    device: str,
    shape: str,
    row: tuple[str, str],
    options: Mapping[str, Any],
    canon: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """``r``'s candidate timed forward + backward at ``shape`` in ``row`` (dtype, regime) in its
    worker, with ``canon``'s options for its slot: the row (torch's functions untouched)."""
    assert r.candidate is not None
    dtype, regime = row
    request = TimeRequest(
        candidate=r.candidate.to_json(),
        slot=r.slot,
        device=device,
        shapes=(shape,),
        dtype=dtype,
        regime=regime,
        options=dict(options),
        canonical=dict((canon or {}).get(r.slot) or {}),
    )
    reply = worker.call(request, TIMING_TIMEOUT)
    assert not reply.tampered, (r.id, reply.tampered)
    return dict(reply.rows[0])


def autocast_dtypes(reports: Mapping[str, Report]) -> dict[str, str]:
    """Every accepted candidate's output dtype under autocast (the mixed row), by id."""
    return {
        cid: v.out_dtype
        for cid, r in reports.items()
        if r.status == "accepted"
        for v in r.verdicts
        if v.regime == "mixed" and v.status == "accepted"
    }


def record(
    path: Path, device: str, reports: Mapping[str, Report], times: Mapping[str, Any]
) -> Path:
    """What the suite saw, for the benchmark report (``KP_GPU_OUT``): verdicts, dtypes, timings."""
    data = {
        "device": device,
        "candidates": {
            cid: {
                "slot": r.slot,
                "status": r.status,
                "reasons": r.reasons[:3],
                "changes": r.changes,
                "rows": {
                    f"{v.dtype}/{v.regime}": {"status": v.status, "out_dtype": v.out_dtype}
                    for v in r.verdicts
                },
            }
            for cid, r in reports.items()
        },
        "autocast_out_dtype": autocast_dtypes(reports),
        "timings": times,
    }
    return write(path, data)


def attention(device: str, geometry: str, *, timeout: float = 120.0) -> dict[str, Any]:
    """The attention part: every candidate of ``ATTENTION_IDS`` checked in ``ATTENTION_ROWS`` with
    the geometry's window, the accepted ones timed forward + backward at ``geometry`` in each dtype;
    per candidate its status, reasons and rows by dtype (``median_ms``, ``tflops``, ``peak_bytes``
    on CUDA, or the error that stopped it: out of memory is a row's error, recorded, not fatal)."""
    ATTENTION = "Attention"
    from kernel_probe.slots.attention import parse_geometry

    window = parse_geometry(geometry).window
    canon = {ATTENTION: {"window": window}} if window is not None else None
    cands = candidates(ATTENTION_IDS)
    out: dict[str, Any] = {"device": device, "geometry": geometry, "candidates": {}}
    with WorkerPool() as pool:
        reports = check_all(
            [ATTENTION],
            cands,
            device,
            ATTENTION_ROWS,
            timeout=timeout,
            workers=pool,
            canonical=canon,
        )
        for r in reports[ATTENTION]:
            entry: dict[str, Any] = {"status": r.status, "reasons": r.reasons[:3], "timings": {}}
            out["candidates"][r.id] = entry
            if r.status != "accepted" or r.candidate is None:
                continue
            with pool.worker_for(r.candidate) as worker:
                for dtype, regime in ATTENTION_ROWS:
                    row = timed(
                        worker, r, device, geometry, (dtype, regime), ATTENTION_TIMING, canon
                    )
                    if device != "cuda" and "error" not in row:
                        row["peak_bytes"] = None  # torch.cuda.max_memory_allocated: CUDA only
                    entry["timings"][dtype] = row
    return out


# the gated-MLP part: anemoi's processor MLP at O96 (40,320 nodes, 1024 channels), bf16 on a GPU
GATED_IDS = ("torch.gated_mlp", "liger.gated_mlp")
GATED_IMPLEMENTATIONS = ("swiglu", "geglu")
GATED_GPU = "40320x1024"
GATED_SMOKE = "64x96"
GATED_ROWS = [
    ("float32", "true"),
    ("bfloat16", "true"),
    ("bfloat16", "mixed"),
]  # fp32: what it computes
GATED_SMOKE_ROWS = [("float32", "true")]
GATED_TIMING = {"reps": 5, "warmup": 1, "min_seconds": 0.0}  # one fwd+bwd at O96 is a few ms


def gated_mlp(device: str, *, smoke: bool, timeout: float = 120.0) -> dict[str, Any]:
    """The gated-MLP part: each candidate of ``GATED_IDS`` checked for each implementation at
    anemoi's shape (smoke: the default 96 in), the accepted ones timed fwd+bwd at ``GATED_GPU``
    (smoke: ``GATED_SMOKE``); per implementation and candidate its status, reasons and timing
    row."""
    GATED_MLP = "GatedMLP"
    from kernel_probe.slots.gated_mlp_kernels import ANEMOI_IN

    rows = GATED_SMOKE_ROWS if smoke else GATED_ROWS
    shape = GATED_SMOKE if smoke else GATED_GPU
    out: dict[str, Any] = {
        "device": device,
        "shape": shape,
        "hidden": None if smoke else ANEMOI_IN,
        "implementations": {},
    }
    with WorkerPool() as pool:
        for impl in GATED_IMPLEMENTATIONS:
            canon = {GATED_MLP: {"mlp_implementation": impl}}
            reports = check_all(
                [GATED_MLP],
                candidates(GATED_IDS),
                device,
                rows,
                timeout=timeout,
                workers=pool,
                canonical=canon,
                hidden=None if smoke else ANEMOI_IN,
            )
            found: dict[str, Any] = {}
            out["implementations"][impl] = found
            for r in reports[GATED_MLP]:
                entry: dict[str, Any] = {
                    "status": r.status,
                    "reasons": r.reasons[:3],
                    "worst_ratio": r.worst_ratio(),
                    "timing": None,
                }
                found[r.id] = entry
                if r.status != "accepted" or r.candidate is None:
                    continue
                with pool.worker_for(r.candidate) as worker:
                    entry["timing"] = timed(worker, r, device, shape, rows[-1], GATED_TIMING, canon)
    return out


def write(path: Path, data: Mapping[str, Any]) -> Path:
    """``data`` as JSON at ``path``, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    """The attention part as gpu_all.py runs it: ``DIR/attention.json``, one line per candidate."""
    import argparse

    import torch

    ap = argparse.ArgumentParser(
        allow_abbrev=False, description="the GPU kit's attention part (tests/gpu_suite.py)"
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--smoke", action="store_true", help=f"{ATTENTION_SMOKE} on this machine's device"
    )
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        raise SystemExit(
            "the attention part needs a CUDA device (or --smoke, at a CPU-sized geometry)"
        )
    from tests import gpu_graph_attention

    graph = gpu_graph_attention.run("cuda" if cuda else "cpu", args.smoke)
    # first: its figures stand if the SDPA work times out
    write(args.out / "graph-attention.json", graph)
    for backend, entry in graph["backends"].items():
        t = entry.get("timing", {})
        figure = (
            f"{t['median_ms']:.3g} ms deterministic={t['deterministic']}"
            if "median_ms" in t
            else t.get("error", "")
        )
        reasons = entry["check"]["reasons"][:1]
        print(
            f"graph attention {backend:7s} {entry['check']['status']:9s} "
            f"{figure or (reasons or [''])[0]}",
            flush=True,
        )
    data = attention("cuda" if cuda else "cpu", ATTENTION_SMOKE if args.smoke else ATTENTION_GPU)
    data["smoke"] = args.smoke
    write(args.out / "attention.json", data)
    for cid, entry in data["candidates"].items():
        rows = entry["timings"]
        figures = ", ".join(
            f"{d} {r['median_ms']:.3g} ms peak {r['peak_bytes']}"
            if "error" not in r
            else f"{d} {r['error']}"
            for d, r in rows.items()
        )
        print(
            f"{cid:22s} {entry['status']:11s} {figures or (entry['reasons'] or [''])[0]}",
            flush=True,
        )
    # the gated-MLP part, after the attention figures are written (a part killed at its limit keeps
    # them)
    gated = gated_mlp("cuda" if cuda else "cpu", smoke=args.smoke)
    gated["smoke"] = args.smoke
    write(args.out / "gated_mlp.json", gated)
    for impl, found in gated["implementations"].items():
        for cid, entry in found.items():
            row = entry["timing"] or {}
            figure = f"{row['median_ms']:.3g} ms" if "median_ms" in row else row.get("error", "")
            print(
                f"{impl:7s} {cid:16s} {entry['status']:11s} "
                f"{figure or (entry['reasons'] or [''])[0]}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
