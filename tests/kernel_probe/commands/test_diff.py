"""kernel-probe diff: what changed between two locks, and exit 6 with --exit-code when they
differ."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import MINIMAL_LOCK, ROOT, write_sealed
from tests.conftest import run_cli as run


def test_diff_exit_code_is_6_when_the_locks_differ(tmp_path, capsys):
    from kernel_lock.errors import EXIT_CODES

    a, same, b = tmp_path / "a.toml", tmp_path / "same.toml", tmp_path / "b.toml"
    for path, text in (
        (a, MINIMAL_LOCK),
        (same, MINIMAL_LOCK),
        (b, MINIMAL_LOCK.replace("bias = false", "bias = true")),
    ):
        write_sealed(path, text)
    code, out, _ = run(["diff", a, b, "--exit-code"], capsys)
    assert code == 6 and "diff --exit-code" in EXIT_CODES[6]
    assert "slot Linear kwargs: {'bias': False} -> {'bias': True}" in out
    assert run(["diff", a, b], capsys)[0] == 0  # without --exit-code a difference is not a status
    assert run(["diff", a, same, "--exit-code"], capsys)[0] == 0
    assert run(["diff", a, a, "--exit-code"], capsys)[0] == 0
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_probe", "diff", str(a), str(b), "--exit-code"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 6, proc.stderr
    code, out, _ = run(["diff", "--help"], capsys)
    assert code == 0 and "exit 6 when the locks differ" in " ".join(out.split())
