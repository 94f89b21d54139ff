"""The LayerNorm and RMSNorm slots in the probe: the protocol's defaults, but a traced site's
hidden size is its normalized shape, and an eps of None is covered by the inputs' digest."""

from __future__ import annotations

import math
from typing import Any

from kernel_lock.model import Site
from kernel_lock.slots import norms

from .base import Slot, dims

__all__ = ["LAYER_NORM", "RMS_NORM"]

# the digest's record of a canonical eps of None (issue 53: a lock probed with 1e-6 is not reused)
EPS_NONE = "torch's eps=None"


class Norm(Slot):
    """A norm: one tensor, normalised over its trailing ``normalized_shape``."""

    def inputs(self, declared: str, kind: str) -> dict[str, Any]:
        """Its canonical eps where it is torch's rule rather than a number."""
        return {f"{self.name}.eps": EPS_NONE} if self.spec.canonical.get("eps", 0) is None else {}

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
