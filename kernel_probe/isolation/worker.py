"""Process isolation for foreign code.

Candidates are imported and run in a child process (the worker) that speaks JSON lines. A candidate
that segfaults, aborts, hangs, forks, raises a CUDA error or runs out of memory costs only its
worker: the parent records ``crashed`` / ``timeout`` with the captured reason and starts a fresh
one.

Which worker serves which candidate (``WorkerPool``): torch's own candidates share one worker,
started before any library is imported, so the torch.nn baseline and the float64 reference it
computes cannot have been patched by a library; every other library gets a fresh worker of its own,
so nothing one library does on import (patching ``torch.nn.functional.layer_norm``, say) can reach
another's verdict. Each worker also snapshots the torch functions the reference and the baseline use
(``TORCH_SURFACE``) and reports any a candidate replaced: that candidate is refused.

Robustness: the worker leads its own process group and the parent kills the group when it closes
the worker, so nothing a candidate spawned outlives it; replies are read with ``select`` against a
deadline, never by a thread blocked on a pipe that a forked grandchild may hold open for ever. The
worker is started by ``child.spawn``, like every child of the probe: it dies with its parent
(``PR_SET_PDEATHSIG``, Linux), and a small reaper in its group kills the group when the worker dies,
so a killed probe leaves no worker and no grandchild behind. Requests and replies are the typed
messages of ``protocol``. The worker's
protocol channel is a duplicate of its original stdout; fd 1 itself is pointed at stderr, so a
library that prints cannot corrupt the protocol.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, cast

from kernel_probe.isolation.child import kill_group, signal_name, spawn
from kernel_probe.isolation.protocol import (
    REQUESTS,
    ImportRequest,
    PingReply,
    PingRequest,
    R,
    Reply,
    Request,
    TimingProgressMessage,
    interpreter_requested,
    request_from_json,
)

DEFAULT_TIMEOUT = (
    300.0  # a call's budget unless the caller says otherwise (checks and imports have their own)
)
START_TIMEOUT = 120.0
CLOSE_GRACE = 5.0  # seconds a worker has to exit after its input closes
POOL_GRACE = 0.5  # seconds a pool's workers have together, once every reply is in
# the module whose serve() a worker process runs (a name: not imported here)
HANDLERS = "kernel_probe.probe.handlers"

# torch functions the float64 reference and the torch.nn baseline go through: a candidate that
# replaces one of them (on import or while it runs) would change every other verdict in its process
TORCH_SURFACE = (
    "torch.nn.functional.layer_norm",
    "torch.nn.functional.rms_norm",
    "torch.nn.functional.linear",
    "torch.layer_norm",
    "torch.rms_norm",
    "torch.rsqrt",
    "torch.matmul",
    "torch.nn.LayerNorm.forward",
    "torch.nn.RMSNorm.forward",
    "torch.nn.Linear.forward",
    "torch.nn.LayerNorm.__init__",
    "torch.nn.RMSNorm.__init__",
    "torch.nn.Linear.__init__",
    "torch.Tensor.backward",
    "torch.autograd.backward",
    "torch.Tensor.__add__",
    "torch.Tensor.__mul__",
    "torch.Tensor.__sub__",
    "torch.Tensor.pow",
    "torch.Tensor.mean",
    "torch.Tensor.to",
)


class WorkerDied(Exception):
    """The worker crashed or gave no answer in time (and was killed): ``status`` says which."""

    def __init__(self, status: Literal["crashed", "timeout"], reason: str):
        super().__init__(reason)
        self.status: Literal["crashed", "timeout"] = status
        self.reason = reason


PING = (json.dumps(PingRequest().to_json()) + "\n").encode()


def _spawn(env: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], Any]:
    """A worker process (``child.spawn``: its own process group, dies with us, a reaper kills its
    group when it dies; the working directory stays on its path, for a local ``--candidate``),
    already asked to start up (its ping not yet read)."""
    stderr = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 (open for the worker's life; closed with it)
    proc = spawn(
        HANDLERS,
        "serve",
        env=env,
        keep_cwd=True,
        reaper=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        bufsize=0,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(PING)
        proc.stdin.flush()
    except (BrokenPipeError, OSError):
        pass  # reading the reply reports the crash
    return proc, stderr


class Worker:
    """A child Python process running :func:`serve`, in its own process group.

    ``spare`` (a pool's) hands over a process spawned ahead of time, so its start-up (importing
    torch) overlapped with other work.
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        spare: Callable[[], tuple[subprocess.Popen[bytes], Any] | None] | None = None,
    ):
        self._env = dict(os.environ if env is None else env)
        self._spare = spare
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buffer = b""
        self._mark = 0
        self.started = 0
        self._ping_unread = False  # started by send_ahead: its start-up ping is still to be read
        self._ahead: str | None = (
            None  # the request send_ahead wrote, whose reply is still to be read
        )

    # -- lifecycle ----------------------------------------------------------------------------
    def _launch(self) -> None:
        spawned = self._spare() if self._spare is not None else None
        self._proc, self._stderr = spawned or _spawn(self._env)
        self._buffer = b""
        self._mark = 0
        self.started += 1
        self._ping_unread = True

    def _start(self) -> None:
        self._launch()
        self._read_ping()

    def _read_ping(self) -> None:
        self._ping_unread = False
        # the ping sent at spawn time
        self._reply(PingReply, START_TIMEOUT, time.monotonic() + START_TIMEOUT)

    def send_ahead(self, request: Request[Any]) -> None:
        """Start the worker if needed and write ``request`` now, without waiting: its reply is read
        by the ``call`` of the same request, so a library's import runs while other workers check.
        (A different call first reads and drops it: replies come in order.)"""
        if self._ahead is not None:
            return
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._launch()
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        line = json.dumps(request.to_json())
        try:
            proc.stdin.write((line + "\n").encode())
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the call that reads it reports the crash
        self._ahead = line

    def hang_up(self) -> None:
        """Tell the worker to leave its loop (EOF on its stdin) without waiting: a pool hangs up on
        all of its workers first, so their interpreters exit side by side (``close`` then waits)."""
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()  # EOF: the worker leaves its loop
            except OSError:
                pass

    def close(self, grace: float = CLOSE_GRACE) -> None:
        """End the worker and everything it spawned: ``grace`` seconds to exit on its own, then its
        process group is killed; never blocks on a pipe a grandchild holds."""
        self.hang_up()
        proc, self._proc = self._proc, None
        self._ping_unread, self._ahead = False, None  # a new process owes no earlier reply
        if proc is not None:
            try:
                proc.wait(timeout=max(grace, 0.0))
            except subprocess.TimeoutExpired:
                pass
            kill_group(proc.pid)  # the worker, if still there, and whatever a candidate spawned
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()  # nobody is reading it: closing cannot deadlock
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls --------------------------------------------------------------------------------
    def call(
        self,
        request: Request[R],
        timeout: float = DEFAULT_TIMEOUT,
        on_progress: Callable[[TimingProgressMessage], None] | None = None,
    ) -> R:
        """Send one request; its reply (``request.REPLY``) comes back. On crash or timeout raise
        WorkerDied (the next call gets a fresh worker). ``on_progress`` receives the worker's
        progress messages that come before the reply (a ``TimeRequest`` asks for them with
        ``progress=True``); ``timeout`` covers the whole call."""
        if self._proc is None or (
            self._proc.poll() is not None and not self._ping_unread and self._ahead is None
        ):
            self.close()
            self._start()
        elif self._ping_unread:
            self._read_ping()
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            if ahead == json.dumps(request.to_json()):  # written already: read its reply
                return self._call(request, timeout, on_progress, written=True)
            kind = REQUESTS[json.loads(ahead)["op"]].REPLY
            self._call_reply(kind, timeout, None)  # not this call's: read and drop it
        return self._call(request, timeout, on_progress)

    def _stderr_tail(self, limit: int = 1500) -> str:
        """What the worker wrote to stderr since the current request began."""
        if self._stderr is None:
            return ""
        self._stderr.flush()
        self._stderr.seek(self._mark)
        data = self._stderr.read().decode("utf-8", "replace")
        self._stderr.seek(0, 2)
        lines = [line for line in data.strip().splitlines() if line.strip()]
        return "\n".join(lines)[-limit:]

    def _readline(self, deadline: float) -> bytes | None:
        """The next reply line; b"" when the worker died without one; None when the deadline
        passed."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.25))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return b""  # EOF: the worker (and whatever inherited the pipe) is gone
                self._buffer += chunk
            elif proc.poll() is not None:
                # the worker died; a process it forked may still hold the pipe open, so EOF may
                # never come: take what has arrived and stop waiting
                ready, _, _ = select.select([fd], [], [], 0)
                if ready:
                    chunk = os.read(fd, 1 << 16)
                    self._buffer += chunk
                    if chunk:
                        continue
                return b"" if b"\n" not in self._buffer else self._buffer.split(b"\n", 1)[0]
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _call(
        self,
        request: Request[R],
        timeout: float,
        on_progress: Callable[[TimingProgressMessage], None] | None = None,
        *,
        written: bool = False,
    ) -> R:
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        if self._stderr is not None and not written:
            self._stderr.seek(0, 2)
            self._mark = self._stderr.tell()
        if not written:
            try:
                proc.stdin.write((json.dumps(request.to_json()) + "\n").encode())
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass  # the read below sees the worker gone and reports the crash
        return cast(R, self._call_reply(request.REPLY, timeout, on_progress))

    def _call_reply(
        self,
        kind: type[Reply],
        timeout: float,
        on_progress: Callable[[TimingProgressMessage], None] | None,
    ) -> Reply:
        deadline = time.monotonic() + timeout
        while True:
            reply = self._reply(kind, timeout, deadline)
            if isinstance(reply, Reply):
                return reply
            if on_progress is not None:
                on_progress(reply)

    def _reply(
        self, kind: type[Reply], timeout: float, deadline: float
    ) -> Reply | TimingProgressMessage:
        proc = self._proc
        assert proc is not None
        line = self._readline(deadline)
        if line is None:
            kill_group(proc.pid)
            proc.wait()
            tail = self._stderr_tail()
            self.close()
            raise WorkerDied(
                "timeout",
                f"no answer within {timeout:g} s (killed)"
                + (f"; last output: {tail[-300:]}" if tail else ""),
            )
        if not line:
            try:
                code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                code = proc.wait()
            tail = self._stderr_tail()
            self.close()
            how = f"killed by {signal_name(-code)}" if code < 0 else f"exited with status {code}"
            raise WorkerDied(
                "crashed",
                f"the worker process {how}" + (f"; stderr: {tail[-600:]}" if tail else ""),
            )
        data = json.loads(line)
        if "fatal" in data:
            raise RuntimeError(f"worker error: {data['fatal']}")
        if "progress" in data:
            return TimingProgressMessage.from_json(data["progress"])
        return kind.from_json(data)


def torch_own(cand: Any) -> bool:
    """A candidate that ships with torch (no library of its own): it may share the clean worker."""
    return cand.source == "builtin" and not cand.distribution and not cand.module


def library_of(cand: Any) -> str:
    """The library a candidate comes from (its distribution, else its top-level module)."""
    return cand.distribution or (cand.module or cand.target).split(".")[0]


class WorkerPool:
    """Which worker serves which candidate: torch's own candidates share one (started before any
    library is imported, so the torch.nn baseline and the reference cannot have been patched); each
    other library gets a fresh one of its own, which serves that library's candidates (liger's
    LayerNorm and RMSNorm) and nothing else.

    A fresh worker costs one interpreter start and ``import torch``; the pool keeps one spare
    process starting in the background, so that cost overlaps with the checks that run meanwhile.
    """

    def __init__(self, env: Mapping[str, str] | None = None):
        self._env = dict(os.environ if env is None else env)
        self.shared = Worker(self._env)
        self._libraries: dict[str, Worker] = {}
        self._next: tuple[subprocess.Popen[bytes], Any] | None = None
        self._spares = True  # keep one spare process starting (off once every library is known)

    @property
    def fresh(self) -> int:
        """Fresh workers started so far (a library whose candidates need no process starts none)."""
        return sum(w.started for w in self._libraries.values())

    def _take(self) -> tuple[subprocess.Popen[bytes], Any]:
        taken = self._next or _spawn(self._env)
        # the next library's, starting meanwhile
        self._next = _spawn(self._env) if self._spares else None
        return taken

    def prepare(self, ahead: Sequence[Any] | None = None) -> None:
        """Start the shared worker now. ``ahead``: the candidates whose libraries will need a worker
        (the first of each library is enough): each library's worker starts now and imports that
        candidate's class while torch's own are checked; no spare is kept then (every library is
        known). ``None``: a spare starts for the first library while it imports torch."""
        # torch's own worker first: it starts importing torch now
        self.shared.send_ahead(PingRequest())
        if ahead is None:
            if self._next is None:
                self._next = _spawn(self._env)
        else:
            self._spares = False
            for cand in ahead:
                if torch_own(cand):
                    continue
                key = library_of(cand)
                if key not in self._libraries:
                    self._libraries[key] = Worker(self._env, spare=self._take)
                    self._libraries[key].send_ahead(ImportRequest(target=cand.target))
        self.shared.call(PingRequest())

    @contextlib.contextmanager
    def worker_for(self, cand: Any) -> Iterator[Worker]:
        """The worker ``cand`` runs in: torch's own candidates share one, every library gets its
        own."""
        if torch_own(cand):
            yield self.shared
            return
        key = library_of(cand)
        if key not in self._libraries:
            self._libraries[key] = Worker(self._env, spare=self._take)
        yield self._libraries[key]

    def close(self) -> None:
        """End every worker: all are told at once, then given POOL_GRACE seconds together before
        their process groups are killed. Every reply has been read by then, so nothing is lost: what
        is cut short is only the interpreters' own teardown (a second or more each with torch
        loaded)."""
        workers = [self.shared, *self._libraries.values()]
        for worker in workers:
            worker.hang_up()
        deadline = time.monotonic() + POOL_GRACE
        for worker in workers:
            worker.close(grace=deadline - time.monotonic())
        spare, self._next = self._next, None
        if spare is not None:
            proc, stderr = spare
            kill_group(proc.pid)
            proc.wait()
            for f in (proc.stdin, proc.stdout, stderr):
                with contextlib.suppress(OSError, AttributeError):
                    if f is not None:
                        f.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the child side -----------------------------------------------------------------------------
def _snapshot() -> dict[str, int]:
    out = {}
    for path in TORCH_SURFACE:
        obj: Any = sys.modules.get("torch")
        for part in path.split(".")[1:]:
            obj = getattr(obj, part, None)
        out[path] = id(obj)
    return out


_BASELINE_SURFACE: dict[str, int] = {}


def interpreting() -> bool:
    """Whether Triton kernels in this process run in Triton's interpreter (``TRITON_INTERPRET=1``),
    not compiled. Asked of triton itself, and only once something imported it: a process that never
    imported triton ran no Triton kernel, so torch.nn's worker stays uninterpreted."""
    triton = sys.modules.get("triton")
    if triton is None:
        return False
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return interpreter_requested()


def tampered() -> list[str]:
    """The torch functions replaced since the worker started (empty: none)."""
    if not _BASELINE_SURFACE:
        return []
    now = _snapshot()
    return [path for path, ident in _BASELINE_SURFACE.items() if now.get(path) != ident]


def record_baseline() -> None:
    """Remember torch's functions as they are now (the start-up ping, before any candidate runs):
    ``tampered`` compares every reply's moment with this."""
    if not _BASELINE_SURFACE:
        _BASELINE_SURFACE.update(_snapshot())


Dispatch = Callable[[Request[Any], Callable[[TimingProgressMessage], None]], Reply]


def serve(dispatch: Dispatch) -> None:
    """The worker's loop: one request a line on stdin, answered by ``dispatch`` (the probe's
    handlers, ``kernel_probe.probe.handlers``, which ``child.spawn`` starts), one reply a line back
    after any progress messages, flagged when torch's functions were replaced or Triton ran
    interpreted; a request that is not one is a fatal reply. Transport only: what a request means is
    the handlers' business."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by foreign code goes to stderr, not the protocol
    sys.stdout = sys.stderr

    def emit(
        message: TimingProgressMessage,
    ) -> None:  # progress, before the reply (Worker.call reads on)
        proto.write(json.dumps({"progress": message.to_json()}) + "\n")
        proto.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        out: dict[str, Any]
        try:
            reply = dispatch(request_from_json(json.loads(line)), emit)
            changed = tampered()
            if changed:
                reply = dataclasses.replace(reply, tampered=tuple(changed))
            if interpreting():
                reply = dataclasses.replace(reply, interpreted=True)
            out = reply.to_json()
        # a bug in the probe itself (or a malformed request), reported to the parent
        except Exception as exc:
            import traceback

            out = {"fatal": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"}
        proto.write(json.dumps(out, default=str) + "\n")
        proto.flush()
