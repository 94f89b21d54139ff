"""kernel_probe.isolation.child: the one way the probe starts a child process, and how its end is
read.

The fast tests replace the interpreter with a fake process (``spawn`` patched) that leaves what a
child leaves (a result file, stderr, a return code); the few that start a real interpreter are
marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from kernel_probe.isolation import child


@pytest.mark.parametrize(
    "number,name",
    [(9, "SIGKILL"), (int(signal.SIGSEGV), "SIGSEGV"), (6, "SIGABRT"), (1000, "signal 1000")],
)
def test_signal_name(number, name):
    assert child.signal_name(number) == name


@pytest.mark.parametrize(
    "text,limit,expected",
    [
        ("  short\n", 10, "short"),
        ("0123456789", 10, "0123456789"),
        ("0123456789A", 10, "...123456789A"),  # the last characters: where a traceback ends
        ("\n\n", 10, ""),
    ],
)
def test_clip(text, limit, expected):
    assert child.clip(text, limit) == expected


def test_clip_defaults_to_the_tail_kept():
    assert child.clip("x" * (child.TAIL + 5)) == "..." + "x" * child.TAIL


@pytest.mark.parametrize(
    "stderr,line",
    [
        ("", ""),
        ("\n  \n", ""),
        ("Traceback (most recent call last):\n  ...\nRuntimeError: boom\n\n", "RuntimeError: boom"),
        (
            "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call "
            "first):\n"
            '  File "<frozen importlib._bootstrap>", line 241 in _call\n  File "/lib/kp.py", '
            "line 3 in <module>\n",
            'Fatal Python error: Segmentation fault (File "/lib/kp.py", line 3 in <module>)',
        ),
        ("Fatal Python error: Aborted\n", "Fatal Python error: Aborted"),  # no frame to name
    ],
)
def test_fatal_line(stderr, line):
    assert child.fatal_line(stderr) == line


@pytest.mark.parametrize(
    "extra,env,pythonpath",
    [
        ((), {"PYTHONPATH": "/old"}, "/old"),
        (("/a", Path("/b")), {}, os.pathsep.join(["/a", "/b"])),
        (("/a",), {"PYTHONPATH": "/old"}, os.pathsep.join(["/a", "/old"])),
        (("/a",), {"PYTHONPATH": ""}, "/a"),
    ],
)
def test_child_environment(extra, env, pythonpath):
    got = child.child_environment(extra, env)
    assert got["PYTHONPATH"] == pythonpath and got["PYTHONIOENCODING"] == "utf-8"
    assert env.get("PYTHONPATH", "") in ("", "/old")  # the given mapping is not changed


def test_child_environment_defaults_to_ours_and_keeps_an_encoding_set(monkeypatch):
    monkeypatch.setenv("PYTHONIOENCODING", "latin-1")
    monkeypatch.setenv("KP_T3_MARK", "1")
    got = child.child_environment()
    assert got["KP_T3_MARK"] == "1" and got["PYTHONIOENCODING"] == "latin-1"
    assert child.child_environment(env={})["PYTHONIOENCODING"] == "utf-8"


def test_tail_keeps_the_end_of_a_long_file(tmp_path):
    path = tmp_path / "stderr"
    path.write_bytes(b"head\n" + b"x" * (5 * child.TAIL) + b"\nlast line\n")
    tail = child._tail(path)
    assert tail.startswith("...") and tail.endswith("last line") and len(tail) == child.TAIL + 3
    assert child._tail(tmp_path / "absent") == ""
    (tmp_path / "bad").write_bytes(b"\xff\xfe ok")
    assert child._tail(tmp_path / "bad") == "\ufffd\ufffd ok"


def test_kill_group_of_a_process_that_is_gone_is_quiet(monkeypatch):
    def gone(pid, sig):
        raise ProcessLookupError(pid)

    monkeypatch.setattr(os, "killpg", gone)
    assert child.kill_group(999_999) is None


@pytest.mark.parametrize(
    "status,ok", [("ok", True), ("error", False), ("crashed", False), ("timeout", False)]
)
def test_child_result_ok(status, ok):
    assert child.ChildResult(status).ok is ok


# ---- run_function, with a fake child -------------------------------------------------------------
class FakeChild:
    """What a child leaves behind: ``result`` (written to the result file; None: none), ``stderr``,
    a return code; ``hang``: it does not end within the timeout."""

    def __init__(self, result=None, *, stderr="", stdout="", returncode=0, hang=False, raw=None):
        self.result, self.stderr, self.stdout, self.raw = result, stderr, stdout, raw
        self.code, self.hang = returncode, hang
        self.options: dict = {}
        self.pid = 4242
        self.returncode = None

    def spawn(self, module, function, *, stdout, stderr, **options):
        self.options = {"module": module, "function": function, **options}
        self.payload = json.loads(Path(options["payload"]).read_text())
        stdout.write(self.stdout.encode())
        stderr.write(self.stderr.encode())
        if self.raw is not None:
            Path(options["result"]).write_text(self.raw)
        elif self.result is not None:
            Path(options["result"]).write_text(json.dumps(self.result))
        return self

    def wait(self, timeout=None):
        if self.hang and timeout is not None:
            raise subprocess.TimeoutExpired("python", timeout)
        self.returncode = self.code
        return self.code


@pytest.fixture
def fake(monkeypatch):
    killed: list[int] = []
    monkeypatch.setattr(child, "kill_group", killed.append)

    def install(proc: FakeChild) -> FakeChild:
        monkeypatch.setattr(child, "spawn", proc.spawn)
        proc.killed = killed
        return proc

    return install


def test_an_answer_is_ok(fake):
    proc = fake(FakeChild({"ok": {"answer": [1, 2]}}, stdout="printed\n", stderr="warned\n"))
    result = child.run_function("mod", "fn", {"x": 1}, timeout=5)
    assert result.ok and result.value == {"answer": [1, 2]} and result.reason == ""
    assert (result.stdout, result.stderr, result.returncode, result.timed_out) == (
        "printed",
        "warned",
        0,
        False,
    )
    assert (
        proc.payload == {"x": 1}
        and proc.options["mode"] == "call"
        and proc.options["exit"] == "hard"
    )
    assert proc.killed == [4242]  # the group goes, whatever it spawned with it


def test_a_protocol_message_is_sent_as_its_json(fake):
    class Message:
        def to_json(self):
            return {"kind": "ping"}

    proc = fake(FakeChild({"ok": None}))
    assert child.run_function("m", "f", Message(), timeout=5, teardown=True).ok
    assert proc.payload == {"kind": "ping"} and proc.options["exit"] == "normal"


def test_started_receives_the_child(fake):
    proc = fake(FakeChild({"ok": 1}))
    seen = []
    child.run_function("m", "f", None, timeout=5, started=seen.append)
    assert seen == [proc]


@pytest.mark.parametrize(
    "proc,status,reason",
    [
        (
            FakeChild({"raised": "ValueError", "message": "bad input", "where": "/lib/x.py:3"}),
            "error",
            "ValueError: bad input",
        ),
        (
            FakeChild(None, returncode=-9),
            "crashed",
            "the child process was killed by SIGKILL without an answer",
        ),
        (
            FakeChild(None, returncode=-11, stderr="Fatal Python error: Segmentation fault\n"),
            "crashed",
            "the child process was killed by SIGSEGV without an answer: Fatal Python error: "
            "Segmentation fault",
        ),
        (
            FakeChild(None, returncode=3, stderr="oops\n"),
            "crashed",
            "the child process exited with status 3 without an answer: oops",
        ),
        (
            FakeChild(None, raw="{not json"),
            "crashed",
            "the child process exited with status 0 without an answer",
        ),
        (FakeChild(None, hang=True, returncode=-9), "timeout", "no answer within 1.5 s (killed)"),
    ],
    ids=["raised", "killed", "segfault", "exit-status", "torn-result", "timeout"],
)
def test_a_child_without_an_answer_says_why(fake, proc, status, reason):
    fake(proc)
    result = child.run_function("m", "f", None, timeout=1.5)
    assert (result.status, result.reason) == (status, reason) and result.value is None
    assert result.timed_out is (status == "timeout")
    if status == "error":
        assert result.raised == {
            "raised": "ValueError",
            "message": "bad input",
            "where": "/lib/x.py:3",
        }


def test_an_answer_that_came_before_the_kill_is_kept(fake):
    fake(FakeChild({"ok": "late"}, hang=True))
    result = child.run_function("m", "f", None, timeout=1)
    assert result.ok and result.value == "late" and result.timed_out


def test_an_interpreter_that_cannot_start(monkeypatch):
    def cannot(*_a, **_k):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(child, "spawn", cannot)
    result = child.run_function("m", "f", None, timeout=1, python="/no/python")
    assert result.status == "crashed" and not result.started
    assert result.reason == "could not start /no/python: [Errno 2] No such file or directory"


# ---- a real interpreter (slow: each starts Python) -----------------------------------------------
@pytest.mark.slow
def test_a_real_child_calls_the_function_and_reports_what_it_raised():
    assert child.run_function("posixpath", "basename", "a/b.toml", timeout=60).value == "b.toml"
    source = "def f(payload):\n    raise KeyError(payload)\n"
    result = child.run_function("unused", "f", "k", timeout=60, source=source)
    assert (
        result.status == "error"
        and result.raised["raised"] == "KeyError"
        and result.reason == "KeyError: 'k'"
    )
