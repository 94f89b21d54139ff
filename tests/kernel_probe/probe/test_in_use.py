"""Issue 55 for the norms and Linear (kernel_probe.probe.inuse): a kernel judged as training and
inference use it. One kp_zoo fake per bug class, each right on a fresh module's first training call
and rejected by its own case (named in the reasons by its hint, kernel_probe.probe.lifecycle), in
the check (in-process, then `kernel-probe check`) and in the probe's lock; torch.nn and the right
fakes accepted with every later case measured."""

from __future__ import annotations

import json

import pytest

from kernel_probe import candidates as cands
from kernel_probe.probe import lifecycle
from kernel_probe.probe.correctness import check
from kernel_probe.probe.judge import judge_row
from tests.conftest import run_cli

HIDDEN = 64  # small: the fakes' bugs do not depend on the width
LATER = {*lifecycle.INFERENCE, lifecycle.AFTER_UPDATE, lifecycle.LOADED, *lifecycle.VIEWS}
# fake -> the cases that reject it, and only those
WRONG = {
    "Linear=kp_zoo.norms.StaleWeightLinear": {"after-update"},
    "LayerNorm=kp_zoo.norms.StaleCopyLayerNorm": {"after-update"},
    "LayerNorm=kp_zoo.norms.EvalUnbiasedLayerNorm": {"eval"},
    "LayerNorm=kp_zoo.norms.NoGradNoBiasLayerNorm": {"no-grad", "inference-mode"},
    "Linear=kp_zoo.norms.NoGradNoBiasLinear": {"no-grad", "inference-mode"},
    "Linear=kp_zoo.norms.InferenceModeNoBiasLinear": {"inference-mode"},
    "LayerNorm=kp_zoo.norms.StrideOneLayerNorm": {"transposed", "strided"},
    "Linear=kp_zoo.norms.StrideOneLinear": {"transposed", "strided"},
    "Linear=kp_zoo.norms.SquareTransposingLinear": {"loaded"},
}
RIGHT = [
    "LayerNorm=torch.layer_norm",
    "RMSNorm=torch.rms_norm",
    "Linear=torch.linear",
    "LayerNorm=kp_zoo.norms.GoodLayerNorm",
    "LayerNorm=kp_zoo.norms.GammaBetaLayerNorm",  # renamed keys: loaded through the layout
    "Linear=kp_zoo.norms.TransposedLinear",  # a transposed weight: loaded through the layout
    "LayerNorm=kp_zoo.norms.ExtraStateLayerNorm",  # _extra_state kept through the round trip
]


def _candidate(spec):
    slot, _, target = spec.partition("=")
    if target.startswith("torch."):
        return slot, next(c for c in cands.builtin() if c.id == target)
    return slot, cands.from_command_line(spec)


def _row(spec, dtype="float32", regime="true"):
    slot, cand = _candidate(spec)
    (row,) = check(cand, slot, "cpu", [(dtype, regime)], hidden=HIDDEN).rows
    return cand, row


def _failed_cases(verdict):
    return {f.split(":")[0] for f in verdict.failed}


@pytest.mark.parametrize("spec", sorted(WRONG))
def test_each_bug_class_is_rejected_by_its_own_case(spec):
    cand, row = _row(spec)
    v = judge_row(cand.id, "cpu", cand.semantics, row)
    assert v.status == "rejected" and _failed_cases(v) == WRONG[spec], (v.failed, v.reasons)
    for case in WRONG[spec]:
        assert any(r.startswith(f"{case} ({lifecycle.HINTS[case]}): ") for r in v.reasons)


@pytest.mark.parametrize("spec", RIGHT)
@pytest.mark.parametrize("dtype,regime", [("float32", "true"), ("bfloat16", "mixed")])
def test_right_kernels_pass_every_later_case(spec, dtype, regime):
    cand, row = _row(spec, dtype, regime)
    assert set(row["cases"]) >= LATER, sorted(row["cases"])
    v = judge_row(cand.id, "cpu", cand.semantics, row)
    assert v.status == "accepted", v.reasons
    for case in LATER - {*lifecycle.INFERENCE, lifecycle.LOADED}:  # forward and backward
        assert {"y", "dx", "dweight"} <= set(row["cases"][case]), (case, row["cases"][case])
    for case in (*lifecycle.INFERENCE, lifecycle.LOADED):  # outputs only
        assert set(row["cases"][case]) == {"y"}, (case, row["cases"][case])


def test_the_no_grad_fast_path_is_a_verdict_and_its_twin_error_is_the_same():
    """The twin check's no-grad forward measured the error and recorded it only; now the no-grad
    case judges it."""
    cand, row = _row("Linear=kp_zoo.norms.NoGradNoBiasLinear")
    assert row["twin"]["max_error"] > 0.1
    got, torch_nn = row["cases"]["no-grad"]["y"]
    assert got > 0.1 and torch_nn < 1e-6


def test_the_determinism_check_builds_fresh_candidates(monkeypatch):
    """A deep copy would carry what the first instance holds (a cached weight): no module is
    copied, the candidate is built once for the row, twice for the determinism check and once for
    the round trip of its state dict."""
    import copy

    import torch

    from kernel_probe.probe import measure

    deepcopy, build, built = copy.deepcopy, measure.build, []

    def no_module(obj, *a, **k):
        assert not isinstance(obj, torch.nn.Module), "a module was deep-copied"
        return deepcopy(obj, *a, **k)

    def counted(cand, *a, **k):
        built.append(cand.target)
        return build(cand, *a, **k)

    monkeypatch.setattr(copy, "deepcopy", no_module)
    monkeypatch.setattr(measure, "build", counted)
    _, row = _row("LayerNorm=kp_zoo.norms.StaleCopyLayerNorm")
    assert row["nondeterministic"] is None
    assert (
        built.count("kp_zoo.norms.StaleCopyLayerNorm") == 1 + 1 + 2 + 1
    )  # fresh, row, twice, load


# ---- the same, through `kernel-probe check` and the probe's lock (workers) ----------------------
ISSUE_FAKES = [c for spec in WRONG for c in ("--candidate", spec)]
SLOTS = ["--slot", "LayerNorm", "--slot", "Linear"]


@pytest.mark.slow  # a worker per library, every fake: ~40 s
def test_kernel_probe_check_rejects_each_for_its_reason(capsys):
    args = ["check", *SLOTS, *ISSUE_FAKES, "--dtype", "float32", "--hidden", str(HIDDEN), "--json"]
    _, out, err = run_cli(args, capsys)
    body = json.loads(out)
    by_id = {c["id"]: c for cs in body["slots"].values() for c in cs}
    for spec, cases in WRONG.items():
        c = by_id[f"custom:{spec.partition('=')[2]}"]
        assert c["status"] == "rejected", (spec, c["reasons"])
        failed = {f.split(":")[0] for e in c["evidence"] for f in e["failed"]}
        assert failed == cases, (spec, failed)
        assert all(lifecycle.HINTS[case] in " ".join(c["reasons"]) for case in cases)
    assert by_id["torch.layer_norm"]["status"] == by_id["torch.linear"]["status"] == "accepted"


@pytest.mark.slow  # a whole probe: ~60 s
def test_the_probe_records_each_rejection_with_its_reason(tmp_path, capsys):
    import kernel_lock

    out = tmp_path / "kernel-lock.toml"
    args = ["--out", out, "--shape", "64x64", "--precision", "32-true", "--reps", "2", *SLOTS]
    code, _, err = run_cli([*args, *ISSUE_FAKES], capsys)
    assert code == 0, err
    lock = kernel_lock.load(out, trust=["kp_zoo"], emit_warnings=False)
    rejected = {
        r.implementation: r for slot in ("LayerNorm", "Linear") for r in lock.slots[slot].rejected
    }
    for spec, cases in WRONG.items():
        r = rejected[f"custom:{spec.partition('=')[2]}"]
        assert r.status == "rejected", (spec, r.reasons)
        assert all(lifecycle.HINTS[case] in " ".join(r.reasons) for case in cases), r.reasons
    assert lock.slots["LayerNorm"].implementation == "torch.layer_norm"
