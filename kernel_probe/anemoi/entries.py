"""Checks of one ``layer_kernels`` entry against anemoi: the key, the import, the signature, the
semantics, and the entry built and run as anemoi builds it; imports the target,
so it runs in a child (:func:`judge_entries`)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kernel_lock import anemoi
from kernel_lock.anemoi import CALLS, DIMENSIONS, convention_problems
from kernel_lock.registry import adapter_for
from kernel_lock.tables import nearest
from kernel_probe.anemoi.config import KEYS, Finding
from kernel_probe.isolation.child import run_function
from kernel_probe.isolation.protocol import EntryCheckReply, EntryCheckRequest

NORM_KEYS = ("LayerNorm", "QueryNorm", "KeyNorm")
DEFAULT_TIMEOUT = 120.0
ROWS = 3  # the rows of the small input each built entry is run on
LAYER_NORM_FIX = (
    "use a LayerNorm implementation; if the change is deliberate, pass --allow-semantics-change"
)
Problem = tuple[str, str, str, str]  # (severity, kind, problem, fix)


# ---- per key: what the class must be, and what the built module must compute --------------------
def _class_problem(
    key: str, target: str, cls: Any, family: str | None, allow: bool
) -> Problem | None:
    if key in NORM_KEYS and family == "rms_norm":
        problem = (
            f"semantics change: {target} is an RMSNorm under the {key} key: it does not subtract "
            "the mean and has no bias, so the model computes something else and its state dict "
            "changes"
        )
        return ("warning" if allow else "error", "semantics", problem, LAYER_NORM_FIX)
    if key == "Linear" and family is not None:
        problem = f"semantics change: {target} is a norm ({family}) under the Linear key"
        return ("error", "semantics", problem, "")
    if key == "Activation" and anemoi.glu_refused(getattr(cls, "__name__", "")):
        problem = (
            f"{target} is a GLU-family activation: anemoi-models raises ValueError: "
            f"{anemoi.GLU_REFUSAL}"
        )
        fix = (
            "set the component's mlp_implementation (glu, swiglu, geglu or reglu) and keep an "
            "elementwise class such as torch.nn.GELU under layer_kernels.Activation"
        )
        return ("error", "semantics", problem, fix)
    return None


def _norm_outputs(
    module: Any, x: Any, call: str, family: str | None, scaled: Any, shifted: Any
) -> Problem | None:
    import torch  # reason: the child's; the parent never imports torch for a config

    name = type(module).__name__
    with torch.no_grad():
        base = module(x)
    if not torch.allclose(scaled, base, rtol=1e-3, atol=1e-3):
        problem = (
            f"anemoi's {call} does not normalise (its output changes with the input's scale): "
            f"{name} is not a norm"
        )
        return ("error", "semantics", problem, "use a LayerNorm implementation")
    if family != "rms_norm" and not torch.allclose(shifted, base, rtol=1e-3, atol=1e-3):
        problem = (
            f"anemoi's {call} does not subtract the mean (its output changes with a shift of the "
            f"input): {name} computes an RMSNorm or another norm, not a LayerNorm"
        )
        return ("error", "semantics", problem, LAYER_NORM_FIX)
    return None


def _linear_outputs(module: Any, x: Any, call: str) -> Problem | None:
    import torch  # reason: as in _norm_outputs

    with torch.no_grad():
        a, b, zero = module(x), module(x * -0.5 + 1.0), module(torch.zeros_like(x))
        mixed = module(x * 0.5 + (x * -0.5 + 1.0) * 0.5)
    if torch.allclose(mixed - zero, ((a - zero) * 0.5 + (b - zero) * 0.5), rtol=1e-3, atol=1e-4):
        return None
    problem = f"anemoi's {call} is not affine in its input: {type(module).__name__} is not a Linear"
    return ("error", "semantics", problem, "use a Linear implementation")


# ---- the entry -----------------------------------------------------------------------------------
def norm_family(cls: Any) -> str | None:
    """``rms_norm``, ``layer_norm``, ``conditional`` or None, from the class and its bases
    (RMSNorm first, over the whole MRO: an adapter subclassing LigerRMSNorm is one)."""
    if not isinstance(cls, type):
        return None
    names = [c.__name__.lower() for c in cls.__mro__]
    try:
        import torch  # reason: as in _norm_outputs

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


def not_imported(target: Any) -> dict[str, Any]:
    """The facts of an entry that was not imported (its target compared with a lock by name)."""
    return {"target": target, "imported": False, "family": None, "defaults": {}}


def key_suggestion(key: str) -> str:
    """The hint for an unknown key: the close match, and the keys anemoi knows."""
    close = nearest(key, KEYS)
    hint = f"did you mean {close!r}? keys are case-sensitive; " if close else ""
    return f"{hint}anemoi knows {', '.join(KEYS)}"


def _target(key: str, entry: Any, add: Callable[..., None]) -> str | None:
    """The entry's ``_target_``, or None after the finding that stops its check."""
    if key not in KEYS:
        problem = f"unknown key {key!r}: anemoi silently ignores it, so this entry has no effect"
        add("error", "key", problem, key_suggestion(key))
        return None
    if not isinstance(entry, Mapping):
        example = f"torch.nn.{key if key != 'Activation' else 'GELU'}"
        problem = f"expected a mapping like {{_target_: {example}}}, got {type(entry).__name__} "
        add("error", "entry", f"{problem}{entry!r:.60}")
        return None
    target = entry.get("_target_")
    if not isinstance(target, str) or not target:
        no = "no _target_: anemoi fails with KeyError: '_target_'"
        add("error", "entry", no, "add `_target_: dotted.path.Class`")
        return None
    private = ("_target_", "_partial_")
    for option in (o for o in entry if isinstance(o, str) and o[:1] == "_" and o not in private):
        problem = (
            f"Hydra option {option!r}: anemoi instantiates entries as partials; positional "
            "`_args_` collide with the sizes anemoi passes"
        )
        add("warning", "entry", problem, "remove it")
    return target


def check_entry(
    key: str, entry: Any, where: str, *, allow_semantics_change: bool = False
) -> tuple[list[Finding], dict[str, Any]]:
    """Findings about one ``layer_kernels`` entry on this machine, and facts for later comparisons
    (``target``, ``imported``, ``family``, ``defaults``); imports the target (and so torch)."""
    findings: list[Finding] = []
    facts = not_imported(None)

    def add(severity: str, kind: str, problem: str, fix: str = "") -> None:
        findings.append(Finding(severity, kind, where, problem, fix))

    target = facts["target"] = _target(key, entry, add)
    if target is None:
        return findings, facts
    kwargs = {k: v for k, v in entry.items() if not (isinstance(k, str) and k.startswith("_"))}
    dims = [k for k in kwargs if k in DIMENSIONS[key]]
    for d in dims:
        problem = f"{d!r} is pinned here, but anemoi passes the size at the call site: a keyword "
        problem += f"call overrides it and a positional call {CALLS[key][0][0]} fails with "
        add("warning", "dimension", problem + "'multiple values'", f"remove {d!r}")
    try:
        cls = anemoi.locate(target)
    except (Exception, SystemExit) as exc:  # ImportError, or whatever a module raises on import
        problem = f"{target!r} does not import here: importing {target.rpartition('.')[0]!r} "
        fix = "install the library that provides it, or fix the dotted path (anemoi would raise "
        fix += "an empty InstantiationException and log the reason at INFO level)"
        add("error", "import", f"{problem}raised {type(exc).__name__}: {exc}", fix)
        return findings, facts
    facts["imported"] = True
    import torch  # reason: as in _norm_outputs

    if not callable(cls):
        add("error", "entry", f"{target!r} is a {type(cls).__name__}, not a class anemoi can call")
        return findings, facts
    if isinstance(cls, type) and not issubclass(cls, torch.nn.Module):
        add("error", "entry", f"{target!r} is not a torch.nn.Module subclass")
    family = facts["family"] = norm_family(cls)
    facts["defaults"] = constructor_defaults(cls)
    built = {k: v for k, v in kwargs.items() if k not in dims}  # a pinned size: dimension's
    for problem in convention_problems(cls, key, built):
        adapter = adapter_for(target)
        fix = f"use `_target_: {adapter}` (same class and state dict, anemoi's signature)"
        if not adapter:
            fix = "use a class whose constructor takes anemoi's arguments, or a thin subclass "
            fix += "adapting it"
        add("error", "signature", f"{target} does not fit anemoi's call convention: {problem}", fix)
    if p := _class_problem(key, target, cls, family, allow_semantics_change):
        add(*p)
    stopped = ("signature", "semantics", "entry")
    if not any(f.severity == "error" and f.kind in stopped for f in findings):
        for p in built_problems(key, cls, built, family):
            add(*p)
    return findings, facts


# ---- built as anemoi builds it -------------------------------------------------------------------
def built_problems(
    key: str, cls: Any, kwargs: Mapping[str, Any], family: str | None = None
) -> list[Problem]:
    """The entry built at each of anemoi's call sites (``CALLS``) as Hydra's partial passes its
    kwargs, then run forward and backward on a small input."""
    import torch  # reason: as in _norm_outputs

    problems = _value_problems(kwargs)
    if problems:
        return problems
    for text, args, call_kwargs in CALLS[key]:
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        call = f"{text} with {shown}" if kwargs else text
        try:
            module = cls(*args, **{**kwargs, **call_kwargs})
        except Exception as exc:
            problem = f"anemoi's {call} fails here: {type(exc).__name__}: {_first(exc)}"
            return [("error", "build", problem, _fix(exc))]
        if not isinstance(module, torch.nn.Module):
            problem = f"anemoi's {call} returns a {type(module).__name__}, not a torch.nn.Module"
            return [("error", "build", problem, "")]
        if family == "conditional":
            continue  # its forward takes a condition too: built, not run
        what = _computes(key, module, args, call, family)
        if what:
            return [what]
    return []


def _value_problems(kwargs: Mapping[str, Any]) -> list[Problem]:
    """Values anemoi passes on as they are and torch refuses: a dtype written as a string, a device
    this machine has not, a string where a number is expected (eps from ``${oc.env:...}``)."""
    import torch  # reason: as in _norm_outputs

    out: list[Problem] = []
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    if isinstance(dtype, str):
        problem = (
            f"dtype is the string {dtype!r}: Hydra passes it on as a string and anemoi fails with "
            "\"argument 'dtype' must be torch.dtype, not str\""
        )
        fix = "remove `dtype` (anemoi casts the model as the precision says), or build it from code"
        out.append(("error", "value", problem, fix))
    try:
        dev = None if device is None else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        problem = f"device {device!r} is not a torch device: {_first(exc)}"
        out.append(("error", "value", problem, "remove `device`"))
    else:
        try:  # how many such devices this machine has (0: none, or its backend is not available)
            module = getattr(torch, dev.type, None) if dev is not None else None
            count = int(module.device_count()) if module and module.is_available() else 0
        except Exception:
            count = 0
        if dev is not None and dev.type != "cpu" and count <= (dev.index or 0):
            no_cuda = dev.type == "cuda" and not torch.cuda.is_available()
            problem = (
                f"device {device!r}: this machine has no {dev.type} device, so anemoi fails "
                "building it " + ('("Torch not compiled with CUDA enabled")' if no_cuda else "")
            )
            fix = "remove `device` (anemoi moves the model to its device itself)"
            out.append(("error", "value", problem, fix))
    for name in ("eps", "momentum"):
        value = kwargs.get(name)
        if isinstance(value, str):
            problem = (
                f"{name} is the string {value!r} (an interpolation such as ${{oc.env:...}} "
                f"resolves to a string): anemoi's forward fails with \"{name} must be float, not "
                'str"'
            )
            fix = f"write {name} as a number, or cast it: ${{oc.decode:...}}"
            out.append(("error", "value", problem, fix))
    return out


def _computes(
    key: str, module: Any, args: Sequence[Any], call: str, family: str | None
) -> Problem | None:
    """The built module run forward and backward on a small input: its output's shape, then the
    key's own rule on what it computes (a norm normalises, a Linear is affine)."""
    import torch  # reason: as in _norm_outputs

    width = int(args[0]) if args else (16 if key == "Activation" else 64)  # no size passed
    out = int(args[1]) if len(args) > 1 else width
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(ROWS, width, generator=gen) * 2.0 + 3.0).to(device)
    try:
        # torch's own deprecation notices from a first call ("torch.jit.script_method is
        # deprecated") say nothing of the entry
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
        problem = f"anemoi's {call} builds, but its forward and backward on a {ROWS}x{width} "
        problem += "float32 input fail" + ("" if config else " on this machine")
        fix = _fix(exc) if config else "check it on the machine it will run on"
        problem += f": {type(exc).__name__}: {_first(exc)}"
        return ("error" if config else "warning", "build", problem, fix)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (ROWS, out):
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        problem = f"anemoi's {call} returns {shape} for a ({ROWS}, {width}) input, where {key} "
        problem += f"returns ({ROWS}, {out}): {type(module).__name__} computes something else, and "
        problem += "anemoi fails at the first layer after it"
        return ("error", "semantics", problem, f"use a {key} implementation")
    if key in NORM_KEYS:
        return _norm_outputs(module, x, call, family, scaled, shifted)
    return _linear_outputs(module, x, call) if key == "Linear" else None


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _fix(exc: BaseException) -> str:
    if "unexpected keyword argument" in str(exc):
        return (
            "remove the keyword (or fix its spelling): the class, or a base it passes its "
            "arguments to, does not take it"
        )
    return ""


def constructor_defaults(cls: Any) -> dict[str, Any]:
    """The keyword defaults a class is built with (of the first base naming its parameters, where a
    constructor only passes ``*args, **kwargs`` on, as anemoi's AutocastLayerNorm)."""
    for klass in getattr(cls, "__mro__", (cls,)):
        try:
            params = inspect.signature(klass).parameters
        except (TypeError, ValueError):
            continue
        if any(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params.values()):
            plain = (type(None), bool, int, float, str)
            return {
                n: p.default
                for n, p in params.items()
                if p.default is not inspect.Parameter.empty and isinstance(p.default, plain)
            }
    return {}


# ---- in a child ----------------------------------------------------------------------------------
def check_entries(requests: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The child's entry point: :func:`check_entry` for each request (JSON), each distinct once."""
    out = []
    seen: dict[str, tuple[str, list[Finding], dict[str, Any]]] = {}
    for r in requests:
        allow = bool(r.get("allow_semantics_change"))
        same = json.dumps([r["key"], r["entry"], allow], sort_keys=True, default=repr)
        if same in seen:
            where, findings, facts = seen[same]
            findings = [
                dataclasses.replace(f, where=r["where"] + f.where[len(where) :]) for f in findings
            ]
        else:
            findings, facts = check_entry(
                r["key"], r["entry"], r["where"], allow_semantics_change=allow
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
        fix = "run `kernel-probe env` to see which library is broken here"
        finding = Finding(
            "error", "import", r.where, f"importing {target!r} failed: {one.reason}", fix
        )
        out.append(EntryCheckReply(findings=[finding.to_json()], facts=not_imported(target)))
    return out
