"""`import kernel_lock` stays light: no rich, no kernel_probe, and no torch until something is
resolved."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def _imported_modules(code: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert "kernel_lock" in names or "kernel_lock" not in code
    return names


def test_import_kernel_lock_is_light():
    names = _imported_modules("import kernel_lock")
    for heavy in ("rich", "kernel_probe", "torch", "tomli_w", "archspec", "filelock"):
        assert not any(n == heavy or n.startswith(heavy + ".") for n in names), heavy


def test_loading_a_lock_does_not_import_torch(lock_file):
    names = _imported_modules(
        f"import kernel_lock; kernel_lock.load({str(lock_file)!r}, emit_warnings=False)"
    )
    assert "torch" not in names and "rich" not in names
