"""What a slot's call sites look like to the trace (its child: imports torch): the functions of
torch.nn.functional each slot covers, and the semantics a call or a module of a slot computes
with, read from the call's own arguments or the module's own attributes, never defaulted."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kernel_lock import slots as specs
from kernel_lock.model import NONE_VALUE

__all__ = ["FUNCTIONS", "Function", "module_site", "public_name"]

Semantics = Callable[[Mapping[str, Any]], dict[str, Any]]


def _none(value: Any) -> Any:
    return NONE_VALUE if value is None else float(value)


def _shape(value: Any) -> list[int]:
    return [int(value)] if isinstance(value, int) else [int(n) for n in value]


def _layer_norm(a: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "normalized_shape": _shape(a["normalized_shape"]),
        "eps": float(a.get("eps", 1e-5)),
        "elementwise_affine": a.get("weight") is not None,
        "bias": a.get("bias") is not None,
    }


def _rms_norm(a: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "normalized_shape": _shape(a["normalized_shape"]),
        "eps": _none(a.get("eps")),
        "elementwise_affine": a.get("weight") is not None,
    }


def _linear(a: Mapping[str, Any]) -> dict[str, Any]:
    w = a["weight"]
    out = int(w.shape[0]) if w.dim() > 1 else 1
    return {"in_features": int(w.shape[-1]), "out_features": out, "bias": a.get("bias") is not None}


def _attention(a: Mapping[str, Any]) -> dict[str, Any]:
    q, k, mask = a["query"], a["key"], a.get("attn_mask")
    kind = "none" if mask is None else "bool" if mask.dtype == torch.bool else "float"
    return {
        "heads": int(q.shape[-3]) if q.dim() >= 3 else 1,
        "kv_heads": int(k.shape[-3]) if k.dim() >= 3 else 1,
        "head_dim": int(q.shape[-1]),
        "seq_q": int(q.shape[-2]),
        "seq_k": int(k.shape[-2]),
        "is_causal": bool(a.get("is_causal", False)),
        "mask": kind,
        "scale": _none(a.get("scale")),
        "dropout": float(a.get("dropout_p") or 0.0),
        "enable_gqa": bool(a.get("enable_gqa", False)),
    }


def _gelu(a: Mapping[str, Any]) -> dict[str, Any]:
    return {"function": "gelu-tanh" if a.get("approximate", "none") == "tanh" else "gelu-erf"}


def _function(name: str) -> Semantics:
    return lambda a: {"function": name}


@dataclass(frozen=True)
class Function:
    """A function of a slot: its public name, positional parameters, tensor inputs, semantics."""

    slot: str
    call: str
    params: tuple[str, ...]
    semantics: Semantics
    inputs: tuple[str, ...] = ("input",)

    @property
    def name(self) -> str:
        """The function's own name (``layer_norm``): what a site's ``where`` ends with."""
        return self.call.rsplit(".", 1)[-1]

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name."""
        return {**dict(zip(self.params, args, strict=False)), **kwargs}


_SDPA = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_NORM = ("input", "normalized_shape", "weight", "bias", "eps")
_ONE = ("input", "inplace")
_FUNCTIONS = [
    (F.layer_norm, Function("LayerNorm", "torch.nn.functional.layer_norm", _NORM, _layer_norm)),
    (torch.layer_norm, Function("LayerNorm", "torch.layer_norm", _NORM, _layer_norm)),
    (
        F.linear,
        Function("Linear", "torch.nn.functional.linear", ("input", "weight", "bias"), _linear),
    ),
    (
        F.scaled_dot_product_attention,
        Function(
            "Attention",
            "torch.nn.functional.scaled_dot_product_attention",
            _SDPA,
            _attention,
            ("query", "key", "value", "attn_mask"),
        ),
    ),
    (F.gelu, Function("Activation", "torch.nn.functional.gelu", ("input", "approximate"), _gelu)),
    (F.silu, Function("Activation", "torch.nn.functional.silu", _ONE, _function("silu"))),
    (F.relu, Function("Activation", "torch.nn.functional.relu", _ONE, _function("relu"))),
    (torch.relu, Function("Activation", "torch.relu", _ONE, _function("relu"))),
    (torch.sigmoid, Function("Activation", "torch.sigmoid", _ONE, _function("sigmoid"))),
    (F.sigmoid, Function("Activation", "torch.nn.functional.sigmoid", _ONE, _function("sigmoid"))),
]
_RMS = ("input", "normalized_shape", "weight", "eps")
_FUNCTIONS += [  # torch >= 2.4
    (fn, Function("RMSNorm", call, _RMS, _rms_norm))
    for fn, call in ((getattr(F, "rms_norm", None), "torch.nn.functional.rms_norm"),
                     (getattr(torch, "rms_norm", None), "torch.rms_norm"))
    if fn is not None
]  # fmt: skip
FUNCTIONS: dict[Any, Function] = dict(_FUNCTIONS)


def public_name(cls: type) -> str:
    """``torch.nn.LayerNorm`` for torch.nn's classes (by any of their module paths), else the
    class's own ``module.Qualname``."""
    path = specs.canonical_target(f"{cls.__module__}.{cls.__qualname__}")
    if cls.__module__.startswith("torch.nn.modules.") and getattr(nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    return path


# ---- module sites -----------------------------------------------------------------------------
def _norm(m: nn.Module, bias: bool) -> dict[str, Any]:
    weight = getattr(m, "weight", None)
    shape = getattr(m, "normalized_shape", None)
    if shape is None and weight is None:
        raise ValueError(f"{public_name(type(m))} has neither normalized_shape nor a weight")
    eps = next((getattr(m, k) for k in ("eps", "variance_epsilon") if hasattr(m, k)), None)
    out = {
        "normalized_shape": _shape(shape if shape is not None else weight.shape),  # type: ignore[union-attr]
        "eps": _none(eps),
        "elementwise_affine": bool(getattr(m, "elementwise_affine", weight is not None)),
    }
    return out | ({"bias": getattr(m, "bias", None) is not None} if bias else {})


def _linear_module(m: nn.Module) -> dict[str, Any]:
    return _linear({"weight": m.weight, "bias": getattr(m, "bias", None)})


def _attention_module(m: nn.Module, bound: Mapping[str, Any]) -> dict[str, Any]:
    given = bound.get("dropout_p")
    dropout = (
        given if given is not None else (float(getattr(m, "dropout", 0.0)) if m.training else 0.0)
    )
    return _attention({**bound, "dropout_p": dropout}) | {"window": int(getattr(m, "window", -1))}


_MHA_REASON = (
    "nn.MultiheadAttention computes its projections and attention in one fused call "
    "(F.multi_head_attention_forward) that no slot swaps; rewrite it with nn.Linear and "
    "F.scaled_dot_product_attention to bring it in reach"
)


def module_site(m: nn.Module) -> tuple[str, str] | None:
    """(slot, "") for a module of a slot, ("", reason) for one found but out of reach; None for a
    module that is neither (its calls are the trace's to find)."""
    cls = type(m)
    if isinstance(m, nn.MultiheadAttention):
        return "", _MHA_REASON
    semantics = specs.class_semantics(cls)
    if semantics is None:
        return None
    if semantics.endswith("(quantized or fused)"):
        return "", f"{public_name(cls)} is quantized or fused: no slot computes a plain float call"
    slot = next((s.name for s in specs.SPECS.values() if s.semantics == semantics), None)
    if slot is None:
        return None
    spec = specs.SPECS[slot]
    if spec.computes is not None and slot == "Activation":
        found = spec.computes(public_name(cls), _activation_kwargs(m), cls)
        if not found or found.get("function") is None:
            why = f"{public_name(cls)} has a forward of its own: what it computes cannot be told"
            return "", why
    return slot, ""


def _activation_kwargs(m: nn.Module) -> dict[str, Any]:
    return {k: getattr(m, k) for k in ("approximate",) if hasattr(m, k)}


def module_semantics(
    slot: str, m: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """What module ``m`` of ``slot`` computes with, called with ``args`` and ``kwargs``."""
    cls = type(m)
    if slot == "LayerNorm":
        return _norm(m, bias=True)
    if slot == "RMSNorm":
        return _norm(m, bias=False)
    if slot == "Linear":
        return _linear_module(m)
    if slot == "Attention":
        return _attention_module(m, {**dict(zip(_SDPA, args, strict=False)), **kwargs})
    spec = specs.SPECS[slot]
    found = spec.computes(public_name(cls), _activation_kwargs(m), cls) if spec.computes else None
    return dict(found or {})
