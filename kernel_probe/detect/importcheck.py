"""Does a module import here? Asked in a child process, so a crash, a hang or a stray print is only a fact.

A kernel library can abort the interpreter on import (a missing or mismatched .so), hang (a lock
on a network filesystem, a driver call that never returns), or print to stdout (and so break a
JSON report). The child runs ``python -c`` with the module name, under a timeout, and writes one
marked JSON line after the import; the parent classifies what came back:

    ok             imported (its stdout, if any, is kept in ``stdout``)
    error          the import raised (exception type and message, and where)
    crashed        the child died from a signal (SIGSEGV, SIGABRT, ...) or exited without a result
    timeout        still running after ``timeout`` seconds; the child's process group is killed
    not-installed  there was nothing to import (decided by the caller, no child started)
    skipped        not checked (``--no-import-checks``, or a namesake that is not the library)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT = 20.0
MARK = "@@kernel-probe-import-result@@"

STATUSES = ("ok", "error", "crashed", "timeout", "not-installed", "skipped")

# The child program. It must not import kernel_probe (the child may have a different sys.path),
# and it drops the working directory from sys.path: the question is what is installed, not what
# sits in the caller's current folder.
CHILD_SOURCE = r"""
import sys
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
import importlib, json, time, traceback
module, probe = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
start = time.perf_counter()
try:
    mod = importlib.import_module(module)
except BaseException as exc:
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f"{f.filename}:{f.lineno}" for f in reversed(frames) if not f.filename.startswith("<")), "")
    result = {"ok": False, "type": type(exc).__name__, "message": str(exc)[:2000], "where": where}
else:
    result = {"ok": True}
    for key, attr in (("file", "__file__"), ("version", "__version__")):
        try:  # a module __getattr__ may raise anything, not only AttributeError
            value = getattr(mod, attr, None)
            result[key] = None if value is None else str(value)
        except BaseException as exc:
            result[key] = None
result["seconds"] = time.perf_counter() - start
if result["ok"] and probe == "triton-target":
    try:
        from triton.runtime import driver
        target = driver.active.get_current_target()
        result["target"] = {"backend": str(target.backend), "arch": str(target.arch),
                            "warp_size": getattr(target, "warp_size", None)}
    except BaseException as exc:
        result["target_error"] = f"{type(exc).__name__}: {exc}"[:2000]
sys.stdout.flush()
sys.stdout.write("\n" + MARK + json.dumps(result) + "\n")
sys.stdout.flush()
""".replace("MARK", repr(MARK))

PROBES = ("", "triton-target")  # what the child may do after a successful import


@dataclass(frozen=True)
class ImportRequest:
    """One module to import in a child, and an optional probe to run after it."""

    module: str
    probe: str = ""


def _tail(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _stderr_reason(stderr: str) -> str:
    """The most telling part of a child's stderr.

    After a crash, faulthandler (``-X faulthandler``) printed 'Fatal Python error: ...' and the
    stack, innermost frame first: keep the error line and that frame. Otherwise the last line.
    """
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            frame = next((f for f in lines[i + 1:] if f.startswith("File ") and "<frozen" not in f), "")
            return f"{line} ({frame.split(' in <module>')[0]})" if frame else line
    return lines[-1] if lines else ""


def classify(returncode: int | None, stdout: str, stderr: str, *, timed_out: bool, seconds: float,
             timeout: float) -> dict[str, Any]:
    """Turn what a child left behind into ``{status, reason, seconds, ...}`` (a pure function)."""
    before, found, marked = stdout.rpartition(MARK)
    result: dict[str, Any] | None = None
    library_stdout = stdout  # what the library itself printed
    if found:
        library_stdout = before
        try:
            result = json.loads(marked.strip().splitlines()[0])
        except (ValueError, IndexError):
            result = None
    out: dict[str, Any] = {"status": "", "reason": "", "seconds": round(seconds, 3)}
    if timed_out:
        out["status"] = "timeout"
        out["reason"] = f"import did not finish within {timeout:g} s (child killed)"
    elif returncode is not None and returncode < 0:
        out["status"] = "crashed"
        when = "after importing, at interpreter exit" if result is not None else "during import"
        detail = _stderr_reason(stderr)
        out["reason"] = f"killed by {signal_name(-returncode)} {when}" + (f": {detail}" if detail else "")
    elif result is None:
        out["status"] = "crashed" if returncode else "error"
        detail = _stderr_reason(stderr)
        out["reason"] = (f"exited with code {returncode} without a result" if returncode
                         else "the child wrote no result") + (f": {detail}" if detail else "")
    elif result.get("ok"):
        out["status"] = "ok"
        out["reason"] = "imported"
        if returncode:
            out["reason"] = f"imported, then exited with code {returncode}"
    else:
        out["status"] = "error"
        out["reason"] = f"{result.get('type', 'Exception')}: {result.get('message', '')}".strip()
        if result.get("where"):
            out["where"] = result["where"]
    if result is not None:
        out["import_seconds"] = round(float(result.get("seconds", 0.0)), 3)
        if result.get("file"):
            out["file"] = result["file"]
        if result.get("version"):
            out["module_version"] = result["version"]
        if "target" in result:
            out["target"] = result["target"]
        if "target_error" in result:
            out["target_error"] = result["target_error"]
    printed = library_stdout.strip()
    if printed:
        out["stdout"] = _tail(printed, 2000)
    if stderr.strip() and out["status"] != "ok":
        out["stderr"] = _tail(stderr, 4000)
    return out


def child_environment(extra_paths: Sequence[str] = (), env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ours (or ``env``), with ``extra_paths`` in front of PYTHONPATH."""
    base = dict(os.environ if env is None else env)
    if extra_paths:
        parts = [str(p) for p in extra_paths]
        if base.get("PYTHONPATH"):
            parts.append(base["PYTHONPATH"])
        base["PYTHONPATH"] = os.pathsep.join(parts)
    base.setdefault("PYTHONIOENCODING", "utf-8")
    return base


def check_import(request: ImportRequest | str, *, timeout: float = DEFAULT_TIMEOUT, extra_paths: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, python: str | None = None,
                 started: Callable[[subprocess.Popen], None] | None = None) -> dict[str, Any]:
    """Import one module in a fresh interpreter and report how it went (never raises for the module's sake).

    ``started`` is called with the child's Popen as soon as it runs (so a caller can cancel it).
    """
    if isinstance(request, str):
        request = ImportRequest(request)
    if request.probe not in PROBES:
        raise ValueError(f"unknown probe {request.probe!r}")
    argv = [python or sys.executable, "-X", "faulthandler", "-c", CHILD_SOURCE, request.module]
    if request.probe:
        argv.append(request.probe)
    posix = os.name == "posix"
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=child_environment(extra_paths, env), start_new_session=posix)
    except OSError as exc:
        return {"status": "error", "reason": f"could not start {argv[0]}: {exc}", "seconds": 0.0}
    if started is not None:
        started(proc)
    timed_out = False
    try:
        raw_out, raw_err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc, posix)
        try:
            raw_out, raw_err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a grandchild that left the group still holds the pipes
            raw_out, raw_err = b"", b""
    seconds = time.perf_counter() - start
    return classify(proc.returncode, raw_out.decode("utf-8", "replace"), raw_err.decode("utf-8", "replace"),
                    timed_out=timed_out, seconds=seconds, timeout=timeout)


def _kill(proc: subprocess.Popen, posix: bool) -> None:
    try:
        if posix:
            os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session: this kills only its group
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


class ImportChecks:
    """Start every check at once (a thread per child) and collect the results later.

    Starting early lets the children import their libraries while the parent imports torch.
    """

    def __init__(self, requests: Mapping[str, ImportRequest], *, timeout: float = DEFAULT_TIMEOUT,
                 extra_paths: Sequence[str] = (), env: Mapping[str, str] | None = None):
        self._futures: dict[str, Future] = {}
        self._procs: list[subprocess.Popen] = []
        self._cancelled = False
        self._pool: ThreadPoolExecutor | None = None
        if requests:
            self._pool = ThreadPoolExecutor(max_workers=min(8, len(requests)), thread_name_prefix="import-check")
            for name, request in requests.items():
                self._futures[name] = self._pool.submit(check_import, request, timeout=timeout,
                                                        extra_paths=extra_paths, env=env, started=self._started)

    def names(self) -> Iterable[str]:
        return self._futures.keys()

    def _started(self, proc: subprocess.Popen) -> None:
        self._procs.append(proc)
        if self._cancelled:  # started while cancel() was running
            _kill(proc, os.name == "posix")

    def cancel(self) -> None:
        """Kill every child still running (Ctrl-C, or the caller failed): nobody waits out the timeouts."""
        self._cancelled = True
        for future in self._futures.values():
            future.cancel()
        for proc in list(self._procs):
            if proc.poll() is None:
                _kill(proc, os.name == "posix")

    def results(self) -> dict[str, dict[str, Any]]:
        out = {}
        try:
            for name, future in self._futures.items():
                try:
                    out[name] = future.result()
                except Exception as exc:  # a bug in the checker itself: report it on that library, go on
                    out[name] = {"status": "error", "seconds": 0.0,
                                 "reason": f"import check failed: {type(exc).__name__}: {exc}"}
        except BaseException:  # KeyboardInterrupt while waiting: the children are in their own sessions
            self.cancel()
            raise
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        return out
