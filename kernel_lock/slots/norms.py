"""The LayerNorm and RMSNorm slots, each the other's likely mistake. Their canonical values are
torch.nn's classes' own: LayerNorm's eps 1e-5 and bias; RMSNorm's eps None (torch's rule, written
``"none"`` in a lock; liger's default, 1e-6, is another eps)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from math import prod
from typing import Any

from .base import (
    NONE_VALUE,
    Calls,
    Functional,
    Param,
    SlotSpec,
    TargetFacts,
    TwinArgs,
    bound,
    run_with_params,
    torch_aliases,
)

__all__ = ["LAYER_NORM", "RMS_NORM"]

_LAYER_NORM = frozenset(
    ("normalized_shape", "eps", "elementwise_affine", "bias", "device", "dtype")
)
_RMS_NORM = frozenset(("normalized_shape", "eps", "elementwise_affine", "device", "dtype"))
_PARAMS = {
    "eps": Param(float, 0.0, 1.0, wanted="a number in [0, 1]"),
    "elementwise_affine": Param(bool),
    "bias": Param(bool),
}
_EPS_NONE = Param(
    float, 0.0, 1.0, wanted='a number in [0, 1], or "none" (torch\'s eps=None)', none=True
)


def _eps(module: Any) -> float | None:
    for name in ("eps", "variance_epsilon"):  # where norm classes keep their eps
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _twin_args(
    module: Any, state: Mapping[str, Any], accepted: set[str], *, bias: bool
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The module's own size and eps, and its affine parameters."""
    shape = getattr(module, "normalized_shape", None)
    if shape is None:
        shape = tuple(state["weight"].shape) if "weight" in state else (int(module.hidden_size),)
    kwargs: dict[str, Any] = {}
    eps = _eps(module)
    if (eps is not None or getattr(module, "eps", 0.0) is None) and "eps" in accepted:
        kwargs["eps"] = eps  # None too: RMSNorm(eps=None) computes with its dtype's eps
    if "elementwise_affine" in accepted:
        kwargs["elementwise_affine"] = "weight" in state
    if bias and "bias" in accepted:
        kwargs["bias"] = "bias" in state
    return (tuple(shape) if not isinstance(shape, int) else (shape,),), kwargs


def _semantics(shape: Any, eps: Any, affine: bool, bias: bool | None) -> dict[str, Any]:
    """A norm's semantics: its size, eps (None as "none"), affine and (LayerNorm's) bias."""
    out = {
        "normalized_shape": [int(shape)] if isinstance(shape, int) else [int(n) for n in shape],
        "eps": NONE_VALUE if eps is None else float(eps),
        "elementwise_affine": affine,
    }
    return out | ({"bias": bias} if bias is not None else {})


def _module(module: Any, *, bias: bool) -> dict[str, Any]:
    has_bias = getattr(module, "bias", None) is not None if bias else None
    eps, affine = getattr(module, "eps", None), bool(module.elementwise_affine)
    return _semantics(module.normalized_shape, eps, affine, has_bias)


_ARGS = {True: ("input", "normalized_shape", "weight", "bias", "eps"), False: ("input",
         "normalized_shape", "weight", "eps")}  # fmt: skip
_EPS = {True: 1e-5, False: None}  # F.layer_norm's and F.rms_norm's default eps


def _call_semantics(args: tuple[Any, ...], kwargs: Mapping[str, Any], *, bias: bool) -> Any:
    b = bound(args, kwargs, _ARGS[bias], weight=None, bias=None, eps=_EPS[bias])
    has_bias = b["bias"] is not None if bias else None
    return _semantics(b["normalized_shape"], b["eps"], b["weight"] is not None, has_bias)


def _build(semantics: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    eps = semantics["eps"]
    kwargs = {"eps": None if eps == NONE_VALUE else eps}
    kwargs |= {k: semantics[k] for k in ("elementwise_affine", "bias") if k in semantics}
    return (tuple(semantics["normalized_shape"]),), kwargs


def _params(semantics: Mapping[str, Any]) -> frozenset[str]:
    names = ("weight",) * semantics["elementwise_affine"] + ("bias",) * semantics.get("bias", 0)
    return frozenset(names)


def _calls(function: str, bias: bool) -> Calls:
    """A norm's sites: its modules, and its torch function (``layer_norm``, ``rms_norm``)."""
    routed = Functional(
        partial(_call_semantics, bias=bias), _build, run_with_params(_ARGS[bias]), _params,
        args=_ARGS[bias],
    )  # fmt: skip
    return Calls(
        module=partial(_module, bias=bias),
        functions={function: routed},
        sizes=frozenset({"normalized_shape"}),
        defaults={"elementwise_affine": True},
    )


def _sample_width(twin: Any) -> int:
    params = list(twin.parameters())
    return int(prod(getattr(twin, "normalized_shape", (params[0].shape[0],))))


def _norm(
    name: str, semantics: str, params: frozenset[str], kinds: Mapping[str, Param], **spec: Any
) -> SlotSpec:
    """A norm slot: torch.nn's class and its compiled adapter (same constructor) known."""
    facts = TargetFacts(semantics, params, True)
    twin_args: TwinArgs = partial(_twin_args, bias="bias" in params)
    return SlotSpec(
        name=name,
        semantics=semantics,
        default_target=f"torch.nn.{name}",
        call_args=("$normalized_shape",),
        call_kwargs={"eps": "$eps"},
        known_targets={f"torch.nn.{name}": facts, f"kernel_lock.adapters.Compiled{name}": facts},
        computed_by=(f"torch.nn.{name}",),
        aliases=torch_aliases("normalization", name),
        twin_args=twin_args,
        sample_width=_sample_width,
        params=kinds,
        calls=_calls(semantics, "bias" in params),
        **spec,
    )


LAYER_NORM = _norm(
    "LayerNorm",
    "layer_norm",
    _LAYER_NORM,
    _PARAMS,
    canonical={"eps": 1e-5, "bias": True},
    confusable="rms_norm",
    anemoi_key="LayerNorm",  # RMSNorm has none: under anemoi's LayerNorm it changes the model
)
RMS_NORM = _norm(
    "RMSNorm",
    "rms_norm",
    _RMS_NORM,
    {**_PARAMS, "eps": _EPS_NONE},
    canonical={"eps": None},  # torch.nn.RMSNorm's: issue 53 (it was 1e-6, liger's, not torch's)
    confusable="layer_norm",
)
