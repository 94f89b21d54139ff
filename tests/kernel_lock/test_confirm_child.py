"""kernel_lock.launch.confirm_child: the child of the job-start check. Run here in-process (its
``os._exit`` replaced): for each slot asked, ``factory``'s verdict; one line of verdicts, even when
resolving a slot ends the interpreter's way (``SystemExit`` from an imported module)."""

from __future__ import annotations

import json
import os

import pytest

from kernel_lock.errors import ExitCode
from kernel_lock.launch import MARK, confirm_child
from kernel_lock.lock import loads
from kernel_lock.resolve import factory
from tests.conftest import edited_lock


class _Exited(Exception):
    pass


def _ask(monkeypatch, capsys, text: str, slots: list[str], trust: list[str]) -> dict:
    def exit_(code):
        raise _Exited(code)

    monkeypatch.setattr(os, "_exit", exit_)
    request = {"text": text, "path": "k.toml", "trust": trust, "mode": "training", "slots": slots}
    with pytest.raises(_Exited) as ended:
        confirm_child(request, loads, factory)
    assert ended.value.args == (0,)  # its exit status says nothing: the verdict line does
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(MARK)]
    assert len(lines) == 1
    return json.loads(lines[0][len(MARK) :])


def test_each_slot_asked_gets_factorys_verdict(monkeypatch, capsys):
    text = edited_lock(**{"kwargs = { bias = false }": "kwargs = { bias = false, fancy = 1 }"})
    verdicts = _ask(monkeypatch, capsys, text, ["LayerNorm", "Linear"], [])
    assert verdicts["LayerNorm"] is None
    assert verdicts["Linear"]["exit_code"] == ExitCode.BAD_INPUT
    assert (
        verdicts["Linear"]["key"] == "slots.Linear.kwargs.fancy"
        and "fancy" in verdicts["Linear"]["problem"]
    )


def test_a_module_that_ends_the_interpreter_is_a_verdict_not_an_ending(monkeypatch, capsys):
    text = edited_lock(**{'target = "torch.nn.LayerNorm"': 'target = "kp_exits.Norm"'})
    verdicts = _ask(monkeypatch, capsys, text, ["LayerNorm", "Linear"], ["kp_exits"])
    assert verdicts["LayerNorm"]["exit_code"] == ExitCode.MISMATCH
    assert (
        "called sys.exit(3)" in verdicts["LayerNorm"]["problem"]
        and verdicts["LayerNorm"]["key"] == "slots.LayerNorm"
    )
    assert verdicts["Linear"] is None  # the next slot is still resolved
