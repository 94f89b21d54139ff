"""kernel_lock.files.write_file and private_dir: the one safe writer, tested against links,
FIFOs, foreign owners and modes (issue 34, point 1: files clobbered through links)."""

from __future__ import annotations

import os
import stat

import pytest

from kernel_lock.errors import ExitCode
from kernel_lock.files import UnsafeWrite, check_directory, private_dir, write_file

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
