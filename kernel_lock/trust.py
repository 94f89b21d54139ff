"""Which modules a lock may make this process import, importing them, and what is known
without. The allow-list is the registry's plus what the *caller* grants; a lock's own
``trusted-modules`` only asks. Every check runs before anything is imported."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .errors import (
    BadEnvironmentVariable,
    Difference,
    KernelUnavailable,
    LockFormatError,
    TargetNotAllowed,
)
from .fingerprint import in_spec, library_versions, release
from .registry import OWN_ROOTS, allowed_roots, declared_semantics, generic_kernel, target_facts
from .slots import (
    SPECS,
    TORCH_FACTS_SINCE,
    _under,
    canonical_target,
    class_semantics,
    computation_fix,
    computation_problem,
)

__all__ = [
    "FLASH_GENERATIONS",
    "IN_INFERENCE_MODE",
    "MODULE",
    "TRUST_ENV",
    "anemoi_flash_generation",
    "build",
    "check_kwargs",
    "check_target",
    "granted_trust",
    "import_target",
    "install_hint",
    "locate",
    "module_name",
    "private",
    "static_problem",
    "unusable",
]

TRUST_ENV = "KERNEL_LOCK_TRUST"  # modules the caller trusts beyond the built-in allow-list
DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", re.ASCII)
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)
# how to ask for inference mode, said once for both audiences of these messages
IN_INFERENCE_MODE = 'in inference mode (Python: mode="inference"; command line: --mode inference)'


def private(dotted: str) -> bool:
    """Whether a dotted name has a private (``_x``) or dunder component."""
    return any(part.startswith("_") for part in dotted.split("."))


def module_name(name: str) -> bool:
    """Whether ``name`` is a public module name a lock or a caller may trust."""
    return bool(MODULE.fullmatch(name)) and not private(name)


def granted_trust(trust: Iterable[str] = ()) -> tuple[str, ...]:
    """The modules the caller trusts: ``trust`` and ``$KERNEL_LOCK_TRUST``."""
    names = [str(t) for t in trust]
    names += [n for n in re.split(r"[,:\s]+", os.environ.get(TRUST_ENV, "")) if n]
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
    """Refuse a target outside the allow-list before anything is imported; a private or
    ``__main__`` component is never imported; a generic adapter's kernel is checked too."""
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
    inner = generic_kernel(target)
    if inner is not None:
        where = f"{what} (inside {target})"
        check_target(inner, trusted, path=path, key=key, requested=requested, what=where)
    if _under(target, (*OWN_ROOTS, *trusted)):
        return  # torch's own classes need no registry read (a few ms at every import of a lock)
    allowed = allowed_roots()
    if _under(target, allowed):
        return
    asked = next((m for m in requested if _under(target, (m,))), None)
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


# ---- importing a pinned class: the allow-list first, then the import, then what it must be ------
def _other_maths(
    target: str, found: str, semantics: str, where: str | None, key: str | None
) -> TargetNotAllowed:
    return TargetNotAllowed(
        f"target {target!r} computes {found}, not {semantics}: the slot would change the "
        "model's maths",
        path=where,
        key=key,
        fix="pin a class of the slot's semantics (an RMSNorm is not a LayerNorm), or move "
        "the entry to its slot",
    )


def _not_installed(
    problem: str, module: str, where: str | None, key: str | None
) -> KernelUnavailable:
    return KernelUnavailable(
        problem,
        path=where,
        key=key,
        fix=f"install the library that provides module {module!r}, re-run `kernel-probe` "
        f"to choose what this machine can run, or resolve it {IN_INFERENCE_MODE} to use the "
        "verified torch.nn twin",
    )


def _unknown_kwarg(
    cls: str, kw: str, accepted: Iterable[str], where: str | None, key: str
) -> LockFormatError:
    return LockFormatError(
        f"{cls} does not accept the keyword argument {kw!r}",
        path=where,
        key=key,
        fix=f"remove it; accepted: {', '.join(accepted)}",
    )


def install_hint(slot: Any) -> str:
    """``pip install 'liger-kernel>=0.5'``: what installs the libraries ``slot`` requires."""
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
    """Import an allow-listed ``torch.nn.Module`` subclass; another ``semantics`` is refused."""
    check_target(target, trusted, path=where, key=key)
    module_path, _, attr = target.rpartition(".")
    # a nested class ("pkg.mod.Outer.Inner") is not supported on purpose: one module, one class
    module = importlib.import_module(module_path)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_path!r} has no attribute {attr!r}") from None
    import torch  # a class is being imported: torch is needed now, not at kernel_lock's import

    if semantics == "attention" and callable(obj) and not isinstance(obj, type):
        # a function with SDPA's signature (``--candidate Attention=module.function``), wrapped
        from .attention import for_function  # imports torch

        obj = for_function(obj, target)
    if not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
        raise TargetNotAllowed(
            f"target {target!r} is a {type(obj).__name__}, not a torch.nn.Module subclass",
            path=where,
            key=key,
            fix="a slot must name a module class, such as torch.nn.LayerNorm",
        )
    # a generic adapter's semantics are its kernel's: the registry's word on the class it names
    kernel = generic_kernel(target) or target
    found = None if semantics is None else class_semantics(obj) or declared_semantics(kernel)
    if found is not None and found != semantics:
        raise _other_maths(target, found, str(semantics), where, key)
    return obj


def check_kwargs(cls: type, kwargs: Mapping[str, Any], *, where: str | None, key: str) -> None:
    """Refuse pinned kwargs the class's constructor does not accept (before any call)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for name in kwargs:
        p = params.get(name)
        if p is None or p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
            accepted = [
                n for n, q in params.items() if q.kind in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY)
            ]
            name_of = f"{cls.__module__}.{cls.__qualname__}"
            raise _unknown_kwarg(name_of, name, accepted, where, f"{key}.{name}")


def build(slot_name: str, target: str, kwargs: Mapping[str, Any], lock: Any, key: str) -> type:
    """Import ``target`` for ``slot_name`` and check ``kwargs``; failures name the file and key."""
    trusted = lock.granted if lock else ()
    where = lock.path if lock else None
    try:
        cls = import_target(
            target, trusted, where=where, key=f"{key}.target", semantics=SPECS[slot_name].semantics
        )
    except (LockFormatError, TargetNotAllowed):
        raise
    except ImportError as exc:
        missing = getattr(exc, "name", None) or target.split(".")[0]
        problem = f"slot {slot_name}: cannot import {target!r}: {exc}"
        raise _not_installed(problem, missing, where, key) from None
    # a module running its command line must not end the caller; one that raises is broken
    except (SystemExit, Exception) as exc:
        raise import_failure(slot_name, target, exc, where, key) from None
    check_kwargs(cls, kwargs, where=where, key=f"{key}.kwargs")
    entry = lock.slots.get(slot_name) if lock else None
    twin = key.endswith(".twin")
    wrong = computation_problem(entry, target, kwargs, cls, twin=twin) if entry else None
    if wrong:  # what the imported class computes (a subclass inherits its base's forward)
        raise TargetNotAllowed(
            f"slot {slot_name}: {wrong}: the model's maths would change",
            path=where,
            key=f"{key}.target",
            fix=computation_fix(twin),
        )
    return cls


def import_failure(
    slot_name: str, target: str, exc: BaseException, where: str | None, key: str
) -> KernelUnavailable:
    """A library that exits or raises while importing: unavailable (exit 3), never fatal."""
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


# ---- what is known without importing: the file system, package metadata, the registry --------
def locate(module: str) -> bool | None:
    """Is ``module`` on the search path? True / False where the file system says, None where
    only importing could tell. No package's code runs (``find_spec("a.b")`` would import ``a``)."""
    parts = module.split(".")
    try:  # a top-level name has no parent to import: only the finders run (editable installs' too)
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError, OSError):
        return None
    if spec is None:
        return False
    for i in range(1, len(parts)):
        locations = spec.submodule_search_locations
        if not locations:
            return None  # a module, not a package, or one whose path is built on import
        try:
            spec = importlib.machinery.PathFinder.find_spec(
                ".".join(parts[: i + 1]), list(locations)
            )
        except (ImportError, ValueError, OSError):
            return None
        if spec is None:
            return None
    return True


def requirement_problems(slot: Any) -> list[Difference]:
    """A slot's requirements this machine does not satisfy (no import)."""
    problems = []
    versions = library_versions(req.name for req in slot.requires)
    for req in slot.requires:
        field = f"slots.{slot.name}.requires.{req.name}"
        version, where = versions[req.name], locate(req.module) if req.module else None
        if version is None and where:
            version = "unknown"  # importable but not installed as a distribution (a source tree)
        if version is None:
            problems.append(Difference(field, req.specifier or "any", "not installed", "specifier"))
        elif where is False:  # the metadata is there, the module's files are not (half removed)
            found = (
                f"{version} per its metadata, but module {req.module!r} is not on the search path"
            )
            problems.append(Difference(field, req.specifier or "any", found, "specifier"))
        elif req.specifier and version != "unknown" and not in_spec(req.specifier, version):
            problems.append(Difference(field, req.specifier, version, "specifier"))
    problems.extend(flash_generation_problems(slot))
    return problems


# anemoi's FlashAttentionWrapper imports the first that imports: (generation, module, class)
FLASH_GENERATIONS = (
    (4, "flash_attn.cute", "kernel_lock.attention.FlashAttention4"),
    (3, "flash_attn_interface", "kernel_lock.attention.FlashAttention3"),
    (2, "flash_attn", "kernel_lock.attention.FlashAttention2"),
)


def anemoi_flash_generation() -> int | None:
    """The flash-attn generation anemoi's import order picks here (None: none)."""
    return next((generation for generation, module, _ in FLASH_GENERATIONS if locate(module)), None)


def flash_generation_problems(slot: Any) -> list[Difference]:
    """A locked flash-attn N where anemoi would import another generation first."""
    locked = next((g for g, _, target in FLASH_GENERATIONS if target == slot.target), None)
    if locked is None:
        return []
    here = anemoi_flash_generation()
    if here is None or here == locked:
        return []  # not installed: the requirement says so
    module = next(m for g, m, _ in FLASH_GENERATIONS if g == here)
    return [
        Difference(
            f"slots.{slot.name}.target",
            f"flash-attn {locked} ({slot.target})",
            f"flash-attn {here}: {module} is installed here, and anemoi-models imports v4, then "
            f"v3, then v2, so its flash_attention would run v{here}",
            "exact",
        )
    ]


def unusable(
    slot: Any, current: Mapping[str, Any], mode: str = "inference", lock_mode: str = "training"
) -> list[Difference]:
    """The one usability rule of a slot (``verify``, the warm check, ``factory``): why ``slot``
    cannot run on ``current`` in ``mode`` (mode, requirements, devices); nothing is imported."""
    problems = []
    if mode == "training" and lock_mode == "inference":
        why = "training asked for (training never runs on the substitutions of a derived lock)"
        problems.append(Difference("mode", "inference", why, "mode"))
    problems += requirement_problems(slot)
    here = current.get("device-type")
    if slot.devices and here not in slot.devices:
        field = f"slots.{slot.name}.devices"
        problems.append(Difference(field, ", ".join(slot.devices), here, "devices"))
    return problems


def unusable_reason(slot: Any, current: Mapping[str, Any]) -> str | None:
    """:func:`unusable` in inference mode, as one sentence (None: usable)."""
    problems = unusable(slot, current)
    if not problems:
        return None
    return "; ".join(
        f"it runs on {p.expected}, this machine's device is {p.found}"
        if p.rule == "devices"
        else f"{p.field.rsplit('.', 1)[-1]} {p.found} (needs {p.expected})"
        for p in problems
    )


def static_problem(
    slot: str,
    target: str,
    kwargs: Mapping[str, Any],
    torch_version: str,
    where: str | None,
    key: str,
) -> str | None:
    """Decide ``target`` for ``slot`` as :func:`build` would, without importing:
    raises what the import would; None when it would build; else why only importing can tell."""
    facts = target_facts(target)
    if facts is None:
        return f"{target!r} is not a class the registry or torch.nn's table declares"
    name = canonical_target(target)
    if (
        name.split(".")[0] in ("torch", "kernel_lock")
        and release(torch_version)[:2] < TORCH_FACTS_SINCE
    ):
        return (
            f"torch {torch_version or '(version unknown)'} is not one the table of "
            "torch.nn's classes holds for"
        )
    semantics = SPECS[slot].semantics
    if facts.semantics != semantics:
        raise _other_maths(target, facts.semantics, semantics, where, f"{key}.target")
    for kw in kwargs:
        if kw in facts.params:
            continue
        if not facts.complete:
            return f"keyword argument {kw!r} is not one the registry declares for {target!r}"
        raise _unknown_kwarg(name, kw, sorted(facts.params), where, f"{key}.kwargs.{kw}")
    module = target.rpartition(".")[0]
    found = locate(module)
    if found is False:
        top = module.split(".")[0]
        problem = f"slot {slot}: cannot import {target!r}: module {top!r} is not on the search path"
        raise _not_installed(problem, top, where, key)
    if found is None:
        return f"module {module!r} can only be found by importing its parent package"
    return None
