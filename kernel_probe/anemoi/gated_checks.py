"""check-config's gated-MLP findings: each component with an ``mlp_implementation`` key (the
processor, each encoder's and decoder's mapper in anemoi-training's presets) judged as anemoi-models
0.19 judges the value, and against the lock's GatedMLP slot.

anemoi builds ``GatedMLPLayer`` (``gate(gate_proj(x)) * value_proj(x)``, its gate hard-coded per
implementation: ``kernel_lock.slots.gated_mlp``) for glu, swiglu, geglu and reglu, and a Linear plus
the ``Activation`` slot for ``mlp``. A lock that checked one gate and a component that trains
another (or none) contradict each other: the job would train a layer the lock never checked. A gated
component with a lock that pins no GatedMLP is a warning: nothing checked that layer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kernel_lock.lock import KernelLock
from kernel_lock.slots.gated_mlp import CONFIG_KEY, GATED, MLP_IMPLEMENTATIONS
from kernel_probe.anemoi.blocks import Finding
from kernel_probe.anemoi.config_file import mappings_where

# anemoi-models' own message for a value its builder does not know (layers/mlp.py)
ANEMOI_INVALID = "`mlp_implementation` must be one of {valid}, got '{got}'."


def components(tree: Any, where: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every mapping of ``tree`` with an ``mlp_implementation`` key, with its dotted path."""
    return mappings_where(tree, lambda tree: CONFIG_KEY in tree, where)


def findings(tree: Any, lock: KernelLock | None) -> list[Finding]:
    """The gated-MLP findings of a config ``tree`` (as composed), against ``lock`` where given."""
    locked = lock.slots.get("GatedMLP") if lock is not None else None
    want = locked.kwargs.get(CONFIG_KEY) if locked is not None else None
    out: list[Finding] = []
    for where, comp in components(tree):
        value = comp.get(CONFIG_KEY)
        key = f"{where}.{CONFIG_KEY}" if where else CONFIG_KEY
        if isinstance(value, str) and "${" in value:
            continue  # an interpolation: judged where it points
        if value not in MLP_IMPLEMENTATIONS:
            valid = "('" + "', '".join(GATED) + "')"
            out.append(
                Finding(
                    "error",
                    "entry",
                    key,
                    f"anemoi raises: {ANEMOI_INVALID.format(valid=valid, got=value)}",
                    f"use one of {', '.join(MLP_IMPLEMENTATIONS)}",
                )
            )
            continue
        if locked is not None and value != want:
            out.append(
                Finding(
                    "error",
                    "lock",
                    key,
                    f"the lock's GatedMLP slot checked {want} ({locked.extra['gate']}); this "
                    "component builds "
                    + (
                        "a Linear and the Activation slot (mlp), no gated layer"
                        if value == "mlp"
                        else value
                    ),
                    f"set {CONFIG_KEY}: {want} (`kernel-probe export --config` writes it), or "
                    "probe "
                    + (
                        f"with --mlp-implementation {value}"
                        if value != "mlp"
                        else "without --mlp-implementation"
                    ),
                )
            )
        elif lock is not None and locked is None and value in GATED:
            out.append(
                Finding(
                    "warning",
                    "lock",
                    key,
                    f"{value} builds anemoi's GatedMLPLayer, and the lock pins no GatedMLP "
                    "slot: nothing checked it",
                    f"probe with --mlp-implementation {value}",
                )
            )
    return out
