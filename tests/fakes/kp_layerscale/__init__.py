"""A layer kernel-probe does not know, declared from outside: LayerScale (``y = x * gamma``, one
learned scale per channel, as vision transformers use it).

A package that is not part of kernel-probe adds the slot through the slot protocol's entry points
(tests/kernel_probe/test_slot_from_outside.py writes them): ``kernel_lock.slots`` names
:data:`kp_layerscale.spec.SPEC` (what a lock may pin, read by every training process),
``kernel_probe.slots`` names :data:`kp_layerscale.probe.SLOT` (how the probe checks and times it),
``kernel_probe.probe.candidates`` its candidates. Importing this package imports nothing."""
