"""The Linear slot, and the BLAS library under it: its names, what the lock records
(``slots.Linear.blas``), and applying it in a process.

On CUDA a Linear's GEMMs run in cuBLAS or cuBLASLt; on ROCm in rocBLAS (torch's ``"hipblas"``) or
hipBLASLt, chosen process-wide by ``torch.backends.cuda.preferred_blas_library`` (its start value
from ``TORCH_BLAS_PREFER_CUBLASLT`` / ``TORCH_BLAS_PREFER_HIPBLASLT`` and, on ROCm, the GPU arch).
The libraries round differently, and it matters: on LUMI (MI250X) anemoi's training loss diverged
with torch newer than 2.3 and not on CUDA (anemoi-core #560, #1041, #1042). So the probe checks and
times the Linear under each library the build offers, and the lock records the one chosen
(:class:`Blas`) and the one torch used by itself on the probing machine (``build_default``).

When the Linear slot resolves, :func:`apply` sets the recorded library process-wide and logs it. A
process that chose another library itself (neither the recorded one nor the build's default the
probe saw) gets a :class:`LockMismatch`, never a silent override. torch is imported by
:func:`apply` only.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import Difference, LockMismatch
from ..tables import EMPTY, ReadError, Table, from_dict, get, one_of, toml_key
from .base import SlotKey, SlotSpec, TargetFacts, torch_aliases

__all__ = [
    "ALL",
    "CONTROL",
    "ENV_VARS",
    "LIBRARIES",
    "LINEAR",
    "TORCH_NAME",
    "Blas",
    "apply",
    "current",
    "device_of",
    "env_choice",
    "environment_differences",
    "in_process_differences",
    "job_start_differences",
    "mismatch_fix",
    "name_of",
    "own_choice",
    "select",
]

log = logging.getLogger("kernel_lock")

# device type -> its libraries, the classic one first
LIBRARIES: Mapping[str, tuple[str, str]] = {
    "cuda": ("cublas", "cublaslt"),
    "rocm": ("rocblas", "hipblaslt"),
}
ALL = tuple(name for pair in LIBRARIES.values() for name in pair)
# our name -> the value torch.backends.cuda.preferred_blas_library takes
TORCH_NAME = {
    "cublas": "cublas",
    "cublaslt": "cublaslt",
    "rocblas": "hipblas",
    "hipblaslt": "hipblaslt",
}
# torch's _BlasBackend member -> index into LIBRARIES[device] (Ck and Default are not recorded
# libraries)
_BACKEND_INDEX = {"Cublas": 0, "Cublaslt": 1}
# torch reads these at start-up, in this order, on both platforms (ATen/Context.h): true = the Lt
# library
ENV_VARS = ("TORCH_BLAS_PREFER_CUBLASLT", "TORCH_BLAS_PREFER_HIPBLASLT")
CONTROL = "torch.backends.cuda.preferred_blas_library"
_TRUE = {"1", "on", "yes", "true", "y"}
_FALSE = {"0", "off", "no", "false", "n"}


def _build_default(ctx: Any, d: Mapping[str, Any], key: str, so_far: Mapping[str, Any]) -> str:
    """The build's default: a library of the same vendor as the recorded one ('' when not
    recorded)."""
    default: str = one_of(("", *ALL), default="")(ctx, d, key, so_far)
    library = so_far["library"]
    if default and device_of(default) != device_of(library):
        raise ReadError(
            f"{default!r} is a {device_of(default)} library, {library!r} a "
            f"{device_of(library)} one",
            key,
            fix="both name libraries of the same GPU vendor (cublas/cublaslt, or "
            "rocblas/hipblaslt)",
        )
    return default


@dataclass(frozen=True, kw_only=True, slots=True)
class Blas(Table):
    """``slots.Linear.blas`` of a lock: the library the Linear was checked and timed under, and the
    one torch used by itself on the probing machine."""

    library: str = field(metadata=toml_key("library", one_of(ALL)))
    build_default: str = field(
        default="", metadata=toml_key("build-default", _build_default, omit=EMPTY)
    )


def device_of(library: str) -> str:
    """``cuda`` or ``rocm``: the device type a library name belongs to ('' for an unknown name)."""
    return next((device for device, pair in LIBRARIES.items() if library in pair), "")


def name_of(backend: Any, device: str) -> str:
    """Our name for torch's preferred backend (an enum such as ``_BlasBackend.Cublaslt``) on
    ``device``; torch's own member name, lower-cased, for one that is not a recorded library
    (``ck``, ``default``)."""
    member = str(getattr(backend, "name", backend)).rsplit(".", 1)[-1]
    index = _BACKEND_INDEX.get(member)
    if index is None or device not in LIBRARIES:
        return member.lower()
    return LIBRARIES[device][index]


def env_choice(device: str, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(library, ``VAR=value``) that the environment asks torch to start with on ``device``, or
    None."""
    environ = os.environ if environ is None else environ
    if device not in LIBRARIES:
        return None
    for var in ENV_VARS:
        value = environ.get(var)
        if value is None:
            continue
        low = value.strip().lower()
        if low in _TRUE:
            return LIBRARIES[device][1], f"{var}={value}"
        if low in _FALSE:
            return LIBRARIES[device][0], f"{var}={value}"
    return None


def current(torch: Any, device: str) -> str:
    """The library torch uses in this process now, by our name."""
    return name_of(torch.backends.cuda.preferred_blas_library(), device)


def select(torch: Any, library: str) -> str:
    """Set ``library`` process-wide; the library in effect afterwards (another one when this build
    does not offer it: torch keeps its choice, e.g. hipBLASLt on an arch it does not support)."""
    device = device_of(library)
    try:
        torch.backends.cuda.preferred_blas_library(TORCH_NAME[library])
    except Exception:  # an older torch without the setting, or a build without the library
        pass
    return current(torch, device)


def own_choice(record: Blas, found: str) -> bool:
    """Is ``found`` a library the process chose itself: neither the one the lock records nor the
    build's default the probe saw?"""
    return found not in (record.library, record.build_default or record.library)


def environment_differences(
    record: Blas, device: str, environ: Mapping[str, str] | None = None
) -> list[Difference]:
    """Job start, without torch: an environment that makes torch start with a library of its own
    choice."""
    asked = env_choice(device, environ)
    if asked is None or not own_choice(record, asked[0]):
        return []
    return [
        Difference(
            "slots.Linear.blas.library",
            record.library,
            f"{asked[0]} (asked for by {asked[1]})",
            "blas",
        )
    ]


_APPLIED: dict[str, str] = {}  # device -> the library kernel_lock set in this process


def apply(record: Blas, device: str, *, path: str | None = None) -> str:
    """Make ``record.library`` the BLAS library of this process (the Linear slot resolves); logged.

    Raises :class:`LockMismatch` when the process (or its environment) chose another library itself,
    or when this build does not offer the recorded one. Returns the library in effect."""
    if device_of(record.library) != device:
        log.info(
            "kernel_lock: the lock's Linear BLAS library %s is for %s; this process runs on "
            "%s: not applied",
            record.library,
            device_of(record.library) or "another device",
            device,
        )
        return ""
    import torch

    found = current(torch, device)
    problems = environment_differences(record, device)
    if found != _APPLIED.get(device) and own_choice(record, found):
        problems.append(
            Difference(
                "slots.Linear.blas.library",
                record.library,
                f"{found} (chosen by this process: {CONTROL}() returns "
                f"{TORCH_NAME.get(found, found)!r})",
                "blas",
            )
        )
    if problems:
        raise LockMismatch(problems, path=path, fix=mismatch_fix(record))
    if found == record.library:
        log.info("kernel_lock: Linear BLAS library %s (as the lock records) is in effect", found)
        _APPLIED[device] = found
        return found
    now = select(torch, record.library)
    if now != record.library:
        raise LockMismatch(
            [
                Difference(
                    "slots.Linear.blas.library",
                    record.library,
                    f"{now} (this build does not offer it)",
                    "blas",
                )
            ],
            path=path,
            fix="re-run `kernel-probe --force` with this torch build, which checks and times "
            "the libraries it offers",
        )
    _APPLIED[device] = now
    log.warning(
        "kernel_lock: Linear BLAS library set to %s process-wide (%s(%r)), as the lock "
        "records; it replaces %s%s",
        now,
        CONTROL,
        TORCH_NAME[now],
        found,
        " (the build's default)" if found == record.build_default else "",
    )
    return now


def mismatch_fix(record: Blas) -> str:
    """The fix for a process whose own BLAS choice differs from the one the lock records."""
    return (
        f"the lock's Linear was checked and timed under {record.library}: remove the process's "
        f"own choice (anemoi's training.preferred_blas_backend, a call to {CONTROL}, "
        f"{' / '.join(ENV_VARS)}), or re-probe under it (`kernel-probe --force --pin "
        "Linear=torch.linear.<library>`) so that the lock records it"
    )


def job_start_differences(record: Blas, device: str) -> list[Difference]:
    """``verify`` at job start: the environment's choice (no torch needed), and this process's own
    choice where it has imported torch already."""
    if device_of(record.library) != device:
        return []  # another device type: the fingerprint says so (device-type), nothing to add here
    return environment_differences(record, device) + in_process_differences(record, device)


def in_process_differences(record: Blas, device: str) -> list[Difference]:
    """Job start in a process that has imported torch already: the library it uses now, if it is its
    own choice."""
    torch = sys.modules.get("torch")
    if torch is None or device_of(record.library) != device:
        return []
    try:
        found = current(torch, device)
    except Exception:
        return []
    if found == _APPLIED.get(device) or not own_choice(record, found):
        return []
    return [
        Difference(
            "slots.Linear.blas.library", record.library, f"{found} (chosen by this process)", "blas"
        )
    ]


def _read_blas(ctx: Any, d: Mapping[str, Any], key: str) -> Blas | None:
    return ctx.object(d, key, lambda b: from_dict(Blas, ctx, b))


def _refuse_blas(slot: str, d: Mapping[str, Any]) -> None:
    if get(d, "blas", dict) is not None:
        raise ReadError(
            f"only the Linear slot records a BLAS library, not {slot}", "blas", fix="remove it"
        )


def _job_start(slot: Any, current: Mapping[str, Any]) -> list[Difference]:
    record = slot.extra.get("blas")
    return (
        [] if record is None else job_start_differences(record, str(current.get("device-type", "")))
    )


def _on_resolve(slot: Any, path: str | None) -> None:
    record = slot.extra.get("blas")
    if record is not None:
        from .. import torchless as here  # reads this machine's facts: only when a Linear resolves

        apply(record, str(here.for_check(("device-type",)).get("device-type", "")), path=path)


def _twin_args(
    module: Any, state: Mapping[str, Any], accepted: set[str]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    weight = state["weight"]
    bias = "bias" in state and state["bias"] is not None
    return (int(weight.shape[1]), int(weight.shape[0])), {"bias": bias}


def _sample_width(twin: Any) -> int:
    return int(next(iter(twin.parameters())).shape[-1])


_LINEAR = frozenset(("in_features", "out_features", "bias", "device", "dtype"))

LINEAR = SlotSpec(
    name="Linear",
    semantics="linear",
    default_target="torch.nn.Linear",
    canonical={"bias": True},
    call_args=("$in_features", "$out_features"),
    call_kwargs={"bias": "$bias"},
    known_targets={
        "torch.nn.Linear": TargetFacts("linear", _LINEAR, True),
        "kernel_lock.adapters.CompiledLinear": TargetFacts("linear", _LINEAR, True),
    },
    computed_by=("torch.nn.Linear",),
    aliases=torch_aliases("linear", "Linear"),
    # on a GPU: the BLAS library it was checked and timed under
    keys=(
        SlotKey(
            "blas",
            _read_blas,
            _refuse_blas,
            after="devices",
            write=lambda v: v.to_dict(),
            omit=lambda v: v is None,
        ),
    ),
    job_start=_job_start,
    on_resolve=_on_resolve,
    twin_args=_twin_args,
    sample_width=_sample_width,
)
