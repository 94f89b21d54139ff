"""The norms and Linear as training and inference use them, in the worker (issue 55): the cases of
``lifecycle`` after the first life's, per (dtype, regime), beside torch.nn treated alike: the views,
the inference forwards, a second life after an in-place update, a round trip through torch.nn's
state dict at a square shape (docs/checks.md). torch.nn's side is prepared once per row
(``prepare``); each candidate's is ``measure_later``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kernel_probe.isolation.protocol import ErrorStats, MeasurementRow
from kernel_probe.probe import lifecycle, measure, onetensor
from kernel_probe.probe.layout import Layout

if TYPE_CHECKING:  # correctness builds on this module (imported where used)
    from kernel_probe.probe.correctness import Bench, Prepared, Row

ROWS = 11  # odd, below a block of 16; fewer than the first life's: these cases cost little

SEED = 55  # the later cases draw from a generator of their own: the first life's stay as they were


@dataclass(frozen=True)
class Later:
    """torch.nn's side of a row's later cases, as every candidate of the slot gets it."""

    views: tuple[tuple[str, Prepared], ...]  # transposed, strided: an input each
    inference: tuple[tuple[str, Any, dict[str, Any], measure.Side], ...]  # case, x, ref, torch's
    deltas: dict[str, Any]  # the in-place update, under torch.nn's names
    updated: tuple[Row, Prepared]  # the row with the updated parameters; the input after it
    loaded: tuple[Row, Any, Forward]  # the row at a square shape, torch.nn's module, the forward


Forward = tuple[Any, Any, measure.Side]  # an input, the reference output, torch.nn's errors


def prepare(bench: Bench, setup: Row, base: tuple[Any, Layout]) -> Later:
    """torch.nn's later cases (``base``: its module and layout)."""
    from kernel_probe.probe.correctness import _baseline  # a cycle: correctness imports inuse

    setup = dataclasses.replace(setup, gen=torch.Generator().manual_seed(bench.seed + SEED))
    views = tuple((v, _input(bench, setup, v, base)) for v in lifecycle.VIEWS)
    deltas = lifecycle.steps(setup.params64, bench.seed + SEED)
    params64 = {k: v if v is None else v + deltas[k] for k, v in setup.params64.items()}
    updated = dataclasses.replace(setup, params64=params64)
    after = _baseline(bench, setup, base[1])
    lifecycle.update_in_place(after, deltas, base[1].pairs)
    after_input = _input(bench, updated, lifecycle.AFTER_UPDATE, (after, base[1]))
    # at a square shape (a Linear's out_features = hidden), with parameters of its own
    canonical = {**setup.canonical, "out_features": bench.hidden}
    params, p64 = onetensor.parameters_for(bench.cand.semantics, canonical, setup.gen)
    square = dataclasses.replace(
        setup, canonical=canonical, params=params, params64=p64, width=bench.hidden
    )
    source = _baseline(bench, square, base[1])
    x, ref = _forward_input(bench, square)
    loaded = (x, ref, measure.side(forward(source, x, square.autocast), ref, rows=True))
    x, ref = _forward_input(bench, setup)  # one input of the inference cases
    inference = tuple(
        (case, x, ref, measure.side(forward(base[0], x, setup.autocast, case), ref, rows=True))
        for case in lifecycle.INFERENCE
    )
    return Later(views, inference, deltas, (updated, after_input), (square, source, loaded))


def _forward_input(bench: Bench, setup: Row) -> tuple[Any, Any]:
    """An input of a forward-only case, and the reference output on it."""
    x = (torch.randn(ROWS, bench.hidden, generator=setup.gen) + 0.3).to(
        bench.torch_device, setup.dtype
    )
    p64, eps = setup.params64, onetensor.eps_for(setup.eps, x.dtype)
    ref = onetensor.reference(
        bench.cand.semantics, x.to(torch.float64), p64["weight"], p64["bias"], eps
    )
    return x, ref


def _input(bench: Bench, setup: Row, name: str, base: tuple[Any, Layout]) -> Any:
    """One input of a later case (a view for a view's), torch.nn's pass and the reference on it."""
    from kernel_probe.probe.correctness import _prepared  # a cycle: correctness imports inuse

    gen, device = setup.gen, bench.torch_device
    x = (torch.randn(ROWS, bench.hidden, generator=gen) + 0.2).to(device, setup.dtype)
    x = lifecycle.view(name, x) if name in lifecycle.VIEWS else x
    gy = (torch.randn(ROWS, setup.width, generator=gen) * 0.7 + 0.1).to(device, setup.dtype)
    return _prepared(bench, setup, onetensor.Case(name, [x]), base, x, gy, None)


def forward(module: Any, x: Any, autocast: tuple[str, Any] | None, case: str = "") -> Any:
    """The module's output on ``x`` inside the inference ``case`` (lifecycle.INFERENCE; '': as
    training runs it)."""
    with contextlib.ExitStack() as stack:
        if case:
            stack.enter_context(lifecycle.inference(case, module))
        stack.enter_context(measure.autocasting(autocast))
        return module(lifecycle.fresh_like(x)).detach()


def measure_later(
    bench: Bench, setup: Row, later: Later, candidate: tuple[Any, Layout], row: MeasurementRow
) -> None:
    """The candidate's later cases into ``row``: the views and inference, then its second life
    (``candidate`` is updated in place), then a fresh one loaded from torch.nn's state dict and
    back."""
    for view, p in later.views:
        _run(bench, setup, view, p, candidate, row)
    for case, x, ref, base_side in later.inference:
        y = forward(candidate[0], x, setup.autocast, case)
        _judge_forward(row, case, [y], ref, base_side)
    lifecycle.update_in_place(candidate[0], later.deltas, candidate[1].pairs)
    updated, p = later.updated
    _run(bench, updated, lifecycle.AFTER_UPDATE, p, candidate, row)
    square, source, (x, ref, base_side) = later.loaded
    loaded = _round_trip(bench, square, source, candidate[1])
    ys = [forward(m, x, square.autocast) for m in loaded]
    _judge_forward(row, lifecycle.LOADED, ys, ref, base_side)


def _judge_forward(
    row: MeasurementRow, case: str, ys: list[Any], ref: Any, base_side: measure.Side
) -> None:
    """A forward-only case's errors into ``row``: the worst of ``ys`` as the candidate's."""
    errs: list[float] = [0.0, 0.0]
    stats: dict[str, ErrorStats] = {}
    for y in ys:
        maxima, y_stats = measure.compare(y, None, ref, rows=True, base_side=base_side)
        errs = [max(a, b) for a, b in zip(errs, maxima, strict=True)]
        measure.worst_stats(stats, "y", y_stats)
    row["cases"][case], row["stats"][case] = {"y": errs}, stats


def _round_trip(bench: Bench, square: Row, source: Any, layout: Layout) -> list[Any]:
    """A fresh candidate loaded from torch.nn's ``source``, and torch.nn loaded back from it."""
    device, param_dtype = bench.torch_device, square.param_dtype
    cand = measure.build(bench.cand, square.canonical, device, param_dtype)
    own = cand.state_dict()
    saved = {k: v.detach().clone() for k, v in source.state_dict().items()}  # source is shared
    own.update(lifecycle.to_module(saved, layout.pairs))
    cand.load_state_dict(own, strict=True)
    back = measure.build(bench.baseline, square.canonical, device, param_dtype)
    back.load_state_dict(lifecycle.to_torch(cand.state_dict(), layout.pairs), strict=True)
    return [cand, back]


def _run(
    bench: Bench, setup: Row, name: str, p: Prepared, candidate: tuple, row: MeasurementRow
) -> None:
    """One later case with a forward and backward, into ``row`` (its flags too)."""
    from kernel_probe.probe.correctness import _measure_case  # a cycle: correctness imports inuse

    case = onetensor.Case(name, [p.x])
    errs, stats, _ = _measure_case(bench, setup, case, (p,), candidate, row["flags"])
    if name in lifecycle.VIEWS:  # a strided row reduced in another order: its mean shifts by a
        # rounding shared by the row, which the bias's independent-noise model does not cover
        stats = {t: {k: v for k, v in s.items() if k != "bias"} for t, s in stats.items()}  # type: ignore[misc]
    row["cases"][name], row["stats"][name] = errs, stats
