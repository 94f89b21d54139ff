"""kernel-probe: find which implementation of each swappable layer (each slot: LayerNorm, RMSNorm,
Linear, Attention, Activation, GatedMLP, anemoi's graph attention, or one a package declares) this
machine should use, check that it computes the right thing (forward and backward), and pin the
answer in a kernel lock.

The runtime that reads the lock is the separate, import-light package ``kernel_lock``.
"""

__version__ = "0.1.0"
