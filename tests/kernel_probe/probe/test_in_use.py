"""Issue 55 for Activation, Attention and GatedMLP: each kernel judged as training and inference
use it (a second life, eval, no_grad, inference_mode, transposed and strided views, a load, large
magnitudes), one fake per bug class rejected for its own reason (tests/fakes/kp_zoo/inuse.py),
torch's own accepted with every such case measured."""

from __future__ import annotations

import pytest

from kernel_probe.probe import lifecycle
from tests.kernel_probe.probe import test_activation as act

ACTIVATION_CASES = {*lifecycle.INFERENCE, *lifecycle.VIEWS, lifecycle.AFTER_UPDATE}


def _failed(report, dtype="float32", regime="true"):
    v = next(v for v in report.verdicts if (v.dtype, v.regime) == (dtype, regime))
    return v, {f.split(":")[0] for f in v.failed}


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
    _, report = act.verdict(f"kp_zoo.inuse.{fake}")
    assert report.status == "rejected"
    v, failed = _failed(report)
    assert failed == cases, v.failed
    assert any(reason in r for r in report.reasons), report.reasons
