"""The check at the model's shapes: run inside the worker, right after a candidate is timed at a
shape.

The correctness kernels (``measure``) run at 37 rows. A kernel can be right there and wrong at the
model's size: PyTorch's ROCm ``F.layer_norm`` for rows >= 2^23 with hidden % 4 != 0 (pytorch
#184826), Triton kernels whose int32 offsets overflow past 2^31 elements, a launch grid whose y
dimension stops at 65535 rows. So after timing, the candidate runs forward and backward once more at
that exact shape, in that regime (autocast or not), and a sample of its rows is compared with a
float64 reference.

The rows (:func:`sample_rows`), for a tensor of R rows whose rows are W wide:

- the first and the last ``WINDOW`` rows;
- ``WINDOW`` rows either side of each boundary the tensor reaches: rows 2^16 and 2^23, and the first
  row whose elements start at or beyond 2^31 (``ceil(2^31 / W)``, for every width the slot's tensors
  have: a Linear's input and output widths), i.e. rows ``b - WINDOW`` to ``b + WINDOW - 1``;
- one row in each of ``SPREAD`` equal bands over the whole tensor, at a fixed offset inside its band
  that depends only on R (so a rerun samples the same rows, and they are not all block-aligned).

What is compared, and why it can be compared on a sample:

- ``y`` and ``dx`` on every sampled row. Both are row-local for these slots (a norm's output row and
  its input gradient depend on that row only; a Linear's on that input row and the weights), so the
  float64 reference computed from the sampled rows alone is exact for them.
- ``dweight`` and ``dbias``, which sum over every row. The checked backward is fed a grad_output
  that is zero on every row but the sampled ones, so the full-size sum must equal the sum over the
  sampled rows, which the reference computes. A kernel that drops, duplicates or misplaces the
  contributions of rows beyond some size is caught as soon as a sampled row lies beyond it.
- torch.nn's own error, the basis of the tolerance (``judge``), is measured by running torch.nn on
  the sampled rows alone (a small tensor): so a torch.nn that is itself wrong at the model's size
  cannot widen the tolerance. The torch.nn candidate gets this check like any other, and is rejected
  by it.

When a sampled row is wrong, the rows between it and the last right sampled row below it are
bisected on the output and the input gradient, so the report names the first wrong row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kernel_probe.isolation.protocol import ErrorStats, ShapeCheck
from kernel_probe.probe.blasrun import blas_selected
from kernel_probe.probe.layout import Layout
from kernel_probe.probe.measure import (
    autocasting,
    compare,
    gradients,
    group_errors,
    one_cpu_thread,
    reference,
    reference_pass,
)
from kernel_probe.probe.tolerance import STATISTICS, Limits, limits

WINDOW = 4  # rows either side of a boundary, and at each end of the tensor
SPREAD = 16  # bands over the whole tensor, one sampled row each
ROW_BOUNDARIES = ((1 << 16, "row 2^16"), (1 << 23, "row 2^23"))  # grid limits; pytorch #184826
ELEMENT_BOUNDARY = 1 << 31  # int32 element offsets overflow here
ROW_LOCAL = ("y", "dx")


def boundaries(rows: int, widths: Sequence[int]) -> list[tuple[int, str]]:
    """The boundaries a ``rows`` x ``width`` tensor reaches: (first row at or beyond it, its
    name)."""
    out = [(b, name) for b, name in ROW_BOUNDARIES if b < rows]
    for w in sorted(set(widths)):
        # ceil: the first row whose first element is at or beyond 2^31
        b = -(-ELEMENT_BOUNDARY // w)
        if b < rows:
            out.append((b, f"2^31 elements at width {w} (row {b})"))
    return out


def sample_rows(rows: int, widths: Sequence[int]) -> list[int]:
    """The rows the check compares (the rule is in the module docstring), ascending, without
    repeats."""
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


def _row_statistics(
    got: torch.Tensor, ref: torch.Tensor, scale: float, lim: Limits
) -> list[torch.Tensor]:
    """Per row, per statistic (max, RMS, bias): is it over its tolerance? ``scale`` is max |ref|
    over every sampled row (normwise, as the tensor's statistics)."""
    per = group_errors(got, ref, scale, rows=True)[:3]
    return [v > tol for v, tol in zip(per, (lim.max, lim.rms, lim.bias), strict=True)]


def _rows_over(got: torch.Tensor, ref: torch.Tensor, scale: float, lim: Limits) -> torch.Tensor:
    """Per row: is any of its statistics over its tolerance?"""
    over = _row_statistics(got, ref, scale, lim)
    return over[0] | over[1] | over[2]


def _row_statistic(
    got: torch.Tensor, ref: torch.Tensor, scale: float, lim: Limits, tensor: str
) -> str:
    """What is over in a one-row ``got`` (``y bias``, ``y RMS error``), the max first; "" when
    none."""
    for name, over in zip(
        ("max", "rms", "bias"), _row_statistics(got, ref, scale, lim), strict=True
    ):
        if bool(over[0]):
            return f"{tensor} {STATISTICS[name]}"
    return ""


def _sampled_statistic(
    row: int,
    sampled: Sequence[int],
    got: Mapping[str, Any],
    ref_by: Mapping[str, Any],
    lims: Mapping[str, Limits],
) -> str:
    """What is over in a sampled row (the first bad row when the bisection did not have to look at
    it)."""
    if row not in sampled:
        return ""
    i = sampled.index(row)
    for name in ROW_LOCAL:
        g, r = got.get(name), ref_by.get(name)
        if g is None or r is None:
            continue
        what = _row_statistic(g[i : i + 1], r[i : i + 1], r.abs().max().item(), lims[name], name)
        if what:
            return what
    return ""


def check_at_shape(
    *,
    module: torch.nn.Module,
    layout: Layout,
    baseline: torch.nn.Module,
    base_layout: Layout,
    semantics: str,
    x: torch.Tensor,
    width: int,
    params64: Mapping[str, Any],
    eps: float,
    dtype_name: str,
    autocast: tuple[str, Any] | None,
    gen: torch.Generator,
    baseline_library: str = "",
    timer: Callable[[Callable[[], None]], object] | None = None,
) -> ShapeCheck:
    """Forward and backward of ``module`` on the whole of ``x`` (the model's shape), against float64
    and against torch.nn (``baseline``, on the sampled rows only), with the same parameters in both.
    ``timer``, when given, runs the full-size forward and backward (and so can time that call alone:
    a sole candidate's one measured call is this one)."""
    started = time.perf_counter()
    rows, hidden = x.shape
    sampled = sample_rows(rows, (hidden, width))
    idx = torch.tensor(sampled, device=x.device)
    # grad_output: zero except on the sampled rows, so the parameter gradients are sums over them
    # only
    gy_rows = (torch.randn(len(sampled), width, generator=gen) * 0.7 + 0.1).to(x.device, x.dtype)
    gy = torch.zeros(rows, width, device=x.device, dtype=x.dtype)
    gy[idx] = gy_rows
    x = x.detach().requires_grad_(True)
    for p in module.parameters():
        p.grad = None
    output: list[torch.Tensor] = []

    def forward_backward(grad: torch.Tensor = gy) -> None:
        with autocasting(autocast):
            output.append(module(x))
        output[0].backward(grad)

    if timer is None:
        forward_backward()
    else:
        timer(forward_backward)
    del forward_backward  # its default holds the full-size grad_output, freed below
    y = output[0]
    got = {
        "y": y.detach()[idx],
        "dx": x.grad[idx] if x.grad is not None else None,
        **{f"d{n}": g for n, g in gradients(module, layout).items()},
    }
    del gy
    # the rest is small tensors: thread hand-offs would cost more than the work
    with one_cpu_thread(x.device.type):
        xs = x.detach()[idx].clone().requires_grad_(True)
        for p in baseline.parameters():
            p.grad = None
        with (
            blas_selected(baseline_library),
            autocasting(autocast),
        ):  # a Linear's baseline: the classic BLAS library
            yb = baseline(xs)
            yb.backward(gy_rows)
        base = {
            "y": yb.detach(),
            "dx": xs.grad,
            **{f"d{n}": g for n, g in gradients(baseline, base_layout).items()},
        }
        ref = reference_pass(semantics, xs.detach(), gy_rows, params64, eps, None)
        ref_by = {"y": ref["y"], "dx": ref["dx"], "dweight": ref["weight"], "dbias": ref["bias"]}
        errors: dict[str, list[float]] = {}
        stats: dict[str, ErrorStats] = {}
        for name, r in ref_by.items():
            if r is None:
                continue
            errors[name], stats[name] = compare(
                got.get(name), base.get(name), r, rows=name in ROW_LOCAL
            )
        out = ShapeCheck(
            rows=rows,
            sampled=len(sampled),
            errors=errors,
            stats=stats,
            boundaries=[n for _, n in boundaries(rows, (hidden, width))],
        )
        # the first wrong row: the first sampled row over a tolerance, then bisected down to the
        # last right one
        lims = {name: limits(dtype_name, errors[name][1], stats[name]) for name in errors}
        bad_at: int | None = None
        for name in ROW_LOCAL:
            g, r = got.get(name), ref_by[name]
            if g is None or r is None:
                continue
            over = _rows_over(g, r, r.abs().max().item(), lims[name]).nonzero()
            if len(over):
                first = sampled[int(over[0])]
                bad_at = first if bad_at is None else min(bad_at, first)
        if bad_at is not None:
            below = [r for r in sampled if r < bad_at]
            out["last_good_row"] = below[-1] if below else -1
            scale_y = ref_by["y"].abs().max().item()
            found: dict[int, str] = {}

            def wrong(r: int) -> bool:
                found[r] = _row_wrong(r, semantics, x, y, params64, eps, scale_y, lims["y"])
                return bool(found[r])

            first_bad = _bisect(out["last_good_row"], bad_at, wrong)
            out["first_bad_row"] = first_bad
            out["first_bad_sampled"] = bad_at
            what = found.get(first_bad) or _sampled_statistic(first_bad, sampled, got, ref_by, lims)
            if what:
                out["first_bad_statistic"] = what
        out["seconds"] = round(time.perf_counter() - started, 4)
        return out


def _row_wrong(
    row: int,
    semantics: str,
    x: torch.Tensor,
    y: torch.Tensor,
    params64: Mapping[str, Any],
    eps: float,
    scale: float,
    lim: Limits,
) -> str:
    """What is wrong in one (unsampled) row ("" when nothing): its output judged on the same scale
    and tolerances as the sample; its input gradient must be zero, as its grad_output was."""
    x64 = x.detach()[row : row + 1].to(torch.float64)
    r = reference(semantics, x64, params64["weight"], params64["bias"], eps)
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
