"""The zoo: the judge must accept the correct fakes and reject each wrong one for the right
reason."""

from __future__ import annotations

import importlib.util
import re

import pytest

from kernel_probe import candidates as cands
from kernel_probe.isolation.worker import WorkerPool
from kernel_probe.probe.check import check_all, dtype_plan

PLAN = dtype_plan(["float32", "bfloat16", "float16"])
ZOO = {
    "LayerNorm": [
        "norms.GoodLayerNorm",
        "norms.ExtraStateLayerNorm",
        "norms.NestedLayerNorm",
        "prints_on_import.ChattyLayerNorm",
        "norms.WrongEpsLayerNorm",
        "norms.NoBiasLayerNorm",
        "norms.IgnoresWeightLayerNorm",
        "norms.RMSNormAsLayerNorm",
        "norms.OnePassLayerNorm",
        "norms.LowPrecisionLayerNorm",
        "norms.ContiguousOnlyLayerNorm",
        "norms.CachingLayerNorm",
        "norms.InPlaceBackwardLayerNorm",
        "norms.MutatesInputLayerNorm",
        "norms.NaNLayerNorm",
        "norms.WrongBackwardLayerNorm",
        "norms.UpcastingLayerNorm",
        "norms.RoundUpLayerNorm",
        "norms.AbortInForwardLayerNorm",
        "abort_on_import.X",
        "raise_on_import.X",
        "missing_dependency.X",
    ],
    "RMSNorm": ["norms.GoodRMSNorm"],
    "Linear": ["norms.GoodLinear", "norms.WrongLinear"],
}


@pytest.fixture(scope="module")
def results():
    offered = [
        cands.from_command_line(f"{slot}=kp_zoo.{name}")
        for slot, names in ZOO.items()
        for name in names
    ]
    # a registry candidate that declares RMSNorm semantics, offered for the LayerNorm slot
    offered.append(
        cands.Candidate("zoo.rms_for_ln", ("LayerNorm",), "rms_norm", "kp_zoo.norms.GoodRMSNorm")
    )
    candidates, problems = cands.registry(offered, entry_points=False)
    assert problems == []
    with WorkerPool() as pool:
        # a generous timeout for everything that should answer (the machine may be busy) ...
        reports = check_all(list(ZOO), candidates, "cpu", PLAN, timeout=120, workers=pool)
        started = (pool.shared.started, pool.fresh)
        # ... and a short one for the candidate that never will
        hang = [cands.from_command_line("LayerNorm=kp_zoo.hang_on_import.X")]
        reports["LayerNorm"] += check_all(
            ["LayerNorm"], hang, "cpu", PLAN, import_timeout=5, workers=pool
        )["LayerNorm"]
    by_id = {r.id: r for rs in reports.values() for r in rs}
    return by_id, started


def rep(results, name):
    by_id, _ = results
    return by_id[name if name.startswith(("torch.", "liger.", "zoo.")) else f"custom:kp_zoo.{name}"]


def row(report, dtype, regime="true"):
    return next(v for v in report.verdicts if (v.dtype, v.regime) == (dtype, regime))


@pytest.mark.parametrize("name", ["torch.layer_norm", "torch.rms_norm", "torch.linear"])
@pytest.mark.slow
def test_torch_nn_accepted_everywhere_on_cpu(results, name):
    r = rep(results, name)
    assert r.status == "accepted", r.reasons
    assert {(v.dtype, v.regime) for v in r.verdicts if v.status == "accepted"} >= {
        ("float32", "true"),
        ("bfloat16", "true"),
        ("bfloat16", "mixed"),
    }
    assert r.twin["state_dict"] == "interchangeable" and r.twin["max_error"] == 0.0


@pytest.mark.parametrize(
    "name",
    [
        "norms.GoodLayerNorm",
        "norms.GoodRMSNorm",
        "norms.GoodLinear",
        "prints_on_import.ChattyLayerNorm",
    ],
)
def test_correct_fakes_are_accepted(results, name):
    r = rep(results, name)
    assert r.status == "accepted", r.reasons
    assert all(v.worst_ratio < 1 for v in r.verdicts)


EXCESS = re.compile(
    r"\b(?:y|dx|dweight|dbias|dskip) (error|RMS error|bias \(mean signed error\)) \S+ > tolerance"
)


def test_a_bias_alone_is_rejected_by_the_bias_statistic(results):
    """Issue 35: rounding up instead of to nearest keeps every element within one ulp (max and RMS
    error about twice torch.nn's: within the tolerance), but its mean error is half an ulp on every
    element, many standard errors of rounding: rejected in every low-precision row, by the bias
    alone."""
    r = rep(results, "norms.RoundUpLayerNorm")
    assert r.status == "rejected"
    for dtype, regime in (
        ("bfloat16", "true"),
        ("bfloat16", "mixed"),
        ("float16", "true"),
        ("float16", "mixed"),
    ):
        v = row(r, dtype, regime)
        assert v.status == "rejected" and v.failed, (dtype, regime, v.reasons)
        over = [m.group(1) for reason in v.reasons for m in EXCESS.finditer(reason)]
        assert over and set(over) == {"bias (mean signed error)"}, v.reasons
        assert 1 < v.worst_ratio < 10
    # one rounding's bias is below torch.nn's own float32 noise
    assert row(r, "float32").status == "accepted"


def test_extra_state_is_accepted_with_a_migration(results):
    r = rep(results, "norms.ExtraStateLayerNorm")
    assert r.status == "accepted"
    assert r.twin["state_dict"] == "migrate" and r.twin["migration"] == ["drop:_extra_state"]


def test_nested_parameters_map_by_renaming(results):
    r = rep(results, "norms.NestedLayerNorm")
    assert r.status == "accepted"
    assert r.twin["state_dict"] == "migrate" and r.twin["migration"] == [
        "rename:norm.weight->weight",
        "rename:norm.bias->bias",
    ]


# (fake, dtype, regime, a failed check that must be among the reasons, words in the reasons)
WRONG = [
    ("norms.WrongEpsLayerNorm", "float32", "true", "tiny-variance:y", "eps"),
    ("norms.NoBiasLayerNorm", "float32", "true", "random:dbias", "dbias error inf"),
    ("norms.IgnoresWeightLayerNorm", "float32", "true", "random:dweight", "dweight error"),
    ("norms.OnePassLayerNorm", "float32", "true", "large-mean:y", "cancellation"),
    ("norms.LowPrecisionLayerNorm", "float16", "true", "large-magnitude:y", "overflow"),
    ("norms.ContiguousOnlyLayerNorm", "float32", "true", "non-contiguous-3d:y", "non-contiguous"),
    ("norms.CachingLayerNorm", "float32", "true", "sequence:y", "state kept between calls"),
    (
        "norms.InPlaceBackwardLayerNorm",
        "float32",
        "true",
        "grad-output-modified",
        "modifies grad_output in place",
    ),
    ("norms.InPlaceBackwardLayerNorm", "float32", "true", "residual:dskip", "skip"),
    ("norms.MutatesInputLayerNorm", "float32", "true", "input-modified", "modifies its input"),
    ("norms.NaNLayerNorm", "float32", "true", "random:y", "inf"),
    ("norms.WrongBackwardLayerNorm", "float32", "true", "random:dx", "dx error"),
    # plain bf16: the next bf16 Linear refuses its float32 output (judged by consequence in the
    # blocks)
    (
        "norms.UpcastingLayerNorm",
        "bfloat16",
        "true",
        "output-dtype",
        "output dtype float32 (torch.nn: bfloat16)",
    ),
    ("norms.WrongLinear", "float32", "true", "random:y", "y error"),
]


@pytest.mark.parametrize(
    "name,dtype,regime,check,words", WRONG, ids=[f"{w[0]}-{w[3]}" for w in WRONG]
)
def test_wrong_fakes_are_rejected_for_the_right_reason(results, name, dtype, regime, check, words):
    r = rep(results, name)
    assert r.status == "rejected"
    v = row(r, dtype, regime)
    assert v.status == "rejected"
    assert check in v.failed, v.failed
    text = " ".join(v.reasons) + " " + " ".join(r.reasons)
    assert words in text, text


def test_upcasting_under_autocast_is_accepted_by_consequence_and_recorded(results):
    # under autocast the next Linear casts to bf16 anyway and the post-norm block is more precise:
    # the dtype difference is recorded (a float32 activation costs memory), not a rejection
    r = rep(results, "norms.UpcastingLayerNorm")
    v = row(r, "bfloat16", "mixed")
    assert v.status == "accepted" and "output-dtype" not in v.failed
    assert any("accepted by consequence" in c for c in v.changes), v.changes
    assert "the pre-norm block raised RuntimeError" in " ".join(row(r, "bfloat16", "true").reasons)


def test_wrong_backward_has_a_correct_forward(results):
    v = row(rep(results, "norms.WrongBackwardLayerNorm"), "float32")
    assert not any(f.endswith(":y") for f in v.failed)


def test_rmsnorm_offered_as_layernorm_names_the_semantics(results):
    r = rep(results, "norms.RMSNormAsLayerNorm")
    assert r.status == "rejected"
    assert r.reasons[0].endswith(
        "semantics: rms_norm != layer_norm (its output matches a rms_norm reference)"
    )
    declared = rep(results, "zoo.rms_for_ln")
    assert declared.status == "rejected" and declared.reasons == [
        "semantics: rms_norm != layer_norm"
    ]


@pytest.mark.parametrize(
    "name,status,words",
    [
        ("abort_on_import.X", "crashed", "SIGABRT"),
        ("norms.AbortInForwardLayerNorm", "crashed", "SIGABRT"),
        ("hang_on_import.X", "timeout", "no answer within 5 s (killed) (import budget 5 s)"),
        ("raise_on_import.X", "crashed", "RuntimeError: CUDA driver initialization failed"),
        (
            "missing_dependency.X",
            "unavailable",
            "No module named 'kp_this_dependency_does_not_exist'",
        ),
    ],
)
def test_crashing_and_hanging_fakes(results, name, status, words):
    r = rep(results, name)
    assert r.status == status
    assert any(words in reason for reason in r.reasons), r.reasons


def test_torch_shares_one_worker_and_every_library_gets_its_own(results):
    shared, fresh = results[1]
    assert shared == 1  # started before any library was imported, never restarted
    # kp_zoo's worker (started again after each of the 2 candidates that killed it: abort on import,
    # abort in forward) and liger's (tried on this CPU): nothing of either ran in torch's worker
    assert fresh >= 3, fresh


def test_crash_reasons_do_not_carry_earlier_output(results):
    r = rep(results, "norms.AbortInForwardLayerNorm")
    assert "liger" not in " ".join(r.reasons)


@pytest.mark.skipif(
    importlib.util.find_spec("liger_kernel") is None,
    reason="liger-kernel is not installed here (pip install liger-kernel)",
)
@pytest.mark.parametrize("name", ["liger.layer_norm", "liger.rms_norm"])
def test_real_liger_on_cpu_is_unavailable_with_its_reason(results, name):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: liger runs here")
    r = rep(results, name)
    assert r.status == "unavailable"
    assert "this device is cpu" in r.reasons[0] and "0 active drivers" in r.reasons[0]
