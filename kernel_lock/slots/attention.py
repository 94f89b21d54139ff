"""The Attention slot: torch's ``scaled_dot_product_attention`` contract (q, k, v) plus the options
a model fixes (window -1 = global, softcap 0 = none, dropout, ALiBi); its classes are
``kernel_lock.attention``'s, built with no dimensions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import SlotSpec, TargetFacts

__all__ = ["ATTENTION"]

_OPTIONS = frozenset(("window", "softcap", "dropout", "alibi"))
_CLASSES = ("FlashAttention2", "FlashAttention3", "FlashAttention4", "TEDotProductAttention")


def _anemoi_environment(slot: Any) -> Mapping[str, str]:
    from ..anemoi import ANEMOI_ATTENTION, ATTENTION_BACKEND_ENV  # anemoi's names: only here

    backend = ANEMOI_ATTENTION.get(slot.target)
    return {ATTENTION_BACKEND_ENV: backend} if backend is not None else {}


ATTENTION = SlotSpec(
    name="Attention",
    semantics="attention",
    # torch choosing its backend: what anemoi's SDPA path runs
    default_target="kernel_lock.attention.SDPAttention",
    canonical={"window": -1, "softcap": 0.0, "dropout": 0.0, "alibi": False},
    call_kwargs={name: f"${name}" for name in ("window", "softcap", "dropout", "alibi")},
    known_targets={
        "kernel_lock.attention.SDPAttention": TargetFacts(
            "attention", _OPTIONS | {"backend"}, True
        ),
        "kernel_lock.attention.FlexAttention": TargetFacts(
            "attention", _OPTIONS | {"compiled"}, True
        ),
        **{
            f"kernel_lock.attention.{c}": TargetFacts("attention", _OPTIONS, True) for c in _CLASSES
        },
    },
    computed_by=("kernel_lock.attention.Attention",),
    anemoi_environment=_anemoi_environment,
)
