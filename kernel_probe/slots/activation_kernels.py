"""The Activation slot's measurements, in the worker (torch): ``y`` and ``dx`` on hard inputs
against the declared function's float64 reference, torch.nn's own the baseline; what a candidate
computes (``identify``), and its rows against that (``approx_cases``); its timing."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from kernel_lock.slots import torch_device
from kernel_lock.slots.activation import ACTIVATION_FUNCTIONS, OTHER_FUNCTION, declared_function
from kernel_lock.trust import import_target
from kernel_probe.candidates import Candidate
from kernel_probe.isolation.protocol import (
    FLAG_GRAD_OUTPUT_MODIFIED,
    FLAG_INPUT_MODIFIED,
    FLAG_NOT_ELEMENTWISE,
    CheckReply,
    ErrorStats,
    MeasurementRow,
    TimeReply,
    TimingProgressMessage,
    TimingRow,
)
from kernel_probe.probe import lifecycle, measure, timing
from kernel_probe.probe.tolerance import tolerance
from kernel_probe.shapes import parse_shape

OUTPUTS = ("y", "dx")
ROWS, WIDTH = 8, 256  # every case is (ROWS, WIDTH): 2,048 elements, a fraction of a ms per call
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
# the functions: float64 references, and torch.nn's own in the inputs' dtype
REFERENCES: dict[str, Callable[[Any], Any]] = {
    "gelu-erf": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "gelu-tanh": lambda x: 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))),
    "silu": lambda x: x * torch.sigmoid(x),
    "relu": lambda x: torch.clamp_min(x, 0.0),
    "sigmoid": torch.sigmoid,
}
TORCH_NN: dict[str, Callable[[Any], Any]] = {
    "gelu-erf": torch.nn.functional.gelu,
    "gelu-tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
    "relu": torch.nn.functional.relu,
    "sigmoid": torch.sigmoid,
}
assert tuple(REFERENCES) == tuple(TORCH_NN) == ACTIVATION_FUNCTIONS
HINTS = {
    "random": "plain random input",
    "gelu-gap": "|x| in 0.5..4: where GELU's erf and tanh forms differ most (~4.7e-4)",
    "large-magnitude": "|x| from 10 to 30,000: overflow of x**3 or exp(-x) in low precision",
    "tiny": "|x| from 1e-6 to 1e-2: relative accuracy near zero",
    "non-contiguous": "a non-contiguous (transposed) 3-D view",
    # as training and inference use it; no state dict to load (no parameters)
    **{k: v for k, v in lifecycle.HINTS.items() if k != lifecycle.LOADED},
}


def function_of_other(function: str) -> Callable[[Any], Any]:
    """A declared ``other:module.Class``, built with no arguments (reference and baseline)."""
    return measure.import_class(function[len(OTHER_FUNCTION) :])()


def functions_for(function: str) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """(the float64 reference, torch's own in the checked dtype) of a declared function."""
    if function.startswith(OTHER_FUNCTION):
        own = function_of_other(function)
        return own, own
    return REFERENCES[function], TORCH_NN[function]


def cases(dtype: Any, gen: torch.Generator) -> dict[str, Any]:
    """The check's inputs, each (ROWS, WIDTH) in ``dtype`` (some as views), drawn in float64 on
    the CPU (the same values on every device)."""
    n = ROWS * WIDTH

    def signed(magnitudes: Any) -> Any:
        sign = torch.where(torch.rand(n, generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0)
        return (magnitudes[torch.randperm(n, generator=gen)] * sign).reshape(ROWS, WIDTH)

    f64 = torch.float64
    raw = {
        "random": torch.randn(ROWS, WIDTH, generator=gen, dtype=f64) * 2.0,
        "gelu-gap": signed(torch.linspace(0.5, 4.0, n, dtype=f64)),
        "large-magnitude": signed(torch.logspace(1.0, math.log10(3e4), n, dtype=f64)),
        "tiny": signed(torch.logspace(-6.0, -2.0, n, dtype=f64)),
        "non-contiguous": torch.randn(WIDTH // 8, ROWS, 8, generator=gen, dtype=f64).transpose(0, 1)
        * 3.0,
    }
    raw.update(
        {v: torch.randn(ROWS, WIDTH, generator=gen, dtype=f64) * 2.0 for v in lifecycle.VIEWS}
    )
    device = torch.get_default_device()
    out = {name: x.to(device=device, dtype=dtype) for name, x in raw.items()}
    return {n: lifecycle.view(n, x) if n in lifecycle.VIEWS else x for n, x in out.items()}


class NotElementwise(ValueError):
    """The candidate's output does not have its input's shape: no elementwise activation."""


def _run(fn: Callable[[Any], Any], x: Any, go: Any) -> dict[str, Any]:
    """y and dx of ``fn`` at ``x`` with grad_output ``go``, and whether it modified either."""
    # the input is no leaf (inside a model it is a Linear's output): a write into it runs as there;
    # it keeps x's layout (a view stays a view)
    leaf = x.detach().clone().requires_grad_(True)
    inp = lifecycle.fresh_like(x).copy_(leaf)
    kept, gout = inp.detach().clone(), go.detach().clone()
    y = fn(inp)
    if tuple(y.shape) != tuple(x.shape):
        raise NotElementwise(
            f"returns shape {tuple(y.shape)} for an input of shape {tuple(x.shape)}: not "
            "elementwise (a GLU-family class halves the last dimension; anemoi refuses it under "
            "layer_kernels.Activation)"
        )
    (dx,) = torch.autograd.grad(y, leaf, gout.to(y.dtype))
    modified = {
        "input": not torch.equal(kept, inp.detach()),
        "grad_output": not torch.equal(gout, go),
    }
    return {"y": y.detach(), "dx": dx, **modified}


def _measure(
    mod: Any, function: str, xs: Mapping[str, Any], gos: Mapping[str, Any], flags: dict | None
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, ErrorStats]]]:
    """Per case: the candidate's and torch's errors against ``function``'s float64 reference."""
    reference, own = functions_for(function)
    cases_out: dict[str, dict[str, list[float]]] = {}
    stats_out: dict[str, dict[str, ErrorStats]] = {}
    for name, x in xs.items():
        got = _run(mod, x, gos[name])
        if flags is not None:
            if got["input"]:
                flags.setdefault(FLAG_INPUT_MODIFIED, name)
            if got["grad_output"]:
                flags.setdefault(FLAG_GRAD_OUTPUT_MODIFIED, name)
        base = _run(own, x, gos[name])
        ref = _run(reference, x.double(), gos[name].double())
        cases_out[name], stats_out[name] = {}, {}
        for t in OUTPUTS:
            g = got[t].detach().double() if got[t].shape == ref[t].shape else None
            b, r = base[t].detach().double(), ref[t].detach().double()
            cases_out[name][t], stats_out[name][t] = measure.compare(g, b, r, rows=True)
    return cases_out, stats_out


def _in_use(
    mod: Any, function: str, later: tuple[Any, Any, Any], flags: dict | None
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, ErrorStats]]]:
    """The cases of ``lifecycle`` after the first life's, on ``later`` (``later_inputs``): the
    inference forwards (y only), then a second call of the same instance on fresh inputs."""
    reference, own = functions_for(function)
    x, x2, go2 = later
    ref, base = reference(x.double()).detach(), own(x).detach().double()
    modules = [mod] if isinstance(mod, torch.nn.Module) else []
    cases_out, stats_out = {}, {}
    for case in lifecycle.INFERENCE:
        with lifecycle.inference(case, *modules):
            y = mod(lifecycle.fresh_like(x))
        got = y.detach().double() if y.shape == ref.shape else None
        maxima, stats = measure.compare(got, base, ref, rows=True)
        cases_out[case], stats_out[case] = {"y": maxima}, {"y": stats}
    after = lifecycle.AFTER_UPDATE
    more, more_stats = _measure(mod, function, {after: x2}, {after: go2}, flags)
    return {**cases_out, **more}, {**stats_out, **more_stats}


def later_inputs(dtype: Any, gen: torch.Generator) -> tuple[Any, Any, Any]:
    """``_in_use``'s inputs: x for the inference cases, x and grad_output for the second call."""
    draw = [torch.randn(ROWS, WIDTH, generator=gen, dtype=torch.float64) * 2.0 for _ in range(3)]
    return tuple(t.to(device=torch.get_default_device(), dtype=dtype) for t in draw)  # type: ignore[return-value]


def identify(mod: Any, declared: str, gen: torch.Generator) -> str:
    """The function the candidate's float32 forward matches (within the tolerance) on the random
    and gelu-gap inputs, the declared one tried first; "" for none."""
    xs = cases(torch.float32, gen)
    names = ("random", "gelu-gap")
    gos = {
        n: torch.randn(xs[n].shape, generator=gen, dtype=torch.float64).float().to(xs[n].device)
        for n in names
    }
    got = {n: _run(mod, xs[n], gos[n]) for n in names}
    for function in dict.fromkeys((declared, *ACTIVATION_FUNCTIONS)):
        try:
            reference, own = functions_for(function)
            ok = True
            for n in names:
                ref = _run(reference, xs[n].double(), gos[n].double())["y"]
                base = _run(own, xs[n], gos[n])["y"].double()
                (mine, theirs), _ = measure.compare(got[n]["y"].double(), base, ref, rows=False)
                ok = ok and mine <= tolerance(theirs, "float32")
        except Exception:  # a declared class that cannot run in float64: it identifies nothing
            ok = False
        if ok:
            return function
    return ""


def _row(
    cand: Candidate, mod: Any, function: str, computes: str, dtype_name: str, regime: str, seed: int
) -> MeasurementRow:
    row: MeasurementRow = {"dtype": dtype_name, "regime": regime}
    dtype = measure.torch_dtype(dtype_name)
    gen = torch.Generator().manual_seed(seed)
    with measure.measuring(row, _failed):
        xs = cases(dtype, gen)
        gos = {
            n: torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x) for n, x in xs.items()
        }
        later = later_inputs(dtype, gen)
        flags: dict[str, str] = {}
        # "mixed": under autocast, on inputs in the low dtype (what the Linear before it hands it)
        mixed = (torch.get_default_device().type, dtype) if regime == "mixed" else None
        with measure.autocasting(mixed):
            for key, against, seen in (("", function, flags), ("approx_", computes, None)):
                if key and (not computes or computes == function):
                    continue
                errors, stats = _measure(mod, against, xs, gos, seen)
                more, more_stats = _in_use(mod, against, later, seen)
                row[f"{key}cases"], row[f"{key}stats"] = {**errors, **more}, {**stats, **more_stats}  # type: ignore[literal-required]
            # twice, each on a fresh instance (built, never copied: a copy carries what it holds)
            a, b = (_run(build(cand), xs["random"], gos["random"]) for _ in range(2))
        row["nondeterministic"] = measure.nondeterminism(a, b, OUTPUTS)
        row["flags"] = flags
    return row


def _failed(row: MeasurementRow, exc: Exception) -> None:
    """A row that raised: no errors; not elementwise is a flag, anything else its exception."""
    row.pop("cases", None)
    row.pop("stats", None)
    if isinstance(exc, NotElementwise):
        row["flags"] = {FLAG_NOT_ELEMENTWISE: str(exc)}
    else:
        row["exception"] = measure.first_line(exc, 400)


def build(cand: Candidate) -> Any:
    """An instance of the candidate (an activation takes no dimensions: its pinned kwargs only)."""
    cls = import_target(cand.target, (cand.target.split(".")[0],), semantics="activation")
    return cls(*cand.args, **{**cand.kwargs, **cand.build_kwargs})


def _twin(cand: Candidate, mod: Any, gen: torch.Generator) -> dict[str, Any]:
    """The portable twin on a random input: the largest relative difference of y or dx, and
    whether the state dicts interchange."""
    twin_cand = measure.twin_candidate(cand, "Activation")
    if twin_cand is None:
        return measure.incompatible()
    try:
        twin = build(twin_cand)
        x = torch.randn(ROWS, WIDTH, generator=gen, dtype=torch.float64).float()
        x = x.to(torch.get_default_device()) * 2
        go = torch.randn_like(x)
        a, b = _run(mod, x, go), _run(twin, x, go)
    except Exception as exc:
        return measure.incompatible(f"the twin raised {measure.first_line(exc, 300)}")
    mine, theirs = mod.state_dict(), twin.state_dict()
    same = set(mine) == set(theirs) and all(mine[k].shape == theirs[k].shape for k in mine)
    worst = max(measure.rel(a[n], b[n], float(b[n].double().abs().max()) or 1.0) for n in OUTPUTS)
    out = {"state_dict": "interchangeable" if same else "incompatible", "max_error": worst}
    keys = f"state dict keys differ: {sorted(mine)} against the twin's {sorted(theirs)}"
    return out if same else {**out, "reason": keys}


def check(
    cand: Candidate,
    device: str,
    dtypes: list[tuple[str, str]],
    *,
    canonical_overrides: Mapping[str, Any] | None = None,
    seed: int = 0,
    **_: Any,
) -> CheckReply:
    """Raw measurements of one Activation candidate against the declared function."""
    function = declared_function(canonical_overrides)
    import_s, stopped = measure.import_stop(cand, device)
    if stopped is not None:
        return stopped
    with measure.on_device(device):
        try:
            mod = build(cand)
            if function.startswith(OTHER_FUNCTION):  # the declared class must build: else nothing
                function_of_other(function)  # can be judged
        except Exception as exc:
            error = measure.first_line(exc, 400)
            return CheckReply(
                candidate=cand.id, device=device, phase="build", error=error, import_s=import_s
            )
        try:
            computes = identify(mod, function, torch.Generator().manual_seed(seed + 11))
        except Exception:  # it cannot even run in float32: every row says why
            computes = ""
        rows = [_row(cand, mod, function, computes, d, regime, seed) for d, regime in dtypes]
        if rows and "exception" not in rows[0]:
            rows[0]["twin"] = _twin(cand, mod, torch.Generator().manual_seed(seed + 5))
    return CheckReply(
        candidate=cand.id, device=device, rows=rows, import_s=import_s, computes=computes
    )


def time_candidate(
    cand: Candidate,
    device: str,
    shapes: list[str],
    dtype_name: str,
    options: Mapping[str, Any],
    progress: Callable[[TimingProgressMessage], None] | None = None,
    regime: str = "true",
    **_: Any,
) -> TimeReply:
    """fwd+bwd at each shape: ROWSxHIDDEN elements (a Linear's ROWSxINxOUT: ROWSxOUT)."""
    tdev = torch_device(device)

    def run_shape(text: str, timed: Callable[[Callable[[], None]], TimingRow]) -> None:
        rows, hidden, out = parse_shape(text)
        mod = build(cand)
        dtype = measure.torch_dtype(dtype_name)
        x = torch.randn(rows, out or hidden, device=tdev, dtype=dtype, requires_grad=True)
        go = torch.randn_like(x)

        def step() -> None:
            torch.autograd.grad(mod(x), x, go)

        row = timed(step)
        # x read, y written forward; x and grad_out read, dx written backward
        row["gbps"] = 5 * x.numel() * x.element_size() / (row["median_ms"] / 1e3) / 1e9

    return timing.step_rows(
        cand.id, device, shapes, dtype_name, options, progress, run_shape, regime
    )


def tiny_call(cand: Candidate, device: str) -> None:
    """One tiny forward and backward (``Slot.try_once``: what it raises says why it cannot run)."""
    mod = build(cand)
    mod(torch.randn(4, 16, device=torch_device(device), requires_grad=True)).sum().backward()
