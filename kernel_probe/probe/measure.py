"""What the worker process measures with: raw numbers, no verdicts (those are judge.py's).

The float64 references and the normwise error (``reference``, ``rel_err``), the hard inputs real
kernels get wrong (``cases``), building a candidate with non-trivial parameters under torch.nn's
names (through its ``layout``), one forward+backward pass, and the measurements besides the errors:
where a fresh candidate's parameters start (``initstats``), whether two runs are bitwise equal, the
errors of the small blocks a norm sits in, and the twin check (the candidate's state loaded into its
torch.nn twin). ``correctness`` runs them per (dtype, regime); ``timing`` and ``atshape`` build on
them too.

Everything that touches foreign code runs inside the isolated worker.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kernel_probe.candidates import Candidate, fill
from kernel_probe.isolation.protocol import ErrorStats
from kernel_probe.probe import initstats
from kernel_probe.probe.layout import Layout

CHECK_ROWS = 37  # odd on purpose


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
    # NaN and inf propagate through max
    worst = (got.detach().to(torch.float64) - ref).abs().max().item()
    if not math.isfinite(worst):
        return math.inf
    scale = ref.abs().max().item()
    return worst / max(scale, 1e-30)


def group_errors(got, ref, scale: float, *, rows: bool):
    """Per group of ``got - ref``: (max |error|, RMS error, |mean signed error|, the standard
    deviation of the errors about their mean), each divided by ``scale`` (max |ref| over the whole
    tensor: normwise, as ``rel_err``). A group is a row (the last dimension, leading ones flattened)
    when ``rows``, else the whole tensor; a group with a non-finite value scores inf in all four."""
    e = got.detach().to(torch.float64) - ref
    e = e.reshape(-1, e.shape[-1]) if rows and e.dim() > 0 else e.reshape(1, -1)
    s = max(scale, 1e-30)
    mean = e.mean(-1)
    # fused: fewer passes
    rms = torch.linalg.vector_norm(e, 2, dim=-1) / math.sqrt(max(e.shape[-1], 1))
    worst = torch.linalg.vector_norm(e, math.inf, dim=-1)
    sd = (rms * rms - mean * mean).clamp_min(0.0).sqrt()
    per = (worst / s, rms / s, mean.abs() / s, sd / s)  # per group: small vectors
    return tuple(torch.nan_to_num(v, nan=math.inf, posinf=math.inf) for v in per)


def error_stats(got, base, ref, *, rows: bool) -> ErrorStats:
    """The candidate's (``got``) and torch.nn's (``base``) RMS error, mean signed error (bias) and
    the errors' spread about it against the float64 ``ref``, per group (``group_errors``), the worst
    group's of each, the group size ``n`` and the reference's own RMS (normwise): what ``judge``
    weighs besides the max error. Every slot's compared outputs go through it (the rule is
    ``judge.limits``); ``compare`` gives the max errors with them, from the same differences."""
    return compare(got, base, ref, rows=rows)[1]


Side = tuple[
    float, float, float, float
]  # one implementation's (max, RMS, bias, sd) errors, worst group each


def compare(
    got, base, ref, *, rows: bool, base_side: Side | None = None
) -> tuple[list[float], ErrorStats]:
    """([the candidate's max error, torch.nn's], their ``error_stats``): ``rel_err`` of each, and
    the statistics besides the max, from one difference per implementation. ``base_side``:
    torch.nn's, already computed against the same ``ref`` (``side``; shared by a slot's
    candidates)."""
    maxima = [0.0, 0.0]
    stats: ErrorStats = {
        "rms": [0.0, 0.0],
        "bias": [0.0, 0.0],
        "sd": [0.0, 0.0],
        "n": 1,
        "ref_rms": 1.0,
    }
    stats["n"], scale, stats["ref_rms"] = _scale(ref, rows)
    for i, t in enumerate((got, base)):
        known = base_side if i == 1 else None
        maxima[i], stats["rms"][i], stats["bias"][i], stats["sd"][i] = known or _side(
            t, ref, scale, rows
        )
    return maxima, stats


def side(t, ref, *, rows: bool) -> Side:
    """One implementation's errors against ``ref`` as ``compare`` computes them (torch.nn's,
    once)."""
    return _side(t, ref, _scale(ref, rows)[1], rows)


def _scale(ref, rows: bool) -> tuple[int, float, float]:
    """(the group size, max |ref|, the reference's RMS over max |ref|)."""
    n = int(ref.shape[-1]) if rows and ref.dim() > 0 else int(ref.numel())
    scale = torch.linalg.vector_norm(ref, math.inf).item() if ref.numel() else 0.0
    spread = (
        torch.linalg.vector_norm(ref).item() / math.sqrt(ref.numel()) / scale if scale > 0 else 1.0
    )
    return max(n, 1), scale, spread


def _side(t, ref, scale: float, rows: bool) -> Side:
    if t is None or t.shape != ref.shape:
        return (math.inf, math.inf, math.inf, math.inf)
    worst, rms, bias, sd = group_errors(t, ref, scale, rows=rows)
    return (float(worst.max().item()), *(float(v.max().item()) for v in (rms, bias, sd)))  # type: ignore[return-value]


def worst_stats(into: dict[str, ErrorStats], name: str, stats: ErrorStats) -> None:
    """Keep, per statistic and implementation, the worst over several inputs of one case."""
    have = into.get(name)
    if have is None:
        into[name] = stats
        return
    have["rms"] = [max(a, b) for a, b in zip(have["rms"], stats["rms"], strict=True)]
    have["bias"] = [max(a, b) for a, b in zip(have["bias"], stats["bias"], strict=True)]
    have["sd"] = [max(a, b) for a, b in zip(have["sd"], stats["sd"], strict=True)]
    have["n"] = min(have["n"], stats["n"])
    have["ref_rms"] = min(have["ref_rms"], stats["ref_rms"])


# ---- inputs ------------------------------------------------------------------------------------
@dataclass
class Case:
    """One hard input of the checks: its name (a ``judge.HINTS`` key) and the tensors run in a
    row."""

    name: str
    inputs: list  # several inputs run in a row (stateful-cache check)
    residual: bool = False


def cases(
    semantics: str, hidden: int, dtype, device, gen: torch.Generator, *, mixed: bool = False
) -> list[Case]:
    """The inputs real kernels get wrong. Values are generated in float32, then cast."""

    def randn(*shape, scale=1.0, shift=0.0, as_dtype=dtype):
        return (torch.randn(*shape, generator=gen) * scale + shift).to(
            device=device, dtype=as_dtype
        )

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
        Case(
            "sequence",
            [
                randn(rows, hidden, scale=s, shift=m)
                for s, m in ((1.0, 0.0), (3.0, -1.0), (0.2, 0.7))
            ],
        )
    )
    # y = f(x) + skip: a backward that writes into grad_output corrupts skip's gradient
    out.append(Case("residual", [randn(rows, hidden, shift=0.2)], residual=True))
    return out


# ---- building ----------------------------------------------------------------------------------
@contextlib.contextmanager
def one_cpu_thread(device: str) -> Iterator[None]:
    """One CPU thread for a check's small tensors (a CPU device only; a GPU's work is its own).

    With torch's default of one thread per core, a check's tiny forwards and backwards spend their
    time in OpenMP hand-offs: measured on 2 cores, torch.nn.LayerNorm's whole check took 0.31 s with
    one thread and 3.5 s with two on a loaded machine (1.7 s / 5.1 s for the first call)."""
    if device != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a name of ``kernel_lock.slots.DTYPES`` (``bfloat16`` ->
    ``torch.bfloat16``)."""
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


def first_line(exc: BaseException, limit: int) -> str:
    """``Type: the first line of its message``, cut at ``limit`` characters."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:limit]


def import_class(target: str):
    """The class a dotted path names (importing its module)."""
    module_name, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def build(cand: Candidate, canonical: Mapping[str, Any], device: str, param_dtype):
    """The candidate built as its declaration says, with ``canonical``'s values, on the torch
    ``device``."""
    cls = import_class(cand.target)
    args = [fill(a, canonical) for a in cand.args]
    kwargs = cand.pinned_kwargs(canonical)
    kwargs.update({k: fill(v, canonical) for k, v in cand.build_kwargs.items()})
    module = cls(*args, **kwargs)
    return module.to(device=device, dtype=param_dtype)


def parameters_for(
    semantics: str, hidden: int, out_features: int, bias: bool, gen: torch.Generator
) -> dict[str, Any]:
    """Weights that are neither ones nor zeros (a kernel ignoring them must fail), under torch.nn's
    names."""
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
            target.copy_(
                (value.t() if turned else value).to(device=target.device, dtype=target.dtype)
            )


def gradients(module, layout: Layout) -> dict[str, Any]:
    """The module's parameter gradients under torch.nn's names and layout."""
    own = _state(module)
    out = {}
    for name, (key, turned) in layout.pairs.items():
        grad = getattr(own[key], "grad", None)
        out[name] = None if grad is None else (grad.t() if turned else grad).detach()
    return out


# ---- one forward/backward pass -----------------------------------------------------------------
def run_pass(module, x, gy, skip, autocast: tuple[str, Any] | None, layout: Layout):
    """Forward + backward: output, input gradient, parameter gradients, and whether inputs
    survived."""
    x = _fresh_like(x)
    x_before = x.clone()
    x.requires_grad_(True)
    for p in module.parameters():
        p.grad = None
    skip_t = skip.detach().clone().requires_grad_(True) if skip is not None else None
    gy_given = gy.clone()
    with autocasting(autocast):
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
        "skip_grad": skip_t.grad.detach()
        if skip_t is not None and skip_t.grad is not None
        else None,
    }


def _fresh_like(x):
    """A copy with the same layout: a non-contiguous case stays a padded, transposed view."""
    if x.is_contiguous():
        return x.detach().clone()
    shape = list(x.shape)
    buf = torch.empty(
        shape[1], shape[0], *shape[2:-1], shape[-1] + 8, dtype=x.dtype, device=x.device
    )
    view = buf[..., : shape[-1]].transpose(0, 1)
    view.copy_(x.detach())
    return view


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def autocasting(autocast: tuple[str, Any] | None):
    """torch.autocast for (device type, dtype); a context that does nothing for None."""
    return torch.autocast(device_type=autocast[0], dtype=autocast[1]) if autocast else _null()


def reference_pass(semantics, x, gy, params64, eps, skip):
    """The float64 reference's forward and backward: output, input and parameter gradients,
    skip's."""
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


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).replace("torch.", "")


def bits_equal(a, b) -> bool:
    """Bitwise equality (NaNs included), same shape and dtype; two Nones are equal."""
    if a is None or b is None:
        return a is b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


# ---- once per candidate: layout and initialisation -----------------------------------------------
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


# ---- per row: determinism and the blocks a norm sits in ------------------------------------------
DETERMINISM_ROWS = 512


def repeatability(
    module, hidden: int, width: int, dtype, device, autocast, layout: Layout, gen: torch.Generator
) -> str | None:
    """None when two forward+backward runs on the same input give bitwise equal results; else what
    differed."""
    x = (torch.randn(DETERMINISM_ROWS, hidden, generator=gen) + 0.3).to(device, dtype)
    gy = (torch.randn(DETERMINISM_ROWS, width, generator=gen) * 0.7).to(device, dtype)
    runs = []
    for _ in range(2):
        try:
            m = copy.deepcopy(module)  # a fresh copy, the same parameters
        except Exception:  # some foreign modules do not deepcopy: run the same module twice
            m = module
        runs.append(run_pass(m, x, gy, None, autocast, layout))
    a, b = runs
    differ = [name for name in ("y", "dx") if not bits_equal(a[name], b[name])]
    differ += [
        f"d{name}" for name in a["grads"] if not bits_equal(a["grads"][name], b["grads"][name])
    ]
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
        """One block's errors, with the candidate (index 0) and torch.nn (index 1), against
        float64."""
        # float64 reference
        x64 = x.detach().double().requires_grad_(True)
        nw = params64["weight"].clone().requires_grad_(True)
        nb = params64["bias"].clone().requires_grad_(True) if params64["bias"] is not None else None
        lw, lb = w.double().to(device), bias.double().to(device)
        y64 = _block(
            kind, lambda t: reference(semantics, t, nw, nb, eps), lambda t: F.linear(t, lw, lb), x64
        )
        y64.backward(gy.double())
        ref = {
            "y": y64.detach(),
            "dx": x64.grad,
            "dweight": nw.grad,
            "dbias": nb.grad if nb is not None else None,
        }
        errs: dict[str, list[float]] = {}
        for i, (module, lay) in enumerate(((mod, layout), (base_mod, base_layout))):
            linear = torch.nn.Linear(hidden, hidden).to(device=device, dtype=param_dtype)
            with torch.no_grad():
                linear.weight.copy_(w)
                linear.bias.copy_(bias)
            for p in module.parameters():
                p.grad = None
            xi = x.detach().clone().requires_grad_(True)
            with autocasting(autocast):
                y = _block(kind, module, linear, xi)
            y.backward(gy)
            got = {
                "y": y.detach(),
                "dx": xi.grad,
                **{f"d{n}": g for n, g in gradients(module, lay).items()},
            }
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
            out[kind] = {"error": first_line(exc, 300)}
    return out


def twin_candidate(cand: Candidate, slot: str, args: tuple[Any, ...] = ()) -> Candidate | None:
    """The candidate's declared portable twin as a candidate of its own, built with ``args`` and the
    twin's kwargs (every slot's twin check builds it so); None when it declares none
    (``no_twin``)."""
    if not cand.twin_target:
        return None
    return Candidate(
        "twin", (slot,), cand.semantics, cand.twin_target, args=args, kwargs=cand.twin_kwargs
    )


def no_twin() -> dict[str, Any]:
    """A twin check's record for a candidate that declares no twin."""
    return {"state_dict": "incompatible", "reason": "no twin declared"}


def twin_check(
    cand, slot, mod, canonical, device, param_dtype, dtype, autocast, gen, layout: Layout
) -> dict[str, Any]:
    """Does the candidate's state dict load into its torch.nn twin through the layout's migration,
    and do they then agree?"""
    from kernel_lock.checkpoint import migrate_module_state, parse_rule

    twin_cand = twin_candidate(
        cand, slot, cand.args if cand.args != ("$hidden",) else ("$normalized_shape",)
    )
    if twin_cand is None:
        return no_twin()
    twin = build(twin_cand, canonical, device, param_dtype)
    rules = [parse_rule(r) for r in layout.rules]
    migrated = migrate_module_state(mod.state_dict(), [r for r in rules if r is not None])
    try:
        twin.load_state_dict(migrated, strict=True)
    except Exception as exc:
        return {"state_dict": "incompatible", "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}
    x = (torch.randn(CHECK_ROWS, canonical["normalized_shape"], generator=gen) + 0.3).to(
        device, dtype
    )
    with torch.no_grad(), autocasting(autocast):
        a, b = mod(x), twin(x)
    return {
        "state_dict": "migrate" if layout.rules else "interchangeable",
        "migration": list(layout.rules),
        "max_error": rel_err(a, b.to(torch.float64)),
    }
