"""The generated tables in README.md and docs/ are up to date with the code
(kernel_probe.docgen)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kernel_lock.errors import EXIT_CODES, ExitCode
from kernel_probe import docgen
from tests.conftest import ROOT

BLOCK = "<!-- exit-codes:begin -->\n{body}<!-- exit-codes:end -->\n"


def test_every_document_is_up_to_date():
    assert docgen.update(ROOT, write=False) == [], "run `python -m kernel_probe.docgen`"


def test_check_mode_from_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_probe.docgen", "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("document", ["README.md", "docs/probe.md", "docs/lock-format.md"])
def test_the_exit_code_table_is_generated_where_exit_codes_are_documented(document):
    text = (ROOT / document).read_text()
    assert BLOCK.format(body=docgen.exit_code_table()) in text
    assert text.count("| code | meaning |") == 1  # no hand-written table beside it


def test_the_table_has_every_code_and_escapes_pipes(monkeypatch):
    table = docgen.exit_code_table()
    for code in ExitCode:
        assert f"| {code.value} | {code.meaning} |" in table
    assert {code.value: code.meaning for code in ExitCode} == EXIT_CODES  # the public dict, derived
    monkeypatch.setattr(ExitCode.LOCKS_DIFFER, "meaning", "a | b")
    assert "| 6 | a \\| b |" in docgen.exit_code_table()


def _root(tmp_path, text):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n")
    doc = tmp_path / "docs" / "a.md"
    doc.write_text(text)
    return doc


def test_check_finds_a_stale_document_and_the_generator_fixes_it(tmp_path, capsys):
    doc = _root(tmp_path, "Codes:\n\n" + BLOCK.format(body="| 0 | ok |\n") + "\nafter\n")
    before = doc.read_text()
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 1
    assert "a.md: generated tables are out of date" in capsys.readouterr().err
    assert doc.read_text() == before  # --check writes nothing
    assert docgen.main(["--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"updated {doc}\n"
    assert (
        doc.read_text() == "Codes:\n\n" + BLOCK.format(body=docgen.exit_code_table()) + "\nafter\n"
    )
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 0
    # nothing to update
    assert docgen.main(["--root", str(tmp_path)]) == 0 and capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "text,words",
    [
        (
            "<!-- exit-codez:begin -->\n<!-- exit-codez:end -->\n",
            "unknown generated block 'exit-codez'",
        ),
        (
            "x\n<!-- exit-codes:begin -->\n| 0 | ok |\n",
            "a.md:2: <!-- exit-codes:begin --> without its",
        ),
    ],
)
def test_malformed_markers_are_errors(tmp_path, capsys, text, words):
    doc = _root(tmp_path, text)
    assert docgen.main(["--root", str(tmp_path)]) == 5
    assert words in capsys.readouterr().err
    assert doc.read_text() == text


def test_no_documents_is_an_error(tmp_path, capsys):
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 5
    assert "no README.md" in capsys.readouterr().err
