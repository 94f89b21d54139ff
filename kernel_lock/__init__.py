"""kernel_lock: read a kernel-lock TOML, check this machine against it, build the pinned classes.

    lock = kernel_lock.load("kernel-lock.toml")
    lock.verify()                        # raises LockMismatch, listing every differing field
    norm = lock.factory("LayerNorm")(1024)  # the library's own class, with the pinned kwargs
    report = kernel_lock.apply(model, lock)  # or swap a built model's call sites, each named

Import-light on purpose (every training process imports it): torch only when something resolves;
rich and kernel_probe never. Dotted paths written into locks, configs, pickles keep their paths."""

from __future__ import annotations

from . import apply as _applying  # torch-free at import; the name `apply` is the function below
from .errors import (
    EXIT_CODES,
    Difference,
    ExitCode,
    KernelUnavailable,
    LockError,
    LockFormatError,
    LockMismatch,
    LockVersionError,
    LockWarning,
    RanksDisagree,
    TargetNotAllowed,
)
from .lock import KernelLock, load, loads
from .schema import LOCK_VERSION
from .slots import SLOTS

__version__ = "0.1.0"

__all__ = [
    "EXIT_CODES",
    "LOCK_VERSION",
    "SLOTS",
    "Difference",
    "ExitCode",
    "KernelLock",
    "KernelUnavailable",
    "LockError",
    "LockFormatError",
    "LockMismatch",
    "LockVersionError",
    "LockWarning",
    "RanksDisagree",
    "TargetNotAllowed",
    "apply",
    "factory",
    "load",
    "loads",
    "portable",
]


def factory(lock: KernelLock | None, slot: str, mode: str | None = None, **options):
    """``lock.factory(slot)``, also for ``lock=None`` (every slot resolves to torch.nn)."""
    from .resolve import factory as _factory  # reason: import-light until something resolves

    return _factory(lock, slot, mode=mode, **options)


def apply(model, lock: KernelLock, mode: str | None = None) -> _applying.Applied:
    """Swap every call site of ``model`` that ``lock`` covers, in place; returns the report
    (:class:`kernel_lock.apply.Applied`): each site, what it resolved to, or why it is left."""
    return _applying.apply(model, lock, mode)


def portable(module, lock: KernelLock | None = None, **options):
    """A copy of ``module`` whose pickle needs neither the lock's libraries nor kernel_lock:
    what :func:`apply` changed undone, any other lock class replaced by its slot's twin."""
    from .portability import portable as _portable  # reason: import-light until a model converts

    return _portable(module, lock, **options)
