"""What a slot is (:class:`SlotSpec`, plain data), and the closed sets. No torch."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, cast, get_args

from ..errors import Difference

__all__ = [
    "DTYPES",
    "MODES",
    "Calls",
    "Functional",
    "NONE_VALUE",
    "PRECISIONS",
    "Param",
    "STATUSES",
    "SlotSpec",
    "Status",
    "TargetFacts",
    "bound",
    "dtype_named",
    "short_dtype",
    "torch_device",
]


class TargetFacts(NamedTuple):
    """What a class computes and which keywords it accepts, known without importing it."""

    semantics: str
    params: frozenset[str]
    complete: bool


@dataclass(frozen=True)
class SlotKey:
    """A key only one slot's table holds (``function``, ``blas``): read, refused in another
    slot's table, written after ``after`` unless ``omit(value)``."""

    name: str
    read: Callable[[Any, Mapping[str, Any], str], Any]
    refuse: Callable[[str, Mapping[str, Any]], None]
    after: str
    write: Callable[[Any], Any] = lambda value: value
    omit: Callable[[Any], bool] = lambda value: not value
    # a value computed from the slot's kwargs (GatedMLP's gate): recomputed, never copied
    derive: Callable[[Mapping[str, Any]], Any] | None = None


@dataclass(frozen=True)
class Param:
    """A keyword a slot's classes take: its type, for a number its closed range, for a string its
    ``choices``. A float parameter takes an integer too (a hand edit may write ``0``); one that
    takes ``none`` takes None (RMSNorm's ``eps=None``), written :data:`NONE_VALUE` in a lock."""

    type: type  # bool, int, float or str
    low: float = -math.inf
    high: float = math.inf
    choices: tuple[str, ...] = ()
    wanted: str = ""  # what it must be, in words ("in [0, 1)")
    none: bool = False  # None is a value (the class's own rule: torch.nn.RMSNorm's eps)

    @property
    def what(self) -> str:
        """What a value must be, in words."""
        if self.choices:
            return "one of " + ", ".join(f'"{c}"' for c in self.choices)
        return self.wanted or _TYPE_WORDS[self.type]

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is no value of this parameter (None when it is one)."""
        if value is None and self.none:
            return None
        types = (int, float) if self.type is float else (self.type,)
        if isinstance(value, bool) != (self.type is bool) or not isinstance(value, types):
            got = _TYPE_WORDS_GOT.get(type(value), type(value).__name__)
            return f"{value!r} is {got}, not {_TYPE_WORDS[self.type]}"
        if self.choices and value not in self.choices:
            return f"{value!r} is not one of the values it may be"
        if self.type in (int, float) and not self.low <= cast(float, value) <= self.high:
            return f"{value!r} is out of range"
        return None


# a None in a lock (TOML has no null): a keyword's (RMSNorm's ``eps = "none"`` is torch.nn.RMSNorm's
# eps=None) and a traced call's semantics value (the lock's [model] table)
NONE_VALUE = "none"

_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_TYPE_WORDS_GOT = {**_TYPE_WORDS, bool: "a boolean", float: "a float"}


# what a class computes beyond its semantics, told from its name, kwargs and (once imported) class:
# {"function": "silu"}; None where only running it can tell
Computes = Callable[[str, Mapping[str, Any], type | None], Mapping[str, Any] | None]
# a portable copy's twin: its positional args and kwargs from a built module (module, state, kw)
TwinArgs = Callable[[Any, Mapping[str, Any], set[str]], tuple[tuple[Any, ...], dict[str, Any]]]


def bound(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], names: tuple[str, ...], **defaults: Any
) -> dict[str, Any]:
    """A torch function's arguments by name (positional ones first), its defaults filled in."""
    return {**defaults, **dict(zip(names, args, strict=False)), **kwargs}


def run_with_params(names: tuple[str, ...]) -> Callable[[Any, tuple[Any, ...], Any], Any]:
    """A routed call (parameters ``names``) run on the built module with the call's own weight and
    bias (those it passes) in place of the module's."""

    def run(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        from torch.func import functional_call  # reason: torch only where a call is routed

        b = bound(args, kwargs, names, weight=None, bias=None)
        params = {k: b[k] for k in ("weight", "bias") if b[k] is not None}
        return functional_call(module, params, (b["input"],))

    return run


# the semantics of a call site as the trace writes them (kernel_lock.model.Site.semantics), or why
# the site is not the slot's plain form (an in-place activation): the reason, in words
Semantics = Mapping[str, Any] | str


@dataclass(frozen=True)
class Functional:
    """A torch function of the slot as ``kernel_lock.apply`` routes it: its call's semantics, the
    slot's class built for them, and the call run on that module (the call's own tensors)."""

    semantics: Callable[[tuple[Any, ...], Mapping[str, Any]], Semantics]
    build: Callable[[Mapping[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]]
    call: Callable[[Any, tuple[Any, ...], Mapping[str, Any]], Any]
    # the parameters of the built module the call passes its own tensors for (weight, bias)
    params: Callable[[Mapping[str, Any]], frozenset[str]] = lambda semantics: frozenset()
    # its parameters in order, and those whose tensors' shapes the trace records
    args: tuple[str, ...] = ("input",)
    inputs: tuple[str, ...] = ("input",)


@dataclass(frozen=True)
class Calls:
    """How the slot's call sites are read in a built model (``kernel_lock.apply``): a module's
    semantics, its torch functions by name, the semantics keys that are sizes (any value is
    covered), and what a lock without ``[model]`` checked where its kwargs do not say."""

    module: Callable[[Any], Semantics]
    functions: Mapping[str, Functional] = field(default_factory=dict)
    sizes: frozenset[str] = frozenset()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    module_args: TwinArgs | None = None  # how to build the slot's class from a module (twin_args)
    # what one call of a module of the slot adds to its own semantics (its inputs' sizes, options)
    module_call: Callable[[Any, tuple[Any, ...], Mapping[str, Any]], Semantics] | None = None
    # classes found in a model that no slot swaps, each with why (their inner calls are theirs)
    out_of_reach: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SlotSpec:
    """One slot: what it computes, what a lock may pin, how its classes are called, its keys
    (each field: docs/architecture.md, "SlotSpec")."""

    name: str
    semantics: str
    default_target: str  # what a slot the lock does not pin resolves to
    canonical: Mapping[str, Any]  # the configuration the lock pins unless the model says otherwise
    call_args: tuple[str, ...] = ()
    call_kwargs: Mapping[str, Any] = field(default_factory=dict)
    known_targets: Mapping[str, TargetFacts] = field(default_factory=dict)
    computed_by: tuple[str, ...] = ()
    not_computed_by: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)  # other public names of its classes
    confusable: str = ""  # the semantics a kernel may compute by mistake (same shapes and params)
    by_default: bool = True  # probed when no slot is named
    keys: tuple[SlotKey, ...] = ()
    job_start: Callable[[Any, Mapping[str, Any]], list[Difference]] | None = None
    on_resolve: Callable[[Any, str | None], None] | None = None
    anemoi_environment: Callable[[Any], Mapping[str, str]] | None = None
    twin_args: TwinArgs | None = None
    computes: Computes | None = None
    declares: Callable[[Any], Mapping[str, tuple[Any, ...]]] | None = None
    anemoi_key: str = ""  # its key in anemoi's layer_kernels block ("": anemoi has none)
    sample_width: Callable[[Any], int] | None = None  # the twin's input width to compare on
    params: Mapping[str, Param] = field(default_factory=dict)
    calls: Calls | None = None  # its call sites in a built model (None: not applied to one)
    optional: tuple[str, ...] = ()  # pinned only where the model sets them (Attention's causal)


def torch_aliases(module: str, *names: str) -> dict[str, str]:
    """``torch.nn.modules[.module].Name`` -> ``torch.nn.Name`` for each of ``names``."""
    return {
        f"torch.nn.{where}.{name}": f"torch.nn.{name}"
        for name in names
        for where in ("modules", f"modules.{module}")
    }


Mode = Literal["training", "inference"]  # what a lock is resolved for
MODES: tuple[Mode, ...] = get_args(Mode)
# parameters and compute in the dtype, or float32 parameters under autocast
Regime = Literal["true", "mixed"]


class Precision(NamedTuple):
    """A training precision: the dtype and the regime the probe checks and times in."""

    dtype: str  # torch dtype name, without "torch."
    regime: Regime


# Lightning / anemoi precision names -> (dtype, regime); the names are the keys, in this order.
PRECISIONS: Mapping[str, Precision] = MappingProxyType(
    {
        "32-true": Precision("float32", "true"),
        "bf16-true": Precision("bfloat16", "true"),
        "16-true": Precision("float16", "true"),
        "bf16-mixed": Precision("bfloat16", "mixed"),
        "16-mixed": Precision("float16", "mixed"),
    }
)


class DType(NamedTuple):
    """A dtype the probe checks: torch's name, the short name, and its machine epsilon."""

    name: str
    short: str
    eps: float


# The dtypes a candidate is checked in, by torch name, in this order (float32 first: the baseline).
DTYPES: Mapping[str, DType] = MappingProxyType(
    {
        d.name: d
        for d in (
            DType("float32", "fp32", 2.0**-23),
            DType("bfloat16", "bf16", 2.0**-7),
            DType("float16", "fp16", 2.0**-10),
        )
    }
)


def short_dtype(name: str) -> str:
    """``bfloat16`` -> ``bf16``; a name that is no probed dtype unchanged."""
    return DTYPES[name].short if name in DTYPES else name


def dtype_named(text: str) -> str | None:
    """The torch name of a dtype given by either name, any case; None when neither."""
    key = text.strip().lower()
    return next((d.name for d in DTYPES.values() if key in (d.name, d.short)), None)


def torch_device(device: str) -> str:
    """The torch device type of a device type: ROCm GPUs are ``cuda`` to torch."""
    return "cuda" if device == "rocm" else device


# What a candidate's check came to, worst first (kernel_probe's judge takes the worst of its rows).
Status = Literal["crashed", "timeout", "rejected", "unavailable", "accepted", "skipped"]
STATUSES: tuple[Status, ...] = get_args(Status)

# torch's quantized, QAT and fused classes: none computes a plain float Linear or norm
NOT_PLAIN_TORCH = (
    "torch.ao",
    "torch.nn.quantized",
    "torch.nn.qat",
    "torch.nn.intrinsic",
    "torch.nn.quantizable",
)
