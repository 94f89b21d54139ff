"""The GPU kit's graph-attention work (issue 39), run by ``tests/gpu_suite.py``'s attention part (so
by ``benchmarks/gpu_all.py``), written for any device so its code paths also run on a CPU
(tests/test_gpu_kit.py).

1. The GraphAttention check (``kernel_probe.probe.graph_attention.check_backend``, in the
   isolated worker) of anemoi's Triton kernel and of the PyG path, forward and backward against
   float64 in float32 and bfloat16 on the check graph (O96 processor degrees), #1027's sharp softmax
   included: on a GPU the real, compiled Triton kernel (on a CPU it is skipped, with its reason,
   unless ``TRITON_INTERPRET=1``).
2. Both backends timed forward + backward at anemoi's O96-era processor: the 10,242 nodes of
   ``TriNodes(resolution=5)`` with ``MultiScaleEdges``' in-degrees (``graph_attention.O96_DEGREES``,
   81,900 edges), 16 heads x 64 channels (1024 channels), bfloat16; median of ``REPS`` calls after
   ``WARMUP`` (CUDA events on a GPU), and whether two runs are bitwise equal (PyG's scatter uses
   atomics on a GPU). ``--smoke``: the check graph's size on any device.

Written to ``DIR/graph-attention.json`` before the SDPA work of the part starts.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from kernel_probe.probe import graph_attention as ga

DTYPES = ("float32", "bfloat16")
O96 = {"degrees": ga.O96_DEGREES, "heads": 16, "channels": 64, "dtype": "bfloat16"}
# the smoke: the check graph's degrees (each of O96's, in proportion, over 36 nodes)
SMOKE = {
    "degrees": tuple((d, ga.check_degrees().count(d)) for d, _ in ga.O96_DEGREES),
    "heads": 4,
    "channels": 32,
    "dtype": "float32",
}
REPS, WARMUP = 10, 2


def o96_graph(
    degrees: tuple[tuple[int, int], ...], gen: torch.Generator
) -> tuple[torch.Tensor, int]:
    """A processor graph with exactly ``degrees``' in-degrees (degree, nodes), no duplicate edge,
    sorted by destination: (edge_index, nodes)."""
    nodes = sum(n for _, n in degrees)
    per_dst = [d for d, n in degrees for _ in range(n)]
    src = torch.cat([torch.randperm(nodes, generator=gen)[:d] for d in per_dst])
    dst = torch.repeat_interleave(torch.arange(nodes), torch.tensor(per_dst))
    return torch.stack([src, dst]), nodes


def _time(fn: Any, device: str) -> list[float]:
    for _ in range(WARMUP):
        fn()
    out = []
    for _ in range(REPS):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def timing(backend: str, device: str, geometry: dict[str, Any]) -> dict[str, Any]:
    """One backend's fwd+bwd at ``geometry``: median ms, reps, bitwise repeatability, or the
    error."""
    gen = torch.Generator().manual_seed(0)
    edge_index, nodes = o96_graph(geometry["degrees"], gen)
    dtype = getattr(torch, geometry["dtype"])
    h, c, e = geometry["heads"], geometry["channels"], edge_index.shape[1]
    row: dict[str, Any] = {
        "nodes": nodes,
        "edges": e,
        "heads": h,
        "channels": c,
        "dtype": geometry["dtype"],
    }
    try:
        attend = ga.backend(backend, device)
        tensors = [
            torch.randn(n, h, c, generator=gen).to(device, dtype)
            for n in (nodes, nodes, nodes, e, nodes)
        ]
        q, k, v, edges, go = tensors
        ei = edge_index.to(device)

        def step() -> tuple[torch.Tensor, ...]:
            leaves = [t.detach().requires_grad_(True) for t in (q, k, v, edges)]
            out = attend(*leaves, ei, (nodes, nodes))
            return (out.detach(), *torch.autograd.grad(out, leaves, go))

        times = _time(step, device)
        first, second = step(), step()
    except Exception as exc:  # out of memory, a kernel that cannot run here: the row's error
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return row
    row["median_ms"] = round(statistics.median(times), 4)
    row["reps"] = len(times)
    row["deterministic"] = all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    return row


def run(device: str, smoke: bool) -> dict[str, Any]:
    """The graph-attention work on ``device`` (the module docstring): verdicts and timings per
    backend."""
    from kernel_probe.probe.graph_attention import check_backend

    geometry = SMOKE if smoke else O96
    out: dict[str, Any] = {"device": device, "smoke": smoke, "backends": {}}
    for backend in ("triton", "pyg"):
        report = check_backend(backend, device, DTYPES)
        entry: dict[str, Any] = {"check": report.to_json()}
        if report.status in (
            "accepted",
            "rejected",
        ):  # a rejected backend's speed is still a figure
            entry["timing"] = timing(backend, device, geometry)
        out["backends"][backend] = entry
    return out
