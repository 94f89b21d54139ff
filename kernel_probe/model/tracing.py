"""``trace(spec)``: a model's call sites, found in a child process (no torch here)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernel_lock.model import Model, Site, Unreached
from kernel_lock.schema import Context
from kernel_lock.slots import PRECISIONS
from kernel_lock.tables import ReadError, from_dict
from kernel_probe.errors import InputFileError, ProbeError, UsageError
from kernel_probe.isolation.child import ChildResult, child_environment, clip, run_function
from kernel_probe.model.spec import ModelSpec, parse_spec

__all__ = ["DEFAULT_TIMEOUT", "Traced", "failure", "trace", "trace_with_notes"]

log = logging.getLogger("kernel_probe.model")

DEFAULT_TIMEOUT = 600.0  # seconds for the child: import, build, one forward and backward
CHILD = "kernel_probe.model.child"
USER_CODE = "ModelCodeError"  # what the child raises where the model's own code failed


@dataclass(frozen=True)
class Traced:
    """A trace and what it noted (the meta device could not run the model, and why)."""

    model: Model
    notes: tuple[str, ...] = ()


def failure(
    spec: ModelSpec,
    result: ChildResult,
    timeout: float,
    done: tuple[str, str] = ("trace", "tracing"),
) -> ProbeError:
    """The error for a child that gave no answer (``done``: what it gives, what it does): the
    model's code (exit 5) or the child (1)."""
    name = f"model {spec.text}"
    if result.status == "error" and result.raised.get("raised") == USER_CODE:
        fix = "fix the model's code (it runs as `python -c 'from <module> import <callable>; ...'`)"
        return InputFileError(f"{name}: {result.raised.get('message', '')}", key="model", fix=fix)
    if result.status == "timeout":
        return ProbeError(
            f"{name}: no {done[0]} within {timeout:g} s (the child was killed)",
            key="model",
            fix="check that building the model and one forward end; pass a longer timeout",
        )
    tail = clip(result.stderr, 600)
    detail = f"{result.reason}" + (f"\n{tail}" if tail and result.status == "crashed" else "")
    return ProbeError(
        f"{name}: the child {done[1]} it failed: {detail}",
        key="model",
        fix="run the model's callable in Python alone to see its own error; --debug for more",
    )


def _model(spec: ModelSpec, value: object) -> Traced:
    """The child's answer, read by the lock's own typed reader."""
    ctx = Context(None, (), False)
    try:
        if not isinstance(value, dict):
            raise ReadError(f"expected an object, got {type(value).__name__}")
        sites = tuple(from_dict(Site, ctx, d) for d in value.get("sites", []))
        gone = tuple(from_dict(Unreached, ctx, d) for d in value.get("unreached", []))
    except (ReadError, TypeError) as exc:
        raise ProbeError(f"model {spec.text}: the trace's answer is not readable: {exc}") from None
    notes = tuple(str(n) for n in value.get("notes", []))
    return Traced(Model.of(spec.text, sites, gone, traced=str(value.get("traced", ""))), notes)


def trace_with_notes(
    spec: str,
    *,
    precision: str = "32-true",
    trust: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT,
) -> Traced:
    """Every call site of every slot in one forward and backward of the model ``spec`` names
    (``path/to/file.py:callable``, ``package.module:callable``, ``anemoi:CONFIG``), traced in a
    child process under ``precision``, with what the trace noted. :class:`UsageError` (exit 2) for a
    bad spec; :class:`InputFileError` (exit 5) where the model's code fails; :class:`ProbeError`
    (exit 1) where the child hangs past ``timeout`` seconds or dies."""
    parsed = parse_spec(spec)
    if precision not in PRECISIONS:
        raise UsageError(
            f"precision {precision!r} is not one kernel-probe knows",
            key="precision",
            fix=f"use one of {', '.join(PRECISIONS)}",
        )
    request = {"spec": parsed.to_json(), "precision": precision, "trust": list(trust)}
    result = run_function(CHILD, "trace_model", request, timeout=timeout, env=child_environment())
    if not result.ok:
        raise failure(parsed, result, timeout)
    traced = _model(parsed, result.value)
    for note in traced.notes:
        log.info("model %s: %s", parsed.text, note)
    return traced


def trace(spec: str, **options: Any) -> Model:
    """The model of :func:`trace_with_notes` (its options: precision, trust, timeout)."""
    return trace_with_notes(spec, **options).model
