"""Which modules a lock may make this process import: the allow-list, and the trust a caller grants.

The built-in allow-list follows from the registry (``kernel_lock/registry.toml``: torch,
``kernel_lock.adapters`` and every built-in candidate's import root; see
``registry.allowed_roots``). Beyond it only the *caller* grants trust: the API's ``trust=[...]``,
``$KERNEL_LOCK_TRUST``, kernel-probe's ``--trust``. A lock's own ``trusted-modules`` only asks for
it, and the refusal says how to grant it. Every check runs before anything is imported.

This package is kernel_lock's *trust and import* group; the allow-list lives here, in its
``__init__``, so ``kernel_lock.trust.check_target`` keeps the path the docs show. Its modules, each
imported where it is used: ``registry`` (the candidates, as data), ``importing`` (the allow-list,
then the import, then what the class must be), ``locate`` (what is known without importing),
``confirming`` and ``confirm_child`` (what only an import can tell, asked of a child), ``launch``
(the one child launcher), ``files`` (the one safe reader and writer), ``adapter_names`` (the
adapters, by name).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from ..errors import BadEnvironmentVariable, LockFormatError, TargetNotAllowed
from . import registry

__all__ = [
    "DOTTED",
    "MODULE",
    "TRUST_ENV",
    "check_target",
    "granted_trust",
    "module_name",
    "private",
]

TRUST_ENV = "KERNEL_LOCK_TRUST"  # modules the caller trusts beyond the built-in allow-list

DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", re.ASCII)
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)


def private(dotted: str) -> bool:
    """Whether a dotted name has a private (``_x``) or dunder component."""
    return any(part.startswith("_") for part in dotted.split("."))


def module_name(name: str) -> bool:
    """Whether ``name`` is a public module name a lock or a caller may trust."""
    return bool(MODULE.fullmatch(name)) and not private(name)


def _under(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


def granted_trust(trust: Iterable[str] = ()) -> tuple[str, ...]:
    """The modules the caller trusts: ``trust`` and ``$KERNEL_LOCK_TRUST`` (comma- or
    colon-separated)."""
    names = [str(t) for t in trust]
    env = os.environ.get(TRUST_ENV, "")
    names += [n for n in re.split(r"[,:\s]+", env) if n]
    for name in names:
        if not module_name(name):
            source = f"${TRUST_ENV}" if name not in trust else "trust"
            raise BadEnvironmentVariable(
                f"{source}: {name!r} is not a public module name",
                key=TRUST_ENV if source != "trust" else None,
                fix="list top-level packages, e.g. KERNEL_LOCK_TRUST=site_kernels",
            )
    return tuple(dict.fromkeys(names))


def check_target(
    target: str,
    trusted: Sequence[str] = (),
    *,
    path: str | None = None,
    key: str | None = None,
    requested: Sequence[str] = (),
    what: str = "target",
) -> None:
    """Refuse a target outside the allow-list. Runs before anything is imported.

    The allow-list is ``registry.allowed_roots()`` plus the modules the *caller* trusts
    (``trusted``: the API's ``trust=``, ``$KERNEL_LOCK_TRUST``, ``--trust``); the lock's own
    ``trusted-modules`` (``requested``) are only a request, named in the error with how to grant it.
    A path with a private or ``__main__`` component is never imported (importing a ``__main__`` runs
    it).
    """
    if not isinstance(target, str) or not DOTTED.fullmatch(target):
        raise LockFormatError(
            f"{target!r} is not a dotted import path like 'torch.nn.LayerNorm'", path=path, key=key
        )
    if private(target):
        raise TargetNotAllowed(
            f"{what} {target!r} has a private or __main__ component: it is never imported "
            "(importing a module's __main__ runs it)",
            path=path,
            key=key,
            fix="name a public class, e.g. torch.nn.LayerNorm",
        )
    if target.startswith("kernel_lock.adapters.") and "__" in target:
        from .adapter_names import (
            generic_kernel,
        )  # a generic adapter imports the kernel its name carries

        inner = generic_kernel(target)
        if inner is not None:
            check_target(
                inner,
                trusted,
                path=path,
                key=key,
                requested=requested,
                what=f"{what} (inside {target})",
            )
    if any(_under(target, root) for root in (*registry.OWN_ROOTS, *trusted)):
        return  # torch's own classes need no registry read (a few ms at every import of a lock)
    allowed = registry.allowed_roots()
    if any(_under(target, root) for root in allowed):
        return
    asked = next((m for m in requested if _under(target, m)), None)
    if asked is not None:
        raise TargetNotAllowed(
            f"{what} {target!r} is in {asked!r}, which the lock asks to trust (trusted-modules) "
            "but which was not granted; nothing was imported",
            path=path,
            key=key,
            fix=f"if you trust {asked!r}, grant it: `--trust {asked}` on kernel-probe's "
            "command line, "
            f"{TRUST_ENV}={asked} in the environment, or kernel_lock.load(path, trust=[{asked!r}])",
        )
    raise TargetNotAllowed(
        f"{what} {target!r} is not in the import allow-list ({', '.join(allowed)}); nothing "
        "was imported",
        path=path,
        key=key,
        fix=f"if you trust that module, grant it: `--trust MODULE`, {TRUST_ENV}=MODULE, or "
        "kernel_lock.load(path, trust=[...]) (a lock's own trusted-modules only asks)",
    )
