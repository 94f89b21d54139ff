"""The GraphTransformer's attention, measured in the worker: anemoi-models' two backends (its Triton
kernel and PyG's message passing) forward and backward against float64, on a graph of the degrees an
O96-era processor has, with the sharp softmax of anemoi-core #1027 and a bitwise repeat.

What anemoi computes (``anemoi.models.layers.conv.GraphTransformerConv``; the Triton kernel the
same): for each destination node ``i`` over its incoming edges ``e = (j -> i)``,

    alpha_e = softmax_i( q_i . (k_j + e_ij) / sqrt(C) ),    out_i = sum_e alpha_e (v_j + e_ij)

with q (N_dst, H, C), k and v (N_src, H, C), the edge attribute e (E, H, C). Outputs compared:
``out``, ``dq``, ``dk``, ``dv``, ``de``. Errors are normwise relative (``attention.rel``) against
that formula in float64 for the backend and for the same formula run by torch in the checked dtype
(the baseline, as torch's math path is for the Attention slot); RMS and bias statistics per row of
the last dimension (``measure.compare``). Where a gradient vanishes by construction (the sharp case:
every neighbour sends the same message, so ``dq = dk = 0``) its error is taken relative to
``max|dv|``: the pre-#1172 kernel's bf16 |dq| of 1.47 fails however small the reference.

The graph (``check_graph``): destination in-degrees in the proportions of anemoi-graphs'
``MultiScaleEdges(x_hops=1)`` over ``TriNodes(resolution=5)`` (the hidden mesh of anemoi-training's
``graph/multi_scale.yaml``): a node first refined at level L has 6 neighbours at each level L..5, so
degrees 6, 12, 18, 24 and 30 for 7680, 1920, 480, 120 and 42 of its 10,242 nodes (81,900 edges, the
count ``docs/_static/hetero_data_graph.txt`` shows; research/anemoi.md). ``O96_DEGREES`` is that
table.

Backends: ``pyg`` (anemoi's GraphTransformerConv), ``triton`` (anemoi's custom op; on a CPU only in
Triton's interpreter, ``TRITON_INTERPRET=1``: its ops are registered for ``cuda`` only, so the
worker registers their own Python bodies for the CPU in its process), or ``module.function`` with
the signature ``f(q, k, v, e, edge_index, size) -> out`` (a user's kernel; the tests' fakes).
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kernel_probe.isolation.protocol import ErrorStats, MeasurementRow, interpreter_requested
from kernel_probe.slots.attention_kernels import Case as AttentionCase

BACKENDS = ("triton", "pyg")  # anemoi-models' graph_attention_backend values
# (in-degree, nodes with it) in TriNodes(resolution=5) + MultiScaleEdges(x_hops=1): see the
# docstring
O96_DEGREES = ((6, 7680), (12, 1920), (18, 480), (24, 120), (30, 42))
OUTPUTS = ("out", "dq", "dk", "dv", "de")
HEADS, CHANNELS = (
    4,
    32,
)  # anemoi's GT processor: 16 heads x 64 at 1024 channels; the maths is per head
NODES = 36  # the check graph: every degree of O96_DEGREES, in proportion, at least one node each


def check_degrees(nodes: int = NODES) -> list[int]:
    """In-degrees of ``nodes`` destinations in ``O96_DEGREES``' proportions (each degree at least
    once), largest first."""
    total = sum(n for _, n in O96_DEGREES)
    counts = [max(1, round(nodes * n / total)) for _, n in O96_DEGREES]
    counts[0] += nodes - sum(counts)  # the commonest degree takes the rounding
    return [
        d
        for (d, _), c in sorted(zip(O96_DEGREES, counts, strict=True), reverse=True)
        for _ in range(c)
    ]


def check_graph(gen: torch.Generator, nodes: int = NODES) -> torch.Tensor:
    """A processor graph (sources = destinations = ``nodes``) with ``check_degrees``' in-degrees, no
    duplicate edge, sorted by destination as anemoi sorts it: ``edge_index`` (2, E) of (src,
    dst)."""
    src, dst = [], []
    for i, degree in enumerate(check_degrees(nodes)):
        picked = torch.randperm(nodes, generator=gen)[:degree]
        src.append(picked)
        dst.append(torch.full((degree,), i, dtype=torch.long))
    return torch.stack([torch.cat(src), torch.cat(dst)])


def reference(q: Any, k: Any, v: Any, e: Any, edge_index: Any, size: tuple[int, int]) -> Any:
    """The formula of the module docstring, with torch's own ops (float64: the reference; the
    checked dtype: the baseline). Stable softmax per destination (max subtracted)."""
    src, dst = edge_index
    n_dst, heads, channels = q.shape[0], q.shape[1], q.shape[2]
    key = k.index_select(0, src) + e
    scores = (q.index_select(0, dst) * key).sum(-1) / math.sqrt(channels)  # (E, H)
    peak = torch.full((n_dst, heads), -math.inf, dtype=scores.dtype, device=scores.device)
    peak = peak.scatter_reduce(
        0, dst[:, None].expand_as(scores), scores.detach(), "amax", include_self=True
    )
    weights = torch.exp(scores - peak.index_select(0, dst))
    total = torch.zeros((n_dst, heads), dtype=scores.dtype, device=scores.device).index_add(
        0, dst, weights
    )
    alpha = weights / total.index_select(0, dst)
    message = (v.index_select(0, src) + e) * alpha[..., None]
    return torch.zeros((n_dst, heads, channels), dtype=q.dtype, device=q.device).index_add(
        0, dst, message
    )


# ---- the backends --------------------------------------------------------------------------------
Attend = Callable[[Any, Any, Any, Any, Any, tuple[int, int]], Any]


def _pyg() -> Attend:
    from anemoi.models.layers.conv import GraphTransformerConv

    def attend(q: Any, k: Any, v: Any, e: Any, edge_index: Any, size: tuple[int, int]) -> Any:
        return GraphTransformerConv(out_channels=q.shape[-1])(q, k, v, e, edge_index, size)

    return attend


def _triton(device: str) -> Attend:
    if device == "cpu" and not interpreter_requested():
        raise _Unavailable(
            "anemoi's Triton kernel runs on a GPU only (anemoi's is_triton_available: triton "
            "imports and torch.cuda.is_available()); on a CPU it can be checked in Triton's "
            "interpreter with TRITON_INTERPRET=1"
        )
    from anemoi.models.triton import gt
    from anemoi.models.triton.utils import edge_index_to_csc

    # interpreter: the ops' own bodies, registered for the CPU in this worker only
    if device == "cpu":
        for op in (gt.graph_transformer_attention, gt.graph_transformer_attention_backward):
            if "cpu" not in op._backend_fns:
                op.register_kernel("cpu")(op._init_fn)

    def attend(q: Any, k: Any, v: Any, e: Any, edge_index: Any, size: tuple[int, int]) -> Any:
        csc, perm, reverse = edge_index_to_csc(
            edge_index, num_nodes=size, reverse=True, edges_are_dst_sorted=True
        )
        assert perm is None
        return gt.graph_transformer_attention_conv(q, k, v, e, csc, reverse)

    return attend


def backend(name: str, device: str) -> Attend:
    """The attention function ``name`` stands for (module docstring); raises ``_Unavailable`` with
    the reason where it cannot run here."""
    if name == "pyg":
        return _pyg()
    if name == "triton":
        return _triton(device)
    module, _, function = name.rpartition(".")
    if not module:
        raise _Unavailable(
            f"unknown graph attention backend {name!r}: use triton, pyg or module.function"
        )
    fn: Attend = getattr(importlib.import_module(module), function)
    return fn


class _Unavailable(Exception):
    """The backend cannot run on this machine: why."""


# ---- the inputs ----------------------------------------------------------------------------------
@dataclass
class Case(AttentionCase):
    """One input: attention's (q, k, v, grad_output and the outputs that vanish by construction) and
    the edge attribute ``e``."""

    e: Any = None

    def to(self, dtype: Any, device: str) -> Case:
        """The same values in ``dtype`` on ``device`` (rounded once)."""
        q, k, v, e, go = (
            t.to(device=device, dtype=dtype) for t in (self.q, self.k, self.v, self.e, self.go)
        )
        return Case(self.name, q, k, v, go, self.vanishing, e=e)


def cases(gen: torch.Generator, n: int, edges: int) -> list[Case]:
    """random; large logits that stay soft (q and k share a large part); the #1027 sharp softmax:
    large scores, and every neighbour sends the same message (v one vector, e = 0), so out = v and
    dq = dk = 0. Drawn in float64 on the CPU (the same values on every device)."""

    def randn(*shape: int, scale: float = 1.0) -> Any:
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    h, c = HEADS, CHANNELS
    q, k, v, e = randn(n, h, c), randn(n, h, c), randn(n, h, c), randn(edges, h, c)  # in this order
    out = [Case("random", q, k, v, randn(n, h, c), e=e)]
    common = randn(1, h, c, scale=30.0)
    q, k, v = (
        common + randn(n, h, c, scale=0.05),
        common + randn(n, h, c, scale=0.05),
        randn(n, h, c),
    )
    e = randn(edges, h, c, scale=0.05)
    out.append(Case("large-logits", q, k, v, randn(n, h, c), e=e))
    value = randn(1, h, c).expand(n, h, c).contiguous()
    q, k, e = (
        randn(n, h, c, scale=3.0),
        randn(n, h, c, scale=3.0),
        torch.zeros(edges, h, c, dtype=torch.float64),
    )
    out.append(Case("sharp-equal-messages", q, k, value, randn(n, h, c), ("dq", "dk"), e=e))
    return out


# ---- measuring -----------------------------------------------------------------------------------
def _grads(fn: Attend, case: Case, edge_index: Any, size: tuple[int, int]) -> dict[str, Any]:
    q, k, v, e = (t.detach().clone().requires_grad_(True) for t in (case.q, case.k, case.v, case.e))
    out = fn(q, k, v, e, edge_index, size)
    dq, dk, dv, de = torch.autograd.grad(out, (q, k, v, e), case.go.to(out.dtype))
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv, "de": de}


def _errors(
    got: Mapping[str, Any],
    base: Mapping[str, Any],
    ref: Mapping[str, Any],
    vanishing: tuple[str, ...],
) -> tuple[dict[str, list[float]], dict[str, ErrorStats]]:
    """output -> [the backend's error, the baseline's], and the RMS/bias statistics of the outputs
    that do not vanish (a vanishing one is judged by its max error against max|dv|)."""
    from kernel_probe.probe.measure import compare, rel

    dv_scale = float(ref["dv"].abs().max())
    errors, stats = {}, {}
    for name in OUTPUTS:
        denom = dv_scale if name in vanishing else None
        errors[name] = [rel(got[name], ref[name], denom), rel(base[name], ref[name], denom)]
        if name not in vanishing:
            ref64 = ref[name].detach().double().cpu()
            stats[name] = compare(
                got[name].double().cpu(), base[name].double().cpu(), ref64, rows=True
            )[1]
    return errors, stats


def _bitwise(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    if all(torch.equal(a[n], b[n]) for n in OUTPUTS):
        return None
    spread = max(float((a[n].double() - b[n].double()).abs().max()) for n in OUTPUTS)
    return f"two identical fwd+bwd differ by up to {spread:.3g}"


def _row(fn: Attend, device: str, dtype_name: str, seed: int) -> MeasurementRow:
    from kernel_probe.probe.measure import first_line, torch_dtype

    row: MeasurementRow = {"dtype": dtype_name, "regime": "true"}
    start = time.perf_counter()
    dtype = torch_dtype(dtype_name)
    gen = torch.Generator().manual_seed(seed)
    edge_index = check_graph(gen)
    size = (NODES, NODES)
    ei = edge_index.to(device)
    errors: dict[str, dict[str, list[float]]] = {}
    stats: dict[str, dict[str, ErrorStats]] = {}
    try:
        for case in cases(gen, NODES, edge_index.shape[1]):
            low = case.to(dtype, device)
            got = _grads(fn, low, ei, size)
            base = _grads(reference, low, ei, size)
            # the reference on the same (rounded) values in float64
            ref = _grads(reference, low.to(torch.float64, "cpu"), edge_index, size)
            errors[case.name], stats[case.name] = _errors(got, base, ref, case.vanishing)
            if case.name == "random":  # determinism: the same fwd+bwd again, bitwise
                row["nondeterministic"] = _bitwise(got, _grads(fn, low, ei, size))
    except Exception as exc:
        row["exception"] = first_line(exc, 400)
        return row
    row["cases"] = errors
    row["stats"] = stats
    row["flags"] = {}
    row["seconds"] = time.perf_counter() - start
    return row


def check(name: str, device: str, dtypes: list[str], seed: int = 0) -> list[MeasurementRow]:
    """One row per dtype for backend ``name`` on ``device`` (``skipped`` rows, with the reason,
    where it cannot run here)."""
    try:
        fn = backend(name, device)
    except _Unavailable as exc:
        return [{"dtype": d, "regime": "true", "skipped": str(exc)} for d in dtypes]
    except Exception as exc:  # an import that failed: the backend's library is missing or broken
        from kernel_probe.probe.measure import first_line

        return [{"dtype": d, "regime": "true", "exception": first_line(exc, 400)} for d in dtypes]
    return [_row(fn, device, d, seed) for d in dtypes]
