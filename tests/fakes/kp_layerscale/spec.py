"""The LayerScale slot as kernel_lock knows it: plain data, no torch."""

from kernel_lock.slots import SlotSpec, TargetFacts

_PARAMS = frozenset(("dim", "init_values", "device", "dtype"))

SPEC = SlotSpec(
    name="LayerScale",
    semantics="layer_scale",
    default_target="kp_layerscale.layers.LayerScale",
    canonical={"init_values": 1e-5},
    call_args=("$hidden",),
    call_kwargs={"init_values": "$init_values"},
    known_targets={"kp_layerscale.layers.LayerScale": TargetFacts("layer_scale", _PARAMS, True)},
    computed_by=("kp_layerscale.layers.LayerScale",),
)
