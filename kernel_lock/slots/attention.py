"""The Attention slot: SDPA's contract plus the options a model fixes (``window``, ``softcap``,
``dropout``, ``alibi``, ``causal``), and what its calls pass that the slot was checked with: a
padding mask's kind (``mask``) and grouped-query attention (``gqa``)."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from ..tables import ReadError, get
from .base import NONE_VALUE, Calls, Functional, Param, SlotKey, SlotSpec, TargetFacts, bound

__all__ = ["ANEMOI_ATTENTION", "ATTENTION", "MASKS", "SDPA_BACKENDS"]

_OPTIONS = frozenset(("window", "softcap", "dropout", "alibi", "causal"))
# the attn_mask a model's calls pass: none, a boolean one (True = attend), an additive float one
MASKS = ("none", "bool", "float")
# kernel_lock.attention's classes, and the keywords each takes beyond the options
_CLASSES: Mapping[str, frozenset[str]] = {
    "SDPAttention": frozenset({"backend"}),
    "FlexAttention": frozenset({"compiled"}),
    **dict.fromkeys(("FlashAttention2", "FlashAttention3", "FlashAttention4"), frozenset()),
    "TEDotProductAttention": frozenset(),
}

# the torch.nn.attention.SDPBackend member each ``backend`` forces ("default": torch chooses)
SDPA_BACKENDS = {
    "math": "MATH",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
}
_WINDOW_MAX = 2**31 - 1  # a band half-width wider than any sequence is global attention
_PARAMS = {
    "window": Param(int, -1, _WINDOW_MAX, wanted=f"-1 (global) or a half-width 0..{_WINDOW_MAX}"),
    "softcap": Param(float, 0.0, sys.float_info.max, wanted="a finite number >= 0 (0: none)"),
    "dropout": Param(float, 0.0, math.nextafter(1.0, 0.0), wanted="in [0, 1)"),
    "alibi": Param(bool),
    "causal": Param(bool),
    "backend": Param(str, choices=("default", *SDPA_BACKENDS)),
    "compiled": Param(bool),
}

# anemoi-models 0.19's backends for a class of the slot (flash: v4, v3, v2, whichever imports)
ANEMOI_ATTENTION = {
    "kernel_lock.attention.SDPAttention": "scaled_dot_product_attention",
    **{f"kernel_lock.attention.FlashAttention{n}": "flash_attention" for n in (2, 3, 4)},
}
# anemoi's variable, read at import: overrides every component's attention_implementation
ATTENTION_BACKEND_ENV = "ANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND"


_BASE = "kernel_lock.attention.Attention"
# the base class's (what torch's SDPA computes when a model sets none)
_DEFAULTS = {"window": -1, "softcap": 0.0, "dropout": 0.0, "alibi": False, "causal": False}


def _computes(target: str, kwargs: Mapping[str, Any], cls: type | None) -> dict[str, Any] | None:
    """The options a kernel_lock.attention class computes with (its own defaults where unpinned);
    None for another class."""
    known = target in ATTENTION.known_targets or any(
        f"{c.__module__}.{c.__qualname__}" == _BASE for c in getattr(cls, "__mro__", ())
    )
    return {k: kwargs.get(k, v) for k, v in _DEFAULTS.items()} if known else None


def _declares(slot: Any) -> dict[str, tuple[Any, ...]]:
    """Causal where the table says so (``causal = true``), else not."""
    return {"causal": (bool(slot.extra.get("causal", False)),)}


def _key(name: str, param: Param, unset: Any, what: str) -> SlotKey:
    """A key of the Attention table alone, omitted where it is ``unset``."""

    def read(ctx: Any, d: Mapping[str, Any], key: str) -> Any:
        value = get(d, key, param.type)
        problem = param.problem(value) if value is not None else None
        if problem:
            raise ReadError(problem, key, fix=f"{key} must be {param.what}")
        return value

    def refuse(slot: str, d: Mapping[str, Any]) -> None:
        if name in d:
            raise ReadError(f"only the Attention slot records {what}", name, fix=f"remove {name}")

    return SlotKey(name, read, refuse, after="semantics", omit=lambda value: value == unset)


_KEYS = (
    _key("causal", Param(bool), False, "a causal mask"),
    _key("mask", Param(str, choices=MASKS), "none", "an attn_mask kind"),
    _key("gqa", Param(bool), False, "grouped-query attention"),
)


def _anemoi_environment(slot: Any) -> Mapping[str, str]:
    backend = ANEMOI_ATTENTION.get(slot.target)
    return {ATTENTION_BACKEND_ENV: backend} if backend is not None else {}


def _module(module: Any) -> dict[str, Any] | str:
    """A built attention module's own option the trace records (its window), or why the swap
    would not keep it (softcap and alibi are not recorded)."""
    if getattr(module, "softcap", 0.0) or getattr(module, "alibi", False):
        return "softcap and alibi are not recorded by the trace: not checked"
    return {"window": int(getattr(module, "window", -1))}


def _module_args(
    module: Any, state: Mapping[str, Any], accepted: set[str]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The module's own options, over whatever the lock pins."""
    return (), {k: getattr(module, k) for k in _DEFAULTS if k in accepted and hasattr(module, k)}


_NONE = {k: v for k, v in _DEFAULTS.items() if k != "dropout"}
_SDPA = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _bound(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """An SDPA call's arguments by name, its defaults filled in."""
    return bound(args, kwargs, _SDPA, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False)  # fmt: skip


def _sdpa(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    b = _bound(args, kwargs)
    q, k, mask, scale = b["query"], b["key"], b["attn_mask"], b["scale"]
    heads = int(q.shape[-3]) if q.dim() >= 3 else 1
    kv_heads = int(k.shape[-3]) if k.dim() >= 3 else 1
    kind = NONE_VALUE if mask is None else "bool" if str(mask.dtype) == "torch.bool" else "float"
    return {
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": int(q.shape[-1]),
        "seq_q": int(q.shape[-2]),
        "seq_k": int(k.shape[-2]),
        "is_causal": bool(b["is_causal"]),
        "mask": kind,
        "scale": NONE_VALUE if scale is None else float(scale),
        "dropout": float(b["dropout_p"]),
        "enable_gqa": bool(b["enable_gqa"]),
    }


def _module_call(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """One call of an Attention-slot module: SDPA's semantics of its arguments, its dropout its
    own where the call gives none (``Attention.forward``'s rule)."""
    b = bound(args, kwargs, _SDPA)
    if b.get("dropout_p") is None:
        b["dropout_p"] = float(getattr(module, "dropout", 0.0)) if module.training else 0.0
    return _sdpa((), b)


_MHA = (
    "nn.MultiheadAttention computes its projections and attention in one fused call "
    "(F.multi_head_attention_forward) that no slot swaps; rewrite it with nn.Linear and "
    "F.scaled_dot_product_attention to bring it in reach"
)


def _sdpa_build(semantics: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The class for an SDPA call: no window, softcap or alibi; causal where the call is (a lock
    of a causal model pins ``causal``, and routes only its causal calls)."""
    return (), {**_DEFAULTS, "causal": bool(semantics.get("is_causal", False))}


def _run_sdpa(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    b = _bound(args, kwargs)
    return module(*(b[name] for name in _SDPA))


_CALLS = Calls(
    module=_module,
    functions={
        "scaled_dot_product_attention": Functional(
            _sdpa, _sdpa_build, _run_sdpa, args=_SDPA, inputs=_SDPA[:4]
        )
    },
    sizes=frozenset({"heads", "kv_heads", "head_dim", "seq_q", "seq_k"}),
    module_args=_module_args,
    module_call=_module_call,
    out_of_reach={"torch.nn.MultiheadAttention": _MHA},
)

ATTENTION = SlotSpec(
    name="Attention",
    semantics="attention",
    # torch choosing its backend: what anemoi's SDPA path runs
    default_target="kernel_lock.attention.SDPAttention",
    canonical=dict(_DEFAULTS),
    call_kwargs={name: f"${name}" for name in ("window", "softcap", "dropout", "alibi")},
    optional=("causal",),  # pinned where the model is causal: a lock without it is as before
    known_targets={
        f"kernel_lock.attention.{c}": TargetFacts("attention", _OPTIONS | more, True)
        for c, more in _CLASSES.items()
    },
    computed_by=(_BASE,),
    computes=_computes,
    declares=_declares,
    keys=_KEYS,
    anemoi_environment=_anemoi_environment,
    params=_PARAMS,
    calls=_CALLS,
)
