"""kernel_probe.detect.importcheck: a module imported in a child process; what came back,
classified.

The tests that import a fake library start a child each (a second or less); the ones that wait for a
timeout are slow."""

from __future__ import annotations

import os

import pytest

from kernel_probe.detect import importcheck
from kernel_probe.detect.importcheck import ImportCache


@pytest.mark.parametrize(
    "module, status, reason_has",
    [
        ("fake_abort", "crashed", "SIGABRT"),
        ("fake_raise", "error", "RuntimeError: libcudart.so.12"),
        ("fake_print", "ok", "imported"),
        ("fake_exit", "crashed", "exited with code 3"),
        ("no_such_module_here", "error", "ModuleNotFoundError"),
    ],
)
def test_check_import_classifies_fakes(fakes, module, status, reason_has):
    result = importcheck.check_import(module, timeout=30, extra_paths=[str(fakes)])
    assert result["status"] == status
    assert reason_has in result["reason"]
    # a child ran (the checker's own failure says 0.0), within the timeout
    assert 0 < result["seconds"] < 30


def test_check_import_reports_where_it_crashed_and_raised(fakes):
    crashed = importcheck.check_import("fake_abort", timeout=30, extra_paths=[str(fakes)])
    assert "fake_abort" in crashed["reason"] and "Fatal Python error" in crashed["stderr"]
    raised = importcheck.check_import("fake_raise", timeout=30, extra_paths=[str(fakes)])
    assert raised["where"].endswith(os.path.join("fake_raise", "__init__.py") + ":2")


def test_check_import_keeps_library_stdout_apart(fakes):
    result = importcheck.check_import("fake_print", timeout=30, extra_paths=[str(fakes)])
    assert result["status"] == "ok" and result["stdout"] == "hello from fake_print"
    assert result["file"].endswith(os.path.join("fake_print", "__init__.py"))


@pytest.mark.slow
def test_check_import_times_out_and_kills(fakes):
    result = importcheck.check_import("fake_hang", timeout=2, extra_paths=[str(fakes)])
    assert result["status"] == "timeout"
    assert "2 s" in result["reason"]
    assert 2 <= result["seconds"] < 15


def test_check_import_ignores_the_working_directory(fakes, monkeypatch):
    """A folder in the caller's cwd is not "installed": the child drops '' from sys.path."""
    monkeypatch.chdir(fakes)
    assert importcheck.check_import("fake_print", timeout=30)["status"] == "error"


@pytest.mark.parametrize(
    "returncode, answer, stdout, stderr, timed_out, status, reason_has",
    [
        (0, {"ok": True, "seconds": 0.1}, "", "", False, "ok", "imported"),
        (0, {"ok": True, "seconds": 0.1}, "noise\n", "", False, "ok", "imported"),
        (1, None, "", "Traceback...\nSystemExit: 1\n", False, "crashed", "exited with code 1"),
        (
            0,
            {"ok": False, "type": "OSError", "message": "bad .so"},
            "",
            "",
            False,
            "error",
            "OSError: bad .so",
        ),
        (
            -11,
            None,
            "",
            "Fatal Python error: Segmentation fault\n",
            False,
            "crashed",
            "SIGSEGV during import",
        ),
        (-6, {"ok": True}, "", "", False, "crashed", "at interpreter exit"),
        (None, None, "", "", True, "timeout", "did not finish"),
        (0, None, "", "", False, "error", "no result"),
        (0, {"ok": True, "modul": "x"}, "", "", False, "error", "unknown key(s) 'modul'"),
    ],
)
def test_classify(returncode, answer, stdout, stderr, timed_out, status, reason_has):
    from kernel_probe.isolation.child import ChildResult

    child = ChildResult(
        "ok" if answer is not None else "crashed",
        value=answer,
        returncode=returncode,
        seconds=1.0,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
    )
    out = importcheck.classify(child, timeout=5)
    assert out["status"] == status and reason_has in out["reason"]
    if "noise" in stdout:
        assert out["stdout"] == "noise"


def _child(status="ok", value=None, **kw):
    from kernel_probe.isolation.child import ChildResult

    return ChildResult(status, value=value, **{"returncode": 0, "seconds": 0.25, **kw})


@pytest.mark.parametrize(
    "child, expected",
    [
        (  # what the module is, kept with the verdict
            _child(
                value={
                    "ok": True,
                    "seconds": 0.1234,
                    "file": "/x/lib/__init__.py",
                    "version": "1.2",
                }
            ),
            {
                "status": "ok",
                "reason": "imported",
                "seconds": 0.25,
                "import_seconds": 0.123,
                "file": "/x/lib/__init__.py",
                "module_version": "1.2",
            },
        ),
        (  # Triton's target, or why it could not be read
            _child(
                value={"ok": True, "target": {"backend": "hip", "arch": "gfx90a", "warp_size": 64}}
            ),
            {
                "status": "ok",
                "reason": "imported",
                "seconds": 0.25,
                "import_seconds": 0.0,
                "target": {"backend": "hip", "arch": "gfx90a", "warp_size": 64},
            },
        ),
        (
            _child(value={"ok": True, "target_error": "RuntimeError: 0 active drivers"}),
            {
                "status": "ok",
                "reason": "imported",
                "seconds": 0.25,
                "import_seconds": 0.0,
                "target_error": "RuntimeError: 0 active drivers",
            },
        ),
        (  # imported, then the interpreter exited badly: still ok, and said
            _child(value={"ok": True}, returncode=3, stderr="warning at exit\n"),
            {
                "status": "ok",
                "reason": "imported, then exited with code 3",
                "seconds": 0.25,
                "import_seconds": 0.0,
            },
        ),
        (  # the import raised: where, and the child's stderr kept
            _child(
                value={
                    "ok": False,
                    "type": "ImportError",
                    "message": "no .so",
                    "where": "/x/a.py:3",
                },
                stderr="log line\n",
            ),
            {
                "status": "error",
                "reason": "ImportError: no .so",
                "seconds": 0.25,
                "where": "/x/a.py:3",
                "import_seconds": 0.0,
                "stderr": "log line",  # clipped: stripped
            },
        ),
        (  # an exception without a type still reads as one
            _child(value={"ok": False, "message": "odd"}),
            {"status": "error", "reason": "Exception: odd", "seconds": 0.25, "import_seconds": 0.0},
        ),
        (  # the interpreter could not be started at all
            _child(
                "crashed", reason="cannot run /no/python: ENOENT", returncode=None, started=False
            ),
            {"status": "error", "reason": "cannot run /no/python: ENOENT", "seconds": 0.25},
        ),
        (  # the child's own function raised: the checker's bug, reported as such
            _child("error", reason="KeyError: 'module'"),
            {
                "status": "error",
                "reason": "the child wrote no result: KeyError: 'module'",
                "seconds": 0.25,
            },
        ),
        (  # a signal this platform does not name
            _child("crashed", returncode=-200),
            {"status": "crashed", "reason": "killed by signal 200 during import", "seconds": 0.25},
        ),
        (  # a timeout wins over the answer that came before the kill
            _child(value={"ok": True}, timed_out=True, returncode=-9),
            {
                "status": "timeout",
                "reason": "import did not finish within 2.5 s (child killed)",
                "seconds": 0.25,
                "import_seconds": 0.0,
            },
        ),
    ],
    ids=[
        "module-facts",
        "target",
        "target-error",
        "exit-code-after",
        "raised",
        "untyped",
        "not-started",
        "checker-bug",
        "unnamed-signal",
        "timeout-wins",
    ],
)
def test_classify_keeps_what_the_child_said(child, expected):
    assert importcheck.classify(child, timeout=2.5) == expected


def test_classify_clips_what_a_library_prints():
    out = importcheck.classify(
        _child(value={"ok": False}, stdout="x" * 10_000, stderr="y" * 10_000), timeout=5
    )
    assert 0 < len(out["stdout"]) < 2100 and 0 < len(out["stderr"]) < 4100


def test_statuses_are_the_documented_ones():
    assert importcheck.STATUSES == ("ok", "error", "crashed", "timeout", "not-installed", "skipped")
    for status in importcheck.STATUSES:
        assert f"    {status} " in importcheck.__doc__


@pytest.mark.slow
def test_import_checks_run_concurrently(fakes):
    requests = {f"hang{i}": importcheck.ImportCheckRequest("fake_hang") for i in range(3)}
    checks = importcheck.ImportChecks(requests, timeout=2, extra_paths=[str(fakes)])
    results = checks.results()
    assert {r["status"] for r in results.values()} == {"timeout"}
    # three 2-second timeouts in parallel, not one after the other
    assert max(r["seconds"] for r in results.values()) < 5.5


def test_cancel_kills_running_checks_at_once(fakes):
    checks = importcheck.ImportChecks(
        {"hang": importcheck.ImportCheckRequest("fake_hang")}, timeout=120, extra_paths=[str(fakes)]
    )
    checks.cancel()
    result = checks.results()["hang"]  # without cancel() this would wait 120 s
    assert result["status"] == "crashed" and "SIGKILL" in result["reason"]
    assert result["seconds"] < 30


def test_the_checks_have_started_when_the_constructor_returns(fakes):
    many = 9  # more than any pool limit once was: none queues behind a running one
    checks = importcheck.ImportChecks(
        {f"hang{i}": importcheck.ImportCheckRequest("fake_hang") for i in range(many)},
        timeout=120,
        extra_paths=[str(fakes)],
    )
    # the parent's own work (importing torch) comes after this: it cannot hold back a child's start
    try:
        assert len(checks._procs) == many and all(p.poll() is None for p in checks._procs)
    finally:
        checks.cancel()
        checks.results()


def test_with_fresh_the_cache_key_is_worked_out_once_the_child_runs(
    fakes, tmp_path_factory, monkeypatch
):
    order = []
    real_run, real_key = importcheck.run_function, importcheck.cache_key

    def run(*a, started, **k):
        return real_run(*a, started=lambda proc: (order.append("started"), started(proc)), **k)

    monkeypatch.setattr(importcheck, "run_function", run)
    monkeypatch.setattr(
        importcheck, "cache_key", lambda *a, **k: (order.append("key"), real_key(*a, **k))[1]
    )
    folder = tmp_path_factory.mktemp("cache")  # not in the fakes' folder, whose time is in the key
    cache = importcheck.ImportCache(folder, read=False)
    importcheck.check_import("fake_raise", timeout=30, extra_paths=[str(fakes)], cache=cache)
    assert order == ["started", "key"]  # --fresh: nothing to look up, so nothing before the start
    order.clear()
    again = importcheck.check_import(
        "fake_raise", timeout=30, extra_paths=[str(fakes)], cache=ImportCache(folder)
    )
    # a read needs the key first: kept under the same one
    assert order == ["key"] and again["cached"]


# ---- timeouts scaled to the machine's load, and a note when one comes close (issue 37) -----------
@pytest.mark.parametrize(
    "load,expected", [(0.0, 20.0), (0.5, 20.0), (1.0, 20.0), (3.0, 60.0), (100.0, 120.0)]
)
def test_the_default_timeout_is_scaled_by_the_load_per_core(load, expected):
    from kernel_probe.detect.importcheck import scaled_timeout

    assert scaled_timeout(20.0, load=load) == expected


def test_an_import_that_came_close_to_its_timeout_is_named():
    from kernel_probe.detect.importcheck import close_calls

    results = {
        "liger-kernel": {"status": "ok", "seconds": 18.98},
        "triton": {"status": "ok", "seconds": 1.2},
        "apex": {"status": "timeout", "seconds": 20.0},
    }
    notes = close_calls(results, 20.0)
    assert len(notes) == 2 and notes[0].startswith(
        "liger-kernel: the import check took 19.0 s of its 20 s timeout"
    )
    assert "timed out after 20.0 s" in notes[1] and "--timeout" in notes[1]


def test_env_reports_the_scaled_timeout_and_the_load(monkeypatch):
    from kernel_probe.detect import importcheck
    from kernel_probe.detect import report as env_report

    monkeypatch.setattr(importcheck, "load_per_core", lambda: 2.5)
    monkeypatch.setattr(env_report, "load_per_core", lambda: 2.5)
    monkeypatch.setattr(env_report, "scaled_timeout", lambda: importcheck.scaled_timeout(load=2.5))
    # no child: the timeout only
    monkeypatch.setattr(env_report, "triton_request", lambda *_a, **_k: None)
    checks = env_report.detect(import_checks=True, table=())["import_checks"]
    assert (
        checks["timeout"] == 50.0
        and checks["load_per_core"] == 2.5
        and isinstance(checks["notes"], list)
    )
