"""The layer slots a lock pins, what each computes, and the closed sets every module names.

One home for the facts about slots: their names, the semantics each must compute, the torch.nn class
a slot the lock does not pin resolves to, its canonical configuration and call convention, what the
portable twins compute, and how to tell what a module class computes. Also the enums the lock, the
resolver, the profiles and the command line share (``MODES``, ``PRECISIONS``, ``Status``,
``DTYPES``, ``torch_device``) and the one "did you mean" hint for a misspelt slot. Plain data:
importing this costs nothing (no torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, get_args

__all__ = [
    "ACTIVATION",
    "ATTENTION",
    "CALL_ARGS",
    "CALL_KWARGS",
    "CANONICAL",
    "CONFUSABLE",
    "DEFAULT_TARGETS",
    "DTYPES",
    "GATED_MLP",
    "KNOWN_TARGETS",
    "MODES",
    "NOT_ELEMENTWISE",
    "NOT_PLAIN_TORCH",
    "PRECISIONS",
    "PROBED_BY_DEFAULT",
    "REGIMES",
    "SEMANTICS",
    "SLOTS",
    "SLOT_SEMANTICS",
    "STATUSES",
    "TARGET_ALIASES",
    "TORCH_FACTS_SINCE",
    "TWIN_SEMANTICS",
    "DType",
    "Mode",
    "Precision",
    "Regime",
    "Status",
    "TargetFacts",
    "canonical_target",
    "class_semantics",
    "dtype_named",
    "short_dtype",
    "slot_name_fix",
    "torch_device",
]

SLOTS = ("LayerNorm", "RMSNorm", "Linear", "Attention", "GatedMLP", "Activation")
SEMANTICS = ("layer_norm", "rms_norm", "linear", "attention", "gated_mlp", "activation")
SLOT_SEMANTICS = {
    "LayerNorm": "layer_norm",
    "RMSNorm": "rms_norm",
    "Linear": "linear",
    "Attention": "attention",
    "GatedMLP": "gated_mlp",
    "Activation": "activation",
}
# Slots whose module has parameters and takes one tensor (the norms and Linear); Attention's modules
# have no parameters and take (q, k, v) with SDPA's contract (kernel_lock.attention): its checks,
# timing and export have their own homes
ATTENTION = "Attention"
# anemoi's GatedMLPLayer (two Linears and a hard-coded gate, kernel_lock.format.gating): its classes
# are kernel_lock.gated_mlp's, its checks and timing have their own home
# (kernel_probe.probe.gated_mlp). A probe checks it only when asked (the model's mlp_implementation
# is gated): anemoi's default is "mlp"
GATED_MLP = "GatedMLP"
# the slots a probe or a check covers when none is named: every slot but GatedMLP, which a model has
# only with a gated mlp_implementation (``--slot GatedMLP --mlp-implementation geglu``)
PROBED_BY_DEFAULT = tuple(s for s in SLOTS if s != GATED_MLP)
# Activation's modules have no parameters and map one tensor elementwise; which function they
# compute (``ACTIVATION_FUNCTIONS``) is the model's declared choice, a canonical value of the slot
# (``function``)
ACTIVATION = "Activation"

# What a slot the lock does not mention resolves to: plain torch.nn, as before the lock existed.
DEFAULT_TARGETS = {
    "LayerNorm": "torch.nn.LayerNorm",
    "RMSNorm": "torch.nn.RMSNorm",
    "Linear": "torch.nn.Linear",
    # torch's scaled_dot_product_attention, torch choosing its backend (what anemoi's SDPA path
    # runs)
    "Attention": "kernel_lock.attention.SDPAttention",
    # anemoi's GatedMLPLayer with torch.nn.Linear: torch's gate functions
    "GatedMLP": "kernel_lock.gated_mlp.GatedMLP",
    "Activation": "torch.nn.GELU",  # anemoi's default layer_kernels.Activation (exact erf)
}

# Canonical configuration per slot: what the lock pins unless a profile or the user says otherwise.
# RMSNorm's eps is pinned because torch.nn.RMSNorm's default (eps=None) means finfo(dtype).eps,
# which differs between fp32 and bf16, and liger defaults to 1e-6.
CANONICAL: dict[str, dict[str, Any]] = {
    "LayerNorm": {"eps": 1e-5, "bias": True},
    "RMSNorm": {"eps": 1e-6},
    "Linear": {"bias": True},
    # the options a model fixes (kernel_lock.attention): window -1 = global, softcap 0 = none
    "Attention": {"window": -1, "softcap": 0.0, "dropout": 0.0, "alibi": False},
    # the model's gated variant (kernel_lock.format.gating.GATES): swiglu unless the model says
    # otherwise
    "GatedMLP": {"mlp_implementation": "swiglu", "bias": True},
    # the function the model declares (ACTIVATION_FUNCTIONS): the reference every candidate is
    # checked against; no constructor takes it (CALL_KWARGS), the lock records it
    # (slots.Activation.function)
    "Activation": {"function": "gelu-erf"},
}

# How a class offered for a slot is called when its declaration does not say: the positional
# arguments (dimensions) and the pinned keyword arguments, as candidate templates ("$name" is filled
# with the canonical value ``name``; see kernel_probe.candidates).
CALL_ARGS: dict[str, tuple[str, ...]] = {
    "LayerNorm": ("$normalized_shape",),
    "RMSNorm": ("$normalized_shape",),
    "Linear": ("$in_features", "$out_features"),
    "Attention": (),
    "GatedMLP": ("$in_features", "$out_features"),
    "Activation": (),
}
CALL_KWARGS: dict[str, dict[str, Any]] = {
    "LayerNorm": {"eps": "$eps"},
    "RMSNorm": {"eps": "$eps"},
    "Linear": {"bias": "$bias"},
    "Attention": {
        "window": "$window",
        "softcap": "$softcap",
        "dropout": "$dropout",
        "alibi": "$alibi",
    },
    "GatedMLP": {"mlp_implementation": "$mlp_implementation", "bias": "$bias"},
    "Activation": {},
}

# What torch.nn's slot classes compute and every keyword their constructors accept, so a check that
# imports nothing (the job-start check) can decide a lock's target and kwargs as ``import`` would.
# They hold for every torch kernel-probe supports (pyproject: torch >= TORCH_FACTS_SINCE: RMSNorm
# came in 2.4, LayerNorm's ``bias`` in 2.1); tests compare them with the installed torch's
# signatures. A target not listed here (or in the registry's declarations) is decided only by
# importing it.
TORCH_FACTS_SINCE = (2, 4)


class TargetFacts(NamedTuple):
    """What a class computes and which constructor keywords it accepts, known without importing
    it."""

    semantics: str
    params: frozenset[str]  # keyword arguments the constructor accepts
    complete: (
        bool  # params lists every one (else: the ones known to be accepted, e.g. from the registry)
    )


_LAYER_NORM = frozenset(
    ("normalized_shape", "eps", "elementwise_affine", "bias", "device", "dtype")
)
_RMS_NORM = frozenset(("normalized_shape", "eps", "elementwise_affine", "device", "dtype"))
_LINEAR = frozenset(("in_features", "out_features", "bias", "device", "dtype"))
_ATTENTION = frozenset(("window", "softcap", "dropout", "alibi"))
_GATED_MLP = frozenset(
    ("in_features", "out_features", "mlp_implementation", "bias", "device", "dtype")
)
_GELU = frozenset(("approximate",))
_INPLACE = frozenset(("inplace",))
KNOWN_TARGETS: Mapping[str, TargetFacts] = MappingProxyType(
    {
        "torch.nn.LayerNorm": TargetFacts("layer_norm", _LAYER_NORM, True),
        "torch.nn.RMSNorm": TargetFacts("rms_norm", _RMS_NORM, True),
        "torch.nn.Linear": TargetFacts("linear", _LINEAR, True),
        # kernel_lock.adapters: subclasses of the above with the same constructor (torch.compile'd
        # forward)
        "kernel_lock.adapters.CompiledLayerNorm": TargetFacts("layer_norm", _LAYER_NORM, True),
        "kernel_lock.adapters.CompiledRMSNorm": TargetFacts("rms_norm", _RMS_NORM, True),
        "kernel_lock.adapters.CompiledLinear": TargetFacts("linear", _LINEAR, True),
        # kernel_lock.attention: the Attention slot's classes (SDPA's contract plus the model's
        # options)
        "kernel_lock.attention.SDPAttention": TargetFacts(
            "attention", _ATTENTION | {"backend"}, True
        ),
        "kernel_lock.attention.FlexAttention": TargetFacts(
            "attention", _ATTENTION | {"compiled"}, True
        ),
        "kernel_lock.attention.FlashAttention2": TargetFacts("attention", _ATTENTION, True),
        "kernel_lock.attention.FlashAttention3": TargetFacts("attention", _ATTENTION, True),
        "kernel_lock.attention.FlashAttention4": TargetFacts("attention", _ATTENTION, True),
        "kernel_lock.attention.TEDotProductAttention": TargetFacts("attention", _ATTENTION, True),
        # kernel_lock.gated_mlp: anemoi's GatedMLPLayer interface over torch's, a compiled or
        # liger's gate
        "kernel_lock.gated_mlp.GatedMLP": TargetFacts("gated_mlp", _GATED_MLP, True),
        "kernel_lock.gated_mlp.CompiledGatedMLP": TargetFacts("gated_mlp", _GATED_MLP, True),
        "kernel_lock.gated_mlp.LigerGatedMLP": TargetFacts("gated_mlp", _GATED_MLP, True),
        # the Activation slot's torch.nn classes (ACTIVATION_CLASSES says which function each
        # computes)
        "torch.nn.GELU": TargetFacts("activation", _GELU, True),
        "torch.nn.SiLU": TargetFacts("activation", _INPLACE, True),
        "torch.nn.ReLU": TargetFacts("activation", _INPLACE, True),
        "torch.nn.Sigmoid": TargetFacts("activation", frozenset(), True),
        "kernel_lock.adapters.CompiledGELU": TargetFacts("activation", _GELU, True),
    }
)
# Other public names of the same classes (torch re-exports them from its submodules)
TARGET_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        f"torch.nn.{where}.{name}": f"torch.nn.{name}"
        for name, module in (
            ("LayerNorm", "normalization"),
            ("RMSNorm", "normalization"),
            ("Linear", "linear"),
            *((name, "activation") for name in ("GELU", "SiLU", "ReLU", "Sigmoid")),
        )
        for where in ("modules", f"modules.{module}")
    }
)


def canonical_target(target: str) -> str:
    """``torch.nn.modules.normalization.LayerNorm`` -> ``torch.nn.LayerNorm``; other names
    unchanged."""
    return TARGET_ALIASES.get(target, target)


# What the portable twins compute (derived from the tables above). A twin records no semantics of
# its own, so a twin target listed here whose semantics differ from its slot's (an RMSNorm standing
# in for a LayerNorm, also through an alias) is refused; a target not listed cannot be judged
# without importing.
TWIN_SEMANTICS = {
    name: KNOWN_TARGETS[canonical_target(name)].semantics
    for name in (*KNOWN_TARGETS, *TARGET_ALIASES)
}

# The semantics a kernel may compute by mistake instead of its own (same shapes, same parameters):
# a "LayerNorm" whose output matches an RMSNorm reference computes the other one.
CONFUSABLE = {"layer_norm": "rms_norm", "rms_norm": "layer_norm"}

Mode = Literal["training", "inference"]  # what a lock is resolved for
MODES: tuple[Mode, ...] = get_args(Mode)
Regime = Literal[
    "true", "mixed"
]  # parameters and compute in the dtype, or float32 parameters under autocast
REGIMES: tuple[Regime, ...] = get_args(Regime)


class Precision(NamedTuple):
    """A training precision: the dtype and the regime the probe checks and times in."""

    dtype: str  # torch dtype name, without "torch."
    # "true": parameters and compute in dtype; "mixed": float32 parameters under autocast
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
    """A floating-point dtype the probe checks: torch's name (without "torch."), the short name the
    command line and the tables use, and its machine epsilon (the tolerance model's floor)."""

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
    """The torch name of a dtype given by its torch or short name, any case (``BF16`` ->
    ``bfloat16``); None when it is neither."""
    key = text.strip().lower()
    return next((d.name for d in DTYPES.values() if key in (d.name, d.short)), None)


def torch_device(device: str) -> str:
    """The torch device type of a device type: ROCm GPUs are ``cuda`` to torch (HIP behind its CUDA
    API)."""
    return "cuda" if device == "rocm" else device


# What a candidate's check came to, as the lock records it per candidate; worst first (a candidate
# checked in several dtypes gets the worst of its results, kernel_probe.probe.judge.worst_status).
Status = Literal["crashed", "timeout", "rejected", "unavailable", "accepted", "skipped"]
STATUSES: tuple[Status, ...] = get_args(Status)


def slot_name_fix(name: str) -> str:
    """The fix for an unknown slot ``name``: the slot it misspells, if only case differs, else the
    list."""
    close = [s for s in SLOTS if s.lower() == str(name).lower()]
    if close:
        return f"did you mean {close[0]!r}? slot names are case-sensitive"
    return f"known slots: {', '.join(SLOTS)}"


# torch's quantized, QAT and fused (module + activation) classes: some subclass nn.Linear, none
# computes a plain float Linear or norm (torch.ao.nn.intrinsic.quantized.dynamic.LinearReLU is an
# int8 Linear and a ReLU with no trainable parameters)
NOT_PLAIN_TORCH = (
    "torch.ao",
    "torch.nn.quantized",
    "torch.nn.qat",
    "torch.nn.intrinsic",
    "torch.nn.quantizable",
)


# torch.nn.modules.activation's classes that are no elementwise activation: attention, the gated GLU
# (it halves the last dimension: anemoi refuses it under Activation) and the normalising softmaxes
NOT_ELEMENTWISE = ("MultiheadAttention", "GLU", "Softmax", "Softmin", "LogSoftmax", "Softmax2d")


def class_semantics(cls: Any) -> str | None:
    """What a module class computes, told by its class hierarchy; None where the hierarchy cannot
    tell.

    A subclass of ``torch.nn.RMSNorm``, ``LayerNorm`` or ``Linear`` computes that, unless it (or a
    class it derives from) is one of torch's quantized, QAT or fused classes (``NOT_PLAIN_TORCH``):
    those, and every other torch module, compute something else (``other: Identity``). Another
    library's class that derives from none of them is not judged by its name: None, and the caller
    takes the registry's declaration (``kernel_lock.registry.declared_semantics``) or the
    lock's word.
    """
    if not isinstance(cls, type):
        return None
    import torch

    def _under(module: str, roots: tuple[str, ...]) -> bool:
        return any(module == r or module.startswith(r + ".") for r in roots)

    if any(
        c.__module__ == "kernel_lock.attention" and c.__name__ == "Attention" for c in cls.__mro__
    ):
        return "attention"
    if any(
        c.__module__ == "kernel_lock.gated_mlp" and c.__name__ == "GatedMLP" for c in cls.__mro__
    ):
        return "gated_mlp"
    if _under(cls.__module__, ("kernel_lock.adapters",)):
        # an adapter computes what the class it wraps (and derives from) computes: an Autocast
        # adapter around torch.nn.Identity is an Identity, whatever slot names it
        wrapped = next(
            (c for c in cls.__mro__[1:] if not _under(c.__module__, ("kernel_lock.adapters",))),
            None,
        )
        return None if wrapped is None or wrapped is torch.nn.Module else class_semantics(wrapped)

    if any(_under(c.__module__, NOT_PLAIN_TORCH) for c in cls.__mro__):
        return f"other: {cls.__name__} (quantized or fused)"
    for base, semantics in (
        (torch.nn.RMSNorm, "rms_norm"),
        (torch.nn.LayerNorm, "layer_norm"),
        (torch.nn.Linear, "linear"),
    ):
        if issubclass(cls, base):
            return semantics
    if _under(cls.__module__, ("torch",)):
        if cls.__module__ == "torch.nn.modules.activation" and cls.__name__ not in NOT_ELEMENTWISE:
            return "activation"
        return f"other: {cls.__name__}"
    return None
