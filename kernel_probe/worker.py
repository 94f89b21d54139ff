"""Process isolation for foreign code.

Candidates are imported and run in a child process that speaks JSON lines. One worker serves many
candidates (torch is imported once); a candidate that segfaults, aborts, hangs, raises a CUDA error
or runs out of memory costs only that worker: the parent records ``crashed`` / ``timeout`` with the
captured reason and starts a fresh worker for the next one.

The worker's protocol channel is a duplicate of its original stdout; fd 1 itself is pointed at
stderr, so a library that prints on import cannot corrupt the protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from .detect.importcheck import signal_name

DEFAULT_TIMEOUT = 300.0  # a timing call's budget (the checks have their own: checker.CHECK_TIMEOUT)
START_TIMEOUT = 120.0


class WorkerDied(Exception):
    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status  # "crashed" | "timeout"
        self.reason = reason


class Worker:
    """A child Python process running :func:`serve`."""

    def __init__(self, env: Mapping[str, str] | None = None):
        self._env = dict(os.environ if env is None else env)
        self._proc: subprocess.Popen[str] | None = None
        self._stderr = None
        self._mark = 0
        self.started = 0

    # -- lifecycle ----------------------------------------------------------------------------
    def _start(self) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kernel_probe.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=self._env,
            text=True,
            bufsize=1,
        )
        self.started += 1
        self._call({"op": "ping"}, START_TIMEOUT)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.poll() is None and proc.stdin:
                    proc.stdin.close()
                    proc.wait(timeout=5)
            except Exception:
                pass
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                try:
                    if pipe is not None:
                        pipe.close()
                except OSError:  # a pipe to a dead process may refuse a final flush
                    pass
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls --------------------------------------------------------------------------------
    def call(self, request: Mapping[str, Any], timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """Send one request; on crash or timeout raise WorkerDied (the next call gets a fresh worker)."""
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._start()
        return self._call(request, timeout)

    def _stderr_tail(self, limit: int = 1500) -> str:
        """What the worker wrote to stderr since the current request began."""
        if self._stderr is None:
            return ""
        self._stderr.flush()
        self._stderr.seek(self._mark)
        data = self._stderr.read().decode("utf-8", "replace")
        self._stderr.seek(0, 2)
        lines = [l for l in data.strip().splitlines() if l.strip()]
        return "\n".join(lines)[-limit:]

    def _call(self, request: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        box: list[str] = []
        if self._stderr is not None:
            self._stderr.seek(0, 2)
            self._mark = self._stderr.tell()

        def read() -> None:
            box.append(proc.stdout.readline())

        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the read below sees EOF and reports the crash
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive():
            proc.kill()
            proc.wait()
            tail = self._stderr_tail()
            self.close()
            raise WorkerDied("timeout", f"no answer within {timeout:.0f} s (killed)" + (f"; last output: {tail[-300:]}" if tail else ""))
        line = box[0] if box else ""
        if not line:
            try:
                code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            tail = self._stderr_tail()
            how = f"killed by {signal_name(-code)}" if code < 0 else f"exited with status {code}"
            self.close()
            raise WorkerDied("crashed", f"the worker process {how}" + (f"; stderr: {tail[-600:]}" if tail else ""))
        reply = json.loads(line)
        if "fatal" in reply:
            raise RuntimeError(f"worker error: {reply['fatal']}")
        return reply


# ---- the child side -----------------------------------------------------------------------------
def serve() -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by foreign code goes to stderr, not the protocol
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            reply = _dispatch(request)
        except Exception as exc:  # a bug in the probe itself, reported to the parent
            import traceback

            reply = {"fatal": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"}
        proto.write(json.dumps(reply, default=str) + "\n")
        proto.flush()


def _dispatch(request: Mapping[str, Any]) -> dict[str, Any]:
    op = request["op"]
    if op == "ping":
        import torch  # noqa: F401  (import once, up front, under the start timeout)

        return {"ok": True, "pid": os.getpid()}
    from . import measure
    from .candidates import Candidate

    if op == "import":  # under its own time budget: a library that hangs here costs only that
        start = time.perf_counter()
        try:
            measure.import_class(request["target"])
        except ImportError as exc:
            return {"ok": False, "kind": "import", "error": f"{type(exc).__name__}: {exc}"}
        except Exception as exc:
            return {"ok": False, "kind": "exception", "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "seconds": time.perf_counter() - start}
    cand = Candidate.from_json(request["candidate"])
    if op == "check":
        baseline = request.get("baseline")
        return measure.check(
            cand, request["slot"], request["device"], [tuple(d) for d in request["dtypes"]],
            canonical_overrides=request.get("canonical"), seed=request.get("seed", 0),
            hidden=request.get("hidden", measure.CHECK_HIDDEN),
            baseline=Candidate.from_json(baseline) if baseline else None,
        )  # fmt: skip
    if op == "try":
        return measure.try_once(cand, request["slot"], request["device"])
    if op == "time":
        from . import timing

        return timing.time_candidate(cand, request["slot"], request["device"], request["shapes"], request["dtype"],
                                     request["regime"], request.get("canonical"), request.get("options", {}))  # fmt: skip
    raise ValueError(f"unknown op {op!r}")


if __name__ == "__main__":
    serve()
