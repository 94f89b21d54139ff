"""Verdicts at the model's shapes (issue 26, point 1): after timing, the candidate is compared with
float64 on a sample of rows at that exact shape and regime.

CPU-sized fakes (``kp_zoo.norms``) stand for the real hazards: a kernel right up to some row count
and wrong beyond it (pytorch #184826's rows >= 2^23), one whose element offsets wrap (int32 past
2^31, here 2^21), one wrong only in its backward, one whose parameter gradients drop rows. Each fake
at a shape below its limit is the control: the same code, right, and it passes.
"""

from __future__ import annotations

import pytest

import kernel_lock
from kernel_probe.candidates import builtin, from_command_line
from kernel_probe.cli import main
from kernel_probe.probe import atshape, timing
from kernel_probe.probe.tolerance import judge_output, judge_shape
from tests.conftest import small_probe

FAST = {"reps": 1, "warmup": 1, "min_seconds": 0.0}


SHIFTED = "kp_zoo.norms.ShiftedBeyondRowsLayerNorm"


# ---- the row-sampling rule ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "rows, widths, must, must_not",
    [
        (1, (1000,), [0], []),
        (37, (1000,), [0, 1, 2, 3, 33, 34, 35, 36], []),
        (8192, (256,), [0, 3, 8188, 8191], [4]),
        (65536, (1024,), [65532, 65535], []),  # row 2^16 does not exist: no window around it
        ((1 << 16) + 10, (1024,), list(range((1 << 16) - 4, (1 << 16) + 4)), []),
        ((1 << 23) + 1, (1000,), [(1 << 23) - 4, 1 << 23, 2147484 - 4, 2147484 + 3], []),
        ((1 << 22), (1024, 4096), [(1 << 21) - 4, (1 << 21) + 3, (1 << 19) - 4, (1 << 19) + 3], []),
    ],
)
def test_sample_rows_rule(rows, widths, must, must_not):
    got = atshape.sample_rows(rows, widths)
    assert got == sorted(set(got)) and all(0 <= r < rows for r in got)
    assert set(must) <= set(got) and not set(must_not) & set(got)
    assert got == atshape.sample_rows(rows, widths)  # deterministic: a rerun checks the same rows


@pytest.mark.parametrize("rows", [17, 37, 1000, 8192, 542080, 40320 * 13])
def test_every_band_of_the_tensor_is_sampled(rows):
    got = atshape.sample_rows(rows, (1024,))
    for i in range(atshape.SPREAD):
        lo, hi = i * rows // atshape.SPREAD, (i + 1) * rows // atshape.SPREAD
        assert hi == lo or any(lo <= r < hi for r in got), (i, lo, hi)
    assert len(got) <= 2 * atshape.WINDOW + atshape.SPREAD + 2 * atshape.WINDOW * 3


def test_boundaries_named_only_where_reached():
    assert atshape.boundaries(542080, (1024,)) == [(65536, "row 2^16")]
    names = [n for _, n in atshape.boundaries(10_000_000, (1000,))]
    assert names == ["row 2^16", "row 2^23", "2^31 elements at width 1000 (row 2147484)"]


# ---- the check after timing, with fakes wrong only at size, and their controls -----------------
CASES = [
    # (candidate, slot, dtype, regime, the shape it is wrong at, the shape it is right at, wrong
    # tensors, first bad row)
    (
        "LayerNorm=kp_zoo.norms.ShiftedBeyondRowsLayerNorm",
        "float32",
        "true",
        "8192x256",
        "4096x256",
        {"y"},
        4096,
    ),
    (
        "LayerNorm=kp_zoo.norms.ShiftedBeyondRowsLayerNorm",
        "bfloat16",
        "mixed",
        "8192x256",
        "4096x256",
        {"y"},
        4096,
    ),
    (
        "LayerNorm=kp_zoo.norms.OverflowLayerNorm",
        "float32",
        "true",
        "4096x1024",
        "2048x1024",
        {"y", "dx"},
        None,
    ),
    (
        "LayerNorm=kp_zoo.norms.BackwardBeyondRowsLayerNorm",
        "bfloat16",
        "true",
        "8192x256",
        "4096x256",
        {"dx"},
        None,
    ),
    (
        "LayerNorm=kp_zoo.norms.PartialSumLayerNorm",
        "float32",
        "true",
        "8192x256",
        "4096x256",
        {"dweight"},
        None,
    ),
    (
        "RMSNorm=kp_zoo.norms.RowLimitRMSNorm",
        "bfloat16",
        "mixed",
        "8192x256",
        "4096x256",
        {"y"},
        4096,
    ),
    (
        "Linear=kp_zoo.norms.RowLimitLinear",
        "float32",
        "true",
        "8192x256x128",
        "4096x256x128",
        {"y", "dbias"},
        4096,
    ),
]


def _verdicts(spec, dtype, regime, shapes):
    slot = spec.split("=")[0]
    reply = timing.time_candidate(
        from_command_line(spec), slot, "cpu", list(shapes), dtype, regime, FAST
    )
    out = {}
    for row in reply.rows:
        assert "error" not in row, row
        out[row["shape"]] = (row["check"], judge_shape(row["shape"], dtype, regime, row["check"]))
    return out


@pytest.mark.parametrize(
    "spec, dtype, regime, bad, good, tensors, first_bad",
    [
        pytest.param(*case, marks=[] if i == 0 else [pytest.mark.slow])
        for i, case in enumerate(CASES)
    ],
)
# torch.nn.RMSNorm, the baseline, in bf16-mixed: bf16 input, float32 weight, so torch says it takes
# its unfused path (the worker keeps such output in the product; here the timing runs in the test's
# process)
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")
def test_wrong_only_at_size_is_rejected_and_the_control_passes(
    spec, dtype, regime, bad, good, tensors, first_bad
):
    verdicts = _verdicts(spec, dtype, regime, (good, bad))
    check, verdict = verdicts[good]
    assert verdict.ok and verdict.worst_ratio is not None and verdict.worst_ratio < 1, (good, check)
    check, verdict = verdicts[bad]
    assert not verdict.ok
    assert f"at the model's shape {bad} ({dtype}, regime {regime})" in verdict.reason
    assert "first bad row" in verdict.reason or "sum over the" in verdict.reason
    failing = {
        t
        for t, errors in check["errors"].items()
        if judge_output(t, errors, check["stats"][t], dtype)[1]
    }
    assert tensors <= failing, (check["errors"], check["stats"])
    if first_bad is not None:
        assert (
            check["first_bad_row"] == first_bad
            and f"first bad row {first_bad} of" in verdict.reason
        )
        assert (
            f"first bad row {first_bad} of 8192, its {check['first_bad_statistic']}"
            in verdict.reason
        )
    if "sum over the" in verdict.reason:  # only a parameter gradient is wrong: no row to name
        assert "first_bad_row" not in check


@pytest.mark.slow
def test_a_shift_within_max_error_is_rejected_by_its_bias_and_controls_pass_five_times(
    monkeypatch,
):
    """Issue 35: +0.05 beyond row 4096 at 8192x256 in bf16-mixed is within 4x torch.nn's max error
    (half an ulp at |y| ~ 4), and is rejected by the statistics besides the max; torch.nn and a
    correct fake at the same shape are accepted in five runs, each on fresh timed inputs."""
    shifted = from_command_line(f"LayerNorm={SHIFTED}")
    row = timing.time_candidate(
        shifted, "LayerNorm", "cpu", ["8192x256"], "bfloat16", "mixed", FAST
    ).rows[0]
    check, verdict = row["check"], judge_shape("8192x256", "bfloat16", "mixed", row["check"])
    # the max error alone passes it
    assert not judge_output("y", check["errors"]["y"], None, "bfloat16")[1]
    assert not verdict.ok and "first bad row 4096 of 8192, its y " in verdict.reason
    assert "y bias (mean signed error)" in verdict.reason
    controls = [
        next(c for c in builtin() if c.id == "torch.layer_norm"),
        from_command_line("LayerNorm=kp_zoo.norms.GoodLayerNorm"),
    ]
    for seed in range(5):
        monkeypatch.setattr(timing, "TIMED_INPUT_SEED", seed)  # other data in each run
        for cand in controls:
            reply = timing.time_candidate(
                cand, "LayerNorm", "cpu", ["8192x256"], "bfloat16", "mixed", FAST
            )
            control = judge_shape("8192x256", "bfloat16", "mixed", reply.rows[0]["check"])
            assert control.ok and control.worst_ratio is not None and control.worst_ratio < 1, (
                seed,
                control,
            )


@pytest.mark.slow
@pytest.mark.parametrize(
    "cid, slot, shape",
    [
        ("torch.layer_norm", "LayerNorm", "3000x384"),
        ("torch.rms_norm", "RMSNorm", "3000x384"),
        ("torch.linear", "Linear", "3000x384x192"),
    ],
)
@pytest.mark.parametrize(
    "dtype, regime", [("float32", "true"), ("bfloat16", "mixed"), ("float16", "true")]
)
def test_torch_nn_passes_its_own_check(cid, slot, shape, dtype, regime):
    cand = next(c for c in builtin() if c.id == cid)
    row = timing.time_candidate(cand, slot, "cpu", [shape], dtype, regime, FAST).rows[0]
    verdict = judge_shape(shape, dtype, regime, row["check"])
    assert verdict.ok, verdict.reason
    assert row["check"]["sampled"] == len(
        atshape.sample_rows(3000, (384,) if slot != "Linear" else (384, 192))
    )
    assert set(row["check"]["errors"]) == (
        {"y", "dx", "dweight"} | ({"dbias"} if slot != "RMSNorm" else set())
    )


def test_the_check_can_be_left_out_only_by_asking():
    cand = next(c for c in builtin() if c.id == "torch.layer_norm")
    assert (
        "check"
        in timing.time_candidate(cand, "LayerNorm", "cpu", ["64x32"], "float32", "true", FAST).rows[
            0
        ]
    )
    off = timing.time_candidate(
        cand, "LayerNorm", "cpu", ["64x32"], "float32", "true", {**FAST, "check": False}
    )
    assert "check" not in off.rows[0]


def test_a_check_that_cannot_run_rejects():
    verdict = judge_shape(
        "542080x1024",
        "bfloat16",
        "mixed",
        {"rows": 542080, "error": "OutOfMemoryError: CUDA out of memory"},
    )
    assert not verdict.ok and "could not run: OutOfMemoryError" in verdict.reason


# ---- through the probe: rejected naming the shape and the row; pinned, exit 3 --------------------
PIN = ["--pin", f"LayerNorm=custom:{SHIFTED}"]


def probe(out, shape: str, *extra: str) -> int:
    """A small probe of LayerNorm at ``shape``, with the shifted candidate among the built-in
    ones."""
    return main(
        [
            "--out",
            str(out),
            "--candidate",
            f"LayerNorm={SHIFTED}",
            *small_probe("LayerNorm", shape=shape, reps=1),
            *extra,
        ]
    )


@pytest.mark.slow
def test_probe_rejects_a_kernel_wrong_at_the_models_size(tmp_path, capsys):
    out = tmp_path / "k.toml"
    assert probe(out, "8192x256") == 0
    slot = kernel_lock.load(out).slots["LayerNorm"]
    assert slot.implementation == "torch.layer_norm"
    shifted = next(c for c in slot.rejected if c.implementation == f"custom:{SHIFTED}")
    assert shifted.status == "rejected"
    assert "at the model's shape 8192x256 (float32, regime true)" in shifted.reasons[0]
    assert "first bad row 4096 of 8192" in shifted.reasons[0]
    chosen = next(t for t in slot.timing if t["implementation"] == "torch.layer_norm")
    assert (
        chosen["checked-rows"] == len(atshape.sample_rows(8192, (256,)))
        and chosen["worst-error-ratio"] < 1
    )
    capsys.readouterr()
    # pinned: an error, exit 3, naming the shape and the first bad row; nothing written
    pinned = tmp_path / "pinned.toml"
    code = probe(pinned, "8192x256", *PIN)
    err = capsys.readouterr().err
    assert code == 3 and "8192x256" in err and "first bad row 4096" in err and not pinned.exists()
    # the control: the same code at a size where it is right is pinned
    assert probe(pinned, "4096x256", *PIN) == 0
    assert kernel_lock.load(pinned).slots["LayerNorm"].implementation == f"custom:{SHIFTED}"


@pytest.mark.parametrize("shape", ["64x32", "64x32x16"])
def test_a_transposed_linear_is_checked_through_its_layout_even_at_a_square_shape(shape):
    # a square weight cannot tell (out, in) from (in, out): the layout comes from a non-square build
    reply = timing.time_candidate(
        from_command_line("Linear=kp_zoo.norms.TransposedLinear"),
        "Linear",
        "cpu",
        [shape],
        "float32",
        "true",
        FAST,
    )
    verdict = judge_shape(shape, "float32", "true", reply.rows[0]["check"])
    assert verdict.ok, verdict.reason
