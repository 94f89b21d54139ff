"""The LayerNorm and RMSNorm slots in the probe: the protocol's defaults."""

from __future__ import annotations

from kernel_lock.slots import norms

from .base import Slot

__all__ = ["LAYER_NORM", "RMS_NORM"]

LAYER_NORM = Slot(norms.LAYER_NORM)
RMS_NORM = Slot(norms.RMS_NORM)
