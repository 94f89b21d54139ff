"""Thin module classes a lock can name as targets (by this path: locks, configs, pickles);
each keeps the parameters and state-dict keys of the class it adapts. Imports torch."""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .registry import (
    AUTOCAST_ADAPTERS,
    GENERIC_SEPARATOR,
    SIZE_ADAPTERS,
    generic_parts,
    size_parameter,
)

# classes built on first lookup are public, unlisted: ``import *`` never imports their libraries
__all__ = [
    "TORCH_INIT_ADAPTERS",
    "CompiledGELU",
    "CompiledLayerNorm",
    "CompiledLinear",
    "CompiledRMSNorm",
    "autocast_adapter",
    "normalized_shape_adapter",
    "torch_init",
    "torch_init_adapter",
]

_OPS: dict[str, Callable[..., Any]] = {
    "layer_norm": lambda x, shape, weight, bias, eps: F.layer_norm(x, shape, weight, bias, eps),
    "rms_norm": lambda x, shape, weight, eps: F.rms_norm(x, shape, weight, eps),
    "linear": lambda x, weight, bias: F.linear(x, weight, bias),
    "gelu": lambda x, approximate: F.gelu(x, approximate=approximate),
}
_compiled: dict[str, Callable[..., Any]] = {}


def _subclass(base: type, name: str, doc: str, module: str = __name__, **members: Any) -> type:
    """``base``'s subclass ``name``, in this module: pickle finds it again (``__getattr__``)."""
    for member in members.values():
        member.__qualname__ = f"{name}.{member.__name__}"
    namespace = {"__module__": module, "__qualname__": name, "__doc__": doc, **members}
    return type(base)(name, (base,), namespace)


def _compiled_class(base: type, op: str, *attributes: str) -> type:
    """``base`` whose forward runs ``F.<op>`` compiled once per op and process."""

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        if op not in _compiled:
            _compiled[op] = torch.compile(_OPS[op])
        return _compiled[op](x, *(getattr(self, a) for a in attributes))

    doc = f"``torch.nn.{base.__name__}`` whose forward runs through ``torch.compile``."
    return _subclass(base, f"Compiled{base.__name__}", doc, forward=forward)


CompiledLayerNorm = _compiled_class(
    nn.LayerNorm, "layer_norm", "normalized_shape", "weight", "bias", "eps"
)
CompiledRMSNorm = _compiled_class(nn.RMSNorm, "rms_norm", "normalized_shape", "weight", "eps")
CompiledLinear = _compiled_class(nn.Linear, "linear", "weight", "bias")
CompiledGELU = _compiled_class(nn.GELU, "gelu", "approximate")


def normalized_shape_adapter(base: type[Any], size_param: str, name: str) -> type:
    """A subclass of ``base`` whose size argument is ``normalized_shape``."""
    missing = object()

    def __init__(self, normalized_shape=missing, *args, **kwargs):
        if size_param in kwargs:
            if normalized_shape is not missing:
                raise TypeError(f"{name}() got both normalized_shape and {size_param}")
            normalized_shape = kwargs.pop(size_param)
        if normalized_shape is missing:
            raise TypeError(f"{name}() missing required argument: 'normalized_shape'")
        if not isinstance(normalized_shape, int):
            shape = tuple(normalized_shape)
            if len(shape) != 1:
                raise ValueError(
                    f"{name} normalizes over the last dimension only; got "
                    f"normalized_shape={shape!r}"
                )
            normalized_shape = int(shape[0])
        base.__init__(self, normalized_shape, *args, **kwargs)

    # what inspect.signature (and so the lock's kwargs check) sees: the base's, size renamed
    params = [
        p.replace(name="normalized_shape", default=inspect.Parameter.empty)
        if p.name == size_param
        else p
        for p in inspect.signature(base.__init__).parameters.values()
    ]
    __init__.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # read by inspect.signature
    doc = (
        f"``{base.__module__}.{base.__qualname__}`` built as ``{name}(normalized_shape, ...)``, "
        "the way anemoi-models calls its norms. Same parameters and state-dict keys as the class "
        "it adapts."
    )
    return _subclass(base, name, doc, __init__=__init__)


def autocast_adapter(base: type, name: str) -> type:
    """A subclass of ``base`` whose forward casts the output back to the input's dtype."""

    def forward(self, x, *args, **kwargs):
        """The base class's forward, its output cast to ``x``'s dtype."""
        return base.forward(self, x, *args, **kwargs).type_as(x)

    doc = (
        f"``{base.__module__}.{base.__qualname__}`` with its output cast back to the input "
        "dtype, as anemoi's AutocastLayerNorm does for torch.nn.LayerNorm. Same parameters and "
        "state-dict keys."
    )
    return _subclass(base, name, doc, forward=forward)


# A library class whose initialisation differs from torch.nn's (TE's Linear: N(0, 0.023)) changes
# every model trained from scratch; these re-initialise it the torch.nn way.
# adapter name -> (the library class, the semantics whose init it restores)
TORCH_INIT_ADAPTERS: dict[str, tuple[str, str]] = {
    "TELinear": ("transformer_engine.pytorch.Linear", "linear")
}


def torch_init(module: nn.Module, semantics: str) -> None:
    """Initialise ``module``'s ``weight``/``bias`` as torch.nn's module of that semantics."""
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    with torch.no_grad():
        if semantics != "linear":
            if weight is not None:
                nn.init.ones_(weight)
            if bias is not None:
                nn.init.zeros_(bias)
        elif weight is not None:
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))  # torch.nn.Linear.reset_parameters
            if bias is not None:
                fan_in = weight.shape[1]
                bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                nn.init.uniform_(bias, -bound, bound)


def torch_init_adapter(base: type[Any], semantics: str, name: str, module: str = __name__) -> type:
    """A subclass of ``base`` whose fresh parameters start where torch.nn's do (``torch_init``)."""

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        torch_init(self, semantics)

    __init__.__signature__ = inspect.signature(base.__init__)  # type: ignore[attr-defined]  # read by inspect.signature
    doc = (
        f"``{base.__module__}.{base.__qualname__}``, its parameters initialised as torch.nn's "
        f"{semantics} initialises them. Same parameters, state dict and forward."
    )
    return _subclass(base, name, doc, module, __init__=__init__)


def _class(target: str) -> type:
    module_name, _, attr = target.rpartition(".")
    if module_name == __name__:
        return globals()[attr] if attr in globals() else __getattr__(attr)
    return getattr(importlib.import_module(module_name), attr)  # ImportError: library missing


def _generic(prefix: str, kernel: str) -> type:
    """The generic ``prefix`` adapter around the class at ``kernel``."""
    base = _class(kernel)
    if not isinstance(base, type) or not issubclass(base, nn.Module):
        raise TypeError(f"{kernel} is not a torch.nn.Module class: no adapter is built around it")
    size = size_parameter(base)
    tail = kernel.replace(".", GENERIC_SEPARATOR)
    if size is not None:
        sized = f"Sized{GENERIC_SEPARATOR}{tail}"
        base = globals().get(sized) or normalized_shape_adapter(base, size, sized)
        globals()[sized] = base
    if prefix == "Autocast":
        return autocast_adapter(base, f"{prefix}{GENERIC_SEPARATOR}{tail}")
    if size is None:
        raise TypeError(f"{kernel} already takes normalized_shape: it needs no size adapter")
    return base


def __getattr__(name: str) -> type:
    """Build the adapter ``name`` on first lookup (a registry row or a generic name)."""
    generic = generic_parts(name)
    if generic is not None:
        cls = _generic(*generic)
    elif name in SIZE_ADAPTERS:
        target, size_param = SIZE_ADAPTERS[name]
        cls = normalized_shape_adapter(_class(target), size_param, name)
    elif name in AUTOCAST_ADAPTERS:
        cls = autocast_adapter(_class(AUTOCAST_ADAPTERS[name]), name)
    elif name in TORCH_INIT_ADAPTERS:
        target, semantics = TORCH_INIT_ADAPTERS[name]
        cls = torch_init_adapter(_class(target), semantics, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = cls  # built once per process
    return cls


def __dir__() -> list[str]:
    """The classes defined here and every adapter a table names (generic ones are not listed)."""
    return sorted({*globals(), *SIZE_ADAPTERS, *AUTOCAST_ADAPTERS, *TORCH_INIT_ADAPTERS})
