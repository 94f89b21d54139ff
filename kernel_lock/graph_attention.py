"""The lock's ``[graph-attention]`` table: the backend anemoi's GraphTransformer must run. anemoi
silently runs ``pyg`` where triton or a GPU is missing, so the job-start check refuses a machine
where a locked ``triton`` would run ``pyg``, unless ``allow-fallback = true``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import Difference
from .schema import record
from .tables import EMPTY, Raw, ReadError, Table, flag, get_choice, text, toml_key
from .trust import locate

__all__ = [
    "ALLOW_FLAG",
    "ANEMOI_KEY",
    "BACKENDS",
    "TABLE",
    "GraphAttention",
    "fallback_cause",
    "triton_installed",
]

BACKENDS = ("triton", "pyg")  # anemoi-models 0.19's graph_attention_backend values
TABLE = "graph-attention"
GPU_DEVICE_TYPES = ("cuda", "rocm")  # where torch.cuda.is_available() is true
ANEMOI_KEY = "graph_attention_backend"
ALLOW_FLAG = "--allow-graph-attention-fallback"
FIX = (
    "run on a GPU node with triton installed (`pip install triton`; ROCm: pytorch-triton-rocm), "
    "re-run `kernel-probe` on this machine to lock the pyg backend it runs, or probe with "
    f"`{ALLOW_FLAG}` to record that the fallback to pyg is accepted"
)


def _allow_fallback(ctx: Any, d: Raw, key: str, so_far: Raw) -> bool:
    allow = flag(ctx, d, key, so_far)
    if allow and so_far["backend"] != "triton":
        raise ReadError("only a triton backend can fall back (to pyg)", key, fix="remove it")
    return allow


def _backend(ctx: Any, d: Raw, key: str, _: Raw) -> str:
    fix = 'set `backend = "triton"` or `"pyg"` (see docs/lock-format.md)'
    return get_choice(d, key, BACKENDS, None, fix=fix)


@dataclass(frozen=True, kw_only=True, slots=True)
class GraphAttention(Table):
    """What the lock pins for anemoi's GraphTransformer attention."""

    backend: str = field(metadata=toml_key("backend", _backend))
    allow_fallback: bool = field(
        default=False, metadata=toml_key("allow-fallback", _allow_fallback, omit=EMPTY)
    )
    reason: str = field(default="", metadata=toml_key("reason", text()))
    evidence: tuple[Raw, ...] = field(
        default=(),
        metadata=toml_key("evidence", lambda ctx, d, k, _: ctx.objects(d, k, record), omit=EMPTY),
    )


def triton_installed() -> bool | None:
    """Is triton on the search path (the file system only; None: only importing could tell)."""
    return locate("triton")


def fallback_cause(current: Raw, triton: bool | None = None) -> str | None:
    """Why anemoi would fall back from ``triton`` to ``pyg`` on ``current``, or None."""
    causes = []
    if (triton_installed() if triton is None else triton) is False:
        causes.append("triton is not installed")
    device = current.get("device-type")
    if device not in GPU_DEVICE_TYPES:
        causes.append(
            f"there is no GPU (device type {device or 'unknown'}: torch.cuda.is_available() is "
            "false)"
        )
    return " and ".join(causes) or None


def job_start_differences(
    graph: GraphAttention | None, current: Raw, triton: bool | None = None
) -> list[Difference]:
    """A locked ``triton`` where anemoi would run ``pyg``, unless allowed."""
    if graph is None or graph.backend != "triton" or graph.allow_fallback:
        return []
    cause = fallback_cause(current, triton)
    if cause is None:
        return []
    found = f"pyg: {cause}, so anemoi-models falls back to PyG's message passing with a warning"
    expected = "triton (anemoi's Triton GraphTransformer kernel)"
    return [Difference(f"{TABLE}.backend", expected, found, "exact")]


def fallback_note(
    graph: GraphAttention | None, current: Raw, triton: bool | None = None
) -> str | None:
    """The note for an allowed (or inference-time) fallback: anemoi runs pyg here."""
    if graph is None or graph.backend != "triton":
        return None
    cause = fallback_cause(current, triton)
    if cause is None:
        return None
    allowed = "the lock allows it (allow-fallback)" if graph.allow_fallback else "inference"
    return f"graph attention: anemoi runs pyg here, not the locked triton ({cause}; {allowed})"
