"""Under pytest-xdist a test marked `timing` runs alone (tests/conftest.py): a small suite run in
two workers, with this suite's hooks, records when each test ran; the timing tests' intervals
overlap no other test's, while the unmarked tests of two modules do run side by side."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_pytest_suite

pytestmark = pytest.mark.slow

RECORD = """\
import json, os, time
from pathlib import Path


def record(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    line = {"name": name, "start": start, "end": time.monotonic()}
    with open(Path(os.environ["RECORD"]), "a") as f:
        f.write(json.dumps(line) + "\\n")
"""

MODULE = """\
import pytest
from record import record
{mark}

@pytest.mark.parametrize("i", range({n}))
def test_step(i):
    record("{name}-%d" % i, {seconds})
"""


def _suite(folder: Path) -> None:
    (folder / "record.py").write_text(RECORD)
    # this suite's own hooks, as tests/conftest.py defines them (the marker is declared here: the
    # small suite has no pyproject.toml)
    (folder / "conftest.py").write_text(
        textwrap.dedent(
            """\
            from tests.conftest import pytest_runtest_protocol, pytest_xdist_make_scheduler

            def pytest_configure(config):
                config.addinivalue_line("markers", "timing: runs alone")
            """
        )
    )
    modules = {
        "test_a_timing.py": ("pytestmark = pytest.mark.timing", 2, "timing", 0.6),
        "test_b_other.py": ("", 6, "b", 0.3),
        "test_c_other.py": ("", 6, "c", 0.3),
    }
    for name, (mark, n, label, seconds) in modules.items():
        (folder / name).write_text(MODULE.format(mark=mark, n=n, name=label, seconds=seconds))


def test_a_timing_test_overlaps_no_other_test_under_two_workers(tmp_path):
    _suite(tmp_path)
    record = tmp_path / "record.jsonl"
    # its own lock folder: sharing this run's would make it wait on the test that started it
    done = run_pytest_suite(
        tmp_path, {"RECORD": str(record)}, drop=("KERNEL_PROBE_TESTS_ALONE_DIR",)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(runs) == 14, runs
    timing = [r for r in runs if r["name"].startswith("timing")]
    others = [r for r in runs if not r["name"].startswith("timing")]

    def overlap(a, b) -> bool:
        return a["start"] < b["end"] and b["start"] < a["end"]

    assert not [(t["name"], o["name"]) for t in timing for o in others if overlap(t, o)]
    # and the lock does not serialize everything: the two unmarked modules ran side by side
    b = [r for r in others if r["name"].startswith("b")]
    c = [r for r in others if r["name"].startswith("c")]
    assert any(overlap(x, y) for x in b for y in c), runs
