"""Checks of one ``layer_kernels`` entry against anemoi: the key, the import, the signature, the
semantics.

:func:`check_entry` imports the entry's target (and so torch), so check-config runs it in a child
process (:func:`judge_entries` starts it; :func:`check_entries` is the child's entry point, JSON in
and out): a library that crashes or exits on import cannot take the checker with it. anemoi's call
convention itself (``CALLS``, ``DIMENSIONS``, :func:`~kernel_lock.anemoi.convention_problems`) is
the runtime's, which the export follows too.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from kernel_lock.anemoi import (
    CALLS,
    DIMENSIONS,
    GLU_REFUSAL,
    convention_problems,
    glu_refused,
    locate,
)
from kernel_lock.registry import adapter_for
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
    close = [k for k in KEYS if k.lower() == str(key).lower()] or difflib.get_close_matches(
        str(key), KEYS, n=1
    )
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
            "expected a mapping like {_target_: "
            f"torch.nn.{key if key != 'Activation' else 'GELU'}}}, "
            f"got {type(entry).__name__} {entry!r:.60}",
        )
        return findings, facts
    target = entry.get("_target_")
    if not isinstance(target, str) or not target:
        add(
            "error",
            "entry",
            "no _target_: anemoi fails with KeyError: '_target_'",
            "add `_target_: dotted.path.Class`",
        )
        return findings, facts
    facts["target"] = target
    for option in entry:
        if (
            isinstance(option, str)
            and option.startswith("_")
            and option not in ("_target_", "_partial_")
        ):
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
            f"{d!r} is pinned here, but anemoi passes the size at the call site: a keyword call "
            f"overrides it and a positional call {CALLS[key][0][0]} fails with 'multiple values'",
            f"remove {d!r}",
        )
    try:
        cls = locate(target)
    except (
        Exception,
        SystemExit,
    ) as exc:  # ImportError, or whatever a module raises (or exits with) on import
        add(
            "error",
            "import",
            f"{target!r} does not import here: importing {target.rpartition('.')[0]!r} raised "
            f"{type(exc).__name__}: {exc}",
            "install the library that provides it, or fix the dotted path (anemoi would raise an "
            "empty InstantiationException and log the reason at INFO level)",
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
    for problem in convention_problems(
        cls, key, {k: v for k, v in kwargs.items() if k not in dims}
    ):
        adapter = adapter_for(target)
        add(
            "error",
            "signature",
            f"{target} does not fit anemoi's call convention: {problem}",
            f"use `_target_: {adapter}` (same class and state dict, anemoi's signature)"
            if adapter
            else "use a class whose constructor takes anemoi's arguments, or a thin subclass "
            "adapting it",
        )
    family = facts["family"]
    if key in NORM_KEYS and family == "rms_norm":
        add(
            "warning" if allow_semantics_change else "error",
            "semantics",
            f"semantics change: {target} is an RMSNorm under the {key} key: it does not "
            "subtract the mean and "
            "has no bias, so the model computes something else and its state dict changes",
            "use a LayerNorm implementation; if the change is deliberate, pass "
            "--allow-semantics-change",
        )
    if key == "Linear" and family is not None:
        add(
            "error",
            "semantics",
            f"semantics change: {target} is a norm ({family}) under the Linear key",
        )
    if key == "Activation" and glu_refused(getattr(cls, "__name__", "")):
        add(
            "error",
            "semantics",
            f"{target} is a GLU-family activation: anemoi-models raises ValueError: {GLU_REFUSAL}",
            "set the component's mlp_implementation (glu, swiglu, geglu or reglu) and keep an "
            "elementwise class such as torch.nn.GELU under layer_kernels.Activation",
        )
    if not any(
        f.severity == "error" and f.kind in ("signature", "semantics", "entry") for f in findings
    ):
        # a pinned size is the dimension warning's: anemoi passes the size at the call site
        built = {k: v for k, v in kwargs.items() if k not in dims}
        for severity, kind, problem, fix in built_problems(key, cls, built, family):
            add(severity, kind, problem, fix)
    return findings, facts


# ---- built as anemoi builds it -------------------------------------------------------------------
ROWS = 3  # the rows of the small input each built entry is run on


def built_problems(
    key: str, cls: Any, kwargs: Mapping[str, Any], family: str | None = None
) -> list[tuple[str, str, str, str]]:
    """(kind, problem, fix) for the entry built as anemoi builds it, at each of anemoi's call sites
    (``CALLS``: ``Linear(in, out, bias=...)``, ``LayerNorm(C)``, ``QueryNorm(head_dim)``), the
    entry's keyword arguments under the call site's, as Hydra's partial passes them, then run
    forward and backward on a small input: a value of the wrong type (a dtype or a string eps), a
    device this machine has not, a keyword a ``*args, **kwargs`` wrapper passes on to a base that
    refuses it, and a class that builds but computes something else (``Identity`` or ``LazyLinear``
    under Linear). (severity, kind, problem, fix) each; an RMSNorm (``family``) is left to the
    semantics check."""
    import torch

    problems = [("error", *p) for p in _value_problems(kwargs)]
    if problems:
        return problems
    for text, args, call_kwargs in CALLS[key]:
        call = (
            f"{text} with {', '.join(f'{k}={v!r}' for k, v in kwargs.items())}" if kwargs else text
        )
        try:
            module = cls(*args, **{**kwargs, **call_kwargs})
        except Exception as exc:
            return [
                (
                    "error",
                    "build",
                    f"anemoi's {call} fails here: {type(exc).__name__}: {_first(exc)}",
                    _fix(exc),
                )
            ]
        if not isinstance(module, torch.nn.Module):
            return [
                (
                    "error",
                    "build",
                    f"anemoi's {call} returns a {type(module).__name__}, not a torch.nn.Module",
                    "",
                )
            ]
        if family == "conditional":
            continue  # its forward takes a condition too: built, not run
        what = _computes(key, module, args, call, family)
        if what:
            return [what]
    return []


def _value_problems(kwargs: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Values anemoi passes on as they are, and torch refuses: a dtype written as a string, a device
    this machine does not have, a string where a number is expected (eps from ``${oc.env:...}``)."""
    import torch

    out: list[tuple[str, str, str]] = []
    dtype = kwargs.get("dtype")
    if isinstance(dtype, str):
        out.append(
            (
                "value",
                f"dtype is the string {dtype!r}: Hydra passes it on as a string and anemoi fails "
                "with \"argument 'dtype' must be torch.dtype, not str\"",
                "remove `dtype` (anemoi casts the model as the precision says), or build it "
                "from code",
            )
        )
    device = kwargs.get("device")
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            out.append(
                (
                    "value",
                    f"device {device!r} is not a torch device: {_first(exc)}",
                    "remove `device`",
                )
            )
        else:
            if dev.type != "cpu" and not _device_present(dev):
                out.append(
                    (
                        "value",
                        f"device {device!r}: this machine has no {dev.type} device, so anemoi "
                        "fails building it "
                        + (
                            '("Torch not compiled with CUDA enabled")'
                            if dev.type == "cuda" and not torch.cuda.is_available()
                            else ""
                        ),
                        "remove `device` (anemoi moves the model to its device itself)",
                    )
                )
    for name in ("eps", "momentum"):
        value = kwargs.get(name)
        if isinstance(value, str):
            out.append(
                (
                    "value",
                    f"{name} is the string {value!r} (an interpolation such as ${{oc.env:...}} "
                    "resolves to a "
                    f'string): anemoi\'s forward fails with "{name} must be float, not str"',
                    f"write {name} as a number, or cast it: ${{oc.decode:...}}",
                )
            )
    return out


def _device_present(dev: Any) -> bool:
    """Whether this machine has the device (its type, and its index where one is given)."""
    import torch

    module = getattr(torch, dev.type, None)
    try:
        count = int(module.device_count()) if module is not None and module.is_available() else 0
    except Exception:
        return False
    return count > (dev.index or 0)


def _computes(
    key: str, module: Any, args: Sequence[Any], call: str, family: str | None
) -> tuple[str, str, str, str] | None:
    """The built module run forward and backward on a small input: what it computes against what the
    key means (a Linear maps ``in`` to ``out`` features; a norm keeps the shape and is invariant to
    the input's scale, a LayerNorm also to its shift). None when it fits."""
    import torch

    if key == "Activation":
        width, out = 16, 16
    else:
        width = int(args[0]) if args else 64
        out = int(args[1]) if key == "Linear" and len(args) > 1 else width
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(ROWS, width, generator=gen) * 2.0 + 3.0).to(device)
    try:
        # torch's own deprecation notices from what a first call compiles or imports
        # (torch.compile's adapters: "torch.jit.script_method is deprecated") say nothing of the
        # entry
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            xs = x.clone().requires_grad_(True)
            y = module(xs)
            y.float().sum().backward()
            with torch.no_grad():
                scaled, shifted = module(x * 4.0), module(x + 5.0)
    except Exception as exc:
        # a value of the wrong type is the config's; anything else (no GPU driver for a GPU kernel)
        # is this machine's, and says nothing of what the entry computes where it runs
        config = isinstance(exc, (TypeError, ValueError))
        return (
            "error" if config else "warning",
            "build",
            f"anemoi's {call} builds, but its forward and backward on a {ROWS}x{width} float32 "
            "input fail"
            + ("" if config else " on this machine")
            + f": {type(exc).__name__}: {_first(exc)}",
            _fix(exc) if config else "check it on the machine it will run on",
        )
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (ROWS, out):
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        return (
            "error",
            "semantics",
            f"anemoi's {call} returns {shape} for a ({ROWS}, {width}) input, where {key} returns "
            f"({ROWS}, {out}): {type(module).__name__} computes something else, and anemoi fails "
            "at the first layer after it",
            f"use a {key} implementation",
        )
    if key == "Linear":
        with torch.no_grad():
            a, b, zero = module(x), module(x * -0.5 + 1.0), module(torch.zeros_like(x))
            mixed = module(x * 0.5 + (x * -0.5 + 1.0) * 0.5)
        if not torch.allclose(
            mixed - zero, ((a - zero) * 0.5 + (b - zero) * 0.5), rtol=1e-3, atol=1e-4
        ):
            return (
                "error",
                "semantics",
                f"anemoi's {call} is not affine in its input: {type(module).__name__} is not a "
                "Linear",
                "use a Linear implementation",
            )
    elif key in NORM_KEYS:
        with torch.no_grad():
            base = module(x)
        if not torch.allclose(scaled, base, rtol=1e-3, atol=1e-3):
            return (
                "error",
                "semantics",
                f"anemoi's {call} does not normalise (its output changes with the input's scale): "
                f"{type(module).__name__} is not a norm",
                "use a LayerNorm implementation",
            )
        if family != "rms_norm" and not torch.allclose(shifted, base, rtol=1e-3, atol=1e-3):
            return (
                "error",
                "semantics",
                f"anemoi's {call} does not subtract the mean (its output changes with a shift "
                "of the input): "
                f"{type(module).__name__} computes an RMSNorm or another norm, not a LayerNorm",
                "use a LayerNorm implementation; if the change is deliberate, pass "
                "--allow-semantics-change",
            )
    return None


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _fix(exc: BaseException) -> str:
    text = str(exc)
    if "unexpected keyword argument" in text:
        return (
            "remove the keyword (or fix its spelling): the class, or a base it passes its "
            "arguments to, does not take it"
        )
    return ""


def constructor_defaults(cls: Any) -> dict[str, Any]:
    """The keyword defaults a class is built with. A constructor that only passes ``*args,
    **kwargs`` on (anemoi's AutocastLayerNorm) has the defaults of the first base that names its
    parameters."""
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
    """JSON in, JSON out: :func:`check_entry` for each ``{key, entry, where,
    allow_semantics_change}``.

    The child-process entry point of ``kernel-probe check-config``.
    """
    out = []
    # each distinct entry is built once
    seen: dict[str, tuple[str, list[Finding], dict[str, Any]]] = {}
    for r in requests:
        same = json.dumps(
            [r["key"], r["entry"], bool(r.get("allow_semantics_change"))],
            sort_keys=True,
            default=repr,
        )
        if same in seen:
            where, findings, facts = seen[same]
            findings = [
                dataclasses.replace(f, where=r["where"] + f.where[len(where) :]) for f in findings
            ]
        else:
            findings, facts = check_entry(
                r["key"],
                r["entry"],
                r["where"],
                allow_semantics_change=bool(r.get("allow_semantics_change")),
            )
            seen[same] = (r["where"], findings, facts)
        out.append({"findings": [f.to_json() for f in findings], "facts": facts})
    return out


def judge_entries(
    requests: Sequence[EntryCheckRequest], timeout: float = DEFAULT_TIMEOUT
) -> list[EntryCheckReply]:
    """:func:`check_entries` in a child; if that child dies, one child per entry says which."""
    if not requests:
        return []
    result = run_function(
        __name__, "check_entries", [r.to_json() for r in requests], timeout=timeout
    )
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
