"""anemoi-models' ``layer_kernels``: the lock as a config block, and checks of a block against anemoi.

anemoi-models builds its layers from a ``layer_kernels`` mapping of five keys to Hydra entries
(``{_target_: dotted.path, **kwargs}``), each instantiated as a partial and then called by anemoi
with the dimensions. Its call sites fix a convention the target must accept:

    LayerNorm(C)  and  LayerNorm(normalized_shape=C)      Transformer / GraphTransformer / MLP blocks
    Linear(in, out)  and  Linear(in, out, bias=...)
    QueryNorm(head_dim), KeyNorm(head_dim)                 only with qk_norm: True
    Activation()

:func:`layer_kernels` turns a lock into that block (pinned kwargs, never dimensions; an adapter from
``kernel_lock.adapters`` where a library's constructor does not fit). :func:`check_entry` judges one
entry of a block: the key, the import, the signature, the semantics. Both import the targets, so
torch; importing this module imports neither torch nor yaml (``import kernel_lock`` never imports it).

The lock's ``RMSNorm`` slot has no anemoi key and is never exported: anemoi has no RMSNorm call site,
and an RMSNorm under ``LayerNorm``/``QueryNorm``/``KeyNorm`` changes the model's maths and its state
dict (no bias, no mean), which is a modelling decision, not a kernel choice.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .errors import LockFormatError
from .lock import KernelLock

KEYS = ("Linear", "LayerNorm", "Activation", "QueryNorm", "KeyNorm")
NORM_KEYS = ("LayerNorm", "QueryNorm", "KeyNorm")

# What anemoi-models 0.19's load_layer_kernels uses for a key the block does not set. A key the
# block sets replaces the default entry whole (its kwargs included).
AUTOCAST_LAYER_NORM = "anemoi.models.layers.normalization.AutocastLayerNorm"
CONDITIONAL_LAYER_NORM = "anemoi.models.layers.normalization.ConditionalLayerNorm"
ANEMOI_DEFAULTS: dict[str, dict[str, Any]] = {
    "Linear": {"_target_": "torch.nn.Linear"},
    "LayerNorm": {"_target_": "torch.nn.LayerNorm"},
    "Activation": {"_target_": "torch.nn.GELU"},
    "QueryNorm": {"_target_": AUTOCAST_LAYER_NORM, "bias": False},
    "KeyNorm": {"_target_": AUTOCAST_LAYER_NORM, "bias": False},
}

# lock slot -> anemoi key (the RMSNorm slot has none; see the module docstring)
SLOT_KEYS = {"LayerNorm": "LayerNorm", "Linear": "Linear"}

# the sizes anemoi passes at the call site; pinned here they clash with a positional call
DIMENSIONS = {
    "LayerNorm": ("normalized_shape", "hidden_size", "dim"),
    "QueryNorm": ("normalized_shape", "hidden_size", "dim"),
    "KeyNorm": ("normalized_shape", "hidden_size", "dim"),
    "Linear": ("in_features", "out_features"),
    "Activation": (),
}

# anemoi's call sites, as (how anemoi writes it, positional args, keyword args); sizes are examples
CALLS: dict[str, tuple[tuple[str, tuple[Any, ...], dict[str, Any]], ...]] = {
    "LayerNorm": (("LayerNorm(C)", (64,), {}), ("LayerNorm(normalized_shape=C)", (), {"normalized_shape": 64})),
    "QueryNorm": (("QueryNorm(head_dim)", (64,), {}),),
    "KeyNorm": (("KeyNorm(head_dim)", (64,), {}),),
    "Linear": (("Linear(in, out)", (64, 128), {}), ("Linear(in, out, bias=...)", (64, 128), {"bias": True})),
    "Activation": (("Activation()", (), {}),),
}


@dataclass(frozen=True)
class Wrapper:
    """One of anemoi's own norm classes, and how it relates to a kernel a lock may pin.

    ``runs`` names the kernel class a *same-kernel* wrapper runs (it subclasses it and adds
    ``behaviour``); None marks a *different layer*, which a lock never replaces. ``adapter_prefix``
    names the ``kernel_lock.adapters`` classes that keep the wrapper's behaviour around another
    kernel (``Autocast`` + the kernel's anemoi-ready class name, see ``AUTOCAST_ADAPTERS``).
    """

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
            "casts its output back to the input dtype (bf16/fp16 under autocast, not fp32: gnn.yaml relies on it "
            "for memory, QueryNorm/KeyNorm for flash attention)",
            adapter_prefix="Autocast",
        ),
        Wrapper(
            CONDITIONAL_LAYER_NORM,
            None,
            "scale and shift computed from a condition (forward(x, cond)): a different layer, not a kernel choice",
        ),
    )
}


# ---- adapters: anemoi-ready classes kernel_lock.adapters builds (tables here, classes there) --------
ADAPTERS = "kernel_lock.adapters"

# anemoi builds norms as ``LayerNorm(C)`` and ``LayerNorm(normalized_shape=C)``; these library classes
# call the size ``hidden_size``, so anemoi cannot build them directly. Each entry is an adapter: a
# subclass of the library class (same parameters, same state-dict keys) whose first argument is
# ``normalized_shape``. Adding a library with that signature is adding a row here.
# adapter name -> (the library class it subclasses, the name of that class's size parameter)
SIZE_ADAPTERS: dict[str, tuple[str, str]] = {
    "LigerLayerNormAnemoi": ("liger_kernel.transformers.LigerLayerNorm", "hidden_size"),
    "LigerRMSNormAnemoi": ("liger_kernel.transformers.LigerRMSNorm", "hidden_size"),
    "FlashAttnRMSNormAnemoi": ("flash_attn.ops.triton.layer_norm.RMSNorm", "hidden_size"),
}

# anemoi's AutocastLayerNorm is torch.nn.LayerNorm with its output cast back to the input dtype, and
# anemoi's gnn preset (and every QueryNorm/KeyNorm default) relies on that cast. Where a lock pins
# another LayerNorm kernel, these keep the cast around it: a subclass of the kernel's anemoi-ready
# class whose forward returns ``super().forward(x).type_as(x)`` (same parameters and state dict).
# adapter name -> the class it subclasses (a library class, or another adapter)
AUTOCAST_ADAPTERS: dict[str, str] = {
    "AutocastCompiledLayerNorm": f"{ADAPTERS}.CompiledLayerNorm",
    "AutocastLigerLayerNormAnemoi": f"{ADAPTERS}.LigerLayerNormAnemoi",
    "AutocastTELayerNorm": "transformer_engine.pytorch.LayerNorm",
    "AutocastFusedLayerNorm": "apex.normalization.FusedLayerNorm",
}

# the adapters that keep an anemoi wrapper's behaviour, by the wrapper's adapter prefix
WRAPPING_ADAPTERS: dict[str, dict[str, str]] = {"Autocast": AUTOCAST_ADAPTERS}

# Generic adapters: for a kernel no table above names (a site's own class, a library not listed), the
# adapter's *name* carries the kernel's dotted path, its dots written ``__``:
#   kernel_lock.adapters.Autocast__site_kernels__norms__FastLayerNorm
# is site_kernels.norms.FastLayerNorm (given anemoi's ``normalized_shape`` argument if it takes its size
# as one of SIZE_NAMES) with its output cast back to the input dtype; ``Sized__...`` only renames the
# size argument. Built on first lookup like every adapter, so it pickles by name, and it subclasses the
# kernel (same parameters and state dict). Nothing in kernel_lock is edited to use a new kernel.
GENERIC_SEPARATOR = "__"
GENERIC_PREFIXES = ("Autocast", "Sized")
SIZE_NAMES = ("hidden_size", "dim")


def generic_adapter(prefix: str, kernel: str) -> str:
    """The ``kernel_lock.adapters`` path of the generic ``prefix`` adapter around ``kernel``."""
    parts = kernel.split(".")
    if len(parts) < 2 or any(not p.isidentifier() or p.startswith("_") or GENERIC_SEPARATOR in p for p in parts):
        raise ConventionError(
            f"{kernel!r} cannot be named in a generic adapter: it needs a public dotted path whose parts contain no "
            f"{GENERIC_SEPARATOR!r}",
            key=kernel,
            fix="rename the module or class, or add a row for it to kernel_lock.anemoi's adapter tables",
        )
    return f"{ADAPTERS}.{prefix}{GENERIC_SEPARATOR}{GENERIC_SEPARATOR.join(parts)}"


def generic_parts(name: str) -> tuple[str, str] | None:
    """(prefix, kernel path) of a generic adapter's class name, or None."""
    prefix, sep, rest = name.partition(GENERIC_SEPARATOR)
    if not sep or prefix not in GENERIC_PREFIXES:
        return None
    parts = rest.split(GENERIC_SEPARATOR)
    if len(parts) < 2 or any(not p.isidentifier() or p.startswith("_") for p in parts):
        return None
    return prefix, ".".join(parts)


def generic_kernel(target: str) -> str | None:
    """The kernel a generic adapter target wraps (``kernel_lock.adapters.Autocast__a__B`` -> ``a.B``), or None."""
    module, _, name = target.rpartition(".")
    if module != ADAPTERS:
        return None
    parts = generic_parts(name)
    return parts[1] if parts else None


def adapter_for(target: str) -> str | None:
    """The ``kernel_lock.adapters`` path of the size adapter for ``target``, or None if there is none."""
    for name, (wrapped, _) in SIZE_ADAPTERS.items():
        if wrapped == target:
            return f"{ADAPTERS}.{name}"
    return None


def wrapping_adapter_for(prefix: str, target: str) -> str | None:
    """The ``kernel_lock.adapters`` path of the class that runs ``target`` inside the behaviour of
    the anemoi wrapper ``prefix`` names (e.g. Autocast: the output cast back to the input dtype)."""
    for name, base in WRAPPING_ADAPTERS.get(prefix, {}).items():
        if base == target:
            return f"{ADAPTERS}.{name}"
    return None


def wrapper_of(target: str) -> Wrapper | None:
    """The anemoi wrapper ``target`` is, or whose behaviour it keeps (a wrapping adapter), or None."""
    if target in WRAPPERS:
        return WRAPPERS[target]
    module, _, name = target.rpartition(".")
    if module == ADAPTERS:
        generic = generic_parts(name)
        for prefix, table in WRAPPING_ADAPTERS.items():
            if name in table or (generic is not None and generic[0] == prefix):
                return next((w for w in WRAPPERS.values() if w.adapter_prefix == prefix), None)
    return None


class ConventionError(LockFormatError):
    """A lock's target cannot be built the way anemoi calls it, and kernel_lock has no adapter for it."""


def size_parameter(cls: Any) -> str | None:
    """The name a norm class gives its size where it is not anemoi's ``normalized_shape`` (one of
    ``SIZE_NAMES``, as its first parameter), else None."""
    try:
        params = [p for p in inspect.signature(cls).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return None
    if not params or any(p.name == "normalized_shape" for p in params):
        return None
    return params[0].name if params[0].name in SIZE_NAMES else None


@dataclass(frozen=True)
class Finding:
    """One verdict about a ``layer_kernels`` block: where, what, why, and the fix."""

    severity: str  # error | warning | note
    kind: str  # key | entry | import | signature | semantics | lock | interpolation | dimension
    where: str  # dotted path in the config, e.g. "model.processor.layer_kernels.LayerNorm"
    problem: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


# ---- the convention ------------------------------------------------------------------------------
def convention_problems(cls: Any, key: str, kwargs: Mapping[str, Any]) -> list[str]:
    """The anemoi call sites for ``key`` that a partial of ``cls`` with ``kwargs`` would fail.

    Call-site kwargs win over the partial's, as in functools.partial and Hydra. A constructor without
    a readable signature cannot be checked and passes.
    """
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


def norm_family(cls: Any) -> str | None:
    """``rms_norm``, ``layer_norm``, ``conditional`` or None, from the class and its bases.

    RMSNorm is looked for first, over the whole MRO: an adapter subclassing LigerRMSNorm is one.
    """
    if not isinstance(cls, type):
        return None
    names = [c.__name__.lower() for c in cls.__mro__]
    try:
        import torch

        if issubclass(cls, torch.nn.RMSNorm):
            return "rms_norm"
    except (ImportError, AttributeError):
        pass
    if any("rmsnorm" in n for n in names):
        return "rms_norm"
    if any("conditional" in n and "norm" in n for n in names):
        return "conditional"
    if any("layernorm" in n for n in names):
        return "layer_norm"
    return None


def locate(path: str) -> Any:
    """Import ``path`` the way Hydra's ``_target_`` does: a module, then attributes (or submodules)."""
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
    key: str
    entry: dict[str, Any]
    note: str = ""


def _entry(target: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {"_target_": target, **kwargs}


def _fitting_target(
    cls: Callable[..., Any], target: str, key: str, kwargs: Mapping[str, Any], slot: str, where: str | None
) -> tuple[str, str]:
    """(the target anemoi can build, a note): the real class if it fits, else its adapter."""
    problems = convention_problems(cls, key, kwargs)
    if not problems:
        return target, ""
    from . import adapters

    adapter = adapter_for(target)
    if adapter is None and size_parameter(cls) is not None and "." in target:
        adapter = generic_adapter("Sized", target)
    if adapter is not None:
        adapted = getattr(adapters, adapter.rpartition(".")[2])
        if not convention_problems(adapted, key, kwargs):
            return (
                adapter,
                f"{target} takes its size as {size_parameter(cls)}; {adapter} subclasses it (same state dict)",
            )
    raise ConventionError(
        f"{target} (slot {slot}) cannot be built the way anemoi calls {key}: " + "; ".join(problems),
        path=where,
        key=f"slots.{slot}.target",
        fix="pin an implementation whose constructor takes anemoi's arguments (`kernel-probe --pin`), or add an "
        "adapter for this class to kernel_lock.anemoi.SIZE_ADAPTERS",
    )


def entry_for(key: str, want: Exported, current: Any, *, where: str = "") -> Exported | None:
    """What a block should hold for ``key`` given the lock's entry ``want`` and the block's
    ``current`` entry (anemoi's default for a key the block does not set); None: leave it as it is.

    The rule (``WRAPPERS``): a different layer (ConditionalLayerNorm) is never replaced; a
    same-kernel wrapper (AutocastLayerNorm) stays where the lock pins the kernel it runs, with the
    lock's kwargs, and becomes the adapter that keeps its behaviour around any other kernel
    (``AUTOCAST_ADAPTERS``); without such an adapter, :class:`ConventionError`. A wrapping adapter
    in the block counts as its wrapper, so applying the rule twice changes nothing.
    Anything else takes the lock's entry.
    """
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
        return Exported(
            key,
            _entry(wrapper.target, kwargs),
            f"keeps anemoi's {name}: it runs the lock's {kernel} kernel and {wrapper.behaviour}",
        )
    adapter = wrapping_adapter_for(wrapper.adapter_prefix, kernel)
    if adapter is None and kernel.startswith(f"{ADAPTERS}."):
        inner = generic_kernel(kernel)  # a generic size adapter: wrap its kernel directly (it adapts the size too)
        adapter = generic_adapter(wrapper.adapter_prefix, inner) if inner else None
    elif adapter is None:
        adapter = generic_adapter(wrapper.adapter_prefix, kernel)
    if adapter is None:
        raise ConventionError(
            f"uses anemoi's {name}, which {wrapper.behaviour}; the lock pins {kernel}, and "
            "kernel_lock has no adapter that keeps that behaviour around it, so replacing it would silently undo it",
            key=where or key,
            fix=f"keep {name} here (it runs the torch.nn.LayerNorm kernel), or add an adapter for {kernel} to "
            "kernel_lock.anemoi.AUTOCAST_ADAPTERS",
        )
    return Exported(
        key,
        _entry(adapter, kwargs),
        f"anemoi's {name} {wrapper.behaviour}; {adapter.rpartition('.')[2]} "
        f"keeps that around the lock's {kernel} (same state dict)",
    )


def export(
    lock: KernelLock, mode: str | None = None, *, qk_norm: bool = False, verify_environment: bool = True
) -> list[Exported]:
    """The entries of :func:`layer_kernels`, each with a note on how it was reached."""
    from .resolve import factory
    from .slots import DEFAULT_TARGETS

    out: list[Exported] = []
    for slot, key in SLOT_KEYS.items():
        if slot not in lock.slots:
            continue  # not pinned: anemoi's own default (torch.nn) stays
        f = factory(lock, slot, mode=mode, verify_environment=verify_environment)
        kwargs = {k: v for k, v in f.keywords.items() if k not in DIMENSIONS[key]}
        target, note = _fitting_target(f.func, f.target, key, kwargs, slot, lock.path)
        if f.substituted_from:
            note = f"inference substitute for {f.substituted_from} (verified max error {f.max_error})" + (
                f"; {note}" if note else ""
            )
        out.append(Exported(key, _entry(target, kwargs), note))
    if qk_norm:
        ln = next((e for e in out if e.key == "LayerNorm"), None)
        target = ln.entry["_target_"] if ln else DEFAULT_TARGETS["LayerNorm"]
        kwargs = {k: v for k, v in (ln.entry if ln else {}).items() if k != "_target_"}
        if target != DEFAULT_TARGETS["LayerNorm"] and "bias" not in kwargs:
            raise ConventionError(
                f"the lock's LayerNorm ({target}) pins no `bias` switch, so it cannot build anemoi's bias-free "
                "QueryNorm/KeyNorm (the state dict would gain a bias)",
                path=lock.path,
                key="slots.LayerNorm.kwargs",
                fix="export without qk_norm (anemoi's default AutocastLayerNorm stays for QueryNorm/KeyNorm)",
            )
        kwargs["bias"] = False  # anemoi's q/k norms have a weight and no bias
        for key in ("QueryNorm", "KeyNorm"):
            # anemoi's default q/k norm is AutocastLayerNorm: the same rule as for any block using it
            entry = entry_for(
                key, Exported(key, _entry(target, kwargs)), ANEMOI_DEFAULTS[key], where=f"layer_kernels.{key}"
            )
            assert entry is not None
            note = entry.note + (
                ""
                if target == DEFAULT_TARGETS["LayerNorm"]
                else "; check the kernel at head_dim with `kernel-probe check --hidden 64`"
            )
            out.append(Exported(key, entry.entry, note))
    return out


def layer_kernels(
    lock: KernelLock, mode: str | None = None, *, qk_norm: bool = False, verify_environment: bool = True
) -> dict[str, dict[str, Any]]:
    """The ``layer_kernels`` block for the slots ``lock`` pins, as anemoi-models reads it.

    ``{"LayerNorm": {"_target_": "torch.nn.LayerNorm", "eps": 1e-05, ...}, "Linear": {...}}``: the
    class each slot resolves to in ``mode`` (in inference mode, the verified twin where the pinned
    library cannot run here), with the pinned kwargs and never a dimension. A class whose constructor
    does not take anemoi's arguments is replaced by its adapter in ``kernel_lock.adapters``; without
    one, :class:`ConventionError`. ``qk_norm=True`` also fills ``QueryNorm``/``KeyNorm`` from the
    LayerNorm slot, bias-free as anemoi's own. Raises what ``lock.factory`` raises (e.g.
    ``LockMismatch`` in training mode on another machine). Pass the result to a processor or mapper
    as its raw ``layer_kernels`` config (anemoi instantiates it itself).
    """
    return {e.key: e.entry for e in export(lock, mode, qk_norm=qk_norm, verify_environment=verify_environment)}


# ---- checks of one entry of a block --------------------------------------------------------------
def key_suggestion(key: str) -> str:
    close = [k for k in KEYS if k.lower() == str(key).lower()] or difflib.get_close_matches(str(key), KEYS, n=1)
    hint = f"did you mean {close[0]!r}? keys are case-sensitive; " if close else ""
    return f"{hint}anemoi knows {', '.join(KEYS)}"


def check_entry(
    key: str, entry: Any, where: str, *, allow_semantics_change: bool = False
) -> tuple[list[Finding], dict[str, Any]]:
    """Findings about one ``layer_kernels`` entry on this machine, and facts for later comparisons
    (``target``, ``imported``, ``family``, ``defaults``: the constructor's keyword defaults).

    Imports the target (and so torch): run it where a crashing import cannot hurt (kernel-probe
    check-config runs it in a child process).
    """
    findings: list[Finding] = []
    facts: dict[str, Any] = {"target": None, "imported": False, "family": None, "defaults": {}}

    def add(severity: str, kind: str, problem: str, fix: str = "") -> None:
        findings.append(Finding(severity, kind, where, problem, fix))

    if key not in KEYS:
        add(
            "error",
            "key",
            f"unknown key {key!r}: anemoi silently ignores it, so this entry has no effect",
            key_suggestion(key),
        )
        return findings, facts
    if not isinstance(entry, Mapping):
        add(
            "error",
            "entry",
            f"expected a mapping like {{_target_: torch.nn.{key if key != 'Activation' else 'GELU'}}}, "
            f"got {type(entry).__name__} {entry!r:.60}",
        )
        return findings, facts
    target = entry.get("_target_")
    if not isinstance(target, str) or not target:
        add(
            "error", "entry", "no _target_: anemoi fails with KeyError: '_target_'", "add `_target_: dotted.path.Class`"
        )
        return findings, facts
    facts["target"] = target
    for option in entry:
        if isinstance(option, str) and option.startswith("_") and option not in ("_target_", "_partial_"):
            add(
                "warning",
                "entry",
                f"Hydra option {option!r}: anemoi instantiates entries as partials; "
                "positional `_args_` collide with the sizes anemoi passes",
                "remove it",
            )
    kwargs = {k: v for k, v in entry.items() if not (isinstance(k, str) and k.startswith("_"))}
    dims = [k for k in kwargs if k in DIMENSIONS[key]]
    for d in dims:
        add(
            "warning",
            "dimension",
            f"{d!r} is pinned here, but anemoi passes the size at the call site: a keyword "
            f"call overrides it and a positional call {CALLS[key][0][0]} fails with 'multiple values'",
            f"remove {d!r}",
        )
    try:
        cls = locate(target)
    except (Exception, SystemExit) as exc:  # ImportError, or whatever a module raises (or exits with) on import
        add(
            "error",
            "import",
            f"{target!r} does not import here: importing {target.rpartition('.')[0]!r} raised "
            f"{type(exc).__name__}: {exc}",
            "install the library that provides it, or fix the dotted path (anemoi would raise an empty "
            "InstantiationException and log the reason at INFO level)",
        )
        return findings, facts
    facts["imported"] = True
    import torch

    if not callable(cls):
        add("error", "entry", f"{target!r} is a {type(cls).__name__}, not a class anemoi can call")
        return findings, facts
    if isinstance(cls, type) and not issubclass(cls, torch.nn.Module):
        add("error", "entry", f"{target!r} is not a torch.nn.Module subclass")
    facts["family"] = norm_family(cls)
    facts["defaults"] = constructor_defaults(cls)
    for problem in convention_problems(cls, key, {k: v for k, v in kwargs.items() if k not in dims}):
        adapter = adapter_for(target)
        add(
            "error",
            "signature",
            f"{target} does not fit anemoi's call convention: {problem}",
            f"use `_target_: {adapter}` (same class and state dict, anemoi's signature)"
            if adapter
            else "use a class whose constructor takes anemoi's arguments, or a thin subclass adapting it",
        )
    family = facts["family"]
    if key in NORM_KEYS and family == "rms_norm":
        add(
            "warning" if allow_semantics_change else "error",
            "semantics",
            f"semantics change: {target} is an RMSNorm under the {key} key: it does not subtract the mean and "
            "has no bias, so the model computes something else and its state dict changes",
            "use a LayerNorm implementation; if the change is deliberate, pass --allow-semantics-change",
        )
    if key == "Linear" and family is not None:
        add("error", "semantics", f"semantics change: {target} is a norm ({family}) under the Linear key")
    if key == "Activation" and "GLU" in getattr(cls, "__name__", "").upper():
        add(
            "error",
            "semantics",
            f"{target} is a GLU-family activation: anemoi-models rejects it in layer_kernels.Activation (ValueError)",
            "select GLU through the processor's mlp_implementation",
        )
    return findings, facts


def constructor_defaults(cls: Any) -> dict[str, Any]:
    """The keyword defaults a class is built with. A constructor that only passes ``*args, **kwargs``
    on (anemoi's AutocastLayerNorm) has the defaults of the first base that names its parameters."""
    for klass in getattr(cls, "__mro__", (cls,)):
        try:
            params = inspect.signature(klass).parameters
        except (TypeError, ValueError):
            continue
        if any(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params.values()):
            return {
                n: p.default
                for n, p in params.items()
                if p.default is not inspect.Parameter.empty and _plain(p.default)
            }
    return {}


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def check_entries(requests: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """JSON in, JSON out: :func:`check_entry` for each ``{key, entry, where, allow_semantics_change}``.

    The child-process entry point of ``kernel-probe check-config``.
    """
    out = []
    for r in requests:
        findings, facts = check_entry(
            r["key"], r["entry"], r["where"], allow_semantics_change=bool(r.get("allow_semantics_change"))
        )
        out.append({"findings": [f.to_json() for f in findings], "facts": facts})
    return out
