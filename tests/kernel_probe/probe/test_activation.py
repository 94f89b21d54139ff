"""The Activation slot's checks and verdicts, in-process (the worker runs the same functions):
torch.nn's classes, and the fakes of tests/fakes/kp_activation.py reproducing real differences (a
tanh GELU offered as erf, an activation that writes into its input, a wrong backward), each accepted
or refused for its reason; then one real ``kernel-probe check --candidate Activation=... --json``
through the worker."""

from __future__ import annotations

import json

import pytest
import torch

from kernel_probe import candidates as cands
from kernel_probe.probe import lifecycle
from kernel_probe.probe.judge import Policy
from kernel_probe.probe.report import report_base
from kernel_probe.slots import activation, activation_kernels
from tests.conftest import needs_anemoi

FP32 = [("float32", "true")]
ALL = [("float32", "true"), ("bfloat16", "true"), ("bfloat16", "mixed"), ("float16", "true")]


def verdict(target_or_id: str, function: str = "gelu-erf", dtypes=FP32, policy=Policy()):
    if target_or_id.startswith("kp_"):
        cand = cands.from_command_line(f"Activation={target_or_id}")
    else:
        cand = next(c for c in cands.builtin() if c.id == target_or_id)
    raw = activation_kernels.check(cand, "cpu", dtypes, canonical_overrides={"function": function})
    report = activation.judge(
        raw, cand, "cpu", report_base(cand, "Activation", "cpu"), function, policy
    )
    return raw, report


# ---- torch.nn's classes --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cid,function",
    [("torch.gelu", "gelu-erf"), ("torch.gelu_tanh", "gelu-tanh"), ("torch.silu", "silu"),
     ("torch.relu", "relu"), ("torch.sigmoid", "sigmoid")],
)  # fmt: skip
def test_torchs_classes_are_accepted_for_their_function_in_every_dtype(cid, function):
    raw, report = verdict(cid, function, ALL)
    assert raw.computes == function
    assert report.status == "accepted", report.reasons
    assert [(v.dtype, v.regime) for v in report.verdicts] == ALL
    for v in report.verdicts:
        assert v.deterministic is True and v.worst_ratio < 1
        assert set(v.errors) == set(activation_kernels.HINTS)
        # the inference cases judge the forward only (issue 55)
        assert all(
            set(t) == ({"y"} if c in lifecycle.INFERENCE else {"y", "dx"})
            for c, t in v.errors.items()
        )
    assert report.verdicts[0].twin == {"state_dict": "interchangeable", "max_error": 0.0}


def test_the_gap_between_the_gelus_is_measured_in_float64():
    size, where = activation.gap("gelu-erf", "gelu-tanh")
    assert 4.6e-4 < size < 4.8e-4 and 2.5 < where < 2.9
    assert activation.gap("gelu-erf", "other:a.B") is None


# ---- a tanh GELU offered as erf ------------------------------------------------------------------
@pytest.mark.parametrize("offered", ["kp_activation.FastGELU", "torch.gelu_tanh"])
def test_a_tanh_gelu_for_an_erf_model_is_rejected_naming_the_difference(offered):
    raw, report = verdict(offered, "gelu-erf", ALL)
    assert raw.computes == "gelu-tanh"
    assert report.status == "rejected"
    first = report.reasons[0]
    assert first.startswith(
        "function: computes gelu-tanh, not the model's gelu-erf: the two differ by up to 0.00047"
    )
    assert "near |x| = 2.7" in first and "--allow-approximation" in first
    # the fp32 row fails on the numbers too, in the case built for it; bf16 cannot see a 4.7e-4 gap
    fp32 = report.verdicts[0]
    assert "gelu-gap:y" in fp32.failed and "function" not in fp32.failed
    assert report.verdicts[1].failed == ("function",)
    assert not report.changes


def test_a_tanh_gelu_is_accepted_only_with_allow_approximation_and_the_change_is_recorded():
    raw, report = verdict("torch.gelu_tanh", "gelu-erf", ALL, Policy(allow_approximation=True))
    assert report.status == "accepted", report.reasons
    assert len(report.changes) == 1
    change = report.changes[0]
    assert change.startswith(
        "approximation: computes gelu-tanh, not the model's gelu-erf: the two differ by up to"
    )
    assert change.endswith("(accepted with --allow-approximation)")
    # judged against the function it computes, with torch's tanh GELU as the baseline: within the
    # rule
    assert all(v.worst_ratio < 1 for v in report.verdicts)
    assert all(change in v.notes for v in report.verdicts)


def test_an_approximation_is_still_judged_against_what_it_computes():
    """The fake's x * x * x overflows float16 at |x| ~ 40 (torch's own tanh GELU does not): allowed
    as an approximation, it is still rejected, for that."""
    raw, report = verdict(
        "kp_activation.FastGELU", "gelu-erf", ALL, Policy(allow_approximation=True)
    )
    assert report.status == "rejected"
    assert report.changes and report.changes[0].startswith("approximation: computes gelu-tanh")
    bad = [v for v in report.verdicts if v.status != "accepted"]
    assert [(v.dtype, v.failed) for v in bad] == [("float16", ("large-magnitude:dx",))]
    assert report.reasons[0].startswith(
        "float16/true: large-magnitude (large values: overflow in low precision): dx"
    )


def test_allow_approximation_does_not_accept_another_function():
    raw, report = verdict("torch.silu", "gelu-erf", FP32, Policy(allow_approximation=True))
    assert raw.computes == "silu" and report.status == "rejected"
    assert (
        report.reasons[0]
        == "function: computes silu, not the model's gelu-erf: "
        + report.reasons[0].split(": ", 2)[2]
    )
    assert "--allow-approximation" not in report.reasons[0]


def test_an_erf_gelu_for_a_tanh_model_is_the_same_pair_the_other_way():
    raw, report = verdict("kp_activation.ExactGELU", "gelu-tanh", FP32)
    assert raw.computes == "gelu-erf" and report.status == "rejected"
    assert "computes gelu-erf, not the model's gelu-tanh" in report.reasons[0]


# ---- flaws besides the function ------------------------------------------------------------------
def test_an_activation_that_writes_into_its_input_is_rejected():
    raw, report = verdict("kp_activation.InPlaceGELU", "gelu-erf", FP32)
    assert raw.computes == "gelu-erf"  # its values are right
    assert report.status == "rejected"
    assert report.reasons[0] == "float32/true: modifies its input (seen on random)"


def test_a_wrong_backward_is_rejected_on_dx_and_the_forward_still_names_the_function():
    raw, report = verdict("kp_activation.WrongBackwardGELU", "gelu-erf", ALL)
    assert raw.computes == "gelu-erf"
    assert report.status == "rejected"
    # the missing x * pdf(x) is visible in bf16 too
    assert all(v.status == "rejected" for v in report.verdicts)
    failed = {f for v in report.verdicts for f in v.failed}
    assert "random:dx" in failed and not any(f.endswith(":y") for f in failed)
    assert any("dx error" in r for r in report.reasons)


def test_a_correct_users_class_is_accepted():
    raw, report = verdict("kp_activation.ExactGELU", "gelu-erf", ALL)
    assert report.status == "accepted", report.reasons


# ---- declared-other: anemoi's own activations ----------------------------------------------------
@needs_anemoi
def test_a_declared_other_function_is_its_own_reference():
    sine = "other:anemoi.models.layers.activations.Sine"
    raw, report = verdict("kp_activation.ExactGELU", sine, FP32)
    assert report.status == "rejected" and raw.computes == "gelu-erf"
    assert report.reasons[0] == f"function: computes gelu-erf, not the model's {sine}"
    cand = cands.from_command_line("Activation=anemoi.models.layers.activations.Sine")
    raw = activation_kernels.check(cand, "cpu", FP32, canonical_overrides={"function": sine})
    report = activation.judge(
        raw, cand, "cpu", report_base(cand, "Activation", "cpu"), sine, Policy()
    )
    assert raw.computes == sine and report.status == "accepted", report.reasons


# ---- before anything runs ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cid,function,skipped",
    [("torch.silu", "gelu-erf", True), ("torch.gelu_tanh", "gelu-erf", False),
     ("torch.gelu", "silu", True), ("te.gelu", "gelu-erf", False), ("te.relu", "gelu-erf", True),
     ("torch.compile.gelu", "gelu-erf", False)],
)  # fmt: skip
def test_a_class_known_to_compute_another_function_is_skipped_unchecked(cid, function, skipped):
    cand = next(c for c in cands.builtin() if c.id == cid)
    problem = activation.static_problem(cand, function)
    assert (problem is not None) == skipped
    if problem:
        assert (
            problem.status == "skipped"
            and f"the model's Activation is {function}" in problem.reason
        )


def test_a_custom_class_is_never_skipped_by_its_name():
    cand = cands.from_command_line("Activation=kp_activation.FastGELU")
    assert activation.static_problem(cand, "gelu-erf") is None


def test_a_candidate_that_cannot_run_is_reported_with_the_reason():
    cand = cands.from_command_line("Activation=kp_activation.SwiGLUish")
    raw, report = verdict("kp_activation.SwiGLUish", "gelu-erf", FP32)
    # it halves the width: none of the functions, its rows say how
    assert report.status == "rejected"
    assert raw.computes == ""
    assert report.reasons[0].startswith("function: its float32 forward matches none of gelu-erf")
    assert report.reasons[1].startswith(
        "float32/true: returns shape (8, 128) for an input of shape (8, 256): not"
    )
    assert report.verdicts[0].failed == ("not-elementwise",)
    missing = cands.from_command_line("Activation=kp_not_installed_anywhere.GELU")
    raw = activation_kernels.check(missing, "cpu", FP32)
    assert raw.phase == "import" and raw.kind == "import"
    assert cand.semantics == "activation"


# ---- timing --------------------------------------------------------------------------------------
def test_the_timing_is_one_measured_call_for_a_sole_candidate():
    cand = cands.default_for("Activation")
    reply = activation_kernels.time_candidate(
        cand, "cpu", ["64x128", "16x32x96"], "float32", {"mode": "sole"}
    )
    assert [r["shape"] for r in reply.rows] == ["64x128", "16x32x96"]
    for row in reply.rows:
        assert "error" not in row, row
        assert row["reps"] == 1 and row["timed"] == "sole candidate" and row["median_ms"] > 0


def test_the_timing_reports_progress_after_every_call_of_every_shape():
    seen = []
    cand = cands.default_for("Activation")
    shapes = ["64x128", "16x32x96"]
    reply = activation_kernels.time_candidate(
        cand, "cpu", shapes, "float32", {"mode": "sole"}, seen.append
    )
    assert all("error" not in r for r in reply.rows), reply.rows
    steps = [(m.shape, m.index, m.of, m.phase) for m in seen]
    # a sole candidate: its first call, then its one measured call (timing.timed_calls)
    assert steps == [(s, i, 2, p) for i, s in enumerate(shapes) for p in ("first call", "rep")]
    assert all(m.seconds >= 0 for m in seen) and seen[1].seconds < 60


# ---- the command line ----------------------------------------------------------------------------
@pytest.mark.slow  # a check in a worker (import torch)
def test_check_candidate_activation_reports_verdicts_in_the_slots_shape(capsys):
    from tests.conftest import run_cli

    code, out, err = run_cli(
        ["check", "--slot", "Activation", "--candidate", "Activation=kp_activation.FastGELU",
         "--dtype", "fp32", "--json"],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    reports = {r["id"]: r for r in data["slots"]["Activation"]}
    fast = reports["custom:kp_activation.FastGELU"]
    assert fast["status"] == "rejected" and "computes gelu-tanh" in fast["reasons"][0]
    assert set(fast) == set(reports["torch.gelu"])  # the same shape as every other report
    assert reports["torch.gelu"]["status"] == "accepted"
    assert reports["torch.silu"]["status"] == "skipped"
    assert fast["evidence"][0]["dtype"] == "float32" and "gelu-gap" in fast["evidence"][0]["errors"]


@pytest.mark.parametrize("command", ["check", "probe"])
def test_the_command_line_sets_the_function_and_the_approximation_policy(command):
    import argparse

    from kernel_probe.commands.check import add_check_arguments, policy_from
    from kernel_probe.commands.probe import add_probe_arguments

    parser = argparse.ArgumentParser()
    (add_check_arguments if command == "check" else add_probe_arguments)(parser)
    args = parser.parse_args(["--activation", "silu", "--allow-approximation"])
    assert args.activation == "silu" and policy_from(args).allow_approximation
    assert not policy_from(parser.parse_args([])).allow_approximation


def test_the_probe_plan_carries_the_function_into_the_checks_and_the_digest():
    from kernel_probe.probe.planning import ProbeRequest, plan

    silu = plan(
        ProbeRequest(
            slots=("Activation",), declared={"Activation": "silu"}, allow_approximation=True
        )
    )
    default = plan(ProbeRequest(slots=("Activation",)))
    assert silu.canonical == {"Activation": {"function": "silu"}} and default.canonical == {}
    assert silu.inputs["activation"] == "silu" and silu.inputs["allow_approximation"] is True
    assert (
        default.inputs["activation"] == "gelu-erf" and "allow_approximation" not in default.inputs
    )
    assert silu.digest != default.digest


@pytest.mark.parametrize("bad", ["gelu", "other:", "other:_private.X", "GELU-ERF"])
def test_an_unknown_activation_function_is_a_usage_error(capsys, bad):
    from tests.conftest import run_cli

    code, out, err = run_cli(["check", "--slot", "Activation", "--activation", bad], capsys)
    assert code == 2 and "--activation" in err and "gelu-erf" in err


def test_torch_float64_reference_agrees_with_the_python_formulas():
    x = torch.linspace(-6, 6, 97, dtype=torch.float64)
    for name, ref in activation_kernels.REFERENCES.items():
        formula = activation._FORMULAS[name]
        assert torch.allclose(
            ref(x), torch.tensor([formula(float(v)) for v in x], dtype=torch.float64), atol=1e-14
        )
