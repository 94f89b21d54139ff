"""The LayerNorm and RMSNorm slots in the probe: the protocol's defaults, but a traced site's
shape, whose hidden size is its normalized shape (all of its trailing dimensions)."""

from __future__ import annotations

import math

from kernel_lock.model import Site
from kernel_lock.slots import norms

from .base import Slot, dims

__all__ = ["LAYER_NORM", "RMS_NORM"]


class Norm(Slot):
    """A norm: one tensor, normalised over its trailing ``normalized_shape``."""

    def site_shape(self, site: Site) -> tuple[str, int]:
        """ROWSxHIDDEN: HIDDEN the normalized shape's size, ROWS the rest of the input's."""
        shape, per = super().site_shape(site)
        normalized = site.semantics.get("normalized_shape")
        if not isinstance(normalized, list) or len(normalized) < 2:
            return shape, per
        hidden = math.prod(int(n) for n in normalized)
        return f"{math.prod(dims(site.shapes[0])) // hidden}x{hidden}", per


LAYER_NORM = Norm(norms.LAYER_NORM)
RMS_NORM = Norm(norms.RMS_NORM)
