"""The main command end to end on this CPU machine: write, reuse, --check, bad inputs, many ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import kernel_lock
from kernel_probe.cli import main

from .conftest import ROOT, write_sealed


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    path = d / "kernel-lock.toml"
    assert main(["--out", str(path)]) == 0
    return path


@pytest.mark.slow
def test_probe_writes_a_valid_lock(probed):
    lock = kernel_lock.load(probed, strict=True)
    assert lock.intact and lock.precision == "bf16-mixed"
    assert lock.environment.fields["device-type"].value == "cpu"
    assert {s: lock.slots[s].implementation for s in lock.slots} == {
        "LayerNorm": "torch.layer_norm",
        "RMSNorm": "torch.rms_norm",
        "Linear": "torch.linear",
    }
    ln = lock.slots["LayerNorm"]
    assert ln.kwargs == {"eps": 1e-5, "elementwise_affine": True, "bias": True}
    assert {(e["dtype"], e["regime"]) for e in ln.evidence} == {("float32", "true"), ("bfloat16", "mixed")}
    assert ln.timing and ln.timing[0]["shape"] == "2048x1024" and ln.timing[0]["median-ms"] > 0
    liger = [r for r in ln.rejected if r.implementation == "liger.layer_norm"]
    if liger:  # liger-kernel installed here: its real failure is recorded, not hidden
        assert liger[0].status == "unavailable"
    lock.verify()
    assert type(lock.factory("LayerNorm")(16)).__name__ == "LayerNorm"


def test_second_run_reuses(probed, capsys):
    before = probed.read_bytes()
    assert main(["--out", str(probed)]) == 0
    assert "reused without probing" in capsys.readouterr().err
    assert probed.read_bytes() == before


def test_check_mode(probed, tmp_path, capsys):
    assert main(["--out", str(probed), "--check"]) == 0
    assert main(["--out", str(tmp_path / "missing.toml"), "--check"]) == 3
    assert "stale or missing" in capsys.readouterr().err
    assert main(["--out", str(probed), "--check", "--precision", "32-true"]) == 3
    assert not (tmp_path / "missing.toml").exists()


@pytest.mark.slow
def test_stale_environment_is_reprobed(probed, tmp_path, capsys):
    text = probed.read_text().replace('device-type = { value = "cpu"', 'device-type = { value = "cuda"')
    stale = tmp_path / "stale.toml"
    write_sealed(stale, text)
    assert main(["--out", str(stale), "--check"]) == 3
    assert "device-type" in capsys.readouterr().err
    assert main(["--out", str(stale)]) == 0
    assert kernel_lock.load(stale).environment.fields["device-type"].value == "cpu"


@pytest.mark.slow
def test_corrupt_lock_is_reported_and_kept_unless_forced(tmp_path, capsys):
    p = tmp_path / "k.toml"
    p.write_text("[[[ not a lock")
    assert main(["--out", str(p)]) == 5
    assert "--force" in capsys.readouterr().err and p.read_text() == "[[[ not a lock"
    assert main(["--out", str(p), "--force", "--slot", "Linear"]) == 0
    assert kernel_lock.load(p).slots["Linear"].implementation == "torch.linear"


def test_hand_edited_lock_needs_force(probed, tmp_path, capsys):
    p = tmp_path / "k.toml"
    p.write_text(probed.read_text().replace("eps = 1e-05", "eps = 1e-04", 1))
    assert main(["--out", str(p)]) == 5
    assert "edited by hand" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,code,words",
    [
        (["--shape", "0x1024"], 2, "positive integers"),
        (["--shape", "40320"], 2, "ROWSxHIDDEN"),
        (["--shape", "axb"], 2, "ROWSxHIDDEN"),
        (["--dtype", "bf16"], 2, "--precision"),
        (["--pin", "RMSNorm"], 2, "expected SLOT=ID"),
        (["--pin", "Rmsnorm=x"], 2, "unknown slot"),
        (["--reps", "0"], 2, "at least 1"),
    ],
)
def test_bad_arguments(tmp_path, capsys, argv, code, words):
    assert main(["--out", str(tmp_path / "k.toml"), *argv]) == code
    assert words in capsys.readouterr().err
    assert not (tmp_path / "k.toml").exists()


def test_unknown_precision_is_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "k.toml"), "--precision", "fp8-mixed"])
    assert exc.value.code == 2


def test_unwritable_output(tmp_path, capsys):
    # every --out that cannot take a lock is a usage error (exit 2) naming the path and the fix
    assert main(["--out", str(tmp_path / "no" / "such" / "dir" / "k.toml")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "mkdir -p" in err
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["--out", str(f / "k.toml")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_pin_of_unavailable_candidate_fails_loudly(tmp_path, capsys):
    code = main(["--out", str(tmp_path / "k.toml"), "--slot", "RMSNorm", "--pin", "RMSNorm=quack.rms_norm"])
    assert code == 3  # EXIT_CODES[3]: a pinned kernel cannot be used here
    err = capsys.readouterr().err
    assert "--pin RMSNorm=quack.rms_norm" in err and "unavailable" in err and "never silently" in err
    assert not (tmp_path / "k.toml").exists()


@pytest.mark.slow
def test_pinned_custom_candidate_lands_in_the_lock(tmp_path):
    p = tmp_path / "k.toml"
    assert (
        main(
            [
                "--out",
                str(p),
                "--slot",
                "LayerNorm",
                "--candidate",
                "LayerNorm=kp_zoo.norms.GoodLayerNorm",
                "--pin",
                "LayerNorm=custom:kp_zoo.norms.GoodLayerNorm",
            ]
        )
        == 0
    )
    lock = kernel_lock.load(p)
    slot = lock.slots["LayerNorm"]
    assert slot.implementation == "custom:kp_zoo.norms.GoodLayerNorm" and "pinned" in slot.reason
    assert lock.trusted_modules == ("kp_zoo",)
    m = lock.factory("LayerNorm")(32)
    assert type(m).__name__ == "GoodLayerNorm" and m.eps == 1e-5


@pytest.mark.slow
def test_json_summary(tmp_path, capsys):
    p = tmp_path / "k.toml"
    assert main(["--out", str(p), "--slot", "RMSNorm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["reused"] is False and data["slots"]["RMSNorm"]["chosen"] == "torch.rms_norm"
    cands = {c["id"]: c for c in data["slots"]["RMSNorm"]["candidates"]}
    assert cands["torch.rms_norm"]["timings"][0]["gbps"] > 0
    assert main(["--out", str(p), "--slot", "RMSNorm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reused"] is True


def test_explain_and_diff(probed, tmp_path, capsys):
    assert main(["explain", str(probed), "LayerNorm"]) == 0
    out = capsys.readouterr().out
    assert "torch.layer_norm" in out and "correctness evidence" in out
    assert "not chosen: liger.layer_norm [unavailable]" in out
    other = tmp_path / "o.toml"
    text = probed.read_text().replace('implementation = "torch.rms_norm"', 'implementation = "liger.rms_norm"')
    write_sealed(other, text)
    assert main(["diff", str(probed), str(other), "--exit-code"]) == 6  # EXIT_CODES[6]: the locks differ
    assert "slot RMSNorm implementation: 'torch.rms_norm' -> 'liger.rms_norm'" in capsys.readouterr().out
    assert main(["diff", str(probed), str(probed), "--exit-code"]) == 0
    assert main(["explain", str(probed), "Layernorm"]) == 2  # a bad argument, not a bad file


@pytest.mark.slow
def test_sixteen_ranks_one_lock(tmp_path):
    out = tmp_path / "same.toml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "kernel_probe", "--out", str(out), "--slot", "LayerNorm"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(16)
    ]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert [code for code, _ in results] == [0] * 16, [err for _, err in results if err]
    lock = kernel_lock.load(out, strict=True)
    assert lock.slots["LayerNorm"].implementation == "torch.layer_norm"
    reused = sum("reused without probing" in err for _, err in results)
    assert reused == 15  # exactly one rank probed; the others waited and reused its lock
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name != "same.toml")
    assert leftovers == [".same.toml.lock"]  # the (empty, hidden) file lock; no temp files
