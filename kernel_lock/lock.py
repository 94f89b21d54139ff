"""The kernel lock: :class:`KernelLock` (the document plus verify and resolve), and
:func:`load` / :func:`loads`."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import resolve
from . import toml as _toml
from .document import LockDocument
from .errors import LockFormatError, LockWarning
from .files import UnsafeFile, read_regular

__all__ = ["MAX_BYTES", "KernelLock", "load", "loads"]

MAX_BYTES = 8 << 20  # a lock is a few kB; anything this large is not one


class KernelLock(LockDocument):
    """A parsed, validated kernel lock: :meth:`dumps`, :meth:`verify`, :meth:`factory`."""

    __slots__ = ()

    def verify(
        self,
        mode: str | None = None,
        *,
        current: Mapping[str, Any] | None = None,
        targets: str | None = None,
    ) -> list[str]:
        """Check this machine against the lock (``kernel_lock.resolve.verify``); its warnings."""
        return resolve.verify(self, mode=mode, current=current, targets=targets)

    def factory(self, slot: str, mode: str | None = None, **options: Any):
        """The class the lock pins for ``slot``, verified (``kernel_lock.resolve.factory``)."""
        return resolve.factory(self, slot, mode=mode, **options)

    def resolve_all(self, mode: str | None = None) -> dict[str, Any]:
        """Every slot's class, by slot name."""
        return {name: resolve.factory(self, name, mode=mode) for name in self.slots}


def _fail(where: str, problem: str, fix: str | None = None) -> LockFormatError:
    return LockFormatError(problem, path=where, fix=fix)


def loads(
    text: str | bytes,
    *,
    path: str | None = None,
    strict: bool = False,
    emit_warnings: bool = True,
    trust: Sequence[str] = (),
    check_targets: bool = True,
) -> KernelLock:
    """Parse and validate lock text; any problem raises a :class:`LockError`. ``trust``:
    modules granted beyond the allow-list (the lock's ``trusted-modules`` only ask); ``strict``: an
    edited or environment-less lock is an error; ``check_targets=False``: no allow-list."""
    where = path or "<lock>"
    # the file reader's limit, for every source of lock text (a file, a checkpoint, a rank's report)
    size = (
        len(text)
        if isinstance(text, bytes) or len(text) > MAX_BYTES
        else len(text.encode("utf-8", "replace"))
    )
    if size > MAX_BYTES:
        raise _fail(
            where,
            f"is {size} bytes, more than the {MAX_BYTES} this input may have",
            "pass the right lock; a real one is a few kB",
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(
                where,
                f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                "a lock is a TOML text file written by kernel-probe",
            ) from None
    try:
        data = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise _fail(
            where,
            f"not valid TOML: {exc}",
            "restore the file from version control or re-run `kernel-probe --force`",
        ) from None
    except (ValueError, RecursionError) as exc:  # e.g. a NUL byte, absurd nesting
        raise _fail(where, f"not valid TOML: {exc}") from None
    try:
        lock = KernelLock._from_dict(
            data, path=where, strict=strict, trust=trust, check_targets=check_targets
        )
    except RecursionError:
        raise _fail(where, "nesting too deep") from None
    if emit_warnings:
        for message in lock.warnings:
            warnings.warn(message, LockWarning, stacklevel=3)
    return lock


def load(
    path: str | os.PathLike[str],
    *,
    strict: bool = False,
    emit_warnings: bool = True,
    trust: Sequence[str] = (),
    check_targets: bool = True,
) -> KernelLock:
    """Read and validate the lock at ``path`` (a regular file, at most 8 MiB); see :func:`loads`."""
    where = str(Path(path))
    try:
        raw = read_regular(path, MAX_BYTES)
    except FileNotFoundError:
        raise _fail(
            where,
            "no such file",
            "run `kernel-probe --out PATH` on this machine to write one, or check the path",
        ) from None
    except UnsafeFile as exc:
        directory = "directory" in exc.problem
        fix = f"pass the lock file itself, e.g. {Path(path) / 'kernel-lock.toml'}"
        raise _fail(where, exc.problem, fix if directory else exc.fix or None) from None
    except OSError as exc:
        raise _fail(
            where, f"cannot read: {exc.strerror}", "check the path and its permissions"
        ) from None
    return loads(
        raw,
        path=where,
        strict=strict,
        emit_warnings=emit_warnings,
        trust=trust,
        check_targets=check_targets,
    )
