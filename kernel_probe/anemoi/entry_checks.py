"""Checks of one ``layer_kernels`` entry against anemoi: the key, the import, the signature, the semantics.

:func:`check_entry` imports the entry's target (and so torch), so check-config runs it in a child
process (:func:`judge_entries` starts it; :func:`check_entries` is the child's entry point, JSON in
and out): a library that crashes or exits on import cannot take the checker with it. anemoi's call
convention itself (``CALLS``, ``DIMENSIONS``, :func:`~kernel_lock.anemoi.convention_problems`) is the
runtime's, which the export follows too.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from kernel_lock.adapter_names import adapter_for
from kernel_lock.anemoi import CALLS, DIMENSIONS, convention_problems, locate
from kernel_probe.anemoi.blocks import KEYS, Finding
from kernel_probe.isolation.child import run_function
from kernel_probe.isolation.protocol import EntryCheckReply, EntryCheckRequest

NORM_KEYS = ("LayerNorm", "QueryNorm", "KeyNorm")
DEFAULT_TIMEOUT = 120.0


def norm_family(cls: Any) -> str | None:
    """``rms_norm``, ``layer_norm``, ``conditional`` or None, from the class and its bases.

    RMSNorm is looked for first, over the whole MRO: an adapter subclassing LigerRMSNorm is one.
    """
    if not isinstance(cls, type):
        return None
    names = [c.__name__.lower() for c in cls.__mro__]
    try:
        import torch

        if issubclass(cls, torch.nn.RMSNorm):
            return "rms_norm"
    except (ImportError, AttributeError):
        pass
    if any("rmsnorm" in n for n in names):
        return "rms_norm"
    if any("conditional" in n and "norm" in n for n in names):
        return "conditional"
    if any("layernorm" in n for n in names):
        return "layer_norm"
    return None


def key_suggestion(key: str) -> str:
    """The hint for an unknown key: the close match, and the keys anemoi knows."""
    close = [k for k in KEYS if k.lower() == str(key).lower()] or difflib.get_close_matches(str(key), KEYS, n=1)
    hint = f"did you mean {close[0]!r}? keys are case-sensitive; " if close else ""
    return f"{hint}anemoi knows {', '.join(KEYS)}"


def check_entry(
    key: str, entry: Any, where: str, *, allow_semantics_change: bool = False
) -> tuple[list[Finding], dict[str, Any]]:
    """Findings about one ``layer_kernels`` entry on this machine, and facts for later comparisons
    (``target``, ``imported``, ``family``, ``defaults``: the constructor's keyword defaults).

    Imports the target (and so torch): run it where a crashing import cannot hurt (kernel-probe
    check-config runs it in a child process).
    """
    findings: list[Finding] = []
    facts: dict[str, Any] = {"target": None, "imported": False, "family": None, "defaults": {}}

    def add(severity: str, kind: str, problem: str, fix: str = "") -> None:
        findings.append(Finding(severity, kind, where, problem, fix))

    if key not in KEYS:
        add(
            "error",
            "key",
            f"unknown key {key!r}: anemoi silently ignores it, so this entry has no effect",
            key_suggestion(key),
        )
        return findings, facts
    if not isinstance(entry, Mapping):
        add(
            "error",
            "entry",
            f"expected a mapping like {{_target_: torch.nn.{key if key != 'Activation' else 'GELU'}}}, "
            f"got {type(entry).__name__} {entry!r:.60}",
        )
        return findings, facts
    target = entry.get("_target_")
    if not isinstance(target, str) or not target:
        add(
            "error", "entry", "no _target_: anemoi fails with KeyError: '_target_'", "add `_target_: dotted.path.Class`"
        )
        return findings, facts
    facts["target"] = target
    for option in entry:
        if isinstance(option, str) and option.startswith("_") and option not in ("_target_", "_partial_"):
            add(
                "warning",
                "entry",
                f"Hydra option {option!r}: anemoi instantiates entries as partials; "
                "positional `_args_` collide with the sizes anemoi passes",
                "remove it",
            )
    kwargs = {k: v for k, v in entry.items() if not (isinstance(k, str) and k.startswith("_"))}
    dims = [k for k in kwargs if k in DIMENSIONS[key]]
    for d in dims:
        add(
            "warning",
            "dimension",
            f"{d!r} is pinned here, but anemoi passes the size at the call site: a keyword "
            f"call overrides it and a positional call {CALLS[key][0][0]} fails with 'multiple values'",
            f"remove {d!r}",
        )
    try:
        cls = locate(target)
    except (Exception, SystemExit) as exc:  # ImportError, or whatever a module raises (or exits with) on import
        add(
            "error",
            "import",
            f"{target!r} does not import here: importing {target.rpartition('.')[0]!r} raised "
            f"{type(exc).__name__}: {exc}",
            "install the library that provides it, or fix the dotted path (anemoi would raise an empty "
            "InstantiationException and log the reason at INFO level)",
        )
        return findings, facts
    facts["imported"] = True
    import torch

    if not callable(cls):
        add("error", "entry", f"{target!r} is a {type(cls).__name__}, not a class anemoi can call")
        return findings, facts
    if isinstance(cls, type) and not issubclass(cls, torch.nn.Module):
        add("error", "entry", f"{target!r} is not a torch.nn.Module subclass")
    facts["family"] = norm_family(cls)
    facts["defaults"] = constructor_defaults(cls)
    for problem in convention_problems(cls, key, {k: v for k, v in kwargs.items() if k not in dims}):
        adapter = adapter_for(target)
        add(
            "error",
            "signature",
            f"{target} does not fit anemoi's call convention: {problem}",
            f"use `_target_: {adapter}` (same class and state dict, anemoi's signature)"
            if adapter
            else "use a class whose constructor takes anemoi's arguments, or a thin subclass adapting it",
        )
    family = facts["family"]
    if key in NORM_KEYS and family == "rms_norm":
        add(
            "warning" if allow_semantics_change else "error",
            "semantics",
            f"semantics change: {target} is an RMSNorm under the {key} key: it does not subtract the mean and "
            "has no bias, so the model computes something else and its state dict changes",
            "use a LayerNorm implementation; if the change is deliberate, pass --allow-semantics-change",
        )
    if key == "Linear" and family is not None:
        add("error", "semantics", f"semantics change: {target} is a norm ({family}) under the Linear key")
    if key == "Activation" and "GLU" in getattr(cls, "__name__", "").upper():
        add(
            "error",
            "semantics",
            f"{target} is a GLU-family activation: anemoi-models rejects it in layer_kernels.Activation (ValueError)",
            "select GLU through the processor's mlp_implementation",
        )
    return findings, facts


def constructor_defaults(cls: Any) -> dict[str, Any]:
    """The keyword defaults a class is built with. A constructor that only passes ``*args, **kwargs``
    on (anemoi's AutocastLayerNorm) has the defaults of the first base that names its parameters."""
    for klass in getattr(cls, "__mro__", (cls,)):
        try:
            params = inspect.signature(klass).parameters
        except (TypeError, ValueError):
            continue
        if any(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params.values()):
            return {
                n: p.default
                for n, p in params.items()
                if p.default is not inspect.Parameter.empty and _plain(p.default)
            }
    return {}


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def check_entries(requests: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """JSON in, JSON out: :func:`check_entry` for each ``{key, entry, where, allow_semantics_change}``.

    The child-process entry point of ``kernel-probe check-config``.
    """
    out = []
    for r in requests:
        findings, facts = check_entry(
            r["key"], r["entry"], r["where"], allow_semantics_change=bool(r.get("allow_semantics_change"))
        )
        out.append({"findings": [f.to_json() for f in findings], "facts": facts})
    return out


def judge_entries(requests: Sequence[EntryCheckRequest], timeout: float = DEFAULT_TIMEOUT) -> list[EntryCheckReply]:
    """:func:`check_entries` in a child; if that child dies, one child per entry says which."""
    if not requests:
        return []
    result = run_function(__name__, "check_entries", [r.to_json() for r in requests], timeout=timeout)
    if result.ok:
        return [EntryCheckReply.from_json(v) for v in result.value]
    out: list[EntryCheckReply] = []
    for r in requests:
        one = run_function(__name__, "check_entries", [r.to_json()], timeout=timeout)
        if one.ok:
            out.extend(EntryCheckReply.from_json(v) for v in one.value)
            continue
        target = r.entry.get("_target_") if isinstance(r.entry, Mapping) else None
        out.append(
            EntryCheckReply(
                findings=[
                    Finding(
                        "error",
                        "import",
                        r.where,
                        f"importing {target!r} failed: {one.reason}",
                        "run `kernel-probe env` to see which library is broken here",
                    ).to_json()
                ],
                facts={"target": target, "imported": False, "family": None, "defaults": {}},
            )
        )
    return out
