"""The GraphTransformer attention backend in a probe: check the backends in the worker, choose the
one the lock records (``[graph-attention]``, kernel_lock.graph_attention), say why.

Which backends are checked: ``pyg`` always (it is what anemoi runs wherever the Triton kernel
cannot); ``triton`` on a GPU, or on a CPU in Triton's interpreter (``TRITON_INTERPRET=1``: its
verdict is about the kernel's maths, never locked on that alone). The check runs only when asked
(``kernel-probe --graph-attention``): a model without a GraphTransformer has no use for it, and on a
CPU the Triton interpreter takes tens of seconds.

The choice (``choose``), for ``wanted``:
- ``auto``: the backend anemoi would run here (``triton`` where triton imports and there is a GPU,
  else ``pyg``); if that one is rejected and the other is accepted and can run here, the other, with
  the reason;
- ``triton``: locked if accepted and runnable here; on a machine where anemoi would fall back, an
  error naming the cause, unless ``allow_fallback`` (then ``triton`` with ``allow-fallback = true``,
  provided the pyg path it falls back to is accepted);
- ``pyg``: locked if accepted.
A backend that is not bitwise repeatable is refused when the probe asks for determinism.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kernel_lock.graph_attention import (
    ALLOW_FLAG,
    BACKENDS,
    GraphAttention,
    fallback_cause,
    triton_installed,
)
from kernel_probe.errors import ForcedUnusable, UsageError
from kernel_probe.probe.graph_attention_verdict import GraphAttentionReport, judge

CHOICES = ("auto", *BACKENDS)
TIMEOUT = 600.0  # the Triton interpreter on a CPU: ~20 s per dtype here


def backends_to_check(device: str, interpreted: bool) -> list[str]:
    """pyg, and triton where its kernel can run (a GPU) or be interpreted."""
    return ["pyg", *(["triton"] if device in ("cuda", "rocm") or interpreted else [])]


def check_backend(
    backend: str, device: str, dtypes: Sequence[str], *, timeout: float = TIMEOUT
) -> GraphAttentionReport:
    """One backend's verdict, measured in a fresh worker (anemoi's and the kernel's code never run
    here)."""
    from kernel_probe.isolation.protocol import GraphAttentionRequest, interpreter_requested
    from kernel_probe.isolation.worker import Worker, WorkerDied

    interpreted = backend == "triton" and device == "cpu" and interpreter_requested()
    try:
        with Worker() as worker:
            request: GraphAttentionRequest = {
                "op": "graph-attention",
                "backend": backend,
                "device": device,
                "dtypes": list(dtypes),
            }
            reply = worker.call(request, timeout=timeout)
    except WorkerDied as exc:
        return GraphAttentionReport(backend, device, exc.status, [f"the check {exc.reason}"])
    report = judge(backend, device, reply.rows, interpreted=interpreted)
    if reply.tampered:
        report.status = "rejected"
        report.reasons.insert(0, f"replaced torch's own functions: {', '.join(reply.tampered)}")
    return report


def check_all(device: str, dtypes: Sequence[str]) -> list[GraphAttentionReport]:
    """Every backend that can be checked here (``backends_to_check``)."""
    from kernel_probe.isolation.protocol import interpreter_requested

    return [
        check_backend(b, device, dtypes) for b in backends_to_check(device, interpreter_requested())
    ]


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
            if sharp:
                # #1027: |dq| / max|dv| where dq must vanish
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
    """The lock's ``[graph-attention]`` per the rule of the module docstring; raises where none
    fits."""
    if wanted not in CHOICES:
        raise UsageError(f"--graph-attention {wanted!r} is not one of {', '.join(CHOICES)}")
    if allow_fallback and wanted == "pyg":
        raise UsageError(
            f"{ALLOW_FLAG} goes with a triton backend (pyg has nothing to fall back from)"
        )
    by = {r.backend: r for r in reports}
    cause = fallback_cause(current, triton_installed() if triton is None else triton)
    why = {b: _usable(by.get(b), deterministic) for b in BACKENDS}
    evidence = _evidence(reports)
    if wanted == "pyg" or (wanted == "auto" and cause is not None):
        if why["pyg"] is not None:
            raise ForcedUnusable(f"the pyg graph attention backend cannot be locked: {why['pyg']}")
        reason = "asked for" if wanted == "pyg" else f"what anemoi runs here ({cause})"
        return GraphAttention(
            backend="pyg", reason=f"pyg: {reason}; accepted against float64", evidence=evidence
        )
    if cause is None and why["triton"] is None:
        return GraphAttention(
            backend="triton",
            reason="triton: anemoi's Triton kernel, accepted against float64",
            evidence=evidence,
        )
    if cause is None and wanted == "auto" and why["pyg"] is None:
        return GraphAttention(
            backend="pyg",
            reason=f"pyg: the Triton kernel is not usable ({why['triton']})",
            evidence=evidence,
        )
    if cause is not None and allow_fallback:
        if why["pyg"] is not None:
            raise ForcedUnusable(
                f"{ALLOW_FLAG}: the pyg path anemoi falls back to cannot be used: {why['pyg']}"
            )
        return GraphAttention(
            backend="triton",
            allow_fallback=True,
            reason=f"triton asked for, with the fallback to pyg allowed ({cause} here; pyg "
            "accepted)",
            evidence=evidence,
        )
    problem = (
        cause
        and f"anemoi would fall back to pyg here: {cause}"
        or f"the Triton kernel {why['triton']}"
    )
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
    """The probe's ``[graph-attention]`` where its request asks for it (``--graph-attention``), else
    None: every backend checkable here checked, each verdict sent to ``note``, then ``choose``.
    ``fingerprint`` is this machine's, from the worker (its device type decides where anemoi falls
    back)."""
    if not request.graph_attention:
        return None
    reports = check_all(device, dtypes)
    for rep in reports:
        note(
            f"graph attention {rep.backend}: {rep.status}"
            + (f" ({rep.reasons[0]})" if rep.reasons else "")
        )
    return choose(
        request.graph_attention,
        reports,
        fingerprint,
        allow_fallback=request.allow_graph_attention_fallback,
        deterministic=deterministic,
    )
