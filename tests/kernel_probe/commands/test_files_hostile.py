"""Files a command is told to write (issue 52, mechanism 6): a pipe or device named as the output is
refused at once (exit 2) by every command that writes one, and a full disk is a typed error (exit 5)
that keeps the old file, never "unexpected OSError"."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import run_cli, small_probe, write_sealed
from tests.kernel_lock.test_safe_writer import _fill, full_tmpfs, pipe_path

__all__ = ["full_tmpfs", "pipe_path"]  # fixtures, shared with the writer's tests


@pytest.mark.parametrize("command", ["probe", "rehash", "lock --for inference"])
def test_a_pipe_as_the_output_is_refused_at_once(tmp_path, pipe_path, capsys, command):
    if not os.path.exists(pipe_path):
        pytest.skip("no /proc here")
    argv = {
        "probe": ["--out", pipe_path, "--lock-timeout", "60", *small_probe("Linear")],
        "rehash": ["rehash", pipe_path],
        "lock --for inference": [
            *("lock", "--for", "inference", write_sealed(tmp_path / "in.toml"), pipe_path),
            "--force",
        ],
    }[command]
    start = time.monotonic()
    code, _, err = run_cli(argv, capsys)
    assert (code, time.monotonic() - start < 20) == (2, True), err
    option = {"probe": "--out", "rehash": "LOCK"}.get(command, "OUT")
    assert f"{pipe_path}: {option}" in err and "a FIFO (named pipe), not a regular file" in err
    assert "fix: name a regular file" in err


def test_out_dev_stdout_into_a_pipe_exits_2_without_waiting(tmp_path):
    # `kernel-probe --out /dev/stdout | cat` waited out --lock-timeout for "another kernel-probe"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_probe", "--out", "/dev/stdout", "--lock-timeout", "60"],
        capture_output=True,  # stdout a pipe, as under `| cat`
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert proc.returncode == 2 and time.monotonic() - start < 30, proc.stderr
    assert "/dev/stdout: --out" in proc.stderr and "FIFO" in proc.stderr and not proc.stdout


def test_rehash_on_a_full_disk_says_so_and_keeps_the_lock(full_tmpfs, capsys):
    lock = write_sealed(full_tmpfs / "kernel-lock.toml")
    lock.write_text(lock.read_text() + "\n")  # a hand edit: rehash must write
    old = lock.read_bytes()
    _fill(full_tmpfs)
    code, _, err = run_cli(["rehash", lock], capsys)
    assert code == 5 and "unexpected" not in err, err
    assert f"{lock}: writing it failed (ENOSPC" in err and "nothing was written" in err
    assert lock.read_bytes() == old and sorted(os.listdir(full_tmpfs)) == [
        "filler",
        "kernel-lock.toml",
    ]
