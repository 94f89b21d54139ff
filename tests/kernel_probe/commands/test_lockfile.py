"""kernel_probe.cli: how the lock subcommands name and read a lock file."""

from __future__ import annotations

import argparse

import pytest

import kernel_lock
from kernel_lock.errors import LockFormatError
from kernel_probe import cli, output
from tests.conftest import MINIMAL_LOCK
from tests.conftest import run_cli as run


def test_the_default_lock_is_KERNEL_LOCK_else_the_file_here(monkeypatch):
    monkeypatch.delenv("KERNEL_LOCK", raising=False)
    assert cli.default_lock_path() == cli.DEFAULT_LOCK == "kernel-lock.toml"
    monkeypatch.setenv("KERNEL_LOCK", "/locks/site.toml")
    assert cli.default_lock_path() == "/locks/site.toml"


def test_the_lock_argument_is_optional_and_says_its_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps help at hyphens too
    p = argparse.ArgumentParser()
    cli.add_lock_argument(p, "lock file to re-seal")
    cli.add_trust_argument(p)
    assert p.parse_args([]).lock is None and p.parse_args([]).trust == []
    args = p.parse_args(["a.toml", "--trust", "mylib", "--trust", "other"])
    assert args.lock == "a.toml" and args.trust == ["mylib", "other"]
    text = " ".join(p.format_help().split())
    assert "lock file to re-seal (default: $KERNEL_LOCK or ./kernel-lock.toml)" in text
    assert "$KERNEL_LOCK_TRUST" in text


def test_loading_sends_the_locks_warnings_to_stderr(tmp_path, capsys):
    output.reset()
    p = tmp_path / "k.toml"
    p.write_text(MINIMAL_LOCK.replace('"1.0"', '"1.99"'))
    lock = cli.load_lock(str(p), check_targets=False)
    err = " ".join(capsys.readouterr().err.split())
    assert len(lock.warnings) == 2 and err.count("warning:") == 2
    assert "minor version 1.99 is newer" in err and "no digest" in err


def test_loading_strict_refuses_what_it_would_only_warn_about(tmp_path, capsys):
    p = tmp_path / "k.toml"
    kernel_lock.loads(MINIMAL_LOCK, emit_warnings=False).sealed().dump(p)
    p.write_text(p.read_text().replace("eps = 1e-06", "eps = 1e-05"))  # a hand edit after sealing
    assert not cli.load_lock(str(p)).intact
    with pytest.raises(LockFormatError, match="edited by hand"):
        cli.load_lock(str(p), strict=True)


# ---- the lock commands default to $KERNEL_LOCK; a bad slot is a usage error (issue 16, point 7)
def test_lock_commands_default_to_KERNEL_LOCK(lock_file, capsys, monkeypatch):
    monkeypatch.setenv("KERNEL_LOCK", str(lock_file))
    monkeypatch.chdir(lock_file.parent.parent)  # no ./kernel-lock.toml here
    for argv in (["show"], ["explain", "LayerNorm"], ["rehash"], ["verify"]):
        code, out, err = run(argv, capsys)
        assert code == 0, (argv, err)
        assert str(lock_file) in out + err or argv == ["explain", "LayerNorm"], argv
    code, out, _ = run(["explain", "LayerNorm"], capsys)
    # the $KERNEL_LOCK file's slot
    assert "LayerNorm -> torch.layer_norm (torch.nn.LayerNorm)" in out
