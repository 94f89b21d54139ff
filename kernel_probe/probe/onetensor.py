"""The layers with parameters that map one tensor (LayerNorm, RMSNorm, Linear), as the worker
measures them: a Linear's BLAS library, float64 maths, non-trivial parameters, hard inputs, one
forward+backward pass, where fresh parameters start, and a row's checks after its cases.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kernel_lock.checkpoint import migrate_module_state, parse_rule
from kernel_lock.slots import linear as blas_lib
from kernel_probe.candidates import Candidate
from kernel_probe.isolation.protocol import interpreter_requested
from kernel_probe.probe import lifecycle, measure
from kernel_probe.probe.layout import Layout
from kernel_probe.probe.measure import autocasting

if TYPE_CHECKING:  # correctness builds on this module
    from kernel_probe.probe.correctness import Bench, Row


# ---- the BLAS library a Linear runs under on a GPU (names: kernel_lock.slots.linear) ------------
class BlasNotOffered(Exception):
    """The candidate's BLAS library is not one this torch build offers."""


def blas_device(cand: Candidate, device: str) -> str:
    """The device type whose BLAS libraries name the candidate's ('': none applies)."""
    if cand.blas:
        return blas_lib.device_of(cand.blas)
    return device if device in blas_lib.LIBRARIES else ""


@contextlib.contextmanager
def blas_library(cand: Candidate, device: str) -> Iterator[tuple[str, str]]:
    """Run a Linear under its BLAS library; yields (the one in effect, the build's default)."""
    kind = blas_device(cand, device) if cand.semantics == "linear" else ""
    if not kind:
        yield "", ""
        return
    default = blas_lib.name_of(torch.backends.cuda.preferred_blas_library(), kind)
    if not cand.blas:
        yield default, default
        return
    with blas_selected(cand.blas) as now:
        if now != cand.blas:
            raise BlasNotOffered(f"this torch build does not offer {cand.blas}: torch kept {now}")
        yield now, default


def baseline_blas(cand: Candidate, device: str) -> str:
    """A Linear's baseline library on a GPU: the classic one (cuBLAS, rocBLAS), so one computing
    worse (hipBLASLt, anemoi-core #560) is judged by it."""
    kind = blas_device(cand, device) if cand.semantics == "linear" else ""
    return blas_lib.LIBRARIES[kind][0] if kind else ""


@contextlib.contextmanager
def blas_selected(library: str) -> Iterator[str]:
    """Run under ``library`` ('': as it is), then restore the process's choice; yields the one
    torch kept."""
    if not library:
        yield ""
        return
    before = torch.backends.cuda.preferred_blas_library()
    now = blas_lib.select(torch, library)
    try:
        yield now
    finally:
        torch.backends.cuda.preferred_blas_library(before)


# ---- a layer with parameters that maps one tensor: its float64 maths ----------------------------
def eps_for(eps: float | None, dtype: Any) -> float:
    """The eps a norm adds for an input of ``dtype``; None: torch.nn.RMSNorm's rule as torch 2.13
    computes it, the machine epsilon of the accumulation type (float32's for a low-precision input,
    not the documented finfo(x.dtype).eps)."""
    return float(torch.finfo(torch.promote_types(dtype, torch.float32)).eps) if eps is None else eps


def reference(semantics: str, x: Any, weight: Any, bias: Any, eps: float) -> Any:
    """The slot's maths in float64 (inputs already float64)."""
    if semantics == "layer_norm":
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    if semantics == "rms_norm":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        y = y * weight if weight is not None else y
        return y + bias if bias is not None else y
    if semantics == "linear":
        return F.linear(x, weight, bias)
    raise ValueError(semantics)


def reference_pass(
    semantics: str, x: Any, gy: Any, params64: Mapping[str, Any], eps: float | None, skip: Any
) -> dict[str, Any]:
    """The float64 reference's forward and backward: y, dx, the parameters' and skip's gradients
    (an eps of None: ``x``'s dtype's, as torch computes it)."""
    eps = eps_for(eps, x.dtype)
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    w = params64["weight"].clone().requires_grad_(True)
    b = params64["bias"].clone().requires_grad_(True) if params64["bias"] is not None else None
    y = reference(semantics, x64, w, b, eps)
    y.backward(gy.to(torch.float64))
    return {
        "y": y.detach(),
        "dx": x64.grad,
        "weight": w.grad,
        "bias": b.grad if b is not None else None,
        "skip": gy.to(torch.float64) if skip is not None else None,
    }


def parameters_for(
    semantics: str, canonical: Mapping[str, Any], gen: torch.Generator
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Weights neither ones nor zeros (a kernel ignoring them must fail), under torch.nn's names, at
    ``canonical``'s size, with its bias (an RMSNorm's: none); and in float64 on its device."""
    hidden, out_features = canonical["hidden"], canonical["out_features"]
    bias = semantics != "rms_norm" and bool(canonical.get("bias", False))
    if semantics == "linear":
        w = torch.randn(out_features, hidden, generator=gen) / math.sqrt(hidden)
        b = torch.randn(out_features, generator=gen) * 0.5 if bias else None
    else:
        w = 1.0 + 0.5 * torch.randn(hidden, generator=gen)
        b = 0.3 * torch.randn(hidden, generator=gen) if bias else None
    params, device = {"weight": w, "bias": b}, canonical["device"]
    return params, {
        k: v if v is None else v.to(torch.float64).to(device) for k, v in params.items()
    }


def load_parameters(module: Any, params: Mapping[str, Any], layout: Layout) -> None:
    """Copy torch.nn-named parameters into the module through the layout's mapping."""
    own = dict(module.state_dict(keep_vars=True))
    with torch.no_grad():
        for name, value in params.items():
            if value is None or name not in layout.pairs:
                continue
            key, turned = layout.pairs[name]
            target = own[key]
            value = value.t() if turned else value
            target.copy_(value.to(device=target.device, dtype=target.dtype))


def gradients(module: Any, layout: Layout) -> dict[str, Any]:
    """The module's parameter gradients under torch.nn's names and layout."""
    own = dict(module.state_dict(keep_vars=True))
    grads = {name: (getattr(own[key], "grad", None), t) for name, (key, t) in layout.pairs.items()}
    return {n: None if g is None else (g.t() if t else g).detach() for n, (g, t) in grads.items()}


# ---- the hard inputs, and one forward/backward pass ---------------------------------------------
CHECK_ROWS = 37  # odd on purpose


@dataclass
class Case:
    """One hard input of the checks: its name (a ``judge.HINTS`` key), the tensors run in a row."""

    name: str
    inputs: list  # several inputs run in a row (stateful-cache check)
    residual: bool = False


def cases(
    semantics: str, hidden: int, dtype, device, gen: torch.Generator, *, mixed: bool = False
) -> list[Case]:
    """The inputs real kernels get wrong. Values are generated in float32, then cast."""

    def randn(*shape, scale=1.0, shift=0.0, as_dtype=dtype):
        x = torch.randn(*shape, generator=gen) * scale + shift
        return x.to(device=device, dtype=as_dtype)

    rows = CHECK_ROWS
    out = [Case("random", [randn(rows, hidden, shift=0.3)])]
    if mixed:
        # under autocast a pre-norm residual stream reaches the norm in float32 (parameters and the
        # stream are float32; only matmul outputs are low precision): the input real models feed it
        out.append(Case("float32-input", [randn(rows, hidden, shift=0.3, as_dtype=torch.float32)]))
    if semantics != "linear":
        # variance far below eps: the result depends on eps itself (catches a wrong default eps)
        shift = 0.5 if semantics == "layer_norm" else 0.0
        out.append(Case("tiny-variance", [randn(rows, hidden, scale=1e-3, shift=shift)]))
        # a large mean over a small spread: one-pass E[x^2]-E[x]^2 cancels catastrophically
        out.append(Case("large-mean", [randn(rows, hidden, scale=1.0, shift=1000.0)]))
    # x^2 overflows fp16 (65504) when a kernel squares in the input dtype
    out.append(Case("large-magnitude", [randn(rows, hidden, scale=1000.0)]))
    # hidden size not a multiple of the block, rows that are views with a larger stride, 3-D
    base = randn(3, 16, hidden + 8, shift=0.1)
    out.append(Case("non-contiguous-3d", [base[..., :hidden].transpose(0, 1)]))
    # several different inputs in a row: a kernel that caches state between calls fails
    scales = ((1.0, 0.0), (3.0, -1.0), (0.2, 0.7))
    out.append(Case("sequence", [randn(rows, hidden, scale=s, shift=m) for s, m in scales]))
    # y = f(x) + skip: a backward that writes into grad_output corrupts skip's gradient
    out.append(Case("residual", [randn(rows, hidden, shift=0.2)], residual=True))
    return out


def run_pass(
    module: Any, x: Any, gy: Any, skip: Any, autocast: tuple[str, Any] | None, layout: Layout
) -> dict[str, Any]:
    """Forward + backward: y, dx, the parameters' gradients, and whether the inputs survived."""
    x = lifecycle.fresh_like(x)  # a view stays a view
    x_before = x.clone()
    x.requires_grad_(True)
    for p in module.parameters():
        p.grad = None
    skip_t = skip.detach().clone().requires_grad_(True) if skip is not None else None
    gy_given = gy.clone()
    with autocasting(autocast):
        # the skip branch recorded *before* the module: autograd hands the skip branch the buffer
        # the module's backward got, so overwriting grad_output shows as a wrong skip gradient
        s = skip_t * 1.0 if skip_t is not None else None
        y = module(x)
        out = y + s if s is not None else y
    out.backward(gy_given)
    skip_grad = skip_t.grad if skip_t is not None else None
    return {
        "y": y.detach(),
        "dx": x.grad.detach() if x.grad is not None else None,
        "grads": gradients(module, layout),
        "grad_output_intact": bool(torch.equal(gy_given, gy)),
        "input_intact": bool(torch.equal(x.detach(), x_before)),
        "skip_grad": skip_grad.detach() if skip_grad is not None else None,
    }


def bits_equal(a: Any, b: Any) -> bool:
    """Bitwise equality (NaNs included), same shape and dtype; two Nones are equal."""
    if a is None or b is None:
        return a is b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


# ---- where a fresh candidate's parameters start (docs/checks.md, "Initialisation") --------------
# Deterministic ones must be equal; random ones from torch.nn's distribution, by four tests at
# ALPHA each: values beyond torch.nn's largest (exact law), means, log variance ratio, KS.
ALPHA = 1e-6  # false-alarm rate of each test
Z = 4.8916  # two-sided normal quantile at ALPHA


def describe(t: torch.Tensor) -> str:
    """A tensor's values in words: zeros, ones, a constant, or mean, std and range."""
    t = t.detach().double().flatten()
    if t.numel() == 0:
        return "empty"
    lo, hi = t.min().item(), t.max().item()
    if lo == hi:
        return {0.0: "zeros", 1.0: "ones"}.get(lo, f"the constant {lo:.6g}")
    mean, std = t.mean().item(), t.std().item()
    return f"values with mean {mean:.4g}, std {std:.4g} in [{lo:.4g}, {hi:.4g}]"


def _exceedance_quantile(n: int, m: int, alpha: float) -> int:
    """The smallest k with P(count > k) < alpha, count: how many of n draws exceed the max of m."""
    # from one continuous distribution, P(count >= j) = prod_{i<j} (n-i)/(n+m-i) (exact)
    tail = 1.0  # tail = P(count >= k + 1) once multiplied by the next factor
    for k in range(n):
        tail *= (n - k) / (n + m - k)
        if tail < alpha:
            return k
    return n


def _ks(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic (sup |F_a - F_b|)."""
    a, b = a.sort().values, b.sort().values
    points = torch.cat([a, b])
    fa = torch.searchsorted(a, points, right=True).double() / a.numel()
    fb = torch.searchsorted(b, points, right=True).double() / b.numel()
    return float((fa - fb).abs().max())


def same_distribution(candidate: torch.Tensor, reference: torch.Tensor) -> list[str]:
    """The tests ``candidate`` fails as a draw from ``reference``'s distribution (empty: none)."""
    c, r = candidate.detach().double().flatten(), reference.detach().double().flatten()
    n, m = c.numel(), r.numel()
    failed = []
    bound = r.abs().max().item()
    beyond = int((c.abs() > bound).sum())
    allowed = _exceedance_quantile(n, m, ALPHA)
    if beyond > allowed:
        failed.append(
            f"{beyond} values beyond torch.nn's bound {bound:.4g} (at most {allowed} expected)"
        )
    var_c, var_r = c.var().item(), r.var().item()
    z = (c.mean().item() - r.mean().item()) / math.sqrt(max(var_c / n + var_r / m, 1e-300))
    if abs(z) > Z:
        failed.append(f"mean differs (z = {z:.1f})")
    if var_c > 0 and var_r > 0:
        zl = math.log(var_c / var_r) / math.sqrt(2.0 / n + 2.0 / m)
        if abs(zl) > Z:
            failed.append(f"spread differs (std {math.sqrt(var_c):.4g} vs {math.sqrt(var_r):.4g})")
    d = _ks(c, r)
    critical = math.sqrt(-math.log(ALPHA / 2) * (n + m) / (2.0 * n * m))
    if d > critical:
        failed.append(f"distribution differs (Kolmogorov-Smirnov D = {d:.4f} > {critical:.4f})")
    return failed


def init_difference(candidate: torch.Tensor, reference: torch.Tensor) -> str | None:
    """Why a fresh parameter does not start like torch.nn's ``reference`` (None: it does)."""
    c, r = candidate.detach().float().cpu(), reference.detach().float().cpu()
    if c.shape != r.shape:
        return f"has shape {tuple(c.shape)}, torch.nn {tuple(r.shape)}"
    if not r.numel():
        return None  # two empty parameters start alike
    if r.min() == r.max():  # deterministic: ones, zeros, a constant
        if torch.equal(c, r):
            return None
        return f"starts as {describe(c)}; torch.nn starts as {describe(r)}"
    failed = same_distribution(c, r)
    if not failed:
        return None
    return (
        f"starts as {describe(c)}; torch.nn draws {describe(r)}: {'; '.join(failed)} "
        f"(each test at a false-alarm rate of {ALPHA:g})"
    )


def fresh_differences(cand_module: Any, base_module: Any, layout: Layout) -> list[str]:
    """Where a freshly built candidate starts differently from a freshly built torch.nn module."""
    cand_state, base_state = cand_module.state_dict(), base_module.state_dict()
    whys = (
        (
            name,
            init_difference(cand_state[key].t() if turned else cand_state[key], base_state[name]),
        )
        for name, (key, turned) in layout.pairs.items()
    )
    return [f"{name} {why}" for name, why in whys if why is not None]


# ---- per row, after the cases: determinism, the blocks a norm sits in, the twin -----------------
DETERMINISM_ROWS = 512
BLOCKS = ("pre-norm", "post-norm")


def determinism_rows() -> int:
    """512 rows, enough for a GPU kernel's reduction to span many programs; under Triton's
    interpreter, which runs a kernel's programs one after another (no race to lose), the check's
    own 37: the run still catches an output that depends on anything but its inputs, at a fourteenth
    of the interpreted cost."""
    return CHECK_ROWS if interpreter_requested() else DETERMINISM_ROWS


def repeatability(bench: Bench, setup: Row, layout: Layout) -> str | None:
    """None when two runs on the same input, each on a candidate freshly built with the row's
    parameters, are bitwise equal; else what differed. Built, never copied: a copy carries what
    the first is holding (a cached weight)."""
    device, gen, rows = bench.torch_device, setup.gen, determinism_rows()
    x = (torch.randn(rows, bench.hidden, generator=gen) + 0.3).to(device, setup.dtype)
    gy = (torch.randn(rows, setup.width, generator=gen) * 0.7).to(device, setup.dtype)
    runs = []
    for _ in range(2):
        m = measure.build(bench.cand, setup.canonical, device, setup.param_dtype)
        load_parameters(m, setup.params, layout)
        runs.append(run_pass(m, x, gy, None, setup.autocast, layout))
    a, b = runs
    differ = [name for name in ("y", "dx") if not bits_equal(a[name], b[name])]
    differ += [f"d{n}" for n in a["grads"] if not bits_equal(a["grads"][n], b["grads"][n])]
    return f"{', '.join(differ)} differ between two runs on the same input" if differ else None


def blocks(
    bench: Bench, setup: Row, cand: tuple[Any, Layout], base: tuple[Any, Layout]
) -> dict[str, Any]:
    """The errors of the blocks a norm sits in: what a different output dtype changes downstream."""
    hidden, device, gen = bench.hidden, bench.torch_device, setup.gen
    w = torch.randn(hidden, hidden, generator=gen) / math.sqrt(hidden)
    bias = torch.randn(hidden, generator=gen) * 0.1
    x = (torch.randn(CHECK_ROWS, hidden, generator=gen) + 0.2).to(device, setup.dtype)
    gy = (torch.randn(CHECK_ROWS, hidden, generator=gen) * 0.7).to(device, setup.dtype)
    out: dict[str, Any] = {}
    for kind in BLOCKS:
        try:
            out[kind] = _block_errors(bench, setup, kind, (w, bias, x, gy), (cand, base))
        except Exception as exc:  # e.g. the next layer refuses the dtype the candidate returns
            out[kind] = {"error": measure.first_line(exc, 300)}
    return out


def _block_errors(bench: Bench, setup: Row, kind: str, drawn: tuple, mods: tuple) -> dict:
    """One block's errors, with the candidate (index 0) and torch.nn (index 1), against float64."""
    (w, bias, x, gy), hidden, device = drawn, bench.hidden, bench.torch_device
    p64 = setup.params64
    nw = p64["weight"].clone().requires_grad_(True)
    nb = p64["bias"].clone().requires_grad_(True) if p64["bias"] is not None else None
    lw, lb = w.double().to(device), bias.double().to(device)
    semantics, eps = bench.cand.semantics, eps_for(setup.eps, x.dtype)
    norm = functools.partial(reference, semantics, weight=nw, bias=nb, eps=eps)
    ref = _block_pass(kind, norm, lambda t: F.linear(t, lw, lb), x.double(), gy.double(), None)
    ref.update(dweight=nw.grad, dbias=nb.grad if nb is not None else None)
    errs: dict[str, list[float]] = {}
    for i, (module, lay) in enumerate(mods):
        linear = torch.nn.Linear(hidden, hidden).to(device=device, dtype=setup.param_dtype)
        with torch.no_grad():
            linear.weight.copy_(w)
            linear.bias.copy_(bias)
        for p in module.parameters():
            p.grad = None
        got = _block_pass(kind, module, linear, x, gy, setup.autocast)
        got.update({f"d{n}": g for n, g in gradients(module, lay).items()})
        for name, r in ref.items():
            if r is not None:
                errs.setdefault(name, [0.0, 0.0])[i] = measure.rel_err(got.get(name), r)
    return errs


def _block_pass(kind: str, norm: Any, linear: Any, x: Any, gy: Any, autocast: Any) -> dict:
    """The block's forward and backward on a leaf copy of ``x``: y and dx."""
    x = x.detach().clone().requires_grad_(True)
    with measure.autocasting(autocast):
        y = x + linear(norm(x)) if kind == "pre-norm" else norm(x + linear(x))
    y.backward(gy)
    return {"y": y.detach(), "dx": x.grad}


def twin_check(bench: Bench, setup: Row, mod: Any, layout: Layout) -> dict[str, Any]:
    """The candidate's state loaded into its torch.nn twin through the layout's migration."""
    cand = bench.cand
    args = cand.args if cand.args != ("$hidden",) else ("$normalized_shape",)
    twin_cand = measure.twin_candidate(cand, bench.slot, args)
    if twin_cand is None:
        return measure.incompatible()
    device, canonical = bench.torch_device, setup.canonical
    twin = measure.build(twin_cand, canonical, device, setup.param_dtype)
    rules = [parse_rule(r) for r in layout.rules]
    migrated = migrate_module_state(mod.state_dict(), [r for r in rules if r is not None])
    try:
        twin.load_state_dict(migrated, strict=True)
    except Exception as exc:
        return measure.incompatible(f"{type(exc).__name__}: {str(exc)[:300]}")
    x = torch.randn(CHECK_ROWS, canonical["normalized_shape"], generator=setup.gen) + 0.3
    x = x.to(device, setup.dtype)
    with torch.no_grad(), measure.autocasting(setup.autocast):
        a, b = mod(x), twin(x)
    return {
        "state_dict": "migrate" if layout.rules else "interchangeable",
        "migration": list(layout.rules),
        "max_error": measure.rel_err(a, b.to(torch.float64)),
    }
