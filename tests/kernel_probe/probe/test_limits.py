"""kernel_probe.probe.limits: the probe's time limits and correctness input size, in one light
home."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kernel_probe.probe import limits
from kernel_probe.probe.planning import ProbeRequest


def test_limits_import_nothing():
    # the command line's parser and a job start's warm path read them without importing torch or the
    # checker
    tree = ast.parse(Path(limits.__file__).read_text())
    imported = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [getattr(n, "module", None) for n in imported] == ["__future__"]


@pytest.mark.parametrize(
    "name", ["IMPORT_TIMEOUT", "CHECK_TIMEOUT", "COMPILED_FACTOR", "TIMING_TIMEOUT", "CHECK_HIDDEN"]
)
def test_every_limit_is_positive(name):
    assert getattr(limits, name) > 0


def test_the_limits_are_ordered():
    # an import costs job start less than one candidate's checks; timing every shape takes the
    # longest
    assert (
        limits.IMPORT_TIMEOUT
        <= limits.CHECK_TIMEOUT
        < limits.CHECK_TIMEOUT * limits.COMPILED_FACTOR
    )
    assert limits.CHECK_TIMEOUT * limits.COMPILED_FACTOR <= limits.TIMING_TIMEOUT


def test_the_check_size_is_not_a_power_of_two():
    # kernels tuned for 2**k hidden sizes must show their tail handling
    assert limits.CHECK_HIDDEN & (limits.CHECK_HIDDEN - 1) != 0


def test_a_probe_request_defaults_to_the_limits():
    request = ProbeRequest()
    assert (request.timeout, request.import_timeout) == (
        limits.CHECK_TIMEOUT,
        limits.IMPORT_TIMEOUT,
    )
