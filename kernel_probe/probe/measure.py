"""What the worker process measures: raw numbers, no verdicts (those are judge.py's).

For one candidate on one device: first, once, what a freshly built candidate is — its parameter
layout against torch.nn's (``layout``: keys and shapes, the mapping between them) and where its
parameters start (``initstats``). Then, for each (dtype, regime), build the candidate and the torch.nn
baseline with the same non-trivial parameters (through the layout's mapping), feed both the hard
inputs of ``cases()``, run forward and backward, and record each one's max relative error against a
float64 reference, plus flags (mutated input or grad_output, output dtype), whether two runs are
bitwise equal, and — where the output dtype differs from torch.nn's — the errors of the small blocks
a norm sits in. The twin check loads the candidate's state into its torch.nn twin.

Everything that touches foreign code runs here, inside the isolated worker.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import math
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kernel_lock import blas as blas_lib
from kernel_lock.slots import CONFUSABLE
from kernel_probe.isolation.protocol import (
    FLAG_GRAD_OUTPUT_MODIFIED,
    FLAG_INPUT_MODIFIED,
    FLAG_OUTPUT_DTYPE,
    CheckReply,
    MeasurementRow,
    alt_key,
)
from kernel_probe.probe import initstats
from kernel_probe.probe.candidates import Candidate, canonical_for, default_for, fill
from kernel_probe.probe.layout import Layout, discover, shapes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHECK_ROWS = 37  # odd on purpose
CHECK_HIDDEN = 1000  # not a power of two on purpose
ALT_SEMANTICS = CONFUSABLE  # kernel_lock.slots declares which semantics a kernel may compute by mistake


# ---- references --------------------------------------------------------------------------------
def reference(semantics: str, x, weight, bias, eps: float):
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


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref|: normwise, so tiny reference entries cannot blow it up."""
    if got is None or ref is None:
        return math.inf if (got is None) != (ref is None) else 0.0
    if got.shape != ref.shape:
        return math.inf
    worst = (got.detach().to(torch.float64) - ref).abs().max().item()  # NaN and inf propagate through max
    if not math.isfinite(worst):
        return math.inf
    scale = ref.abs().max().item()
    return worst / max(scale, 1e-30)


# ---- the BLAS library under a Linear ---------------------------------------------------------------
class BlasNotOffered(Exception):
    """The candidate's BLAS library is not one this torch build offers."""


def blas_device(cand: Candidate, device: str) -> str:
    """The device type whose BLAS libraries name the candidate's (``cuda``/``rocm``); '' where none applies."""
    return blas_lib.device_of(cand.blas) if cand.blas else (device if device in blas_lib.LIBRARIES else "")


@contextlib.contextmanager
def blas_library(cand: Candidate, device: str) -> Iterator[tuple[str, str]]:
    """Run a Linear under its candidate's BLAS library (``cand.blas``; none: the one torch picks by
    itself), restoring the process's previous choice afterwards (the worker serves other candidates).
    Yields (the library in effect, the build's default, i.e. torch's choice before any was set); ("", "")
    where no GPU BLAS library applies. Raises :class:`BlasNotOffered` when the build keeps another."""
    kind = blas_device(cand, device) if cand.semantics == "linear" else ""
    if not kind:
        yield "", ""
        return
    before = torch.backends.cuda.preferred_blas_library()
    default = blas_lib.name_of(before, kind)
    if not cand.blas:
        yield default, default
        return
    now = blas_lib.select(torch, cand.blas)
    try:
        if now != cand.blas:
            raise BlasNotOffered(f"this torch build does not offer {cand.blas}: torch kept {now}")
        yield now, default
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def baseline_blas(cand: Candidate, device: str) -> str:
    """The library torch.nn's baseline runs under when a Linear is checked on a GPU: the classic one
    (cuBLAS, rocBLAS), which torch used for every Linear before the Lt libraries became preferences and
    defaults (on LUMI the divergence came with hipBLASLt, anemoi-core #560). So a library that computes
    worse is judged against the classic library's error, never against its own."""
    kind = blas_device(cand, device) if cand.semantics == "linear" else ""
    return blas_lib.LIBRARIES[kind][0] if kind else ""


@contextlib.contextmanager
def blas_selected(library: str) -> Iterator[None]:
    """Run under ``library`` (''; as it is), then restore the process's choice."""
    if not library:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    blas_lib.select(torch, library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


# ---- inputs ------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    inputs: list  # several inputs run in a row (stateful-cache check)
    residual: bool = False


def cases(semantics: str, hidden: int, dtype, device, gen: torch.Generator, *, mixed: bool = False) -> list[Case]:
    """The inputs real kernels get wrong. Values are generated in float32, then cast."""

    def randn(*shape, scale=1.0, shift=0.0, as_dtype=dtype):
        return (torch.randn(*shape, generator=gen) * scale + shift).to(device=device, dtype=as_dtype)

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
    out.append(
        Case("sequence", [randn(rows, hidden, scale=s, shift=m) for s, m in ((1.0, 0.0), (3.0, -1.0), (0.2, 0.7))])
    )
    # y = f(x) + skip: a backward that writes into grad_output corrupts skip's gradient
    out.append(Case("residual", [randn(rows, hidden, shift=0.2)], residual=True))
    return out


# ---- building ----------------------------------------------------------------------------------
def import_class(target: str):
    module_name, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def build(cand: Candidate, canonical: Mapping[str, Any], device: str, param_dtype):
    cls = import_class(cand.target)
    args = [fill(a, canonical) for a in cand.args]
    kwargs = cand.pinned_kwargs(canonical)
    kwargs.update({k: fill(v, canonical) for k, v in cand.build_kwargs.items()})
    module = cls(*args, **kwargs)
    return module.to(device=device, dtype=param_dtype)


def parameters_for(semantics: str, hidden: int, out_features: int, bias: bool, gen: torch.Generator) -> dict[str, Any]:
    """Weights that are neither ones nor zeros (a kernel ignoring them must fail), under torch.nn's names."""
    if semantics == "linear":
        w = torch.randn(out_features, hidden, generator=gen) / math.sqrt(hidden)
        b = torch.randn(out_features, generator=gen) * 0.5 if bias else None
    else:
        w = 1.0 + 0.5 * torch.randn(hidden, generator=gen)
        b = 0.3 * torch.randn(hidden, generator=gen) if bias else None
    return {"weight": w, "bias": b}


def _state(module) -> dict[str, Any]:
    return dict(module.state_dict(keep_vars=True))


def load_parameters(module, params: Mapping[str, Any], layout: Layout) -> None:
    """Copy torch.nn-named parameters into the module through the layout's mapping."""
    own = _state(module)
    with torch.no_grad():
        for name, value in params.items():
            if value is None or name not in layout.pairs:
                continue
            key, turned = layout.pairs[name]
            target = own[key]
            target.copy_((value.t() if turned else value).to(device=target.device, dtype=target.dtype))


def gradients(module, layout: Layout) -> dict[str, Any]:
    """The module's parameter gradients under torch.nn's names and layout."""
    own = _state(module)
    out = {}
    for name, (key, turned) in layout.pairs.items():
        grad = getattr(own[key], "grad", None)
        out[name] = None if grad is None else (grad.t() if turned else grad).detach()
    return out


# ---- one forward/backward pass -----------------------------------------------------------------
def _run(module, x, gy, skip, autocast: tuple[str, Any] | None, layout: Layout):
    """Forward + backward: output, input gradient, parameter gradients, and whether inputs survived."""
    x = _fresh_like(x)
    x_before = x.clone()
    x.requires_grad_(True)
    for p in module.parameters():
        p.grad = None
    skip_t = skip.detach().clone().requires_grad_(True) if skip is not None else None
    gy_given = gy.clone()
    with _autocast(autocast):
        # the skip branch is recorded *before* the module, so autograd runs the module's backward
        # first and then hands the same gradient buffer to the skip branch: an in-place backward
        # that overwrote grad_output shows up as a wrong skip gradient
        s = skip_t * 1.0 if skip_t is not None else None
        y = module(x)
        out = y + s if s is not None else y
    out.backward(gy_given)
    return {
        "y": y.detach(),
        "dx": x.grad.detach() if x.grad is not None else None,
        "grads": gradients(module, layout),
        "grad_output_intact": bool(torch.equal(gy_given, gy)),
        "input_intact": bool(torch.equal(x.detach(), x_before)),
        "skip_grad": skip_t.grad.detach() if skip_t is not None and skip_t.grad is not None else None,
    }


def _fresh_like(x):
    """A copy with the same layout: a non-contiguous case stays a padded, transposed view."""
    if x.is_contiguous():
        return x.detach().clone()
    shape = list(x.shape)
    buf = torch.empty(shape[1], shape[0], *shape[2:-1], shape[-1] + 8, dtype=x.dtype, device=x.device)
    view = buf[..., : shape[-1]].transpose(0, 1)
    view.copy_(x.detach())
    return view


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _autocast(autocast: tuple[str, Any] | None):
    return torch.autocast(device_type=autocast[0], dtype=autocast[1]) if autocast else _null()


def _reference_pass(semantics, x, gy, params64, eps, skip):
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


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _bits_equal(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


# ---- once per candidate: layout and initialisation -------------------------------------------------
def fresh_differences(cand_module, base_module, layout: Layout) -> list[str]:
    """Where a freshly built candidate starts differently from a freshly built torch.nn module."""
    cand_state, base_state = cand_module.state_dict(), base_module.state_dict()
    out = []
    for name, (key, turned) in layout.pairs.items():
        value = cand_state[key]
        why = initstats.compare(value.t() if turned else value, base_state[name])
        if why is not None:
            out.append(f"{name} {why}")
    return out


# ---- per row: determinism and the blocks a norm sits in -------------------------------------------
DETERMINISM_ROWS = 512


def repeatability(
    module, hidden: int, width: int, dtype, device, autocast, layout: Layout, gen: torch.Generator
) -> str | None:
    """None when two forward+backward runs on the same input give bitwise equal results; else what differed."""
    x = (torch.randn(DETERMINISM_ROWS, hidden, generator=gen) + 0.3).to(device, dtype)
    gy = (torch.randn(DETERMINISM_ROWS, width, generator=gen) * 0.7).to(device, dtype)
    runs = []
    for _ in range(2):
        try:
            m = copy.deepcopy(module)  # a fresh copy, the same parameters
        except Exception:  # some foreign modules do not deepcopy: run the same module twice
            m = module
        runs.append(_run(m, x, gy, None, autocast, layout))
    a, b = runs
    differ = [name for name in ("y", "dx") if not _bits_equal(a[name], b[name])]
    differ += [f"d{name}" for name in a["grads"] if not _bits_equal(a["grads"][name], b["grads"][name])]
    return f"{', '.join(differ)} differ between two runs on the same input" if differ else None


BLOCKS = ("pre-norm", "post-norm")


def _block(kind: str, norm, linear, x):
    return x + linear(norm(x)) if kind == "pre-norm" else norm(x + linear(x))


def blocks(
    mod,
    base_mod,
    semantics: str,
    hidden: int,
    dtype,
    param_dtype,
    device,
    autocast,
    params64,
    eps: float,
    layout: Layout,
    base_layout: Layout,
    gen: torch.Generator,
) -> dict[str, Any]:
    """Errors of the two blocks a norm sits in — pre-norm ``x + Linear(Norm(x))`` and post-norm
    ``Norm(x + Linear(x))`` — with the candidate and with torch.nn, in the row's regime, forward and
    backward, against float64: what a different output dtype changes downstream."""
    w = torch.randn(hidden, hidden, generator=gen) / math.sqrt(hidden)
    bias = torch.randn(hidden, generator=gen) * 0.1
    x = (torch.randn(CHECK_ROWS, hidden, generator=gen) + 0.2).to(device, dtype)
    gy = (torch.randn(CHECK_ROWS, hidden, generator=gen) * 0.7).to(device, dtype)

    def block_errors(kind: str) -> dict[str, list[float]]:
        """One block's errors, with the candidate (index 0) and torch.nn (index 1), against float64."""
        # float64 reference
        x64 = x.detach().double().requires_grad_(True)
        nw = params64["weight"].clone().requires_grad_(True)
        nb = params64["bias"].clone().requires_grad_(True) if params64["bias"] is not None else None
        lw, lb = w.double().to(device), bias.double().to(device)
        y64 = _block(kind, lambda t: reference(semantics, t, nw, nb, eps), lambda t: F.linear(t, lw, lb), x64)
        y64.backward(gy.double())
        ref = {"y": y64.detach(), "dx": x64.grad, "dweight": nw.grad, "dbias": nb.grad if nb is not None else None}
        errs: dict[str, list[float]] = {}
        for i, (module, lay) in enumerate(((mod, layout), (base_mod, base_layout))):
            linear = torch.nn.Linear(hidden, hidden).to(device=device, dtype=param_dtype)
            with torch.no_grad():
                linear.weight.copy_(w)
                linear.bias.copy_(bias)
            for p in module.parameters():
                p.grad = None
            xi = x.detach().clone().requires_grad_(True)
            with _autocast(autocast):
                y = _block(kind, module, linear, xi)
            y.backward(gy)
            got = {"y": y.detach(), "dx": xi.grad, **{f"d{n}": g for n, g in gradients(module, lay).items()}}
            for name, r in ref.items():
                if r is None:
                    continue
                errs.setdefault(name, [0.0, 0.0])[i] = rel_err(got.get(name), r)
        return errs

    out: dict[str, Any] = {}
    for kind in BLOCKS:
        try:
            out[kind] = block_errors(kind)
        except Exception as exc:  # e.g. the next layer refuses the dtype the candidate returns
            out[kind] = {
                "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
            }
    return out


def check(
    cand: Candidate,
    slot: str,
    device: str,
    dtypes: list[tuple[str, str]],
    *,
    hidden: int = CHECK_HIDDEN,
    canonical_overrides: Mapping[str, Any] | None = None,
    seed: int = 0,
    baseline: Candidate | None = None,
) -> CheckReply:
    """Raw measurements of one candidate on one device: layout, initialisation, and per (dtype, regime)
    the errors, flags, determinism and (where the output dtype differs) the blocks. Where it stops
    early, ``phase`` says where (import, baseline, build) and ``error`` why."""
    rows: list[MeasurementRow] = []
    # the reply so far: each step binds what it learnt, and an early stop returns it with the reason
    reply = functools.partial(CheckReply, candidate=cand.id, device=device, rows=rows)
    t0 = time.perf_counter()
    try:
        import_class(cand.target)
    except ImportError as exc:
        return reply(phase="import", error=f"{type(exc).__name__}: {exc}", kind="import")
    except Exception as exc:
        return reply(phase="import", error=f"{type(exc).__name__}: {exc}", kind="exception")
    reply = functools.partial(reply, import_s=time.perf_counter() - t0)
    semantics = cand.semantics
    baseline = baseline or default_for(slot)
    torch_device = "cuda" if device == "rocm" else device
    out_features = 384 if semantics == "linear" else None
    # once, in float32: what a freshly built candidate is, against a freshly built torch.nn module
    canonical32 = canonical_for(
        slot,
        hidden=hidden,
        out_features=out_features,
        device=torch_device,
        param_dtype="float32",
        overrides=canonical_overrides,
    )
    try:
        fresh_base = build(baseline, canonical32, torch_device, torch.float32)
    except Exception as exc:
        return reply(
            phase="baseline", error=f"torch.nn itself cannot be built on {device}: {type(exc).__name__}: {exc}"
        )
    try:
        fresh = build(cand, canonical32, torch_device, torch.float32)
    except Exception as exc:
        return reply(
            phase="build", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=6)[-2000:]
        )
    base_shapes = shapes(fresh_base.state_dict())
    layout = discover(shapes(fresh.state_dict()), base_shapes)
    base_layout = discover(base_shapes, base_shapes)
    reply = functools.partial(reply, layout=layout.to_json())
    if not layout.ok:
        return reply()  # no numerics without a mapping: the verdict says what is missing and unexpected
    reply = functools.partial(reply, init=fresh_differences(fresh, fresh_base, layout))
    with contextlib.ExitStack() as stack:
        try:
            library, default = stack.enter_context(blas_library(cand, device))
        except BlasNotOffered as exc:
            return reply(phase="blas", error=str(exc))
        _measure_rows(
            cand,
            slot,
            device,
            dtypes,
            hidden,
            out_features,
            canonical_overrides,
            seed,
            baseline,
            layout,
            base_layout,
            rows,
        )
    return reply(blas=library, blas_default=default)


def _measure_rows(
    cand: Candidate,
    slot: str,
    device: str,
    dtypes: list[tuple[str, str]],
    hidden: int,
    out_features: int | None,
    canonical_overrides: Mapping[str, Any] | None,
    seed: int,
    baseline: Candidate,
    layout: Layout,
    base_layout: Layout,
    rows: list[MeasurementRow],
) -> None:
    """Per (dtype, regime): the errors, flags, determinism and blocks, appended to ``rows``."""
    semantics = cand.semantics
    torch_device = "cuda" if device == "rocm" else device
    for dtype_name, regime in dtypes:
        dtype = DTYPES[dtype_name]
        mixed = regime == "mixed"
        param_dtype = torch.float32 if mixed else dtype
        canonical = canonical_for(
            slot,
            hidden=hidden,
            out_features=out_features,
            device=torch_device,
            param_dtype=_dtype_name(param_dtype),
            overrides=canonical_overrides,
        )
        row: MeasurementRow = {"dtype": dtype_name, "regime": regime, "cases": {}, "flags": {}}
        rows.append(row)
        gen = torch.Generator().manual_seed(seed)
        bias = bool(canonical.get("bias", False)) if semantics != "rms_norm" else False
        params = parameters_for(semantics, hidden, canonical["out_features"], bias, gen)
        params64 = {k: (v.to(torch.float64).to(torch_device) if v is not None else None) for k, v in params.items()}
        autocast = (torch_device, dtype) if mixed else None
        width = canonical["out_features"] if semantics == "linear" else hidden
        eps = canonical.get("eps", 0.0)
        try:
            base_mod = build(baseline, canonical, torch_device, param_dtype)
            load_parameters(base_mod, params, base_layout)
            x_probe = torch.randn(2, hidden, generator=gen).to(torch_device, dtype)
            _run(base_mod, x_probe, torch.ones(2, width, device=torch_device, dtype=dtype), None, autocast, base_layout)
        except Exception as exc:
            row["skipped"] = f"torch.nn itself fails for {dtype_name} {regime} on {device}: {type(exc).__name__}: {exc}"
            continue
        try:
            t_build = time.perf_counter()
            mod = build(cand, canonical, torch_device, param_dtype)
            load_parameters(mod, params, layout)
            for case in cases(semantics, hidden, dtype, torch_device, gen, mixed=mixed):
                errs: dict[str, list[float]] = {}
                for x in case.inputs:
                    out_shape = (*x.shape[:-1], width)
                    gy = (torch.randn(*out_shape, generator=gen) * 0.7 + 0.1).to(torch_device, x.dtype)
                    skip = (torch.randn(*out_shape, generator=gen)).to(torch_device, x.dtype) if case.residual else None
                    ref = _reference_pass(semantics, x, gy, params64, eps, skip)
                    got = _run(mod, x, gy, skip, autocast, layout)
                    with blas_selected(baseline_blas(cand, device)):
                        base = _run(base_mod, x, gy, skip, autocast, base_layout)
                    pairs = {
                        "y": (got["y"], base["y"], ref["y"]),
                        "dx": (got["dx"], base["dx"], ref["dx"]),
                        "dweight": (got["grads"].get("weight"), base["grads"].get("weight"), ref["weight"]),
                    }
                    if ref["bias"] is not None:
                        pairs["dbias"] = (got["grads"].get("bias"), base["grads"].get("bias"), ref["bias"])
                    if case.residual:
                        pairs["dskip"] = (got["skip_grad"], base["skip_grad"], ref["skip"])
                    for name, (g, b, r) in pairs.items():
                        e = errs.setdefault(name, [0.0, 0.0])
                        e[0] = max(e[0], rel_err(g, r))
                        e[1] = max(e[1], rel_err(b, r))
                    if semantics in ALT_SEMANTICS and case.name in ("random", "tiny-variance"):
                        # an RMSNorm offered as a LayerNorm usually has no bias either: take the closer
                        alt_err = min(
                            rel_err(
                                got["y"],
                                reference(
                                    ALT_SEMANTICS[semantics], x.detach().to(torch.float64), params64["weight"], b, eps
                                ),
                            )
                            for b in (params64["bias"], None)
                        )
                        e = errs.setdefault(alt_key(ALT_SEMANTICS[semantics]), [0.0, 0.0])
                        e[0] = max(e[0], alt_err)
                        e[1] = max(e[1], rel_err(base["y"], ref["y"]))  # tolerance basis: torch.nn on its own maths
                    flags = row["flags"]
                    if not got["grad_output_intact"]:
                        flags.setdefault(FLAG_GRAD_OUTPUT_MODIFIED, case.name)
                    if not got["input_intact"]:
                        flags.setdefault(FLAG_INPUT_MODIFIED, case.name)
                    if got["y"].dtype != base["y"].dtype:
                        flags.setdefault(
                            FLAG_OUTPUT_DTYPE,
                            f"{_dtype_name(got['y'].dtype)} (torch.nn: {_dtype_name(base['y'].dtype)}) "
                            f"for {_dtype_name(x.dtype)} input",
                        )
                row["cases"][case.name] = errs
            row["out_dtype"] = _dtype_name(got["y"].dtype)
            row["nondeterministic"] = repeatability(mod, hidden, width, dtype, torch_device, autocast, layout, gen)
            if FLAG_OUTPUT_DTYPE in row["flags"] and semantics in ALT_SEMANTICS:
                row["blocks"] = blocks(
                    mod,
                    base_mod,
                    semantics,
                    hidden,
                    dtype,
                    param_dtype,
                    torch_device,
                    autocast,
                    params64,
                    eps,
                    layout,
                    base_layout,
                    gen,
                )
            row["seconds"] = time.perf_counter() - t_build
            row["twin"] = _twin_check(
                cand, slot, mod, canonical, torch_device, param_dtype, dtype, autocast, gen, layout
            )
        except Exception as exc:
            row["exception"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc(limit=6)[-2000:]


def _twin_check(
    cand, slot, mod, canonical, device, param_dtype, dtype, autocast, gen, layout: Layout
) -> dict[str, Any]:
    """Does the candidate's state dict load into its torch.nn twin through the layout's migration,
    and do they then agree?"""
    from kernel_lock.checkpoint import migrate_module_state, parse_rule

    if not cand.twin_target:
        return {"state_dict": "incompatible", "reason": "no twin declared"}
    twin_cand = Candidate(
        "twin",
        (slot,),
        cand.semantics,
        cand.twin_target,
        args=cand.args if cand.args != ("$hidden",) else ("$normalized_shape",),
        kwargs=cand.twin_kwargs,
    )
    twin = build(twin_cand, canonical, device, param_dtype)
    rules = [parse_rule(r) for r in layout.rules]
    migrated = migrate_module_state(mod.state_dict(), [r for r in rules if r is not None])
    try:
        twin.load_state_dict(migrated, strict=True)
    except Exception as exc:
        return {"state_dict": "incompatible", "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}
    x = (torch.randn(CHECK_ROWS, canonical["normalized_shape"], generator=gen) + 0.3).to(device, dtype)
    with torch.no_grad(), _autocast(autocast):
        a, b = mod(x), twin(x)
    return {
        "state_dict": "migrate" if layout.rules else "interchangeable",
        "migration": list(layout.rules),
        "max_error": rel_err(a, b.to(torch.float64)),
    }


def try_once(cand: Candidate, slot: str, device: str) -> dict[str, Any]:
    """On a device the candidate does not declare: build it and run one tiny forward, to capture
    the concrete reason it cannot run (or the fact that it silently runs something else)."""
    torch_device = "cuda" if device == "rocm" else device
    canonical = canonical_for(slot, hidden=64, out_features=64, device=torch_device)
    try:
        mod = build(cand, canonical, torch_device, torch.float32)
        x = torch.randn(4, 64, device=torch_device)
        mod(x).sum().backward()
    except Exception as exc:
        return {
            "ran": False,
            "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500],
        }
    return {"ran": True}
