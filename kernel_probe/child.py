"""Run one function in a child Python process, where a crash, a hang or a fork cannot hurt the caller.

    result = run_function("kernel_lock.anemoi", "check_entries", requests, timeout=120)
    if result.ok:
        use(result.value)
    else:
        report(result.status, result.reason)     # "crashed" / "timeout" / "error", with the evidence

The child is a fresh interpreter (``python -X faulthandler``) that imports ``module``, calls
``function(payload)`` and writes the JSON-ready return value to a result file. Nothing travels
through pipes: the payload, the result and the child's stdout/stderr are files, so a library that
forks a long-lived process holding the child's descriptors cannot block the caller, and whatever it
prints cannot corrupt the answer. The child leads its own process group; when it ends (or its time
is up) the whole group is killed, so nothing it spawned outlives the call. The child also dies with
its parent (``PR_SET_PDEATHSIG`` on Linux, and a check of the parent's pid), so a killed probe
leaves no orphans.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The child program. It imports only the standard library before ``module``, removes the working
# directory from sys.path (the question is what is installed, not what sits in the caller's folder)
# and arranges to die with its parent.
BOOT = r"""
import sys
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
import json, os
module, function, payload_path, result_path, parent = sys.argv[1:6]
def _die_with_parent():
    try:
        import ctypes, signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if str(os.getppid()) != parent:  # the parent died before prctl took effect
        os._exit(137)
_die_with_parent()
limit = os.environ.get("KERNEL_PROBE_CHILD_MEMORY")
if limit:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))
with open(payload_path, encoding="utf-8") as fh:
    payload = json.load(fh)
import importlib
try:
    value = {"ok": getattr(importlib.import_module(module), function)(payload)}
except MemoryError:
    value = {"raised": "MemoryError", "message": "the child ran out of its memory limit"}
except BaseException as exc:
    import traceback
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f"{f.filename}:{f.lineno}" for f in reversed(frames) if not f.filename.startswith("<")), "")
    value = {"raised": type(exc).__name__, "message": str(exc)[:4000], "where": where}
tmp = result_path + ".tmp"
with open(tmp, "w", encoding="utf-8") as fh:
    json.dump(value, fh, default=repr)
os.replace(tmp, result_path)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # skip interpreter teardown: a library's atexit hooks cannot change the answer
"""

TAIL = 4000  # characters of the child's stdout/stderr kept as evidence


@dataclass(frozen=True)
class ChildResult:
    """What came back from a child: ``status`` is ok, error (the function raised), crashed or timeout."""

    status: str
    value: Any = None
    reason: str = ""
    returncode: int | None = None
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    raised: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def kill_group(pid: int) -> None:
    """Kill the process group ``pid`` leads (the child and everything it spawned)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 4 * TAIL))
            text = fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return text if len(text) <= TAIL else "..." + text[-TAIL:]


def fatal_line(stderr: str) -> str:
    """The most telling line of a dead child's stderr (faulthandler's 'Fatal Python error', else the last)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            frame = next((f for f in lines[i + 1:] if f.startswith("File ") and "<frozen" not in f), "")
            return f"{line} ({frame})" if frame else line
    return lines[-1] if lines else ""


def child_environment(extra_paths: tuple[str, ...] | list[str] = (), env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ours (or ``env``), with ``extra_paths`` in front of PYTHONPATH."""
    base = dict(os.environ if env is None else env)
    if extra_paths:
        parts = [str(p) for p in extra_paths]
        if base.get("PYTHONPATH"):
            parts.append(base["PYTHONPATH"])
        base["PYTHONPATH"] = os.pathsep.join(parts)
    base.setdefault("PYTHONIOENCODING", "utf-8")
    return base


def run_function(module: str, function: str, payload: Any, *, timeout: float, env: Mapping[str, str] | None = None,
                 memory_limit: int | None = None, python: str | None = None) -> ChildResult:  # fmt: skip
    """``module.function(payload)`` in a child process, with a wall-clock ``timeout`` (seconds).

    ``payload`` and the return value are JSON. ``memory_limit`` (bytes) caps the child's address
    space, so a runaway (a YAML alias bomb) ends as a MemoryError instead of exhausting the node.
    Never raises for the child's sake.
    """
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernel-probe-child-") as tmp:
        d = Path(tmp)
        payload_path, result_path = d / "payload.json", d / "result.json"
        payload_path.write_text(json.dumps(payload, default=str), encoding="utf-8")
        child_env = dict(env) if env is not None else child_environment()
        if memory_limit:
            child_env["KERNEL_PROBE_CHILD_MEMORY"] = str(int(memory_limit))
        argv = [python or sys.executable, "-X", "faulthandler", "-c", BOOT, module, function, str(payload_path),
                str(result_path), str(os.getpid())]  # fmt: skip
        with open(d / "stdout", "wb") as out, open(d / "stderr", "wb") as err:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=child_env,
                                        start_new_session=True)  # fmt: skip
            except OSError as exc:
                return ChildResult("crashed", reason=f"could not start {argv[0]}: {exc}")
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BaseException:  # interrupted: take the child (and its group) with us
                kill_group(proc.pid)
                proc.wait()
                raise
            finally:
                kill_group(proc.pid)  # whatever it spawned ends with it
            if timed_out:
                proc.wait()
        seconds = time.perf_counter() - start
        stdout, stderr = _tail(d / "stdout"), _tail(d / "stderr")
        value = None
        if result_path.exists():
            try:
                value = json.loads(result_path.read_text(encoding="utf-8"))
            except ValueError:
                value = None
    common = dict(returncode=proc.returncode, seconds=seconds, stdout=stdout, stderr=stderr)
    if timed_out and value is None:
        return ChildResult("timeout", reason=f"no answer within {timeout:g} s (killed)", **common)
    if value is None:
        code = proc.returncode
        how = f"was killed by {signal_name(-code)}" if code is not None and code < 0 else f"exited with status {code}"
        detail = fatal_line(stderr)
        return ChildResult("crashed", reason=f"the child process {how} without an answer" + (f": {detail}" if detail else ""),
                           **common)  # fmt: skip
    if "raised" in value:
        raised = {k: str(v) for k, v in value.items()}
        return ChildResult("error", reason=f"{value['raised']}: {value.get('message', '')}".strip(), raised=raised, **common)
    return ChildResult("ok", value=value["ok"], **common)
