"""A fake library's adapter, built with kernel_lock's own factory: RandnBiasLayerNorm initialised as
torch.nn.LayerNorm is (what kernel_lock.adapters.TELinear does for transformer-engine's Linear)."""

from kernel_lock.adapters import torch_init_adapter

from .norms import RandnBiasLayerNorm

RandnBiasLayerNormTorchInit = torch_init_adapter(
    RandnBiasLayerNorm, "layer_norm", "RandnBiasLayerNormTorchInit", module=__name__
)
