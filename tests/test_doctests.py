"""The examples in the small rule functions' docstrings are run by the fast lane (issue 40): the
tolerance rule, the fingerprint's matching rule and the choice's verdicts. Only these modules, so
the lane does not import every module under doctest."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = {  # module -> the functions whose examples it must keep (a deleted example fails here)
    "kernel_probe.probe.tolerance": ("floor", "tolerance", "ratio", "limits"),
    "kernel_lock.fingerprint": ("field_matches",),
    "kernel_lock.toml": ("toml_key", "toml_value"),  # the canonical layout's two rules
    "kernel_probe.probe.repetitions": ("block", "verdict", "said"),  # the paired rounds' verdict
    "kernel_probe.probe.choose": ("acceptable",),
    "kernel_probe.probe.check": ("merged",),  # a candidate's blocks of calls, one row per shape
    "kernel_probe.probe.planning": ("SlotRule", "slot_rules"),  # a slot's rule, and the merge
    "kernel_lock.tables": (
        "tables",
    ),  # a table declared by its fields, written by the generic writer
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_rule_functions_examples_hold(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    tests = {t.name.rsplit(".", 1)[-1]: t for t in finder.find(module) if t.examples}
    assert set(MODULES[name]) <= set(tests), (
        f"{name}: no examples in {set(MODULES[name]) - set(tests)}"
    )
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests.values():
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0 and result.attempted >= len(MODULES[name]), result
