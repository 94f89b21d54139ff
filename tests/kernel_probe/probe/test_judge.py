"""The verdict module's candidate-level rules, without a worker: what rules a candidate out before
anything is imported (said once, for a --pin and for the checker), a worker that died, tampering,
and the check after timing."""

from __future__ import annotations

import dataclasses

import pytest

from kernel_probe.candidates import Candidate
from kernel_probe.isolation.protocol import TimeReply, TryReply
from kernel_probe.probe import judge
from kernel_probe.probe.report import Problem, Report, static_problem

HERE = Candidate("x.here", ("LayerNorm",), "layer_norm", "torch.nn.LayerNorm")
ABSENT = dataclasses.replace(HERE, distribution="kp-surely-absent", module="kp_surely_absent")


def _report() -> Report:
    return Report(
        "x.here", "torch.nn.LayerNorm", "LayerNorm", "layer_norm", "cpu", "accepted", ["earlier"]
    )


def test_nothing_rules_out_an_installed_candidate_for_its_own_slot():
    assert static_problem(HERE, "LayerNorm", "cpu") is None
    assert static_problem(HERE, "LayerNorm", "cpu", detail=True) is None


def test_the_wrong_semantics_is_rejected_before_anything_else():
    on_gpu = dataclasses.replace(ABSENT, devices=("cuda",))
    assert static_problem(on_gpu, "RMSNorm", "cpu") == Problem(
        "rejected", "semantics: layer_norm != rms_norm"
    )


def test_another_device_is_tried_only_where_it_is_installed():
    gpu = dataclasses.replace(HERE, devices=("cuda",))
    why = "runs on cuda; this device is cpu"
    assert static_problem(gpu, "LayerNorm", "cpu") == Problem("unavailable", why)
    assert static_problem(gpu, "LayerNorm", "cpu", detail=True) == Problem(
        "unavailable", why, try_it=True
    )
    absent = dataclasses.replace(ABSENT, devices=("cuda",))
    # a --pin: the short reason
    assert static_problem(absent, "LayerNorm", "cpu") == Problem("unavailable", why)
    assert static_problem(absent, "LayerNorm", "cpu", detail=True) == Problem(
        "unavailable", why + " (and it is not installed)"
    )
    blas = dataclasses.replace(gpu, blas="cublaslt")
    assert static_problem(blas, "LayerNorm", "cpu", detail=True) == Problem(
        "unavailable", why + " (cublaslt is a cuda BLAS library)"
    )


def test_hardware_comes_before_installing():
    archs = dataclasses.replace(ABSENT, archs={"cuda": ("sm_90",)})
    problem = static_problem(archs, "LayerNorm", "cuda", "sm_80", detail=True)
    assert problem is not None and problem.status == "unavailable"
    assert problem.reason.startswith("needs a GPU arch sm_90 on cuda") and problem.reason.endswith(
        "not installed)"
    )
    missing = static_problem(ABSENT, "LayerNorm", "cuda", "sm_90")
    assert missing is not None and missing.reason.startswith("not installed: kp-surely-absent")


def test_compiled_candidates_are_skipped_on_a_cpu_unless_asked():
    compiled = dataclasses.replace(HERE, compiled=True)
    problem = static_problem(compiled, "LayerNorm", "cpu")
    assert (
        problem is not None and problem.status == "skipped" and "--with-compile" in problem.reason
    )
    assert static_problem(compiled, "LayerNorm", "cpu", with_compile=True) is None
    assert static_problem(compiled, "LayerNorm", "cuda") is None


@pytest.mark.parametrize(
    ("tried", "tail"),
    [
        (
            TryReply(ran=False, error="RuntimeError: 0 active drivers"),
            "; trying it raised RuntimeError: 0 active drivers",
        ),
        (
            TryReply(ran=True),
            "; it ran here, but not as the kernel it is declared to be, so it is not offered",
        ),
        (
            TryReply(ran=False, error="E", interpreted=True),
            " (tried under Triton's interpreter, TRITON_INTERPRET=1); trying it raised E",
        ),
    ],
)
def test_what_trying_it_showed_is_said(tried, tail):
    problem = Problem("unavailable", "runs on cuda; this device is cpu", try_it=True)
    assert judge.judge_tried(problem, HERE, tried) == problem.reason + tail


def test_a_dying_worker_names_the_budget_only_when_it_ran_out_of_time():
    timeout = judge.died(
        "timeout", "no answer within 20 s (killed)", "importing a.B", ("import", 20.0)
    )
    assert timeout == Problem(
        "timeout", "importing a.B: no answer within 20 s (killed) (import budget 20 s)"
    )
    assert judge.died("crashed", "killed by SIGSEGV", "checks", ("check", 30.0)) == Problem(
        "crashed", "killed by SIGSEGV"
    )


def test_an_import_that_raised_is_absent_or_broken():
    assert judge.failed_import("a.B", "import", "ModuleNotFoundError: a").status == "unavailable"
    assert judge.failed_import("a.B", "exception", "ValueError: x").status == "crashed"
    assert judge.tampered("importing a.B", ["layer_norm"]).status == "rejected"


def test_tampering_while_timed_rejects_and_skips_the_shape_checks():
    report = _report()
    wrong = {"shape": "64x32", "dtype": "float32", "regime": "true", "check": {"error": "boom"}}
    judge.judge_timing(
        report, TimeReply(candidate="x", device="cpu", rows=[wrong], tampered=("layer_norm",))
    )
    assert report.status == "rejected"
    assert report.reasons == ["while timing it replaced torch's own layer_norm", "earlier"]


def test_a_wrong_timed_shape_rejects_naming_it_first():
    report = _report()
    right = {
        "shape": "64x32",
        "dtype": "float32",
        "regime": "true",
        "check": {"errors": {"y": [1e-7, 1e-7]}},
    }
    wrong = {"shape": "128x32", "dtype": "float32", "regime": "true", "check": {"error": "boom"}}
    judge.judge_timing(report, TimeReply(candidate="x", device="cpu", rows=[right]))
    assert report.status == "accepted" and report.reasons == ["earlier"]
    judge.judge_timing(report, TimeReply(candidate="x", device="cpu", rows=[right, wrong]))
    assert report.status == "rejected" and report.reasons[0].startswith(
        "at the model's shape 128x32"
    )
    judge.judge_timing_died(report, "timeout", "no answer")
    assert report.status == "timeout" and report.reasons[0] == "while timing: no answer"


# ---- the statistics besides the max (issue 35) ---------------------------------------------------
def _stats(got, base, ref, rows=True):
    from kernel_probe.probe.measure import compare

    return compare(got, base, ref, rows=rows)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rounding_noise_is_no_bias_and_a_shift_of_half_an_ulp_is(dtype):
    import torch

    from kernel_probe.probe.tolerance import judge_output

    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(37, 1000, generator=gen, dtype=torch.float64)
    low = getattr(torch, dtype)
    torch_nn = ref.to(low)  # one rounding to nearest: what torch.nn's output carries
    # noisier, unbiased
    other = (ref + torch.randn(37, 1000, generator=gen, dtype=torch.float64) * 1e-3).to(low)
    errors, stats = _stats(other, torch_nn, ref)
    assert judge_output("y", errors, stats, dtype)[1] == []
    eps = {"bfloat16": 2**-7, "float16": 2**-10}[dtype]
    shifted = (ref + 0.5 * eps * ref.abs().mean()).to(low)  # within the max and RMS tolerances
    errors, stats = _stats(shifted, torch_nn, ref)
    ratio, over = judge_output("y", errors, stats, dtype)
    assert [e.statistic for e in over] == ["bias"] and ratio > 1, (errors, stats)
    assert "y bias (mean signed error)" in str(over[0]) and "torch.nn's" in str(over[0])


def test_the_bias_rule_false_alarm_rate_on_pure_rounding_noise():
    """K_SIGMA = 6: 2e-9 per group under the normal approximation; 200 tensors of 37 rows of
    unbiased uniform noise (7,400 groups) raise none, where 3 standard errors would have raised
    ~20."""
    import torch

    from kernel_probe.probe.tolerance import K_SIGMA, judge_output, limits

    gen = torch.Generator().manual_seed(1)
    flagged, at_three = 0, 0
    for _ in range(200):
        ref = torch.randn(37, 256, generator=gen, dtype=torch.float64) + 3.0
        noise = lambda: (torch.rand(37, 256, generator=gen, dtype=torch.float64) - 0.5) * 1e-3  # noqa: E731
        errors, stats = _stats(ref + noise(), ref + noise(), ref)
        flagged += bool(judge_output("y", errors, stats, "float32")[1])
        lim = limits("float32", errors[1], stats)
        at_three += (
            stats["bias"][0]
            > 4 * stats["bias"][1] + (lim.bias - 4 * stats["bias"][1]) * 3 / K_SIGMA
        )
    assert flagged == 0 and K_SIGMA == 6.0
    assert at_three < 200  # the rule's K matters: fewer standard errors would flag correct kernels


def test_without_stats_only_the_max_is_judged():
    from kernel_probe.probe.tolerance import judge_output, limits

    assert limits("float32", 1e-7).rms == float("inf")
    assert judge_output("y", [1e-7, 1e-7], None, "float32") == (
        pytest.approx(1e-7 / (4e-7 + 2 * 2**-23)),
        [],
    )
