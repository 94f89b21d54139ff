"""kernel-probe verify: the machine against a lock, every slot resolved; exit codes, one clear
message, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kernel_probe.cli import main
from tests.conftest import MINIMAL_LOCK, ROOT, edited_lock, write_sealed
from tests.conftest import run_cli as run


def test_verify_ok(lock_file, capsys):
    code, out, err = run(["verify", str(lock_file)], capsys)
    assert code == 0, err
    assert "torch.nn.LayerNorm" in out and "no digest" in err


def test_verify_json(lock_file, capsys):
    code, out, _ = run(["verify", str(lock_file), "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["ok"] is True
    assert data["slots"]["RMSNorm"]["target"] == "torch.nn.RMSNorm"
    assert data["slots"]["Linear"]["kwargs"] == {"bias": False}


def test_verify_uses_env_var_default(lock_file, capsys, monkeypatch):
    monkeypatch.setenv("KERNEL_LOCK", str(lock_file))
    assert run(["verify"], capsys)[0] == 0


def test_verify_mismatch_exit_3_json_lists_fields(tmp_path, capsys):
    p = tmp_path / "k.toml"
    p.write_text(MINIMAL_LOCK.replace('value = "cpu"', 'value = "rocm"'))
    code, out, err = run(["verify", str(p), "--json"], capsys)
    assert code == 3
    data = json.loads(out)
    assert data["ok"] is False
    assert data["differences"] == [
        {"field": "device-type", "expected": "rocm", "found": "cpu", "rule": "exact"}
    ]
    code, out, err = run(["verify", str(p)], capsys)
    assert code == 3 and "device-type" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "content,code,words",
    [
        ("not = = toml", 5, "not valid TOML"),
        (MINIMAL_LOCK.replace('"1.0"', '"3.0"'), 5, "not supported"),
        (
            MINIMAL_LOCK.replace('target = "torch.nn.LayerNorm"', 'target = "os.system"'),
            5,
            "allow-list",
        ),
        (
            MINIMAL_LOCK.replace("kwargs = { eps = 1e-6 }", "kwargs = { epsilon = 1e-6 }", 1),
            5,
            "does not accept",
        ),
        (
            MINIMAL_LOCK.replace("[slots.Linear]", "[slots.Layernorm]"),
            5,
            "did you mean 'LayerNorm'",
        ),
    ],
)
def test_verify_bad_lock_exit_codes(tmp_path, capsys, content, code, words):
    p = tmp_path / "k.toml"
    p.write_text(content)
    got, out, err = run(["verify", str(p)], capsys)
    assert got == code
    assert words in err and str(p) in err and "Traceback" not in err


def test_missing_and_directory(tmp_path, capsys):
    code, _, err = run(["verify", str(tmp_path / "nope.toml")], capsys)
    assert code == 5 and "no such file" in err
    code, _, err = run(["show", str(tmp_path)], capsys)
    assert code == 5 and "is a directory" in err


def test_strict_refuses_hand_edit(tmp_path, capsys):

    p = write_sealed(tmp_path / "k.toml")
    assert run(["verify", str(p), "--strict"], capsys)[0] == 0
    p.write_text(p.read_text().replace("1e-06", "1e-07", 1))
    code, _, err = run(["verify", str(p), "--strict"], capsys)
    assert code == 5 and "edited by hand" in err
    # rehash accepts the edit
    assert run(["rehash", str(p)], capsys)[0] == 0
    assert run(["verify", str(p), "--strict"], capsys)[0] == 0


def test_usage_error_is_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--mode", "serving"])
    assert exc.value.code == 2


@pytest.mark.slow
def test_no_traceback_from_real_process(tmp_path):
    p = tmp_path / "k.toml"
    p.write_text("[[[")
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_probe", "verify", str(p)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 5
    assert "Traceback" not in proc.stderr and "not valid TOML" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_probe", "verify", str(p), "--debug"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert "Traceback" in proc.stderr  # --debug shows it


# ---- verify: the slot's semantics, an empty or unknown environment (hostile input, issue 14) -----
@pytest.mark.parametrize(
    "slot,target,words",
    [
        ("LayerNorm", "torch.nn.RMSNorm", "computes rms_norm, not layer_norm"),
        ("Linear", "torch.nn.Identity", "computes other: Identity, not linear"),
    ],
)
def test_verify_checks_the_class_against_the_slot(tmp_path, capsys, slot, target, words):
    default = {"LayerNorm": "torch.nn.LayerNorm", "Linear": "torch.nn.Linear"}[slot]
    text = MINIMAL_LOCK.replace(
        f"[slots.{slot}]\nimplementation", f"[slots.{slot}]\nimplementation", 1
    )
    head, _, tail = text.partition(f"[slots.{slot}]")
    tail = tail.replace(f'target = "{default}"', f'target = "{target}"', 1)
    # rehash-ed: the digest is intact
    path = write_sealed(tmp_path / "k.toml", head + f"[slots.{slot}]" + tail, check_targets=False)
    code, _, err = run(["verify", path, "--strict"], capsys)
    assert code == 5 and words in err, err


def test_strict_refuses_an_empty_environment(tmp_path, capsys):
    text = edited_lock(**{'[environment]\ndevice-type = { value = "cpu", match = "exact" }\n': ""})
    path = write_sealed(tmp_path / "k.toml", text, check_targets=False)
    assert run(["verify", path], capsys)[0] == 0  # matches any machine: allowed, but ...
    code, _, err = run(["verify", path, "--strict"], capsys)
    assert code == 5 and "no [environment]: it would match any machine" in err


def test_an_unknown_environment_field_is_reported_not_checked(tmp_path, capsys):
    text = edited_lock(
        **{
            'device-type = { value = "cpu", match = "exact" }': (
                'device-type = { value = "cpu", match = "exact" }\n'
                'quantum-bits = { value = "42", match = "exact" }'
            )
        }
    )
    path = write_sealed(tmp_path / "k.toml", text, check_targets=False)
    code, out, err = run(["verify", path], capsys)
    assert code == 0, err
    assert "'quantum-bits' is unknown to this kernel_lock" in out and "not checked" in out
