"""The Attention slot's measurements in the worker: out, dq, dk, dv against float64, called as the
model calls it; band edge, determinism, capabilities, timing (docs/checks.md, "Attention")."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kernel_lock.slots import torch_device
from kernel_lock.trust import import_target
from kernel_probe.candidates import Candidate, fill
from kernel_probe.isolation import protocol
from kernel_probe.isolation.protocol import CheckReply, MeasurementRow
from kernel_probe.probe import lifecycle, measure, timing
from kernel_probe.probe.measure import rel
from kernel_probe.slots.attention import (
    SMALL_WINDOW,
    UNSET,
    VANISHING,
    canonical_options,
    keys_seen,
    parse_geometry,
)
from kernel_probe.slots.attention import too_long as attention_too_long
from kernel_probe.slots.attention_reference import (
    Options,
    call_mask,
    every_other_row,
    explicit,
    fused_path,
    math_path,
)

OUTPUTS = ("out", "dq", "dk", "dv")
ESTIMATE_SEQ = 1024  # on a CPU, a longer sequence's time is estimated from one call at this many
CHECK_HEADS, CHECK_DIM, CHECK_SEQ = 2, 32, 48  # the check's own: a few (S x S) matmuls a case


def _grads(fn: Callable[..., Any], q: Any, k: Any, v: Any, go: Any) -> dict[str, Any]:
    """out, dq, dk, dv of ``fn`` at (q, k, v) with grad_output ``go``; whether it mutated them."""
    q, k, v = (lifecycle.fresh_like(t).requires_grad_(True) for t in (q, k, v))  # views stay
    kept = [t.detach().clone() for t in (q, k, v)]
    gout = go.detach().clone()
    out = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), gout.to(out.dtype))
    same = all(torch.equal(a, b) for a, b in zip(kept, (q, k, v), strict=True))
    mutated = not same or not torch.equal(gout, go)
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv, "mutated": mutated}


# ---- the inputs --------------------------------------------------------------------------------
@dataclass
class Case:
    """One input: q, k, v (BHSD), grad_output, and the outputs that vanish by construction."""

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


def random_case(dtype: Any, gen: torch.Generator) -> Case:
    """The plain random case: query, key, value and the output gradient, seeded by ``gen``."""
    randn = _randn(dtype, gen)
    shape = (1, CHECK_HEADS, CHECK_SEQ, CHECK_DIM)
    return Case("random", randn(*shape), randn(*shape), randn(*shape), randn(*shape))


def cases(dtype: Any, gen: torch.Generator) -> list[Case]:
    """The check's inputs (``slots.attention.HINTS`` says what each is for)."""
    h, d, s = CHECK_HEADS, CHECK_DIM, CHECK_SEQ
    randn = _randn(dtype, gen)
    out = [random_case(dtype, gen)]
    # large logits: a large common part of q and k makes unscaled q.k ~80,000 (over fp16's 65504)
    common = randn(1, h, 1, d, scale=50.0)
    q, k = common + randn(1, h, s, d, scale=0.05), common + randn(1, h, s, d, scale=0.05)
    out.append(Case("large-logits", q, k, randn(1, h, s, d), randn(1, h, s, d)))
    # anemoi-core #1027: a sharp softmax whose keys all carry the same value: out = v, dq = dk = 0
    q = randn(1, h, s, d, scale=2.5)
    value = randn(1, h, 1, d).expand(1, h, s, d).contiguous()
    k = q + randn(1, h, s, d, scale=0.2)
    sharp = "sharp-equal-values"
    out.append(Case(sharp, q, k, value, randn(1, h, s, d), VANISHING[sharp]))
    # a non-contiguous view: what anemoi's rearrange of a (batch, grid, heads, vars) tensor gives
    q, k = randn(1, s, h, d).transpose(1, 2), randn(1, s, h, d).transpose(1, 2)
    out.append(Case("non-contiguous", q, k, randn(1, h, s, d), randn(1, h, s, d)))
    for dim in (64, 128):
        shape = (1, h, 16, dim)
        q, k, v, go = randn(*shape), randn(*shape), randn(*shape), randn(*shape)
        out.append(Case(f"head-dim-{dim}", q, k, v, go))
    # issue 55's views SDPA's kernels take: heads and sequence transposed; a strided sequence
    q, k, v, go = (randn(1, s, h, d).transpose(1, 2) for _ in range(4))
    out.append(Case(lifecycle.TRANSPOSED, q, k, v, go))
    q, k, v = (every_other_row(randn(1, h, s, d)) for _ in "qkv")
    out.append(Case(lifecycle.STRIDED, q, k, v, randn(1, h, s, d)))
    return out


def _cast(case: Case, dtype: Any) -> Case:
    """The same values in ``dtype`` (views stay views)."""
    q, k, v, go = (t.to(dtype) for t in (case.q, case.k, case.v, case.go))
    return Case(case.name, q, k, v, go, case.vanishing)


def _as_called(case: Case, opts: Options) -> Case:
    """The case with the key/value heads the model's calls pass (its first ``opts.kv``)."""
    if not opts.kv:
        return case
    return dataclasses.replace(case, k=case.k[:, : opts.kv], v=case.v[:, : opts.kv])


# ---- measuring: a row per dtype ------------------------------------------------------------------
def build(cand: Candidate, values: Mapping[str, Any], **override: Any) -> Any:
    """An instance of the candidate with the canonical options, as the lock pins them (``causal``
    only where the model is), and ``override``."""
    cls = import_target(cand.target, (cand.target.split(".")[0],), semantics="attention")
    kwargs = {**cand.pinned_kwargs(values), **override}
    return cls(*[fill(a, values) for a in cand.args], **kwargs)


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """What the block raises, raised again as ``measure.Refused`` with torch's reasons first."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        except Exception as exc:
            # torch's SDPA says why it refused a backend in warnings ("Flash attention kernel not
            # used because:", "Both fused kernels do not support non-zero dropout.")
            notes = [str(w.message).split(" (Triggered internally")[0] for w in caught]
            notes = [n for n in dict.fromkeys(notes) if n and "kernel" in n]
            raise measure.Refused("; ".join([*notes, measure.first_line(exc, 300)])) from exc


def _call(mod: Any, q: Any, k: Any, v: Any, opts: Options) -> Any:
    """The module called as the model calls it: its attn_mask, scale, grouped key/value heads."""
    mask = call_mask(opts.mask, q, k)
    extra = {"attn_mask": mask} if mask is not None else {}
    extra.update({"enable_gqa": True} if k.shape[1] != q.shape[1] else {})
    return mod(q, k, v, scale=opts.scale, **extra)


PLAIN = Options()  # a call that passes no mask, scale or grouped heads


def _run(mod: Any, case: Case, opts: Options = PLAIN) -> dict[str, Any]:
    with _refusals():
        return _grads(lambda q, k, v: _call(mod, q, k, v, opts), case.q, case.k, case.v, case.go)


def _forward(mod: Any, case: Case, opts: Options, inference: str) -> dict[str, Any]:
    """The output alone, the module called inside ``inference`` (``lifecycle.INFERENCE``)."""
    with _refusals(), lifecycle.inference(inference, mod):
        q, k, v = (lifecycle.fresh_like(t) for t in (case.q, case.k, case.v))
        return {"out": _call(mod, q, k, v, opts).detach()}


def _errors(got: Mapping, bases: list, ref: Mapping, vanishing: tuple) -> tuple[dict, dict]:
    """Per output in ``got``: [the candidate's error, torch's (its paths' larger)], and the
    statistics per row (none for a vanishing output: measured against max|dv|, by the max alone)."""
    dv_scale = float(ref["dv"].abs().max())
    # float32 sums into each output: the scores' over head_dim, then P's over the keys
    terms = int(ref["dk"].shape[-1] + ref["dk"].shape[-2])
    out, stats = {}, {}
    for name in (n for n in OUTPUTS if n in got):
        denom = dv_scale if name in vanishing else None
        theirs = max(rel(b[name], ref[name], denom) for b in bases)
        out[name] = [rel(got[name], ref[name], denom), theirs]
        if name in vanishing:
            continue
        ref64, got64 = ref[name].detach().double(), got[name].detach().double()
        # torch's statistics: the larger of its math path's and its fused ordering's
        m, f = (measure.compare(got64, b[name].double(), ref64, rows=True)[1] for b in bases)
        for key in ("rms", "bias", "sd"):
            m[key] = [m[key][0], max(m[key][1], f[key][1])]
        stats[name] = {**m, "terms": terms}
    return out, stats


def _torch_side(case: Case, opts: Options) -> tuple[Any, Any, Any]:
    """torch's math path, its fused path and the float64 reference on ``case``."""
    base = _grads(lambda q, k, v: math_path(q, k, v, opts), case.q, case.k, case.v, case.go)
    fused = fused_path(case.q, case.k, case.v, case.go, opts)
    c64 = _cast(case, torch.float64)
    ref = _grads(lambda q, k, v: explicit(q, k, v, opts), c64.q, c64.k, c64.v, c64.go)
    return base, fused, ref


def _band_edge(mod: Any, dtype: Any, gen: torch.Generator, opts: Options) -> str | None:
    """None when keys outside query i0's band get exactly zero weight and gradient, else what."""
    h, d, s, window = CHECK_HEADS, CHECK_DIM, CHECK_SEQ, opts.window
    randn = _randn(dtype, gen)
    q, k, v = (randn(1, h, s, d) for _ in range(3))
    i0 = s // 2
    go = torch.zeros_like(q)
    go[:, :, i0] = 1.0
    edge = _as_called(Case("edge", q, k, v, go), opts)
    q, k, v = edge.q, edge.k.clone(), edge.v.clone()
    got = _run(mod, Case("edge", q, k, v, go), opts)
    outside = (torch.arange(s, device=q.device) - i0).abs() > window
    leaks = [name for name in ("dk", "dv") if bool((got[name][:, :, outside] != 0).any())]
    v2, k2 = v.clone(), k.clone()
    v2[:, :, outside] = 1e3
    k2[:, :, outside] = -k2[:, :, outside]
    again = _run(mod, Case("edge", q, k2, v2, go), opts)
    if not torch.equal(again["out"][:, :, i0], got["out"][:, :, i0]):
        leaks.insert(0, "out")
    if not leaks:
        return None
    reached = ", ".join(leaks)
    return f"keys outside the band of half-width {window} reach {reached} (must be exactly zero)"


def _row(cand: Candidate, values: Mapping, name: str, regime: str, seed: int, shared: Any) -> Any:
    # "mixed" is checked on inputs in the low dtype, as in "true" (the Linear before it hands it)
    row: MeasurementRow = {"dtype": name, "regime": regime}
    # every candidate draws a row's inputs in the same order: torch's side is shared by call number
    overrides = json.dumps(dict(values), sort_keys=True, default=str)
    key = ("Attention", overrides, name, regime, seed, str(torch.get_default_device()))
    sides: dict[int, tuple[Any, Any, Any]] = {} if shared is None else shared.get(key, dict)
    calls = itertools.count()

    def measured(inst: Any, case: Case, opts: Options, flags: dict | None = None, **use) -> tuple:
        # ``use``: inference=lifecycle.INFERENCE's (the forward only), side=the call it shares
        n = use.get("side", next(calls))
        case = _as_called(case, opts)
        if "inference" in use:
            got = _forward(inst, case, opts, use["inference"])
        else:
            got = _run(inst, case, opts)
            if got["mutated"] and flags is not None:
                flags.setdefault("input-modified", case.name)
        if n not in sides:
            sides[n] = _torch_side(case, opts)
        base, fused, ref = sides[n]
        return _errors(got, [base, fused], ref, case.vanishing)

    dtype = measure.torch_dtype(name)
    gen = torch.Generator().manual_seed(seed)
    errors: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    flags: dict[str, str] = {}
    with measure.measuring(row):  # a refusal's exception says torch's reasons
        _cases(cand, values, measured, dtype, gen, (errors, stats, flags))
        # determinism: the same fwd+bwd twice, bitwise, each on a fresh instance (never copied)
        opts = Options.of(values)
        random = _as_called(random_case(dtype, torch.Generator().manual_seed(seed)), opts)
        got, again = (_run(_training(build(cand, values), values), random, opts) for _ in "ab")
        row["nondeterministic"] = measure.nondeterminism(got, again, OUTPUTS)
        row["twin"] = _twin(cand, values, random, got)
        row["cases"], row["stats"], row["flags"] = errors, stats, flags
    return row


def _training(mod: Any, values: Mapping[str, Any]) -> Any:
    """In training mode where the model has no dropout, else in eval (dropout is a capability)."""
    return mod.train(not values["dropout"])


def _cases(
    cand: Candidate, values: Mapping[str, Any], measured: Any, dtype: Any, gen: Any, out: tuple
) -> None:
    """The cases, ``lifecycle``'s, the windows and the band's edge, a second length into ``out``."""
    errors, stats, flags = out
    opts = Options.of(values)
    window = opts.window if opts.window >= 0 else CHECK_SEQ // 4
    mod = _training(build(cand, values), values)
    checked = cases(dtype, gen)
    for case in checked:
        errors[case.name], stats[case.name] = measured(mod, case, opts, flags)
    for use in lifecycle.INFERENCE:
        errors[use], stats[use] = measured(mod, checked[0], opts, inference=use, side=0)
    after = lifecycle.AFTER_UPDATE  # no parameter to update: the same instance, fresh inputs
    errors[after], stats[after] = measured(mod, random_case(dtype, gen), opts, flags)
    # the windows: the model's (or a quarter of the sequence) and the band's edge, fresh instances
    for name, w in (("window", window), ("small-window", SMALL_WINDOW)):
        if opts.window >= 0 and name == "window":
            inst, o = mod, opts
        else:
            inst = _training(build(cand, values, window=w), values)
            o = dataclasses.replace(opts, window=w)
        errors[name], stats[name] = measured(inst, random_case(dtype, gen), o)
        leak = _band_edge(inst, dtype, gen, o)
        if leak:
            flags.setdefault("band-leak", leak)
    # a second sequence length through the same instance (anemoi's SDPA wrapper caches its mask)
    inst = _training(build(cand, values, window=window), values)
    o = dataclasses.replace(opts, window=window)
    first = _as_called(random_case(dtype, gen), o)
    _run(inst, first, o)
    cut = CHECK_SEQ // 2 + 5
    short = Case("second-length", *(t[:, :, :cut] for t in (first.q, first.k, first.v, first.go)))
    errors["second-length"], stats["second-length"] = measured(inst, short, o)


def _twin(cand: Candidate, values: Mapping, case: Case, got: Mapping) -> dict[str, Any]:
    """The twin (torch's SDPA, the same options) on the same input: the largest difference."""
    twin_cand = measure.twin_candidate(cand, "Attention")
    if twin_cand is None:
        return measure.incompatible()
    try:
        twin = _run(build(twin_cand, values).eval(), case, Options.of(values))
    except Exception as exc:
        return measure.incompatible(f"the twin raised {measure.first_line(exc, 300)}")
    worst = max(rel(got[n], twin[n]) for n in OUTPUTS)
    return {"state_dict": "interchangeable", "max_error": worst}


# ---- the capability matrix -----------------------------------------------------------------------
def capabilities(cand: Candidate, values: Mapping[str, Any], seed: int) -> dict[str, str]:
    """What each option really does, measured in float32 on a fresh instance per option."""
    gen = torch.Generator().manual_seed(seed + 7)
    base_values = {**values, **UNSET}  # no option set
    case = random_case(torch.float32, gen)
    # large logits make softcap matter; a window of 4 in 48 keys makes the band matter
    loud = Case("loud", case.q * 6, case.k * 6, case.v, case.go)
    trials: dict[str, tuple[dict[str, Any], Options, Case]] = {
        "window": ({"window": 4}, Options(window=4), case),
        "softcap": ({"softcap": 2.0}, Options(softcap=2.0), loud),
        "alibi": ({"alibi": True}, Options(alibi=True), case),
        "scale": ({}, Options(scale=0.05), loud),
        "causal": ({"causal": True}, Options(causal=True), case),
        "mask-bool": ({}, Options(mask="bool"), case),
        "mask-float": ({}, Options(mask="float"), case),
        "gqa": ({}, Options(kv=1), case),
    }
    out = {name: _capability(cand, base_values, *trial) for name, trial in trials.items()}
    out["dropout"] = _dropout(cand, base_values, case)
    return out


def _capability(
    cand: Candidate, values: Mapping[str, Any], override: dict[str, Any], opts: Options, case: Case
) -> str:
    case = _as_called(case, opts)
    c64 = _cast(case, torch.float64)
    with_it = explicit(c64.q, c64.k, c64.v, opts)
    without = explicit(c64.q, c64.k, c64.v, Options())  # the heads grouped alike, by the shapes
    try:
        mod = build(cand, values, **override).eval()
        with _refusals():
            got = _call(mod, case.q, case.k, case.v, opts).detach()
    except Exception as exc:  # a refusal says torch's reasons
        return (
            f"raises: {exc if isinstance(exc, measure.Refused) else measure.first_line(exc, 300)}"
        )
    tol = 4 * rel(math_path(case.q, case.k, case.v, opts), with_it) + 1e-5
    if rel(got, with_it) <= tol:
        return "honoured"
    if rel(got, without) <= tol:
        return "ignored"
    return (
        f"wrong (error {rel(got, with_it):.3g} against the reference with it, "
        f"{rel(got, without):.3g} without)"
    )


def _dropout(cand: Candidate, values: Mapping[str, Any], case: Case) -> str:
    """Honoured: dropout 0.5 changes the output in training mode, and eval mode turns it off."""
    try:
        mod = build(cand, values, dropout=0.5)
        with _refusals():
            mod.train()
            torch.manual_seed(1)
            dropped = mod(case.q, case.k, case.v).detach()
            mod.eval()
            plain = mod(case.q, case.k, case.v).detach()
    except Exception as exc:  # a refusal says torch's reasons
        return (
            f"raises: {exc if isinstance(exc, measure.Refused) else measure.first_line(exc, 300)}"
        )
    ref = explicit(case.q.double(), case.k.double(), case.v.double(), Options())
    if rel(plain, ref) > 1e-4:
        return f"wrong (eval mode with dropout set is off by {rel(plain, ref):.3g})"
    return "ignored" if rel(dropped, plain) <= 1e-6 else "honoured"


def check(
    cand: Candidate,
    device: str,
    dtypes: list[tuple[str, str]],
    *,
    canonical_overrides: Mapping[str, Any] | None = None,
    seed: int = 0,
    shared: measure.SetupCache | None = None,
    **_: Any,
) -> CheckReply:
    """Raw measurements of one Attention candidate (``shared``: torch's side of each case, once)."""
    values = canonical_options(canonical_overrides)
    import_s, stopped = measure.import_stop(cand, device, needed=bool(cand.target.count(".")))
    if stopped is not None:
        return stopped
    with measure.on_device(device):
        rows = [_row(cand, values, d, regime, seed, shared) for d, regime in dtypes]
        caps = capabilities(cand, values, seed)
    return CheckReply(
        candidate=cand.id, device=device, rows=rows, import_s=import_s, capabilities=caps
    )


def tiny_call(cand: Candidate, device: str) -> None:
    """One tiny forward and backward (``Slot.try_once``: what it raises says why it cannot run)."""
    mod = build(cand, canonical_options(None))
    q = torch.randn(1, 2, 8, 32, device=torch_device(device), requires_grad=True)
    mod(q, q, q).sum().backward()


def too_long(mod: Any, g: Any, dtype: Any, calls: int) -> None:
    """On a CPU, raise (the row's error) where ``calls`` calls at ``g`` would outlast the timing
    limit, from the second of two calls at ``ESTIMATE_SEQ`` keys (``attention.too_long``)."""
    q = torch.randn(1, g.heads, ESTIMATE_SEQ, g.head_dim, dtype=dtype, requires_grad=True)
    for _ in range(2):
        t0 = time.perf_counter()
        mod(q, q, q).sum().backward()
    reason = attention_too_long(g.seq, ESTIMATE_SEQ, time.perf_counter() - t0, calls)
    if reason:
        raise RuntimeError(reason)


def time_candidate(
    cand: Candidate,
    device: str,
    geometries: list[str],
    dtype_name: str,
    options: Mapping[str, Any],
    canonical_overrides: Mapping[str, Any] | None = None,
    progress: Callable[[protocol.TimingProgressMessage], None] | None = None,
    regime: str = "true",
    **_: Any,
) -> protocol.TimeReply:
    """fwd+bwd per geometry (``timing.step_rows``); on a GPU, peak memory."""
    tdev = torch_device(device)

    def run_shape(text: str, timed: Callable[[Callable[[], None]], protocol.TimingRow]) -> None:
        g = parse_geometry(text)
        values = canonical_options({**dict(canonical_overrides or {}), **dict(g.options)})
        mod = build(cand, values).train()
        dtype = measure.torch_dtype(dtype_name)

        def new(heads: int, grad: bool = True) -> Any:
            shape = (1, heads, g.seq, g.head_dim)
            return torch.randn(*shape, device=tdev, dtype=dtype, requires_grad=grad)

        if tdev == "cpu" and g.seq > ESTIMATE_SEQ:
            reps = 1 if options.get("mode") == "sole" else int(options.get("reps", 1))
            too_long(mod, g, dtype, int(options.get("warmup", 1)) + reps)
        q, k, v, go = new(g.heads), new(g.kv_heads), new(g.kv_heads), new(g.heads, False)
        opts = dataclasses.replace(Options.of(values), kv=0)  # the heads are the geometry's

        def step() -> None:
            torch.autograd.grad(_call(mod, q, k, v, opts), (q, k, v), go)

        if tdev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row = timed(step)
        keys = keys_seen(g)
        seconds = row["median_ms"] / 1e3
        # fwd 2 matmuls, bwd 5 (one recomputing the scores), 2 flops per multiply-add, band keys
        row["tflops"] = 7 * 2.0 * g.heads * g.seq * keys * g.head_dim / seconds / 1e12
        # q, k, v, out read or written forward; q, k, v, out, grad_out read, dq, dk, dv written
        row["gbps"] = 12 * g.heads * g.seq * g.head_dim * dtype.itemsize / seconds / 1e9
        if tdev == "cuda":
            row["peak_bytes"] = int(torch.cuda.max_memory_allocated())

    return timing.step_rows(
        cand.id, device, geometries, dtype_name, options, progress, run_shape, regime
    )
