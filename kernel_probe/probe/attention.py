"""The Attention slot's measurements, in the worker: forward and backward against float64, the hard
inputs, the band's edge, determinism, what each option really does, and the timing at the model's
geometry.

Every error is normwise relative (``max|got - ref| / max|ref|``) against a float64 reference of the
same masked attention on the same inputs, for the candidate and for torch's own math path in the
same dtype (``baseline``): the verdict (``attention_verdict``) compares the two. Outputs: ``out``,
``dq``, ``dk``, ``dv``. Where a reference gradient vanishes by construction (the sharp softmax over
equal values, anemoi-core #1027: dq = dk = 0), its error is taken relative to the gradient's natural
size, ``max|dv|``, so a kernel that returns |dq| = 1.47 there fails however small the reference.

The capability matrix is measured, not declared: each option (window, softcap, dropout, alibi,
scale) is set on a fresh instance and the result compared with the reference with and without it:
``honoured``, ``ignored`` (equal to the result without it: silently dropped), ``raises: <why>`` or
``wrong`` (neither). The model's own options must be honoured (the verdict names the one that is
not).

Timing geometries are written ``HEADSxHEAD_DIMxSEQ[:window=W]`` (``attention_geometry``), batch 1.
"""

from __future__ import annotations

import itertools
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kernel_lock.attention import alibi_bias, band_mask
from kernel_probe.candidates import Candidate, fill
from kernel_probe.isolation.protocol import (
    CheckReply,
    ErrorStats,
    MeasurementRow,
    TimeReply,
    TimingProgressMessage,
    TimingRow,
)
from kernel_probe.probe.attention_geometry import HINTS, SMALL_WINDOW, canonical, parse_geometry  # noqa: F401 (re-exported)
from kernel_probe.probe.measure import (
    SetupCache,
    first_line,
    import_stop,
    no_twin,
    torch_dtype,
    twin_candidate,
)

OUTPUTS = ("out", "dq", "dk", "dv")
# the check's own geometry: cheap on a CPU (every case is a few (S x S) matmuls of head_dim 32)
CHECK_HEADS, CHECK_DIM, CHECK_SEQ = 2, 32, 48
OPTIONS = ("window", "softcap", "dropout", "alibi", "scale")


# ---- the reference and torch's own math path -----------------------------------------------------
@dataclass(frozen=True)
class Options:
    """What a call computes besides q, k, v: the layer's options and the call's scale."""

    window: int = -1
    softcap: float = 0.0
    alibi: bool = False
    scale: float | None = None

    @classmethod
    def of(cls, kwargs: Mapping[str, Any], scale: float | None = None) -> Options:
        """The options from a candidate's keyword arguments (window, softcap, alibi) and a scale."""
        return cls(
            int(kwargs.get("window", -1)),
            float(kwargs.get("softcap", 0.0)),
            bool(kwargs.get("alibi")),
            scale,
        )


def explicit(q: Any, k: Any, v: Any, opts: Options) -> Any:
    """softmax(q k^T * scale [softcap] [+ alibi], masked to the band) v, in the inputs' dtype."""
    scale = opts.scale if opts.scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-1, -2)) * scale
    if opts.softcap > 0:
        s = opts.softcap * torch.tanh(s / opts.softcap)
    if opts.alibi:
        s = s + alibi_bias(q.shape[1], q.shape[-2], k.shape[-2], q.device, s.dtype)
    if opts.window >= 0:
        s = s.masked_fill(
            ~band_mask(q.shape[-2], k.shape[-2], opts.window, q.device), float("-inf")
        )
    return torch.softmax(s, dim=-1) @ v


def math_path(q: Any, k: Any, v: Any, opts: Options) -> Any:
    """torch's own math path in the inputs' dtype: SDPA's MATH backend; the explicit formula for
    what SDPA cannot express (softcap, alibi)."""
    if opts.softcap > 0 or opts.alibi:
        return explicit(q, k, v, opts)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mask = None if opts.window < 0 else band_mask(q.shape[-2], k.shape[-2], opts.window, q.device)
    with sdpa_kernel([SDPBackend.MATH]):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=opts.scale
        )


def fused_path(q: Any, k: Any, v: Any, go: Any, opts: Options) -> dict[str, Any]:
    """The same attention ordered as a correct fused kernel orders it, in the inputs' dtype: float32
    accumulation, the output rounded once to the dtype, and a backward that recomputes P from the
    log-sum-exp and takes D = rowsum(dO * O) from the rounded output. Where the math path is exact
    by accident (a one-hot softmax), this is the error a correct kernel still makes (the #1027
    case's dq, dk; the cancellation in s - lse at large logits)."""
    dtype = q.dtype
    q32, k32, v32, go32 = (t.float() for t in (q, k, v, go))
    scale = opts.scale if opts.scale is not None else 1.0 / math.sqrt(q.shape[-1])
    half = q.shape[-1] // 2

    def scores(raw: Any) -> Any:
        s = opts.softcap * torch.tanh(raw / opts.softcap) if opts.softcap > 0 else raw
        if opts.alibi:
            s = s + alibi_bias(q.shape[1], q.shape[-2], k.shape[-2], q.device, s.dtype)
        if opts.window >= 0:
            s = s.masked_fill(
                ~band_mask(q.shape[-2], k.shape[-2], opts.window, q.device), float("-inf")
            )
        return s

    # the forward's scores, and the backward's recomputed in another summation order (as a kernel's
    # other tiling does): their difference, ~eps * |s|, is what a recomputing backward cannot avoid
    raw = (q32 @ k32.transpose(-1, -2)) * scale
    raw_b = (
        q32[..., :half] @ k32[..., :half].transpose(-1, -2)
        + q32[..., half:] @ k32[..., half:].transpose(-1, -2)
    ) * scale
    s = scores(raw)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    out = (torch.exp(s - lse).to(dtype).float() @ v32).to(dtype)  # P rounded to the dtype for P @ V
    p = torch.exp(scores(raw_b) - lse)
    delta = (go32 * out.float()).sum(-1, keepdim=True)
    ds = p * (go32 @ v32.transpose(-1, -2) - delta)
    if opts.softcap > 0:
        ds = ds * (1 - torch.tanh(raw_b / opts.softcap) ** 2)
    ds, p = ds.to(dtype).float(), p.to(dtype).float()  # rounded to the dtype for the last matmuls
    return {
        "out": out,
        "dq": ((ds @ k32) * scale).to(dtype),
        "dk": ((ds.transpose(-1, -2) @ q32) * scale).to(dtype),
        "dv": (p.transpose(-1, -2) @ go32).to(dtype),
    }


def _grads(fn: Callable[[Any, Any, Any], Any], q: Any, k: Any, v: Any, go: Any) -> dict[str, Any]:
    """out, dq, dk, dv of ``fn`` at (q, k, v) with grad_output ``go`` (leaves detached from the
    inputs)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    kept = [t.detach().clone() for t in (q, k, v)]
    gout = go.detach().clone()
    out = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), gout.to(out.dtype))
    mutated = not all(
        torch.equal(a, b) for a, b in zip(kept, (q, k, v), strict=True)
    ) or not torch.equal(gout, go)
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv, "mutated": mutated}


def rel(got: Any, ref: Any, denom: float | None = None) -> float:
    """max|got - ref| / max|ref| (or / ``denom``); inf where got is not finite and ref is."""
    got64, ref64 = got.detach().double(), ref.detach().double()
    if got64.shape != ref64.shape:
        return math.inf
    if not torch.isfinite(got64).all() and torch.isfinite(ref64).all():
        return math.inf
    scale = denom if denom is not None else float(ref64.abs().max())
    err = float((got64 - ref64).abs().max())
    return err / scale if scale > 0 else (0.0 if err == 0 else math.inf)


# ---- the inputs ----------------------------------------------------------------------------------
@dataclass
class Case:
    """One input: q, k, v (BHSD), grad_output, and for ``vanishing`` outputs the denominator's
    source."""

    name: str
    q: Any
    k: Any
    v: Any
    go: Any
    vanishing: tuple[str, ...] = ()


def _randn(dtype: Any, gen: torch.Generator) -> Callable[..., Any]:
    # drawn on the CPU from a seeded generator (the same values on every device), then moved
    def randn(*shape: int, scale: float = 1.0) -> Any:
        x = torch.randn(*shape, generator=gen, dtype=torch.float64, device="cpu") * scale
        return x.to(device=torch.get_default_device(), dtype=dtype)

    return randn


def random_case(
    dtype: Any, gen: torch.Generator, heads: int = CHECK_HEADS, seq: int = CHECK_SEQ
) -> Case:
    """The plain random case: query, key, value and the output gradient, seeded by ``gen``."""
    randn = _randn(dtype, gen)
    shape = (1, heads, seq, CHECK_DIM)
    return Case("random", randn(*shape), randn(*shape), randn(*shape), randn(*shape))


def cases(dtype: Any, gen: torch.Generator) -> list[Case]:
    """The check's inputs: random, large logits, the #1027 sharp softmax over equal values, a
    non-contiguous (BSHD-transposed) view, head_dim 64 and 128 (short sequences)."""
    h, d, s = CHECK_HEADS, CHECK_DIM, CHECK_SEQ

    randn = _randn(dtype, gen)

    out = [
        Case("random", randn(1, h, s, d), randn(1, h, s, d), randn(1, h, s, d), randn(1, h, s, d))
    ]
    # large logits: q and k share a large common part, so unscaled q.k is ~80,000 (over fp16's
    # 65504) while the softmax stays soft (the common part cancels in it)
    common = randn(1, h, 1, d, scale=50.0)
    q, k = common + randn(1, h, s, d, scale=0.05), common + randn(1, h, s, d, scale=0.05)
    out.append(Case("large-logits", q, k, randn(1, h, s, d), randn(1, h, s, d)))
    # anemoi-core #1027: a sharp softmax whose keys all carry the same value: out = v, dq = dk = 0
    q = randn(1, h, s, d, scale=2.5)
    value = randn(1, h, 1, d).expand(1, h, s, d).contiguous()
    out.append(
        Case(
            "sharp-equal-values",
            q,
            q + randn(1, h, s, d, scale=0.2),
            value,
            randn(1, h, s, d),
            ("dq", "dk"),
        )
    )
    # a non-contiguous view: what anemoi's rearrange of a (batch, grid, heads, vars) tensor gives
    bshd = randn(1, s, h, d)
    out.append(
        Case(
            "non-contiguous",
            bshd.transpose(1, 2),
            randn(1, s, h, d).transpose(1, 2),
            randn(1, h, s, d),
            randn(1, h, s, d),
        )
    )
    for dim in (64, 128):
        n = 16
        out.append(
            Case(
                f"head-dim-{dim}",
                randn(1, h, n, dim),
                randn(1, h, n, dim),
                randn(1, h, n, dim),
                randn(1, h, n, dim),
            )
        )
    return out


def build(cand: Candidate, values: Mapping[str, Any], **override: Any) -> Any:
    """An instance of the candidate with the canonical options (and ``override``)."""
    from kernel_lock.trust.importing import import_target

    cls = import_target(cand.target, (cand.target.split(".")[0],), semantics="attention")
    kwargs = {k: fill(v, values) for k, v in cand.kwargs.items()}
    kwargs.update(override)
    return cls(*[fill(a, values) for a in cand.args], **kwargs)


def _forced_reason(caught: list[Any], exc: BaseException) -> str:
    """torch's reason a forced SDPA backend refused: its warnings ("... not used because ...") and
    error."""
    # torch's SDPA says why it refused a backend in warnings ("Flash attention kernel not used
    # because:", "Both fused kernels do not support non-zero dropout."); other warnings are not the
    # reason
    notes = [str(w.message).split(" (Triggered internally")[0] for w in caught]
    notes = [n for n in dict.fromkeys(notes) if n and "kernel" in n]
    return "; ".join([*notes, first_line(exc, 300)])


def _run(mod: Any, case: Case, *, scale: float | None = None) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return _grads(
                lambda q, k, v: mod(q, k, v, scale=scale), case.q, case.k, case.v, case.go
            )
        except Exception as exc:
            raise _Refused(_forced_reason(caught, exc)) from exc


class _Refused(Exception):
    """The candidate raised on these inputs: its reason (torch's warnings first)."""


def _errors(
    got: Mapping[str, Any],
    bases: list[Mapping[str, Any]],
    ref: Mapping[str, Any],
    vanishing: tuple[str, ...],
) -> tuple[dict[str, list[float]], dict[str, ErrorStats]]:
    """output -> [candidate's error, torch's paths' (the larger of the math and the fused
    ordering)], and output -> the RMS and bias statistics besides the max (``measure.compare``, per
    row of the last dimension; torch's the larger of its two paths'), the norms' rule applied to
    attention (issue 35). A vanishing output (its reference ~0: the sharp case's dq and dk) has no
    statistics: its error is measured against max|dv| by the max alone."""
    from kernel_probe.probe.measure import compare

    dv_scale = float(ref["dv"].abs().max())
    out, stats = {}, {}
    for name in OUTPUTS:
        denom = dv_scale if name in vanishing else None
        out[name] = [
            rel(got[name], ref[name], denom),
            max(rel(b[name], ref[name], denom) for b in bases),
        ]
        if name in vanishing:
            continue
        ref64 = ref[name].detach().double()
        per_base = [
            compare(got[name].detach().double(), b[name].detach().double(), ref64, rows=True)[1]
            for b in bases
        ]
        merged = per_base[0]
        for other in per_base[1:]:
            for key in ("rms", "bias", "sd"):
                merged[key] = [merged[key][0], max(merged[key][1], other[key][1])]
        stats[name] = merged
    return out, stats


def _cast(case: Case, dtype: Any) -> Case:
    # the same values in float64 (q, k, v may be views: kept as they are)
    q, k, v, go = (t.to(dtype) for t in (case.q, case.k, case.v, case.go))
    return Case(case.name, q, k, v, go, vanishing=case.vanishing)


def _measure(
    mod: Any,
    case: Case,
    opts: Options,
    flags: dict[str, str] | None = None,
    torch_side: Callable[[], tuple[Any, Any, Any]] | None = None,
) -> tuple[dict[str, list[float]], dict[str, ErrorStats]]:
    """The candidate's and torch's errors on one case; ``torch_side``: torch's two paths and the
    float64 reference on it, as the slot's earlier candidate computed them (``slotcheck``)."""
    got = _run(mod, case, scale=opts.scale)
    if got["mutated"] and flags is not None:
        flags.setdefault("input-modified", case.name)
    base, fused, ref = torch_side() if torch_side is not None else _torch_side(case, opts)
    return _errors(got, [base, fused], ref, case.vanishing)


def _torch_side(case: Case, opts: Options) -> tuple[Any, Any, Any]:
    """torch's math path, its fused path and the float64 reference on ``case`` (the same for every
    candidate of the slot: the candidate runs on clones, ``_grads``, and never touches the case)."""
    base = _grads(lambda q, k, v: math_path(q, k, v, opts), case.q, case.k, case.v, case.go)
    fused = fused_path(case.q, case.k, case.v, case.go, opts)
    c64 = _cast(case, torch.float64)
    ref = _grads(lambda q, k, v: explicit(q, k, v, opts), c64.q, c64.k, c64.v, c64.go)
    return base, fused, ref


def _band_edge(mod: Any, dtype: Any, gen: torch.Generator, window: int) -> str | None:
    """Keys outside query i0's band get exactly zero weight (its output does not change when they
    do) and exactly zero gradient (grad_output only on row i0); None when so, else what leaked."""
    h, d, s = CHECK_HEADS, CHECK_DIM, CHECK_SEQ
    randn = _randn(dtype, gen)
    q, k, v = (randn(1, h, s, d) for _ in range(3))
    i0 = s // 2
    go = torch.zeros_like(q)
    go[:, :, i0] = 1.0
    got = _run(mod, Case("edge", q, k, v, go))
    outside = (torch.arange(s, device=q.device) - i0).abs() > window
    leaks = [name for name in ("dk", "dv") if bool((got[name][:, :, outside] != 0).any())]
    v2 = v.clone()
    v2[:, :, outside] = 1e3
    k2 = k.clone()
    k2[:, :, outside] = -k2[:, :, outside]
    again = _run(mod, Case("edge", q, k2, v2, go))
    if not torch.equal(again["out"][:, :, i0], got["out"][:, :, i0]):
        leaks.insert(0, "out")
    if not leaks:
        return None
    return (
        f"keys outside the band of half-width {window} reach {', '.join(leaks)} (must be "
        "exactly zero)"
    )


def _bitwise(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[bool, float]:
    spread = max(float((a[n].double() - b[n].double()).abs().max()) for n in OUTPUTS)
    same = all(torch.equal(a[n], b[n]) for n in OUTPUTS)
    return same, spread


# ---- one row: a dtype ----------------------------------------------------------------------------
def _row(
    cand: Candidate,
    values: Mapping[str, Any],
    dtype_name: str,
    regime: str,
    seed: int,
    shared: SetupCache | None = None,
) -> MeasurementRow:
    # "mixed": under autocast the Linear layers before attention hand it q, k, v in the low dtype,
    # so it is checked on inputs in that dtype, as in "true"
    row: MeasurementRow = {"dtype": dtype_name, "regime": regime}
    # the row's inputs are drawn in the same order for every candidate (a candidate that raises ends
    # the row), so the n-th case measured is the same case: torch's side of it is shared by call
    # number
    overrides = json.dumps(dict(values), sort_keys=True, default=str)
    row_key = ("Attention", overrides, dtype_name, regime, seed, str(torch.get_default_device()))
    calls = itertools.count()
    # one cache entry per row: call number -> torch's side, filled by the first candidate to get
    # there
    sides: dict[int, tuple[Any, Any, Any]] = {} if shared is None else shared.get(row_key, dict)

    def measure(
        inst: Any, case: Case, o: Options, flags: dict[str, str] | None = None
    ) -> tuple[dict[str, list[float]], dict[str, ErrorStats]]:
        n = next(calls)

        def side() -> tuple[Any, Any, Any]:
            if n not in sides:
                sides[n] = _torch_side(case, o)
            return sides[n]

        return _measure(inst, case, o, flags, None if shared is None else side)

    start = time.perf_counter()
    dtype = torch_dtype(dtype_name)
    gen = torch.Generator().manual_seed(seed)
    opts = Options.of(values)
    window = opts.window if opts.window >= 0 else CHECK_SEQ // 4
    errors: dict[str, dict[str, list[float]]] = {}
    stats: dict[str, dict[str, ErrorStats]] = {}
    flags: dict[str, str] = {}
    try:
        mod = build(cand, values)
        # dropout off: the numbers are judged without it (dropout is in the capability matrix)
        mod.eval()
        for case in cases(dtype, gen):
            errors[case.name], stats[case.name] = measure(mod, case, opts, flags)
        # the windows: the model's (or a quarter of the sequence) and the band's edge, on fresh
        # instances
        for name, w in (("window", window), ("small-window", SMALL_WINDOW)):
            if opts.window >= 0 and name == "window":
                inst, o = mod, opts
            else:
                inst, o = build(cand, values, window=w).eval(), Options(w, opts.softcap, opts.alibi)
            errors[name], stats[name] = measure(inst, random_case(dtype, gen), o)
            leak = _band_edge(inst, dtype, gen, w)
            if leak:
                flags.setdefault("band-leak", leak)
        # a second sequence length through the same instance (anemoi's SDPA wrapper caches its mask)
        inst = build(cand, values, window=window).eval()
        first = random_case(dtype, gen)
        _run(inst, first)
        short = Case(
            "second-length",
            *(t[:, :, : CHECK_SEQ // 2 + 5] for t in (first.q, first.k, first.v, first.go)),
        )
        errors["second-length"], stats["second-length"] = measure(
            inst, short, Options(window, opts.softcap, opts.alibi)
        )
        # determinism: the same fwd+bwd twice, bitwise
        random = random_case(dtype, torch.Generator().manual_seed(seed))
        got = _run(mod, random)
        same, spread = _bitwise(got, _run(mod, random))
        row["nondeterministic"] = (
            None if same else f"two identical fwd+bwd differ by up to {spread:.3g}"
        )
        row["twin"] = _twin(cand, values, random, got)
    except _Refused as exc:
        row["exception"] = str(exc)
        return row
    except Exception as exc:
        row["exception"] = first_line(exc, 400)
        return row
    row["cases"] = errors
    row["stats"] = stats
    row["flags"] = flags
    row["seconds"] = time.perf_counter() - start
    return row


def _twin(
    cand: Candidate, values: Mapping[str, Any], case: Case, got: Mapping[str, Any]
) -> dict[str, Any]:
    """The portable twin (torch's SDPA with the same options) on the same input: the largest
    relative difference of any output. Attention holds no parameters, so the state dicts interchange
    (both empty)."""
    twin_cand = twin_candidate(cand, "Attention")
    if twin_cand is None:
        return no_twin()
    try:
        twin = _run(build(twin_cand, values).eval(), case)
    except Exception as exc:
        return {"state_dict": "incompatible", "reason": f"the twin raised {first_line(exc, 300)}"}
    return {
        "state_dict": "interchangeable",
        "max_error": max(rel(got[n], twin[n]) for n in OUTPUTS),
    }


# ---- the capability matrix -----------------------------------------------------------------------
def capabilities(cand: Candidate, values: Mapping[str, Any], seed: int) -> dict[str, str]:
    """What each option really does, measured in float32 on a fresh instance per option."""
    gen = torch.Generator().manual_seed(seed + 7)
    out: dict[str, str] = {}
    base_values = {**values, "window": -1, "softcap": 0.0, "dropout": 0.0, "alibi": False}
    case = random_case(torch.float32, gen)
    # large logits make softcap matter; a window of 4 in 48 keys makes the band matter
    loud = Case("loud", case.q * 6, case.k * 6, case.v, case.go)
    trials: dict[str, tuple[dict[str, Any], Options, Case]] = {
        "window": ({"window": 4}, Options(window=4), case),
        "softcap": ({"softcap": 2.0}, Options(softcap=2.0), loud),
        "alibi": ({"alibi": True}, Options(alibi=True), case),
        "scale": ({}, Options(scale=0.05), loud),
    }
    for name, (override, opts, c) in trials.items():
        out[name] = _capability(cand, base_values, override, opts, c)
    out["dropout"] = _dropout(cand, base_values, case)
    return out


def _capability(
    cand: Candidate, values: Mapping[str, Any], override: dict[str, Any], opts: Options, case: Case
) -> str:
    c64 = _cast(case, torch.float64)
    with_it = explicit(c64.q, c64.k, c64.v, opts)
    without = explicit(c64.q, c64.k, c64.v, Options())
    try:
        mod = build(cand, values, **override).eval()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                got = mod(case.q, case.k, case.v, scale=opts.scale).detach()
            except Exception as exc:
                return f"raises: {_forced_reason(caught, exc)}"
    except Exception as exc:
        return f"raises: {first_line(exc, 300)}"
    base = math_path(case.q, case.k, case.v, opts)
    tol = 4 * rel(base, with_it) + 1e-5
    if rel(got, with_it) <= tol:
        return "honoured"
    if rel(got, without) <= tol:
        return "ignored"
    return (
        f"wrong (error {rel(got, with_it):.3g} against the reference with it, "
        f"{rel(got, without):.3g} without)"
    )


def _dropout(cand: Candidate, values: Mapping[str, Any], case: Case) -> str:
    """Honoured: in training mode with dropout 0.5 the output differs from the one without dropout,
    and eval mode turns it off."""
    try:
        mod = build(cand, values, dropout=0.5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                mod.train()
                torch.manual_seed(1)
                dropped = mod(case.q, case.k, case.v).detach()
                mod.eval()
                plain = mod(case.q, case.k, case.v).detach()
            except Exception as exc:
                return f"raises: {_forced_reason(caught, exc)}"
    except Exception as exc:
        return f"raises: {first_line(exc, 300)}"
    ref = explicit(case.q.double(), case.k.double(), case.v.double(), Options())
    if rel(plain, ref) > 1e-4:
        return f"wrong (eval mode with dropout set is off by {rel(plain, ref):.3g})"
    if rel(dropped, plain) <= 1e-6:
        return "ignored"
    return "honoured"


# ---- the worker's entry points -------------------------------------------------------------------
def check(
    cand: Candidate,
    device: str,
    dtypes: list[tuple[str, str]],
    *,
    canonical_overrides: Mapping[str, Any] | None = None,
    seed: int = 0,
    shared: SetupCache | None = None,
) -> CheckReply:
    """Raw measurements of one Attention candidate (CPU tensors on a CPU, the device's otherwise).
    ``shared``: the worker's cache of torch's side of each case, shared by the slot's candidates."""
    values = canonical(canonical_overrides)
    import_s, stopped = import_stop(cand, device, needed=bool(cand.target.count(".")))
    if stopped is not None:
        return stopped
    with _on(device):
        rows = [_row(cand, values, d, regime, seed, shared) for d, regime in dtypes]
        caps = capabilities(cand, values, seed)
    return CheckReply(
        candidate=cand.id, device=device, rows=rows, import_s=import_s, capabilities=caps
    )


class _on:
    """Tensors created while checking land on ``device`` (torch.set_default_device)."""

    def __init__(self, device: str):
        from kernel_lock.slots import torch_device

        self.device = torch_device(device)

    def __enter__(self) -> None:
        self.before = torch.get_default_device()
        torch.set_default_device(self.device)
        # the check's tensors are tiny: one thread. Several threads cost 100x here on a loaded CPU
        # (measured: 120 ms instead of 0.4 ms per fwd+bwd, OpenMP threads waiting on each other)
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        torch.set_default_device(self.before)
        torch.set_num_threads(self.threads)


def try_once(cand: Candidate, device: str) -> dict[str, Any]:
    """One tiny forward and backward on a device the candidate does not declare: why it cannot
    run."""
    from kernel_lock.slots import torch_device

    try:
        with _on(device):
            mod = build(cand, canonical(None))
            q = torch.randn(1, 2, 8, 32, device=torch_device(device), requires_grad=True)
            mod(q, q, q).sum().backward()
    except Exception as exc:
        return {"ran": False, "error": first_line(exc, 500)}
    return {"ran": True}


def time_candidate(
    cand: Candidate,
    device: str,
    geometries: list[str],
    dtype_name: str,
    options: Mapping[str, Any],
    canonical_overrides: Mapping[str, Any] | None = None,
    progress: Callable[[TimingProgressMessage], None] | None = None,
) -> TimeReply:
    """fwd+bwd per geometry with the timing module's clock and repetition rule; on a GPU, peak
    memory. ``progress`` receives the other slots' messages (``timing.progress_message``) after each
    call."""
    from kernel_lock.slots import torch_device
    from kernel_probe.probe import timing

    tdev = torch_device(device)

    def measure(text: str, timed: Callable[[Callable[[], None]], TimingRow]) -> None:
        g = parse_geometry(text)
        values = canonical({**dict(canonical_overrides or {}), **dict(g.options)})
        mod = build(cand, values).train()
        dtype = torch_dtype(dtype_name)
        q, k, v = (
            torch.randn(1, g.heads, g.seq, g.head_dim, device=tdev, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        go = torch.randn(1, g.heads, g.seq, g.head_dim, device=tdev, dtype=dtype)

        def step() -> None:
            out = mod(q, k, v)
            torch.autograd.grad(out, (q, k, v), go)

        if tdev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row = timed(step)
        keys = g.seq if values["window"] < 0 else min(g.seq, 2 * values["window"] + 1)
        seconds = row["median_ms"] / 1e3
        # fwd 2 matmuls, bwd 5 (one recomputing the scores), 2 flops per multiply-add, band keys
        # only
        row["tflops"] = 7 * 2.0 * g.heads * g.seq * keys * g.head_dim / seconds / 1e12
        # q, k, v, out read or written forward; q, k, v, out, grad_out read and dq, dk, dv
        # written backward
        row["gbps"] = 12 * g.heads * g.seq * g.head_dim * dtype.itemsize / seconds / 1e9
        if tdev == "cuda":
            row["peak_bytes"] = int(torch.cuda.max_memory_allocated())

    return timing.step_rows(cand.id, device, geometries, dtype_name, options, progress, measure)
