"""What anemoi's gated MLPs compute: ``mlp_implementation`` and the gate each one hard-codes.

anemoi-models' ``GatedMLPLayer`` (``anemoi/models/layers/mlp.py``) holds two
``layer_kernels.Linear`` modules, ``gate_proj`` and ``value_proj``, and returns ``gate(gate_proj(x))
* value_proj(x)``, the gate chosen by ``mlp_implementation`` in ``_build_gating_activation``. The
facts here are that table, declared once: the lock's ``[slots.GatedMLP]`` records both the
implementation (its kwargs) and the formula (its ``gate``), the export writes the implementation
into anemoi's config, and the check compares a fused kernel against the formula. Plain data:
importing this costs nothing (no torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

__all__ = [
    "APPROXIMATIONS",
    "CONFIG_KEY",
    "GATED",
    "GATES",
    "MLP_IMPLEMENTATIONS",
    "Gate",
    "formula",
    "gate_for",
]

# anemoi's MLPImplementation literal (schemas/common_components.py), "mlp" first: not gated
MLP_IMPLEMENTATIONS = ("mlp", "glu", "swiglu", "geglu", "reglu")
CONFIG_KEY = "mlp_implementation"  # the key in anemoi's processor, encoder and decoder configs


class Gate(NamedTuple):
    """One gated variant: the gate function's name, the layer's formula, and the torch.nn module
    anemoi builds for the gate (``_build_gating_activation``)."""

    function: str
    formula: str
    anemoi_module: str


def _formula(function: str) -> str:
    return f"{function}(gate_proj(x)) * value_proj(x)"


# mlp_implementation -> its gate. geglu's gate is torch.nn.GELU(): the exact erf form, not tanh's
# approximation (liger's GELUMul and transformer-engine's geglu compute tanh's)
GATES: Mapping[str, Gate] = MappingProxyType(
    {
        "glu": Gate("sigmoid", _formula("sigmoid"), "torch.nn.Sigmoid"),
        "swiglu": Gate("silu", _formula("silu"), "torch.nn.SiLU"),
        "geglu": Gate("gelu_erf", _formula("gelu_erf"), "torch.nn.GELU"),
        "reglu": Gate("relu", _formula("relu"), "torch.nn.ReLU"),
    }
)
GATED = tuple(GATES)
# what a kernel may compute instead of a gate (same shapes, same parameters): the tanh approximation
# of GELU for geglu's erf, and the gate applied to the value projection instead of the gate
# projection
APPROXIMATIONS: Mapping[str, str] = MappingProxyType({"gelu_erf": "gelu_tanh"})


def gate_for(mlp_implementation: str) -> Gate:
    """The gate of a gated ``mlp_implementation``; ValueError naming the choices for any other."""
    if mlp_implementation not in GATES:
        raise ValueError(
            f"mlp_implementation {mlp_implementation!r} is not a gated MLP: use one of "
            f"{', '.join(GATED)}"
            + (
                " ('mlp' has no gate: its Linear and Activation are their own slots)"
                if mlp_implementation == "mlp"
                else ""
            )
        )
    return GATES[mlp_implementation]


def formula(mlp_implementation: str) -> str:
    """``swiglu`` -> ``silu(gate_proj(x)) * value_proj(x)``."""
    return gate_for(mlp_implementation).formula
