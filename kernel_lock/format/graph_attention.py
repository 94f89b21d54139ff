"""The lock's ``[graph-attention]`` table: which backend anemoi's GraphTransformer attention must run,
and the job-start rule that holds it there. Import-light (no torch).

anemoi-models' GraphTransformer blocks take ``graph_attention_backend: triton | pyg``. With ``triton``
they use anemoi's own Triton kernel only where ``import triton`` works *and* ``torch.cuda.is_available()``
(ROCm included); anywhere else they log a WARNING and run PyG's message passing instead
(``anemoi.models.layers.block.GraphTransformerBaseBlock.set_attention_function``). The two are different
kernels (the Triton one gather-style and bitwise repeatable, PyG's scatter-based with atomics on a
GPU), so a lock that checked ``triton`` does not vouch for a job that silently runs ``pyg``: the
job-start check (``kernel_lock.resolve.verify``) refuses such a machine, naming the cause, unless the
lock records the allowance ``allow-fallback = true`` (written by ``kernel-probe
--allow-graph-attention-fallback``).

    [graph-attention]
    backend = "triton"          # what export writes as graph_attention_backend
    allow-fallback = false      # a machine where anemoi would run pyg instead is refused
    reason = "..."              # why the probe chose it
    [[graph-attention.evidence]]   # one verdict per (backend, dtype): kernel_probe.probe.graph_attention_verdict
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import Difference
from .reading import ReadError, get, get_choice

if TYPE_CHECKING:
    from .schema import Context

__all__ = [
    "ALLOW_FLAG",
    "ANEMOI_KEY",
    "BACKENDS",
    "FIX",
    "GPU_DEVICE_TYPES",
    "TABLE",
    "GraphAttention",
    "fallback_cause",
    "fallback_note",
    "job_start_differences",
    "triton_installed",
]

BACKENDS = ("triton", "pyg")  # anemoi-models 0.19's graph_attention_backend values
TABLE = "graph-attention"
GPU_DEVICE_TYPES = ("cuda", "rocm")  # where torch.cuda.is_available() is true
ANEMOI_KEY = "graph_attention_backend"
ALLOW_FLAG = "--allow-graph-attention-fallback"


@dataclass(frozen=True)
class GraphAttention:
    """What the lock pins for anemoi's GraphTransformer attention."""

    backend: str
    allow_fallback: bool = False
    reason: str = ""
    evidence: tuple[Mapping[str, Any], ...] = ()

    _KEYS = ("backend", "allow-fallback", "reason", "evidence")

    @classmethod
    def _from_dict(cls, ctx: Context, d: Mapping[str, Any]) -> GraphAttention:
        from .schema import record

        ctx.unknown(d, cls._KEYS)
        backend = get_choice(
            d, "backend", BACKENDS, None, fix='set `backend = "triton"` or `"pyg"` (see docs/lock-format.md)'
        )
        allow = get(d, "allow-fallback", bool, default=False)
        if allow and backend != "triton":
            raise ReadError("only a triton backend can fall back (to pyg)", "allow-fallback", fix="remove it")
        return cls(
            backend=backend,
            allow_fallback=bool(allow),
            reason=get(d, "reason", str, default=""),
            evidence=ctx.objects(d, "evidence", record),
        )

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready ``[graph-attention]`` table."""
        out: dict[str, Any] = {"backend": self.backend}
        if self.allow_fallback:
            out["allow-fallback"] = True
        out["reason"] = self.reason
        if self.evidence:
            out["evidence"] = [dict(e) for e in self.evidence]
        return out


def triton_installed() -> bool | None:
    """Is triton on the search path (the file system only; None: only importing could tell)."""
    from ..trust.locate import locate

    return locate("triton")


def fallback_cause(current: Mapping[str, Any], triton: bool | None = None) -> str | None:
    """Why anemoi's GraphTransformer would fall back from ``triton`` to ``pyg`` on the machine ``current``
    describes (its ``device-type``), or None. ``triton``: whether triton is installed (default: looked up)."""
    causes = []
    if (triton_installed() if triton is None else triton) is False:
        causes.append("triton is not installed")
    device = current.get("device-type")
    if device not in GPU_DEVICE_TYPES:
        causes.append(f"there is no GPU (device type {device or 'unknown'}: torch.cuda.is_available() is false)")
    return " and ".join(causes) or None


def job_start_differences(
    graph: GraphAttention | None, current: Mapping[str, Any], triton: bool | None = None
) -> list[Difference]:
    """A locked ``triton`` backend on a machine where anemoi would run ``pyg`` instead, unless the lock
    allows the fallback."""
    if graph is None or graph.backend != "triton" or graph.allow_fallback:
        return []
    cause = fallback_cause(current, triton)
    if cause is None:
        return []
    return [
        Difference(
            f"{TABLE}.backend",
            "triton (anemoi's Triton GraphTransformer kernel)",
            f"pyg: {cause}, so anemoi-models falls back to PyG's message passing with a warning",
            "exact",
        )
    ]


FIX = (
    "run on a GPU node with triton installed (`pip install triton`; ROCm: pytorch-triton-rocm), re-run "
    "`kernel-probe` on this machine to lock the pyg backend it runs, or probe with "
    f"`{ALLOW_FLAG}` to record that the fallback to pyg is accepted"
)


def fallback_note(graph: GraphAttention | None, current: Mapping[str, Any], triton: bool | None = None) -> str | None:
    """The note for an allowed (or inference-time) fallback: anemoi runs pyg here."""
    if graph is None or graph.backend != "triton":
        return None
    cause = fallback_cause(current, triton)
    if cause is None:
        return None
    allowed = "the lock allows it (allow-fallback)" if graph.allow_fallback else "inference"
    return f"graph attention: anemoi runs pyg here, not the locked triton ({cause}; {allowed})"
