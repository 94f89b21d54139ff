"""kernel-probe check: the verdict table and its JSON."""

from __future__ import annotations

import json

import pytest

from kernel_probe.cli import main
from tests.conftest import run_cli


@pytest.mark.slow
def test_check_json_keys(capsys):
    code = main(
        [
            "check",
            "--slot",
            "LayerNorm",
            "--dtype",
            "fp32",
            "--dtype",
            "bf16",
            "--json",
            "--candidate",
            "LayerNorm=kp_zoo.norms.WrongEpsLayerNorm",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)
    assert data["device"]["type"] == "cpu"
    assert data["plan"] == [
        {"dtype": "float32", "regime": "true"},
        {"dtype": "bfloat16", "regime": "true"},
        {"dtype": "bfloat16", "regime": "mixed"},
    ]
    reports = {r["id"]: r for r in data["slots"]["LayerNorm"]}
    for r in reports.values():
        assert set(r) >= {"id", "target", "status", "reasons", "evidence"}
    assert reports["torch.layer_norm"]["status"] == "accepted"
    wrong = reports["custom:kp_zoo.norms.WrongEpsLayerNorm"]
    assert wrong["status"] == "rejected" and wrong["target"] == "kp_zoo.norms.WrongEpsLayerNorm"
    ev = wrong["evidence"][0]
    assert set(ev) >= {"dtype", "regime", "status", "failed", "worst_ratio", "reasons"}
    assert ev["worst_ratio"] > 1


@pytest.mark.slow
def test_check_table(capsys):
    code = main(["check", "--slot", "RMSNorm", "--dtype", "fp32"])
    out = capsys.readouterr().out
    assert code == 0
    assert "torch.rms_norm" in out and "accepted" in out and "worst error / tolerance" in out


@pytest.mark.parametrize(
    "argv,words",
    [
        (["check", "--candidate", "LayerNorm"], "expected SLOT=dotted.path.Class"),
        (["check", "--candidate", "Layernorm=a.B"], "did you mean 'LayerNorm'"),
        (["check", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    ],
)
def test_check_usage_errors(capsys, argv, words):
    assert main(argv) == 2
    assert words in capsys.readouterr().err


# ---- timeouts that are not numbers (hostile input, issue 14) -------------------------------------
@pytest.mark.parametrize(
    "argv,code",
    [
        (["check", "--timeout", "nan"], 2),
        (["check", "--timeout", "-1"], 2),
        (["check", "--import-timeout", "inf"], 2),
    ],
)
def test_bad_timeouts_are_usage_errors(capsys, argv, code):
    assert run_cli(argv, capsys)[0] == code


# ---- a class the user offered that cannot be imported (issue 37: it exited 0, "no build for cpu")
def test_an_offered_class_that_is_not_importable_says_so_without_an_install_hint():
    from kernel_probe.candidates import from_command_line
    from kernel_probe.probe.report import installed

    why = installed(from_command_line("LayerNorm=mymod_that_is_not_there.Nope"), "cpu")
    assert (
        why is not None
        and "not importable" in why
        and "PYTHONPATH" in why
        and "no build for" not in why
    )


@pytest.mark.slow
def test_check_of_an_offered_class_that_is_not_importable_exits_3(capsys):
    argv = [
        "check",
        "--candidate",
        "LayerNorm=mymod_that_is_not_there.Nope",
        "--slot",
        "LayerNorm",
        "--dtype",
        "fp32",
    ]
    code, out, err = run_cli([*argv, "--json"], capsys)
    data = json.loads(out)
    assert code == 3 and data["ok"] is False and data["error"]["exit_code"] == 3
    assert "mymod_that_is_not_there.Nope" in data["error"]["problem"] and data["slots"]["LayerNorm"]
