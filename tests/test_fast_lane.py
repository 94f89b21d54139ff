"""The fast lane (`pytest -m "not slow"`) leaves out what conftest.SLOW_FIXTURES names: each name
must still be a module-scoped fixture of its module, or a rename would quietly put minutes back in
the lane."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, SLOW_FIXTURES, SLOW_MODULES


@pytest.mark.parametrize(
    ("module", "fixture"), sorted((m, f) for m, names in SLOW_FIXTURES.items() for f in names)
)
def test_each_slow_fixture_is_still_there(module, fixture):
    text = (ROOT / "tests" / module).read_text()
    assert re.search(rf'@pytest\.fixture\(scope="module"\)\ndef {fixture}\(', text), (
        f"{module}: no fixture {fixture}"
    )


def test_the_lane_marks_a_test_using_one_and_only_that():
    from tests.conftest import pytest_collection_modifyitems

    class Item:
        def __init__(self, module: str, fixturenames: tuple[str, ...]):
            self.path, self.fixturenames, self.marks = ROOT / "tests" / module, fixturenames, []

        def add_marker(self, mark):
            self.marks.append(mark.name)

    using, using_the_other, other_module, not_using = (
        Item("kernel_probe/commands/test_probe.py", ("probed", "tmp_path")),
        Item("kernel_probe/commands/test_probe.py", ("logged_probe",)),
        Item("kernel_lock/test_resolve.py", ("probed",)),
        Item("kernel_probe/commands/test_probe.py", ("tmp_path",)),
    )
    pytest_collection_modifyitems(None, [using, using_the_other, other_module, not_using])
    assert (using.marks, using_the_other.marks, other_module.marks, not_using.marks) == (
        ["slow"],
        ["slow"],
        [],
        [],
    )


@pytest.mark.parametrize("module", SLOW_MODULES)
def test_a_module_the_lane_does_not_import_is_slow_throughout(module):
    """conftest.SLOW_MODULES are left uncollected by `-m "not slow"`: right only while all their
    tests are slow, which a module-level mark makes so (a test added there later is slow too, and
    runs in CI)."""
    text = (ROOT / "tests" / module).read_text()
    assert re.search(r"^pytestmark = .*pytest\.mark\.slow\b", text, re.M), (
        f"{module}: no module-level slow mark"
    )


def test_the_lane_leaves_those_modules_out_and_only_in_the_lane():
    from types import SimpleNamespace

    from tests.conftest import pytest_ignore_collect

    def config(markexpr):
        return SimpleNamespace(getoption=lambda name, default=None: markexpr)

    path = ROOT / "tests" / SLOW_MODULES[0]
    assert pytest_ignore_collect(path, config("not slow")) is True
    assert pytest_ignore_collect(path, config("not  slow ")) is True
    assert pytest_ignore_collect(path, config("")) is None  # the whole suite, CI
    assert pytest_ignore_collect(path, config("slow")) is None
    assert (
        pytest_ignore_collect(
            ROOT / "tests" / "kernel_probe" / "commands" / "test_probe.py", config("not slow")
        )
        is None
    )
