"""anemoi-models' ``layer_kernels``: the lock as a config block (:func:`layer_kernels`), kwargs
but no dimensions (anemoi passes them: ``CALLS``), an adapter where a constructor does not fit.
Imports neither torch nor yaml."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import LockFormatError
from .lock import KernelLock
from .registry import (
    ADAPTERS,
    GENERIC_SEPARATOR,
    WRAPPING_ADAPTERS,
    adapter_for,
    generic_kernel,
    generic_parts,
    size_parameter,
    wrapping_adapter_for,
)
from .resolve import factory
from .slots import SPECS
from .slots.attention import ANEMOI_ATTENTION, ATTENTION_BACKEND_ENV
from .slots.gated_mlp import CONFIG_KEY

__all__ = [
    "ANEMOI_ATTENTION",
    "ANEMOI_DEFAULTS",
    "AUTOCAST_LAYER_NORM",
    "CALLS",
    "CONDITIONAL_LAYER_NORM",
    "DIMENSIONS",
    "GLU_REFUSAL",
    "WRAPPERS",
    "ConventionError",
    "Exported",
    "attention_export",
    "convention_problems",
    "entry_for",
    "export",
    "gated_mlp_export",
    "generic_adapter",
    "glu_refused",
    "layer_kernels",
    "locate",
    "wrapper_of",
]

# anemoi-models 0.19's load_layer_kernels defaults; a key the block sets replaces one whole.
AUTOCAST_LAYER_NORM = "anemoi.models.layers.normalization.AutocastLayerNorm"
CONDITIONAL_LAYER_NORM = "anemoi.models.layers.normalization.ConditionalLayerNorm"
ANEMOI_DEFAULTS: dict[str, dict[str, Any]] = {
    "Linear": {"_target_": "torch.nn.Linear"},
    "LayerNorm": {"_target_": "torch.nn.LayerNorm"},
    "Activation": {"_target_": "torch.nn.GELU"},
    "QueryNorm": {"_target_": AUTOCAST_LAYER_NORM, "bias": False},
    "KeyNorm": {"_target_": AUTOCAST_LAYER_NORM, "bias": False},
}
# anemoi-models 0.19's refusal of a GLU-family class under layer_kernels.Activation (layers/mlp.py)
GLU_REFUSAL = (
    "GLU-based activations are not supported via layer_kernels.Activation. "
    "Use `mlp_implementation` with one of: 'glu', 'swiglu', 'geglu', 'reglu'."
)


def glu_refused(class_name: str) -> bool:
    """Whether anemoi refuses this class name under ``Activation`` ("GLU" in it)."""
    return "GLU" in class_name.upper()


def attention_options(target: str, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The Attention slot's anemoi keys and a note; ``({}, why)`` where anemoi cannot run it."""
    implementation = ANEMOI_ATTENTION.get(target)
    if implementation is None:
        return {}, (
            "anemoi-models runs only flash_attention or scaled_dot_product_attention; the lock's "
            f"{target} has no anemoi setting (anemoi keeps its own attention_implementation)"
        )
    if kwargs.get("causal"):  # anemoi-models 0.19's blocks build it with is_causal=False
        return {}, "the lock's attention is causal; anemoi-models' never is (not exported)"
    out: dict[str, Any] = {"attention_implementation": implementation}
    if int(kwargs.get("window", -1)) >= 0:
        out["window_size"] = int(kwargs["window"])
    if float(kwargs.get("softcap", 0.0)) > 0:
        out["softcap"] = float(kwargs["softcap"])
    if kwargs.get("alibi"):
        out["use_alibi_slopes"] = True
    if float(kwargs.get("dropout", 0.0)) > 0:
        out["dropout_p"] = float(kwargs["dropout"])
    backend = kwargs.get("backend", "default")
    if target == "kernel_lock.attention.SDPAttention" and backend != "default":
        return out, (
            f"the lock checked SDPA's {backend} backend; anemoi's SDPA path lets torch choose, so "
            "run under torch.nn.attention.sdpa_kernel to hold it there"
        )
    if implementation == "flash_attention":
        return out, (
            "anemoi imports flash-attn v4, then v3, then v2: the job-start check refuses a "
            f"machine where it would not pick the lock's v{target[-1]}"
        )
    return out, ""


# the sizes anemoi passes at the call site; pinned here they clash with a positional call
NORM_DIMENSIONS = ("normalized_shape", "hidden_size", "dim")
DIMENSIONS = {
    "LayerNorm": NORM_DIMENSIONS,
    "QueryNorm": NORM_DIMENSIONS,
    "KeyNorm": NORM_DIMENSIONS,
    "Linear": ("in_features", "out_features"),
    "Activation": (),
}
# anemoi's call sites, as (how anemoi writes it, positional args, keyword args); sizes are examples
CALLS: dict[str, tuple[tuple[str, tuple[Any, ...], dict[str, Any]], ...]] = {
    "LayerNorm": (
        ("LayerNorm(C)", (64,), {}),
        ("LayerNorm(normalized_shape=C)", (), {"normalized_shape": 64}),
    ),
    "QueryNorm": (("QueryNorm(head_dim)", (64,), {}),),
    "KeyNorm": (("KeyNorm(head_dim)", (64,), {}),),
    "Linear": (
        ("Linear(in, out)", (64, 128), {}),
        ("Linear(in, out, bias=...)", (64, 128), {"bias": True}),
    ),
    "Activation": (("Activation()", (), {}),),
}


@dataclass(frozen=True)
class Wrapper:
    """One of anemoi's norm classes: ``runs``, the kernel a same-kernel wrapper subclasses
    (None: a different layer, never replaced); ``adapter_prefix``, the adapters that keep it."""

    target: str
    runs: str | None
    behaviour: str
    adapter_prefix: str = ""


# anemoi-models 0.19, anemoi/models/layers/normalization.py. Adding a wrapper is adding a row.
WRAPPERS: dict[str, Wrapper] = {
    w.target: w
    for w in (
        Wrapper(
            AUTOCAST_LAYER_NORM,
            "torch.nn.LayerNorm",
            "casts its output back to the input dtype (bf16/fp16 under autocast, not fp32: "
            "gnn.yaml relies on it for memory, QueryNorm/KeyNorm for flash attention)",
            adapter_prefix="Autocast",
        ),
        Wrapper(
            CONDITIONAL_LAYER_NORM,
            None,
            "scale and shift computed from a condition (forward(x, cond)): a different layer, "
            "not a kernel choice",
        ),
    )
}


class ConventionError(LockFormatError):
    """A target anemoi cannot build the way it calls it, and no adapter fits."""


def generic_adapter(prefix: str, kernel: str) -> str:
    """The ``kernel_lock.adapters`` path of the generic ``prefix`` adapter around ``kernel``."""
    parts = kernel.split(".")
    if len(parts) < 2 or any(
        not p.isidentifier() or p.startswith("_") or GENERIC_SEPARATOR in p for p in parts
    ):
        raise ConventionError(
            f"{kernel!r} cannot be named in a generic adapter: it needs a public dotted path "
            f"whose parts contain no {GENERIC_SEPARATOR!r}",
            key=kernel,
            fix="rename the module or class, or add a row for it to "
            "kernel_lock.registry's adapter tables",
        )
    return f"{ADAPTERS}.{prefix}{GENERIC_SEPARATOR}{GENERIC_SEPARATOR.join(parts)}"


def wrapper_of(target: str) -> Wrapper | None:
    """The anemoi wrapper ``target`` is, or whose behaviour it keeps, or None."""
    if target in WRAPPERS:
        return WRAPPERS[target]
    module, _, name = target.rpartition(".")
    if module == ADAPTERS:
        generic = generic_parts(name)
        for prefix, table in WRAPPING_ADAPTERS.items():
            if name in table or (generic is not None and generic[0] == prefix):
                return next((w for w in WRAPPERS.values() if w.adapter_prefix == prefix), None)
    return None


def convention_problems(cls: Any, key: str, kwargs: Mapping[str, Any]) -> list[str]:
    """The anemoi call sites for ``key`` a partial of ``cls`` would fail."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return []
    problems = []
    for text, args, call_kwargs in CALLS[key]:
        try:
            sig.bind(*args, **{**kwargs, **call_kwargs})
        except TypeError as exc:
            problems.append(f"{text} fails: {exc}")
    return problems


def locate(path: str) -> Any:
    """Import ``path`` the way Hydra's ``_target_`` does: a module, then attributes."""
    parts = path.split(".")
    if not path or any(not p.isidentifier() for p in parts):
        raise ImportError(f"{path!r} is not a dotted import path")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            module = ".".join(parts[: i + 1])
            try:
                obj = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise  # the module exists but one of its own imports is missing
                raise ImportError(f"{'.'.join(parts[:i])!r} has no attribute {part!r}") from None
    return obj


# ---- export: the lock as a layer_kernels block ---------------------------------------------------
@dataclass(frozen=True)
class Exported:
    """One entry of an exported ``layer_kernels`` block, and how it was reached."""

    key: str
    entry: dict[str, Any]
    note: str = ""


def _fitting_target(
    cls: Callable[..., Any],
    target: str,
    key: str,
    kwargs: Mapping[str, Any],
    slot: str,
    where: str | None,
) -> tuple[str, str]:
    """(the target anemoi can build, a note): the real class if it fits, else its adapter."""
    problems = convention_problems(cls, key, kwargs)
    if not problems:
        return target, ""
    from . import adapters  # reason: imports torch

    adapter = adapter_for(target)
    if adapter is None and size_parameter(cls) is not None and "." in target:
        adapter = generic_adapter("Sized", target)
    if adapter is not None:
        adapted = getattr(adapters, adapter.rpartition(".")[2])
        if not convention_problems(adapted, key, kwargs):
            note = f"{target} takes its size as {size_parameter(cls)}; {adapter} subclasses it "
            return adapter, note + "(same state dict)"
    raise ConventionError(
        f"{target} (slot {slot}) cannot be built the way anemoi calls {key}: "
        + "; ".join(problems),
        path=where,
        key=f"slots.{slot}.target",
        fix="pin an implementation whose constructor takes anemoi's arguments (`kernel-probe "
        "--pin`), or add an adapter for this class to "
        "kernel_lock.registry.SIZE_ADAPTERS",
    )


def entry_for(key: str, want: Exported, current: Any, *, where: str = "") -> Exported | None:
    """What a block should hold for ``key`` given the lock's ``want`` and the block's
    ``current`` entry; None: leave it. A different layer is never replaced; a same-kernel wrapper
    stays where the lock pins its kernel, else becomes the adapter keeping its behaviour (none:
    :class:`ConventionError`). Applying the rule twice changes nothing."""
    target = current.get("_target_") if isinstance(current, Mapping) else None
    wrapper = wrapper_of(target) if isinstance(target, str) else None
    if wrapper is None:
        return want
    if wrapper.runs is None:
        return None
    kernel = want.entry["_target_"]
    kwargs = {k: v for k, v in want.entry.items() if k != "_target_"}
    name = wrapper.target.rpartition(".")[2]
    if kernel == wrapper.runs:
        note = f"keeps anemoi's {name}: it runs the lock's {kernel} kernel and {wrapper.behaviour}"
        return Exported(key, {"_target_": wrapper.target, **kwargs}, note)
    adapter = wrapping_adapter_for(wrapper.adapter_prefix, kernel)
    if adapter is None and kernel.startswith(f"{ADAPTERS}."):
        # a generic size adapter: wrap its kernel directly (it adapts the size too)
        inner = generic_kernel(kernel)
        adapter = generic_adapter(wrapper.adapter_prefix, inner) if inner else None
    elif adapter is None:
        adapter = generic_adapter(wrapper.adapter_prefix, kernel)
    if adapter is None:
        raise ConventionError(
            f"uses anemoi's {name}, which {wrapper.behaviour}; the lock pins {kernel}, and "
            "kernel_lock has no adapter that keeps that behaviour around it, so replacing it "
            "would silently undo it",
            key=where or key,
            fix=f"keep {name} here (it runs the torch.nn.LayerNorm kernel), or add an adapter "
            f"for {kernel} to kernel_lock.registry.AUTOCAST_ADAPTERS",
        )
    note = (
        f"anemoi's {name} {wrapper.behaviour}; {adapter.rpartition('.')[2]} keeps that around the "
        f"lock's {kernel} (same state dict)"
    )
    return Exported(key, {"_target_": adapter, **kwargs}, note)


def _joined(first: str, note: str) -> str:
    return first + (f"; {note}" if note else "")


def export(
    lock: KernelLock,
    mode: str | None = None,
    *,
    qk_norm: bool = False,
    verify_environment: bool = True,
) -> list[Exported]:
    """The entries of :func:`layer_kernels`, each with a note on how it was reached."""
    out: list[Exported] = []
    # each slot with a layer_kernels key (its spec's; Attention is set per component:
    # ``attention_options``); a slot not pinned keeps anemoi's own default (torch.nn)
    keys = [(spec.name, spec.anemoi_key) for spec in SPECS.values() if spec.anemoi_key]
    for slot, key in keys:
        if slot not in lock.slots:
            continue
        f = factory(lock, slot, mode=mode, verify_environment=verify_environment)
        kwargs = {k: v for k, v in f.keywords.items() if k not in DIMENSIONS[key]}
        target, note = _fitting_target(f.func, f.target, key, kwargs, slot, lock.path)
        if f.substituted_from:
            twin = f"inference substitute for {f.substituted_from} (verified max error "
            note = _joined(f"{twin}{f.max_error})", note)
        function = lock.slots[slot].extra.get("function")  # which function the model computes
        if function:
            note = _joined(f"the model's function {function}", note)
        out.append(Exported(key, {"_target_": target, **kwargs}, note))
    if qk_norm:
        out.extend(_query_key_norms(lock, next((e for e in out if e.key == "LayerNorm"), None)))
    return out


def _query_key_norms(lock: KernelLock, ln: Exported | None) -> list[Exported]:
    """QueryNorm and KeyNorm from the LayerNorm slot's entry ``ln``, bias-free as anemoi's own."""
    default = SPECS["LayerNorm"].default_target
    target = ln.entry["_target_"] if ln else default
    kwargs = {k: v for k, v in (ln.entry if ln else {}).items() if k != "_target_"}
    if target != default and "bias" not in kwargs:
        raise ConventionError(
            f"the lock's LayerNorm ({target}) pins no `bias` switch, so it cannot build "
            "anemoi's bias-free QueryNorm/KeyNorm (the state dict would gain a bias)",
            path=lock.path,
            key="slots.LayerNorm.kwargs",
            fix="export without qk_norm (anemoi's default AutocastLayerNorm stays for "
            "QueryNorm/KeyNorm)",
        )
    kwargs["bias"] = False  # anemoi's q/k norms have a weight and no bias
    check = "check the kernel at head_dim with `kernel-probe check --hidden 64`"
    out = []
    for key in ("QueryNorm", "KeyNorm"):
        # anemoi's default q/k norm is AutocastLayerNorm: the rule for any block using it
        want = Exported(key, {"_target_": target, **kwargs})
        entry = entry_for(key, want, ANEMOI_DEFAULTS[key], where=f"layer_kernels.{key}")
        assert entry is not None
        out.append(
            Exported(key, entry.entry, entry.note + ("" if target == default else f"; {check}"))
        )
    return out


def attention_export(
    lock: KernelLock, mode: str | None = None, *, verify_environment: bool = True
) -> tuple[dict[str, Any], str] | None:
    """The Attention slot's keys for every component with attention, and a note."""
    if "Attention" not in lock.slots:
        return None
    f = factory(lock, "Attention", mode=mode, verify_environment=verify_environment)
    options, note = attention_options(f.target, f.keywords)
    if f.substituted_from and options:
        note = (
            f"inference substitute for {f.substituted_from} (verified max error {f.max_error}); "
            f"set {ATTENTION_BACKEND_ENV}={options['attention_implementation']} in the inference "
            "job's environment"
        )
    return options, note


def gated_mlp_export(lock: KernelLock) -> tuple[dict[str, Any], str] | None:
    """The GatedMLP slot's ``mlp_implementation`` and a note; None when not pinned."""
    if "GatedMLP" not in lock.slots:
        return None
    slot = lock.slots["GatedMLP"]
    note = f"the lock checked {slot.extra['gate']}"
    if slot.target != "kernel_lock.gated_mlp.GatedMLP":
        note += (
            f" with {slot.target}; anemoi builds its own GatedMLPLayer (torch's gate): after "
            "building the model, kernel_lock.gated_mlp.swap_gated_layers(model, "
            "lock.factory('GatedMLP').func) puts the lock's kernel in its place (same state dict)"
        )
    return {CONFIG_KEY: slot.kwargs.get(CONFIG_KEY)}, note


def layer_kernels(
    lock: KernelLock,
    mode: str | None = None,
    *,
    qk_norm: bool = False,
    verify_environment: bool = True,
) -> dict[str, dict[str, Any]]:
    """The ``layer_kernels`` block of the slots ``lock`` pins, in ``mode`` (see :func:`export`);
    ``qk_norm`` also fills QueryNorm/KeyNorm. Raises what ``factory`` does."""
    return {
        e.key: e.entry
        for e in export(lock, mode, qk_norm=qk_norm, verify_environment=verify_environment)
    }
