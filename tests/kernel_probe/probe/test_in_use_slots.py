"""Issue 55 for Activation, Attention and GatedMLP: each kernel judged as training and inference
use it (a second life, eval, no_grad, inference_mode, transposed and strided views, a load, large
magnitudes), one fake per bug class rejected for its own reason (tests/fakes/kp_zoo/inuse.py),
torch's own accepted with every such case measured."""

from __future__ import annotations

import json

import pytest

import kernel_lock
from kernel_probe import candidates as cands
from kernel_probe.cli import main
from kernel_probe.probe import lifecycle
from kernel_probe.probe.report import report_base
from kernel_probe.slots import attention_kernels, gated_mlp, gated_mlp_kernels
from tests.kernel_probe.probe import test_activation as act
from tests.kernel_probe.probe import test_attention as attn

ACTIVATION_CASES = {*lifecycle.INFERENCE, *lifecycle.VIEWS, lifecycle.AFTER_UPDATE}


def _failed(report, dtype="float32", regime="true"):
    v = next(v for v in report.verdicts if (v.dtype, v.regime) == (dtype, regime))
    return v, {f.split(":")[0] for f in v.failed}


def _rejected_by(verdict, fake, cases, reason):
    """``fake`` (kp_zoo.inuse) rejected by exactly ``cases`` in float32, naming ``reason``."""
    _, report = verdict(f"kp_zoo.inuse.{fake}")
    assert report.status == "rejected"
    v, failed = _failed(report)
    assert failed == cases, v.failed
    assert any(reason in r for r in report.reasons), report.reasons


# ---- Activation ----------------------------------------------------------------------------------
def test_torchs_activation_is_accepted_with_every_case_measured():
    raw, report = act.verdict("torch.gelu", dtypes=act.ALL)
    assert report.status == "accepted", report.reasons
    for row in raw.rows:
        assert set(row["cases"]) >= ACTIVATION_CASES
        assert set(row["cases"][lifecycle.EVAL]) == {"y"}  # inference: the forward only
        assert set(row["cases"][lifecycle.STRIDED]) == {"y", "dx"}


@pytest.mark.parametrize(
    "fake,cases,reason",
    [
        ("EvalTanhGELU", {"eval"}, "eval (in eval mode): y error"),
        ("NoGradTanhGELU", {"no-grad", "inference-mode"}, "no-grad (under torch.no_grad()): y"),
        ("StrideOneGELU", {"transposed", "strided", "non-contiguous"}, "transposed (on a trans"),
    ],
)
def test_an_activation_wrong_in_use_is_rejected_for_that_use(fake, cases, reason):
    _rejected_by(act.verdict, fake, cases, reason)


# ---- GatedMLP ------------------------------------------------------------------------------------
GATED_ALL = [*act.ALL, ("float16", "mixed")]
FP16 = [("float16", "true"), ("float16", "mixed")]
GATED_CASES = {*lifecycle.HINTS, "random", "wide-gate"}


def _gated(target_or_id, implementation, dtypes):
    """The GatedMLP check and verdict, in-process (torch's own: anemoi's layer where installed)."""
    if target_or_id.startswith("kp_"):
        cand = cands.from_command_line(f"GatedMLP={target_or_id}")
    else:
        cand = next(c for c in cands.builtin() if c.id == target_or_id)
    overrides = {"mlp_implementation": implementation}
    raw = gated_mlp_kernels.check(cand, "cpu", dtypes, canonical_overrides=overrides)
    return raw, gated_mlp.judge(raw, cand, "cpu", report_base(cand, "GatedMLP", "cpu"))


@pytest.mark.parametrize("implementation", ["swiglu", "geglu", "reglu"])
def test_torchs_gated_mlp_is_accepted_with_every_case_measured(implementation):
    raw, report = _gated("torch.gated_mlp", implementation, GATED_ALL)
    assert report.status == "accepted", report.reasons
    for row in raw.rows:
        low = row["dtype"] in ("float16", "bfloat16")
        assert set(row["cases"]) == GATED_CASES | ({"overflow"} if low else set())
        assert set(row["cases"][lifecycle.NO_GRAD]) == {"y"}


@pytest.mark.parametrize(
    "fake,cases,dtypes,reason",
    [
        ("CachedWeightGatedMLP", {"after-update"}, act.ALL, "after-update (after an in-place"),
        ("Conv1DLoadGatedMLP", {"loaded"}, act.ALL, "loaded (after load_state_dict): y error"),
        ("ProductFirstGatedMLP", {"overflow"}, FP16, "overflow (gate -6..-2"),
    ],
)  # fmt: skip
def test_a_gated_mlp_wrong_in_use_is_rejected_for_that_use(fake, cases, dtypes, reason):
    _, report = _gated(f"kp_zoo.inuse.{fake}", "swiglu", dtypes)
    assert report.status == "rejected"
    for v in report.verdicts:
        assert {f.split(":")[0] for f in v.failed} == cases, (v.dtype, v.regime, v.failed)
    assert all(reason in r for r in report.reasons), report.reasons


def test_the_order_of_operations_passes_where_nothing_overflows():
    _, report = _gated("kp_zoo.inuse.ProductFirstGatedMLP", "swiglu", act.ALL[:3])
    assert report.status == "accepted", report.reasons


# ---- Attention -----------------------------------------------------------------------------------
ATTENTION_CASES = {*lifecycle.INFERENCE, *lifecycle.VIEWS, lifecycle.AFTER_UPDATE}


@pytest.mark.parametrize("cid", ["torch.sdpa", "torch.sdpa.math", "torch.sdpa.flash"])
def test_torchs_attention_is_accepted_with_every_case_measured(cid):
    raw, report = attn.verdict(cid, {"causal": True}, attn.BOTH)
    assert report.status == "accepted", report.reasons
    for row in raw.rows:
        assert set(row["cases"]) >= ATTENTION_CASES
        assert set(row["cases"][lifecycle.INFERENCE_MODE]) == {"out"}
        assert set(row["cases"][lifecycle.STRIDED]) == set(attention_kernels.OUTPUTS)


@pytest.mark.parametrize(
    "fake,cases,reason",
    [
        ("EvalScaleAttention", {"eval"}, "eval (in eval mode): out error"),
        ("NoGradHalfAttention", {"no-grad", "inference-mode"}, "no-grad (under torch.no_grad())"),
        # the second length is a slice of the sequence: a view too
        ("StrideOneAttention", {*lifecycle.VIEWS, "non-contiguous", "second-length"}, "strided"),
    ],
)
def test_an_attention_wrong_in_use_is_rejected_for_that_use(fake, cases, reason):
    _rejected_by(attn.verdict, fake, cases, reason)


def test_a_second_call_that_returns_the_first_calls_output_is_rejected():
    _, report = attn.verdict("kp_zoo.inuse.FirstOutputAttention")
    assert report.status == "rejected"
    v, failed = _failed(report)
    assert lifecycle.AFTER_UPDATE in failed, v.failed


# ---- through `kernel-probe check`: the probe's check loop, each candidate in its worker -------
IN_CHECK = {
    "Activation": {"EvalTanhGELU": "eval", "NoGradTanhGELU": "no-grad", "StrideOneGELU": "strided"},
    "Attention": {
        "EvalScaleAttention": "eval",
        "NoGradHalfAttention": "inference-mode",
        "StrideOneAttention": "transposed",
        "FirstOutputAttention": "after-update",
        "RoundedDeltaAttention": "sharp-equal-values",
    },
    "GatedMLP": {
        "CachedWeightGatedMLP": "after-update",
        "Conv1DLoadGatedMLP": "loaded",
        "ProductFirstGatedMLP": "overflow",
    },
}


@pytest.mark.slow  # three slots' workers, float32 and float16: ~40 s on 2 cores
def test_kernel_probe_check_rejects_each_for_its_reason_and_accepts_torchs(capsys):
    argv = ["check", "--json", "--dtype", "fp32", "--dtype", "fp16"]
    for slot, fakes in IN_CHECK.items():
        argv += ["--slot", slot]
        argv += [a for fake in fakes for a in ("--candidate", f"{slot}=kp_zoo.inuse.{fake}")]
    assert main(argv) == 0
    reports = json.loads(capsys.readouterr().out)["slots"]
    for slot, fakes in IN_CHECK.items():
        by_id = {r["id"]: r for r in reports[slot]}
        for fake, case in fakes.items():
            r = by_id[f"custom:kp_zoo.inuse.{fake}"]
            assert r["status"] == "rejected", (fake, r["reasons"])
            assert any(f": {case} (" in x for x in r["reasons"]), (fake, r["reasons"])
        default = next(r for r in reports[slot] if r["id"].startswith("torch."))
        assert default["status"] == "accepted", default["reasons"]


def test_a_backward_whose_delta_comes_from_a_rounded_softmax_is_rejected_in_bf16_and_fp16():
    """anemoi-core #1027's class: dq and dk must vanish on the sharp case; judged with float32's
    floor (every correct path forms them in float32), not the dtype's, which let 1e-3 through."""
    _, report = attn.verdict("kp_zoo.inuse.RoundedDeltaAttention", dtypes=attn.BOTH + FP16[:1])
    assert report.status == "rejected"
    for v in report.verdicts:
        flawed = {"sharp-equal-values:dq", "sharp-equal-values:dk"}
        expected = set() if v.dtype == "float32" else flawed
        assert set(v.failed) == expected, (v.dtype, v.failed)
        if expected:
            assert v.ratios["sharp-equal-values"]["dq"] > 20


@pytest.mark.slow  # a probe of three slots, fp16-mixed: ~40 s on 2 cores
def test_the_probe_records_each_rejected_for_its_reason(tmp_path):
    path = tmp_path / "kernel-lock.toml"
    argv = ["--out", str(path), "--precision", "16-mixed", "--shape", "64x96"]
    argv += ["--attention", "2x32x64", "--no-plugins"]
    for slot, fakes in IN_CHECK.items():
        argv += ["--slot", slot]
        argv += [a for fake in fakes for a in ("--candidate", f"{slot}=kp_zoo.inuse.{fake}")]
    assert main(argv) == 0
    lock = kernel_lock.load(path, strict=True)
    for slot, fakes in IN_CHECK.items():
        assert lock.slots[slot].implementation.startswith("torch."), slot
        rejected = {r.implementation: r for r in lock.slots[slot].rejected}
        for fake, case in fakes.items():
            r = rejected[f"custom:kp_zoo.inuse.{fake}"]
            assert r.status == "rejected", (fake, r.reasons)
            assert any(f": {case} (" in x for x in r.reasons), (fake, r.reasons)
