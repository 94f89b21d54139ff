"""The GatedMLP slot's checks, in the worker (torch): anemoi's gated MLP layer built as the lock
builds it, loaded strictly under anemoi's keys, every output against the formula's float64
reference and torch's own layer (``own_layer``); a known mistake named; the state dict's round
trip; its timing."""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from kernel_lock.gated_mlp import TORCH_GATES, GatedMLP
from kernel_lock.slots import SPECS, torch_device
from kernel_lock.slots.gated_mlp import gate_for
from kernel_probe.candidates import Candidate
from kernel_probe.isolation.protocol import (
    CheckReply,
    ErrorStats,
    MeasurementRow,
    TimeReply,
    TimingProgressMessage,
    TimingRow,
)
from kernel_probe.probe import lifecycle, measure, timing
from kernel_probe.shapes import parse_shape
from kernel_probe.slots.gated_mlp import (
    FLAG_INPUT_MODIFIED,
    FLAG_MISTAKE,
    FLAG_STATE_DICT,
    MISTAKES,
)

ANEMOI_IN = 1024  # anemoi's num_channels in every preset: ``check --hidden 1024``, the GPU kit
CHECK_IN = 96  # the default check: 96 in, 256 out, cheap in every dtype (bf16 emulated on AVX2)
CHECK_RATIO = 2.67  # anemoi's configs: "use 4 (mlp) or ~2.67 (glu/swiglu/geglu/reglu)"
CHECK_ROWS = 8  # a few rows: at anemoi's shape each is 1024 in, 2734 out (the cost is the matmuls)
PARAMS = ("gate_proj.weight", "gate_proj.bias", "value_proj.weight", "value_proj.bias")
OUTPUTS = ("y", "dx", *PARAMS)
FIRST = ("random", "wide-gate")  # a fresh module's first life, at the check's width: fwd and bwd
LOW = ("float16", "bfloat16")  # where the overflow case runs


def hidden_dim(num_channels: int, ratio: float) -> int:
    """anemoi's hidden width for a ratio (``compute_mlp_hidden_dim``: halves round up)."""
    if not math.isfinite(ratio) or ratio <= 0:
        raise ValueError(f"the MLP ratio must be a positive finite number, not {ratio!r}")
    return int(num_channels * ratio + 0.5)


def canonical(overrides: Mapping[str, Any] | None, in_features: int = CHECK_IN) -> dict[str, Any]:
    """The values a GatedMLP template names: the model's mlp_implementation, bias and sizes."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    values = {**SPECS["GatedMLP"].canonical, **given}
    gate_for(values["mlp_implementation"])  # ValueError for "mlp" or a name anemoi does not know
    out = hidden_dim(in_features, CHECK_RATIO)
    values.update(
        in_features=in_features, out_features=out, hidden=in_features, normalized_shape=in_features
    )
    return values


def reference(x: Any, params: Mapping[str, Any], function: str, mistake: str = "") -> Any:
    """The formula in x's dtype (float64 for the reference): ``gate(gate_proj(x)) * value_proj(x)``;
    ``mistake`` computes one of ``MISTAKES`` instead."""
    wb: dict[str, Any] = {
        k: (None if mistake == "no-bias" and k.endswith("bias") else v) for k, v in params.items()
    }
    g = F.linear(x, wb["gate_proj.weight"], wb.get("gate_proj.bias"))
    v = F.linear(x, wb["value_proj.weight"], wb.get("value_proj.bias"))
    if mistake == "swapped":
        g, v = v, g
    return TORCH_GATES["gelu_tanh" if mistake == "gelu_tanh" else function](g) * v


def parameters(
    in_features: int, out_features: int, gen: torch.Generator, bias: bool = True
) -> dict[str, Any]:
    """float64 parameters under anemoi's keys, neither ones nor zeros (ignoring one fails)."""
    out: dict[str, Any] = {}
    f64 = torch.float64
    for proj in ("gate_proj", "value_proj"):
        weight = torch.randn(out_features, in_features, generator=gen, dtype=f64)
        out[f"{proj}.weight"] = weight / math.sqrt(in_features)
        if bias:
            out[f"{proj}.bias"] = 0.5 * torch.randn(out_features, generator=gen, dtype=f64)
    return out


def own_layer(values: Mapping[str, Any]) -> tuple[Any, str]:
    """torch's own gated layer (float32) and its name: anemoi-models' ``GatedMLPLayer`` with
    ``torch.nn.Linear``, or ``kernel_lock.gated_mlp.GatedMLP`` without anemoi."""
    n_in, n_out = values["in_features"], values["out_features"]
    implementation = values["mlp_implementation"]
    try:
        from anemoi.models.layers.mlp import GatedMLPLayer
    except ImportError:
        layer = GatedMLP(n_in, n_out, implementation, bias=values["bias"])
        return layer, "kernel_lock.gated_mlp.GatedMLP (anemoi-models is not installed)"
    # anemoi reads layer_kernels.Linear only (a DotDict in anemoi's own call sites)
    kernels: Any = types.SimpleNamespace(Linear=torch.nn.Linear)
    return GatedMLPLayer(n_in, n_out, kernels, implementation), "anemoi-models' GatedMLPLayer"


def state_dict_problem(mod: Any, values: Mapping[str, Any], gen: torch.Generator) -> str | None:
    """anemoi layer -> candidate -> anemoi layer, strict and bitwise (float32): None when the
    candidate holds anemoi's state dict exactly, else what differs."""
    ours, source = own_layer(values)
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    want = ours.state_dict()
    have = set(mod.state_dict())
    if have != set(want):
        missing, extra = sorted(set(want) - have), sorted(have - set(want))
        parts = [f"missing {missing}" if missing else "", f"unexpected {extra}" if extra else ""]
        return f"its state dict is not {source}'s: " + "; ".join(s for s in parts if s)
    mod_f32 = mod.float()
    try:
        mod_f32.load_state_dict(want, strict=True)
    except (RuntimeError, KeyError) as exc:
        why = measure.first_line(exc, 300)
        return f"{source}'s state dict does not load into it strictly: {why}"
    back = own_layer(values)[0]
    back.load_state_dict(mod_f32.state_dict(), strict=True)
    changed = [k for k, t in back.state_dict().items() if not torch.equal(t, want[k])]
    return f"the round trip through it changes {changed}" if changed else None


def _pass(mod: Any, x: Any, gy: Any, autocast: tuple[str, Any] | None) -> dict[str, Any]:
    x = lifecycle.fresh_like(x).requires_grad_(True)  # a view stays a view
    before = x.detach().clone()
    for p in mod.parameters():
        p.grad = None
    with measure.autocasting(autocast):
        y = mod(x)
    y.backward(gy)
    grads = dict(mod.named_parameters())
    out = {"y": y.detach(), "dx": x.grad, "intact": bool(torch.equal(x.detach(), before))}
    out.update({k: (grads[k].grad if k in grads else None) for k in PARAMS})
    return out


def _reference_pass(x: Any, gy: Any, params: Mapping[str, Any], function: str) -> dict[str, Any]:
    x64 = x.detach().clone().requires_grad_(True)
    p64 = {k: t.detach().clone().requires_grad_(True) for k, t in params.items()}
    y = reference(x64, p64, function)
    y.backward(gy)
    grads = {k: p64[k].grad if k in p64 else None for k in PARAMS}
    return {"y": y.detach(), "dx": x64.grad, **grads}


def _row(
    cand: Candidate, values: Mapping[str, Any], dtype_name: str, regime: str, device: str
) -> MeasurementRow:
    row: MeasurementRow = {"dtype": dtype_name, "regime": regime, "cases": {}, "stats": {}}
    row["flags"] = {}
    dtype, tdev = measure.torch_dtype(dtype_name), torch_device(device)
    param_dtype = torch.float32 if regime == "mixed" else dtype
    autocast = (tdev, dtype) if regime == "mixed" else None
    function = gate_for(values["mlp_implementation"]).function
    gen = torch.Generator().manual_seed(0)
    try:
        mod = measure.build(cand, values, tdev, param_dtype)
    except Exception as exc:
        row["exception"] = measure.first_line(exc, 400)
        return row
    problem = state_dict_problem(mod, values, torch.Generator().manual_seed(1))
    if problem:
        row["flags"][FLAG_STATE_DICT] = problem
        return row
    run = _Run(values, function, (dtype, param_dtype, autocast), gen, row)
    params = parameters(values["in_features"], values["out_features"], gen, bool(values["bias"]))
    # strict: a candidate without anemoi's keys fails here
    run.mods = tuple(run.load(m, params, tdev) for m in (mod, own_layer(values)[0]))
    # the reference from the parameters as the candidate holds them (rounded), on the CPU
    run.held = {k: t.to(param_dtype).to(torch.float64) for k, t in params.items()}
    with measure.measuring(row):
        for case in FIRST:
            x, ys = run.case(case, scale=3.0 if case == "wide-gate" else 1.0)
            if case == "random":
                _mistake(row, *ys, x.double().cpu(), run.held, function)
        # the cases in use at CHECK_IN (at anemoi's width they would outlast the check's budget)
        small = run if values["in_features"] == CHECK_IN else run.small(cand)
        for case in lifecycle.VIEWS:
            small.case(case)
        _in_use(small, cand)
        row["twin"] = _twin(cand, values, run.mods[0], x, autocast)
    return row


class _Run:
    """A row's passes: one case's candidate and torch's own against the float64 reference."""

    def __init__(
        self, values: Mapping[str, Any], function: str, dtypes: tuple, gen: Any, row: Any
    ) -> None:
        self.values, self.function, self.gen, self.row = values, function, gen, row
        self.dtypes = dtypes
        self.dtype, self.param_dtype, self.autocast = dtypes  # the inputs', parameters', autocast
        self.mods: tuple[Any, Any] = (None, None)  # the candidate and torch's own, loaded
        self.held: dict[str, Any] = {}  # their parameters as held, float64

    @property
    def device(self) -> Any:
        """Where torch's own module (and so the candidate) runs."""
        return next(self.mods[1].parameters()).device

    def load(self, mod: Any, state: Mapping[str, Any], device: Any = None) -> Any:
        """``mod`` on the device and parameter dtype, loaded strictly with ``state``."""
        mod = mod.to(device=device or self.device, dtype=self.param_dtype)
        mod.load_state_dict({k: t.to(self.param_dtype) for k, t in state.items()}, strict=True)
        return mod

    def build(self, cand: Candidate, values: Mapping[str, Any]) -> Any:
        """A fresh candidate on the device, in the parameter dtype."""
        return measure.build(cand, values, self.device, self.param_dtype)

    def small(self, cand: Candidate) -> _Run:
        """The same passes at CHECK_IN wide on a fresh, loaded pair, after a first random pass."""
        values = canonical(self.values, CHECK_IN)
        run = _Run(values, self.function, self.dtypes, self.gen, self.row)
        n_in, n_out = values["in_features"], values["out_features"]
        params = parameters(n_in, n_out, self.gen, bool(values["bias"]))
        built = self.build(cand, values), own_layer(values)[0]
        run.mods = tuple(run.load(m, params, self.device) for m in built)
        run.held = _held(run.mods[1])
        run.case("random")
        return run

    def inputs(self, device: Any, scale: float = 1.0, n_out: int = 0) -> tuple[Any, Any]:
        """x (ROWS x in) and grad_output (ROWS x out), drawn in float64 on the CPU."""
        n_in, gen, f64 = self.values["in_features"], self.gen, torch.float64
        x = scale * torch.randn(CHECK_ROWS, n_in, generator=gen, dtype=f64)
        gy = torch.randn(CHECK_ROWS, n_out or self.values["out_features"], generator=gen, dtype=f64)
        return x.to(device=device, dtype=self.dtype), gy.to(device=device, dtype=self.dtype)

    def case(
        self, name: str, mods: Any = None, held: Any = None, scale: float = 1.0, xy: Any = None
    ) -> tuple[Any, tuple[Any, Any]]:
        """One case's fwd+bwd of the candidate and torch's own (``mods``, else the run's) with the
        parameters ``held`` (else the run's), judged: x, both outputs."""
        mods, held = mods or self.mods, held or self.held
        x, gy = xy or self.inputs(self.device, scale)
        x = lifecycle.view(name, x) if name in lifecycle.VIEWS else x
        ref = _reference_pass(x.double().cpu(), gy.double().cpu(), held, self.function)
        got, ours = (_pass(m, x, gy, self.autocast) for m in mods)
        if not got["intact"]:
            self.row["flags"].setdefault(FLAG_INPUT_MODIFIED, name)
        self._keep(name, _errors(got, ours, ref))
        return x, (got["y"].cpu(), ours["y"].cpu())

    def _keep(self, name: str, measured: tuple[dict, dict]) -> None:
        """A case's errors, the worst of several modules' (a round trip's two ends)."""
        errors, stats = measured
        have = self.row["cases"].setdefault(name, {})
        have_stats = self.row["stats"].setdefault(name, {})
        for tensor, (got, theirs) in errors.items():
            measure.worst_errors(have, tensor, got, theirs)
            measure.worst_stats(have_stats, tensor, stats[tensor])


def _held(mod: Any) -> dict[str, Any]:
    """A module's parameters as it holds them, in float64 on the CPU (the reference's)."""
    return {k: t.detach().double().cpu() for k, t in mod.state_dict().items() if k in PARAMS}


def _in_use(run: _Run, cand: Candidate) -> None:
    """The cases after the first life (``lifecycle``; docs/checks.md "GatedMLP"), and in fp16 and
    bf16 the overflow case."""
    mods, device = run.mods, run.device
    x = run.inputs(device)[0]
    ref = reference(x.double().cpu(), _held(mods[1]), run.function)
    for case in lifecycle.INFERENCE:
        with lifecycle.inference(case, *mods), measure.autocasting(run.autocast):
            y, y_base = (m(lifecycle.fresh_like(x)).detach().cpu() for m in mods)
        maxima, stats = measure.compare(y, y_base, ref, rows=True)
        run.row["cases"][case], run.row["stats"][case] = {"y": maxima}, {"y": stats}
    deltas = lifecycle.steps(_held(mods[1]), 55)
    for m in mods:
        lifecycle.update_in_place(m, deltas)
    run.case(lifecycle.AFTER_UPDATE, mods, _held(mods[1]))
    square = {**run.values, "out_features": run.values["in_features"]}
    n = square["in_features"]
    source = run.load(own_layer(square)[0], parameters(n, n, run.gen, bool(square["bias"])))
    fresh = run.load(run.build(cand, square), source.state_dict())
    back = run.load(own_layer(square)[0], fresh.state_dict())
    xy = run.inputs(device, n_out=n)
    for m in (fresh, back):
        run.case(lifecycle.LOADED, (m, source), _held(source), xy=xy)
    if run.row["dtype"] in LOW:
        params = _overflowing(run.values, run.gen, bool(run.values["bias"]))
        x, gy = run.inputs(device)
        x[:, 0], gy = 1.0, gy * 0.01  # the gate's offset (its first column); gy * v fits fp16
        mods = (run.load(run.build(cand, run.values), params), run.load(mods[1], params))
        run.case("overflow", mods, _held(mods[1]), xy=(x, gy))


def _overflowing(values: Mapping[str, Any], gen: Any, bias: bool) -> dict[str, Any]:
    """Parameters for the overflow case (x's first column 1): gate -6..-2, |v| up to ~4e4, so
    ``gate(g) * v`` fits fp16 and ``(g * v) * sigma(g)`` does not."""
    n_in, n_out, f64 = values["in_features"], values["out_features"], torch.float64
    gate = 0.1 * torch.randn(n_out, n_in, generator=gen, dtype=f64) / math.sqrt(n_in)
    gate[:, 0] = -6.0 + 4.0 * torch.rand(n_out, generator=gen, dtype=f64)
    value = 1e4 * torch.randn(n_out, n_in, generator=gen, dtype=f64) / math.sqrt(n_in)
    value[:, 0] = 0.0
    out = {"gate_proj.weight": gate, "value_proj.weight": value}
    if bias:
        out.update(
            {f"{p}.bias": torch.zeros(n_out, dtype=f64) for p in ("gate_proj", "value_proj")}
        )
    return out


def _errors(
    got: Mapping[str, Any], ours: Mapping[str, Any], ref: Mapping[str, Any]
) -> tuple[dict[str, list[float]], dict[str, ErrorStats]]:
    errors: dict[str, list[float]] = {}
    stats: dict[str, ErrorStats] = {}
    for name in (n for n in OUTPUTS if ref[n] is not None):
        g, b = (None if t[name] is None else t[name].cpu() for t in (got, ours))
        errors[name], stats[name] = measure.compare(g, b, ref[name], rows=name in ("y", "dx"))
    return errors, stats


def _twin(
    cand: Candidate, values: Mapping[str, Any], mod: Any, x: Any, autocast: tuple[str, Any] | None
) -> dict[str, Any]:
    """The portable twin loaded with the candidate's state dict (strict): how far apart."""
    if not cand.twin_target:
        return measure.incompatible()
    try:
        cls = measure.import_class(cand.twin_target)
        twin = cls(values["in_features"], values["out_features"], **cand.pinned_twin_kwargs(values))
        twin = twin.to(device=x.device, dtype=next(mod.parameters()).dtype)
        twin.load_state_dict(mod.state_dict(), strict=True)
        with torch.no_grad(), measure.autocasting(autocast):
            a, b = mod(x), twin(x)
    except Exception as exc:
        return measure.incompatible(measure.first_line(exc, 300))
    return {"state_dict": "interchangeable", "max_error": measure.rel_err(a, b.to(torch.float64))}


def _mistake(
    row: MeasurementRow, y: Any, y_base: Any, x: Any, held: Mapping[str, Any], function: str
) -> None:
    """Which of ``MISTAKES`` the output matches better than the formula (the verdict names it)."""
    right = measure.compare(y, y_base, reference(x, held, function), rows=True)[0][0]
    for mistake in MISTAKES:
        if mistake == "gelu_tanh" and function != "gelu_erf":
            continue
        wrong = reference(x, held, function, mistake)
        if measure.compare(y, y_base, wrong, rows=True)[0][0] < right / 4:
            row["flags"][FLAG_MISTAKE] = mistake
            return


def check(
    cand: Candidate,
    device: str,
    dtypes: list[tuple[str, str]],
    *,
    canonical_overrides: Mapping[str, Any] | None = None,
    hidden: int | None = None,
    **_: Any,
) -> CheckReply:
    """Raw measurements of one GatedMLP candidate (what ``slots.gated_mlp.judge`` decides on)."""
    try:
        values = canonical(canonical_overrides, hidden or CHECK_IN)
    except ValueError as exc:
        return CheckReply(candidate=cand.id, device=device, phase="build", error=str(exc))
    import_s, stopped = measure.import_stop(cand, device)
    if stopped is not None:
        return stopped
    with measure.one_cpu_thread(device):  # the default check's tensors are small
        rows = [_row(cand, values, d, regime, device) for d, regime in dtypes]
        # what the kernel computes is told in float32, where a formula's mistake (tanh's GELU for
        # erf's) is far above rounding (in bf16 or fp16 it can hide): measured once, said on all
        fp32 = next((r for r in rows if r["dtype"] == "float32"), None)
        if fp32 is None:
            fp32 = _row(cand, values, "float32", "true", device)
        mistake = fp32.get("flags", {}).get(FLAG_MISTAKE)
        if mistake:
            for r in rows:
                r.setdefault("flags", {})[FLAG_MISTAKE] = mistake
    return CheckReply(candidate=cand.id, device=device, rows=rows, import_s=import_s)


def tiny_call(cand: Candidate, device: str) -> None:
    """One tiny forward and backward (``Slot.try_once``: what it raises says why it cannot run)."""
    mod = measure.build(cand, canonical(None, 16), torch_device(device), torch.float32)
    mod(torch.randn(2, 16, device=torch_device(device), requires_grad=True)).sum().backward()


def time_candidate(
    cand: Candidate,
    device: str,
    shapes: list[str],
    dtype_name: str,
    options: Mapping[str, Any],
    progress: Callable[[TimingProgressMessage], None] | None = None,
    regime: str = "true",
    canonical_overrides: Mapping[str, Any] | None = None,
    **_: Any,
) -> TimeReply:
    """fwd+bwd at each ``ROWSxIN`` shape (out: anemoi's gated hidden width), fixed repetitions."""
    tdev, dtype = torch_device(device), measure.torch_dtype(dtype_name)
    param_dtype = torch.float32 if regime == "mixed" else dtype

    def run_shape(text: str, timed: Callable[[Callable[[], None]], TimingRow]) -> None:
        rows, width = parse_shape(text)[:2]
        values = canonical(canonical_overrides, width)
        mod = measure.build(cand, values, tdev, param_dtype)
        x = torch.randn(rows, width, device=tdev, dtype=dtype, requires_grad=True)
        gy = torch.randn(rows, values["out_features"], device=tdev, dtype=dtype)

        def step() -> None:
            mod(x).backward(gy)

        row = timed(step)
        seconds, out = row["median_ms"] / 1e3, values["out_features"]
        # the least a fwd+bwd moves: x and dy in, y and dx out, both weights read twice and their
        # grads written
        moved = dtype.itemsize * (2 * rows * width + 2 * rows * out + 6 * width * out)
        row["gbps"] = moved / seconds / 1e9
        row["tflops"] = 12 * rows * width * out / seconds / 1e12

    opts = {**options, "mode": "fixed"}
    return timing.step_rows(cand.id, device, shapes, dtype_name, opts, progress, run_shape, regime)
