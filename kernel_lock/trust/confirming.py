"""Confirming what only an import can judge, in a child process, and deciding a lock before it is
sealed.

``child_verdicts`` resolves slots with ``factory`` in a fresh interpreter
(``kernel_lock.trust.confirm_child``) and returns what it said of each: the import path's own
answer, without its code running here. ``confirm_in_child`` raises the first refusal (the job-start
check, ``resolve.confirm_targets``). ``before_sealing`` decides every target of a hand-edited lock
before ``kernel-probe rehash`` seals it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import KernelUnavailable, LockFormatError

if TYPE_CHECKING:
    import subprocess

    from ..format.document import LockDocument

__all__ = [
    "CHILD_TIMEOUT",
    "MARK",
    "before_sealing",
    "child_verdicts",
    "confirm_in_child",
    "read_verdicts",
]

CHILD_TIMEOUT = 300.0  # seconds for the child that imports what could not be judged without it
MARK = "KERNEL_LOCK_CONFIRM "


def child_verdicts(
    lock: LockDocument, mode: str, unknown: Mapping[str, str]
) -> dict[str, dict[str, Any] | None]:
    """Resolve the ``unknown`` slots (name -> why they could not be judged without importing) with
    ``factory`` in a fresh interpreter (same search path, same trust): per slot, None where it
    built, else the error as a dict (exit_code, problem, key, fix). A child that cannot run, or ends
    without a verdict, is :class:`KernelUnavailable`."""
    import json
    import subprocess

    from .launch import cwd_like, python_argv

    request = {
        "text": lock.dumps(),
        "path": lock.path,
        "trust": list(lock.granted),
        "mode": mode,
        "slots": list(unknown),
    }
    # the caller's search path (same trust, same libraries), but never its working directory first:
    # a module the caller could import from there is still found, after everything installed
    # (kernel_lock.trust.launch)
    keep_cwd = any(cwd_like(entry) for entry in sys.path)
    code = (
        "import json, sys; from kernel_lock.trust.confirm_child import main; "
        "main(json.loads(sys.stdin.read()))"
    )
    argv = python_argv(code, roots=sys.path, keep_cwd=keep_cwd)
    what = ", ".join(f"slot {name} ({why})" for name, why in unknown.items())

    def unconfirmed(problem: str) -> KernelUnavailable:
        return KernelUnavailable(
            f"{what}: {problem}",
            path=lock.path,
            key="slots." + next(iter(unknown)),
            fix="run `kernel-probe verify` to see the import's own error",
        )

    try:
        proc = _run_child(argv, json.dumps(request), CHILD_TIMEOUT)
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
    """The child's answer, read by the typed reader (``kernel_lock.format.reading``): per slot
    asked, None or {exit_code (a documented one), problem, key, fix}; anything else is a
    ReadError."""
    from ..errors import ExitCode
    from ..format.reading import ReadError, context, get_text, refuse_unknown

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


def _run_child(argv: list[str], request: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the child with ``request`` on its stdin; its output comes back through files, not pipes,
    so a process a library forks (and that inherits them) cannot keep this waiting after the child
    has ended. The child runs in a session of its own, and whatever is left of it (such a process)
    is killed once it ends or runs out of time; on time out, ``subprocess.TimeoutExpired`` is
    raised."""
    import subprocess
    import tempfile

    from .launch import kill_group, start

    with (
        tempfile.TemporaryFile("w+b") as stdin,
        tempfile.TemporaryFile("w+b") as out,
        tempfile.TemporaryFile("w+b") as err,
    ):
        stdin.write(request.encode("utf-8"))
        stdin.seek(0)
        proc = start(argv, stdin=stdin, stdout=out, stderr=err)
        try:
            proc.wait(timeout)
        finally:
            kill_group(proc.pid)  # the session's leftovers, or the child itself on time out
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = (f.read().decode("utf-8", "replace") for f in (out, err))
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


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
    """Every target of ``lock`` (each slot's, and its twin's) decided before a hand-edited lock is
    sealed, so that no lock is sealed that ``verify`` and the runtime refuse.

    Each is decided as the job-start check decides it: from the tables and the file system
    (``locate.static_problem``), and a slot's target the tables cannot judge by importing it in a
    child process (foreign code never runs here). What an import refuses (a class of other
    semantics, a keyword argument it does not take) is raised. A library absent or broken on this
    machine is no refusal (a lock may be sealed where its library is not installed): returned, one
    line per target not judged here and why, as is a twin the tables cannot judge.
    """
    from .locate import static_problem

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
