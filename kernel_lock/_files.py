"""Reading an input file safely (a regular file only, never more than a cap), and writing one atomically.

A FIFO, a character device (``/dev/zero``), a socket or a directory passed where a lock, a profile
or a config is expected would hang the reader or exhaust its memory: they are refused before any
byte is read. The file is opened non-blocking (a FIFO's open cannot wait for a writer), checked with
``fstat`` on the open descriptor (no race with a rename), and read up to ``limit`` bytes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import LockFormatError

KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


class UnsafeFile(Exception):
    """Why a path cannot be read as an input file: ``problem`` and ``fix``."""

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def kind(mode: int) -> str:
    """How a message names a file type (``a FIFO (named pipe)``) from its ``st_mode``."""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``limit``); UnsafeFile otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise UnsafeFile("is a directory, not a file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(
                f"is {kind(st.st_mode)}, not a regular file: it is never read (it could block or never end)",
                "pass a regular file",
            )
        if st.st_size > limit:
            raise UnsafeFile(
                f"is {st.st_size} bytes, more than the {limit} this input may have",
                "pass the right file; a real one is far smaller",
            )
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise UnsafeFile(f"grew beyond the {limit} bytes this input may have while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temp file in the same directory, fsync, rename.

    A symbolic link at ``path`` is written *through* (its target is replaced, the link stays, so a
    shared lock others link to stays shared). Anything there that is not a regular file (a directory,
    a FIFO, a device) is refused, never replaced.
    """
    import tempfile

    path = Path(os.path.realpath(path))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise LockFormatError(
            f"is {kind(mode)}, not a regular file: not replaced",
            path=str(path),
            fix="write the lock to a regular file path",
        )
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:  # the folder is missing, read-only, or not a folder: nothing was written
        why = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be written to ({exc.strerror})"
        raise LockFormatError(
            f"cannot write the lock: the folder {directory} {why}; nothing was written",
            path=str(path),
            fix="create the folder first, or give a path in a folder you can write to",
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
