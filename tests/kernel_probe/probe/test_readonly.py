"""A current lock on a read-only file system is reused; write access is asked for only when a probe
will write, and the refusal names the real cause (a read-only file system, or a permission) (issue
37)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from kernel_probe.errors import UsageError
from kernel_probe.probe.write import check_writable, resolve_out
from tests.conftest import run_cli, small_probe


@pytest.fixture
def read_only(tmp_path):
    """(source directory, the same directory bind-mounted read-only): what is written in the first
    is seen in the second, which refuses every write with EROFS, even to root."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a read-only bind mount needs root and mount(8)")
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    done = subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True)
    if done.returncode:
        pytest.skip(f"mount --bind refused here: {done.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True, capture_output=True)
        yield src, ro
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def test_a_read_only_file_system_is_named_as_the_cause(read_only):
    _, ro = read_only
    # no write needed
    assert resolve_out(ro / "kernel-lock.toml") == ro.resolve() / "kernel-lock.toml"
    with pytest.raises(UsageError) as info:
        check_writable(ro / "kernel-lock.toml")
    assert "read-only file system" in info.value.problem and "permission" not in info.value.problem
    assert "writable file system" in info.value.fix and info.value.exit_code == 2


def test_a_permission_is_named_as_the_cause(tmp_path, monkeypatch):
    # as a non-root user in another's directory
    monkeypatch.setattr(os, "access", lambda *_a, **_k: False)
    with pytest.raises(UsageError) as info:
        check_writable(tmp_path / "kernel-lock.toml")
    assert "permission denied" in info.value.problem and "read-only" not in info.value.problem


@pytest.mark.slow
def test_a_current_lock_on_a_read_only_file_system_is_reused(read_only, capsys):
    src, ro = read_only
    argv = small_probe("Linear")
    assert run_cli(["--out", src / "kernel-lock.toml", *argv], capsys)[0] == 0
    before, files = (src / "kernel-lock.toml").read_bytes(), sorted(src.iterdir())
    code, _, err = run_cli(["--out", ro / "kernel-lock.toml", *argv], capsys)
    assert code == 0 and "reused without probing" in err
    assert run_cli(["--out", ro / "kernel-lock.toml", "--check", *argv], capsys)[0] == 0
    # a stale one must be probed again: that needs a write, refused naming the file system
    code, _, err = run_cli(
        ["--out", ro / "kernel-lock.toml", *small_probe("Linear", shape="64x48")], capsys
    )
    assert code == 2 and "read-only file system" in err and "permission denied" not in err
    assert (src / "kernel-lock.toml").read_bytes() == before
    assert sorted(src.iterdir()) == files  # nothing half-written


@pytest.mark.slow
def test_under_a_launcher_every_rank_reuses_a_current_lock_on_a_read_only_file_system(
    read_only, capsys, monkeypatch
):
    # the job-start recipe (srun kernel-probe --out LOCK) with a lock shipped read-only: no rank can
    # write a job marker, so none waits for one; each reuses the current lock itself
    src, ro = read_only
    argv = small_probe("Linear")
    assert (
        run_cli(["--out", src / "kernel-lock.toml", "--probe-per", "rank", *argv], capsys)[0] == 0
    )
    for rank in (1, 0):  # a waiting rank first: it would wait --lock-timeout for rank 0's marker
        env = {
            "SLURM_JOB_ID": "77",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
        }
        for k, v in (env | {"SLURM_NTASKS": "2"}).items():
            monkeypatch.setenv(k, v)
        code, _, err = run_cli(
            ["--out", ro / "kernel-lock.toml", "--lock-timeout", "5", *argv], capsys
        )
        assert code == 0 and "reused without probing" in err, err
