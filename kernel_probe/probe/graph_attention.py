"""The GraphTransformer's attention backend: measured in a worker, judged, and chosen for the lock's
``[graph-attention]`` when asked (``--graph-attention``; docs/checks.md, "GraphAttention"). Per
destination ``i`` over its edges ``e = (j -> i)``:

    alpha_e = softmax_i( q_i . (k_j + e_ij) / sqrt(C) ),    out_i = sum_e alpha_e (v_j + e_ij)

Backends: ``pyg``, ``triton`` (on a CPU only under TRITON_INTERPRET=1), or ``module.function`` as
``f(q, k, v, e, edge_index, size) -> out``.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel_lock.graph_attention import (
    ALLOW_FLAG,
    BACKENDS,
    GraphAttention,
    fallback_cause,
    triton_installed,
)
from kernel_lock.slots import Status
from kernel_probe.errors import ForcedUnusable, UsageError
from kernel_probe.isolation.protocol import (
    ErrorStats,
    GraphAttentionRequest,
    MeasurementRow,
    interpreter_requested,
)
from kernel_probe.isolation.worker import Worker, WorkerDied
from kernel_probe.probe.judge import judge_cases, row_reasons, row_verdict, unmeasured, worst_status
from kernel_probe.probe.report import Verdict, deterministic
from kernel_probe.slots.attention import tolerance

CHOICES = ("auto", *BACKENDS)
TIMEOUT = 600.0  # the Triton interpreter on a CPU: ~20 s per dtype here
# (in-degree, nodes with it) in TriNodes(resolution=5) + MultiScaleEdges(x_hops=1): a node first
# refined at level L has 6 neighbours at each level L..5 (10,242 nodes, 81,900 edges)
O96_DEGREES = ((6, 7680), (12, 1920), (18, 480), (24, 120), (30, 42))
OUTPUTS = ("out", "dq", "dk", "dv", "de")
# anemoi's GT processor: 16 heads x 64 at 1024 channels; the maths is per head
HEADS, CHANNELS = 4, 32
NODES = 36  # the check graph: every degree of O96_DEGREES, in proportion, at least one node each
BASELINE = "torch's formula's"
HINTS = {
    "random": "plain random input",
    "large-logits": "large logits: overflow of unscaled scores in low precision",
    "sharp-equal-messages": "sharp softmax over equal messages: dq and dk must vanish "
    "(anemoi-core #1027)",
}


# ---- the check graph and the formula (the worker's) ----------------------------------------------
def check_degrees(nodes: int = NODES) -> list[int]:
    """In-degrees of ``nodes`` destinations in ``O96_DEGREES``' proportions, largest first."""
    total = sum(n for _, n in O96_DEGREES)
    counts = [max(1, round(nodes * n / total)) for _, n in O96_DEGREES]
    counts[0] += nodes - sum(counts)  # the commonest degree takes the rounding
    pairs = sorted(zip(O96_DEGREES, counts, strict=True), reverse=True)
    return [d for (d, _), c in pairs for _ in range(c)]


def check_graph(gen: Any, nodes: int = NODES) -> Any:
    """``edge_index`` (2, E) with ``check_degrees``' in-degrees, destination-sorted as anemoi's."""
    import torch  # the worker's (this module is the probe's too)

    src, dst = [], []
    for i, degree in enumerate(check_degrees(nodes)):
        src.append(torch.randperm(nodes, generator=gen)[:degree])
        dst.append(torch.full((degree,), i, dtype=torch.long))
    return torch.stack([torch.cat(src), torch.cat(dst)])


def reference(q: Any, k: Any, v: Any, e: Any, edge_index: Any, size: tuple[int, int]) -> Any:
    """The module docstring's formula in torch's ops (stable softmax): reference and baseline."""
    import torch  # the worker's

    src, dst = edge_index
    n_dst, heads, channels = q.shape[0], q.shape[1], q.shape[2]
    key = k.index_select(0, src) + e
    scores = (q.index_select(0, dst) * key).sum(-1) / math.sqrt(channels)  # (E, H)
    peak = torch.full((n_dst, heads), -math.inf, dtype=scores.dtype, device=scores.device)
    peak = peak.scatter_reduce(
        0, dst[:, None].expand_as(scores), scores.detach(), "amax", include_self=True
    )
    weights = torch.exp(scores - peak.index_select(0, dst))
    zeros = torch.zeros((n_dst, heads), dtype=scores.dtype, device=scores.device)
    alpha = weights / zeros.index_add(0, dst, weights).index_select(0, dst)
    message = (v.index_select(0, src) + e) * alpha[..., None]
    out = torch.zeros((n_dst, heads, channels), dtype=q.dtype, device=q.device)
    return out.index_add(0, dst, message)


Attend = Callable[[Any, Any, Any, Any, Any, tuple[int, int]], Any]


class _Unavailable(Exception):
    """The backend cannot run on this machine: why."""


def backend(name: str, device: str) -> Attend:
    """The attention function ``name`` stands for; ``_Unavailable`` where it cannot run here."""
    if name == "pyg":
        from anemoi.models.layers.conv import GraphTransformerConv

        def pyg(q: Any, k: Any, v: Any, e: Any, edge_index: Any, size: tuple[int, int]) -> Any:
            return GraphTransformerConv(out_channels=q.shape[-1])(q, k, v, e, edge_index, size)

        return pyg
    module, _, function = name.rpartition(".")
    if name != "triton" and not module:
        raise _Unavailable(
            f"unknown graph attention backend {name!r}: use triton, pyg or module.function"
        )
    if name != "triton":
        fn: Attend = getattr(importlib.import_module(module), function)
        return fn
    if device == "cpu" and not interpreter_requested():
        raise _Unavailable(
            "anemoi's Triton kernel runs on a GPU only (anemoi's is_triton_available: triton "
            "imports and torch.cuda.is_available()); on a CPU it can be checked in Triton's "
            "interpreter with TRITON_INTERPRET=1"
        )
    from anemoi.models.triton import gt
    from anemoi.models.triton.utils import edge_index_to_csc

    if device == "cpu":  # interpreter: the ops' own bodies, registered for the CPU in this worker
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


@dataclass
class Case:
    """One input: q, k, v, grad_output, the outputs that vanish by construction, e."""

    name: str
    q: Any
    k: Any
    v: Any
    go: Any
    vanishing: tuple[str, ...] = ()
    e: Any = None

    def to(self, dtype: Any, device: str) -> Case:
        """The same values in ``dtype`` on ``device`` (rounded once)."""
        q, k, v, e, go = (
            t.to(device=device, dtype=dtype) for t in (self.q, self.k, self.v, self.e, self.go)
        )
        return Case(self.name, q, k, v, go, self.vanishing, e=e)


def cases(gen: Any, n: int, edges: int) -> list[Case]:
    """random; large logits that stay soft; #1027's sharp softmax over equal messages (v one
    vector, e = 0: out = v, dq = dk = 0). Drawn in float64 on the CPU."""
    import torch  # the worker's

    def randn(*shape: int, scale: float = 1.0) -> Any:
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    h, c = HEADS, CHANNELS
    q, k, v, e = randn(n, h, c), randn(n, h, c), randn(n, h, c), randn(edges, h, c)  # in this order
    out = [Case("random", q, k, v, randn(n, h, c), e=e)]
    common = randn(1, h, c, scale=30.0)
    q, k = common + randn(n, h, c, scale=0.05), common + randn(n, h, c, scale=0.05)
    v = randn(n, h, c)
    e = randn(edges, h, c, scale=0.05)
    out.append(Case("large-logits", q, k, v, randn(n, h, c), e=e))
    value = randn(1, h, c).expand(n, h, c).contiguous()
    q, k = randn(n, h, c, scale=3.0), randn(n, h, c, scale=3.0)
    e = torch.zeros(edges, h, c, dtype=torch.float64)
    out.append(Case("sharp-equal-messages", q, k, value, randn(n, h, c), ("dq", "dk"), e=e))
    return out


# ---- measuring (the worker's) --------------------------------------------------------------------
def _grads(fn: Attend, case: Case, edge_index: Any, size: tuple[int, int]) -> dict[str, Any]:
    import torch  # the worker's

    q, k, v, e = (t.detach().clone().requires_grad_(True) for t in (case.q, case.k, case.v, case.e))
    out = fn(q, k, v, e, edge_index, size)
    dq, dk, dv, de = torch.autograd.grad(out, (q, k, v, e), case.go.to(out.dtype))
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv, "de": de}


def _errors(
    got: Mapping[str, Any], base: Mapping[str, Any], ref: Mapping[str, Any], vanishing: tuple
) -> tuple[dict[str, list[float]], dict[str, ErrorStats]]:
    """output -> [its error, the baseline's]; statistics where it does not vanish (max|dv|)."""
    from kernel_probe.probe.measure import compare, rel  # torch: the worker's

    dv_scale = float(ref["dv"].abs().max())
    errors, stats = {}, {}
    for name in OUTPUTS:
        denom = dv_scale if name in vanishing else None
        errors[name] = [rel(got[name], ref[name], denom), rel(base[name], ref[name], denom)]
        if name not in vanishing:
            ref64 = ref[name].detach().double().cpu()
            got64, base64 = got[name].double().cpu(), base[name].double().cpu()
            stats[name] = compare(got64, base64, ref64, rows=True)[1]
    return errors, stats


def _row(fn: Attend, device: str, dtype_name: str, seed: int) -> MeasurementRow:
    import torch  # the worker's

    from kernel_probe.probe.measure import measuring, nondeterminism, torch_dtype  # torch

    row: MeasurementRow = {"dtype": dtype_name, "regime": "true"}
    dtype = torch_dtype(dtype_name)
    gen = torch.Generator().manual_seed(seed)
    edge_index = check_graph(gen)
    size = (NODES, NODES)
    ei = edge_index.to(device)
    errors: dict[str, dict[str, list[float]]] = {}
    stats: dict[str, dict[str, ErrorStats]] = {}
    with measuring(row):
        for case in cases(gen, NODES, edge_index.shape[1]):
            low = case.to(dtype, device)
            got = _grads(fn, low, ei, size)
            base = _grads(reference, low, ei, size)
            # the reference on the same (rounded) values in float64
            ref = _grads(reference, low.to(torch.float64, "cpu"), edge_index, size)
            errors[case.name], stats[case.name] = _errors(got, base, ref, case.vanishing)
            if case.name == "random":  # determinism: the same fwd+bwd again, bitwise
                row["nondeterministic"] = nondeterminism(got, _grads(fn, low, ei, size), OUTPUTS)
        row["cases"], row["stats"], row["flags"] = errors, stats, {}
    return row


def check(name: str, device: str, dtypes: list[str], seed: int = 0) -> list[MeasurementRow]:
    """One row per dtype for backend ``name`` on ``device`` (``skipped`` where it cannot run)."""
    from kernel_probe.probe.measure import first_line  # torch: the worker's

    try:
        fn = backend(name, device)
    except _Unavailable as exc:
        return [{"dtype": d, "regime": "true", "skipped": str(exc)} for d in dtypes]
    except Exception as exc:  # an import that failed: the backend's library is missing or broken
        return [{"dtype": d, "regime": "true", "exception": first_line(exc, 400)} for d in dtypes]
    return [_row(fn, device, d, seed) for d in dtypes]


# ---- the verdict (the probe's) -------------------------------------------------------------------
@dataclass
class GraphAttentionReport:
    """The verdict on one backend: the worst of its dtypes' statuses, reasons, verdicts."""

    backend: str
    device: str
    status: Status
    reasons: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    interpreted: bool = False  # ran in Triton's interpreter (never locked on that alone)

    @property
    def deterministic(self) -> bool | None:
        """Bitwise repeatable in every checked dtype (None: not measured)."""
        return deterministic(self.verdicts)

    def to_json(self) -> dict[str, Any]:
        """The report as ``--json`` and the lock's evidence show it."""
        return {
            "backend": self.backend,
            "device": self.device,
            "status": self.status,
            "reasons": list(self.reasons),
            "deterministic": self.deterministic,
            "interpreted": self.interpreted,
            "evidence": [v.to_json() for v in self.verdicts],
        }


def judge(
    backend: str, device: str, rows: list[MeasurementRow], *, interpreted: bool = False
) -> GraphAttentionReport:
    """The verdict on ``backend`` from its rows (one per dtype): max errors under the attention
    tolerance, RMS and bias as usual; an exception is a crash (no refusal to tell apart)."""
    verdicts = [
        unmeasured(backend, device, row, None)
        or row_verdict(
            backend,
            device,
            row,
            judge_cases(row, HINTS, max_tolerance=tolerance, baseline=BASELINE),
            twin=False,
        )
        for row in rows
    ]
    status = worst_status([v.status for v in verdicts])
    reasons = row_reasons(verdicts, regime=False)
    return GraphAttentionReport(backend, device, status, reasons, verdicts, interpreted)


# ---- checking in a worker, and the lock's choice (the probe's) -----------------------------------
def backends_to_check(device: str, interpreted: bool) -> list[str]:
    """pyg, and triton where its kernel can run (a GPU) or be interpreted."""
    return ["pyg", *(["triton"] if device in ("cuda", "rocm") or interpreted else [])]


def check_backend(
    backend: str, device: str, dtypes: Sequence[str], *, timeout: float = TIMEOUT
) -> GraphAttentionReport:
    """One backend's verdict, measured in a fresh worker (its code never runs here)."""
    interpreted = backend == "triton" and device == "cpu" and interpreter_requested()
    request = GraphAttentionRequest(backend=backend, device=device, dtypes=tuple(dtypes))
    try:
        with Worker() as worker:
            reply = worker.call(request, timeout=timeout)
    except WorkerDied as exc:
        return GraphAttentionReport(backend, device, exc.status, [f"the check {exc.reason}"])
    report = judge(backend, device, reply.rows, interpreted=interpreted)
    if reply.tampered:
        report.status = "rejected"
        report.reasons.insert(0, f"replaced torch's own functions: {', '.join(reply.tampered)}")
    return report


def _evidence(reports: Sequence[GraphAttentionReport]) -> tuple[dict[str, Any], ...]:
    rows = []
    for rep in reports:
        for v in rep.verdicts:
            row: dict[str, Any] = {"backend": rep.backend, "dtype": v.dtype, "status": v.status}
            if v.worst_ratio is not None:
                row["worst-ratio"] = round(v.worst_ratio, 4)
            if v.deterministic is not None:
                row["deterministic"] = v.deterministic
            if rep.interpreted:
                row["interpreted"] = True
            if v.reasons:
                row["reasons"] = [r[:300] for r in v.reasons[:4]]
            sharp = v.errors.get("sharp-equal-messages", {}).get("dq")
            if sharp:  # #1027: |dq| / max|dv| where dq must vanish
                row["sharp-dq"] = float(f"{sharp[0]:.3g}")
            rows.append(row)
    return tuple(rows)


def _usable(rep: GraphAttentionReport | None, deterministic: bool) -> str | None:
    """Why ``rep``'s backend cannot be locked (None: it can)."""
    if rep is None:
        return "not checked here"
    if rep.status != "accepted":
        return f"{rep.status}: {'; '.join(rep.reasons[:2]) or 'no reason given'}"
    if rep.interpreted:
        return (
            "checked only in Triton's interpreter (TRITON_INTERPRET=1), not compiled for "
            "this machine"
        )
    if deterministic and rep.deterministic is False:
        return "not bitwise repeatable, and the probe asks for determinism (--deterministic)"
    return None


def choose(
    wanted: str,
    reports: Sequence[GraphAttentionReport],
    current: Mapping[str, Any],
    *,
    allow_fallback: bool = False,
    deterministic: bool = False,
    triton: bool | None = None,
) -> GraphAttention:
    """The lock's ``[graph-attention]``: ``auto`` takes what anemoi would run here, or the other
    where that one is rejected; ``triton`` if accepted and runnable, else an error unless
    ``allow_fallback``; ``pyg`` if accepted; never one not bitwise repeatable under
    ``deterministic``."""
    if wanted not in CHOICES:
        raise UsageError(f"--graph-attention {wanted!r} is not one of {', '.join(CHOICES)}")
    if allow_fallback and wanted == "pyg":
        raise UsageError(
            f"{ALLOW_FLAG} goes with a triton backend (pyg has nothing to fall back from)"
        )
    by = {r.backend: r for r in reports}
    cause = fallback_cause(current, triton_installed() if triton is None else triton)
    why = {b: _usable(by.get(b), deterministic) for b in BACKENDS}
    lock = functools.partial(GraphAttention, evidence=_evidence(reports))
    if wanted == "pyg" or (wanted == "auto" and cause is not None):
        if why["pyg"] is not None:
            raise ForcedUnusable(f"the pyg graph attention backend cannot be locked: {why['pyg']}")
        reason = "asked for" if wanted == "pyg" else f"what anemoi runs here ({cause})"
        return lock(backend="pyg", reason=f"pyg: {reason}; accepted against float64")
    if cause is None and why["triton"] is None:
        return lock(
            backend="triton", reason="triton: anemoi's Triton kernel, accepted against float64"
        )
    if cause is None and wanted == "auto" and why["pyg"] is None:
        return lock(backend="pyg", reason=f"pyg: the Triton kernel is not usable ({why['triton']})")
    if cause is not None and allow_fallback:
        if why["pyg"] is not None:
            raise ForcedUnusable(
                f"{ALLOW_FLAG}: the pyg path anemoi falls back to cannot be used: {why['pyg']}"
            )
        reason = f"triton asked for, with the fallback to pyg allowed ({cause} here; pyg accepted)"
        return lock(backend="triton", allow_fallback=True, reason=reason)
    problem = f"the Triton kernel {why['triton']}"
    if cause:
        problem = f"anemoi would fall back to pyg here: {cause}"
    raise ForcedUnusable(
        f"the triton graph attention backend cannot be locked: {problem}",
        fix="probe on a GPU node with triton installed, lock pyg (--graph-attention pyg), or "
        f"pass {ALLOW_FLAG}",
    )


def for_probe(
    request: Any,
    device: str,
    dtypes: Sequence[str],
    fingerprint: Mapping[str, Any],
    deterministic: bool,
    note: Callable[[str], None],
) -> GraphAttention | None:
    """The probe's ``[graph-attention]`` where asked (``--graph-attention``; else None): every
    backend checkable here, each verdict to ``note``, then ``choose`` (``fingerprint``: the
    worker's, whose device type decides where anemoi falls back)."""
    if not request.graph_attention:
        return None
    found = backends_to_check(device, interpreter_requested())
    reports = [check_backend(b, device, dtypes) for b in found]
    for rep in reports:
        first = f" ({rep.reasons[0]})" if rep.reasons else ""
        note(f"graph attention {rep.backend}: {rep.status}{first}")
    return choose(
        request.graph_attention,
        reports,
        fingerprint,
        allow_fallback=request.allow_graph_attention_fallback,
        deterministic=deterministic,
    )
