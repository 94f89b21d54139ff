"""The verdict on one measured (dtype, regime), ``judge.judge_row``, from hand-written measurements:
each rule that turns a row's errors and flags into a status, one test per rule, no worker and no
torch (the fast lane catches a rule flipped or dropped; the slow judge tests check the same rules on
real kernels)."""

from __future__ import annotations

import math

import pytest

from kernel_probe.isolation.protocol import (
    FLAG_GRAD_OUTPUT_MODIFIED,
    FLAG_INPUT_MODIFIED,
    FLAG_OUTPUT_DTYPE,
    MeasurementRow,
    alt_key,
)
from kernel_probe.probe.judge import Policy, UnjudgedRow, judge_row, worst_status

# torch.nn's own errors in float32: the tolerance of each is 4 x these + 2 eps (TOL, about 6.4e-7)
RIGHT = {"y": [1e-7, 1e-7], "dx": [1e-7, 1e-7], "dweight": [1e-7, 1e-7]}
TOL = 4e-7 + 2 * 2**-23


def row(cases=None, **extra) -> MeasurementRow:
    """A float32 row whose every case is right unless ``cases`` says otherwise."""
    base: MeasurementRow = {
        "dtype": "float32",
        "regime": "true",
        "cases": {"random": dict(RIGHT)},
        "flags": {},
    }
    if cases is not None:
        base["cases"] = cases
    base.update(extra)  # type: ignore[typeddict-item]
    return base


def verdict(r: MeasurementRow, semantics: str = "layer_norm", policy: Policy = Policy()):
    return judge_row("x.cand", "cpu", semantics, r, policy)


@pytest.mark.parametrize("cases", [{}, None], ids=["empty", "absent"])
def test_a_row_with_no_cases_gives_no_verdict_naming_the_candidate(cases):
    r = row(cases={})
    if cases is None:
        del r["cases"]
    with pytest.raises(
        UnjudgedRow, match=r"x\.cand: its float32/true row has no measured case"
    ) as exc:
        verdict(r)
    assert exc.value.candidate == "x.cand"


def test_a_row_with_no_cases_but_a_failing_flag_is_rejected_for_it():
    v = verdict(row(cases={}, flags={FLAG_INPUT_MODIFIED: "x"}))
    assert v.status == "rejected" and v.failed == (FLAG_INPUT_MODIFIED,) and v.worst_ratio is None


def test_a_row_right_to_rounding_is_accepted():
    v = verdict(row())
    assert (v.status, v.failed, v.reasons) == ("accepted", (), ())
    assert v.worst_ratio == pytest.approx(1e-7 / (4e-7 + 2 * 2**-23))


@pytest.mark.parametrize("tensor", ["y", "dx", "dweight"])
def test_one_output_over_its_tolerance_rejects_naming_it(tensor):
    # just over: 4 x torch.nn's error + the floor is the tolerance (TOL), and 1.01 x that fails
    v = verdict(row({"random": {**RIGHT, tensor: [1.01 * TOL, 1e-7]}}))
    assert v.status == "rejected" and v.failed == (f"random:{tensor}",)
    assert v.reasons[0].startswith(f"random (plain random input): {tensor} error ")
    assert v.worst_ratio == pytest.approx(1.01)


def test_at_the_tolerance_it_still_passes():
    assert verdict(row({"random": {**RIGHT, "dx": [TOL, 1e-7]}})).status == "accepted"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nan_or_inf_error_rejects(bad):
    v = verdict(row({"random": {**RIGHT, "y": [bad, 1e-7]}}))
    assert v.status == "rejected" and v.failed == ("random:y",) and v.worst_ratio == math.inf


def test_a_backward_that_modifies_grad_output_is_rejected_even_when_every_error_is_right():
    v = verdict(row(flags={FLAG_GRAD_OUTPUT_MODIFIED: "residual"}))
    assert v.status == "rejected" and v.failed == (FLAG_GRAD_OUTPUT_MODIFIED,)
    assert v.reasons == (
        "backward modifies grad_output in place (seen on residual): "
        "gradients of other branches, e.g. a residual, are corrupted",
    )


def test_a_kernel_that_modifies_its_input_is_rejected_even_when_every_error_is_right():
    v = verdict(row(flags={FLAG_INPUT_MODIFIED: "random"}))
    assert v.status == "rejected" and v.failed == (FLAG_INPUT_MODIFIED,)
    assert v.reasons == ("modifies its input (seen on random)",)


@pytest.mark.parametrize(
    "message,status",
    [
        (
            "\"LayerNormKernelImpl\" not implemented for 'BFloat16'",
            "unavailable",
        ),  # this dtype, not the kernel
        ("unsupported dtype Half", "unavailable"),
        ("CUDA error: an illegal memory access was encountered", "crashed"),
        ("index 3 is out of bounds", "crashed"),
    ],
)
def test_an_exception_is_unavailable_for_a_dtype_problem_and_crashed_otherwise(message, status):
    v = verdict(row(exception=message))
    assert (v.status, v.reasons) == (status, (f"raised {message}",))


def test_a_row_torch_nn_itself_cannot_run_is_skipped():
    v = verdict(row(skipped="torch.nn itself fails for float16 true on cpu: RuntimeError: x"))
    assert (v.status, v.reasons) == (
        "skipped",
        ("torch.nn itself fails for float16 true on cpu: RuntimeError: x",),
    )


def test_a_wrong_output_that_matches_the_other_norm_names_the_semantics():
    wrong_y = {**RIGHT, "y": [0.3, 1e-7]}
    matches = verdict(row({"random": {**wrong_y, alt_key("rms_norm"): [1e-7, 1e-7]}}))
    assert matches.status == "rejected" and matches.reasons[0] == (
        "semantics: rms_norm != layer_norm (its output matches a rms_norm reference)"
    )
    # the other norm's error is no output of its own
    assert alt_key("rms_norm") not in " ".join(matches.failed)
    differs = verdict(row({"random": {**wrong_y, alt_key("rms_norm"): [0.3, 1e-7]}}))
    assert differs.status == "rejected" and not differs.reasons[0].startswith("semantics")
    # right output: the other norm's reference is not consulted at all
    assert (
        verdict(row({"random": {**RIGHT, alt_key("rms_norm"): [0.3, 1e-7]}})).status == "accepted"
    )


def _dtype_row(blocks):
    return row(
        flags={FLAG_OUTPUT_DTYPE: "float32 (torch.nn: bfloat16) for bfloat16 input"}, blocks=blocks
    )


GOOD_BLOCKS = {"pre-norm": {"y": [1e-7, 1e-7]}, "post-norm": {"y": [1e-7, 1e-7]}}


def test_an_output_dtype_within_the_blocks_tolerance_is_accepted_and_recorded():
    v = verdict(_dtype_row(GOOD_BLOCKS))
    assert v.status == "accepted" and v.failed == ()
    assert v.changes == v.notes and v.changes[0].startswith(
        "output dtype float32 (torch.nn: bfloat16) for bfloat16 input in plain float32: "
        "accepted by consequence"
    )


@pytest.mark.parametrize(
    "blocks,policy,words",
    [
        (GOOD_BLOCKS, Policy(strict_dtype=True), "(--strict-dtype)"),
        (None, Policy(), "(no block check for this slot)"),
        (
            {**GOOD_BLOCKS, "post-norm": {"y": [1.01 * TOL, 1e-7]}},
            Policy(),
            "post-norm block y error 6.45e-07 > tolerance 6.38e-07",
        ),
        (
            {**GOOD_BLOCKS, "pre-norm": {"error": "RuntimeError: x"}},
            Policy(),
            "the pre-norm block raised RuntimeError",
        ),
    ],
    ids=["strict", "no-blocks", "a-block-too-wrong", "a-block-raised"],
)
def test_an_output_dtype_is_rejected_strictly_without_blocks_or_by_its_consequence(
    blocks, policy, words
):
    v = verdict(_dtype_row(blocks), policy=policy)
    assert v.status == "rejected" and v.failed == (FLAG_OUTPUT_DTYPE,) and words in v.reasons[0]
    assert v.changes == ()


@pytest.mark.parametrize(
    "statuses,worst",
    [
        (["accepted", "rejected", "crashed"], "crashed"),
        (["accepted", "timeout", "rejected"], "timeout"),
        (["accepted", "unavailable"], "unavailable"),
        (
            ["skipped", "accepted"],
            "accepted",
        ),  # a skipped row (torch.nn cannot run it) is no verdict
        (["skipped", "skipped"], "skipped"),
        ([], "skipped"),
    ],
)
def test_a_candidate_is_as_bad_as_its_worst_row(statuses, worst):
    assert worst_status(statuses) == worst


# ---- the candidate: what stops a check early, its layout, its initialisation, its rows -----------
def _candidate_report(**reply):
    from kernel_probe import candidates as cands
    from kernel_probe.isolation.protocol import CheckReply
    from kernel_probe.probe.judge import judge_candidate
    from kernel_probe.probe.report import report_base

    cand = cands.default_for("LayerNorm")
    policy = reply.pop("policy", None) or Policy()
    reply.setdefault(
        "layout", {"ok": True, "rules": [], "missing": [], "unexpected": [], "pairs": {}}
    )
    raw = CheckReply(candidate=cand.id, device="cpu", **reply)
    return judge_candidate(
        raw, cand, "LayerNorm", "cpu", policy, report_base(cand, "LayerNorm", "cpu")
    )


@pytest.mark.parametrize(
    "reply,status,reason",
    [
        (
            {"phase": "import", "kind": "import", "error": "No module 'x'"},
            "unavailable",
            "import of ",
        ),
        ({"phase": "import", "kind": "exception", "error": "boom"}, "crashed", "import of "),
        (
            {"phase": "baseline", "error": "torch.nn itself cannot be built"},
            "skipped",
            "torch.nn itself",
        ),
        (
            {"phase": "build", "error": "TypeError: x"},
            "crashed",
            "building torch.nn.LayerNorm raised TypeError: x",
        ),
        ({"phase": "blas", "error": "no cublaslt"}, "unavailable", "BLAS library: no cublaslt"),
    ],
    ids=["absent", "broken", "baseline", "build", "blas"],
)
def test_a_check_that_stopped_early_has_the_status_of_where_it_stopped(reply, status, reason):
    report = _candidate_report(**reply)
    assert (
        report.status == status and report.reasons[0].startswith(reason) and report.verdicts == []
    )


def test_no_layout_mapping_rejects_naming_the_keys():
    layout = {
        "ok": False,
        "rules": [],
        "missing": ["weight (8,)"],
        "unexpected": ["scale (9,)"],
        "pairs": {},
    }
    report = _candidate_report(layout=layout, rows=[row()])
    assert report.status == "rejected" and report.verdicts == []
    assert (
        report.reasons[0].startswith("layout: ")
        and "missing weight (8,); unexpected scale (9,)" in report.reasons[0]
    )


def test_the_candidate_is_its_worst_row_and_says_why_per_row():
    wrong = row({"random": {**RIGHT, "dx": [1.0, 1e-7]}})
    report = _candidate_report(rows=[row(), {**wrong, "dtype": "bfloat16", "regime": "mixed"}])
    assert report.status == "rejected" and [v.status for v in report.verdicts] == [
        "accepted",
        "rejected",
    ]
    assert report.reasons[0].startswith(
        "bfloat16/mixed: random (plain random input): dx error 1 > tolerance"
    )


def test_a_different_initialisation_rejects_unless_accepted_and_recorded():
    init = ["bias starts as values with mean 0.1; torch.nn starts as zeros"]
    report = _candidate_report(rows=[row()], init=init)
    assert report.status == "rejected" and report.reasons[0].startswith(
        "initialisation differs from torch.nn's"
    )
    allowed = _candidate_report(rows=[row()], init=init, policy=Policy(allow_init_change=True))
    assert allowed.status == "accepted" and allowed.changes == [
        f"initialisation: {init[0]} (accepted with --allow-init-change)"
    ]
