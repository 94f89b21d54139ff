"""Importing a pinned class: the allow-list first, then the import, then what the class must be.

``import_target`` imports an allow-listed ``torch.nn.Module`` subclass and refuses one of other
semantics; ``build`` turns every way an import fails into the error a user can act on (the library
is missing, broken, or a program); ``check_kwargs`` refuses pinned arguments the constructor does
not take. Nothing here decides *what* a slot resolves to: that is ``kernel_lock.resolve``'s.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import KernelUnavailable, LockFormatError, TargetNotAllowed
from ..slots import SPECS, class_semantics
from . import check_target

if TYPE_CHECKING:
    from ..format.document import LockDocument
    from ..format.schema import Slot

__all__ = [
    "IN_INFERENCE_MODE",
    "build",
    "check_kwargs",
    "import_failure",
    "import_target",
    "install_hint",
]


# how to ask for inference mode, said once for both audiences of these messages
IN_INFERENCE_MODE = 'in inference mode (Python: mode="inference"; command line: --mode inference)'


def install_hint(slot: Slot) -> str:
    """``pip install 'liger-kernel>=0.5'``: what installs the libraries ``slot`` requires, by
    name."""
    wanted = " ".join(
        f"'{r.name}{r.specifier}'" if str(r.specifier) else r.name
        for r in slot.requires
        if r.name != "torch"
    )
    return f"`pip install {wanted}`" if wanted else "the library it needs"


def import_target(
    target: str,
    trusted: tuple[str, ...] = (),
    *,
    where: str | None = None,
    key: str | None = None,
    semantics: str | None = None,
) -> type:
    """Import an allow-listed ``torch.nn.Module`` subclass. The allow-list is checked first; with
    ``semantics``, a class that computes something else (an RMSNorm for a LayerNorm slot, an
    Identity for a Linear) is refused."""
    check_target(target, trusted, path=where, key=key)
    module_name, _, attr = target.rpartition(".")
    # a nested class ("pkg.mod.Outer.Inner") is not supported on purpose: one module, one class
    module = importlib.import_module(module_name)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None
    import torch

    if semantics == "attention" and callable(obj) and not isinstance(obj, type):
        # a function with SDPA's signature (``--candidate Attention=module.function``): called
        # through the slot's options by a class of kernel_lock.attention, which receives the window
        # as its mask
        from ..attention import for_function

        obj = for_function(obj, target)
    if not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
        raise TargetNotAllowed(
            f"target {target!r} is a {type(obj).__name__}, not a torch.nn.Module subclass",
            path=where,
            key=key,
            fix="a slot must name a module class, such as torch.nn.LayerNorm",
        )
    found = None
    if semantics is not None:
        from .adapter_names import generic_kernel
        from .registry import declared_semantics

        # a generic adapter's semantics are its kernel's: the registry's word on the class its name
        # carries
        found = class_semantics(obj) or declared_semantics(generic_kernel(target) or target)
    if found is not None and found != semantics:
        raise TargetNotAllowed(
            f"target {target!r} computes {found}, not {semantics}: the slot would change the "
            "model's maths",
            path=where,
            key=key,
            fix="pin a class of the slot's semantics (an RMSNorm is not a LayerNorm), or move "
            "the entry to its slot",
        )
    return obj


def check_kwargs(cls: type, kwargs: Mapping[str, Any], *, where: str | None, key: str) -> None:
    """Refuse pinned kwargs the class's constructor does not accept (before any call)."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for name in kwargs:
        p = params.get(name)
        if p is None or p.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.VAR_POSITIONAL,
        ):
            accepted = [
                n for n, q in params.items() if q.kind in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY)
            ]
            raise LockFormatError(
                f"{cls.__module__}.{cls.__qualname__} does not accept the keyword argument "
                f"{name!r}",
                path=where,
                key=f"{key}.{name}",
                fix=f"remove it; accepted: {', '.join(accepted)}",
            )


def build(
    slot_name: str, target: str, kwargs: Mapping[str, Any], lock: LockDocument | None, key: str
) -> type:
    """Import ``target`` for ``slot_name`` and check ``kwargs`` against it; every failure a
    :class:`LockError` naming the lock's file and ``key``."""
    trusted = lock.granted if lock else ()
    where = lock.path if lock else None
    try:
        cls = import_target(
            target, trusted, where=where, key=f"{key}.target", semantics=SPECS[slot_name].semantics
        )
    except (LockFormatError, TargetNotAllowed):
        raise
    # a module that runs its command line on import must not end the caller
    except SystemExit as exc:
        raise import_failure(slot_name, target, exc, where, key) from None
    except ImportError as exc:
        missing = getattr(exc, "name", None) or target.split(".")[0]
        raise KernelUnavailable(
            f"slot {slot_name}: cannot import {target!r}: {exc}",
            path=where,
            key=key,
            fix=f"install the library that provides module {missing!r}, re-run `kernel-probe` "
            f"to choose what this machine can run, or resolve it {IN_INFERENCE_MODE} to use the "
            "verified torch.nn twin",
        ) from None
    # a library that raises something else while importing is broken, not absent
    except Exception as exc:
        raise import_failure(slot_name, target, exc, where, key) from None
    check_kwargs(cls, kwargs, where=where, key=f"{key}.kwargs")
    return cls


def import_failure(
    slot_name: str, target: str, exc: BaseException, where: str | None, key: str
) -> KernelUnavailable:
    """What an import that did not end in a class or an ImportError means, for every importer of a
    lock's classes (``build``, ``portable``): a library that calls ``sys.exit`` or raises while
    importing is unavailable here (exit 3); it never ends the caller."""
    if isinstance(exc, SystemExit):
        return KernelUnavailable(
            f"slot {slot_name}: importing {target!r} called sys.exit({exc.code!r})",
            path=where,
            key=key,
            fix="that module is a program, not a library of layers: pin a class from a library",
        )
    return KernelUnavailable(
        f"slot {slot_name}: importing {target!r} failed with {type(exc).__name__}: {exc}",
        path=where,
        key=key,
        fix="repair or reinstall that library, re-run `kernel-probe`, or resolve it "
        f"{IN_INFERENCE_MODE}",
    )
