"""The check at the model's shapes, in the worker, as a norm or Linear is timed (``timing``): one
more forward and backward at that shape, sampled rows (``sample_rows``) compared with float64 and
torch.nn on them alone (grad_output is zero elsewhere), a wrong row bisected down to the first.
A kernel right at 37 rows can be wrong past 2^23 rows (pytorch #184826) or 2^31 elements
(docs/checks.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kernel_probe.candidates import Candidate, default_for
from kernel_probe.isolation.protocol import ErrorStats, ShapeCheck
from kernel_probe.probe import measure, onetensor
from kernel_probe.probe.layout import discover, shapes
from kernel_probe.probe.tolerance import STATISTICS, Limits, limits

WINDOW = 4  # rows either side of a boundary, and at each end of the tensor
SPREAD = 16  # bands over the whole tensor, one sampled row each
ROW_BOUNDARIES = ((1 << 16, "row 2^16"), (1 << 23, "row 2^23"))  # grid limits; pytorch #184826
ELEMENT_BOUNDARY = 1 << 31  # int32 element offsets overflow here
ROW_LOCAL = ("y", "dx")
Timer = Callable[[Callable[[], None]], object]


def boundaries(rows: int, widths: Sequence[int]) -> list[tuple[int, str]]:
    """The boundaries a ``rows`` x ``width`` tensor reaches: (first row at or beyond, name)."""
    out = [(b, name) for b, name in ROW_BOUNDARIES if b < rows]
    for w in sorted(set(widths)):
        b = -(-ELEMENT_BOUNDARY // w)  # ceil: the first row whose first element is at or beyond
        if b < rows:
            out.append((b, f"2^31 elements at width {w} (row {b})"))
    return out


def sample_rows(rows: int, widths: Sequence[int]) -> list[int]:
    """The rows compared, ascending: the first and last ``WINDOW``, ``WINDOW`` either side of each
    boundary, one in each of ``SPREAD`` bands at an offset depending only on ``rows``."""
    if rows <= 0:
        return []
    picked: set[int] = set(range(min(WINDOW, rows)))
    picked.update(range(max(rows - WINDOW, 0), rows))
    for b, _ in boundaries(rows, widths):
        picked.update(r for r in range(b - WINDOW, b + WINDOW) if 0 <= r < rows)
    for i in range(SPREAD):
        lo, hi = i * rows // SPREAD, (i + 1) * rows // SPREAD
        if hi > lo:
            picked.add(lo + (i * 2654435761 + rows) % (hi - lo))  # Knuth's multiplicative hash
    return sorted(picked)


class Setup:
    """The check at a timed shape, prepared: candidate and torch.nn with the checks' parameters."""

    def __init__(
        self,
        cand: Candidate,
        slot: str,
        module: Any,
        canonical: dict,
        device: str,
        param_dtype: Any,
    ) -> None:
        self.semantics, self.device, self.module = cand.semantics, device, module
        self.baseline_library = onetensor.baseline_blas(cand, device)
        self.baseline = measure.build(default_for(slot), canonical, device, param_dtype)
        base_shapes = shapes(self.baseline.state_dict())
        self.base_layout = discover(base_shapes, base_shapes)
        if cand.semantics == "linear" and canonical["out_features"] == canonical["in_features"]:
            # a square weight cannot tell (out, in) from (in, out): the layout is read from a
            # non-square build (the same names and orientation), as the correctness checks read it
            wide = {**canonical, "out_features": canonical["in_features"] + 3}
            self.layout = discover(
                shapes(measure.build(cand, wide, device, param_dtype).state_dict()),
                shapes(measure.build(default_for(slot), wide, device, param_dtype).state_dict()),
            )
        else:
            self.layout = discover(shapes(module.state_dict()), base_shapes)
        self.gen = torch.Generator().manual_seed(0)
        params, self.params64 = onetensor.parameters_for(cand.semantics, canonical, self.gen)
        self.eps: float | None = canonical.get("eps", 0.0)  # None: torch's (eps_for)
        if self.layout.ok:
            onetensor.load_parameters(module, params, self.layout)
            onetensor.load_parameters(self.baseline, params, self.base_layout)

    def run(
        self, x: Any, width: int, dtype_name: str, mixed: bool, timer: Timer | None = None
    ) -> ShapeCheck:
        """The check on all of ``x``, or its error (``timer`` runs the full-size pass, if given)."""
        rows = int(x.shape[0])
        if not self.layout.ok:  # only accepted candidates are timed: one offered directly
            why = f"its state dict does not map onto torch.nn's: {self.layout.problem()}"
            return ShapeCheck(rows=rows, error=why)
        autocast = (self.device, measure.torch_dtype(dtype_name)) if mixed else None
        try:
            return check_at_shape(self, x, width, dtype_name, autocast, timer)
        except Exception as exc:  # out of memory for the extra tensors, a kernel raising
            return ShapeCheck(rows=rows, error=measure.first_line(exc, 400))


def check_at_shape(
    setup: Setup, x: Any, width: int, dtype_name: str, autocast: Any, timer: Timer | None
) -> ShapeCheck:
    """The candidate's pass on all of ``x``, against float64 and torch.nn on the sampled rows."""
    started = time.perf_counter()
    rows, hidden = x.shape
    sampled = sample_rows(rows, (hidden, width))
    idx = torch.tensor(sampled, device=x.device)
    # grad_output: zero except on the sampled rows, so the parameter gradients sum over them only
    gy_rows = torch.randn(len(sampled), width, generator=setup.gen) * 0.7 + 0.1
    gy_rows = gy_rows.to(x.device, x.dtype)
    x, y, got = _full_size(setup, x, idx, gy_rows, autocast, timer)
    # the rest is small tensors: thread hand-offs would cost more than the work
    with measure.one_cpu_thread(x.device.type):
        xs = x.detach()[idx].clone()
        base = _sampled_baseline(setup, xs, gy_rows, autocast)
        ref = onetensor.reference_pass(
            setup.semantics, xs.detach(), gy_rows, setup.params64, setup.eps, None
        )
        ref_by = {"y": ref["y"], "dx": ref["dx"], "dweight": ref["weight"], "dbias": ref["bias"]}
        errors: dict[str, list[float]] = {}
        stats: dict[str, ErrorStats] = {}
        for name, r in ref_by.items():
            if r is not None:
                errors[name], stats[name] = measure.compare(
                    got.get(name), base.get(name), r, rows=name in ROW_LOCAL
                )
        found = [n for _, n in boundaries(rows, (hidden, width))]
        out = ShapeCheck(
            rows=rows, sampled=len(sampled), errors=errors, stats=stats, boundaries=found
        )
        lims = {name: limits(dtype_name, errors[name][1], stats[name]) for name in errors}
        _first_bad(setup, out, (x, y), sampled, got, ref_by, lims)
        out["seconds"] = round(time.perf_counter() - started, 4)
        return out


def _full_size(
    setup: Setup, x: Any, idx: Any, gy_rows: Any, autocast: Any, timer: Timer | None
) -> tuple[Any, Any, dict[str, Any]]:
    """The candidate's full-size pass: x (now a leaf), y, and what is compared."""
    rows, width = x.shape[0], gy_rows.shape[1]
    gy = torch.zeros(rows, width, device=x.device, dtype=x.dtype)
    gy[idx] = gy_rows
    x = x.detach().requires_grad_(True)
    for p in setup.module.parameters():
        p.grad = None
    output: list[Any] = []

    def forward_backward(grad: Any = gy) -> None:
        with measure.autocasting(autocast):
            output.append(setup.module(x))
        output[0].backward(grad)

    if timer is None:
        forward_backward()
    else:
        timer(forward_backward)
    del forward_backward, gy  # the full-size grad_output is freed here
    y = output[0]
    got = {
        "y": y.detach()[idx],
        "dx": x.grad[idx] if x.grad is not None else None,
        **{f"d{n}": g for n, g in onetensor.gradients(setup.module, setup.layout).items()},
    }
    return x, y, got


def _sampled_baseline(setup: Setup, xs: Any, gy_rows: Any, autocast: Any) -> dict[str, Any]:
    """torch.nn on the sampled rows alone (a Linear's under the classic BLAS library)."""
    xs.requires_grad_(True)
    for p in setup.baseline.parameters():
        p.grad = None
    with onetensor.blas_selected(setup.baseline_library), measure.autocasting(autocast):
        yb = setup.baseline(xs)
        yb.backward(gy_rows)
    grads = onetensor.gradients(setup.baseline, setup.base_layout)
    return {"y": yb.detach(), "dx": xs.grad, **{f"d{n}": g for n, g in grads.items()}}


def _first_bad(
    setup: Setup,
    out: ShapeCheck,
    xy: tuple[Any, Any],
    sampled: list[int],
    got: Mapping[str, Any],
    ref_by: Mapping[str, Any],
    lims: Mapping[str, Limits],
) -> None:
    """The first wrong row into ``out``: the first sampled one over, bisected down."""
    bad_at: int | None = None
    overs: dict[str, list[Any]] = {}  # per output, per statistic: each sampled row over?
    for name in ROW_LOCAL:
        g, r = got.get(name), ref_by[name]
        if g is None or r is None:
            continue
        by_max, by_rms, by_bias = overs[name] = _row_statistics(
            g, r, r.abs().max().item(), lims[name]
        )
        over = (by_max | by_rms | by_bias).nonzero()
        if len(over):
            first = sampled[int(over[0])]
            bad_at = first if bad_at is None else min(bad_at, first)
    if bad_at is None:
        return
    below = [r for r in sampled if r < bad_at]
    out["last_good_row"] = below[-1] if below else -1
    scale_y = ref_by["y"].abs().max().item()
    found: dict[int, str] = {}

    def wrong(r: int) -> bool:
        found[r] = _row_wrong(setup, r, xy, scale_y, lims["y"])
        return bool(found[r])

    first_bad = _bisect(out["last_good_row"], bad_at, wrong)
    out["first_bad_row"] = first_bad
    out["first_bad_sampled"] = bad_at
    i = sampled.index(bad_at)  # a sampled row the bisection did not look at: what is over in it
    said = (
        f"{n} {s}"
        for n, o in overs.items()
        for s, v in zip(STATISTICS.values(), o, strict=True)
        if v[i]
    )
    what = found.get(first_bad) or (next(said, "") if first_bad == bad_at else "")
    if what:
        out["first_bad_statistic"] = what


def _row_statistics(got: Any, ref: Any, scale: float, lim: Limits) -> list[Any]:
    """Per row, per statistic (max, RMS, bias: ``STATISTICS``' order): over its tolerance?"""
    per = measure.group_errors(got, ref, scale, rows=True)[:3]
    return [v > tol for v, tol in zip(per, (lim.max, lim.rms, lim.bias), strict=True)]


def _row_statistic(got: Any, ref: Any, scale: float, lim: Limits, tensor: str) -> str:
    """What is over in a one-row ``got`` (``y bias``, ``y RMS error``), max first; "" if none."""
    over = _row_statistics(got, ref, scale, lim)
    pairs = zip(STATISTICS.values(), over, strict=True)
    return next((f"{tensor} {said}" for said, o in pairs if o[0]), "")


def _row_wrong(setup: Setup, row: int, xy: tuple[Any, Any], scale: float, lim: Limits) -> str:
    """What is wrong in an unsampled row (""; none): its output, or a dx not zero."""
    x, y = xy
    x64 = x.detach()[row : row + 1].to(torch.float64)
    p64, eps = setup.params64, onetensor.eps_for(setup.eps, x.dtype)
    r = onetensor.reference(setup.semantics, x64, p64["weight"], p64["bias"], eps)
    what = _row_statistic(y.detach()[row : row + 1], r, scale, lim, "y")
    if what:
        return what
    dx = x.grad[row] if x.grad is not None else None
    return "dx not zero where grad_output is" if dx is not None and bool((dx != 0).any()) else ""


def _bisect(good: int, bad: int, wrong: Callable[[int], bool]) -> int:
    """The lowest row in (good, bad] that is wrong, assuming the rows from it to ``bad`` are."""
    while bad - good > 1:
        mid = (good + bad) // 2
        if wrong(mid):
            bad = mid
        else:
            good = mid
    return bad
