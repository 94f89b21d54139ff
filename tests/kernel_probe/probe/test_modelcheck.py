"""The probe's model-level check stage (kernel_probe.probe.modelcheck) without a child: the check
function replaced, so what the stage does with each outcome is the subject (the real check runs in
tests/kernel_probe/commands/test_probe_model.py and tests/test_model_end_to_end.py)."""

from __future__ import annotations

import dataclasses

import pytest

from kernel_lock import loads
from kernel_lock.model import Model, Site
from kernel_probe.errors import InputFileError
from kernel_probe.model import check as check_module
from kernel_probe.probe import modelcheck
from tests.conftest import MINIMAL_LOCK

SITE = Site(slot="LayerNorm", where="norm1", call="torch.nn.LayerNorm", shapes=("4x8",))


def _lock():
    lock = loads(MINIMAL_LOCK, emit_warnings=False)
    return dataclasses.replace(lock, model=Model.of("m.py:build", (SITE,))).sealed()


def _check(verdict, phases, timing=None, why=""):
    return check_module.Check(
        spec="m.py:build", lock="L", steps=3, verdict=verdict, phases=tuple(phases),
        sites=("norm1",), timing=timing, why=why,
    )  # fmt: skip


def test_an_agreeing_check_is_recorded_and_the_lock_sealed_again(monkeypatch):
    timing = {"rounds": 9, "written": 0.93, "applied": 0.83, "ratio": 1.1205, "interval": [1, 1.2]}
    phases = [{"phase": "p", "loss": [1.0, 1.0003], "worst": None, "diverging": []}]
    monkeypatch.setattr(check_module, "check", lambda *a, **k: _check("agree", phases, timing))
    notes: list[str] = []
    lock = modelcheck.checked(_lock(), "m.py:build", (), notes.append, pytest.fail)
    recorded = lock.model.check
    assert (recorded.verdict, recorded.steps, recorded.phases) == ("agree", 3, 1)
    assert recorded.losses_agree_to == pytest.approx(3e-4) and recorded.step_ratio == 1.1205
    assert recorded.step_interval == (1.0, 1.2) and lock.intact and lock.model.intact
    assert notes[-1] == recorded.line() and "step 1.12x (0.93 -> 0.83 s" in notes[-1]


def test_a_diverging_check_is_exit_3_naming_site_and_phase(monkeypatch):
    first = {"what": "site norm1", "difference": 1e-3, "tolerance": 1e-5}
    phases = [{"phase": "after optimizer step 1", "loss": [1, 2], "diverging": [first]}]
    monkeypatch.setattr(check_module, "check", lambda *a, **k: _check("diverging", phases))
    with pytest.raises(modelcheck.ModelDiverges) as info:
        modelcheck.checked(_lock(), "m.py:build", (), lambda _: None, pytest.fail)
    assert info.value.exit_code == 3
    assert "site norm1 diverges (phase 'after optimizer step 1': differs by 0.001" in str(
        info.value
    )


def test_a_check_that_cannot_run_is_recorded_not_run_and_warned(monkeypatch):
    def fails(*a, **k):
        raise InputFileError("in the first forward and backward, the model as written raised X")

    monkeypatch.setattr(check_module, "check", fails)
    warned: list[str] = []
    lock = modelcheck.checked(_lock(), "m.py:build", (), lambda _: None, warned.append)
    recorded = lock.model.check
    assert recorded.verdict == "not-run" and "the model as written raised X" in recorded.why
    assert recorded.steps == 0 and lock.intact and "not run" in warned[0]
