"""The Activation slot's functions: what an activation computes, told without importing it, and the
lock's ``slots.Activation.function`` key. Plain data and pure functions (no torch).

GELU's exact-erf and tanh forms are different functions (up to 4.7e-4 apart, near |x| = 2.7):
liger's GEGLU and TE's gelu use tanh, anemoi's default and its geglu gate use erf. A function
outside ``ACTIVATION_FUNCTIONS`` is declared by the class that computes it,
``other:dotted.path.Class`` (anemoi's Sine, CustomRelu): its reference is that class itself, run in
float64.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .reading import ReadError, get_required
from .slots import ACTIVATION, CANONICAL, canonical_target

__all__ = [
    "ACTIVATION_CLASSES",
    "ACTIVATION_FUNCTIONS",
    "APPROXIMATIONS",
    "OTHER_FUNCTION",
    "function_of",
    "declared_function",
    "function_problem",
    "is_approximation",
    "read_function",
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
    name = canonical_target(target)
    function = ACTIVATION_CLASSES.get(name)
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
    return str((canonical_overrides or {}).get("function") or CANONICAL[ACTIVATION]["function"])


def is_approximation(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are an approximation pair (gelu-erf and gelu-tanh)."""
    return frozenset({a, b}) in APPROXIMATIONS


def read_function(slot: str, d: Mapping[str, Any]) -> str:
    """A lock slot table's ``function``: required on the Activation slot (which function the model
    computes is that slot's meaning), refused on every other slot. ReadError names the key."""
    if slot != ACTIVATION:
        if "function" in d:
            raise ReadError(
                f"only the {ACTIVATION} slot records a function",
                "function",
                fix="remove `function`",
            )
        return ""
    value: str = get_required(d, "function", str)
    problem = function_problem(value)
    if problem:
        raise ReadError(
            problem, "function", fix='write the model\'s function, e.g. function = "gelu-erf"'
        )
    return value
