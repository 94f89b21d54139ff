"""Portable whole-model checkpoints: the model with every lock class replaced by its
torch.nn twin (:func:`portable`), and what a ``torch.save`` file names (:func:`saved_modules`)."""

from __future__ import annotations

import copy
import functools
import io
import logging
import pickle
import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .anemoi import locate, wrapper_of
from .apply import RECORD, _accepted, _qualified, undo
from .checkpoint import migrate_module_state, migration_rules
from .errors import ExitCode, KernelUnavailable, LockError, LockFormatError
from .lock import KernelLock
from .registry import ADAPTERS
from .resolve import twin_refusal
from .schema import Slot
from .slots import SPECS
from .trust import import_failure, import_target

__all__ = [
    "NotPortable",
    "Replacement",
    "UnreadablePickle",
    "globals_in",
    "pickled_modules",
    "portable",
    "saved_modules",
]

log = logging.getLogger("kernel_lock")


class NotPortable(LockError):
    """The copy would still need a training library or kernel_lock to unpickle."""

    exit_code = ExitCode.MISMATCH


@dataclass(frozen=True)
class Replacement:
    """One module replaced by its twin, and their error here (None: not compared)."""

    path: str
    slot: str
    original: str
    twin: str
    error: float | None
    note: str = ""


def _build_twin(module: Any, slot: Slot, twin_cls: type) -> Any:
    """The twin of ``module``: its sizes and eps, the lock's twin kwargs, the migrated state."""
    assert slot.twin is not None
    state = migrate_module_state(module.state_dict(), migration_rules(slot))
    kwargs = dict(slot.twin.kwargs)
    accepted = _accepted(twin_cls)
    accepted = set(kwargs) if accepted is None else accepted
    how = SPECS[slot.name].twin_args  # its size, eps, parameters (none: the twin's own kwargs)
    args, own = how(module, state, accepted) if how is not None else ((), {})
    twin = twin_cls(*args, **{**kwargs, **own})
    reference = next(iter(state.values()), None)
    if reference is not None and hasattr(reference, "device"):
        twin = twin.to(device=reference.device, dtype=reference.dtype)
    twin.load_state_dict(state, strict=True)
    twin.train(module.training)
    originals = dict(module.named_parameters())
    for name, p in twin.named_parameters():
        if name in originals:
            p.requires_grad_(originals[name].requires_grad)
    return twin


def _compare(original: Any, twin: Any, slot: Slot) -> float | None:
    """Normwise relative error of the two on a small input; None where the original cannot run."""
    import torch  # reason: kernel_lock imports torch only when a model is converted

    params = list(twin.parameters())
    device = params[0].device if params else torch.device("cpu")
    dtype = params[0].dtype if params else torch.float32
    how = SPECS[slot.name].sample_width
    width = 8 if not params else how(twin) if how is not None else int(params[0].shape[0])
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(16, width, generator=gen) + 0.3).to(device=device, dtype=dtype)
    try:
        with torch.no_grad():
            a = original(x)
    except Exception:  # e.g. a GPU-only kernel on this CPU: not compared, and said so
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
    return max(8 * ((slot.twin.max_error if slot.twin else None) or 0.0), 1e-4)


class _Converter:
    """Replaces lock classes (modules, stored classes, partials) in a module tree by their twins."""

    def __init__(self, lock: KernelLock, compare: bool):
        self.lock, self.compare = lock, compare
        self.replacements: list[Replacement] = []
        self._seen: dict[int, Any] = {}  # a module shared by several parents stays shared
        self.slots: list[tuple[Slot, type]] = []  # each slot importable here, with its class
        for slot in lock.slots.values():
            key = f"slots.{slot.name}.target"
            try:
                cls = import_target(slot.target, lock.granted, where=lock.path, key=key)
            except ImportError:
                continue  # not importable here: no module of the model can be an instance of it
            except LockError:
                raise
            except (Exception, SystemExit) as exc:  # sys.exit on import: unavailable, as factory
                raise import_failure(slot.name, slot.target, exc, lock.path, key) from None
            self.slots.append((slot, cls))

    def slot_of(self, cls: type) -> Slot | None:
        """The slot whose pinned class ``cls`` is (or adapts)."""
        adapts = cls.__module__ == ADAPTERS
        return next(
            (s for s, pin in self.slots if cls is pin or adapts and issubclass(cls, pin)), None
        )

    def twin_class(self, slot: Slot, cls: type) -> type:
        """The slot's twin, or the anemoi wrapper around it that ``cls`` adapts."""
        refusal = twin_refusal(slot)
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
        key = f"slots.{slot.name}.twin.target"
        twin = import_target(slot.twin.target, self.lock.granted, where=self.lock.path, key=key)
        wrapper = wrapper_of(_qualified(cls)) if cls.__module__ == ADAPTERS else None
        if wrapper is None:
            return twin
        if wrapper.runs != slot.twin.target:
            raise NotPortable(
                f"{_qualified(cls)} keeps anemoi's {wrapper.target} behaviour around its kernel, "
                f"but that wrapper runs {wrapper.runs}, not the twin {slot.twin.target}",
                fix="add a wrapper for the twin to kernel_lock.anemoi.WRAPPERS",
            )
        return locate(wrapper.target)

    def modules(self, root: Any) -> Any:
        """``root`` with every lock-class module in its tree replaced (``root`` itself too)."""
        slot = self.slot_of(type(root))
        if slot is not None:
            return self._replace(root, "", slot)
        for name, parent in list(root.named_modules()):
            for child_name, child in list(parent._modules.items()):
                if child is not None and (slot := self.slot_of(type(child))) is not None:
                    where = f"{name}.{child_name}" if name else child_name
                    parent._modules[child_name] = self._replace(child, where, slot)
        return root

    def _replace(self, module: Any, where: str, slot: Slot) -> Any:
        if id(module) in self._seen:
            return self._seen[id(module)]
        twin_cls = self.twin_class(slot, type(module))
        if type(module) is twin_cls:
            self._seen[id(module)] = module
            return module
        twin = _build_twin(module, slot, twin_cls)
        error = _compare(module, twin, slot) if self.compare else None
        original, twin_name = _qualified(type(module)), _qualified(twin_cls)
        if error is not None and error > _tolerance(slot):
            raise NotPortable(
                f"{where or 'the model'}: {original} and its twin {twin_name} disagree here "
                f"(error {error:.3g} > tolerance {_tolerance(slot):.3g}; the lock verified "
                f"{slot.twin.max_error if slot.twin else None})",
                path=self.lock.path,
                key=f"slots.{slot.name}.twin",
                fix="re-probe on this machine (`kernel-probe --force`) and save with the new lock",
            )
        compared = error is not None or not self.compare
        note = "" if compared else "not compared: the original cannot run on this machine"
        where = where or "<root>"
        self.replacements.append(Replacement(where, slot.name, original, twin_name, error, note))
        self._seen[id(module)] = twin
        return twin

    def attributes(self, root: Any) -> None:
        """Replace the lock classes and partials stored in the tree's modules' attributes."""
        for _, module in root.named_modules():
            for name, value in list(vars(module).items()):
                if name in ("_modules", "_parameters", "_buffers") or name.startswith(
                    ("_forward", "_backward")
                ):
                    continue
                new = self.value(value, 0)
                if new is not value:
                    object.__setattr__(module, name, new)

    def value(self, value: Any, depth: int) -> Any:
        """``value`` with lock classes and partials replaced, through dicts, lists and tuples."""
        if depth > 8:
            return value
        if isinstance(value, functools.partial):
            return self._partial(value)
        if isinstance(value, type):
            slot = self.slot_of(value)
            return self.twin_class(slot, value) if slot is not None else value
        if isinstance(value, dict):
            items = {k: self.value(v, depth + 1) for k, v in value.items()}
            if all(items[k] is value[k] for k in value):
                return value
            try:
                return type(value)(items)
            except Exception:
                return dict(items)
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            listed = [self.value(v, depth + 1) for v in value]
            if all(a is b for a, b in zip(listed, value, strict=True)):
                return value
            return type(value)(listed)
        return value

    def _partial(self, value: functools.partial) -> Any:
        func, args, keywords = value.func, value.args, dict(value.keywords or {})
        if isinstance(func, type) and (slot := self.slot_of(func)) is not None:
            twin_cls = self.twin_class(slot, func)
            assert slot.twin is not None
            twin_kwargs = dict(slot.twin.kwargs)  # a value the call site set (eps) wins
            twin_kwargs.update((k, v) for k, v in keywords.items() if k in twin_kwargs)
            return functools.partial(twin_cls, *args, **twin_kwargs)
        if type(value).__module__.startswith("kernel_lock"):  # a KernelFactory of a torch.nn class
            return functools.partial(func, *args, **keywords)
        return value


def portable(
    module: Any,
    lock: KernelLock | None = None,
    *,
    compare: bool = True,
    report: list[Replacement] | None = None,
) -> Any:
    """A copy of ``module`` that unpickles without the training library and kernel_lock: ``apply``
    undone, each other lock class replaced by its slot's verified twin (``compare``: checked here)
    of ``lock`` (default: ``apply``'s). Raises KernelUnavailable or :class:`NotPortable`."""
    record = getattr(module, RECORD, None)
    lock = lock if lock is not None else getattr(record, "lock", None)
    memo = {id(record.lock): record.lock} if record is not None else {}
    copied = copy.deepcopy(module, memo)
    undo(copied)
    if lock is None:
        left = sorted(m for m in pickled_modules(copied) if m.startswith("kernel_lock"))
        if left:
            raise NotPortable(
                f"the copy would still need {', '.join(left)} to unpickle, and no lock says "
                "which twin replaces each class",
                fix="pass the lock: kernel_lock.portable(model, lock)",
            )
        return copied
    converter = _Converter(lock, compare)
    copied = converter.modules(copied)
    converter.attributes(copied)
    for r in converter.replacements:
        compared = "not compared" if r.error is None else f"error {r.error:.3g}"
        log.info("kernel_lock.portable: %s %s -> %s (%s)", r.path, r.original, r.twin, compared)
    if report is not None:
        report.extend(converter.replacements)
    _refuse_left(copied, lock)
    return copied


def _refuse_left(copied: Any, lock: KernelLock) -> None:
    """:class:`NotPortable` where the copy's pickle names a lock library or kernel_lock."""
    slots = lock.slots.values()
    forbidden = {"kernel_lock", *lock.trusted_modules, *(s.target for s in slots)}
    forbidden |= {r.module for s in slots for r in s.requires if r.module}
    twins = {s.twin.target.split(".")[0] for s in slots if s.twin is not None}
    roots = {m.split(".")[0] for m in forbidden} - (twins - {"kernel_lock"}) - {"torch"}
    left = sorted(
        m
        for m in pickled_modules(copied)
        if m.split(".")[0] in roots or m.startswith("kernel_lock")
    )
    if not left:
        return
    own = sorted(
        f"slot {s.name}'s twin {s.twin.target}"
        for s in slots
        if s.twin is not None and s.twin.target.rpartition(".")[0] in left
    )
    raise NotPortable(
        f"the portable copy would still need {', '.join(left)} to unpickle"
        + (
            f" ({', '.join(own)} is kernel_lock's own: torch.nn has no module for it)"
            if own
            else ""
        ),
        path=lock.path,
        fix=(
            "save a state dict instead (it loads into the model built without kernel_lock), or "
            "write the model with torch's functional call, which kernel_lock.apply routes and "
            "portable restores"
            if own
            else "something outside the module tree keeps a lock class (a custom attribute "
            "holding an instance or a closure); replace it by hand, or save a state dict instead"
        ),
    )


# ---- what a pickle names -------------------------------------------------------------------------
# the opcodes that push a string: SHORT_BINUNICODE, BINUNICODE, UNICODE, ..., BINSTRING, STRING
_PUSH_STRING = ([pickletools.pyunicode], [pickletools.pystring])
_STRINGS = {op.name for op in pickletools.opcodes if op.stack_after in _PUSH_STRING}
_UNKNOWN = object()  # a stack value that is not a string the scan knows


class UnreadablePickle(ValueError):
    """A pickle whose globals cannot all be named without running it."""


def globals_in(data: bytes) -> set[str]:
    """Every ``module.name`` the pickle ``data`` would import, read without unpickling
    (stack, marks and memo modelled); :class:`UnreadablePickle` where one cannot be named."""
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
            if name in _STRINGS:
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
            elif name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1] if stack else _UNKNOWN
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise UnreadablePickle(
                        f"{name} at byte {pos} reads memo entry {arg!r}, which was never stored"
                    )
                stack.append(memo[arg])
            elif name == "DUP":
                stack.append(stack[-1] if stack else _UNKNOWN)
            elif name == "POP" and len(stack) > (marks[-1] if marks else 0):
                pop()
            elif name in ("POP", "POP_MARK"):  # pickle's load_pop: nothing above the mark: drop it
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
    """The modules pickling ``obj`` names (tensor data left out)."""
    import torch  # reason: kernel_lock imports torch only when a model is converted

    class _Pickler(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:  # storages: named, not serialised (as torch.save)
            if isinstance(o, (torch.UntypedStorage, torch.storage.TypedStorage)):
                return "storage"
            return None

    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(obj)
    return {name.rpartition(".")[0] for name in globals_in(buf.getvalue())}


def saved_modules(path: str | Path) -> set[str]:
    """The modules a ``torch.save`` file's pickles would import (read, not unpickled): each
    ``.pkl`` entry scanned; an archive with two entries of one name (case ignored, as torch's zip
    reader may match) is a LockFormatError: which one a loader reads is not defined."""
    found: set[str] = set()
    with zipfile.ZipFile(path) as archive:
        seen: dict[str, str] = {}
        for info in archive.infolist():  # by entry: read(name) would give the last one twice
            name, key = info.filename, info.filename.lower()
            if key in seen:
                raise LockFormatError(
                    f"the archive holds two entries named {seen[key]!r} and {name!r}: a loader "
                    "may read either, so what it would import cannot be known; refused",
                    path=str(path),
                    fix="re-save the checkpoint with torch.save from a trusted copy of the model",
                )
            seen[key] = name
            if key.endswith(".pkl"):  # data.pkl, and any other pickle torch.load may read
                with archive.open(info) as member:
                    found |= globals_in(member.read())
    return {name.rpartition(".")[0] for name in found}
