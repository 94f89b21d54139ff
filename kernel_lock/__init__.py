"""kernel_lock: read a kernel-lock TOML, check this machine against it, and build the pinned
classes.

    import kernel_lock
    lock = kernel_lock.load("kernel-lock.toml")
    lock.verify()                        # raises LockMismatch, listing every differing field
    LayerNorm = lock.factory("LayerNorm")
    norm = LayerNorm(1024)               # the library's own class, with the pinned kwargs

Import-light on purpose: training and inference import this in every process. torch is imported only
when something is resolved; rich and kernel_probe never.

What a reader finds where (every module lists its public names in ``__all__``):

- the entry: this package, ``lock`` (``KernelLock``, ``load``, ``loads``), ``errors``;
- the lock file: ``document`` (its top-level keys), ``schema`` (its tables), ``tables`` (the typed
  getters; tables declared by their fields), ``toml`` (the canonical layout), ``graph_attention``;
  the slots: ``slots/``;
- what may be imported and how: ``registry`` (the candidates and adapters, as data), ``trust`` (the
  allow-list, importing, what is known without importing); the one child launcher and the
  confirming child (``launch``) and the one safe reader and writer (``files``);
- resolve and fingerprint: ``resolve`` (the resolver); ``fingerprint``, ``host`` and ``torchless``
  (this machine's facts);
- the classes a lock names as targets: ``adapters``, ``attention``, ``gated_mlp``;
- integrations: ``anemoi``, ``checkpoint``, ``distributed``, ``portability``.

Modules whose dotted paths are written into locks, configs, pickles or the docs keep those paths.
"""

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
    """A copy of ``module`` whose pickle needs neither the lock's training libraries nor
    kernel_lock (``kernel_lock.portability.portable``)."""
    from .portability import portable as _portable  # reason: import-light until a model converts

    return _portable(module, lock, **options)
