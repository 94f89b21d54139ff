"""What the worker process measures: raw numbers, no verdicts (those are judge.py's).

Correctness: for one candidate on one device, for each (dtype, regime), build the candidate and the
torch.nn baseline with the same non-trivial parameters, feed both the hard inputs of ``cases()``,
run forward and backward, and record each one's max relative error against a float64 reference,
plus flags (mutated input or grad_output, non-finite output, output dtype). Timing lives here too.

Everything that touches foreign code runs here, inside the isolated worker.
"""

from __future__ import annotations

import importlib
import math
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .candidates import Candidate, canonical_for, default_for, fill

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHECK_ROWS = 37  # odd on purpose
CHECK_HIDDEN = 1000  # not a power of two on purpose
ALT_SEMANTICS = {"layer_norm": "rms_norm", "rms_norm": "layer_norm"}


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
    got = got.detach().to(torch.float64)
    if not torch.isfinite(got).all():
        return math.inf
    scale = ref.abs().max().item()
    return (got - ref).abs().max().item() / max(scale, 1e-30)


# ---- inputs ------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    inputs: list  # several inputs run in a row (stateful-cache check)
    residual: bool = False


def cases(semantics: str, hidden: int, dtype, device, gen: torch.Generator) -> list[Case]:
    """The inputs real kernels get wrong. Values are generated in float32, then cast."""

    def randn(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=gen) * scale + shift).to(device=device, dtype=dtype)

    rows = CHECK_ROWS
    out = [Case("random", [randn(rows, hidden, shift=0.3)])]
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
    out.append(Case("sequence", [randn(rows, hidden, scale=s, shift=m) for s, m in ((1.0, 0.0), (3.0, -1.0), (0.2, 0.7))]))
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
    """Weights that are neither ones nor zeros (a kernel ignoring them must fail)."""
    if semantics == "linear":
        w = torch.randn(out_features, hidden, generator=gen) / math.sqrt(hidden)
        b = torch.randn(out_features, generator=gen) * 0.5 if bias else None
    else:
        w = 1.0 + 0.5 * torch.randn(hidden, generator=gen)
        b = 0.3 * torch.randn(hidden, generator=gen) if bias else None
    return {"weight": w, "bias": b}


def canonical_parameters(module) -> dict[str, Any]:
    """The module's parameters under the canonical names (weight, bias). A wrapper holding the
    norm as a submodule (`norm.weight`) is matched by a unique suffix."""
    own = dict(module.named_parameters())
    for name in ("weight", "bias"):
        if name not in own:
            hits = [k for k in own if k.endswith("." + name)]
            if len(hits) == 1:
                own[name] = own[hits[0]]
    return own


def load_parameters(module, params: Mapping[str, Any]) -> list[str]:
    """Copy our parameters into the module by name; return the names it lacks."""
    own = canonical_parameters(module)
    missing = []
    with torch.no_grad():
        for name, value in params.items():
            if name in own:
                if value is None:
                    own[name].zero_()  # e.g. liger's always-present bias, when the slot has none
                else:
                    own[name].copy_(value.to(own[name].dtype))
            elif value is not None:
                missing.append(name)
    return missing


# ---- one forward/backward pass -----------------------------------------------------------------
def _run(module, x, gy, skip, autocast: tuple[str, Any] | None):
    """Forward + backward; returns (y, dx, dparams, grad_output_intact, x_intact, skip_grad)."""
    x = _fresh_like(x)
    x_before = x.clone()
    x.requires_grad_(True)
    for p in module.parameters():
        p.grad = None
    skip_t = skip.detach().clone().requires_grad_(True) if skip is not None else None
    gy_given = gy.clone()
    ctx = torch.autocast(device_type=autocast[0], dtype=autocast[1]) if autocast else _null()
    with ctx:
        # the skip branch is recorded *before* the module, so autograd runs the module's backward
        # first and then hands the same gradient buffer to the skip branch: an in-place backward
        # that overwrote grad_output shows up as a wrong skip gradient
        s = skip_t * 1.0 if skip_t is not None else None
        y = module(x)
        out = y + s if s is not None else y
    out.backward(gy_given)
    grads = {n: (p.grad.detach() if p.grad is not None else None) for n, p in canonical_parameters(module).items()}
    return {
        "y": y.detach(),
        "dx": x.grad.detach() if x.grad is not None else None,
        "grads": grads,
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


def _reference_pass(semantics, x, gy, params64, eps, skip):
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    w = params64["weight"].clone().requires_grad_(True)
    b = params64["bias"].clone().requires_grad_(True) if params64["bias"] is not None else None
    y = reference(semantics, x64, w, b, eps)
    y.backward(gy.to(torch.float64))
    return {"y": y.detach(), "dx": x64.grad, "weight": w.grad, "bias": b.grad if b is not None else None,
            "skip": gy.to(torch.float64) if skip is not None else None}  # fmt: skip


def check(cand: Candidate, slot: str, device: str, dtypes: list[tuple[str, str]], *, hidden: int = CHECK_HIDDEN,
          canonical_overrides: Mapping[str, Any] | None = None, seed: int = 0) -> dict[str, Any]:
    """Raw correctness measurements of one candidate on one device, for each (dtype, regime)."""
    result: dict[str, Any] = {"candidate": cand.id, "device": device, "rows": []}
    t0 = time.perf_counter()
    try:
        import_class(cand.target)
    except ImportError as exc:
        result.update(phase="import", error=f"{type(exc).__name__}: {exc}", kind="import")
        return result
    except Exception as exc:
        result.update(phase="import", error=f"{type(exc).__name__}: {exc}", kind="exception")
        return result
    result["import_s"] = time.perf_counter() - t0
    semantics = cand.semantics
    baseline = default_for(slot)
    torch_device = "cuda" if device == "rocm" else device
    for dtype_name, regime in dtypes:
        dtype = DTYPES[dtype_name]
        mixed = regime == "mixed"
        param_dtype = torch.float32 if mixed else dtype
        canonical = canonical_for(slot, hidden=hidden, out_features=384 if semantics == "linear" else None,
                                  device=torch_device, param_dtype=str(param_dtype).replace("torch.", ""),
                                  overrides=canonical_overrides)  # fmt: skip
        row: dict[str, Any] = {"dtype": dtype_name, "regime": regime, "cases": {}, "flags": {}}
        result["rows"].append(row)
        gen = torch.Generator().manual_seed(seed)
        bias = bool(canonical.get("bias", False)) if semantics != "rms_norm" else False
        params = parameters_for(semantics, hidden, canonical["out_features"], bias, gen)
        params64 = {k: (v.to(torch.float64).to(torch_device) if v is not None else None) for k, v in params.items()}
        autocast = (torch_device, dtype) if mixed else None
        try:
            base_mod = build(baseline, canonical, torch_device, param_dtype)
            load_parameters(base_mod, params)
            x_probe = torch.randn(2, hidden, generator=gen).to(torch_device, dtype)
            _run(base_mod, x_probe, torch.ones(2, canonical["out_features"] if semantics == "linear" else hidden,
                                               device=torch_device, dtype=dtype), None, autocast)  # fmt: skip
        except Exception as exc:
            row["skipped"] = f"torch.nn itself fails for {dtype_name} {regime} on {device}: {type(exc).__name__}: {exc}"
            continue
        try:
            t_build = time.perf_counter()
            mod = build(cand, canonical, torch_device, param_dtype)
            row["missing_parameters"] = load_parameters(mod, params)
            row["parameters"] = sorted(n for n, _ in mod.named_parameters())
            row["state_dict_keys"] = sorted(mod.state_dict().keys())
            for case in cases(semantics, hidden, dtype, torch_device, gen):
                errs: dict[str, list[float]] = {}
                for x in case.inputs:
                    out_shape = (*x.shape[:-1], canonical["out_features"] if semantics == "linear" else hidden)
                    gy = (torch.randn(*out_shape, generator=gen) * 0.7 + 0.1).to(torch_device, dtype)
                    skip = (torch.randn(*out_shape, generator=gen)).to(torch_device, dtype) if case.residual else None
                    ref = _reference_pass(semantics, x, gy, params64, canonical.get("eps", 0.0), skip)
                    got = _run(mod, x, gy, skip, autocast)
                    base = _run(base_mod, x, gy, skip, autocast)
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
                            rel_err(got["y"], reference(ALT_SEMANTICS[semantics], x.detach().to(torch.float64),
                                                        params64["weight"], b, canonical.get("eps", 0.0)))
                            for b in (params64["bias"], None)
                        )  # fmt: skip
                        e = errs.setdefault("y-as-" + ALT_SEMANTICS[semantics], [0.0, 0.0])
                        e[0] = max(e[0], alt_err)
                        e[1] = max(e[1], rel_err(base["y"], ref["y"]))  # tolerance basis: torch.nn on its own maths
                    flags = row["flags"]
                    if not got["grad_output_intact"]:
                        flags.setdefault("grad-output-modified", case.name)
                    if not got["input_intact"]:
                        flags.setdefault("input-modified", case.name)
                    if got["y"].dtype != base["y"].dtype:
                        flags["output-dtype"] = f"{str(got['y'].dtype).replace('torch.', '')} (torch.nn: {str(base['y'].dtype).replace('torch.', '')})"
                row["cases"][case.name] = errs
            row["out_dtype"] = str(got["y"].dtype).replace("torch.", "")
            row["seconds"] = time.perf_counter() - t_build
            row["twin"] = _twin_check(cand, slot, mod, canonical, torch_device, param_dtype, dtype, autocast, gen)
        except Exception as exc:
            row["exception"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc(limit=6)[-2000:]
    return result


def _twin_check(cand, slot, mod, canonical, device, param_dtype, dtype, autocast, gen) -> dict[str, Any]:
    """Does the candidate's state dict load into its torch.nn twin, and do they then agree?"""
    if not cand.twin_target:
        return {"state_dict": "incompatible", "reason": "no twin declared"}
    twin_cand = Candidate("twin", (slot,), cand.semantics, cand.twin_target, args=cand.args if cand.args != ("$hidden",)
                          else ("$normalized_shape",), kwargs=cand.twin_kwargs)  # fmt: skip
    twin = build(twin_cand, canonical, device, param_dtype)
    state = mod.state_dict()
    dropped = sorted(k for k in state if k.endswith("_extra_state"))
    migrated = {k: v for k, v in state.items() if k not in dropped}
    try:
        twin.load_state_dict(migrated, strict=True)
    except Exception as exc:
        return {"state_dict": "incompatible", "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}
    x = (torch.randn(CHECK_ROWS, canonical["normalized_shape"], generator=gen) + 0.3).to(device, dtype)
    ctx = torch.autocast(device_type=autocast[0], dtype=autocast[1]) if autocast else _null()
    with torch.no_grad(), ctx:
        a, b = mod(x), twin(x)
    return {
        "state_dict": "migrate" if dropped else "interchangeable",
        "migration": [f"drop:{k}" for k in dropped],
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
        return {"ran": False, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500]}
    return {"ran": True}


Runner = Callable[..., dict[str, Any]]
