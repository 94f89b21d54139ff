"""The Activation slot: an elementwise function, no parameters; the function is the
model's declared choice (``function``). GELU's erf and tanh forms differ (up to 4.7e-4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..tables import ReadError, get_required
from .base import Calls, Functional, Param, SlotKey, SlotSpec, TargetFacts, bound, torch_aliases

__all__ = [
    "ACTIVATION",
    "ACTIVATION_FUNCTIONS",
    "APPROXIMATIONS",
    "OTHER_FUNCTION",
    "TORCH_OTHERS",
    "approximation_change",
    "declared_function",
    "function_of",
    "function_problem",
    "is_approximation",
]

# What an activation computes, as the model declares it (``--activation``)
ACTIVATION_FUNCTIONS = ("gelu-erf", "gelu-tanh", "silu", "relu", "sigmoid")
OTHER_FUNCTION = "other:"
# approximations of each other: accepted only with ``--allow-approximation``, and recorded
APPROXIMATIONS = frozenset({frozenset({"gelu-erf", "gelu-tanh"})})
_GELU, _INPLACE = frozenset(("approximate",)), frozenset(("inplace",))
# class -> its function with default arguments, and its keywords (None: not known unimported)
_CLASSES: Mapping[str, tuple[str, frozenset[str] | None]] = {
    "torch.nn.GELU": ("gelu-erf", _GELU),
    "torch.nn.SiLU": ("silu", _INPLACE),
    "torch.nn.ReLU": ("relu", _INPLACE),
    "torch.nn.Sigmoid": ("sigmoid", frozenset()),
    "kernel_lock.adapters.CompiledGELU": ("gelu-erf", _GELU),
    # transformer-engine's fusible ops: its GELU is the tanh form (TE's docstring and math.h)
    "transformer_engine.pytorch.ops.GELU": ("gelu-tanh", None),
    "transformer_engine.pytorch.ops.ReLU": ("relu", None),
}
_ALIASES = torch_aliases("activation", "GELU", "SiLU", "ReLU", "Sigmoid")


def function_of(target: str, kwargs: Mapping[str, Any] | None = None) -> str | None:
    """The function a class computes with ``kwargs``, told without importing it, or None."""
    function = _CLASSES.get(_ALIASES.get(target, target), (None, None))[0]
    if function == "gelu-erf" and (kwargs or {}).get("approximate", "none") == "tanh":
        return "gelu-tanh"
    return function


# torch.nn's other elementwise activations (torch.nn.modules.activation; a test compares)
TORCH_OTHERS = frozenset(
    ("Threshold", "RReLU", "Hardtanh", "ReLU6", "Hardsigmoid", "Tanh", "Mish", "Hardswish", "ELU",
     "CELU", "SELU", "Hardshrink", "LeakyReLU", "LogSigmoid", "Softplus", "Softshrink", "PReLU",
     "Softsign", "Tanhshrink")
)  # fmt: skip


def _torch_other(path: str) -> str | None:
    """``other:torch.nn.Tanh`` for another of torch.nn's activations, by any of its names."""
    parts = path.split(".")
    if parts[:2] != ["torch", "nn"] or parts[2:-1] not in ([], ["modules", "activation"]):
        return None
    return f"{OTHER_FUNCTION}torch.nn.{parts[-1]}" if parts[-1] in TORCH_OTHERS else None


def _function(path: str, kwargs: Mapping[str, Any]) -> str | None:
    return function_of(path, kwargs) or _torch_other(path)


def _computes(target: str, kwargs: Mapping[str, Any], cls: type | None) -> dict[str, str] | None:
    """The function a class computes: by its name, else (imported) by the known class it inherits
    its forward from."""
    function = _function(target, kwargs)
    for c in cls.__mro__ if cls is not None and function is None else ():
        if (function := _function(f"{c.__module__}.{c.__qualname__}", kwargs)) is not None:
            inherited = getattr(cls, "forward", None) is getattr(c, "forward", None)
            function = function if inherited else None
            break
    return {"function": function} if function is not None else None


def approximation_change(declared: str, computes: str) -> str:
    """How a lock's ``accepted-changes`` begins that records ``computes`` approximating
    ``declared`` (``--allow-approximation``)."""
    return f"approximation: computes {computes}, not the model's {declared}"


def _declares(slot: Any) -> dict[str, tuple[str, ...]]:
    """The model's function, and an approximation of it the lock records as accepted."""
    declared = str(slot.extra.get("function", ""))
    declared = _torch_other(declared.removeprefix(OTHER_FUNCTION)) or declared
    recorded = tuple(
        other
        for other in ACTIVATION_FUNCTIONS
        if is_approximation(declared, other)
        and any(c.startswith(approximation_change(declared, other)) for c in slot.changes)
    )
    return {"function": (declared, *recorded)}


def function_problem(text: str) -> str | None:
    """Why ``text`` is no activation function the slot knows (None when it is one)."""
    if text in ACTIVATION_FUNCTIONS:
        return None
    if text.startswith(OTHER_FUNCTION):
        parts = text[len(OTHER_FUNCTION) :].split(".")
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
    """The model's declared function: the canonical ``function`` as the request overrides it."""
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


_IN_PLACE = "in place (it overwrites its input, which a swapped class would not)"


def _module(module: Any) -> dict[str, str] | str:
    """A built activation's function, or why it is not one the slot swaps."""
    if getattr(module, "inplace", False):
        return _IN_PLACE
    cls = type(module)
    approximate = {"approximate": getattr(module, "approximate", "none")}
    found = _computes(f"{cls.__module__}.{cls.__qualname__}", approximate, cls)
    if not found:
        return f"{cls.__qualname__} has a forward of its own: what it computes cannot be told"
    return dict(found)


def _functional(function: str) -> Functional:
    """``torch.nn.functional.<name>`` (``gelu``: its ``approximate`` says which form)."""

    names = ("input", "approximate" if function == "gelu-erf" else "inplace")

    def semantics(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, str] | str:
        b = bound(args, kwargs, names, approximate="none", inplace=False)
        if b["inplace"]:
            return _IN_PLACE
        tanh = function == "gelu-erf" and b["approximate"] == "tanh"
        return {"function": "gelu-tanh" if tanh else function}

    return Functional(semantics, lambda s: ((), {}), _run, args=names)


def _run(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    return module(bound(args, kwargs, ("input",))["input"])


_CALLS = Calls(
    module=_module,
    functions={
        "gelu": _functional("gelu-erf"),
        **{name: _functional(name) for name in ("silu", "relu", "sigmoid")},
    },
)

ACTIVATION = SlotSpec(
    name="Activation",
    semantics="activation",
    default_target="torch.nn.GELU",  # anemoi's default layer_kernels.Activation (exact erf)
    canonical={"function": "gelu-erf"},
    anemoi_key="Activation",
    known_targets={
        target: TargetFacts("activation", params, True)
        for target, (_, params) in _CLASSES.items()
        if params is not None
    },
    computed_by=("torch.nn.modules.activation.*",),
    # torch.nn's non-elementwise classes: attention, GLU (anemoi refuses it), the softmaxes
    not_computed_by=("MultiheadAttention", "GLU", "Softmax", "Softmin", "LogSoftmax", "Softmax2d"),
    aliases=_ALIASES,
    # the model's function the candidates were checked against
    keys=(SlotKey("function", _read_function, _refuse_function, after="semantics"),),
    params={"approximate": Param(str, choices=("none", "tanh")), "inplace": Param(bool)},
    computes=_computes,
    declares=_declares,
    calls=_CALLS,
)
