"""``trace(spec)``: a model's call sites, found in a child process (no torch here). The spec,
read here: ``path/to/file.py:callable``, ``package.module:callable``, or ``anemoi:CONFIG`` (an
anemoi training config: a YAML path or a config anemoi-training ships); the callable takes no
required arguments and returns ``(model, args)`` or ``(model, args, kwargs)``."""

from __future__ import annotations

import keyword
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernel_lock.model import Model, Site, Unreached
from kernel_lock.schema import Context
from kernel_lock.slots import PRECISIONS
from kernel_lock.tables import ReadError, from_dict
from kernel_probe.errors import InputFileError, ProbeError, UsageError
from kernel_probe.isolation.child import ChildResult, child_environment, clip, run_function

__all__ = ["ANEMOI", "ANEMOI_BUILDER", "DEFAULT_TIMEOUT", "ModelSpec", "Traced", "failure"]
__all__ += ["parse_spec", "trace", "trace_with_notes"]

log = logging.getLogger("kernel_probe.model")

DEFAULT_TIMEOUT = 600.0  # seconds for the child: import, build, one forward and backward
CHILD = "kernel_probe.model.child"
USER_CODE = "ModelCodeError"  # what the child raises where the model's own code failed


ANEMOI = "anemoi"  # the prefix of an anemoi config's spec
ANEMOI_BUILDER = ("kernel_probe.anemoi.model", "build")  # its child-side builder: build(config)
_FORMS = "path/to/file.py:callable, package.module:callable or anemoi:CONFIG"


@dataclass(frozen=True)
class ModelSpec:
    """A parsed spec: ``kind`` file (``source`` an absolute path), module (a dotted module) or
    anemoi (``source`` the config: an absolute path, or a name anemoi-training ships)."""

    text: str
    kind: str
    source: str
    callable: str

    @property
    def folder(self) -> str | None:
        """A file's folder (on the child's path, so that its sibling imports work)."""
        return os.path.dirname(self.source) if self.kind == "file" else None

    def to_json(self) -> dict[str, Any]:
        """The child's request."""
        return {"text": self.text, "kind": self.kind, "source": self.source, "call": self.callable}


def _bad(spec: str, problem: str, fix: str) -> UsageError:
    return UsageError(f"--model {spec!r}: {problem}", key="model", fix=fix)


def _dotted(name: str) -> bool:
    parts = name.split(".")
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)


def _anemoi(text: str, config: str) -> ModelSpec:
    if not config:
        raise _bad(text, "no config after 'anemoi:'", "name a config: anemoi:path/to/config.yaml")
    is_path = config.endswith((".yaml", ".yml")) or os.sep in config or "/" in config
    if not is_path:
        return ModelSpec(text, ANEMOI, config, ANEMOI_BUILDER[1])
    path = os.path.abspath(os.path.expanduser(config))
    if not os.path.isfile(path):
        fix = "give the path of an existing YAML config, or the name of a config anemoi ships"
        raise _bad(text, f"config {config!r} is not a file", fix)
    return ModelSpec(text, ANEMOI, path, ANEMOI_BUILDER[1])


def parse_spec(text: str) -> ModelSpec:
    """The spec ``text`` as a :class:`ModelSpec`; :class:`UsageError` (exit 2) naming the fix."""
    if not isinstance(text, str) or not text.strip():
        raise _bad(str(text), "empty", f"name the model as {_FORMS}")
    text = text.strip()
    if text.startswith(ANEMOI + ":"):
        return _anemoi(text, text[len(ANEMOI) + 1 :])
    if ":" not in text:
        fix = f"name the callable that builds the model after a colon: {_FORMS}"
        raise _bad(text, "no ':callable'", fix)
    source, name = text.rsplit(":", 1)
    if not _dotted(name):
        fix = (
            "after the colon comes the name of a function (or Class.method) in that file or module"
        )
        raise _bad(text, f"{name!r} is not a Python name", fix)
    looks_like_path = source.endswith(".py") or "/" in source or os.sep in source
    if looks_like_path or os.path.isfile(source):
        path = os.path.abspath(os.path.expanduser(source))
        if not os.path.exists(path):
            raise _bad(text, f"{source!r} does not exist", "give the path of the model's .py file")
        if not os.path.isfile(path) or not path.endswith(".py"):
            fix = "name a .py file (path/to/file.py:callable) or a module (package.module:callable)"
            raise _bad(text, f"{source!r} is not a .py file", fix)
        return ModelSpec(text, "file", path, name)
    if not _dotted(source):
        fix = "a module is named by dots (package.module), a file by its path ending in .py"
        raise _bad(text, f"{source!r} is neither a .py file nor a module name", fix)
    return ModelSpec(text, "module", source, name)


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
