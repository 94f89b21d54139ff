"""kernel_lock.files.write_file and private_dir: the one safe writer, tested against links,
FIFOs, foreign owners and modes (issue 34, point 1: files clobbered through links), a full disk
and a pipe behind a link (issue 52: typed OS errors, special files refused)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess

import pytest

from kernel_lock.errors import ExitCode
from kernel_lock.files import (
    SpecialFile,
    UnsafeWrite,
    WriteFailed,
    check_directory,
    private_dir,
    refuse_special,
    write_file,
)

OTHER_UID = (
    54321  # a user that is not us (the tests run as root here, or as a user: either way not 54321)
)


def test_writes_atomically_with_the_mode_asked_and_leaves_no_temporary_file(tmp_path):
    target = write_file(tmp_path / "k.toml", "x = 1\n", mode=0o640)
    assert target.read_text() == "x = 1\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    write_file(tmp_path / "k.toml", b"y = 2\n")
    assert target.read_text() == "y = 2\n" and os.listdir(tmp_path) == ["k.toml"]


def test_a_link_at_the_final_component_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / ".L.toml.job-slurm-77.0-a0").symlink_to(victim)
    with pytest.raises(UnsafeWrite) as err:
        write_file(tmp_path / ".L.toml.job-slurm-77.0-a0", "{}")
    assert err.value.exit_code == ExitCode.BAD_INPUT and "symbolic link" in err.value.problem
    assert victim.read_text() == "precious"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "not-yet")
    with pytest.raises(UnsafeWrite):
        write_file(dangling, "{}")
    assert not (tmp_path / "not-yet").exists()


def test_a_link_the_user_named_is_written_through_on_request(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link.toml").symlink_to(tmp_path / "real" / "lock.toml")
    write_file(tmp_path / "link.toml", "a", through_link=True)
    assert (tmp_path / "link.toml").is_symlink() and (
        tmp_path / "real" / "lock.toml"
    ).read_text() == "a"


def test_a_planted_temporary_name_is_never_opened(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    names = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    import secrets

    monkeypatch.setattr(secrets, "token_hex", lambda n: next(names))
    (tmp_path / ".k.aaaaaaaaaaaa.tmp").symlink_to(victim)  # the first name the writer tries
    write_file(tmp_path / "k", "new")
    assert victim.read_text() == "precious" and (tmp_path / "k").read_text() == "new"


def test_exclusive_create_fails_on_anything_there_link_included(tmp_path):
    write_file(tmp_path / "claim", "me", exclusive=True)
    with pytest.raises(FileExistsError):
        write_file(tmp_path / "claim", "you", exclusive=True)
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeWrite):
        write_file(tmp_path / "linked", "you", exclusive=True)
    assert not (tmp_path / "elsewhere").exists() and (tmp_path / "claim").read_text() == "me"


@pytest.mark.parametrize("make", ["fifo", "directory"])
def test_a_fifo_or_a_directory_at_the_path_is_never_replaced(tmp_path, make):
    path = tmp_path / "x"
    os.mkfifo(path) if make == "fifo" else path.mkdir()
    with pytest.raises(UnsafeWrite, match="not a regular file"):
        write_file(path, "data")


@pytest.mark.parametrize(
    ("mode", "uid", "refused"),
    [
        (0o755, None, None),
        (0o775, None, None),  # group-writable: the group is trusted (a project's lock directory)
        (0o777, None, "writable by every user"),
        (0o1777, None, None),  # sticky and root-owned, as /tmp is
        (0o755, OTHER_UID, "owned by another user"),
        (0o1777, OTHER_UID, "owned by another user"),
    ],
)
def test_the_directory_rule(tmp_path, mode, uid, refused):
    d = tmp_path / "d"
    d.mkdir()
    os.chmod(d, mode)
    if uid is not None:
        if os.getuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(d, uid, -1)
    if mode & 0o1000 and os.getuid() != 0 and uid is None:
        pytest.skip("a sticky world-writable folder is accepted only when root owns it")
    if refused:
        with pytest.raises(UnsafeWrite, match=refused):
            write_file(d / "k.toml", "x")
        assert not list(d.iterdir())
    else:
        write_file(d / "k.toml", "x")


def test_a_world_writable_folder_above_is_refused_unless_sticky(tmp_path):
    above = tmp_path / "above"
    (above / "inner").mkdir(parents=True)
    os.chmod(above, 0o777)
    with pytest.raises(UnsafeWrite, match="the folder above"):
        check_directory(above / "inner")
    os.chmod(above, 0o1777)
    if os.getuid() == 0:
        assert check_directory(above / "inner") == (above / "inner").resolve()


def test_a_missing_folder_writes_nothing(tmp_path):
    with pytest.raises(UnsafeWrite, match="does not exist"):
        write_file(tmp_path / "no" / "k.toml", "x")


# ---- node-local folders: 0700, made by us, checked after creation --------------------------------
def test_private_dir_is_made_0700_and_an_older_0755_of_ours_is_tightened(tmp_path):
    made = private_dir(tmp_path / "p")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    os.chmod(made, 0o755)
    private_dir(made)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


@pytest.mark.parametrize("how", ["777 ours", "other owner", "link"])
def test_private_dir_refuses_one_made_beforehand_by_someone_else(tmp_path, how):
    path = tmp_path / "kernel-probe-0"
    if how == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.mkdir()
        os.chmod(path, 0o777 if how == "777 ours" else 0o700)
        if how == "other owner":
            if os.getuid() != 0:
                pytest.skip("chown to another user needs root")
            os.chown(path, OTHER_UID, -1)
    with pytest.raises(UnsafeWrite):
        private_dir(path)
    with pytest.raises(UnsafeWrite):
        private_dir(path, create=False)


# ---- every OS error typed, nothing half-written (issue 52, mechanism 6) -------------------------
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _failing(real, exc=ENOSPC):
    """``real`` (os.write, os.fsync ...) that fails on any descriptor but stdin/stdout/stderr."""

    def call(fd, *args):
        if isinstance(fd, int) and fd > 2:
            raise exc
        return real(fd, *args)

    return call


@pytest.mark.parametrize("call", ["write", "fsync", "fchmod", "close"])
def test_a_full_disk_is_a_typed_error_and_the_old_file_is_kept(tmp_path, monkeypatch, call):
    old = write_file(tmp_path / "k.toml", "old = 1\n")
    monkeypatch.setattr(os, call, _failing(getattr(os, call)))
    with pytest.raises(WriteFailed) as err:
        write_file(old, "new = 2\n")
    monkeypatch.undo()
    assert err.value.exit_code == ExitCode.BAD_INPUT and err.value.path == str(old)
    assert "ENOSPC" in err.value.problem and "nothing was written" in err.value.problem
    assert "free space" in err.value.fix
    assert old.read_text() == "old = 1\n" and os.listdir(tmp_path) == ["k.toml"]


def test_a_failed_rename_is_typed_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    old = write_file(tmp_path / "k.toml", "old = 1\n")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
    with pytest.raises(WriteFailed, match="EIO: I/O.*nothing was written"):
        write_file(old, "new = 2\n")
    assert old.read_text() == "old = 1\n" and os.listdir(tmp_path) == ["k.toml"]


def test_a_failed_exclusive_write_removes_its_half_written_claim(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "write", _failing(os.write))
    with pytest.raises(WriteFailed, match="ENOSPC"):
        write_file(tmp_path / "claim", "me", exclusive=True)
    assert not (tmp_path / "claim").exists()


@pytest.fixture
def full_tmpfs(tmp_path):
    """A 64 KiB tmpfs, filled: each write there ends in ENOSPC (needs root and mount(8))."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    where = tmp_path / "full"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)])
    if done.returncode:
        pytest.skip("mount -t tmpfs refused here")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def _fill(folder):
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_a_real_full_disk_keeps_the_old_file(full_tmpfs):
    old = write_file(full_tmpfs / "k.toml", "old = 1\n")
    _fill(full_tmpfs)
    with pytest.raises(WriteFailed, match="ENOSPC.*nothing was written"):
        write_file(old, "new = 2\n" * 4096)
    assert old.read_text() == "old = 1\n" and sorted(os.listdir(full_tmpfs)) == ["filler", "k.toml"]


# ---- a path that names no regular file: refused at once, exit 2 ---------------------------------
@pytest.fixture
def pipe_path():
    """A path that names the write end of a pipe, as /dev/stdout does under `... | cat`."""
    r, w = os.pipe()
    try:
        yield f"/proc/self/fd/{w}"
    finally:
        os.close(r)
        os.close(w)


def test_a_pipe_behind_a_link_is_refused_by_kind(pipe_path):
    if not os.path.exists(pipe_path):
        pytest.skip("no /proc here")
    with pytest.raises(SpecialFile) as err:
        write_file(pipe_path, "x", through_link=True)
    assert err.value.exit_code == ExitCode.USAGE and err.value.path == pipe_path
    assert "a FIFO (named pipe), not a regular file" in err.value.problem and "a link to" in str(
        err.value
    )
    assert "regular file" in err.value.fix


@pytest.mark.parametrize("make", ["device", "directory", "link to a fifo"])
def test_refuse_special_names_the_option_the_kind_and_the_fix(tmp_path, make):
    path = tmp_path / "x"
    if make == "device":
        path.symlink_to("/dev/null")
    elif make == "directory":
        path.mkdir()
    else:
        os.mkfifo(tmp_path / "fifo")
        path.symlink_to(tmp_path / "fifo")
    with pytest.raises(SpecialFile) as err:
        refuse_special(path, "--out")
    said = {"device": "a character device", "directory": "a directory"}.get(make, "a FIFO")
    assert err.value.problem.startswith("--out") and said in err.value.problem
    assert err.value.exit_code == ExitCode.USAGE and "kernel-lock.toml" in err.value.fix
    refuse_special(tmp_path / "missing", "--out")  # nothing there yet: fine
    refuse_special(write_file(tmp_path / "regular", "x"), "--out")
