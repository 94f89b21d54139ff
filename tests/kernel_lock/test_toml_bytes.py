"""tomli-w is the project's TOML writer, and a lock's bytes stay what they were (issue 37).

The golden files in data/toml-golden/ were written by the hand-written formatter tomli-w replaced (a
real CPU probe's lock, the lock-format example, a document of every value form): for the same
content the writer must give the same bytes (key order, float and string forms, inline tables,
one-line arrays), so diffs between locks and their digests do not change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import kernel_lock
from kernel_lock import toml

GOLDEN = sorted((Path(__file__).parent / "data" / "toml-golden").glob("*.toml"))


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_the_same_content_gives_the_same_bytes(path):
    text = path.read_text()
    assert toml.dumps(toml.loads(text)) == text


def test_a_probe_lock_keeps_its_bytes_and_its_digest():
    text = (Path(__file__).parent / "data" / "toml-golden" / "probe-cpu-linear.toml").read_text()
    lock = kernel_lock.loads(text, emit_warnings=False)
    assert lock.intact and lock.compute_digest() == lock.digest
    assert lock.dumps() == text
    # one line
    assert any(len(line) > 100 and line.startswith("reasons = [") for line in text.splitlines())


def test_every_scalar_is_formatted_by_tomli_w(monkeypatch):
    import tomli_w

    seen = []
    real = tomli_w.dumps
    monkeypatch.setattr(tomli_w, "dumps", lambda obj, **kw: seen.append(obj) or real(obj, **kw))
    toml.dumps({"a": 1.5, "b": ["x", True], "c": {"d": "e"}})
    assert [v for obj in seen for v in obj.values() if v != 0] == [1.5, "x", True, "e"]


@pytest.mark.parametrize("text", ["tab\there", "bell\bform\ffeed", "del\x7f", "esc\x1b[31m"])
def test_control_characters_are_escaped_as_tomli_w_escapes_them_and_read_back(text):
    out = toml.dumps({"s": text})
    assert toml.loads(out) == {"s": text}
    assert "\x1b" not in out and "\b" not in out and "\x7f" not in out


def test_reading_a_lock_does_not_import_the_writer():
    code = (
        "import sys, kernel_lock; kernel_lock.loads(open(sys.argv[1]).read(), "
        "emit_warnings=False); print('tomli_w' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(GOLDEN[-1])],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert proc.stdout.strip() == "False"
