"""Timing, in the worker: forward+backward of one candidate at the model's shapes, by CUDA events
on a GPU and perf_counter on a CPU, the first call timed apart (``compile_s``). ``time_candidate``
(the norms', Linear's) rotates inputs past twice the L2 cache, checks at the shape (``atshape``) and
reports bandwidth against a device-to-device copy."""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kernel_lock.slots import torch_device
from kernel_probe.candidates import Candidate, canonical_for
from kernel_probe.isolation.protocol import TimeReply, TimingProgressMessage, TimingRow
from kernel_probe.probe import atshape, measure, onetensor, repetitions
from kernel_probe.shapes import parse_shape

# check: the check at each timed shape (atshape; off only to measure its cost, and in the later
# rounds of a paired timing). first: the untimed first call (``compile_s``; off in a paired
# timing's later blocks: the worker made it in the first, so JIT and caches are warm). mode:
# "fixed" (``reps`` calls, more until ``min_seconds``, at most ``max_reps``: one block of a round,
# repetitions.py), "sole" (one measured call)
DEFAULT_OPTIONS: dict[str, Any] = {"warmup": 3, "reps": 20, "min_seconds": 0.2, "max_reps": 200}
DEFAULT_OPTIONS |= {"check": True, "first": True, "mode": "fixed"}
MODES = ("fixed", "sole")
TIMED_INPUT_SEED = 0  # the timed inputs' seed (and so the data the check at the shape sees)
Tick = Callable[[str, int, int], None]


def bytes_moved(semantics: str, rows: int, hidden: int, out: int, dtype_bytes: int) -> int:
    """Minimum bytes for forward+backward: norms read x, write y; read x, dy, write dx (5 N D)."""
    if semantics == "linear":
        return dtype_bytes * (2 * rows * hidden + 2 * rows * out + 3 * hidden * out)
    return 5 * rows * hidden * dtype_bytes


def flops(semantics: str, rows: int, hidden: int, out: int) -> int:
    """Floating-point operations of one forward and backward at this shape (0 for a norm)."""
    return 6 * rows * hidden * out if semantics == "linear" else 0


class _Clock:
    def __init__(self, device: str):
        self.cuda = device in ("cuda", "rocm")

    def time(self, fn: Callable[[], object]) -> float:
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
    fn: Callable[[], object],
    opts: Mapping[str, Any],
    tick: Tick | None = None,
    checked: Callable[[], None] | None = None,
) -> tuple[list[float], str]:
    """Warm-up calls, then timed repetitions; ``tick(phase, done, total)`` after each call.
    ``checked``: the last warm-up call (none: after the repetitions). Returns the samples and how
    their number was decided (the lock's ``timed``)."""
    warmup, reps, max_reps = int(opts["warmup"]), int(opts["reps"]), int(opts["max_reps"])
    for i in range(warmup):
        (checked if checked is not None and i == warmup - 1 else fn)()
        if tick:
            tick("warm-up", i + 1, warmup)
    clock.sync()
    samples: list[float] = []
    t_end = time.perf_counter() + float(opts["min_seconds"])
    while True:
        samples.append(clock.time(fn))
        n = len(samples)
        if tick:
            tick("rep", n, max(reps, n))
        if n >= reps and (time.perf_counter() >= t_end or n >= max_reps):
            break
    if checked is not None and warmup == 0:
        checked()
    return samples, "fixed"


def timed_calls(
    clock: _Clock,
    opts: Mapping[str, Any],
    tick: Tick | None,
    row: TimingRow,
    mixed: tuple[str, Any] | None,
    bare: Callable[[], None],
) -> TimingRow:
    """A step slot's calls at ``row``'s shape (first, then sole or ``repeat``'s), into the row;
    ``mixed``: each under autocast to (device type, dtype)."""

    def step() -> None:
        with measure.autocasting(mixed):
            bare()

    if opts["first"]:
        row["compile_s"] = _first_call(clock, step, tick)
    if opts.get("mode") == "sole":  # the slot's one accepted candidate: one measured call
        samples, how = [clock.time(step)], "sole candidate"
        _tick(tick, "rep")
    else:
        samples, how = repeat(clock, step, opts, tick)
    row["median_ms"] = 1e3 * sorted(samples)[len(samples) // 2]
    row["spread"] = repetitions.spread(samples)
    row["reps"] = len(samples)
    row["timed"], row["samples"] = how, samples
    return row


def _first_call(clock: _Clock, step: Callable[[], None], tick: Tick | None) -> float:
    """The seconds of the first call (compiling, JIT), ticked."""
    t0 = time.perf_counter()
    step()
    clock.sync()
    _tick(tick, "first call")
    return time.perf_counter() - t0


def _tick(tick: Tick | None, phase: str) -> None:
    if tick is not None:
        tick(phase, 1, 1)


def progress_message(
    shape: str, index: int, of: int, phase: str, done: int, total: int, seconds: float
) -> TimingProgressMessage:
    """A timing worker's progress: shape ``index`` of ``of``, ``phase`` ``done`` of ``total``."""
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
) -> Tick | None:
    """``tick(phase, done, total)`` sending one shape's progress; None: nobody listens."""
    if progress is None:
        return None
    started = time.perf_counter()

    def tick(phase: str, done: int, total: int) -> None:
        seconds = time.perf_counter() - started
        progress(progress_message(shape, index, of, phase, done, total, seconds))

    return tick


def step_rows(
    cand_id: str,
    device: str,
    shapes: Sequence[str],
    dtype_name: str,
    options: Mapping[str, Any],
    progress: Callable[[TimingProgressMessage], None] | None,
    run_shape: Callable[[str, Callable[[Callable[[], None]], TimingRow]], None],
    regime: str = "true",
) -> TimeReply:
    """One row per shape for a slot timing one fwd+bwd step: ``run_shape(shape, timed)`` builds the
    step and calls ``timed(step)`` (``timed_calls``), which returns the row for its own figures;
    what it raises is the row's error. The inputs it draws from torch's generator are seeded
    (``TIMED_INPUT_SEED``: every candidate, every round the same); ``regime`` "mixed": each call
    runs under autocast, as a mixed-precision model's does."""
    opts = {**DEFAULT_OPTIONS, **options}
    clock = _Clock(device)
    mixed = (torch_device(device), measure.torch_dtype(dtype_name)) if regime == "mixed" else None
    rows: list[TimingRow] = []
    for index, text in enumerate(shapes):
        row = TimingRow(implementation=cand_id, shape=text, dtype=dtype_name, regime=regime)
        tick = ticker(progress, text, index, len(shapes))
        cuda = [torch.cuda.current_device()] if torch_device(device) == "cuda" else []
        try:
            with torch.random.fork_rng(devices=cuda):
                torch.manual_seed(TIMED_INPUT_SEED)
                run_shape(text, functools.partial(timed_calls, clock, opts, tick, row, mixed))
        except Exception as exc:  # OOM at the model's shape, a kernel that refuses the size, ...
            row["error"] = measure.first_line(exc, 400)
        rows.append(row)
    return TimeReply(candidate=cand_id, device=device, rows=rows)


# ---- the norms' and Linear's timing ------------------------------------------------------------
def time_candidate(
    cand: Candidate,
    slot: str,
    device: str,
    shapes: list[str],
    dtype_name: str,
    regime: str,
    options: Mapping[str, Any] | None = None,
    progress: Callable[[TimingProgressMessage], None] | None = None,
    canonical: Mapping[str, Any] | None = None,
) -> TimeReply:
    """Rows per shape; ``progress`` receives a message after each call (``progress_message``);
    ``canonical``: the model's values of the slot's semantics (a Linear without bias)."""
    opts = {**DEFAULT_OPTIONS, **(options or {})}
    if opts["mode"] not in MODES:
        raise ValueError(f"timing mode {opts['mode']!r}: expected one of {', '.join(MODES)}")
    dtype = measure.torch_dtype(dtype_name)
    run = _Run(cand, slot, device, dtype, regime == "mixed", opts, _Clock(device), canonical)
    rows: list[TimingRow] = []
    with contextlib.ExitStack() as stack:
        try:
            library = stack.enter_context(onetensor.blas_library(cand, device))[0]
        except onetensor.BlasNotOffered as exc:
            rows = [{**_where(cand, s, dtype_name, regime), "error": str(exc)} for s in shapes]
            return TimeReply(candidate=cand.id, device=device, rows=rows)
        for index, shape in enumerate(shapes):
            row = _where(cand, shape, dtype_name, regime)
            tick = ticker(progress, shape, index, len(shapes))
            try:
                row.update(_time_shape(run, shape, tick))
            except Exception as exc:  # OOM at the model's shape, a kernel refusing the size, ...
                row["error"] = measure.first_line(exc, 400)
            finally:
                if torch_device(device) == "cuda":
                    torch.cuda.empty_cache()  # the shape's buffers died with _time_shape's frame
            if library:
                row["blas"] = library
            rows.append(row)
    return TimeReply(candidate=cand.id, device=device, rows=rows)


def _where(cand: Candidate, shape: str, dtype: str, regime: str) -> TimingRow:
    return TimingRow(implementation=cand.id, shape=shape, dtype=dtype, regime=regime)


@dataclass
class _Run:
    """One candidate's timing: what every shape's is measured with."""

    cand: Candidate
    slot: str
    device: str
    dtype: torch.dtype
    mixed: bool
    opts: Mapping[str, Any]
    clock: _Clock
    canonical: Mapping[str, Any] | None = None  # the model's values of the slot's semantics
    copy_gbps: dict[int, float] = field(default_factory=dict)  # by bytes: a copy's bandwidth


def _time_shape(run: _Run, shape: str, tick: Tick | None) -> TimingRow:
    """Forward+backward timing of one candidate at one shape; its buffers are freed on return."""
    s = _Shape(run, shape)
    row: TimingRow = {}
    clock, opts = run.clock, run.opts
    checked = None
    if s.check is not None:
        check = s.check

        def checked(timer: Callable[[Callable[[], None]], object] | None = None) -> None:
            row["check"] = check.run(
                s.next(), s.width, measure.dtype_name(run.dtype), run.mixed, timer
            )

    if opts.get("mode") == "sole":
        # the first call is the check at this shape (compile_s); the measured one a second, unless
        # the first took so long that one-time costs cannot matter (bf16 emulated on a CPU)
        timed: list[float] = []  # the one call, timed inside its check
        if checked is not None:
            checked(lambda fn: timed.append(clock.time(fn)))
        else:
            timed.append(clock.time(s.step))
        row["compile_s"] = round(timed[0], 4)
        _tick(tick, "first call")
        if timed[0] < repetitions.SOLE_SECOND_CALL_BELOW_S:
            timed[0] = clock.time(s.step)
            _tick(tick, "rep")
        samples, how = timed, "sole candidate"
    else:
        if opts["first"]:
            row["compile_s"] = round(_first_call(clock, s.step, tick), 4)
        samples, how = repeat(clock, s.step, opts, tick, checked)
    return _figures(run, s, row, samples, how)


def _figures(run: _Run, s: _Shape, row: TimingRow, samples: list[float], how: str) -> TimingRow:
    """The row's median, spread, bandwidth (against a copy's, on a GPU) and FLOP rate."""
    median = statistics.median(samples)
    semantics = run.cand.semantics
    nbytes = bytes_moved(semantics, s.rows, s.hidden, s.out, run.dtype.itemsize)
    row["median_ms"], row["spread"] = median * 1000, repetitions.spread(samples)
    row["reps"], row["gbps"] = len(samples), nbytes / median / 1e9
    row["timed"], row["samples"] = how, samples
    fl = flops(semantics, s.rows, s.hidden, s.out)
    if fl:
        row["tflops"] = fl / median / 1e12
    if run.device == "cpu":  # a CPU copy of a cache-sized buffer is no bandwidth ceiling
        return row
    key = nbytes // 5
    if key not in run.copy_gbps:
        run.copy_gbps[key] = copy_bandwidth(run.device, key * 2, run.opts)
    row["copy_gbps"] = run.copy_gbps[key]
    row["copy_percent"] = 100.0 * row["gbps"] / run.copy_gbps[key]
    return row


class _Shape:
    """One shape's module (with the checks' parameters), timed inputs and check set-up."""

    def __init__(self, run: _Run, shape: str) -> None:
        cand, dtype = run.cand, run.dtype
        tdev = self.tdev = torch_device(run.device)
        param_dtype = torch.float32 if run.mixed else dtype
        self.rows, self.hidden, out = parse_shape(shape)
        self.out = out = out or self.hidden
        canonical = canonical_for(
            run.slot,
            hidden=self.hidden,
            out_features=out,
            device=tdev,
            param_dtype=measure.dtype_name(param_dtype),
            overrides=run.canonical,
        )
        self.module = measure.build(cand, canonical, tdev, param_dtype)
        self.check = None
        if run.opts.get("check", True):
            self.check = atshape.Setup(cand, run.slot, self.module, canonical, tdev, param_dtype)
        self.width = out if cand.semantics == "linear" else self.hidden
        per_input = self.rows * self.hidden * dtype.itemsize
        self.n_buf = 1
        l2 = 0
        if run.clock.cuda:
            with contextlib.suppress(Exception):  # no properties to read: no rotation
                l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0))
        if l2 and per_input < 2 * l2:  # rotate inputs so that together they exceed twice the L2
            self.n_buf = min(8, 2 * l2 // max(per_input, 1) + 1)
        # the timed inputs, which the check at the shape also reads, come from their own seeded
        # generator: the same data on every rank and in every run, whatever ran before
        gen = torch.Generator(device=tdev).manual_seed(TIMED_INPUT_SEED)
        randn = functools.partial(torch.randn, device=tdev, dtype=dtype, generator=gen)
        self.xs = [randn(self.rows, self.hidden).requires_grad_(True) for _ in range(self.n_buf)]
        self.gy = randn(self.rows, self.width)
        self.autocast = (tdev, dtype) if run.mixed else None
        self.calls = 0

    def next(self) -> Any:
        """The next of the rotating inputs."""
        x = self.xs[self.calls % self.n_buf]
        self.calls += 1
        return x

    def step(self) -> None:
        """One timed forward and backward."""
        x = self.next()
        x.grad = None
        with measure.autocasting(self.autocast):
            y = self.module(x)
        y.backward(self.gy)


def copy_bandwidth(device: str, nbytes: int, opts: Mapping[str, Any]) -> float:
    """GB/s of a device-to-device copy of ``nbytes`` (read + write counted)."""
    n = max(nbytes // 4, 1 << 20)
    src = torch.empty(n, dtype=torch.float32, device=torch_device(device)).uniform_()
    dst = torch.empty_like(src)
    samples, _ = repeat(_Clock(device), lambda: dst.copy_(src), {**opts, "mode": "fixed"})
    return 2 * n * 4 / statistics.median(samples) / 1e9
