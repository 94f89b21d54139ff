"""Portable whole-model checkpoints: the model with every lock class replaced by its torch.nn twin.

anemoi's inference checkpoint is a pickled model (``torch.save(model)``, read back with
``torch.load(weights_only=False)``): the pickle names every class the model holds, and the factory
partials its processors and mappers keep (``layer_factory``). Built from a lock that pins a training
library, or an adapter of ``kernel_lock.adapters``, it unpickles only where that library *and*
kernel_lock are installed. :func:`portable` returns a copy that names neither:

- every module whose class came from the lock (the pinned class itself, or a
  ``kernel_lock.adapters`` subclass of it) becomes the slot's verified twin, built with the module's
  own size and eps, its state migrated as the lock records (``drop:_extra_state``), and its output
  compared with the original's where the original can run here;
- an adapter that keeps an anemoi wrapper's behaviour (``AutocastLigerLayerNormAnemoi``) becomes
  that wrapper around the twin (anemoi's ``AutocastLayerNorm``), so the output dtype is unchanged;
- every stored factory (a ``functools.partial`` of a lock class, such as anemoi's ``layer_factory``
  entries, or kernel_lock's own ``KernelFactory``) becomes a plain ``functools.partial`` of the
  twin;
- the result is pickled once, without tensor data, and refused if any kernel_lock or
  training-library name is still in it.

Not imported by ``import kernel_lock``; torch is imported when :func:`portable` runs.

One of kernel_lock's integrations (with ``anemoi``, ``checkpoint`` and ``distributed``), kept at the
path the docs show (``kernel_lock.portability.saved_modules``).
"""

from __future__ import annotations

import copy
import functools
import io
import logging
import pickle
import pickletools
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ExitCode, KernelUnavailable, LockError
from .format.schema import Slot
from .lock import KernelLock

__all__ = [
    "ADAPTERS_MODULE",
    "EPS_ATTRIBUTES",
    "NotPortable",
    "Replacement",
    "UnreadablePickle",
    "forbidden_roots",
    "globals_in",
    "pickled_modules",
    "portable",
    "saved_modules",
]

log = logging.getLogger("kernel_lock")

ADAPTERS_MODULE = "kernel_lock.adapters"
EPS_ATTRIBUTES = ("eps", "variance_epsilon")  # where norm classes keep their eps


class NotPortable(LockError):
    """The copy would still need a training library or kernel_lock to unpickle."""

    exit_code = ExitCode.MISMATCH


@dataclass(frozen=True)
class Replacement:
    """One module replaced by its twin: where, from which class to which, and how close they are."""

    path: str
    slot: str
    original: str
    twin: str
    # measured here between the two (normwise relative); None: the original cannot run here
    error: float | None
    note: str = ""


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class _Plan:
    """Which classes came from the lock, and what each becomes."""

    def __init__(self, lock: KernelLock):
        from .errors import LockError
        from .resolve import twin_refusal
        from .trust import import_failure, import_target

        self.lock = lock
        self.slots: list[tuple[Slot, type]] = []
        for slot in lock.slots.values():
            key = f"slots.{slot.name}.target"
            try:
                cls = import_target(slot.target, lock.granted, where=lock.path, key=key)
            except ImportError:
                continue  # not importable here: no module of the model can be an instance of it
            except LockError:
                raise
            except (
                Exception,
                SystemExit,
            ) as exc:  # sys.exit on import: unavailable, as factory says; never the end
                raise import_failure(slot.name, slot.target, exc, lock.path, key) from None
            self.slots.append((slot, cls))
        self._twin_refusal = twin_refusal
        self._import = import_target

    def slot_of(self, cls: type) -> tuple[Slot, type] | None:
        """The slot whose class ``cls`` is (or adapts), with the slot's pinned class."""
        for slot, pinned in self.slots:
            if cls is pinned or (cls.__module__ == ADAPTERS_MODULE and issubclass(cls, pinned)):
                return slot, pinned
        return None

    def twin_class(self, slot: Slot, cls: type) -> type:
        refusal = self._twin_refusal(slot)
        if refusal is not None:
            raise KernelUnavailable(
                f"slot {slot.name}: the model holds {_qualified(cls)} ({slot.implementation}), "
                f"and {refusal}",
                path=self.lock.path,
                key=f"slots.{slot.name}.twin",
                fix="save the checkpoint as it is (it then needs the training library to "
                "load), or re-train with an implementation that has a verified torch.nn twin",
            )
        assert slot.twin is not None
        twin = self._import(
            slot.twin.target,
            self.lock.granted,
            where=self.lock.path,
            key=f"slots.{slot.name}.twin.target",
        )
        wrapper = _wrapper_for(cls, slot.twin.target)
        if wrapper is not None:
            from .anemoi import locate

            return locate(wrapper)
        return twin


def _wrapper_for(cls: type, twin_target: str) -> str | None:
    """anemoi's wrapper class to use where ``cls`` is an adapter keeping that wrapper's
    behaviour."""
    from .anemoi import wrapper_of

    wrapper = wrapper_of(_qualified(cls)) if cls.__module__ == ADAPTERS_MODULE else None
    if wrapper is None:
        return None
    if wrapper.runs != twin_target:
        raise NotPortable(
            f"{_qualified(cls)} keeps anemoi's {wrapper.target} behaviour around its kernel, but "
            f"that wrapper runs {wrapper.runs}, not the twin {twin_target}",
            fix="add a wrapper for the twin to kernel_lock.anemoi.WRAPPERS",
        )
    return wrapper.target


def _migrated(state: Mapping[str, Any], slot: Slot) -> dict[str, Any]:
    from .checkpoint import migrate_module_state, migration_rules

    return migrate_module_state(state, migration_rules(slot))


def _module_eps(module: Any) -> float | None:
    for name in EPS_ATTRIBUTES:
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _build_twin(module: Any, slot: Slot, twin_cls: type) -> Any:
    """The twin of ``module``: its sizes and eps, the lock's twin kwargs, the migrated state."""
    import inspect

    assert slot.twin is not None
    state = _migrated(module.state_dict(), slot)
    kwargs = dict(slot.twin.kwargs)
    try:
        accepted = set(inspect.signature(twin_cls).parameters)
    except (TypeError, ValueError):
        accepted = set(kwargs)
    if slot.semantics == "activation":  # elementwise, no parameters: the twin's own kwargs only
        args: tuple[Any, ...] = ()
    elif slot.semantics == "linear":
        weight = state["weight"]
        args = (int(weight.shape[1]), int(weight.shape[0]))
        kwargs["bias"] = "bias" in state and state["bias"] is not None
    else:
        shape = getattr(module, "normalized_shape", None)
        if shape is None:
            shape = (
                tuple(state["weight"].shape) if "weight" in state else (int(module.hidden_size),)
            )
        args = (tuple(shape) if not isinstance(shape, int) else (shape,),)
        eps = _module_eps(module)
        if eps is not None and "eps" in accepted:
            kwargs["eps"] = eps  # what the module computed with (a call site may have set it)
        if "elementwise_affine" in accepted:
            kwargs["elementwise_affine"] = "weight" in state
        if "bias" in accepted and slot.semantics == "layer_norm":
            kwargs["bias"] = "bias" in state
    twin = twin_cls(*args, **kwargs)
    reference = next(iter(state.values()), None)
    if reference is not None and hasattr(reference, "device"):
        twin = twin.to(device=reference.device, dtype=reference.dtype)
    twin.load_state_dict(state, strict=True)
    twin.train(module.training)
    for name, p in twin.named_parameters():
        original = dict(module.named_parameters()).get(name)
        if original is not None:
            p.requires_grad_(original.requires_grad)
    return twin


def _compare(original: Any, twin: Any, slot: Slot) -> float | None:
    """Normwise relative error between the two on a small input; None when the original cannot run
    here."""
    import torch

    params = list(twin.parameters())
    device = params[0].device if params else torch.device("cpu")
    dtype = params[0].dtype if params else torch.float32
    width = (
        params[0].shape[-1]
        if slot.semantics == "linear" and params
        else (
            int(torch.tensor(getattr(twin, "normalized_shape", (params[0].shape[0],))).prod())
            if params
            else 8
        )
    )
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(16, width, generator=gen) + 0.3).to(device=device, dtype=dtype)
    try:
        with torch.no_grad():
            a = original(x)
    # e.g. a GPU-only kernel on this CPU: it cannot be compared here, which is said
    except Exception:
        return None
    with torch.no_grad():
        b = twin(x)
    a, b = a.detach().double(), b.detach().double()
    finite = torch.isfinite(a)
    if a.shape != b.shape or not torch.equal(finite, torch.isfinite(b)):
        return float("inf")  # a non-finite value where the other has none: they disagree
    if not finite.any():
        return 0.0
    a, b = a[finite], b[finite]
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _tolerance(slot: Slot) -> float:
    recorded = (
        slot.twin.max_error if slot.twin is not None and slot.twin.max_error is not None else 0.0
    )
    return max(8 * recorded, 1e-4)


class _Converter:
    """Walks a module tree, replacing lock classes (modules, classes, partials) with their twins."""

    def __init__(self, plan: _Plan, compare: bool):
        self.plan = plan
        self.compare = compare
        self.replacements: list[Replacement] = []
        self._seen: dict[int, Any] = {}

    # -- modules ------------------------------------------------------------------------------
    def modules(self, root: Any) -> Any:
        found = self.plan.slot_of(type(root))
        if found is not None:
            return self._replace(root, "", *found)
        for name, parent in list(root.named_modules()):
            for child_name, child in list(parent._modules.items()):
                if child is None:
                    continue
                hit = self.plan.slot_of(type(child))
                if hit is not None:
                    where = f"{name}.{child_name}" if name else child_name
                    parent._modules[child_name] = self._replace(child, where, *hit)
        return root

    def _replace(self, module: Any, where: str, slot: Slot, pinned: type) -> Any:
        key = id(module)
        if key in self._seen:  # a module shared by several parents stays shared
            return self._seen[key]
        twin_cls = self.plan.twin_class(slot, type(module))
        if type(module) is twin_cls:
            self._seen[key] = module
            return module
        twin = _build_twin(module, slot, twin_cls)
        error = _compare(module, twin, slot) if self.compare else None
        if error is not None and error > _tolerance(slot):
            raise NotPortable(
                f"{where or 'the model'}: {_qualified(type(module))} and its twin "
                f"{_qualified(twin_cls)} disagree here "
                f"(error {error:.3g} > tolerance {_tolerance(slot):.3g}; the lock verified "
                f"{slot.twin.max_error if slot.twin else None})",
                path=self.plan.lock.path,
                key=f"slots.{slot.name}.twin",
                fix="re-probe on this machine (`kernel-probe --force`) and save with the new lock",
            )
        note = (
            ""
            if error is not None or not self.compare
            else "not compared: the original cannot run on this machine"
        )
        self.replacements.append(
            Replacement(
                where or "<root>",
                slot.name,
                _qualified(type(module)),
                _qualified(twin_cls),
                error,
                note,
            )
        )
        self._seen[key] = twin
        return twin

    # -- stored factories and classes -----------------------------------------------------------
    def attributes(self, root: Any) -> None:
        for _, module in root.named_modules():
            for name, value in list(vars(module).items()):
                if (
                    name in ("_modules", "_parameters", "_buffers")
                    or name.startswith("_forward")
                    or name.startswith("_backward")
                ):
                    continue
                new = self.value(value, 0)
                if new is not value:
                    object.__setattr__(module, name, new)

    def value(self, value: Any, depth: int) -> Any:
        if depth > 8:
            return value
        if isinstance(value, functools.partial):
            return self._partial(value)
        if isinstance(value, type):
            found = self.plan.slot_of(value)
            return self.plan.twin_class(found[0], value) if found is not None else value
        if isinstance(value, dict):
            items = {k: self.value(v, depth + 1) for k, v in value.items()}
            if all(items[k] is value[k] for k in value):
                return value
            try:
                return type(value)(items)
            except Exception:
                return dict(items)
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            items_l = [self.value(v, depth + 1) for v in value]
            if all(a is b for a, b in zip(items_l, value, strict=True)):
                return value
            return type(value)(items_l)
        return value

    def _partial(self, value: functools.partial) -> Any:
        func, args, keywords = value.func, value.args, dict(value.keywords or {})
        if isinstance(func, type) and (found := self.plan.slot_of(func)) is not None:
            slot = found[0]
            twin_cls = self.plan.twin_class(slot, func)
            assert slot.twin is not None
            twin_kwargs = dict(slot.twin.kwargs)
            for k, v in keywords.items():  # what the call site pinned beyond the lock (eps) is kept
                if k in twin_kwargs:
                    twin_kwargs[k] = v
            return functools.partial(twin_cls, *args, **twin_kwargs)
        if type(value).__module__.startswith("kernel_lock"):  # a KernelFactory of a torch.nn class
            return functools.partial(func, *args, **keywords)
        return value


def portable(
    module: Any, lock: KernelLock, *, compare: bool = True, report: list[Replacement] | None = None
) -> Any:
    """A copy of ``module`` that unpickles where neither the training library nor kernel_lock is
    installed.

    Every module whose class came from ``lock`` (directly, through a ``kernel_lock.adapters`` class,
    or through a stored factory such as anemoi's ``layer_factory``) is replaced by the slot's
    verified twin, with its state migrated as the lock records. ``compare`` runs each replaced
    module and its twin on a small input and refuses (:class:`NotPortable`) where they disagree
    beyond the lock's verified error; a module that cannot run here (a GPU kernel on a CPU) is
    recorded as not compared. ``report`` (a list) receives one :class:`Replacement` per module
    replaced.

    Raises :class:`KernelUnavailable` naming the slot where a module's slot has no usable twin, and
    :class:`NotPortable` where the copy's pickle would still name kernel_lock or a training library.
    """
    plan = _Plan(lock)
    copied = copy.deepcopy(module)
    converter = _Converter(plan, compare)
    copied = converter.modules(copied)
    converter.attributes(copied)
    for r in converter.replacements:
        log.info(
            "kernel_lock.portable: %s %s -> %s (%s)",
            r.path,
            r.original,
            r.twin,
            "not compared" if r.error is None else f"error {r.error:.3g}",
        )
    if report is not None:
        report.extend(converter.replacements)
    forbidden = forbidden_roots(lock)
    left = sorted(
        m
        for m in pickled_modules(copied)
        if m.split(".")[0] in forbidden or m.startswith("kernel_lock")
    )
    if left:
        raise NotPortable(
            f"the portable copy would still need {', '.join(left)} to unpickle",
            path=lock.path,
            fix="something outside the module tree keeps a lock class (a custom attribute "
            "holding an instance or a closure); replace it by hand, or save a state dict instead",
        )
    return copied


def forbidden_roots(lock: KernelLock) -> set[str]:
    """Top-level modules a portable pickle must not name: kernel_lock and the lock's training
    libraries."""
    roots = {"kernel_lock"}
    for slot in lock.slots.values():
        roots.add(slot.target.split(".")[0])
        roots.update(r.module.split(".")[0] for r in slot.requires if r.module)
    roots.update(m.split(".")[0] for m in lock.trusted_modules)
    twins = {
        slot.twin.target.split(".")[0] for slot in lock.slots.values() if slot.twin is not None
    }
    return roots - (twins - {"kernel_lock"}) - {"torch"}


# ---- what a pickle names -------------------------------------------------------------------------
_STRING_OPS = {
    "SHORT_BINUNICODE",
    "BINUNICODE",
    "UNICODE",
    "BINUNICODE8",
    "SHORT_BINSTRING",
    "BINSTRING",
    "STRING",
}
_UNKNOWN = object()  # a stack value that is not a string the scan knows


class UnreadablePickle(ValueError):
    """A pickle whose globals cannot all be named without running it (a STACK_GLOBAL whose operands
    are not plain strings, an extension-registry code, a malformed stream): nothing may be said
    about it."""


def globals_in(data: bytes) -> set[str]:
    """Every ``module.name`` the pickle stream ``data`` would import when loaded: GLOBAL and INST
    arguments, and STACK_GLOBAL's two operands as they are on the stack when it runs.

    The stack, the marks and the memo are modelled opcode by opcode (each opcode's declared stack
    effect, from ``pickletools``), so strings pushed and popped as decoys, or fetched from the memo,
    are read as ``pickle`` would read them. Where the scan cannot name a global with certainty it
    raises :class:`UnreadablePickle` rather than under-report. Nothing is unpickled.
    """
    found: set[str] = set()
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[Any, Any] = {}

    def pop(n: int = 1) -> list[Any]:
        if n > len(stack) - (marks[-1] if marks else 0):
            raise UnreadablePickle(f"the stack underflows at opcode {name} (byte {pos})")
        taken = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        return taken

    def pop_mark() -> None:
        if not marks:
            raise UnreadablePickle(f"opcode {name} at byte {pos} has no mark")
        del stack[marks.pop() :]

    try:
        for op, arg, pos in pickletools.genops(data):
            name = op.name
            if name in _STRING_OPS:
                stack.append(arg)
            elif name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                found.add(f"{module}.{attr}")
                if name == "INST":
                    pop_mark()
                stack.append(_UNKNOWN)
            elif name == "STACK_GLOBAL":
                module, attr = pop(2)
                if not (isinstance(module, str) and isinstance(attr, str)):
                    raise UnreadablePickle(
                        f"STACK_GLOBAL at byte {pos} takes operands that are not plain strings"
                    )
                found.add(f"{module}.{attr}")
                stack.append(_UNKNOWN)
            elif name in ("EXT1", "EXT2", "EXT4"):
                raise UnreadablePickle(
                    f"{name} at byte {pos} names a global through copyreg's extension registry"
                )
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1] if stack else _UNKNOWN
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1] if stack else _UNKNOWN
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise UnreadablePickle(
                        f"{name} at byte {pos} reads memo entry {arg!r}, which was never stored"
                    )
                stack.append(memo[arg])
            elif name == "DUP":
                stack.append(stack[-1] if stack else _UNKNOWN)
            elif name == "POP":
                if len(stack) > (marks[-1] if marks else 0):
                    pop()
                else:  # pickle's load_pop: with nothing above the mark, POP drops the mark
                    pop_mark()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "STOP":
                break
            else:
                before = op.stack_before
                if pickletools.markobject in before:
                    pop_mark()
                    pop(before.index(pickletools.markobject))
                else:
                    pop(len(before))
                stack.extend(_UNKNOWN for _ in op.stack_after)
    except UnreadablePickle:
        raise
    except (ValueError, IndexError) as exc:  # pickletools on a truncated or malformed stream
        raise UnreadablePickle(f"not a readable pickle: {exc}") from None
    return found


def pickled_modules(obj: Any) -> set[str]:
    """The modules pickling ``obj`` names (tensor data left out), e.g. ``{"torch.nn.modules.linear",
    ...}``."""
    import torch

    buf = io.BytesIO()

    class _Pickler(pickle.Pickler):
        # storages: named, not serialised (torch.save does the same)
        def persistent_id(self, o: Any) -> Any:
            if isinstance(o, (torch.UntypedStorage, torch.storage.TypedStorage)):
                return "storage"
            return None

    _Pickler(buf, protocol=2).dump(obj)
    return {name.rpartition(".")[0] for name in globals_in(buf.getvalue())}


def saved_modules(path: str | Path) -> set[str]:
    """The modules a ``torch.save`` file's pickles would import when loaded (read from its zip
    archive; nothing is unpickled). Every global is reported: each ``.pkl`` member's stack is
    modelled (:func:`globals_in`), and a pickle whose globals cannot all be named raises
    :class:`UnreadablePickle`.
    """
    found: set[str] = set()
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            if member.endswith(".pkl"):  # data.pkl, and any other pickle torch.load may read
                found |= globals_in(archive.read(member))
    return {name.rpartition(".")[0] for name in found}
