"""The GatedMLP slot's classes, anemoi's ``GatedMLPLayer`` interface and state-dict keys, computing
``gate(gate_proj(x)) * value_proj(x)``; ``swap_gated_layers`` puts one into a built anemoi model."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .slots.gated_mlp import GATES, gate_for

# LigerGatedMLP (built on first lookup) is public, unlisted: ``import *`` never imports liger
__all__ = [
    "TORCH_GATES",
    "CompiledGatedMLP",
    "GatedMLP",
    "anemoi_implementation",
    "from_anemoi",
    "swap_gated_layers",
]

# gate function name (kernel_lock.slots.gated_mlp) -> torch's function
TORCH_GATES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "gelu_erf": F.gelu,  # approximate="none": erf, as torch.nn.GELU() in anemoi's geglu
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "relu": F.relu,
}


class GatedMLP(nn.Module):
    """``gate(gate_proj(x)) * value_proj(x)`` with torch's functions (anemoi's layer)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        mlp_implementation: str = "swiglu",
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.mlp_implementation = mlp_implementation
        self.gate_function = gate_for(mlp_implementation).function
        self._check_gate()
        options = {"bias": bias, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(in_features, out_features, **options)
        self.value_proj = nn.Linear(in_features, out_features, **options)

    def _check_gate(self) -> None:
        """A subclass refuses, at construction, a gate its kernel does not compute."""

    def gate_and_multiply(self, gate: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """The gate applied to ``gate``, times ``value``."""
        return TORCH_GATES[self.gate_function](gate) * value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``gate(gate_proj(x)) * value_proj(x)``."""
        return self.gate_and_multiply(self.gate_proj(x), self.value_proj(x))

    def extra_repr(self) -> str:
        """The gated MLP's kind (``mlp_implementation``) in the module's repr."""
        return f"mlp_implementation={self.mlp_implementation!r}"


_compiled: dict[str, Callable[..., Any]] = {}


class CompiledGatedMLP(GatedMLP):
    """``GatedMLP`` whose gate and product run compiled, one function per gate."""

    def gate_and_multiply(self, gate: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """The gate and the product, compiled."""
        function = self.gate_function
        if function not in _compiled:
            torch_gate = TORCH_GATES[function]

            def gated_product(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return torch_gate(g) * v

            _compiled[function] = torch.compile(gated_product)
        return _compiled[function](gate, value)


# liger-kernel's fused gate-and-multiply functions, by the gate they compute (its GELU is tanh's)
LIGER_GATES = {
    "silu": ("liger_kernel.ops.swiglu", "LigerSiLUMulFunction", "silu"),
    "gelu_erf": ("liger_kernel.ops.geglu", "LigerGELUMulFunction", "gelu_tanh"),
}


def _liger_class() -> type:
    functions = {
        gate: getattr(importlib.import_module(m), name)
        for gate, (m, name, _) in LIGER_GATES.items()
    }

    class LigerGatedMLP(GatedMLP):
        """``GatedMLP`` on liger-kernel's fused kernels (its geglu is tanh GELU)."""

        # what the fused kernel computes for each gate it is offered for (the check compares)
        computes = {gate: computed for gate, (_, _, computed) in LIGER_GATES.items()}

        def _check_gate(self) -> None:
            if self.gate_function not in functions:
                raise ValueError(
                    f"liger-kernel has no fused {self.gate_function} gate (mlp_implementation="
                    f"{self.mlp_implementation!r}); its fused gates are swiglu's silu and "
                    "geglu's (tanh) GELU"
                )

        def gate_and_multiply(self, gate: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            """liger's fused gate-and-multiply (its backward overwrites its inputs)."""
            return functions[self.gate_function].apply(gate, value)

    LigerGatedMLP.__module__ = __name__
    LigerGatedMLP.__qualname__ = "LigerGatedMLP"  # picklable by name, found through __getattr__
    return LigerGatedMLP


ANEMOI_LAYER = "GatedMLPLayer"


def anemoi_implementation(layer: nn.Module) -> str:
    """The ``mlp_implementation`` an anemoi ``GatedMLPLayer`` was built with (its gate module)."""
    gating = getattr(layer, "gating", None)
    for name, gate in GATES.items():
        cls = gate.anemoi_module.rpartition(".")[2]
        if type(gating).__name__ == cls and getattr(gating, "approximate", "none") == "none":
            return name
    raise ValueError(
        f"{type(layer).__name__} has the gate {gating!r}, which no mlp_implementation builds"
    )


def from_anemoi(layer: nn.Module, cls: type[GatedMLP] = GatedMLP) -> GatedMLP:
    """A ``cls`` computing what the anemoi ``GatedMLPLayer`` ``layer`` does, parameters loaded."""
    gate_proj = layer.gate_proj
    if not isinstance(gate_proj, nn.Linear):
        raise TypeError(
            f"{type(layer).__name__}.gate_proj is a {type(gate_proj).__name__}, not a "
            "torch.nn.Linear"
        )
    new = cls(
        gate_proj.in_features,
        gate_proj.out_features,
        mlp_implementation=anemoi_implementation(layer),
        bias=gate_proj.bias is not None,
        device=gate_proj.weight.device,
        dtype=gate_proj.weight.dtype,
    )
    new.load_state_dict(layer.state_dict(), strict=True)
    return new


def swap_gated_layers(model: nn.Module, cls: type[GatedMLP]) -> int:
    """Replace every anemoi ``GatedMLPLayer`` in ``model`` by ``cls``; returns how many."""
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child).__name__ == ANEMOI_LAYER
    ]
    for parent, name, child in found:
        setattr(parent, name, from_anemoi(child, cls))
    return len(found)


def __getattr__(name: str) -> type:
    """Build ``LigerGatedMLP`` on first lookup (ImportError without liger-kernel)."""
    if name != "LigerGatedMLP":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = globals()[name] = _liger_class()
    return cls
