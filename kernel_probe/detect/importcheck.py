"""Does a module import here? Asked in a child process (``CHILD_SOURCE``: nothing of kernel_probe
is imported there), so an abort, a hang or a stray print is only a fact. The child imports under a
timeout, answers an ``ImportCheckReply`` and exits normally, so a crash at exit is seen too:

    ok             imported (its stdout, if any, is kept in ``stdout``)
    error          the import raised (exception type and message, and where)
    crashed        the child died from a signal (SIGSEGV, SIGABRT, ...) or exited without a result
    timeout        still running after ``timeout`` seconds; the child's process group is killed
    not-installed  there was nothing to import (decided by the caller, no child started)
    skipped        not checked (``--no-import-checks``, or a namesake that is not the library)

``ImportCache`` reuses a clean answer (exit 0, nothing printed), marked ``cached``, for ``MAX_AGE``
at most, while nothing in its ``cache_key`` (interpreter, boot, paths, files, variables) changed
and every file the import loaded (``loaded``: each module's file, its mtime and size, as the child
saw them) is as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock.files import UnsafeFile, UnsafeWrite, private_dir, read_regular, write_file
from kernel_probe import __version__
from kernel_probe.detect.host import read_lines, usable_cores
from kernel_probe.isolation.child import (
    ChildResult,
    child_environment,
    clip,
    fatal_line,
    kill_group,
    run_function,
    signal_name,
)
from kernel_probe.isolation.protocol import (
    ImportCheckCached,
    ImportCheckReply,
    ImportCheckRequest,
    ProtocolError,
)

STATUSES = ("ok", "error", "crashed", "timeout", "not-installed", "skipped")
PROBES = ("", "triton-target")  # what the child may do after a successful import
DEFAULT_TIMEOUT = 20.0
# a machine loaded beyond one runnable process per core makes every import slower by about that
# factor: the default timeout is scaled by it (1x to MAX_SCALE x), and a check that took more than
# CLOSE of its timeout is named, so the next run under more load is not a surprise
MAX_SCALE = 6.0
CLOSE = 0.5
FORMAT = "kernel-probe-import-cache/1"
CACHE_DIR_ENV = "KERNEL_PROBE_CACHE_DIR"  # the cache folder (cache_folder)
MAX_AGE = 7 * 24 * 3600.0  # seconds an answer is reused at the most
MAX_BYTES = 4 * 1024 * 1024  # a cached answer: ~110 bytes per file loaded (torch: ~1,000 files)
MAX_ENTRIES = 5000  # files of a library's package stat'ed for the key (liger-kernel has ~300)
ENV_NAMES = ("PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD")
ENV_PREFIXES = (
    ("CUDA_", "HIP_", "ROCM_", "ROCR_", "NVIDIA_")
    + ("TRITON_", "TORCH", "PYTORCH_")
    + ("NVTE_", "LIGER_")
)

# The child's function: an ImportCheckRequest in, an ImportCheckReply out (as JSON).
CHILD_SOURCE = r"""
def loaded(before, frames):
    import os, sys
    modules = [m for n, m in list(sys.modules.items()) if n not in before]
    out = set()
    for item in modules + [f.filename for f in frames]:  # what raised is gone from sys.modules
        try:  # a module __getattr__ may raise anything; a file may be gone
            path = item if isinstance(item, str) else getattr(item, "__file__", None)
            if isinstance(path, str) and os.path.isabs(path):
                st = os.stat(path)
                out.add((path, st.st_mtime_ns, st.st_size))
        except BaseException:
            continue
    return sorted(out)

def check(request):
    import importlib, sys, time, traceback
    start = time.perf_counter()
    before = set(sys.modules)
    frames = []
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
    result["loaded"] = loaded(before, frames)
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


def load_per_core() -> float:
    """Runnable processes per usable core over the last minute (0.0 where the OS does not say)."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0
    return load / max(1, usable_cores() or os.cpu_count() or 1)


def scaled_timeout(base: float = DEFAULT_TIMEOUT, load: float | None = None) -> float:
    """``base`` seconds scaled to the machine's load (``load_per_core`` when ``load`` is None)."""
    return base * min(MAX_SCALE, max(1.0, load_per_core() if load is None else load))


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


def _verdict(
    child: ChildResult, reply: ImportCheckReply | None, broken: str, timeout: float
) -> tuple[str, str]:
    code = child.returncode
    detail = fatal_line(child.stderr).replace(" in <module>)", ")")
    if child.timed_out:
        return "timeout", f"import did not finish within {timeout:g} s (child killed)"
    if not child.started:
        return "error", child.reason
    if code is not None and code < 0:
        when = "after importing, at interpreter exit" if reply is not None else "during import"
        said = f"killed by {signal_name(-code)} {when}"
        return "crashed", said + (f": {detail}" if detail else "")
    if reply is None:
        detail = broken or detail
        said = f"exited with code {code} without a result" if code else "the child wrote no result"
        return "crashed" if code else "error", said + (f": {detail}" if detail else "")
    if reply.ok:
        return "ok", "imported" + (f", then exited with code {code}" if code else "")
    return "error", f"{reply.type or 'Exception'}: {reply.message}".strip()


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
    status, reason = _verdict(child, reply, broken, timeout)
    out: dict[str, Any] = {"status": status, "reason": reason, "seconds": round(child.seconds, 3)}
    if reply is not None:
        if status == "error" and child.started and reply.where:  # the import raised
            out["where"] = reply.where
        out["import_seconds"] = round(float(reply.seconds), 3)
        found = dict(file=reply.file, module_version=reply.version, target=reply.target)
        out.update((k, v) for k, v in {**found, "target_error": reply.target_error}.items() if v)
    if child.stdout.strip():
        out["stdout"] = clip(child.stdout, 2000)
    if child.stderr.strip() and out["status"] != "ok":
        out["stderr"] = clip(child.stderr, 4000)
    return out


def cache_folder(env: Mapping[str, str] | None = None) -> Path:
    """The cache folder (not yet made): ``$KERNEL_PROBE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/kernel-probe``, else ``~/.cache/kernel-probe``."""
    e = os.environ if env is None else env
    if e.get(CACHE_DIR_ENV):
        return Path(e[CACHE_DIR_ENV])
    base = Path(e["XDG_CACHE_HOME"]) if e.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "kernel-probe"


def _stamp(path: str | os.PathLike[str]) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _package_files(module: str, paths: Sequence[str]) -> Iterator[list[Any]]:
    top = module.split(".", 1)[0]
    for folder in paths:
        root, single = Path(folder or ".") / top, Path(folder or ".") / f"{top}.py"
        if root.is_dir():
            seen = 0
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in sorted(n for n in filenames if not n.endswith(".pyc")):
                    seen += 1
                    if seen > MAX_ENTRIES:
                        yield ["(more files)", seen]
                        return
                    yield [os.path.join(dirpath, name), _stamp(os.path.join(dirpath, name))]
            return
        if single.is_file():
            yield [str(single), _stamp(single)]
            return


def unchanged(reply: Mapping[str, Any]) -> bool:
    """Every file the import loaded (the reply's ``loaded``) still has the mtime and size the
    child saw; an answer that lists none is not reused."""
    loaded = reply.get("loaded")
    if not isinstance(loaded, list) or not loaded:
        return False
    for item in loaded:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)):
            return False
        if _stamp(item[0]) != item[1:]:
            return False
    return True


def cache_key(
    request: ImportCheckRequest,
    *,
    child_source: str,
    extra_paths: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> str:
    """The hex digest of everything an import check's answer depends on."""
    e = os.environ if env is None else env
    paths = [str(p) for p in extra_paths] + [p for p in sys.path if p]
    boot = "".join(read_lines("/proc/sys/kernel/random/boot_id")).strip()
    facts = {
        "format": FORMAT,
        "kernel_probe": __version__,
        "child": hashlib.sha256(child_source.encode()).hexdigest(),
        "request": request.to_json(),
        "python": [sys.executable, sys.version, sys.prefix],
        "node": [socket.gethostname(), boot],
        "paths": [[p, _stamp(p)] for p in paths],
        "package": list(_package_files(request.module, paths)),
        "env": {k: e[k] for k in sorted(e) if k in ENV_NAMES or k.startswith(ENV_PREFIXES)},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


@dataclass
class ImportCache:
    """The cache folder, and in one run: ``used`` answers reused, the ``problem`` that turned
    it off."""

    folder: Path | None
    read: bool = True  # False: ask every library again (``--fresh``); answers are still written
    used: int = 0
    problem: str = ""
    _ready: bool = field(default=False, repr=False)

    @classmethod
    def default(cls, env: Mapping[str, str] | None = None, *, read: bool = True) -> ImportCache:
        """The cache in its usual folder (``cache_folder``)."""
        return cls(cache_folder(env), read=read)

    def _imports(self) -> Path | None:
        if self.folder is None or self.problem:
            return None
        if not self._ready:
            try:
                # ~/.cache on a new account: made private too
                new = () if self.folder.parent.exists() else (self.folder.parent,)
                for folder in (*new, self.folder, self.folder / "imports"):
                    private_dir(folder, variable=CACHE_DIR_ENV)
            except (UnsafeWrite, OSError) as exc:
                self.problem = f"the import-check cache is off: {exc}"
                return None
            self._ready = True
        return self.folder / "imports"

    def load(self, key: str) -> tuple[ChildResult, str] | None:
        """The child result kept under ``key``, and when it was asked (None: missing, stale)."""
        folder = self._imports() if self.read else None
        if folder is None:
            return None
        try:
            entry = ImportCheckCached.from_json(
                json.loads(read_regular(folder / f"{key}.json", MAX_BYTES))
            )
            ImportCheckReply.from_json(entry.reply)  # what classify reads: refused here
        except (UnsafeFile, OSError, ValueError, TypeError, ProtocolError):
            return None
        if not all(isinstance(t, (int, float)) for t in (entry.asked, entry.seconds)):
            return None
        stale = not 0 <= time.time() - entry.asked <= MAX_AGE
        if entry.format != FORMAT or entry.key != key or stale or not unchanged(entry.reply):
            return None
        self.used += 1
        child = ChildResult(status="ok", value=entry.reply, returncode=0, seconds=entry.seconds)
        return child, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.asked))

    def store(self, key: str, child: ChildResult) -> None:
        """Keep a clean answer (the module's docstring); anything else is not kept."""
        clean = child.ok and child.returncode == 0 and not child.timed_out
        folder = self._imports() if clean and not child.stdout.strip() else None
        if folder is None:
            return
        asked, seconds, reply = time.time(), float(child.seconds), dict(child.value)
        entry = ImportCheckCached(format=FORMAT, key=key, asked=asked, seconds=seconds, reply=reply)
        try:
            write_file(folder / f"{key}.json", json.dumps(entry.to_json()), mode=0o600)
        except (UnsafeWrite, OSError) as exc:
            self.problem = f"the import-check cache is off: {exc}"


def check_import(
    request: ImportCheckRequest | str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    extra_paths: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
    cache: ImportCache | None = None,
) -> dict[str, Any]:
    """Import one module in a fresh interpreter and report how it went (never raises for the
    module's sake); ``started`` gets the child's Popen (to cancel it); ``cache`` keeps answers."""
    if isinstance(request, str):
        request = ImportCheckRequest(module=request)
    if request.probe not in PROBES:
        raise ValueError(f"unknown probe {request.probe!r}")
    key = ""
    args: dict[str, Any] = dict(child_source=CHILD_SOURCE, extra_paths=extra_paths, env=env)
    if cache is not None and cache.read:
        key = cache_key(request, **args)
        if (found := cache.load(key)) is not None:
            return {**classify(found[0], timeout), "cached": found[1]}

    def _started(proc: subprocess.Popen[bytes]) -> None:
        nonlocal key
        if started is not None:
            started(proc)
        if cache is not None and not key:  # --fresh: the key is worked out while the child imports
            key = cache_key(request, **args)

    call: dict[str, Any] = dict(source=CHILD_SOURCE, teardown=True, timeout=timeout)
    call.update(env=child_environment(extra_paths, env), started=_started)
    child = run_function("", "check", request, **call)
    if key and cache is not None:
        cache.store(key, child)
    return classify(child, timeout)


class ImportChecks:
    """Every check started at once (a thread per child) and collected later; the constructor returns
    once every child has started, so the caller's own work (importing torch) cannot delay one."""

    def __init__(
        self,
        requests: Mapping[str, ImportCheckRequest],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        extra_paths: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cache: ImportCache | None = None,
    ):
        self._results: dict[str, dict[str, Any]] = {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self._cancelled = False
        options: dict[str, Any] = dict(
            timeout=timeout, extra_paths=extra_paths, env=env, cache=cache
        )
        ready = {name: threading.Event() for name in requests}

        def check(name: str, request: ImportCheckRequest) -> None:
            def started(proc: subprocess.Popen[bytes]) -> None:
                self._procs.append(proc)
                ready[name].set()
                if self._cancelled:  # started while cancel() was running
                    kill_group(proc.pid)

            try:
                self._results[name] = check_import(request, started=started, **options)
            except Exception as exc:  # a bug in the checker itself: said on that library
                reason = f"import check failed: {type(exc).__name__}: {exc}"
                self._results[name] = {"status": "error", "seconds": 0.0, "reason": reason}
            finally:
                ready[name].set()

        self._threads = {
            name: threading.Thread(target=check, args=(name, r), name="import-check")
            for name, r in requests.items()
        }
        for thread in self._threads.values():
            thread.start()
        try:
            for event in ready.values():
                event.wait()
        except BaseException:  # interrupted while the children start
            self.cancel()
            raise

    def cancel(self) -> None:
        """Kill every child still running (Ctrl-C, or the caller failed)."""
        self._cancelled = True
        for proc in list(self._procs):
            if proc.poll() is None:
                kill_group(proc.pid)

    def results(self) -> dict[str, dict[str, Any]]:
        """Each library's import check result, waiting for the ones still running."""
        try:
            for thread in self._threads.values():
                thread.join()
        except BaseException:  # KeyboardInterrupt while waiting: the children are in own sessions
            self.cancel()
            raise
        return {name: self._results[name] for name in self._threads}
