"""The LayerNorm and RMSNorm slots in the probe: the protocol's defaults, but a traced site's
shape, whose hidden size is its normalized shape (all of its trailing dimensions), and an eps of
None (torch.nn.RMSNorm's own, float32's machine epsilon as torch computes it) covered by the
inputs' digest."""

from __future__ import annotations

import math
from typing import Any

from kernel_lock.model import Site
from kernel_lock.slots import norms

from .base import Slot, dims

__all__ = ["LAYER_NORM", "RMS_NORM"]

# what the digest records of a canonical eps of None (a lock probed when RMSNorm's was pinned 1e-6,
# liger's default and not torch's, records nothing and is not reused: issue 53)
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
