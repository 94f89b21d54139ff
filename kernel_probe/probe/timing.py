"""Timing, run inside the worker: forward+backward of one candidate at the model's shapes.

GPU: CUDA events around each repetition, after warm-up; inputs rotate through enough buffers to
exceed twice the L2 cache, so the figure is not an L2-resident fantasy. CPU: perf_counter. The first
call (Triton JIT, torch.compile) is timed apart and reported as ``compile_s``, never mixed into the
median. The module is timed with the non-trivial parameters of the correctness checks, and its last
warm-up call is checked at that very shape and regime against float64 (``atshape``, the row's
``check``): a kernel right at 37 rows and wrong at the model's size is caught where it is timed, for
no extra full-size pass. Bandwidth is the bytes the op must move divided by the time, and is
reported against a device-to-device copy measured in the same process, so the ratio survives a noisy
machine.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kernel_lock.slots import torch_device
from kernel_probe.candidates import Candidate, canonical_for, default_for
from kernel_probe.isolation.protocol import ShapeCheck, TimeReply, TimingProgressMessage, TimingRow
from kernel_probe.probe import repetitions
from kernel_probe.probe.blasrun import BlasNotOffered, baseline_blas, blas_library
from kernel_probe.probe.layout import discover, shapes
from kernel_probe.probe.measure import (
    build,
    dtype_name,
    first_line,
    load_parameters,
    parameters_for,
    torch_dtype,
)
from kernel_probe.shapes import parse_shape

# check: run the check at the model's shape after timing each shape (atshape); off only to measure
# its cost. mode (kernel_probe.probe.repetitions): "fixed" (``reps`` calls, more until
# ``min_seconds``, at most ``max_reps``), "sole" (one measured call, the check at the shape),
# "adaptive" (the default of the slot without ``against``: ``reps`` calls; a candidate with
# ``against``, the default's samples per shape: until the sequential test decides it); adaptive
# stops at ``budget_s`` (seconds, all shapes together)
DEFAULT_OPTIONS: dict[str, Any] = {
    "warmup": 3,
    "reps": 20,
    "min_seconds": 0.2,
    "max_reps": 200,
    "check": True,
    "mode": "fixed",
    "against": None,
    "budget_s": None,
}
MODES = ("fixed", "sole", "adaptive")
TIMED_INPUT_SEED = (
    0  # the seed of the timed inputs (and so of the data the check at the shape sees)
)


def bytes_moved(semantics: str, rows: int, hidden: int, out: int, dtype_bytes: int) -> int:
    """Minimum bytes for forward+backward: norms read x, write y; read x, dy, write dx (5 N D)."""
    if semantics == "linear":
        return dtype_bytes * (2 * rows * hidden + 2 * rows * out + 3 * hidden * out)
    return 5 * rows * hidden * dtype_bytes


def flops(semantics: str, rows: int, hidden: int, out: int) -> int:
    """Floating-point operations of one forward and backward at this shape (a Linear's; 0 for a
    norm)."""
    return 6 * rows * hidden * out if semantics == "linear" else 0


class _Clock:
    def __init__(self, device: str):
        self.cuda = device in ("cuda", "rocm")

    def time(self, fn) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def repeat(
    clock: _Clock,
    fn,
    opts: Mapping[str, Any],
    tick: Callable[[str, int, int], None] | None = None,
    checked: Callable[[], None] | None = None,
    against: list[float] | None = None,
    deadline: float | None = None,
) -> tuple[list[float], str]:
    """Warm-up calls, then timed repetitions; ``tick(phase, done, total)`` after each call.
    ``checked``, when given, is the last warm-up call (a call checked against float64: the module is
    warm by then, and the check costs no extra full-size pass); without warm-up calls it runs after
    the repetitions. Returns the samples and how their number was decided (the lock's ``timed``): in
    the adaptive mode ``against`` (the default's samples at this shape) makes the repetitions
    sequential, and ``deadline`` (a ``perf_counter`` time) ends them once at least one call was
    timed."""
    warmup, reps, max_reps = int(opts["warmup"]), int(opts["reps"]), int(opts["max_reps"])
    adaptive = opts.get("mode") == "adaptive"
    for i in range(warmup):
        (checked if checked is not None and i == warmup - 1 else fn)()
        if tick:
            tick("warm-up", i + 1, warmup)
    clock.sync()
    samples: list[float] = []
    t_end = time.perf_counter() + float(opts["min_seconds"])
    how = "fixed"
    if adaptive:
        how = "baseline" if against is None else "max-reps"
        max_reps = max_reps if against is None else min(max_reps, repetitions.MAX_FACTOR * reps)
    while True:
        samples.append(clock.time(fn))
        if tick:
            tick(
                "rep",
                len(samples),
                max(reps, len(samples)) if not adaptive or against is None else max_reps,
            )
        n = len(samples)
        if not adaptive:
            if n >= reps and (time.perf_counter() >= t_end or n >= max_reps):
                break
            continue
        if against is not None and n == 1 and repetitions.far_slower(samples[0], against):
            how = "far slower"
            break
        if against is not None and repetitions.decided(samples, against):
            how = "decided"
            break
        if against is None and n >= reps and (time.perf_counter() >= t_end or n >= max_reps):
            break
        if n >= max_reps:
            break
        if deadline is not None and time.perf_counter() >= deadline:
            how = "budget"
            break
    if checked is not None and warmup == 0:
        checked()
    return samples, how


def timed_calls(
    clock: _Clock,
    step: Callable[[], None],
    opts: Mapping[str, Any],
    tick: Callable[[str, int, int], None] | None,
    shape: str,
    row: TimingRow,
) -> list[float]:
    """The Attention and Activation slots' calls at one shape: the first call (``compile_s``), then
    one measured call for a sole candidate, else ``repeat``'s repetitions (adaptive against the
    default's samples at ``shape``); the row's median, spread, repetitions and how their number was
    decided are filled in. Returns the samples."""
    t0 = time.perf_counter()
    step()
    clock.sync()
    row["compile_s"] = time.perf_counter() - t0
    if tick is not None:
        tick("first call", 1, 1)
    if opts.get("mode") == "sole":  # the slot's one accepted candidate: one measured call
        samples, how = [clock.time(step)], "sole candidate"
        if tick is not None:
            tick("rep", 1, 1)
    else:
        against = (opts.get("against") or {}).get(shape) if opts.get("mode") == "adaptive" else None
        samples, how = repeat(clock, step, opts, tick, against=against)
    row["median_ms"] = 1e3 * sorted(samples)[len(samples) // 2]
    row["spread"] = _spread(samples)
    row["reps"] = len(samples)
    row["timed"], row["samples"] = how, samples
    return samples


def _spread(samples: list[float]) -> float:
    """Relative noise: interquartile range / median."""
    return repetitions.spread(samples)


def _buffers(n: int, make) -> list:
    return [make() for _ in range(n)]


def _l2_bytes(device: str) -> int:
    if device in ("cuda", "rocm"):
        try:
            return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0))
        except Exception:
            return 0
    return 0


def copy_bandwidth(device: str, nbytes: int, opts: Mapping[str, Any]) -> float:
    """GB/s of a device-to-device copy of ``nbytes`` (read + write counted)."""
    tdev = torch_device(device)
    n = max(nbytes // 4, 1 << 20)
    src = torch.empty(n, dtype=torch.float32, device=tdev).uniform_()
    dst = torch.empty_like(src)
    samples, _ = repeat(_Clock(device), lambda: dst.copy_(src), {**opts, "mode": "fixed"})
    return 2 * n * 4 / statistics.median(samples) / 1e9


def _time_shape(
    cand: Candidate,
    slot: str,
    device: str,
    shape: str,
    dtype,
    mixed: bool,
    opts: Mapping[str, Any],
    clock: _Clock,
    copy_cache: dict[int, float],
    tick: Callable[[str, int, int], None] | None = None,
    deadline: float | None = None,
) -> TimingRow:
    """Forward+backward timing of one candidate at one shape; its buffers are freed on return."""
    tdev = torch_device(device)
    param_dtype = torch.float32 if mixed else dtype
    rows, hidden, out = parse_shape(shape)
    out = out or hidden
    canonical = canonical_for(
        slot, hidden=hidden, out_features=out, device=tdev, param_dtype=dtype_name(param_dtype)
    )
    module = build(cand, canonical, tdev, param_dtype)
    check = (
        _CheckSetup(cand, slot, module, canonical, tdev, param_dtype)
        if opts.get("check", True)
        else None
    )
    width_out = out if cand.semantics == "linear" else hidden
    per_input = rows * hidden * dtype.itemsize
    n_buf = 1
    l2 = _l2_bytes(device)
    if l2 and per_input < 2 * l2:  # rotate inputs so that together they exceed twice the L2 cache
        n_buf = min(8, 2 * l2 // max(per_input, 1) + 1)
    # the timed inputs, which the check at the shape also reads, come from their own seeded
    # generator: the same data on every rank and in every run, whatever the worker computed before
    gen = torch.Generator(device=tdev).manual_seed(TIMED_INPUT_SEED)
    xs = _buffers(
        n_buf,
        lambda: torch.randn(rows, hidden, device=tdev, dtype=dtype, generator=gen).requires_grad_(
            True
        ),
    )
    gy = torch.randn(rows, width_out, device=tdev, dtype=dtype, generator=gen)
    state = {"i": 0}

    def step():
        x = xs[state["i"] % n_buf]
        state["i"] += 1
        x.grad = None
        if mixed:
            with torch.autocast(device_type=tdev, dtype=dtype):
                y = module(x)
        else:
            y = module(x)
        y.backward(gy)

    row: TimingRow = {}
    checked: Callable[[], None] | None = None
    timed: list[float] = []  # the sole candidate's one call, timed inside its check
    if check is not None:
        setup = check

        def checked_call(timer: Callable[[Callable[[], None]], object] | None = None) -> None:
            x = xs[state["i"] % n_buf]
            state["i"] += 1
            row["check"] = setup.run(x, width_out, str(dtype).replace("torch.", ""), mixed, timer)

        checked = checked_call
    if opts.get("mode") == "sole":
        # the first call is the check at this shape (compile_s); the one measured call is a second
        # one, unless the first took so long that its one-time costs cannot matter (bf16 emulated on
        # a CPU)
        if checked is not None:
            checked_call(lambda fn: timed.append(clock.time(fn)))
        else:
            timed.append(clock.time(step))
        row["compile_s"] = round(timed[0], 4)
        if tick:
            tick("first call", 1, 1)
        if timed[0] < repetitions.SOLE_SECOND_CALL_BELOW_S:
            timed[0] = clock.time(step)
            if tick:
                tick("rep", 1, 1)
        samples, how = timed, "sole candidate"
    else:
        t0 = time.perf_counter()
        step()
        clock.sync()
        row["compile_s"] = round(time.perf_counter() - t0, 4)
        if tick:
            tick("first call", 1, 1)
        against = (opts.get("against") or {}).get(shape) if opts.get("mode") == "adaptive" else None
        samples, how = repeat(clock, step, opts, tick, checked, against, deadline)
    median = statistics.median(samples)
    nbytes = bytes_moved(cand.semantics, rows, hidden, out, dtype.itemsize)
    row["median_ms"], row["spread"] = median * 1000, _spread(samples)
    row["reps"], row["gbps"] = len(samples), nbytes / median / 1e9
    row["timed"], row["samples"] = how, samples
    fl = flops(cand.semantics, rows, hidden, out)
    if fl:
        row["tflops"] = fl / median / 1e12
    if device == "cpu":
        return (
            row  # a CPU copy of a cache-sized buffer is no bandwidth ceiling: no "% of copy" on CPU
        )
    key = nbytes // 5
    if key not in copy_cache:
        copy_cache[key] = copy_bandwidth(device, key * 2, opts)
    row["copy_gbps"] = copy_cache[key]
    row["copy_percent"] = 100.0 * row["gbps"] / copy_cache[key]
    return row


class _CheckSetup:
    """What the check at a timed shape needs, prepared before the timing: the candidate and torch.nn
    loaded with the same non-trivial parameters (those of the correctness checks), through the
    candidate's parameter layout."""

    def __init__(
        self, cand: Candidate, slot: str, module, canonical, device: str, param_dtype
    ) -> None:
        self.semantics, self.device, self.module = cand.semantics, device, module
        self.baseline_library = baseline_blas(cand, device)
        self.baseline = build(default_for(slot), canonical, device, param_dtype)
        base_shapes = shapes(self.baseline.state_dict())
        self.base_layout = discover(base_shapes, base_shapes)
        if cand.semantics == "linear" and canonical["out_features"] == canonical["in_features"]:
            # a square weight cannot tell (out, in) from (in, out): the layout is read from a
            # non-square build (the same parameter names and orientation), as the correctness checks
            # read it
            wide = {**canonical, "out_features": canonical["in_features"] + 3}
            self.layout = discover(
                shapes(build(cand, wide, device, param_dtype).state_dict()),
                shapes(build(default_for(slot), wide, device, param_dtype).state_dict()),
            )
        else:
            self.layout = discover(shapes(module.state_dict()), base_shapes)
        self.gen = torch.Generator().manual_seed(0)
        bias = bool(canonical.get("bias", False)) if cand.semantics != "rms_norm" else False
        params = parameters_for(
            cand.semantics, canonical["hidden"], canonical["out_features"], bias, self.gen
        )
        self.params64 = {
            k: (v.to(torch.float64).to(device) if v is not None else None)
            for k, v in params.items()
        }
        self.eps = float(canonical.get("eps", 0.0) or 0.0)
        if self.layout.ok:
            load_parameters(module, params, self.layout)
            load_parameters(self.baseline, params, self.base_layout)

    def run(
        self,
        x,
        width: int,
        dtype_name: str,
        mixed: bool,
        timer: Callable[[Callable[[], None]], object] | None = None,
    ) -> ShapeCheck:
        from kernel_probe.probe.atshape import check_at_shape

        rows = int(x.shape[0])
        # only accepted candidates are timed, so this is a candidate offered directly
        if not self.layout.ok:
            return ShapeCheck(
                rows=rows,
                error=f"its state dict does not map onto torch.nn's: {self.layout.problem()}",
            )
        try:
            return check_at_shape(
                module=self.module,
                layout=self.layout,
                baseline=self.baseline,
                base_layout=self.base_layout,
                semantics=self.semantics,
                x=x,
                width=width,
                params64=self.params64,
                eps=self.eps,
                dtype_name=dtype_name,
                autocast=(self.device, torch_dtype(dtype_name)) if mixed else None,
                gen=self.gen,
                baseline_library=self.baseline_library,
                timer=timer,
            )
        # out of memory for the extra output and gradients, a kernel that raises
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return ShapeCheck(rows=rows, error=f"{type(exc).__name__}: {first}"[:400])


def progress_message(
    shape: str, index: int, of: int, phase: str, done: int, total: int, seconds: float
) -> TimingProgressMessage:
    """The progress message a timing worker sends before its reply: shape ``index`` of ``of``,
    ``phase`` (first call, warm-up, rep) ``done`` of ``total``, ``seconds`` spent on this shape."""
    return TimingProgressMessage(
        shape=shape,
        index=index,
        of=of,
        phase=phase,
        done=done,
        total=total,
        seconds=round(seconds, 3),
    )


def ticker(
    progress: Callable[[TimingProgressMessage], None] | None, shape: str, index: int, of: int
) -> Callable[[str, int, int], None] | None:
    """``tick(phase, done, total)`` for one shape's timing, reporting ``progress_message``s with
    the time since it was made; None where nobody listens. Every slot's timing uses it."""
    if progress is None:
        return None
    started = time.perf_counter()

    def tick(phase: str, done: int, total: int) -> None:
        progress(
            progress_message(shape, index, of, phase, done, total, time.perf_counter() - started)
        )

    return tick


def step_rows(
    cand_id: str,
    device: str,
    shapes: Sequence[str],
    dtype_name: str,
    options: Mapping[str, Any],
    progress: Callable[[TimingProgressMessage], None] | None,
    measure: Callable[[str, Callable[[Callable[[], None]], TimingRow]], None],
) -> TimeReply:
    """One row per shape for a slot that times one forward+backward step (Activation, Attention):
    ``measure(shape, timed)`` builds the shape's step and calls ``timed(step)``, which times it
    (``timed_calls``: this module's clock and repetition rule, ``progress`` after each call) and
    returns the row for the figures ``measure`` adds; whatever it raises is the row's error."""
    opts = {**DEFAULT_OPTIONS, **options}
    clock = _Clock(device)
    rows: list[TimingRow] = []
    for index, text in enumerate(shapes):
        row: TimingRow = {
            "implementation": cand_id,
            "shape": text,
            "dtype": dtype_name,
            "regime": "true",
        }
        tick = ticker(progress, text, index, len(shapes))

        def timed(
            step: Callable[[], None],
            row: TimingRow = row,
            tick: Callable[[str, int, int], None] | None = tick,
            text: str = text,
        ) -> TimingRow:
            timed_calls(clock, step, opts, tick, text, row)
            return row

        try:
            measure(text, timed)
        except Exception as exc:  # OOM at the model's shape, a kernel that refuses the size, ...
            row["error"] = first_line(exc, 400)
        rows.append(row)
    return TimeReply(candidate=cand_id, device=device, rows=rows)


def time_candidate(
    cand: Candidate,
    slot: str,
    device: str,
    shapes: list[str],
    dtype_name: str,
    regime: str,
    options: Mapping[str, Any] | None = None,
    progress: Callable[[TimingProgressMessage], None] | None = None,
) -> TimeReply:
    """Rows per shape; ``progress`` receives a message after each call (see
    ``progress_message``)."""
    opts = {**DEFAULT_OPTIONS, **(options or {})}
    if opts["mode"] not in MODES:
        raise ValueError(f"timing mode {opts['mode']!r}: expected one of {', '.join(MODES)}")
    clock = _Clock(device)
    budget = opts.get("budget_s")
    started = time.perf_counter()
    out_rows: list[TimingRow] = []
    copy_cache: dict[int, float] = {}
    with contextlib.ExitStack() as stack:
        try:
            library = stack.enter_context(blas_library(cand, device))[0]
        except BlasNotOffered as exc:
            rows = [
                TimingRow(
                    implementation=cand.id, shape=s, dtype=dtype_name, regime=regime, error=str(exc)
                )
                for s in shapes
            ]
            return TimeReply(candidate=cand.id, device=device, rows=rows)
        for index, shape in enumerate(shapes):
            # the budget's share of this shape: what is left, split over the shapes still to time
            deadline = None
            if budget is not None:
                left = started + float(budget) - time.perf_counter()
                deadline = time.perf_counter() + left / (len(shapes) - index)
            out_rows.append(
                _timed_shape(
                    cand,
                    slot,
                    device,
                    shape,
                    index,
                    shapes,
                    dtype_name,
                    regime,
                    opts,
                    clock,
                    copy_cache,
                    progress,
                    deadline,
                )
            )
            if library:
                out_rows[-1]["blas"] = library
    return TimeReply(candidate=cand.id, device=device, rows=out_rows)


def _timed_shape(
    cand: Candidate,
    slot: str,
    device: str,
    shape: str,
    index: int,
    shapes: list[str],
    dtype_name: str,
    regime: str,
    opts: Mapping[str, Any],
    clock: _Clock,
    copy_cache: dict[int, float],
    progress: Callable[[TimingProgressMessage], None] | None,
    deadline: float | None = None,
) -> TimingRow:
    """One shape's row: the figures, or the error that stopped it."""
    tdev = torch_device(device)
    row: TimingRow = {
        "implementation": cand.id,
        "shape": shape,
        "dtype": dtype_name,
        "regime": regime,
    }
    tick = ticker(progress, shape, index, len(shapes))

    try:
        row.update(
            _time_shape(
                cand,
                slot,
                device,
                shape,
                torch_dtype(dtype_name),
                regime == "mixed",
                opts,
                clock,
                copy_cache,
                tick,
                deadline,
            )
        )
    except Exception as exc:  # OOM at the model's shape, a kernel that refuses the size, ...
        row["error"] = first_line(exc, 400)
    finally:
        if tdev == "cuda":
            torch.cuda.empty_cache()  # the shape's buffers died with _time_shape's frame

    return row
