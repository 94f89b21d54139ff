"""The LayerNorm and RMSNorm slots in the probe: the protocol's defaults, and an eps of None
(torch.nn.RMSNorm's own, float32's machine epsilon as torch computes it) covered by the inputs'
digest."""

from __future__ import annotations

from typing import Any

from kernel_lock.slots import norms

from .base import Slot

__all__ = ["LAYER_NORM", "RMS_NORM"]

# what the digest records of a canonical eps of None (a lock probed when RMSNorm's was pinned 1e-6,
# liger's default and not torch's, records nothing and is not reused: issue 53)
EPS_NONE = "torch's eps=None"


class Norm(Slot):
    """A norm: a layer with parameters that maps one tensor."""

    def inputs(self, declared: str, kind: str) -> dict[str, Any]:
        """Its canonical eps where it is torch's rule rather than a number."""
        return {f"{self.name}.eps": EPS_NONE} if self.spec.canonical.get("eps", 0) is None else {}


LAYER_NORM = Norm(norms.LAYER_NORM)
RMS_NORM = Norm(norms.RMS_NORM)
