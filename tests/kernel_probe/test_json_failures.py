"""One JSON failure shape for every command (issue 37): with --json, a failing command prints one
object on stdout, ``{"ok": false, "error": {type, problem, fix, file, key, exit_code}}`` plus its
own fields, and exits with the code the error names; a person's message still goes to stderr."""

from __future__ import annotations

import json

import pytest

from kernel_probe.cli import SUBCOMMANDS
from tests.conftest import MINIMAL_LOCK, run_cli, write_sealed

ERROR_KEYS = {"type", "problem", "fix", "file", "key", "exit_code"}


def other_machine(d):
    return write_sealed(d / "cuda.toml", MINIMAL_LOCK.replace('"cpu"', '"cuda"'))


def minimal(d):
    return write_sealed(d / "k.toml")


def other_choice(d):
    return write_sealed(d / "b.toml", MINIMAL_LOCK.replace("eps = 1e-6 }", "eps = 1e-5 }", 1))


def existing(d):
    (d / "out.toml").write_text("precious")
    return d / "out.toml"


def bad_profile(d):
    (d / "bad.toml").write_text("[[[ not toml")
    return d / "bad.toml"


MISSING = "/no/such/kernel-lock.toml"

# (the command's name, its arguments (callables make files in tmp_path), the exit code)
CASES = [
    ("probe", ["--pin", "RMSNorm=nope"], 2),
    ("probe", ["--shape", "0x8"], 2),
    ("probe", ["--check", "--out", "{tmp}/absent.toml"], 3),
    ("probe", ["--out", "{tmp}"], 2),
    ("verify", [MISSING], 5),
    ("verify", [other_machine, "--no-import"], 3),
    ("show", [MISSING], 5),
    ("rehash", [MISSING], 2),  # it has no --json: the usage error is JSON all the same
    ("env", ["--no-such-option"], 2),
    ("check", ["--dtype", "fp99"], 2),
    ("profiles", ["show", "no-such-profile"], 2),
    ("profiles", ["show", bad_profile], 5),
    ("explain", [MISSING, "LayerNorm"], 5),
    ("explain", [minimal], 2),  # a lock and no slot
    ("explain", [minimal, "Layernorm"], 2),
    ("diff", [MISSING, MISSING], 5),
    ("diff", [minimal, other_choice, "--exit-code"], 6),
    ("export", [MISSING], 5),
    ("check-config", ["/no/such/config.yaml"], 5),
    ("lock", ["--for", "inference", minimal, existing], 2),
    ("model", ["no/such/model.py:build"], 2),
    ("check-model", ["no/such/model.py:build", "--lock", MISSING], 2),
    ("check-model", ["tests/models/block.py:build", "--lock", MISSING], 5),
    ("verfiy", [], 2),  # a mistyped subcommand
]


def _argv(name, args, tmp_path):
    made = [a(tmp_path) if callable(a) else str(a).replace("{tmp}", str(tmp_path)) for a in args]
    return ([] if name == "probe" else [name]) + [str(a) for a in made] + ["--json"]


@pytest.mark.parametrize("name,args,code", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_failure_is_one_json_shape(
    name, args, code, tmp_path, capsys, no_workers, monkeypatch
):
    monkeypatch.delenv("KERNEL_LOCK", raising=False)
    got, out, err = run_cli(_argv(name, args, tmp_path), capsys)
    assert got == code, err
    data = json.loads(out)  # one object, nothing else on stdout
    assert data["ok"] is False
    assert set(data["error"]) == ERROR_KEYS
    error = data["error"]
    assert error["exit_code"] == code and isinstance(error["problem"], str) and error["problem"]
    assert isinstance(error["type"], str) and error["type"]
    assert all(error[k] is None or isinstance(error[k], str) for k in ("fix", "file", "key"))
    assert err.strip()  # and a message for a person on stderr


def test_every_command_with_json_has_its_failures_here():
    covered = {name for name, _, _ in CASES}
    assert {n for n, s in SUBCOMMANDS.items() if s.json} | {"probe", "profiles"} <= covered


def test_a_failing_command_keeps_its_own_fields(tmp_path, capsys, monkeypatch):
    got, out, _ = run_cli(["verify", other_machine(tmp_path), "--no-import", "--json"], capsys)
    data = json.loads(out)
    assert got == 3 and data["error"]["type"] == "LockMismatch"
    # verify's own fields
    assert data["differences"] and data["differences"][0]["field"] == "device-type"
    assert data["error"]["file"] == str(tmp_path / "cuda.toml")
