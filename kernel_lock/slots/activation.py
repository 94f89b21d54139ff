"""The Activation slot: an elementwise function of one tensor, no parameters. Which function is
the model's declared choice (``function``, a canonical value and a key of the lock's table), the
reference every candidate is checked against; no constructor takes it.

GELU's exact-erf and tanh forms are different functions (up to 4.7e-4 apart, near |x| = 2.7):
liger's GEGLU and TE's gelu use tanh, anemoi's default and its geglu gate use erf. A function
outside ``ACTIVATION_FUNCTIONS`` is declared by the class that computes it,
``other:dotted.path.Class`` (anemoi's Sine, CustomRelu): its reference is that class, run in
float64.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..tables import ReadError, get_required
from .base import SlotKey, SlotSpec, TargetFacts, torch_aliases

__all__ = [
    "ACTIVATION",
    "ACTIVATION_CLASSES",
    "ACTIVATION_FUNCTIONS",
    "APPROXIMATIONS",
    "NOT_ELEMENTWISE",
    "OTHER_FUNCTION",
    "declared_function",
    "function_of",
    "function_problem",
    "is_approximation",
]

# What an activation computes, as the model declares it (``--activation``; anemoi: the class its
# config names)
ACTIVATION_FUNCTIONS = ("gelu-erf", "gelu-tanh", "silu", "relu", "sigmoid")
OTHER_FUNCTION = "other:"
# pairs where one is an approximation of the other: accepted for each other only with
# ``--allow-approximation``, and recorded in the lock's accepted-changes
APPROXIMATIONS = frozenset({frozenset({"gelu-erf", "gelu-tanh"})})
# torch.nn's activation classes -> the function each computes with its default arguments; GELU's
# ``approximate="tanh"`` makes it gelu-tanh (``function_of``)
ACTIVATION_CLASSES: Mapping[str, str] = MappingProxyType(
    {
        "torch.nn.GELU": "gelu-erf",
        "torch.nn.SiLU": "silu",
        "torch.nn.ReLU": "relu",
        "torch.nn.Sigmoid": "sigmoid",
        "kernel_lock.adapters.CompiledGELU": "gelu-erf",
        # transformer-engine's fusible ops: its GELU is the tanh form (TE's docstring and math.h)
        "transformer_engine.pytorch.ops.GELU": "gelu-tanh",
        "transformer_engine.pytorch.ops.ReLU": "relu",
    }
)


def function_of(target: str, kwargs: Mapping[str, Any] | None = None) -> str | None:
    """The function a class computes with ``kwargs``, told without importing it: torch.nn's
    activations and kernel_lock's adapters (``torch.nn.GELU`` with ``approximate="tanh"`` is
    gelu-tanh); None for any other class (the check measures what it computes)."""
    function = ACTIVATION_CLASSES.get(_ALIASES.get(target, target))
    if function is None:
        return None
    if function == "gelu-erf" and (kwargs or {}).get("approximate", "none") == "tanh":
        return "gelu-tanh"
    return function


def function_problem(text: str) -> str | None:
    """Why ``text`` is no activation function the slot knows (None when it is one): one of
    ``ACTIVATION_FUNCTIONS`` or ``other:dotted.path.Class``."""
    if text in ACTIVATION_FUNCTIONS:
        return None
    if text.startswith(OTHER_FUNCTION):
        path = text[len(OTHER_FUNCTION) :]
        parts = path.split(".")
        if len(parts) >= 2 and all(p.isidentifier() and not p.startswith("_") for p in parts):
            return None
        return (
            f"{text!r}: after {OTHER_FUNCTION!r} comes the public dotted path of the class "
            "that computes it"
        )
    return (
        f"{text!r} is not an activation function kernel-probe knows: use one of "
        f"{', '.join(ACTIVATION_FUNCTIONS)}, or {OTHER_FUNCTION}module.Class for another (e.g. "
        f"{OTHER_FUNCTION}anemoi.models.layers.activations.Sine)"
    )


def declared_function(canonical_overrides: Mapping[str, Any] | None) -> str:
    """The model's declared function: the slot's canonical ``function`` as the request overrides it
    (torch-free: the probe's own process judges with it and never imports torch)."""
    return str((canonical_overrides or {}).get("function") or ACTIVATION.canonical["function"])


def is_approximation(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are an approximation pair (gelu-erf and gelu-tanh)."""
    return frozenset({a, b}) in APPROXIMATIONS


def _read_function(ctx: Any, d: Mapping[str, Any], key: str) -> str:
    value: str = get_required(d, key, str)
    problem = function_problem(value)
    if problem:
        raise ReadError(problem, key, fix='write the model\'s function, e.g. function = "gelu-erf"')
    return value


def _refuse_function(slot: str, d: Mapping[str, Any]) -> None:
    if "function" in d:
        raise ReadError(
            "only the Activation slot records a function", "function", fix="remove `function`"
        )


# torch.nn.modules.activation's classes that are no elementwise activation: attention, the gated GLU
# (it halves the last dimension: anemoi refuses it under Activation) and the normalising softmaxes
NOT_ELEMENTWISE = ("MultiheadAttention", "GLU", "Softmax", "Softmin", "LogSoftmax", "Softmax2d")
_GELU = frozenset(("approximate",))
_INPLACE = frozenset(("inplace",))
_ALIASES = torch_aliases("activation", "GELU", "SiLU", "ReLU", "Sigmoid")

ACTIVATION = SlotSpec(
    name="Activation",
    semantics="activation",
    default_target="torch.nn.GELU",  # anemoi's default layer_kernels.Activation (exact erf)
    canonical={"function": "gelu-erf"},
    known_targets={
        "torch.nn.GELU": TargetFacts("activation", _GELU, True),
        "torch.nn.SiLU": TargetFacts("activation", _INPLACE, True),
        "torch.nn.ReLU": TargetFacts("activation", _INPLACE, True),
        "torch.nn.Sigmoid": TargetFacts("activation", frozenset(), True),
        "kernel_lock.adapters.CompiledGELU": TargetFacts("activation", _GELU, True),
    },
    computed_by=("torch.nn.modules.activation.*",),
    not_computed_by=NOT_ELEMENTWISE,
    aliases=_ALIASES,
    # the model's function the candidates were checked against
    keys=(SlotKey("function", _read_function, _refuse_function, after="semantics"),),
)
