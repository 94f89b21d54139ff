"""``graph_attention_backend`` in an anemoi config: where it is set, what check-config says of it,
and what export writes for it.

anemoi-models 0.19 reads ``graph_attention_backend`` (``triton | pyg``, default ``triton``) in every
GraphTransformer component: the processor of a GraphTransformer model (``model.processor``), and the
GraphTransformer mappers of any model (``model.encoders.<name>.mapper``,
``model.decoders.<name>.mapper``; anemoi-training's ``config/model/graphtransformer*.yaml`` and
``transformer*.yaml``). A component is a mapping whose ``_target_`` is one of ``GT_TARGETS``, or
that sets the key. Each is judged alone (per component), against anemoi's own rule (any other value
fails its assertion, quoted) and against the lock's ``[graph-attention]``
(kernel_lock.graph_attention).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kernel_lock.graph_attention import ANEMOI_KEY, BACKENDS, TABLE, fallback_cause
from kernel_lock.lock import KernelLock
from kernel_probe.anemoi.blocks import Finding
from kernel_probe.anemoi.config_file import mappings_where

GT_TARGETS = (
    "anemoi.models.layers.processor.GraphTransformerProcessor",
    "anemoi.models.layers.mapper.GraphTransformerForwardMapper",
    "anemoi.models.layers.mapper.GraphTransformerBackwardMapper",
)
DEFAULT = "triton"  # anemoi-models' default in code (GraphTransformerBaseBlock) and in every YAML


def anemoi_rejects(value: str) -> str:
    """anemoi's own assertion message for a backend it does not know
    (anemoi/models/layers/block.py)."""
    return (
        f"Backend '{value}' not supported for GraphTransformerBlock, valid options are "
        "'triton' and 'pyg'"
    )


def components(tree: Any, where: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every GraphTransformer component of ``tree`` (module docstring), with its dotted path."""
    return mappings_where(
        tree, lambda tree: tree.get("_target_") in GT_TARGETS or ANEMOI_KEY in tree, where
    )


def _value(comp: Mapping[str, Any]) -> str | None:
    """The component's backend as anemoi reads it (its default where unset); None for an
    interpolation."""
    value = comp.get(ANEMOI_KEY, DEFAULT)
    if isinstance(value, str) and "${" in value:
        return None
    return str(value)


def findings(
    tree: Any, lock: KernelLock | None, current: Mapping[str, Any] | None = None
) -> list[Finding]:
    """check-config's findings on every component's ``graph_attention_backend``: a value anemoi
    rejects (error, its wording); a contradiction with the lock's backend (error); without a lock
    that pins one, a ``triton`` that this machine would run as ``pyg`` (warning: anemoi only logs
    it)."""
    graph = lock.graph_attention if lock is not None else None
    if current is None:
        from kernel_lock import torchless

        current = torchless.for_check(["device-type"])
    out: list[Finding] = []
    for where, comp in components(tree):
        value = _value(comp)
        if value is None:
            continue
        key = f"{where}.{ANEMOI_KEY}"
        unset = "" if ANEMOI_KEY in comp else f" (not set: anemoi's default {DEFAULT})"
        if value not in BACKENDS:
            out.append(
                Finding(
                    "error",
                    "entry",
                    key,
                    f"anemoi raises: {anemoi_rejects(value)}",
                    "set triton or pyg",
                )
            )
            continue
        if graph is not None and value != graph.backend:
            out.append(
                Finding(
                    "error",
                    "lock",
                    key,
                    f"{value}{unset} here, but the lock's [{TABLE}] backend is {graph.backend}",
                    f"set {ANEMOI_KEY}: {graph.backend} (`kernel-probe export --config` writes "
                    f"it), or probe with --graph-attention {value}",
                )
            )
            continue
        cause = fallback_cause(current) if value == "triton" else None
        if cause is not None and (graph is None or graph.allow_fallback):
            allowed = " (the lock allows it)" if graph is not None else ""
            out.append(
                Finding(
                    "warning" if graph is None else "note",
                    "import",
                    key,
                    f"triton{unset}, but anemoi falls back to pyg here: {cause}{allowed}",
                    "run on a GPU node with triton installed, or set pyg to say what runs",
                )
            )
    return out


def export_setting(lock: KernelLock) -> tuple[str, str] | None:
    """``(backend, note)`` export writes on every GraphTransformer component; None when the lock has
    no ``[graph-attention]`` (anemoi's own setting stays)."""
    graph = lock.graph_attention
    if graph is None:
        return None
    note = (
        f"from the lock's [{TABLE}]: {graph.reason}"
        if graph.reason
        else f"from the lock's [{TABLE}]"
    )
    if graph.allow_fallback:
        note += "; where there is no GPU or no triton anemoi runs pyg (the lock allows it)"
    return graph.backend, note


def overlay_settings(tree: Any, lock: KernelLock, *, model_file: bool) -> dict[str, str]:
    """Component path relative to the model node (``processor``, ``encoders.0.mapper``) -> the
    backend to set there. ``model_file``: ``tree`` is the model node itself
    (config/model/<name>.yaml), else the whole config, whose components under ``model`` count."""
    setting = export_setting(lock)
    if setting is None:
        return {}
    out = {}
    for where, _ in components(tree):
        relative = (
            where
            if model_file
            else where.removeprefix("model.")
            if where.startswith("model.")
            else ""
        )
        if relative and "[" not in relative:
            out[relative] = setting[0]
    return out
