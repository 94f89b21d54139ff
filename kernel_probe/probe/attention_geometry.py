"""The Attention slot's geometry, as the command line writes it: ``HEADSxHEAD_DIMxSEQ[:window=W]``.

Light (no torch): the command line and the probe's plan parse it before any work. Batch 1; ``window``
is the band's half-width (key j visible to query i iff |i - j| <= W; -1: global), and when given it is
the model's window: the lock pins it (``slots.Attention.kwargs.window``) and the checks judge it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# timing on a CPU: cheap (a fraction of a second per candidate); on a GPU: a sequence long enough to
# rank the backends without O96's cost. anemoi's O96 processor: 16 heads of 128 over 40,320 nodes,
# window 512 (anemoi-core PR #959: FA2 142 ms, FA3/FA4 74 ms per fwd+bwd iteration in fp16)
DEFAULT_GEOMETRY = {"cpu": "4x32x256", "gpu": "16x128x8192:window=512"}
O96_GEOMETRY = "16x128x40320:window=512"
FORM = "HEADSxHEAD_DIMxSEQ[:window=W]"

_GEOMETRY = re.compile(r"^(\d+)x(\d+)x(\d+)(?::window=(-?\d+))?$")


@dataclass(frozen=True)
class Geometry:
    """One attention geometry: heads, head_dim, sequence length, and the window (None: not given)."""

    heads: int
    head_dim: int
    seq: int
    window: int | None = None

    def __str__(self) -> str:
        return f"{self.heads}x{self.head_dim}x{self.seq}" + ("" if self.window is None else f":window={self.window}")


def parse_geometry(text: str) -> Geometry:
    """``16x128x40320:window=512`` -> Geometry; ValueError naming the form otherwise."""
    m = _GEOMETRY.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not {FORM}, e.g. {DEFAULT_GEOMETRY['cpu']} or {O96_GEOMETRY}")
    heads, dim, seq = (int(m.group(i)) for i in (1, 2, 3))
    window = None if m.group(4) is None else int(m.group(4))
    if not (1 <= heads <= 1024 and 1 <= dim <= 512 and 1 <= seq <= 10_000_000):
        raise ValueError(f"{text!r}: heads 1..1024, head_dim 1..512, seq 1..10,000,000")
    if window is not None and window < -1:
        raise ValueError(f"{text!r}: window is -1 (global) or a half-width >= 0")
    return Geometry(heads, dim, seq, window)
