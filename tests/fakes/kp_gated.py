"""Fused gated MLPs with the flaws real ones have, each offered for the GatedMLP slot.

Each keeps anemoi's module names (``gate_proj``, ``value_proj``) unless its flaw is the names:

- ``SwappedGatedMLP``: a fused kernel that takes (value, gate) where the caller passes (gate,
  value);
- ``BiasDroppedGatedMLP``: a fused MLP that runs the projections as bare matmuls (the biases stay in
  the state dict and are never used, as in a kernel written for bias-free LLM MLPs);
- ``TanhGatedMLP``: a GEGLU kernel whose GELU is the tanh approximation (liger's,
  transformer-engine's);
- ``FusedKeysGatedMLP``: one fused ``fc1`` of both projections (transformer-engine's layout), so
  anemoi's checkpoint does not load into it.
"""

import torch
import torch.nn.functional as F

from kernel_lock.gated_mlp import GatedMLP


class SwappedGatedMLP(GatedMLP):
    def gate_and_multiply(self, gate, value):
        return super().gate_and_multiply(value, gate)


class BiasDroppedGatedMLP(GatedMLP):
    def forward(self, x):
        return self.gate_and_multiply(
            F.linear(x, self.gate_proj.weight), F.linear(x, self.value_proj.weight)
        )


class TanhGatedMLP(GatedMLP):
    def gate_and_multiply(self, gate, value):
        return F.gelu(gate, approximate="tanh") * value


class FusedKeysGatedMLP(torch.nn.Module):
    def __init__(self, in_features, out_features, mlp_implementation="swiglu", bias=True):
        super().__init__()
        self.out_features = out_features
        self.fc1 = torch.nn.Linear(in_features, 2 * out_features, bias=bias)

    def forward(self, x):
        gate, value = self.fc1(x).split(self.out_features, dim=-1)
        return F.silu(gate) * value
