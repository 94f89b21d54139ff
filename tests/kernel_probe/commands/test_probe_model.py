"""``kernel-probe --model SPEC`` end to end on this CPU: the lock pins each slot the model calls,
with the model's semantics, timed at its shapes, records the trace, and ``--check`` holds a lock
to it. The trace is a hand-built one (``frommodel.trace`` patched) where the tracer is not the
subject; the real tracer's run on tests/models/block.py follows."""

from __future__ import annotations

import json

import pytest

import kernel_lock
from kernel_probe.probe import frommodel
from tests.conftest import ROOT, run_cli
from tests.kernel_probe.probe.test_frommodel import SPEC, block

SMALL = ["--precision", "32-true", "--reps", "2"]


def _timed(lock, slot):
    return {row["shape"] for row in lock.slots[slot].timing}


@pytest.mark.slow
def test_a_probe_for_a_model_pins_its_semantics_at_its_shapes_and_records_it(
    tmp_path, capsys, monkeypatch
):
    model = block(eps2=1e-6)
    monkeypatch.setattr(frommodel, "trace", lambda spec, precision: model)
    out = tmp_path / "kernel-lock.toml"
    # a hand-built trace: no model to check (SPEC names no file), so the check is skipped
    argv = ["--model", SPEC, "--out", out, *SMALL, "--json", "--no-model-check"]
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "makes no call of RMSNorm, GatedMLP: not probed" in err
    assert "model check skipped (--no-model-check), none recorded" in err
    summary = json.loads(stdout)
    assert summary["model"]["digest"] == model.digest
    assert "model-check" not in summary  # skipped: nothing recorded
    assert summary["weights"]["LayerNorm"] == {"24x32": 2}  # norm2 (eps 1e-6) is not covered
    lock = kernel_lock.load(out, emit_warnings=False)
    assert lock.model == model and lock.intact and lock.model.check is None
    assert set(lock.slots) == {"LayerNorm", "Linear", "Attention", "Activation"}
    # the semantics of the most calls, pinned; the other site named, left as the model has it
    assert lock.slots["LayerNorm"].kwargs["eps"] == 1e-5
    assert any(
        line.startswith("LayerNorm norm2: eps=1e-06") for line in lock.provenance["not-covered"]
    )
    assert lock.slots["Activation"].extra["function"] == "gelu-tanh"
    # each slot timed at the model's own shapes (rows = batch x sequence), not one --shape list
    assert _timed(lock, "LayerNorm") == {"24x32"} and _timed(lock, "Activation") == {"24x64"}
    assert _timed(lock, "Linear") == {"24x32x64", "24x64x32"} and _timed(lock, "Attention") == {
        "2x16x8"
    }
    # --check holds the lock to the trace: the same model is current, another size is stale
    assert run_cli(["--check", "--model", SPEC, "--out", out, *SMALL], capsys)[0] == 0
    monkeypatch.setattr(frommodel, "trace", lambda spec, precision: block(eps2=1e-6, out=128))
    code, _, err = run_cli(["--check", "--model", SPEC, "--out", out, *SMALL], capsys)
    assert code == 3 and "probed for another model or other sizes" in err and "fc1:" in err
    code, _, err = run_cli(["--check", "--out", out, *SMALL], capsys)
    assert code == 3 and f"it was probed for the model {SPEC}" in err


@pytest.mark.parametrize(
    "argv,said",
    [
        (["--shape", "64x32"], "--shape with --model"),
        (["--attention", "4x32x256"], "--attention with --model"),
        (["--slot", "RMSNorm"], "makes no RMSNorm call"),
        (["--pin", "RMSNorm=torch.rms_norm"], "makes no RMSNorm call the probe can check"),
    ],
)
def test_what_only_the_model_says_is_refused_before_any_work(
    tmp_path, capsys, monkeypatch, no_workers, argv, said
):
    monkeypatch.setattr(frommodel, "trace", lambda spec, precision: block())
    code, _, err = run_cli(["--model", SPEC, "--out", tmp_path / "l.toml", *argv], capsys)
    assert code == 2 and said in err and not (tmp_path / "l.toml").exists()


def test_no_model_check_without_a_model_is_refused(tmp_path, capsys, no_workers):
    code, _, err = run_cli(["--no-model-check", "--out", tmp_path / "l.toml"], capsys)
    assert code == 2 and "--no-model-check without --model" in err
    assert not (tmp_path / "l.toml").exists()


@pytest.mark.slow
def test_the_block_traced_for_real_is_probed_as_it_is(tmp_path, capsys):
    out = tmp_path / "kernel-lock.toml"
    spec = f"{ROOT / 'tests/models/block.py'}:build"
    code, _, err = run_cli(["--model", spec, "--out", out, *SMALL], capsys)
    assert code == 0, err
    lock = kernel_lock.load(out, emit_warnings=False)
    assert lock.model is not None and lock.model.intact
    used = lock.model.by_slot()
    not_covered = "\n".join(lock.provenance.get("not-covered", []))
    for name, sites in used.items():  # every slot the block calls: pinned, or its sites named
        assert name in lock.slots or all(f"{name} {s.where}" in not_covered for s in sites)
    assert lock.slots["LayerNorm"].kwargs["eps"] == used["LayerNorm"][0].semantics["eps"]
    # the model-level check ran against the lock chosen, and is recorded (issue 54)
    checked = lock.model.check
    assert checked is not None and (checked.verdict, checked.steps) == ("agree", 3), checked
    assert checked.phases >= 5 and checked.losses_agree_to is not None
    assert checked.step_ratio and checked.step_ratio > 0 and len(checked.step_interval) == 2
    assert "model check: agree over 3 steps" in err
    code, shown, _ = run_cli(["show", out], capsys)
    assert code == 0 and checked.line() in " ".join(shown.split())
    assert run_cli(["--check", "--model", spec, "--out", out, *SMALL], capsys)[0] == 0
