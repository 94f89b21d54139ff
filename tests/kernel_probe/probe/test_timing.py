"""kernel_probe.probe.timing's parts that CPU tests can pin without trusting a clock: the bytes and
flops a row is divided by, the statistics a row reports and how they relate, shapes (2-D, 3-D, bad),
progress messages.

The public names used: ``bytes_moved``, ``flops``, ``progress_message``, ``time_candidate``,
``DEFAULT_OPTIONS``.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from kernel_probe.candidates import default_for
from kernel_probe.probe.timing import (
    DEFAULT_OPTIONS,
    MODES,
    bytes_moved,
    flops,
    progress_message,
    time_candidate,
)

# tiny and exact: two repetitions, one warm-up call, no minimum time, no float64 check
FAST = {"reps": 2, "warmup": 1, "min_seconds": 0.0, "check": False}


# ---- what a row is divided by --------------------------------------------------------------------
@pytest.mark.parametrize(
    "semantics, rows, hidden, out, dtype_bytes, expected",
    [
        # a norm reads x and writes y forward, reads x and dy and writes dx backward: 5 N D elements
        ("layer_norm", 2048, 1024, 1024, 2, 5 * 2048 * 1024 * 2),
        ("rms_norm", 2048, 1024, 1024, 2, 5 * 2048 * 1024 * 2),
        ("layer_norm", 37, 1000, 0, 4, 5 * 37 * 1000 * 4),  # out is ignored for a norm
        # a Linear: x and dx (2 N H), y and dy (2 N O), W read twice and dW written (3 H O)
        ("linear", 8, 4, 2, 4, 4 * (2 * 8 * 4 + 2 * 8 * 2 + 3 * 4 * 2)),
        ("linear", 1, 1, 1, 1, 7),
    ],
)
def test_bytes_moved(semantics, rows, hidden, out, dtype_bytes, expected):
    assert bytes_moved(semantics, rows, hidden, out, dtype_bytes) == expected


def test_bytes_moved_scales_with_each_dimension():
    base = bytes_moved("linear", 64, 32, 16, 2)
    assert bytes_moved("linear", 64, 32, 16, 4) == 2 * base  # the dtype's bytes
    assert bytes_moved("linear", 64, 32, 32, 2) > base  # more output features, more bytes
    assert bytes_moved("layer_norm", 128, 32, 0, 2) == 2 * bytes_moved("layer_norm", 64, 32, 0, 2)


@pytest.mark.parametrize(
    "semantics, rows, hidden, out, expected",
    [
        ("linear", 2048, 1024, 4096, 6 * 2048 * 1024 * 4096),  # forward 2 N H O, backward 4 N H O
        ("linear", 1, 1, 1, 6),
        ("layer_norm", 2048, 1024, 1024, 0),  # a norm is bandwidth, not flops
        ("rms_norm", 2048, 1024, 1024, 0),
    ],
)
def test_flops(semantics, rows, hidden, out, expected):
    assert flops(semantics, rows, hidden, out) == expected


def test_default_options_time_enough_and_check_at_the_shape():
    assert set(DEFAULT_OPTIONS) == {
        "warmup",
        "reps",
        "min_seconds",
        "max_reps",
        "check",
        "first",
        "mode",
    }
    assert (
        1 <= DEFAULT_OPTIONS["reps"] <= DEFAULT_OPTIONS["max_reps"]
        and DEFAULT_OPTIONS["warmup"] >= 1
    )
    assert DEFAULT_OPTIONS["check"] is True and DEFAULT_OPTIONS["first"] is True
    # what a caller asks is done
    assert DEFAULT_OPTIONS["mode"] == "fixed" and DEFAULT_OPTIONS["mode"] in MODES


# ---- how many calls: fixed, sole, adaptive (kernel_probe.probe.repetitions) ----------------------
def test_a_sole_candidate_gets_one_measured_call_after_its_check_at_the_shape(monkeypatch):
    from kernel_probe.probe import repetitions

    # a first call is never long enough
    monkeypatch.setattr(repetitions, "SOLE_SECOND_CALL_BELOW_S", math.inf)
    seen = []
    opts = {**FAST, "check": True, "mode": "sole", "reps": 5}
    reply = time_candidate(
        default_for("LayerNorm"),
        "LayerNorm",
        "cpu",
        ["64x32"],
        "float32",
        "true",
        opts,
        seen.append,
    )
    [row] = reply.rows
    assert row["reps"] == 1 and row["timed"] == "sole candidate" and len(row["samples"]) == 1
    assert row["median_ms"] == pytest.approx(row["samples"][0] * 1000)
    # the first call is the check
    assert row["check"]["sampled"] > 0 and "error" not in row["check"]
    # a short first call: one more, measured, call (the first call's one-time costs are not the
    # evidence)
    assert [(m.phase, m.done, m.total) for m in seen] == [("first call", 1, 1), ("rep", 1, 1)]
    unchecked = {**opts, "check": False}
    [row] = time_candidate(
        default_for("LayerNorm"), "LayerNorm", "cpu", ["64x32"], "float32", "true", unchecked
    ).rows
    assert row["reps"] == 1 and "check" not in row


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="timing mode 'guess'"):
        time_candidate(
            default_for("LayerNorm"),
            "LayerNorm",
            "cpu",
            ["8x8"],
            "float32",
            "true",
            {"mode": "guess"},
        )


@pytest.mark.parametrize(
    "slot, shape", [("Attention", "2x16x32"), ("Activation", "16x32"), ("LayerNorm", "16x32")]
)
def test_every_timing_row_names_the_probes_precision_regime(slot, shape):
    """Issue 57 point 4: Attention and Activation said "bf16 true" inside a bf16-mixed probe."""
    from kernel_probe import slots

    behaviour = slots.slot(slot)
    opts = {**FAST, "mode": "sole", "check": False}
    for regime in ("mixed", "true"):
        reply = behaviour.time(
            default_for(slot), "cpu", [shape], "bfloat16", regime, opts, {}, None
        )
        [row] = reply.rows
        assert row["regime"] == regime and "error" not in row, row


def test_a_step_slots_inputs_are_the_same_in_every_request():
    """The default and a candidate, and every round of either, time on the same seeded inputs."""
    from kernel_probe.probe import timing

    seen = []

    def run_shape(text, timed):
        seen.append(torch.randn(4))
        timed(lambda: None)

    for _ in range(2):
        torch.randn(3)  # whatever ran before
        timing.step_rows("x", "cpu", ["2x2"], "float32", {**FAST}, None, run_shape)
    assert torch.equal(seen[0], seen[1])


# ---- progress messages ---------------------------------------------------------------------------
def test_progress_message_carries_its_fields_and_rounds_the_seconds():
    m = progress_message("64x32", 1, 3, "rep", 4, 20, 1.23456789)
    assert (m.shape, m.index, m.of, m.phase, m.done, m.total) == ("64x32", 1, 3, "rep", 4, 20)
    assert m.seconds == 1.235


# ---- a row's statistics, on CPU (the figures' values are the clock's; their relations are not) ---
@pytest.mark.parametrize(
    "slot, shape, rows, hidden, out",
    [
        ("LayerNorm", "64x32", 64, 32, 0),
        ("RMSNorm", "37x100", 37, 100, 0),
        ("Linear", "64x32", 64, 32, 32),  # 2-D: as many outputs as inputs
        ("Linear", "64x32x16", 64, 32, 16),  # 3-D: ROWSxHIDDENxOUT
    ],
)
def test_a_row_reports_consistent_statistics(slot, shape, rows, hidden, out):
    cand = default_for(slot)
    [row] = time_candidate(cand, slot, "cpu", [shape], "float32", "true", FAST).rows
    assert "error" not in row, row
    assert (row["implementation"], row["shape"], row["dtype"], row["regime"]) == (
        cand.id,
        shape,
        "float32",
        "true",
    )
    assert row["reps"] == FAST["reps"]  # no minimum time: exactly the repetitions asked
    assert row["median_ms"] > 0 and row["compile_s"] >= 0
    assert row["spread"] == 0.0  # under four samples there is no interquartile range
    seconds = row["median_ms"] / 1000
    assert row["gbps"] == pytest.approx(
        bytes_moved(cand.semantics, rows, hidden, out, 4) / seconds / 1e9
    )
    if cand.semantics == "linear":
        assert row["tflops"] == pytest.approx(flops("linear", rows, hidden, out) / seconds / 1e12)
    else:
        assert "tflops" not in row
    assert "copy_gbps" not in row and "copy_percent" not in row  # no copy ceiling on a CPU
    assert "check" not in row  # asked without the float64 check


def test_the_timed_inputs_do_not_depend_on_the_global_generator():
    """The check at the shape reads the timed inputs: they come from their own seeded generator, so
    the same candidate is judged on the same data on every rank, whatever ran before in the
    worker."""
    import torch

    cand, opts = default_for("LayerNorm"), {**FAST, "check": True}
    checks = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        [row] = time_candidate(cand, "LayerNorm", "cpu", ["64x48"], "float32", "true", opts).rows
        checks.append(row["check"]["errors"])
    # errors of real data, bit for bit the same
    assert checks[0] == checks[1] and checks[0]["y"][0] > 0


def test_more_repetitions_give_a_spread_and_a_minimum_time_adds_repetitions():
    cand = default_for("LayerNorm")
    [row] = time_candidate(
        cand, "LayerNorm", "cpu", ["16x8"], "float32", "true", {**FAST, "reps": 8}
    ).rows
    assert row["reps"] == 8 and row["spread"] >= 0.0
    opts = {**FAST, "reps": 1, "min_seconds": 0.05, "max_reps": 5}
    [row] = time_candidate(cand, "LayerNorm", "cpu", ["16x8"], "float32", "true", opts).rows
    assert 1 <= row["reps"] <= 5  # the minimum time adds repetitions, never beyond max_reps


@pytest.mark.parametrize("shape, words", [("axb", "ROWSxHIDDEN"), ("0x32", "positive")])
def test_a_bad_shape_is_an_error_row_and_the_next_shape_is_still_timed(shape, words):
    rows = time_candidate(
        default_for("LayerNorm"), "LayerNorm", "cpu", [shape, "16x8"], "float32", "true", FAST
    ).rows
    assert [r["shape"] for r in rows] == [shape, "16x8"]
    assert words in rows[0]["error"] and "median_ms" not in rows[0]
    assert "error" not in rows[1] and rows[1]["median_ms"] > 0


# what a timing with 2 warm-up calls and 3 repetitions reports at each shape, in order: (phase,
# done, total)
PROGRESS_2_3 = [
    ("first call", 1, 1),
    ("warm-up", 1, 2),
    ("warm-up", 2, 2),
    ("rep", 1, 3),
    ("rep", 2, 3),
    ("rep", 3, 3),
]


def assert_seconds_per_shape(seen, shapes, wall: float) -> None:
    """``seconds`` is the time spent on this shape so far, to the millisecond: it starts again at
    each shape, never goes back within one, and the shapes' totals fit in the call's own time
    (``wall``)."""
    per_shape = {shape: [m.seconds for m in seen if m.shape == shape] for shape in shapes}
    for seconds in per_shape.values():
        assert seconds == sorted(seconds) and seconds[0] >= 0, seconds
        assert all(s == round(s, 3) for s in seconds), seconds
    assert sum(seconds[-1] for seconds in per_shape.values()) <= wall + 0.002, (per_shape, wall)


def test_progress_follows_every_call_of_every_shape():
    seen = []
    opts = {**FAST, "warmup": 2, "reps": 3}
    started = time.perf_counter()
    time_candidate(
        default_for("RMSNorm"),
        "RMSNorm",
        "cpu",
        ["16x8", "8x8"],
        "float32",
        "true",
        opts,
        seen.append,
    )
    wall = time.perf_counter() - started
    steps = [(m.shape, m.index, m.of, m.phase, m.done, m.total) for m in seen]
    assert steps == [("16x8", 0, 2, *s) for s in PROGRESS_2_3] + [
        ("8x8", 1, 2, *s) for s in PROGRESS_2_3
    ]
    assert_seconds_per_shape(seen, ("16x8", "8x8"), wall)


# ---- progress while timing (issue 16, point 5) ---------------------------------------------------
def test_timing_progress_estimates_what_is_left():
    from kernel_probe.commands.probe import TimingProgress
    from kernel_probe.probe.timing import progress_message

    shown: list[str] = []
    p = TimingProgress(
        "timing LayerNorm: torch.layer_norm", ["1000x100", "4000x100"], shown.append, every=3600
    )
    p(progress_message("1000x100", 0, 2, "first call", 1, 1, 0.5))
    # rate-limited: same shape, not the last
    p(progress_message("1000x100", 0, 2, "rep", 1, 5, 1.0))
    p(progress_message("1000x100", 0, 2, "rep", 5, 5, 3.0))
    assert len(shown) == 2
    assert "first call 1/1" in shown[0]
    # issue 37: the time per call counts the repetitions only: 2.5 s over 5 reps after a 0.5 s first
    # call is 0.5 s per call (not 3 s / 6); the next shape is 4x the elements: 4 x 5 reps x 0.5 s =
    # 10 s
    assert "rep 5/5, 0.5 s per call, about 10 s for the shapes after it" in shown[1]
    p(progress_message("4000x100", 1, 2, "warm-up", 1, 1, 2.0))
    mid = p.text(progress_message("4000x100", 1, 2, "rep", 2, 5, 6.0))
    assert "rep 2/5, 2 s per call, about 6 s left at this shape" in mid


def test_attention_timing_progress_reads_its_geometries_not_shapes():
    """An Attention geometry (HEADSxHEAD_DIMxSEQ[:window=W]) is no norm shape: its cost is heads x
    queries x keys in the band x head_dim (issue 36)."""
    from kernel_probe.commands.probe import TimingProgress
    from kernel_probe.probe.timing import progress_message
    from kernel_probe.slots import slot

    attention_work = slot("Attention").work

    assert attention_work("2x32x128:window=8") == 2 * 128 * 17 * 32
    assert attention_work("2x32x128") == 2 * 128 * 128 * 32
    shown: list[str] = []
    geometries = ["2x32x128:window=8", "2x32x128"]  # the second sees 128 keys a query, the first 17
    p = TimingProgress(
        "timing Attention: torch.sdpa", geometries, shown.append, every=3600, work=attention_work
    )
    p(progress_message(geometries[0], 0, 2, "first call", 1, 1, 0.1))
    p(progress_message(geometries[0], 0, 2, "rep", 4, 4, 0.5))
    # 0.4 s over the 4 reps after the first call: 0.1 s a call; 4 reps at 128/17 the work: 4 x 0.1 x
    # 128 / 17 = 3 s
    assert "at 2x32x128:window=8 (shape 1/2)" in shown[0] and "first call 1/1" in shown[0]
    assert "rep 4/4, 0.1 s per call, about 3 s for the shapes after it" in shown[1]


def test_a_sole_candidate_whose_first_call_is_long_is_measured_by_it(monkeypatch):
    from kernel_probe.probe import repetitions

    # every first call counts as long
    monkeypatch.setattr(repetitions, "SOLE_SECOND_CALL_BELOW_S", 0.0)
    opts = {**FAST, "check": True, "mode": "sole"}
    [row] = time_candidate(
        default_for("LayerNorm"), "LayerNorm", "cpu", ["64x32"], "float32", "true", opts
    ).rows
    assert row["reps"] == 1 and row["compile_s"] == pytest.approx(row["median_ms"] / 1000, abs=1e-4)
    assert row["check"]["sampled"] > 0


def test_timing_progress_in_a_terminal_fits_80_columns_and_counts_calls():
    import io

    from rich.console import Console
    from rich.progress import Progress
    from rich.text import Text

    from kernel_probe.commands.probe import ConsoleEvents, TimingProgress
    from kernel_probe.probe.timing import progress_message

    shown: list[str] = []
    what = "timing Linear: some.very.long.candidate.identifier.from.a.plugin"
    p = TimingProgress(what, ["40320x1024", "542080x1024"], shown.append, compact=True)
    p(progress_message("40320x1024", 0, 2, "first call", 1, 1, 4.0))
    for done in range(1, 4):
        # 1 s per rep after the first call
        p(progress_message("40320x1024", 0, 2, "rep", done, 20, 4.0 + done))
    assert len(shown) == 4 and all(len(line) <= TimingProgress.WIDTH for line in shown)
    assert shown[-1].startswith("Linear: some.") and "40320x1024 1/2 rep 3/20" in shown[-1]
    # 17 reps left here at 1 s, then 20 reps at 542080/40320 = 13.4x the elements: 17 + 269 s
    assert shown[-1].endswith("~286s left")
    # the whole progress row (description, bar, calls done/total, clock) fits 80 columns
    events = ConsoleEvents()
    events.__dict__["terminal"] = True
    buf = io.StringIO()
    events.__dict__["progress"] = Progress(
        *events.progress_columns(),
        console=Console(file=buf, width=80, force_terminal=True),
        auto_refresh=False,
    )
    events.begin(12)
    events.timing(
        "Linear", "some.very.long.candidate.identifier.from.a.plugin", ["40320x1024"], None
    )
    events.timing(
        "Linear",
        "some.very.long.candidate.identifier.from.a.plugin",
        ["40320x1024"],
        progress_message("40320x1024", 0, 1, "rep", 7, 20, 9.0),
    )
    task = events.progress.tasks[0]
    assert (task.completed, task.total) == (
        7,
        20,
    )  # the calls of this shape, not the candidates (5/12)
    events.progress.refresh()
    events.done()
    lines = [line for line in buf.getvalue().replace("\r", "\n").split("\n") if "rep 7/20" in line]
    assert lines and all(len(Text.from_ansi(line).plain) <= 80 for line in lines)


def test_a_later_block_of_paired_rounds_makes_no_untimed_first_call():
    """A paired timing's later blocks (``first``: False, no warm-up) make only the timed calls: the
    worker made the first call in the candidate's first block. Both timing paths: the norms' and
    Linear's (``time_candidate``) and the step slots' (``step_rows``)."""
    from kernel_probe.probe.timing import step_rows

    later = {**FAST, "warmup": 0, "reps": 1, "first": False}
    seen: list = []
    [row] = time_candidate(
        default_for("LayerNorm"),
        "LayerNorm",
        "cpu",
        ["16x8"],
        "float32",
        "true",
        later,
        seen.append,
    ).rows
    assert [(m.phase, m.done) for m in seen] == [("rep", 1)]
    assert row["reps"] == 1 and "compile_s" not in row
    calls: list[int] = []

    def run_shape(shape, timed):
        timed(lambda: calls.append(1))

    for opts, expected in ((later, 1), ({**later, "first": True}, 2)):
        calls.clear()
        [row] = step_rows("x", "cpu", ["4x4"], "float32", opts, None, run_shape).rows
        assert len(calls) == expected and ("compile_s" in row) is opts["first"]
