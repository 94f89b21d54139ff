"""What can be known about a slot's implementation without importing it: the file system and the
registry.

``locate`` finds a module on the search path without running any package's code;
``requirement_problems`` compares a slot's requirements with the installed distributions;
``static_problem`` decides a target as an import would, from ``registry.target_facts``, or says why
only an import can tell. The job-start check (``kernel_lock.resolve.confirm_targets``) and the
inference resolver use them, and so does ``kernel_lock.launch.before_sealing``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import Difference, KernelUnavailable, LockFormatError, TargetNotAllowed
from ..format.slots import SLOT_SEMANTICS
from .importing import IN_INFERENCE_MODE

if TYPE_CHECKING:
    from ..format.schema import Slot

__all__ = [
    "FLASH_GENERATIONS",
    "anemoi_flash_generation",
    "flash_generation_problems",
    "locate",
    "requirement_problems",
    "static_problem",
    "unusable_reason",
]


def locate(module: str) -> bool | None:
    """Is ``module`` on the search path? True / False where the file system says so, None where only
    importing could tell. No package's code runs: the top-level package is looked up by the import
    system's finders and each submodule by ``PathFinder`` within its parent's ``__path__`` as found
    on disk (``importlib.util.find_spec("a.b")`` would import ``a``). A package that builds its
    ``__path__`` when imported (a legacy namespace package, a lazy loader) may hold a submodule this
    cannot see: a submodule not found is None (unknown), never False; only a missing top-level
    package is False.
    """
    import importlib.machinery
    import importlib.util

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


def requirement_problems(slot: Slot) -> list[Difference]:
    """Requirements of a slot that this machine does not satisfy (no import; metadata only)."""
    from importlib import metadata

    from ..format.versions import in_spec

    problems = []
    for req in slot.requires:
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            version = None
        where = locate(req.module) if req.module else None
        if version is None and where:
            version = (
                "unknown"  # importable but not installed as a distribution (e.g. a source tree)
            )
        if version is None:
            problems.append(
                Difference(
                    f"slots.{slot.name}.requires.{req.name}",
                    req.specifier or "any",
                    "not installed",
                    "specifier",
                )
            )
            continue
        # the metadata is there, the module's files are not (a half-removed install)
        if where is False:
            problems.append(
                Difference(
                    f"slots.{slot.name}.requires.{req.name}",
                    req.specifier or "any",
                    f"{version} per its metadata, but module {req.module!r} is not on the "
                    "search path",
                    "specifier",
                )
            )
            continue
        if req.specifier and version != "unknown" and not in_spec(req.specifier, version):
            problems.append(
                Difference(
                    f"slots.{slot.name}.requires.{req.name}", req.specifier, version, "specifier"
                )
            )
    problems.extend(flash_generation_problems(slot))
    return problems


# anemoi-models' FlashAttentionWrapper imports the first of these that imports, whatever the lock
# chose: (generation, module, the kernel_lock.attention class that calls it as anemoi does)
FLASH_GENERATIONS = (
    (4, "flash_attn.cute", "kernel_lock.attention.FlashAttention4"),
    (3, "flash_attn_interface", "kernel_lock.attention.FlashAttention3"),
    (2, "flash_attn", "kernel_lock.attention.FlashAttention2"),
)


def anemoi_flash_generation() -> int | None:
    """The flash-attn generation anemoi's import order (v4, v3, v2) picks here, from the file system
    (None: none is installed)."""
    for generation, module, _ in FLASH_GENERATIONS:
        if locate(module):
            return generation
    return None


def flash_generation_problems(slot: Slot) -> list[Difference]:
    """A lock that chose flash-attn generation N, on a machine where anemoi would import another
    first (v4 installed beside the locked v2): anemoi would run kernels the lock never checked."""
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


def unusable_reason(slot: Slot, current: Mapping[str, Any]) -> str | None:
    """Why ``slot``'s pinned implementation cannot run on ``current`` (metadata only), or None."""
    problems = requirement_problems(slot)
    if problems:
        return "; ".join(
            f"{p.field.rsplit('.', 1)[-1]} {p.found} (needs {p.expected})" for p in problems
        )
    if slot.devices and current.get("device-type") not in slot.devices:
        return (
            f"it runs on {', '.join(slot.devices)}, this machine's device is "
            f"{current.get('device-type')}"
        )
    return None


def static_problem(
    slot: str,
    target: str,
    kwargs: Mapping[str, Any],
    torch_version: str,
    where: str | None,
    key: str,
) -> str | None:
    """Decide ``target`` for ``slot`` as ``importing.build`` would, from ``registry.target_facts``
    and the file system: raises the error the import would raise; None when it would build; the
    reason when only importing can tell (a target outside the tables, a kwarg the registry does not
    declare, an unknown or too old torch, a module found only by importing its parent)."""
    from ..format.slots import TORCH_FACTS_SINCE, canonical_target
    from ..format.versions import release
    from . import registry

    facts = registry.target_facts(target)
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
    semantics = SLOT_SEMANTICS[slot]
    if facts.semantics != semantics:
        raise TargetNotAllowed(
            f"target {target!r} computes {facts.semantics}, not {semantics}: the slot would "
            "change the model's maths",
            path=where,
            key=f"{key}.target",
            fix="pin a class of the slot's semantics (an RMSNorm is not a LayerNorm), or move "
            "the entry to its slot",
        )
    for kw in kwargs:
        if kw in facts.params:
            continue
        if not facts.complete:
            return f"keyword argument {kw!r} is not one the registry declares for {target!r}"
        raise LockFormatError(
            f"{name} does not accept the keyword argument {kw!r}",
            path=where,
            key=f"{key}.kwargs.{kw}",
            fix=f"remove it; accepted: {', '.join(sorted(facts.params))}",
        )
    module = target.rpartition(".")[0]
    found = locate(module)
    if found is False:
        raise KernelUnavailable(
            f"slot {slot}: cannot import {target!r}: module {module.split('.')[0]!r} is not on "
            "the search path",
            path=where,
            key=key,
            fix=f"install the library that provides module {module.split('.')[0]!r}, re-run "
            "`kernel-probe` to choose what this machine can run, or resolve it "
            f"{IN_INFERENCE_MODE} to use the verified torch.nn twin",
        )
    if found is None:
        return f"module {module!r} can only be found by importing its parent package"
    return None
