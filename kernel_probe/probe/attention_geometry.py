"""The Attention slot's geometry, as the command line writes it: ``HEADSxHEAD_DIMxSEQ[:window=W]``.

Light (no torch): the command line and the probe's plan parse it before any work. Batch 1;
``window`` is the band's half-width (key j visible to query i iff |i - j| <= W; -1: global), and
when given it is the model's window: the lock pins it (``slots.Attention.kwargs.window``) and the
checks judge it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# timing on a CPU: cheap (a fraction of a second per candidate); on a GPU: a sequence long enough to
# rank the backends without O96's cost. anemoi's O96 processor: 16 heads of 128 over 40,320 nodes,
# window 512 (anemoi-core PR #959: FA2 142 ms, FA3/FA4 74 ms per fwd+bwd iteration in fp16)
DEFAULT_GEOMETRY = {"cpu": "4x32x256", "gpu": "16x128x8192:window=512"}
O96_GEOMETRY = "16x128x40320:window=512"
FORM = "HEADSxHEAD_DIMxSEQ[:window=W][,softcap=C][,dropout=P][,alibi=true]"

_GEOMETRY = re.compile(r"^(\d+)x(\d+)x(\d+)(?::(.+))?$")
# the options a model fixes, as they are written after the colon, and how each is read
OPTIONS = ("window", "softcap", "dropout", "alibi")


@dataclass(frozen=True)
class Geometry:
    """One attention geometry: heads, head_dim, sequence length, and the model's options it names
    (``window``, ``softcap``, ``dropout``, ``alibi``; absent: the lock's canonical value)."""

    heads: int
    head_dim: int
    seq: int
    options: tuple[tuple[str, object], ...] = ()

    @property
    def window(self) -> int | None:
        """The sliding window of this geometry (None: full attention)."""
        return dict(self.options).get("window")  # type: ignore[return-value]

    def __str__(self) -> str:
        text = f"{self.heads}x{self.head_dim}x{self.seq}"
        if self.options:
            text += ":" + ",".join(
                f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.options
            )
        return text


def _option(text: str, name: str, value: str) -> tuple[str, object]:
    try:
        if name == "window":
            w = int(value)
            if w < -1:
                raise ValueError
            return name, w
        if name == "alibi":
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return name, value.lower() in ("true", "1")
        x = float(value)
        if not (x >= 0 and x == x and x != float("inf")) or (name == "dropout" and x >= 1):
            raise ValueError
        return name, x
    except ValueError:
        what = {
            "window": "-1 (global) or a half-width >= 0",
            "alibi": "true or false",
            "softcap": "a number >= 0",
        }
        raise ValueError(
            f"{text!r}: {name} must be {what.get(name, 'in [0, 1)')}, got {value!r}"
        ) from None


def parse_geometry(text: str) -> Geometry:
    """``16x128x40320:window=512`` -> Geometry; ValueError naming the form otherwise."""
    m = _GEOMETRY.match(text.strip())
    if not m:
        raise ValueError(
            f"{text!r} is not {FORM}, e.g. {DEFAULT_GEOMETRY['cpu']} or {O96_GEOMETRY}"
        )
    heads, dim, seq = (int(m.group(i)) for i in (1, 2, 3))
    if not (1 <= heads <= 1024 and 1 <= dim <= 512 and 1 <= seq <= 10_000_000):
        raise ValueError(f"{text!r}: heads 1..1024, head_dim 1..512, seq 1..10,000,000")
    options: dict[str, object] = {}
    for part in (m.group(4) or "").split(",") if m.group(4) else []:
        name, sep, value = part.partition("=")
        name = name.strip()
        if name not in OPTIONS or not sep:
            raise ValueError(
                f"{text!r}: {part!r} is not one of {', '.join(o + '=...' for o in OPTIONS)}"
            )
        if name in options:
            raise ValueError(f"{text!r}: {name} is given twice")
        options.update([_option(text, name, value.strip())])
    return Geometry(heads, dim, seq, tuple(options.items()))


# ---- facts the parent reads too (torch-free: the probe's own process never imports torch for them)
SMALL_WINDOW = 1  # the band's edge: three keys per query

HINTS = {
    "random": "plain random input",
    "large-logits": "large logits: overflow of unscaled scores in low precision",
    "sharp-equal-values": "sharp softmax over equal values: dq and dk must vanish (anemoi-core "
    "#1027)",
    "non-contiguous": "non-contiguous (transposed) views",
    "head-dim-64": "head_dim 64",
    "head-dim-128": "head_dim 128",
    "window": "the model's window",
    "small-window": f"the band's edge (window {SMALL_WINDOW})",
    "second-length": "a second sequence length through the same instance (a cached mask)",
}


def canonical(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Attention slot's canonical options (its ``SlotSpec.canonical``) with the model's
    ``overrides``."""
    from kernel_lock.slots.attention import ATTENTION

    c = dict(ATTENTION.canonical)
    c.update({k: v for k, v in (overrides or {}).items() if k in c})
    return c
