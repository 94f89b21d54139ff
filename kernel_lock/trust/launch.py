"""The one way kernel-probe and kernel_lock start a Python child: a clean interpreter, its own
session.

Every Python child (the probe's worker and its one-shot children, ``kernel_probe.isolation.child``;
the confirming child of the job-start check and of ``rehash``, ``kernel_lock.trust.confirming``;
``check-config``'s Hydra and import children) is started by :func:`python_argv` and :func:`start`:

- ``python -I`` (isolated mode: no user site-packages, no ``PYTHON*`` variable read, no script or
  working directory on ``sys.path``), so a ``json.py``, ``tempfile.py`` or ``sitecustomize.py`` in
  the caller's working directory never runs in it;
- ``sys.path`` set by the first statement, before any import: the caller's trusted roots in front
  (the entries of ``PYTHONPATH`` the caller meant the child to have, or the caller's own search
  path, each absolute; never ``''``, ``.`` or the working directory), then the interpreter's own. A
  child that must find a module the user named in the working directory (``--candidate mymod.X``)
  gets the working directory *last*: nothing installed, the standard library included, can be
  shadowed from it;
- ``-X faulthandler`` (a crash names its frame) and ``-X utf8`` (what it prints is UTF-8 whatever
  the locale);
- its own session (``start_new_session``): :func:`kill_group` ends it and everything it spawned.

Import-light: ``os`` and ``sys``; ``subprocess`` only when a child is started.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

__all__ = [
    "FLAGS",
    "cwd_like",
    "kill_group",
    "python_argv",
    "pythonpath_roots",
    "start",
    "trusted_roots",
]

FLAGS = ("-I", "-X", "faulthandler", "-X", "utf8")


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
    """The roots a child started with ``env`` was meant to have from its ``PYTHONPATH`` (which
    ``-I`` itself ignores), as :func:`trusted_roots`."""
    env = os.environ if env is None else env
    return trusted_roots([p for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p])


def python_argv(
    code: str,
    args: Sequence[str] = (),
    *,
    roots: Sequence[str] = (),
    keep_cwd: bool = False,
    python: str | None = None,
) -> list[str]:
    """The command line of a child running ``code`` (``-c``) with ``args``, its ``sys.path`` being
    ``roots`` + the interpreter's own (+ the working directory last, ``keep_cwd``)."""
    first = f"import sys; sys.path[:0] = {trusted_roots(roots)!r}"
    if keep_cwd:
        first += "; sys.path.append(__import__('os').getcwd())"
    return [python or sys.executable, *FLAGS, "-c", f"{first}\n{code}", *args]


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    bufsize: int = -1,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (from :func:`python_argv`) in a session of its own, with ``env`` (default:
    ours). Raises OSError when it cannot be started."""
    import subprocess

    return subprocess.Popen(
        list(argv),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        bufsize=bufsize,
        env=dict(os.environ if env is None else env),
        start_new_session=True,
    )


def kill_group(pid: int) -> None:
    """Kill the session ``pid`` leads: the child and everything it spawned (the one kill rule)."""
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass  # nothing left of it
