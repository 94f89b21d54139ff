"""Does a module import here? Asked in a child process, so a crash, a hang or a stray print is only
a fact.

A kernel library can abort the interpreter on import (a missing or mismatched .so), hang (a lock
on a network filesystem, a driver call that never returns), or print to stdout (and so break a
JSON report). The child (``child.run_function``, with ``CHILD_SOURCE``: nothing of kernel_probe is
imported there) imports the module under a timeout and answers an ``ImportCheckReply``; it then
exits normally, so a crash at interpreter exit is seen too. The parent classifies what came back:

    ok             imported (its stdout, if any, is kept in ``stdout``)
    error          the import raised (exception type and message, and where)
    crashed        the child died from a signal (SIGSEGV, SIGABRT, ...) or exited without a result
    timeout        still running after ``timeout`` seconds; the child's process group is killed
    not-installed  there was nothing to import (decided by the caller, no child started)
    skipped        not checked (``--no-import-checks``, or a namesake that is not the library)
"""

from __future__ import annotations

import functools
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from kernel_probe.isolation.child import (
    ChildResult,
    child_environment,
    clip,
    fatal_line,
    kill_group,
    run_function,
    signal_name,
)
from kernel_probe.isolation.protocol import ImportCheckReply, ProtocolError
from kernel_probe.isolation.protocol import ImportCheckRequest as ImportRequest

if TYPE_CHECKING:
    from kernel_probe.detect.importcache import ImportCache

__all__ = [
    "DEFAULT_TIMEOUT",
    "PROBES",
    "STATUSES",
    "ImportChecks",
    "ImportRequest",
    "check_import",
    "classify",
    "close_calls",
    "scaled_timeout",
]

DEFAULT_TIMEOUT = 20.0
# a machine loaded beyond one runnable process per core makes every import slower by about that
# factor: the default timeout is scaled by it (never below 1x, at most MAX_SCALE x), and a check
# that took more than CLOSE of its timeout is named, so the next run under more load is not a
# surprise
MAX_SCALE = 6.0
CLOSE = 0.5


def load_per_core() -> float:
    """Runnable processes per usable core over the last minute (0.0 where the OS does not say)."""
    import os

    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return load / max(1, cores)


def scaled_timeout(base: float = DEFAULT_TIMEOUT, load: float | None = None) -> float:
    """``base`` seconds scaled to the machine's measured load (``load_per_core`` when ``load`` is
    None)."""
    per_core = load_per_core() if load is None else load
    return base * min(MAX_SCALE, max(1.0, per_core))


def close_calls(results: Mapping[str, Mapping[str, Any]], timeout: float) -> list[str]:
    """A note for each import that took more than CLOSE of its timeout (or ran out of it)."""
    notes = []
    for name, r in results.items():
        seconds = r.get("seconds")
        if isinstance(seconds, (int, float)) and seconds >= CLOSE * timeout:
            what = "timed out after" if r.get("status") == "timeout" else "took"
            notes.append(
                f"{name}: the import check {what} {seconds:.1f} s of its {timeout:.0f} s timeout "
                f"(load {load_per_core():.1f} per core); pass a larger --timeout if it fails "
                "under more load"
            )
    return notes


STATUSES = ("ok", "error", "crashed", "timeout", "not-installed", "skipped")

# The child's function: an ImportCheckRequest in, an ImportCheckReply out (as JSON).
CHILD_SOURCE = r"""
def check(request):
    import importlib, time, traceback
    start = time.perf_counter()
    try:
        mod = importlib.import_module(request["module"])
    except BaseException as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        where = next((f"{f.filename}:{f.lineno}" for f in reversed(frames)
                      if not f.filename.startswith("<")), "")
        result = {"ok": False, "type": type(exc).__name__, "message": str(exc)[:2000],
                  "where": where}
    else:
        result = {"ok": True}
        for key, attr in (("file", "__file__"), ("version", "__version__")):
            try:  # a module __getattr__ may raise anything, not only AttributeError
                value = getattr(mod, attr, None)
                result[key] = None if value is None else str(value)
            except BaseException as exc:
                result[key] = None
    result["seconds"] = time.perf_counter() - start
    if result["ok"] and request.get("probe") == "triton-target":
        try:
            from triton.runtime import driver
            target = driver.active.get_current_target()
            result["target"] = {"backend": str(target.backend), "arch": str(target.arch),
                                "warp_size": getattr(target, "warp_size", None)}
        except BaseException as exc:
            result["target_error"] = f"{type(exc).__name__}: {exc}"[:2000]
    return result
"""

PROBES = ("", "triton-target")  # what the child may do after a successful import


def classify(child: ChildResult, timeout: float) -> dict[str, Any]:
    """Turn what a child left behind into ``{status, reason, seconds, ...}`` (a pure function)."""
    reply: ImportCheckReply | None = None
    broken = ""
    if child.ok:
        try:
            reply = ImportCheckReply.from_json(child.value)
        except ProtocolError as exc:
            broken = str(exc)
    elif child.status == "error":  # the child's own code raised: a bug, not the library's doing
        broken = child.reason
    returncode = child.returncode
    out: dict[str, Any] = {"status": "", "reason": "", "seconds": round(child.seconds, 3)}
    if child.timed_out:
        out["status"] = "timeout"
        out["reason"] = f"import did not finish within {timeout:g} s (child killed)"
    elif not child.started:
        out["status"], out["reason"] = "error", child.reason
    elif returncode is not None and returncode < 0:
        out["status"] = "crashed"
        when = "after importing, at interpreter exit" if reply is not None else "during import"
        detail = _stderr_reason(child.stderr)
        out["reason"] = f"killed by {signal_name(-returncode)} {when}" + (
            f": {detail}" if detail else ""
        )
    elif reply is None:
        out["status"] = "crashed" if returncode else "error"
        detail = broken or _stderr_reason(child.stderr)
        out["reason"] = (
            f"exited with code {returncode} without a result"
            if returncode
            else "the child wrote no result"
        ) + (f": {detail}" if detail else "")
    elif reply.ok:
        out["status"] = "ok"
        out["reason"] = "imported"
        if returncode:
            out["reason"] = f"imported, then exited with code {returncode}"
    else:
        out["status"] = "error"
        out["reason"] = f"{reply.type or 'Exception'}: {reply.message}".strip()
        if reply.where:
            out["where"] = reply.where
    if reply is not None:
        out["import_seconds"] = round(float(reply.seconds), 3)
        if reply.file:
            out["file"] = reply.file
        if reply.version:
            out["module_version"] = reply.version
        if reply.target is not None:
            out["target"] = reply.target
        if reply.target_error:
            out["target_error"] = reply.target_error
    if child.stdout.strip():
        out["stdout"] = clip(child.stdout, 2000)
    if child.stderr.strip() and out["status"] != "ok":
        out["stderr"] = clip(child.stderr, 4000)
    return out


def _stderr_reason(stderr: str) -> str:
    """faulthandler's 'Fatal Python error' and the innermost frame (without its ' in <module>'),
    else the last line."""
    return fatal_line(stderr).replace(" in <module>)", ")")


def check_import(
    request: ImportRequest | str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    extra_paths: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
    cache: ImportCache | None = None,
) -> dict[str, Any]:
    """Import one module in a fresh interpreter and report how it went (never raises for the
    module's sake).

    ``started`` is called with the child's Popen as soon as it runs (so a caller can cancel it).
    ``cache``: an earlier clean answer for the same installation is reused (``cached`` in the result
    says when it was asked), and a new clean answer is kept (``detect.importcache``).
    """
    if isinstance(request, str):
        request = ImportRequest(module=request)
    if request.probe not in PROBES:
        raise ValueError(f"unknown probe {request.probe!r}")
    key = ""
    keyed = cache is not None and python is None

    def _key() -> str:
        from kernel_probe.detect.importcache import cache_key

        return cache_key(request, child_source=CHILD_SOURCE, extra_paths=extra_paths, env=env)

    if keyed and cache is not None and cache.read:
        key = _key()
        found = cache.load(key)
        if found is not None:
            kept, asked = found
            return {**classify(kept, timeout), "cached": asked}

    def _started(proc: subprocess.Popen[bytes]) -> None:
        nonlocal key
        if started is not None:
            started(proc)
        # --fresh: the key is worked out while the child imports, not before it starts
        if keyed and not key:
            key = _key()

    child = run_function(
        "",
        "check",
        request,
        source=CHILD_SOURCE,
        teardown=True,
        timeout=timeout,
        env=child_environment(extra_paths, env),
        python=python,
        started=_started,
    )
    if key and cache is not None:
        cache.store(key, child)
    return classify(child, timeout)


def _set(event: threading.Event, _future: Future) -> None:
    event.set()


class ImportChecks:
    """Start every check at once (a thread per child) and collect the results later.

    The constructor returns once every child has started (or its check ended without one: a kept
    answer, a failure to start), so the caller's own work (importing torch) cannot delay a start:
    the children import their libraries while the parent does the rest.
    """

    def __init__(
        self,
        requests: Mapping[str, ImportRequest],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        extra_paths: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cache: ImportCache | None = None,
    ):
        self._futures: dict[str, Future] = {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self._cancelled = False
        self._pool: ThreadPoolExecutor | None = None
        if requests:
            # a thread per check (each only waits on its child): every child starts now, none queues
            self._pool = ThreadPoolExecutor(
                max_workers=len(requests), thread_name_prefix="import-check"
            )
            ready = {name: threading.Event() for name in requests}
            for name, request in requests.items():
                future = self._pool.submit(
                    check_import,
                    request,
                    timeout=timeout,
                    extra_paths=extra_paths,
                    env=env,
                    started=functools.partial(self._started, ready[name]),
                    cache=cache,
                )
                future.add_done_callback(functools.partial(_set, ready[name]))
                self._futures[name] = future
            try:
                for event in ready.values():
                    event.wait()
            except BaseException:  # interrupted while the children start
                self.cancel()
                raise

    def names(self) -> Iterable[str]:
        """The libraries whose import checks were started."""
        return self._futures.keys()

    def _started(self, ready: threading.Event, proc: subprocess.Popen[bytes]) -> None:
        self._procs.append(proc)
        ready.set()
        if self._cancelled:  # started while cancel() was running
            kill_group(proc.pid)

    def cancel(self) -> None:
        """Kill every child still running (Ctrl-C, or the caller failed): nobody waits out the
        timeouts."""
        self._cancelled = True
        for future in self._futures.values():
            future.cancel()
        for proc in list(self._procs):
            if proc.poll() is None:
                kill_group(proc.pid)

    def results(self) -> dict[str, dict[str, Any]]:
        """Each library's import check result, waiting for the ones still running."""
        out = {}
        try:
            for name, future in self._futures.items():
                try:
                    out[name] = future.result()
                # a bug in the checker itself: report it on that library, go on
                except Exception as exc:
                    out[name] = {
                        "status": "error",
                        "seconds": 0.0,
                        "reason": f"import check failed: {type(exc).__name__}: {exc}",
                    }
        # KeyboardInterrupt while waiting: the children are in their own sessions
        except BaseException:
            self.cancel()
            raise
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        return out
