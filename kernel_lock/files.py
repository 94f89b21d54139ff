"""The one safe reader of input files and the one safe writer of every file kernel-probe creates.

Reading refuses anything but a regular file and reads at most a cap; writing is atomic (a new
temporary file beside the target, fsynced, renamed), never through a link it did not create, into
directories checked as OpenSSH's ``StrictModes`` (group-writable is accepted)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from .errors import ExitCode, LockFormatError

__all__ = [
    "SpecialFile",
    "UnsafeFile",
    "UnsafeWrite",
    "WriteFailed",
    "check_directory",
    "kind",
    "private_dir",
    "read_regular",
    "refuse_special",
    "write_file",
]

KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


# a new file, never one planted beforehand, never through a link
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL
_CREATE |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(Exception):
    """Why a path cannot be read as an input file: ``problem`` and ``fix``."""

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(problem)
        self.problem, self.fix = problem, fix


def kind(mode: int) -> str:
    """How a message names a file type (``a FIFO (named pipe)``) from its ``st_mode``."""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``limit``); UnsafeFile otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except IsADirectoryError:
        raise UnsafeFile("is a directory, not a file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(
                f"is {kind(st.st_mode)}, not a regular file: it is never read (it could block "
                "or never end)",
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
                raise UnsafeFile(
                    f"grew beyond the {limit} bytes this input may have while it was read"
                )
        return b"".join(chunks)
    finally:
        os.close(fd)


class UnsafeWrite(LockFormatError):
    """A file is not written (exit 5): unsafe directory, a link or not a regular file."""


class SpecialFile(UnsafeWrite):
    """The path to write names a FIFO, device, socket or directory: a usage error (exit 2)."""

    exit_code = ExitCode.USAGE


class WriteFailed(UnsafeWrite):
    """The OS failed a write (disk full, quota, I/O error): nothing was written (exit 5)."""


def refuse_special(path: str | os.PathLike[str], option: str = "") -> None:
    """:class:`SpecialFile` where ``path``, links followed, names something that is not a regular
    file (``/dev/stdout`` into a pipe: a FIFO); ``option`` (``--out``) says who named it."""
    try:
        st = os.stat(path)
    except OSError:
        return  # missing, or not to be looked at: the writer says why when it writes
    if stat.S_ISREG(st.st_mode):
        return
    said = option or "the path"  # the error names the path itself
    link = f" (a link to {os.readlink(path)})" if os.path.islink(path) else ""
    example = f"{option} kernel-lock.toml" if option.startswith("-") else "kernel-lock.toml"
    raise SpecialFile(
        f"{said}{link} is {kind(st.st_mode)}, not a regular file: it is never replaced (not even "
        "with --force) nor written into (a file is written whole, then renamed into place)",
        path=str(path),
        fix=f"name a regular file (e.g. {example}); to pipe it on, `cat` that file"
        if not stat.S_ISDIR(st.st_mode)
        else f"name a file in that folder, e.g. {Path(path) / 'kernel-lock.toml'}",
    )


def _failed(target: Path, exc: OSError, doing: str) -> WriteFailed:
    code = errno.errorcode.get(exc.errno or 0, "")
    reason = f"{code}: {exc.strerror}" if code and exc.strerror else str(exc)
    return WriteFailed(
        f"{doing} failed ({reason}); nothing was written: a file already there is unchanged",
        path=str(target),
        fix="free space (or quota) on that file system and run again, or write elsewhere"
        if code in ("ENOSPC", "EDQUOT", "EFBIG")
        else "check the disk and the folder, then run again, or write elsewhere",
    )


def _refuse(path: Path | str, problem: str, fix: str) -> UnsafeWrite:
    return UnsafeWrite(problem, path=str(path), fix=fix)


def _world_writable_problem(st: os.stat_result) -> str | None:
    if not st.st_mode & stat.S_IWOTH:
        return None
    if st.st_mode & stat.S_ISVTX and st.st_uid == 0:
        return None  # /tmp, /dev/shm: nobody else can rename or remove what this user writes there
    return f"is writable by every user (mode {stat.S_IMODE(st.st_mode):o}" + (
        ", sticky but not owned by root)" if st.st_mode & stat.S_ISVTX else ", not sticky)"
    )


def check_directory(directory: Path | str, named: Path | str | None = None) -> Path:
    """The real path of ``directory`` if files may be written there, else :class:`UnsafeWrite`."""
    real = Path(os.path.realpath(directory or "."))
    where = named if named is not None else real
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise _refuse(
            where,
            f"the folder {real} does not exist; nothing was written",
            "create the folder first, or give a path in a folder you can write to",
        ) from None
    except OSError as exc:
        raise _refuse(
            where,
            f"the folder {real} cannot be read ({exc.strerror}); nothing was written",
            "check its permissions",
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(
            where,
            f"{real} is {kind(st.st_mode)}, not a folder; nothing was written",
            "give a path in a folder",
        )
    if st.st_uid not in (os.getuid(), 0):
        raise _refuse(
            where,
            f"the folder {real} is owned by another user (uid {st.st_uid}), who could replace "
            "what is written there; nothing was written",
            "write into a folder you own (or root owns); share it with your group by its group "
            "permissions",
        )
    problem = _world_writable_problem(st)
    if problem:
        raise _refuse(
            where,
            f"the folder {real} {problem}: anyone could replace what is written there; nothing "
            "was written",
            f"chmod o-w {real} (or chmod +t, as /tmp is), or write elsewhere",
        )
    for parent in real.parents:
        try:
            pst = os.stat(parent)
        except OSError:
            continue
        problem = _world_writable_problem(pst)
        if problem:
            raise _refuse(
                where,
                f"the folder above {real}, {parent}, {problem}: anyone could move this folder "
                "away and put another in its place; nothing was written",
                f"chmod o-w {parent} (or chmod +t), or write elsewhere",
            )
    return real


def private_dir(
    path: Path | str, *, create: bool = True, variable: str = "KERNEL_PROBE_NODE_DIR"
) -> Path:
    """The private directory ``path``, made 0700 where missing and checked: this user's and open
    to nobody else, else :class:`UnsafeWrite` naming ``variable`` (what chooses that folder) in
    its fix (``create=False``: FileNotFoundError)."""
    path = Path(path)
    check_directory(path.parent)
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise _refuse(
                path, f"cannot create the folder ({exc.strerror})", "check the parent's permissions"
            ) from None
    try:
        fd = os.open(
            path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
        )
    except FileNotFoundError:
        raise
    except OSError:  # a link (ELOOP), not a directory (ENOTDIR), no permission
        st = os.lstat(path)
        raise _refuse(
            path, f"is {kind(st.st_mode)}, not a folder kernel-probe made", f"remove {path}"
        ) from None
    try:
        st = os.fstat(fd)
        if (
            st.st_uid == os.getuid()
            and not stat.S_IMODE(st.st_mode) & 0o022
            and stat.S_IMODE(st.st_mode) & 0o077
        ):
            # ours, and nobody else could write in it (an older kernel-probe's 755)
            os.fchmod(fd, 0o700)
            st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise _refuse(
            path,
            f"this folder was not made by kernel-probe for you (owner uid {st.st_uid}, "
            f"mode {stat.S_IMODE(st.st_mode):o}; expected uid {os.getuid()}, mode 700): it is "
            "never used",
            f"remove {path} (or ask its owner to), or set ${variable} to a folder of your own",
        )
    return path


def write_file(
    path: str | os.PathLike[str],
    data: str | bytes,
    *,
    mode: int = 0o644,
    through_link: bool = False,
    exclusive: bool = False,
    check: Callable[[bytes], None] | None = None,
) -> Path:
    """Write ``data`` to ``path`` atomically and return the path written. ``exclusive``:
    create ``path`` with ``O_EXCL``; ``through_link``: replace a link's target, else refused;
    ``check``: called with the bytes read back from the file before it replaces ``path`` (it
    raises to refuse them: then nothing was written)."""
    refuse_special(path)
    path = Path(path)
    if through_link:
        path = Path(os.path.realpath(path))
    directory = check_directory(path.parent if str(path.parent) else Path("."), named=path)
    target = directory / path.name
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _failed(target, exc, "looking at it") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise _refuse(
            target,
            "is a symbolic link: kernel-probe never writes through a link it did not create; "
            "not replaced",
            f"remove {target} (a link planted there could make the write land anywhere)",
        )
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if exclusive:
        try:
            fd = os.open(target, _CREATE, mode)
        except FileExistsError:
            raise  # claimed by another
        except OSError as exc:
            raise _failed(target, exc, "creating it") from None
        _write_all(fd, raw, None, target, target)
        return target
    tmp, fd = _temporary(directory, target)
    _write_all(fd, raw, mode, tmp, target)
    try:
        if check is not None:
            check(_read_back(tmp, target, raw))
        os.replace(tmp, target)
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, OSError):
            raise _failed(target, exc, f"renaming {tmp.name} onto it") from None
        raise
    return target


def _write_all(fd: int, raw: bytes, mode: int | None, written: Path, target: Path) -> None:
    """Write ``raw`` to ``fd``, fsync (``mode``: fchmod) and close it; on any failure remove
    ``written`` (new, this call's): nothing half-written stays; WriteFailed names ``target``."""
    try:
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            if mode is not None:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)  # on NFS a deferred write error may surface only here
    except BaseException as exc:
        _remove(written)
        if isinstance(exc, OSError):
            raise _failed(target, exc, "writing it") from None
        raise


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _temporary(directory: Path, target: Path) -> tuple[Path, int]:
    """A new temporary file beside ``target``, created with ``_CREATE``, and its descriptor."""
    import secrets  # only where something is written: reading a lock stays light

    for _ in range(100):
        tmp = directory / f".{target.name}.{secrets.token_hex(6)}.tmp"
        try:
            return tmp, os.open(tmp, _CREATE, 0o600)
        except FileExistsError:
            continue
        except OSError as exc:  # read-only, no permission: nothing was written
            raise _refuse(
                target,
                f"cannot write in the folder {directory} ({exc.strerror}); nothing was written",
                "give a path in a folder you can write to",
            ) from None
    # 100 random names all taken
    raise _refuse(target, "no temporary name was free", "remove the .tmp files there")


def _read_back(tmp: Path, target: Path, raw: bytes) -> bytes:
    """The bytes of ``tmp`` as the file system returns them: refused unless they are ``raw``."""
    try:
        again = tmp.read_bytes()
    except OSError as exc:
        raise _failed(target, exc, "reading it back") from None
    if again != raw:
        raise _refuse(
            target,
            f"read back {len(again)} bytes that differ from the {len(raw)} written; nothing was "
            "written",
            "check the file system (a full or failing disk?) and run the command again",
        )
    return again
