"""Reading an input file safely: a regular file only, never more than a cap.

A FIFO, a character device (``/dev/zero``), a socket or a directory passed where a lock, a profile
or a config is expected would hang the reader or exhaust its memory: they are refused before any
byte is read. The file is opened non-blocking (a FIFO's open cannot wait for a writer), checked with
``fstat`` on the open descriptor (no race with a rename), and read up to ``limit`` bytes.
"""

from __future__ import annotations

import os
import stat

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
