"""The one way to start a Python child, and the child that confirms what only an import can
judge. Children run ``python -I`` (the working directory reached only through a finder exposing
the modules named), ``sys.path`` set first, device-backend autoload off, in their own session."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import ExitCode, KernelUnavailable, LockError, LockFormatError
from .tables import ReadError, context, get_text, refuse_unknown
from .trust import static_problem

if TYPE_CHECKING:
    import subprocess

    from .document import LockDocument

__all__ = [
    "MARK",
    "before_sealing",
    "child_verdicts",
    "confirm_child",
    "confirm_in_child",
    "cwd_like",
    "kill_group",
    "python_argv",
    "pythonpath_roots",
    "run",
    "start",
    "trusted_roots",
]

FLAGS = ("-I", "-X", "faulthandler", "-X", "utf8")
CHILD_TIMEOUT = 300.0  # seconds for the child that imports what could not be judged without it
MARK = "KERNEL_LOCK_CONFIRM "
# The confirming child's program: it imports the reader and resolver, which sit above this module.
_CONFIRM = (
    "import json, sys; from kernel_lock.launch import confirm_child; "
    "from kernel_lock.lock import loads; from kernel_lock.resolve import factory; "
    "confirm_child(json.loads(sys.stdin.read()), loads, factory)"
)


def cwd_like(entry: str) -> bool:
    """Whether a search-path entry names the working directory (``''``, ``.``, or its path)."""
    if entry in ("", "."):
        return True
    try:
        return os.path.realpath(entry) == os.path.realpath(os.getcwd())
    except OSError:
        return True


def trusted_roots(entries: Sequence[str]) -> list[str]:
    """``entries`` (a search path), absolute, without the working directory in any spelling."""
    return [
        os.path.abspath(e) for e in dict.fromkeys(entries) if isinstance(e, str) and not cwd_like(e)
    ]


def pythonpath_roots(env: Mapping[str, str] | None = None) -> list[str]:
    """The roots ``env``'s ``PYTHONPATH`` (which ``-I`` ignores) meant, as :func:`trusted_roots`."""
    env = os.environ if env is None else env
    return trusted_roots([p for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p])


# Last on the child's meta path: finds only the named top-level modules, in one folder; it lists
# no distributions there (importlib.metadata, torch's backend entry points, never look in it).
_LOCAL = """
class _Local:
    @staticmethod
    def find_spec(name, path=None, target=None):
        from importlib.machinery import PathFinder
        return PathFinder.find_spec(name, [{folder!r}]) if name in {names!r} else None
sys.meta_path.append(_Local)
"""


def python_argv(
    code: str,
    args: Sequence[str] = (),
    *,
    roots: Sequence[str] = (),
    local: Sequence[str] = (),
    python: str | None = None,
) -> list[str]:
    """A child's command line: ``sys.path`` is ``roots`` + the interpreter's; the top-level
    modules named in ``local`` (and nothing else) are found in the working directory, last."""
    first = f"import sys; sys.path[:0] = {trusted_roots(roots)!r}"
    names = sorted({n for n in local if n.isidentifier()})
    if names:
        first += _LOCAL.format(folder=os.path.abspath(os.getcwd()), names=names)
    return [python or sys.executable, *FLAGS, "-c", f"{first}\n{code}", *args]


def start(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, **popen: Any
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own with ``env`` (torch's device-backend autoload off:
    no entry point runs before the child's own code) and ``popen`` (``cwd``, ``stdin``, ...);
    OSError when it cannot start."""
    import subprocess  # only where a child is started: kernel_lock stays import-light

    env = {**(os.environ if env is None else env), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    return subprocess.Popen(list(argv), env=env, start_new_session=True, **popen)


def kill_group(pid: int, sig: int | None = None) -> None:
    """Kill the session ``pid`` leads: the child and everything it spawned (the one kill rule);
    ``sig`` (default SIGKILL) to send another signal."""
    import signal

    try:
        os.killpg(pid, signal.SIGKILL if sig is None else sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass  # nothing left of it


def run(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes = b"",
    timeout: float | None = None,
    grace: float = 0.0,
    stdout: Any = None,
    stderr: Any = None,
) -> subprocess.CompletedProcess[str]:
    """:func:`start` ``argv`` with ``input`` on its stdin and wait ``timeout`` seconds at most; its
    output comes back as text through files (a forked process cannot keep us waiting) unless sent
    elsewhere. Its session is killed when it ends, at its time limit (SIGTERM ``grace`` seconds
    first; then subprocess.TimeoutExpired) or when we are interrupted."""
    import contextlib
    import signal
    import subprocess
    import tempfile

    if subprocess.PIPE in (stdout, stderr):  # nothing would read it: the child would block
        raise ValueError("launch.run captures output itself: leave stdout/stderr None for it")
    with contextlib.ExitStack() as stack:
        spool = [stack.enter_context(tempfile.TemporaryFile("w+b")) for _ in range(3)]
        spool[0].write(input.encode("utf-8") if isinstance(input, str) else input)
        spool[0].seek(0)
        streams = [spool[1] if stdout is None else stdout, spool[2] if stderr is None else stderr]
        proc = start(argv, cwd=cwd, env=env, stdin=spool[0], stdout=streams[0], stderr=streams[1])
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            if grace > 0:
                kill_group(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(grace)
            raise
        finally:
            kill_group(proc.pid)  # the session's leftovers, or the child itself
            proc.wait()
        texts = []
        for own, f in zip(spool[1:], streams, strict=True):
            own.seek(0)
            texts.append(own.read().decode("utf-8", "replace") if f is own else "")
    return subprocess.CompletedProcess(list(argv), proc.returncode, *texts)


# ---- confirming in a child what only an import can judge ----------------------------------------
def child_verdicts(
    lock: LockDocument, mode: str, unknown: Mapping[str, str]
) -> dict[str, dict[str, Any] | None]:
    """Resolve the ``unknown`` slots with ``factory`` in a child: per slot None or an error dict."""
    import subprocess

    request = {
        "text": lock.dumps(),
        "path": lock.path,
        "trust": list(lock.granted),
        "mode": mode,
        "slots": list(unknown),
    }
    # the caller's search path (same trust, same libraries); from its working directory (when on
    # that path) only the modules of the slots' targets
    entries = [lock.slots[s] for s in unknown]
    targets = [e.target for e in entries] + [e.twin.target for e in entries if e.twin is not None]
    local = [t.split(".")[0] for t in targets]
    keep = any(cwd_like(entry) for entry in sys.path)
    argv = python_argv(_CONFIRM, roots=sys.path, local=local if keep else ())
    what = ", ".join(f"slot {name} ({why})" for name, why in unknown.items())

    def unconfirmed(problem: str) -> KernelUnavailable:
        return KernelUnavailable(
            f"{what}: {problem}",
            path=lock.path,
            key="slots." + next(iter(unknown)),
            fix="run `kernel-probe verify` to see the import's own error",
        )

    try:
        proc = run(argv, input=json.dumps(request), timeout=CHILD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise unconfirmed(f"importing it in a child process to confirm it failed: {exc}") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise unconfirmed(
            f"the child process importing it to confirm it ended without a verdict ({tail[:300]})"
        )
    try:
        verdicts = read_verdicts(json.loads(lines[-1][len(MARK) :]), unknown)
    except (ValueError, RecursionError) as exc:
        raise unconfirmed(
            "the child process importing it to confirm it gave no verdict kernel-probe reads "
            f"({exc})"
        ) from None
    missing = {"exit_code": KernelUnavailable.exit_code, "key": None, "fix": None}
    return {
        slot: verdicts.get(slot, {**missing, "problem": f"slot {slot}: no verdict"})
        for slot in unknown
    }


def read_verdicts(data: Any, slots: Mapping[str, str]) -> dict[str, dict[str, Any] | None]:
    """The child's answer per slot asked: None or an error dict; else a ReadError."""
    if not isinstance(data, dict):
        raise ReadError(f"expected a JSON object, got {type(data).__name__}")
    refuse_unknown(data, list(slots))
    out: dict[str, dict[str, Any] | None] = {}
    for slot, verdict in data.items():
        if verdict is None:
            out[slot] = None
            continue
        with context(slot):
            if not isinstance(verdict, dict):
                raise ReadError(f"expected an object or null, got {type(verdict).__name__}")
            refuse_unknown(verdict, ("exit_code", "problem", "key", "fix"))
            code = verdict.get("exit_code")
            if isinstance(code, bool) or code not in {int(c) for c in ExitCode if c}:
                raise ReadError(f"{code!r:.40} is not a documented failing exit code", "exit_code")
            out[slot] = {
                "exit_code": code,
                "problem": get_text(verdict, "problem", "") or "",
                "key": get_text(verdict, "key", None, limit=300),
                "fix": get_text(verdict, "fix", None),
            }
    return out


def confirm_child(
    request: Mapping[str, Any], loads: Callable[..., Any], factory: Callable[..., Any]
) -> None:
    """The confirming child's body: ``factory`` per slot, one line of verdicts, ``os._exit``."""
    verdicts: dict[str, Any] = {}
    try:
        for slot in request["slots"]:
            verdicts[slot] = _verdict(request, slot, loads, factory)
    finally:
        sys.stdout.write("\n" + MARK + json.dumps(verdicts) + "\n")
        sys.stdout.flush()
        os._exit(0)  # no atexit hook or thread of an imported library decides the outcome


def _verdict(
    request: Mapping[str, Any], slot: str, loads: Callable[..., Any], factory: Callable[..., Any]
) -> dict[str, Any] | None:
    """What ``factory`` said of ``slot``: None when it built, else the error as a dict."""
    try:
        lock = loads(
            request["text"], path=request["path"], trust=request["trust"], emit_warnings=False
        )
        factory(lock, slot, request["mode"], verify_environment=False)
        return None
    except LockError as exc:
        return {"exit_code": exc.exit_code, "problem": exc.problem, "key": exc.key, "fix": exc.fix}
    except BaseException as exc:  # the import path reports it as unavailable too
        return {
            "exit_code": KernelUnavailable.exit_code,
            "problem": f"slot {slot}: resolving it raised {type(exc).__name__}: {exc}",
            "key": f"slots.{slot}",
            "fix": "repair or reinstall that library, or re-run `kernel-probe`",
        }


def _refusal(
    lock: LockDocument, verdict: Mapping[str, Any], why: str
) -> KernelUnavailable | LockFormatError:
    cls = (
        LockFormatError if verdict["exit_code"] == LockFormatError.exit_code else KernelUnavailable
    )
    return cls(
        f"{verdict['problem']} (found by importing it in a child process: {why} without import)",
        path=lock.path,
        key=verdict["key"],
        fix=verdict["fix"],
    )


def confirm_in_child(lock: LockDocument, mode: str, unknown: Mapping[str, str]) -> None:
    """Resolve the ``unknown`` slots in a child process and raise the first refusal here."""
    for slot, verdict in child_verdicts(lock, mode, unknown).items():
        if verdict is not None:
            raise _refusal(lock, verdict, unknown[slot])


def before_sealing(lock: LockDocument, torch_version: str) -> list[str]:
    """Every target of a hand-edited ``lock`` decided before sealing, as at job start:
    an import's refusal is raised; what cannot be judged here is returned as a line."""
    notes: list[str] = []
    unknown: dict[str, str] = {}
    for entry in lock.slots.values():
        key = f"slots.{entry.name}"
        pairs = [(entry.target, entry.kwargs, key)]
        if entry.twin is not None:
            pairs.append((entry.twin.target, entry.twin.kwargs, f"{key}.twin"))
        for target, kwargs, at in pairs:
            try:
                why = static_problem(entry.name, target, kwargs, torch_version, lock.path, at)
            except KernelUnavailable as exc:
                notes.append(f"{at}: {target} not judged: {exc.problem}")
                continue
            if why is not None and at == key:
                unknown[entry.name] = why
            elif why is not None:
                notes.append(f"{at}: {target} not judged without importing it: {why}")
    if unknown:
        for slot, verdict in child_verdicts(lock, "training", unknown).items():
            if verdict is None:
                continue
            if verdict["exit_code"] == LockFormatError.exit_code:  # what the import refuses
                raise _refusal(lock, verdict, unknown[slot])
            notes.append(
                f"slots.{slot}: {lock.slots[slot].target} not judged: {verdict['problem']}"
            )
    return notes
