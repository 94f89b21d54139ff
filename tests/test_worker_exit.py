"""A pytest-xdist worker of this suite skips only the interpreter's teardown (tests/conftest.py,
`_end_the_worker_now`): a small suite run in two workers, with this suite's conftest, shows that
the exit handlers its tests register, a `weakref.finalize` and logging's flush all still run, that
a failing test still fails the run, and that every worker still ends with its results sent."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_pytest_suite

pytestmark = pytest.mark.slow

MODULE = """\
import atexit, logging, logging.handlers, os, weakref
from pathlib import Path

OUT = Path(os.environ["EXIT_RECORD"])


class _Held:  # an object alive until the worker exits: its finalizer runs among the exit handlers
    pass


KEPT = _Held()


def test_registers_what_the_exit_must_run_{name}():
    worker = os.environ["PYTEST_XDIST_WORKER"]
    atexit.register(lambda: (OUT / f"atexit-{{worker}}-{name}").write_text("ran"))
    weakref.finalize(KEPT, lambda: (OUT / f"finalize-{{worker}}-{name}").write_text("ran"))
    log = logging.getLogger("exit-{name}")
    # held in memory until logging's shutdown flushes it to the file
    into = logging.FileHandler(OUT / f"log-{{worker}}-{name}", delay=True)
    log.addHandler(logging.handlers.MemoryHandler(1000, flushLevel=logging.CRITICAL, target=into))
    log.warning("written before the worker's exit")
    assert {ok}
"""


def _run(folder: Path, *, fail: bool) -> tuple[subprocess.CompletedProcess, Path]:
    out = folder / "out"
    out.mkdir()
    suite = folder / "suite"
    suite.mkdir()
    # this suite's conftest, whole: its import registers the worker's exit
    (suite / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    for name in ("a", "b"):
        ok = "False" if (fail and name == "b") else "True"
        (suite / f"test_{name}.py").write_text(textwrap.dedent(MODULE.format(name=name, ok=ok)))
    done = run_pytest_suite(suite, {"EXIT_RECORD": str(out)}, drop=("PYTEST_XDIST_WORKER",))
    return done, out


def test_a_workers_exit_handlers_finalizers_and_logs_still_run(tmp_path):
    done, out = _run(tmp_path, fail=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout, done.stdout
    ran = sorted(p.name for p in out.iterdir() if p.read_text().strip())
    # both tests, wherever they ran: the exit handler, the finalizer and the log line each reached
    # their file; a worker that skipped them would leave the first two missing
    for name in ("a", "b"):
        for kind in ("atexit", "finalize", "log"):
            assert [r for r in ran if r.startswith(kind) and r.endswith(f"-{name}")], (kind, ran)
    assert "not properly terminated" not in (done.stdout + done.stderr).lower(), done.stdout


def test_a_failing_test_still_fails_the_run(tmp_path):
    done, _ = _run(tmp_path, fail=True)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 failed, 1 passed" in done.stdout, done.stdout
