"""The one way the probe starts a child process: a fresh interpreter that cannot hurt the caller.

Every child runs ``BOOT`` through the one launcher, ``kernel_lock.launch``: it dies with its parent,
may leave a reaper that kills its process group, then calls ``function(payload)`` once
(:func:`run_function`: payload, answer and output are files, so a forked grandchild cannot block the
caller) or serves (:func:`spawn`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock.files import write_file
from kernel_lock.launch import kill_group, python_argv, pythonpath_roots, start

# The child program: the standard library only before ``module`` (an import check asks about the
# library's import alone). Its options (JSON): mode (call | serve), module, function, source (code
# defining ``function``, instead of module), parent, reaper, exit (hard | normal), payload,
# result.
BOOT = r"""
import sys, json, os
options = json.loads(sys.argv[1])
def _die_with_parent(parent, reaper):
    try:
        import ctypes, signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: the caller died -> this child dies
    except Exception:  # not Linux: the caller still kills the group when it is done with the child
        libc = None
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(137)
    if not (reaper and libc):
        return
    me = os.getpid()
    if os.fork() == 0:  # the reaper: kills the group (grandchildren included) when this child dies
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)  # hold none of the child's pipes
        signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
        libc.prctl(1, int(signal.SIGTERM))
        if os.getppid() != me:
            os.killpg(0, signal.SIGKILL)
        while True:
            signal.pause()
_die_with_parent(int(options["parent"]), options.get("reaper"))
import importlib
if options["mode"] == "serve":
    getattr(importlib.import_module(options["module"]), options["function"])()
else:
    with open(options["payload"], encoding="utf-8") as fh:
        payload = json.load(fh)
    try:
        if options.get("source") is not None:
            namespace = {"__name__": "__kernel_probe_child__"}
            exec(compile(options["source"], "<kernel-probe-child>", "exec"), namespace)
            function = namespace[options["function"]]
        else:
            function = getattr(importlib.import_module(options["module"]), options["function"])
        value = {"ok": function(payload)}
    except MemoryError:
        value = {"raised": "MemoryError", "message": "the child ran out of its memory limit"}
    except BaseException as exc:
        import traceback
        frames = traceback.extract_tb(exc.__traceback__)
        where = next((f"{f.filename}:{f.lineno}" for f in reversed(frames)
                      if not f.filename.startswith("<")), "")
        value = {"raised": type(exc).__name__, "message": str(exc)[:4000], "where": where}
    tmp = options["result"] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(value, fh, default=repr)
    os.replace(tmp, options["result"])
    sys.stdout.flush()
    sys.stderr.flush()
    if options.get("exit") != "normal":
        os._exit(0)  # skip interpreter teardown: a library's atexit hooks cannot change the answer
"""

TAIL = 4000  # characters of the child's stdout/stderr kept as evidence


@dataclass(frozen=True)
class ChildResult:
    """What came back from a child: ``status`` ok, error (the function raised), crashed or timeout;
    ``timed_out`` even when an answer came before the kill; ``started``: the interpreter started."""

    status: str
    value: Any = None
    reason: str = ""
    returncode: int | None = None
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    raised: Mapping[str, str] = field(default_factory=dict)
    timed_out: bool = False
    started: bool = True

    @property
    def ok(self) -> bool:
        """The function ran in the child and returned (status ok)."""
        return self.status == "ok"


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal N`` for a number this platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def clip(text: str, limit: int = TAIL) -> str:
    """``text`` stripped, and cut to its last ``limit`` characters."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4 * TAIL))
            return clip(fh.read().decode("utf-8", "replace"))
    except OSError:
        return ""


def fatal_line(stderr: str) -> str:
    """The most telling line of a dead child's stderr (faulthandler's 'Fatal Python error' with its
    first frame, else the last line)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            frames = (f for f in lines[i + 1 :] if f.startswith("File ") and "<frozen" not in f)
            frame = next(frames, "")
            return f"{line} ({frame})" if frame else line
    return lines[-1] if lines else ""


def child_environment(
    extra_paths: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The child's environment: ours (or ``env``), with ``extra_paths`` in front of PYTHONPATH."""
    base = dict(os.environ if env is None else env)
    if extra_paths:
        old = [base["PYTHONPATH"]] if base.get("PYTHONPATH") else []
        base["PYTHONPATH"] = os.pathsep.join([str(p) for p in extra_paths] + old)
    base.setdefault("PYTHONIOENCODING", "utf-8")
    return base


def spawn(
    module: str,
    function: str,
    *,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    local: Sequence[str] = (),
    reaper: bool = False,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    bufsize: int = -1,
    **call: Any,
) -> subprocess.Popen[bytes]:
    """Start ``BOOT`` in its own process group: it serves ``module.function()``, or with ``call``
    (mode, payload, result, source, exit) calls it once; ``local``: top-level modules found in the
    working directory. OSError when it cannot start."""
    options = {"mode": "serve", "module": module, "function": function, "parent": os.getpid()}
    options["reaper"] = reaper
    env = dict(env) if env is not None else child_environment()
    code = [json.dumps({**options, **call})]
    argv = python_argv(BOOT, code, roots=pythonpath_roots(env), local=local, python=python)
    return start(argv, stdin=stdin, stdout=stdout, stderr=stderr, bufsize=bufsize, env=env)


def end(proc: subprocess.Popen[bytes], grace: float) -> bool:
    """Give ``proc`` ``grace`` seconds to exit, then kill its process group, whatever it spawned
    included (at once when interrupted); True: it had not exited in time."""
    late = False
    try:
        proc.wait(timeout=max(grace, 0.0))
    except subprocess.TimeoutExpired:
        late = True
    except BaseException:  # interrupted: take the child (and its group) with us
        kill_group(proc.pid)
        proc.wait()
        raise
    kill_group(proc.pid)
    if late:
        proc.wait()
    return late


def run_function(
    module: str,
    function: str,
    payload: Any,
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    source: str | None = None,
    teardown: bool = False,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> ChildResult:
    """``module.function(payload)`` (JSON in and out) in a child, within ``timeout`` seconds; never
    raises for the child's sake (a MemoryError it raises is its answer); ``source``: code defining
    ``function``, run instead of ``module``; ``teardown``: the child exits normally after answering
    (a crash at exit shows in ``returncode``); ``started`` receives its Popen as soon as it runs."""
    payload = payload.to_json() if hasattr(payload, "to_json") else payload
    begun = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernel-probe-child-") as tmp:
        d = Path(tmp)
        write_file(d / "payload.json", json.dumps(payload, default=str), mode=0o600)
        with open(d / "stdout", "wb") as out, open(d / "stderr", "wb") as err:
            call: dict[str, Any] = dict(mode="call", source=source)
            call["exit"] = "normal" if teardown else "hard"
            call |= dict(payload=str(d / "payload.json"), result=str(d / "result.json"))
            call |= dict(env=env, python=python)
            try:
                proc = spawn(
                    module, function, stdin=subprocess.DEVNULL, stdout=out, stderr=err, **call
                )
            except OSError as exc:
                reason = f"could not start {python or sys.executable}: {exc}"
                return ChildResult("crashed", reason=reason, started=False)
            if started is not None:
                started(proc)
            timed_out = end(proc, timeout)
        value = _answer(d / "result.json")
        stdout, stderr = _tail(d / "stdout"), _tail(d / "stderr")
    seconds = time.perf_counter() - begun
    common: dict[str, Any] = dict(returncode=proc.returncode, seconds=seconds, stdout=stdout)
    common |= dict(stderr=stderr, timed_out=timed_out)
    if value is not None and "raised" in value:
        reason = f"{value['raised']}: {value.get('message', '')}".strip()
        raised = {k: str(v) for k, v in value.items()}
        return ChildResult("error", reason=reason, raised=raised, **common)
    if value is not None:
        return ChildResult("ok", value=value["ok"], **common)
    if timed_out:
        return ChildResult("timeout", reason=f"no answer within {timeout:g} s (killed)", **common)
    code = proc.returncode
    how = (
        f"was killed by {signal_name(-code)}" if code and code < 0 else f"exited with status {code}"
    )
    detail = f": {line}" if (line := fatal_line(stderr)) else ""
    reason = f"the child process {how} without an answer{detail}"
    return ChildResult("crashed", reason=reason, **common)


def _answer(path: Path) -> dict[str, Any] | None:
    """The answer ``BOOT`` wrote, or None (none, torn, or not one ``BOOT`` writes: crashed)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(value, dict) and (set(value) == {"ok"} or isinstance(value.get("raised"), str))
    return value if ok else None
