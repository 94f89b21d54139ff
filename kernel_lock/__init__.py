"""kernel_lock: read a kernel-lock TOML, check this machine against it, build the pinned classes.

    lock = kernel_lock.load("kernel-lock.toml")
    lock.verify()                        # raises LockMismatch, listing every differing field
    norm = lock.factory("LayerNorm")(1024)  # the library's own class, with the pinned kwargs

Import-light on purpose (every training process imports it): torch only when something resolves;
rich and kernel_probe never. Dotted paths written into locks, configs, pickles keep their paths."""

from __future__ import annotations

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
    "factory",
    "load",
    "loads",
    "portable",
]


def factory(lock: KernelLock | None, slot: str, mode: str | None = None, **options):
    """``lock.factory(slot)``, also for ``lock=None`` (every slot resolves to torch.nn)."""
    from .resolve import factory as _factory  # reason: import-light until something resolves

    return _factory(lock, slot, mode=mode, **options)


def portable(module, lock: KernelLock, **options):
    """A copy of ``module`` whose pickle needs neither the lock's libraries nor kernel_lock."""
    from .portability import portable as _portable  # reason: import-light until a model converts

    return _portable(module, lock, **options)
