"""The worker that candidates are imported and run in: a ``child.spawn`` process group.

A candidate that segfaults, aborts, hangs, forks or runs out of memory costs only its worker: the
caller gets ``WorkerDied`` (with stderr's tail), the next call a fresh worker. Replies are read with
``select`` against a deadline; the worker's stdout goes to stderr (a library that prints cannot
corrupt the protocol); it reports the torch functions (``TORCH_SURFACE``) a candidate replaced
and a mode it left on torch's stacks (``MODE_STACKS``)."""

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
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from kernel_probe.isolation.child import end, signal_name, spawn
from kernel_probe.isolation.protocol import (
    REQUESTS,
    ImportRequest,
    PingReply,
    PingRequest,
    ProtocolError,
    Reply,
    Request,
    TimingProgressMessage,
    interpreter_requested,
)

DEFAULT_TIMEOUT = 300.0  # a call's budget unless the caller says otherwise
START_TIMEOUT = 120.0
CLOSE_GRACE = 5.0  # seconds a worker has to exit after its input closes
POOL_GRACE = 0.5  # seconds a pool's workers have together, once every reply is in
HANDLERS = "kernel_probe.probe.handlers"  # the module whose serve() a worker runs (not imported)

# what the float64 reference and the torch.nn baseline go through: a candidate that replaces one
# (on import or while it runs) would change every other verdict in its process
_MODULES = ("LayerNorm", "RMSNorm", "Linear")
TORCH_SURFACE = (
    *(f"torch.nn.functional.{f}" for f in ("layer_norm", "rms_norm", "linear")),
    *(f"torch.{f}" for f in ("layer_norm", "rms_norm", "rsqrt", "matmul")),
    *(f"torch.nn.{c}.{m}" for m in ("forward", "__init__") for c in _MODULES),
    "torch.Tensor.backward",
    "torch.autograd.backward",
    *(f"torch.Tensor.{m}" for m in ("__add__", "__mul__", "__sub__", "pow", "mean", "to")),
)
# torch's mode stacks by how tampering names them, and the torch._C function giving each one's depth
MODE_STACKS = {
    "TorchFunctionMode stack": "_len_torch_function_stack",
    "TorchDispatchMode stack": "_len_torch_dispatch_stack",
}
PING = PingRequest()
Progress = Callable[[TimingProgressMessage], None]
Spawned = tuple[subprocess.Popen[bytes], Any]  # a worker process and its stderr file


class WorkerDied(Exception):
    """The worker crashed or gave no answer in time (and was killed): ``status`` says which."""

    def __init__(self, status: Literal["crashed", "timeout"], reason: str):
        super().__init__(reason)
        self.status: Literal["crashed", "timeout"] = status
        self.reason = reason


def _spawn(env: Mapping[str, str], local: Sequence[str] = ()) -> Spawned:
    """A worker process, already asked to start up (its ping not yet read)."""
    stderr = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 (open for the worker's life)
    pipes: dict[str, Any] = dict(
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, bufsize=0
    )
    proc = spawn(HANDLERS, "serve", env=env, local=local, reaper=True, **pipes)
    _write(proc, PING)
    return proc, stderr


def _write(proc: subprocess.Popen[bytes], request: Request) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(request.to_json()) + "\n").encode())
        proc.stdin.flush()
    except (BrokenPipeError, OSError):
        pass  # reading the reply reports the crash


class Worker:
    """A child Python process answering requests, in its own process group. ``spare`` (a pool's)
    hands over a process spawned ahead, so its start-up (importing torch) overlapped other work."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        spare: Callable[[], Spawned | None] | None = None,
        local: Sequence[str] = (),
    ):
        self._env = dict(os.environ if env is None else env)
        self._local = tuple(local)
        self._spare = spare
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buffer = b""
        self._mark = 0
        self.started = 0
        self._ping_unread = False  # its start-up ping is still to be read
        self._ahead: Request | None = None  # written by send_ahead, its reply still to be read

    def _relaunch(self, needed: bool) -> None:
        if not needed:
            return
        self.close()
        spawned = self._spare() if self._spare is not None else None
        self._proc, self._stderr = spawned or _spawn(self._env, self._local)
        self._buffer, self._mark, self._ping_unread = b"", 0, True
        self.started += 1

    def send_ahead(self, request: Request) -> None:
        """Start the worker if needed and write ``request`` now, without waiting: the ``call`` of
        the same request reads its reply (a different call reads and drops it first)."""
        if self._ahead is not None:
            return
        self._relaunch(self._proc is None or self._proc.poll() is not None)
        assert self._proc is not None
        _write(self._proc, request)
        self._ahead = request

    def hang_up(self) -> None:
        """Close the worker's stdin (it leaves its loop) without waiting (a pool's workers then exit
        side by side)."""
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def close(self, grace: float = CLOSE_GRACE) -> None:
        """End the worker and everything it spawned: ``grace`` seconds to exit on its own, then its
        process group is killed; never blocks on a pipe a grandchild holds."""
        self.hang_up()
        proc, self._proc = self._proc, None
        self._ping_unread, self._ahead = False, None  # a new process owes no earlier reply
        if proc is not None:
            end(proc, grace)
            if proc.stdout is not None:
                proc.stdout.close()  # nobody is reading it: closing cannot deadlock
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        request: Request,
        timeout: float = DEFAULT_TIMEOUT,
        on_progress: Progress | None = None,
    ) -> Any:
        """``request``'s reply (a ``request.reply``), ``on_progress`` given each progress message
        before it, within ``timeout``; WorkerDied on crash or timeout (the next call: a new one)."""
        owed = self._ping_unread or self._ahead is not None  # a reply is owed: read it first
        self._relaunch(self._proc is None or (self._proc.poll() is not None and not owed))
        if self._ping_unread:
            self._ping_unread = False
            self._read(PingReply, START_TIMEOUT)  # the ping sent at spawn time
        ahead, self._ahead = self._ahead, None
        if ahead != request:
            if ahead is not None:
                self._read(ahead.reply, timeout)  # not this call's: read and drop it
            assert self._proc is not None
            if self._stderr is not None:
                self._stderr.seek(0, 2)
                self._mark = self._stderr.tell()
            _write(self._proc, request)
        return self._read(request.reply, timeout, on_progress)

    def _stderr_tail(self) -> str:
        """What the worker wrote to stderr since the current request began, blank lines left out."""
        if self._stderr is None:
            return ""
        self._stderr.flush()
        self._stderr.seek(self._mark)
        data = self._stderr.read().decode("utf-8", "replace")
        self._stderr.seek(0, 2)
        return "\n".join(line for line in data.strip().splitlines() if line.strip())

    def _readline(self, deadline: float) -> bytes | None:
        """The next reply line; b"" when the worker died without one; None past the deadline."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if (remaining := deadline - time.monotonic()) <= 0:
                return None
            ready = select.select([fd], [], [], min(remaining, 0.25))[0]
            # dead: a process it forked may hold the pipe open, so EOF may never come: take what
            # has arrived and stop waiting
            if not ready and proc.poll() is not None and not select.select([fd], [], [], 0)[0]:
                return b""
            if ready or proc.poll() is not None:
                if not (chunk := os.read(fd, 1 << 16)):
                    return b""  # EOF: the worker (and whatever inherited the pipe) is gone
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _read(self, kind: type[Reply], timeout: float, on_progress: Progress | None = None) -> Any:
        """The reply (a ``kind``), after any progress messages; WorkerDied when none comes."""
        proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if not (line := self._readline(deadline)):  # None: its time ran out; b"": it died
                end(proc, 0 if line is None else 10)
                tail, code = self._stderr_tail(), proc.returncode
                self.close()
                if line is None:
                    last = f"; last output: {tail[-300:]}" if tail else ""
                    raise WorkerDied("timeout", f"no answer within {timeout:g} s (killed){last}")
                how = (
                    f"killed by {signal_name(-code)}" if code < 0 else f"exited with status {code}"
                )
                last = f"; stderr: {tail[-600:]}" if tail else ""
                raise WorkerDied("crashed", f"the worker process {how}{last}")
            data = json.loads(line)
            if "fatal" in data:
                raise RuntimeError(f"worker error: {data['fatal']}")
            if "progress" not in data:
                return kind.from_json(data)
            message = TimingProgressMessage.from_json(data["progress"])
            if on_progress is not None:
                on_progress(message)


def torch_own(cand: Any) -> bool:
    """A candidate that ships with torch (no library of its own): it may share the clean worker."""
    return cand.source == "builtin" and not cand.distribution and not cand.module


def library_of(cand: Any) -> str:
    """The library a candidate comes from (its distribution, else its top-level module)."""
    return cand.distribution or (cand.module or cand.target).split(".")[0]


class WorkerPool:
    """Which worker serves which candidate: torch's own share one (started before any library is
    imported), each other library its own; a spare process starts ahead, overlapping checks.
    ``local``: the top-level modules of ``--candidate``s, found in the working directory."""

    def __init__(self, env: Mapping[str, str] | None = None, local: Sequence[str] = ()):
        self._env = dict(os.environ if env is None else env)
        self._local = tuple(local)
        self.shared = Worker(self._env, local=self._local)
        self._libraries: dict[str, Worker] = {}
        self._next: Spawned | None = None
        self._spares = True  # keep one spare process starting (off once every library is known)

    @property
    def fresh(self) -> int:
        """Fresh workers started so far (a library whose candidates need no process starts none)."""
        return sum(w.started for w in self._libraries.values())

    def _take(self) -> Spawned:
        taken = self._next or _spawn(self._env, self._local)
        self._next = _spawn(self._env, self._local) if self._spares else None  # the next library's
        return taken

    def _library(self, cand: Any) -> Worker:
        key = library_of(cand)
        if key not in self._libraries:
            self._libraries[key] = Worker(self._env, spare=self._take, local=self._local)
        return self._libraries[key]

    def prepare(self, ahead: Sequence[Any] | None = None) -> None:
        """Start the shared worker now; ``ahead``: candidates whose libraries' workers start now,
        importing their first class while torch's own are checked (None: one spare starts)."""
        self.shared.send_ahead(PING)  # torch's own worker first: it starts importing torch now
        if ahead is None:
            if self._next is None:
                self._next = _spawn(self._env, self._local)
        else:
            self._spares = False
            for cand in ahead:
                if not torch_own(cand) and library_of(cand) not in self._libraries:
                    self._library(cand).send_ahead(ImportRequest(target=cand.target))
        self.shared.call(PING)

    @contextlib.contextmanager
    def worker_for(self, cand: Any) -> Iterator[Worker]:
        """The worker ``cand`` runs in: torch's own candidates share one, every library its own."""
        yield self.shared if torch_own(cand) else self._library(cand)

    def close(self) -> None:
        """End every worker: all are told at once, then given POOL_GRACE seconds together before
        their process groups are killed (every reply is in: only interpreter teardown is cut)."""
        workers = [self.shared, *self._libraries.values()]
        for worker in workers:
            worker.hang_up()
        deadline = time.monotonic() + POOL_GRACE
        for worker in workers:
            worker.close(grace=deadline - time.monotonic())
        spare, self._next = self._next, None
        if spare is not None:
            end(spare[0], 0)
            for f in (spare[0].stdin, spare[0].stdout, spare[1]):
                with contextlib.suppress(OSError, AttributeError):
                    f.close()  # type: ignore[union-attr]

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the worker process's side -------------------------------------------------------------------
def _snapshot() -> dict[str, int]:
    out = {}
    for path in TORCH_SURFACE:
        obj: Any = sys.modules.get("torch")
        for part in path.split(".")[1:]:
            obj = getattr(obj, part, None)
        out[path] = id(obj)
    # a mode left on torch's stacks (torch.set_default_device's, a library's) sees every later call
    torch_c: Any = getattr(sys.modules.get("torch"), "_C", None)
    for name, depth in MODE_STACKS.items():
        out[name] = getattr(torch_c, depth, lambda: 0)()
    return out


_BASELINE_SURFACE: dict[str, int] = {}


def interpreting() -> bool:
    """Whether Triton kernels in this process run in Triton's interpreter, asked of triton once
    something imported it (a process that never imported triton ran no Triton kernel)."""
    triton = sys.modules.get("triton")
    if triton is None:
        return False
    knobs = getattr(triton, "knobs", None)
    return bool(knobs.runtime.interpret) if knobs is not None else interpreter_requested()


def tampered() -> list[str]:
    """The torch functions replaced, and the mode stacks changed, since the worker started (empty:
    none)."""
    if not _BASELINE_SURFACE:
        return []
    now = _snapshot()
    return [path for path, ident in _BASELINE_SURFACE.items() if now.get(path) != ident]


def record_baseline() -> None:
    """Remember torch's functions as they are now (at the start-up ping, before any candidate)."""
    if not _BASELINE_SURFACE:
        _BASELINE_SURFACE.update(_snapshot())


def read_request(data: Any) -> Request:
    """The request a JSON object is, by its ``op`` (else ProtocolError)."""
    if not isinstance(data, Mapping):
        raise ProtocolError(f"request: expected a JSON object, got {type(data).__name__}")
    if (kind := REQUESTS.get(data.get("op"))) is None:  # type: ignore[arg-type]
        known = ", ".join(REQUESTS)
        raise ProtocolError(f"request: unknown op {data.get('op')!r} (known: {known})")
    return kind.from_json(data)


def serve(dispatch: Callable[[Request, Progress], Reply]) -> None:
    """The worker's loop: a request a line on stdin, ``dispatch``'s reply a line after its progress
    (flagged: torch's functions replaced, Triton interpreted); a fatal reply to a non-request."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by foreign code goes to stderr, not the protocol
    sys.stdout = sys.stderr

    def emit(message: TimingProgressMessage) -> None:
        proto.write(json.dumps({"progress": message.to_json()}) + "\n")
        proto.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        out: dict[str, Any]
        try:
            reply = dispatch(read_request(json.loads(line)), emit)
            flags: dict[str, Any] = dict(tampered=tuple(tampered()) or reply.tampered)
            flags["interpreted"] = reply.interpreted or interpreting()
            out = dataclasses.replace(reply, **flags).to_json()
        except Exception as exc:  # a bug in the probe (or a malformed request): the parent's to see
            out = {"fatal": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"}
        proto.write(json.dumps(out, default=str) + "\n")
        proto.flush()
