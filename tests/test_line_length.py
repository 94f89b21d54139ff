"""Every Python line of the project fits in 100 columns (issue 40): ruff's E501 at pyproject's
``line-length``, run here so the fast lane catches what CI's lint step would. ruff measures as
the anchors' linters do: a line that ends in a pragma (``# type: ignore[...]``, ``# noqa``) counts
without it, a single unbreakable word (a URL) is let through, and a multi-line string of data
(TOML inline tables must stay on one line) carries ``# noqa: E501`` after its closing quotes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 100

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed (the `lint` extra: pip install -e '.[lint]'); CI installs it",
)


def _long_lines(*paths: Path, cwd: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "E501"]
        + ["--line-length", str(WIDTH), "--output-format", "concise", *map(str, paths)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    return [line for line in done.stdout.splitlines() if "E501" in line]


def test_every_python_line_fits_in_100_columns() -> None:
    over = _long_lines(ROOT, cwd=ROOT)
    assert not over, f"{len(over)} lines over {WIDTH} columns, first: {over[:10]}"


def test_the_check_finds_a_long_line_and_lets_a_marked_one_through(tmp_path: Path) -> None:
    long = "y = '" + "a b " * 30 + "'"
    sample = tmp_path / "sample.py"
    sample.write_text(f"x = 1\n{long}\n{long}  # noqa: E501\n", encoding="utf-8")
    over = _long_lines(sample, cwd=tmp_path)
    assert len(over) == 1 and "sample.py:2:" in over[0]
