"""The trace's child (imports torch): import the spec, build the model on the meta device, run one
forward and backward, and record every call site of every slot (:class:`Recorder`): modules
through their hooks, functional calls through a TorchFunctionMode, each attributed to the
innermost module running. Where the meta device cannot run the model, the CPU at batch 1 and 2,
the shapes scaled to the model's own batch. JSON out (:func:`trace_model`)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.overrides import TorchFunctionMode

from kernel_lock import slots as specs
from kernel_lock.model import Site, Unreached, function_site
from kernel_lock.slots import PRECISIONS, SlotSpec
from kernel_lock.slots.base import Functional, bound
from kernel_probe.model.tracing import ANEMOI, ANEMOI_BUILDER

__all__ = ["Function", "ModelCodeError", "Recorder", "functions", "trace_model"]

# autocast's rule on a GPU, emulated so that the meta device follows it too: these run in the
# regime's dtype, these in float32; every other op in what it receives
_LOW = {F.linear, F.scaled_dot_product_attention, F.conv1d, F.conv2d, F.conv3d, torch.matmul,
        torch.mm, torch.bmm, torch.baddbmm, torch.addmm, torch.addbmm, torch.einsum,
        torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.Tensor.mm,
        torch.Tensor.bmm}  # fmt: skip
_FLOAT32 = {F.layer_norm, torch.layer_norm, F.group_norm, F.softmax, F.log_softmax, torch.softmax,
            torch.log_softmax, torch.Tensor.softmax, torch.Tensor.log_softmax, F.cross_entropy,
            F.mse_loss}  # fmt: skip


@dataclass(frozen=True)
class Function:
    """A torch function of a slot: its public name, its name, and the slot's knowledge of it."""

    slot: str
    call: str
    name: str
    functional: Functional

    def inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        """The call's tensor inputs, in the slot's order (their shapes are the site's)."""
        given = bound(args, kwargs, self.functional.args)
        return [t for n in self.functional.inputs if isinstance(t := given.get(n), torch.Tensor)]


def functions() -> dict[Any, Function]:
    """Every torch callable of a function a slot routes (the slots registered now), by the
    callable: ``torch.nn.functional``'s first, then ``torch``'s own of the same name
    (``F.layer_norm`` and ``torch.layer_norm`` are both ``layer_norm``). What a call site computes
    with, which modules are sites and their public names are the slots' (``SlotSpec.calls``,
    ``kernel_lock.slots.site_of``, ``public_name``): what ``kernel_lock.apply`` reads too."""
    found: dict[Any, Function] = {}
    for spec in specs.SPECS.values():
        for name, functional in (spec.calls.functions if spec.calls else {}).items():
            for path, where in (("torch.nn.functional", F), ("torch", torch)):
                fn = getattr(where, name, None)
                if fn is not None and fn not in found:
                    found[fn] = Function(spec.name, f"{path}.{name}", name, functional)
    return found


class ModelCodeError(Exception):
    """The model's own code failed (its import, its build, its forward or backward), or its
    callable returned what is no ``(model, args[, kwargs])``."""


@dataclass
class _Frame:
    name: str
    covered: bool  # a slot's module (or one out of reach): its inner calls are its own
    counts: Counter[str] = field(default_factory=Counter)


class Recorder(TorchFunctionMode):
    """Records the sites of one forward of ``model`` (``low``: the dtype of a mixed regime)."""

    def __init__(self, model: nn.Module, low: torch.dtype | None = None):
        super().__init__()
        self.low, self.recording = low, False
        self.sites: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []  # a site called again with other shapes or semantics
        self.noted: set[str] = set()
        self.unreached: dict[str, Unreached] = {}
        self.stack: list[_Frame] = []
        self.handles: list[Any] = []
        self.functions = functions()  # the slots registered now: a trusted package's too
        for name, module in model.named_modules():
            site = specs.site_of(module)
            enter = partial(self._enter, name, site)
            self.handles.append(module.register_forward_pre_hook(enter, with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._leave, always_call=True))

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self.handles:
            handle.remove()

    def _enter(self, name: str, site: SlotSpec | str | None, module: nn.Module, args, kwargs):
        covered = any(f.covered for f in self.stack)
        if self.recording and not covered and site is not None:
            call = specs.public_name(type(module))
            slot, semantics = ("", site) if isinstance(site, str) else (
                site.name, _module_semantics(site, module, args, kwargs)
            )  # fmt: skip
            if isinstance(semantics, str):
                self.unreached.setdefault(name, Unreached(where=name, call=call, reason=semantics))
            else:
                inputs = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
                self._record(name, slot, "module", call, inputs, semantics)
        self.stack.append(_Frame(name, covered or site is not None))

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.stack:
            self.stack.pop()

    def _record(self, where: str, slot: str, kind: str, call: str, inputs, semantics) -> None:
        dtype = str(inputs[0].dtype).removeprefix("torch.") if inputs else ""
        site = dict(slot=slot, kind=kind, call=call, calls=1, dtype=dtype)
        site |= dict(
            shapes=["x".join(map(str, t.shape)) or "1" for t in inputs], semantics=dict(semantics)
        )
        first = self.sites.setdefault(where, site)
        if first is site:
            return
        first["calls"] += 1
        keys = ("dtype", "shapes", "semantics")
        if any(first[k] != site[k] for k in keys) and where not in self.noted:
            self.noted.add(where)
            again = ", ".join(f"{k} {site[k]}" for k in keys if first[k] != site[k])
            self.notes.append(
                f"{where}: called again with {again}: the site keeps its first call's"
            )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fn = self.functions.get(func)
        if fn is not None and self.recording and self.stack and not self.stack[-1].covered:
            frame = self.stack[-1]
            frame.counts[fn.name] += 1
            where = function_site(frame.name, fn.name, frame.counts[fn.name])
            semantics = fn.functional.semantics(args, kwargs)
            if isinstance(semantics, str):
                self.unreached.setdefault(
                    where, Unreached(where=where, call=fn.call, reason=semantics)
                )
            else:
                inputs = fn.inputs(args, kwargs)
                self._record(where, fn.slot, "function", fn.call, inputs, semantics)
        if self.low is not None and (func in _LOW or func in _FLOAT32):
            dtype = self.low if func in _LOW else torch.float32
            args, kwargs = _cast((args, kwargs), dtype)
        return func(*args, **kwargs)


def _module_semantics(spec: SlotSpec, module: nn.Module, args: tuple, kwargs: dict) -> Any:
    """A module site's semantics: its own (``Calls.module``), over what its call adds."""
    if spec.calls is None:  # a slot kernel_lock.apply does not swap: its class is its semantics
        return {}
    own = spec.calls.module(module)
    call = spec.calls.module_call(module, args, kwargs) if spec.calls.module_call else {}
    return own if isinstance(own, str) else call if isinstance(call, str) else {**call, **own}


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``fn`` applied to each tensor in it (lists, tuples, dicts)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if type(value) in (list, tuple):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with every floating tensor in it cast to ``dtype``."""
    return _map(value, lambda t: t.to(dtype) if t.is_floating_point() else t)


def _floats(value: Any) -> list[torch.Tensor]:
    """The floating tensors in ``value`` (lists, tuples, mappings), in order."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, Mapping):
        value = list(value.values())
    return [t for v in value for t in _floats(v)] if isinstance(value, (list, tuple)) else []


# ---- the spec's callable ------------------------------------------------------------------------
def _module_of(spec: Mapping[str, str]) -> Any:
    if spec["kind"] == "file":
        folder, stem = os.path.split(spec["source"])
        sys.path.insert(0, folder)  # its sibling modules import as they would beside it
        name = stem[:-3] if stem[:-3].isidentifier() else "__kernel_probe_model__"
        found = importlib.util.spec_from_file_location(name, spec["source"])
        if found is None or found.loader is None:
            raise ImportError(f"{spec['source']} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(found)
        sys.modules.setdefault(name, module)  # a sibling importing it by name gets this one
        found.loader.exec_module(module)
        return module
    return importlib.import_module(ANEMOI_BUILDER[0] if spec["kind"] == ANEMOI else spec["source"])


def _callable(spec: Mapping[str, str]) -> tuple[Callable[[], Any], str]:
    """The spec's callable, imported, and its name; ModelCodeError naming what failed."""
    what = ANEMOI_BUILDER[0] if spec["kind"] == ANEMOI else spec["source"]
    try:
        obj = _module_of(spec)
    except BaseException as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and spec["kind"] == "module":
            hint = (
                " (the working directory is not searched: name the file, path/to/file.py:"
                "callable, or put its folder on PYTHONPATH)"
            )
        raise ModelCodeError(f"importing {what} raised {type(exc).__name__}: {exc}{hint}") from None
    if spec["kind"] == ANEMOI:
        if not callable(getattr(obj, ANEMOI_BUILDER[1], None)):
            raise ModelCodeError(f"{what} has no {ANEMOI_BUILDER[1]}(config)")
        return partial(getattr(obj, ANEMOI_BUILDER[1]), spec["source"]), ".".join(ANEMOI_BUILDER)
    with _models_code(spec["call"]):  # it runs here too: a property, __getattr__, __signature__
        return _named(obj, spec, what)


@contextlib.contextmanager
def _models_code(call: str) -> Iterator[None]:
    """What the block raises is the model's code's: a ModelCodeError naming ``call``."""
    try:
        yield
    except ModelCodeError:
        raise
    except BaseException as exc:
        raise ModelCodeError(f"{call}() raised {type(exc).__name__}: {exc}") from None


def _named(obj: Any, spec: Mapping[str, str], what: str) -> tuple[Callable[[], Any], str]:
    """The callable ``spec["call"]`` names in the module ``obj``, checked callable without
    arguments; ModelCodeError where it is not."""
    for part in spec["call"].split("."):
        if not hasattr(obj, part):
            raise ModelCodeError(f"{what} has no {spec['call']!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelCodeError(f"{spec['call']!r} in {what} is a {type(obj).__name__}, not callable")
    try:
        inspect.signature(obj).bind()
    except TypeError as exc:
        raise ModelCodeError(f"{spec['call']}() takes required arguments ({exc})") from None
    except ValueError:  # no signature to read (a builtin): calling it will tell
        pass
    return obj, spec["call"]


def _unpack(value: Any, call: str) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """``(model, args)`` or ``(model, args, kwargs)``; ModelCodeError for anything else."""
    want = "(model, args) or (model, args, kwargs)"
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
        got = f"a {len(value)}-tuple" if isinstance(value, tuple) else type(value).__name__
        raise ModelCodeError(f"{call}() returned {got}, not {want}")
    model, args, kwargs = (*value, {}) if len(value) == 2 else value
    if not isinstance(model, nn.Module):
        raise ModelCodeError(
            f"{call}() returned a {type(model).__name__} as the model, not an nn.Module"
        )
    if not isinstance(args, (tuple, list)):
        raise ModelCodeError(
            f"{call}() returned a {type(args).__name__} as args, not a tuple of the forward's "
            "inputs (one input: (x,))"
        )
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ModelCodeError(f"{call}() returned a {type(kwargs).__name__} as kwargs, not a dict")
    return model, tuple(args), kwargs


def _build(
    fn: Callable[[], Any], call: str, device: str, *, wrap: bool = True
) -> tuple[nn.Module, tuple, dict]:
    """The model, args and kwargs ``fn`` builds on ``device``; what it raises is the model's
    code's (ModelCodeError) with ``wrap``."""
    with _models_code(call) if wrap else contextlib.nullcontext(), torch.device(device):
        value = fn()
    return _unpack(value, call)


# ---- one forward and backward -------------------------------------------------------------------
def _prepare(model: nn.Module, args: tuple, kwargs: dict, precision: str) -> tuple:
    """A ``-true`` regime casts the model (in place) and the floating inputs; a ``-mixed`` one
    gives its autocast dtype. (args, kwargs, autocast dtype or None)."""
    dtype = getattr(torch, PRECISIONS[precision].dtype)
    if PRECISIONS[precision].regime == "mixed":
        return args, kwargs, dtype
    model.to(dtype)
    return _cast(args, dtype), _cast(kwargs, dtype), None


def _run(
    model: nn.Module, args: tuple, kwargs: dict, low: torch.dtype | None, device: str
) -> Recorder:
    """One forward (recorded) and backward of ``model``, tensors its forward makes without a
    device on ``device`` (as on the device a model runs on)."""
    recorder = Recorder(model, low)
    try:
        with torch.device(device), _checkpoint_as_plain_calls(low is not None), recorder:
            recorder.recording = True
            out = model(*args, **kwargs)
            recorder.recording = False
            floating = [t for t in _floats(out) if t.requires_grad]
        if floating:
            torch.stack([t.float().sum() for t in floating]).sum().backward()
    finally:
        recorder.remove()
    return recorder


@contextlib.contextmanager
def _checkpoint_as_plain_calls(on: bool) -> Iterator[None]:
    """With ``on``, ``torch.utils.checkpoint.checkpoint`` calls its function plainly wherever a
    loaded module bound it: its backward recomputes outside the trace's mode, so without the
    mixed regime's casts, and torch refuses the recomputed dtypes. The calls are the same."""
    original = torch.utils.checkpoint.checkpoint
    if not on:
        yield
        return

    def plain(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        for key in ("use_reentrant", "context_fn", "determinism_check", "debug",
                    "preserve_rng_state"):  # fmt: skip
            kwargs.pop(key, None)
        return function(*args, **kwargs)

    bound = [
        (m, k)
        for m in list(sys.modules.values())
        for k, v in list(getattr(m, "__dict__", {}).items())
        if v is original
    ]
    for m, k in bound:
        setattr(m, k, plain)
    try:
        yield
    finally:
        for m, k in bound:
            setattr(m, k, original)


# ---- where the meta device cannot: the CPU at batch 1 and 2, scaled to the model's batch --------
def _first_batch(values: Any) -> int | None:
    if isinstance(values, torch.Tensor):
        return int(values.shape[0]) if values.dim() else None
    items = values.values() if isinstance(values, Mapping) else values
    if isinstance(items, (list, tuple)) or isinstance(values, Mapping):
        return next((n for v in items if (n := _first_batch(v)) is not None), None)
    return None


def _scaled(a: Any, b: Any, n: int) -> Any:
    """What grows with the batch, at batch ``n`` from its values at batches 1 (a) and 2 (b)."""
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [_scaled(x, y, n) for x, y in zip(a, b, strict=False)]
    if type(a) is int and type(b) is int:
        return a + (b - a) * (n - 1)
    return a


def _shape_at(a: str, b: str, n: int) -> str:
    x, y = a.split("x"), b.split("x")
    if len(x) != len(y):
        return a
    return "x".join(str(_scaled(int(i), int(j), n)) for i, j in zip(x, y, strict=False))


def _at_batch(one: dict, two: dict, n: int) -> tuple[dict, list[str]]:
    """The sites of batch 1 with their shapes, call counts and sizes scaled to batch ``n``."""
    out, notes = {}, []
    for where, site in one.items():
        other = two.get(where)
        if other is None:
            notes.append(f"{where}: called at batch 1, not at batch 2: its sizes are batch 1's")
            out[where] = site
            continue
        shapes = [_shape_at(a, b, n) for a, b in zip(site["shapes"], other["shapes"], strict=False)]
        semantics = {
            k: _scaled(v, other["semantics"].get(k), n) for k, v in site["semantics"].items()
        }
        calls = _scaled(site["calls"], other["calls"], n)
        out[where] = {**site, "shapes": shapes, "semantics": semantics, "calls": calls}
    notes += [f"{w}: called at batch 2, not at batch 1: left out" for w in two if w not in one]
    return out, notes


def _on_cpu(fn: Callable[[], Any], call: str, precision: str) -> tuple[str, Recorder, dict, list]:
    """The trace on the CPU at batch 1 (and 2); (traced, recorder, sites, notes)."""
    model, args, kwargs = _build(fn, call, "cpu")
    args, kwargs, low = _prepare(model, args, kwargs, precision)
    n = _first_batch((args, kwargs))
    batches = (1, 2) if n is not None and n > 1 else (n or 1,)
    runs = []
    for b in batches:
        cut = lambda t, b=b: t[:b] if n and t.dim() and t.shape[0] == n else t  # noqa: E731
        cut_args, cut_kwargs = _map(args, cut), _map(kwargs, cut)
        try:
            runs.append(_run(model, cut_args, cut_kwargs, low, "cpu"))
        except BaseException as exc:
            raise ModelCodeError(
                f"its forward and backward at batch {b} on the CPU raised "
                f"{type(exc).__name__}: {exc}"
            ) from None
    if len(runs) == 1:
        return f"cpu, batch {n or 1} of {n or 1}", runs[0], runs[0].sites, runs[0].notes
    sites, notes = _at_batch(runs[0].sites, runs[1].sites, int(n or 1))
    return f"cpu, batch 1 of {n}", runs[0], sites, runs[0].notes + notes


def _trusted_slots(trust: list[str]) -> None:
    """Register the slots trusted packages declare (``kernel_lock.slots`` entry points): their
    modules are sites too. Nothing untrusted is imported."""
    if not trust:
        return
    from importlib.metadata import entry_points  # ~20 ms: only where a package is trusted

    for ep in entry_points(group=specs.ENTRY_POINTS):
        module = ep.value.split(":")[0].strip()
        if any(module == t or module.startswith(t + ".") for t in trust):
            specs.spec_of(ep.name, tuple(trust))


def trace_model(request: Mapping[str, Any]) -> dict[str, Any]:
    """The child's body: the spec's sites, the unreached and how it was traced (JSON)."""
    spec, precision = request["spec"], str(request["precision"])
    _trusted_slots([str(t) for t in request.get("trust", [])])
    fn, call = _callable(spec)
    try:
        model, args, kwargs = _build(fn, call, "meta", wrap=False)
        args, kwargs, low = _prepare(model, args, kwargs, precision)
        recorder = _run(model, args, kwargs, low, "meta")
        traced, sites, notes = "meta", recorder.sites, list(recorder.notes)
    except ModelCodeError:
        raise
    except BaseException as exc:  # the meta device cannot run it (an .item(), a data-dependent op)
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        traced, recorder, sites, notes = _on_cpu(fn, call, precision)
        notes = [f"the meta device could not run it ({why})", *notes]
    found = [
        Site(where=w, **{**s, "shapes": tuple(s["shapes"])}).to_dict() for w, s in sites.items()
    ]
    gone = [u.to_dict() for u in recorder.unreached.values()]
    return {"traced": traced, "sites": found, "unreached": gone, "notes": notes}
