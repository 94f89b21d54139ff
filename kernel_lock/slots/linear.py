"""The Linear slot, and the BLAS library under it (``slots.Linear.blas``, anemoi-core #560): the
lock records the library checked, :func:`apply` sets it, and a process that chose another itself
gets a :class:`LockMismatch`, never a silent override."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import Difference, LockMismatch
from ..tables import EMPTY, ReadError, Table, from_dict, get, one_of, toml_key
from .base import (
    Calls,
    Functional,
    Param,
    SlotKey,
    SlotSpec,
    TargetFacts,
    bound,
    run_with_params,
    torch_aliases,
)

__all__ = ["LIBRARIES", "LINEAR", "Blas", "apply", "device_of", "name_of", "select"]

log = logging.getLogger("kernel_lock")

# device type -> its libraries, the classic one first
LIBRARIES: Mapping[str, tuple[str, str]] = {
    "cuda": ("cublas", "cublaslt"),
    "rocm": ("rocblas", "hipblaslt"),
}
_ALL = tuple(name for pair in LIBRARIES.values() for name in pair)
_TORCH_NAME = {"rocblas": "hipblas"}  # where torch's name for a library is not ours
# torch reads these at start-up, in this order, on both platforms (ATen/Context.h): true = Lt
_ENV_VARS = ("TORCH_BLAS_PREFER_CUBLASLT", "TORCH_BLAS_PREFER_HIPBLASLT")
_CONTROL = "torch.backends.cuda.preferred_blas_library"
_FIELD = "slots.Linear.blas.library"
# how torch reads each of them: 1 = the Lt library, 0 = the classic one
_PREFER = dict.fromkeys(("1", "on", "yes", "true", "y"), 1) | dict.fromkeys(
    ("0", "off", "no", "false", "n"), 0
)


def _build_default(ctx: Any, d: Mapping[str, Any], key: str, so_far: Mapping[str, Any]) -> str:
    """The build's default: a library of the recorded one's vendor ('' when not recorded)."""
    default: str = one_of(("", *_ALL), default="")(ctx, d, key, so_far)
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
    """The library the Linear was checked under, and the one torch used by itself when probing."""

    library: str = field(metadata=toml_key("library", one_of(_ALL)))
    build_default: str = field(
        default="", metadata=toml_key("build-default", _build_default, omit=EMPTY)
    )


def device_of(library: str) -> str:
    """``cuda`` or ``rocm``: the device type a library name belongs to ('' for an unknown name)."""
    return next((device for device, pair in LIBRARIES.items() if library in pair), "")


def name_of(backend: Any, device: str) -> str:
    """Our name for torch's preferred BLAS backend on ``device`` (else torch's, lower-cased)."""
    member = str(getattr(backend, "name", backend)).rsplit(".", 1)[-1]
    index = {"Cublas": 0, "Cublaslt": 1}.get(member)
    return member.lower() if index is None or device not in LIBRARIES else LIBRARIES[device][index]


def _current(torch: Any, device: str) -> str:
    return name_of(torch.backends.cuda.preferred_blas_library(), device)


def select(torch: Any, library: str) -> str:
    """Set ``library`` process-wide; the library in effect afterwards (torch may keep its own)."""
    try:
        torch.backends.cuda.preferred_blas_library(_TORCH_NAME.get(library, library))
    except Exception:  # an older torch without the setting, or a build without the library
        pass
    return _current(torch, device_of(library))


_APPLIED: dict[str, str] = {}  # device -> the library kernel_lock set in this process


def _own_choices(record: Blas, device: str, found: str | None, how: str) -> list[Difference]:
    """Libraries the process chose itself that are neither the recorded one nor the default."""
    chosen = []
    for var in _ENV_VARS:  # the first one set that reads as a boolean, as torch reads them
        index = _PREFER.get(os.environ.get(var, "").strip().lower())
        if index is not None:
            chosen.append((LIBRARIES[device][index], f"asked for by {var}={os.environ[var]}"))
            break
    if found is not None and found != _APPLIED.get(device):
        chosen.append((found, f"chosen by this process{how}"))
    allowed = (record.library, record.build_default or record.library)
    return [
        Difference(_FIELD, record.library, f"{library} ({why})", "blas")
        for library, why in chosen
        if library not in allowed
    ]


def apply(record: Blas, device: str, *, path: str | None = None) -> str:
    """Make ``record.library`` this process's BLAS library (logged); :class:`LockMismatch` when
    the process chose another itself or the build lacks it. Returns the library in effect."""
    if device_of(record.library) != device:
        log.info(
            "kernel_lock: the lock's Linear BLAS library %s is for %s; this process runs on "
            "%s: not applied",
            record.library,
            device_of(record.library) or "another device",
            device,
        )
        return ""
    import torch  # reason: only where a Linear with a recorded library resolves on its GPU

    found = _current(torch, device)
    how = f": {_CONTROL}() returns {_TORCH_NAME.get(found, found)!r}"
    problems = _own_choices(record, device, found, how)
    if problems:
        raise LockMismatch(
            problems,
            path=path,
            fix=f"the lock's Linear was checked and timed under {record.library}: remove the "
            f"process's own choice (anemoi's training.preferred_blas_backend, a call to "
            f"{_CONTROL}, {' / '.join(_ENV_VARS)}), or re-probe under it (`kernel-probe --force "
            "--pin Linear=torch.linear.<library>`) so that the lock records it",
        )
    if found == record.library:
        log.info("kernel_lock: Linear BLAS library %s (as the lock records) is in effect", found)
        _APPLIED[device] = found
        return found
    now = select(torch, record.library)
    if now != record.library:
        raise LockMismatch(
            [Difference(_FIELD, record.library, f"{now} (this build does not offer it)", "blas")],
            path=path,
            fix="re-run `kernel-probe --force` with this torch build, which checks and times "
            "the libraries it offers",
        )
    _APPLIED[device] = now
    log.warning(
        "kernel_lock: Linear BLAS library set to %s process-wide (%s(%r)), as the lock "
        "records; it replaces %s%s",
        now,
        _CONTROL,
        _TORCH_NAME.get(now, now),
        found,
        " (the build's default)" if found == record.build_default else "",
    )
    return now


def _read_blas(ctx: Any, d: Mapping[str, Any], key: str) -> Blas | None:
    return ctx.object(d, key, lambda b: from_dict(Blas, ctx, b))


def _refuse_blas(slot: str, d: Mapping[str, Any]) -> None:
    if get(d, "blas", dict) is not None:
        raise ReadError(
            f"only the Linear slot records a BLAS library, not {slot}", "blas", fix="remove it"
        )


def _job_start(slot: Any, current: Mapping[str, Any]) -> list[Difference]:
    """``verify`` at job start: the environment's and this process's own BLAS choice."""
    record, device = slot.extra.get("blas"), str(current.get("device-type", ""))
    if record is None or device_of(record.library) != device:
        return []
    torch, found = sys.modules.get("torch"), None
    try:
        found = _current(torch, device) if torch is not None else None
    except Exception:
        pass
    return _own_choices(record, device, found, "")


def _on_resolve(slot: Any, path: str | None) -> None:
    record = slot.extra.get("blas")
    if record is not None:
        from .. import torchless  # reason: this machine's facts, read only when a Linear resolves

        apply(record, str(torchless.for_check(("device-type",)).get("device-type", "")), path=path)


def _twin_args(
    module: Any, state: Mapping[str, Any], accepted: set[str]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    weight = state["weight"]
    bias = "bias" in state and state["bias"] is not None
    return (int(weight.shape[1]), int(weight.shape[0])), {"bias": bias}


def _module(module: Any) -> dict[str, Any]:
    """A built Linear's semantics: its sizes and whether it has a bias."""
    return {
        "in_features": int(module.in_features),
        "out_features": int(module.out_features),
        "bias": getattr(module, "bias", None) is not None,
    }


_ARGS = ("input", "weight", "bias")


def _call_semantics(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | str:
    b = bound(args, kwargs, _ARGS, bias=None)
    if b["weight"].dim() != 2:  # a vector weight drops the output's last dimension: no nn.Linear
        return f"a {b['weight'].dim()}-D weight: no Linear computes it"
    out_features, in_features = b["weight"].shape
    return {"in_features": int(in_features), "out_features": int(out_features),
            "bias": b["bias"] is not None}  # fmt: skip


_CALLS = Calls(
    module=_module,
    functions={
        "linear": Functional(
            _call_semantics,
            lambda s: ((s["in_features"], s["out_features"]), {"bias": s["bias"]}),
            run_with_params(_ARGS),
            lambda s: frozenset(("weight", "bias") if s["bias"] else ("weight",)),
            args=_ARGS,
        )
    },
    sizes=frozenset({"in_features", "out_features"}),
)

_LINEAR = frozenset(("in_features", "out_features", "bias", "device", "dtype"))

LINEAR = SlotSpec(
    name="Linear",
    semantics="linear",
    default_target="torch.nn.Linear",
    canonical={"bias": True},
    anemoi_key="Linear",
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
    sample_width=lambda twin: int(next(iter(twin.parameters())).shape[-1]),
    params={"bias": Param(bool)},
    calls=_CALLS,
)
