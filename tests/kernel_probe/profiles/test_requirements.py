"""kernel_probe.profile_match: what a site requires, enforced (exit 4), and the profile as
part of the lock's identity."""

from __future__ import annotations

import json

import pytest

import kernel_lock
from kernel_probe.cli import main
from kernel_probe.probe import pipeline
from kernel_probe.profiles import load_file
from tests.conftest import run_cli
from tests.kernel_probe.profiles.cases import (
    GPU_PROFILE,
    GPU_PROFILES,
    PIN,
    check,
    lock_with_profile,
    match,
    write_profile,
)


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_gpu_profiles_are_unmet_on_this_cpu_machine(name, tmp_path, capsys):
    out = tmp_path / "k.toml"
    assert main(["--profile", name, "--out", str(out)]) == 4
    err = capsys.readouterr().err
    assert f"does not meet profile '{name}'" in err
    assert "device-type: expected" in err and "found cpu" in err
    assert "device-count: expected >= 1 accelerator(s), found 0" in err
    assert not out.exists()


@pytest.mark.slow
def test_a_profile_pin_changes_the_lock(tmp_path, capsys):
    plain, pinned = tmp_path / "plain.toml", tmp_path / "pinned.toml"
    assert main(["--out", str(plain), "--slot", "LayerNorm", "--shape", "256x1000"]) == 0
    assert kernel_lock.load(plain).slots["LayerNorm"].implementation == "torch.layer_norm"
    write_profile(tmp_path / "profiles", PIN)
    assert (
        main(
            [
                "--profile",
                "mysite",
                "--profiles-dir",
                str(tmp_path / "profiles"),
                "--out",
                str(pinned),
                "--slot",
                "LayerNorm",
            ]
        )
        == 0
    )
    lock = kernel_lock.load(pinned)
    slot = lock.slots["LayerNorm"]
    assert (
        slot.implementation == "site.good_layer_norm" and "pinned by profile mysite" in slot.reason
    )
    assert lock.profile["name"] == "mysite" and lock.profile["matched"] == "explicit (--profile)"
    assert lock.provenance["shapes"] == ["256x1000"]  # the profile's shapes were used
    assert type(lock.factory("LayerNorm")(8)).__name__ == "GoodLayerNorm"
    assert main(["diff", str(plain), str(pinned)]) == 0
    assert (
        "slot LayerNorm implementation: 'torch.layer_norm' -> 'site.good_layer_norm'"
        in capsys.readouterr().out
    )


@pytest.mark.slow
def test_forbidden_library_and_strictness(tmp_path, capsys):
    from importlib.metadata import version

    installed = version("liger-kernel")  # installed here (pyproject's test dependencies)
    forbid = '[requires.forbidden]\nliger-kernel = ">=0.1"\n'
    p = write_profile(tmp_path / "a", forbid)
    assert main(["--profile", str(p), "--out", str(tmp_path / "k.toml")]) == 4
    err = capsys.readouterr().err
    assert f"library liger-kernel: expected not installed in >=0.1, found {installed}" in err
    assert "uninstall the forbidden library, or use another environment" in err
    p = write_profile(tmp_path / "b", forbid + '[strictness]\nwarn = ["forbidden"]\n')
    assert main(["--profile", str(p), "--out", str(tmp_path / "k.toml"), "--slot", "Linear"]) == 0
    assert "warning: profile mysite: library liger-kernel" in capsys.readouterr().err


def test_diff_sees_a_changed_profile_digest(tmp_path, capsys):
    record = {
        "name": "mysite",
        "digest": "sha256:" + "a" * 64,
        "matched": "explicit (--profile)",
        "source": "x",
    }
    a = lock_with_profile(tmp_path / "a.toml", record)
    b = lock_with_profile(tmp_path / "b.toml", {**record, "digest": "sha256:" + "b" * 64})
    code, out, _ = run_cli(["diff", a, b, "--exit-code"], capsys)
    assert code == 6 and "profile: profile mysite changed since the lock was written" in out
    code, out, _ = run_cli(["diff", a, b, "--json"], capsys)
    (found,) = json.loads(out)["probe"]
    assert found["what"] == "profile" and found["a"]["digest"] == record["digest"]
    assert found["b"] == {"name": "mysite", "digest": "sha256:" + "b" * 64}
    assert run_cli(["diff", a, a, "--exit-code"], capsys)[0] == 0


def test_the_stale_lock_message_names_a_changed_profile(tmp_path):
    p = tmp_path / "mysite.toml"
    p.write_text(GPU_PROFILE)
    prof = load_file(p)
    lock = lock_with_profile(
        tmp_path / "k.toml",
        {**prof.lock_record("explicit (--profile)"), "digest": "sha256:" + "0" * 64},
    )
    found, why = pipeline.reusable(lock, "inputs-2", (), prof)
    assert (
        found is None
        and "profile mysite changed since the lock was written" in why
        and str(p) in why
    )
    found, why = pipeline.reusable(lock, "inputs-2", (), None)
    assert "written under profile mysite and this run applies none" in why


def test_a_profile_help_line_is_shown_on_refusal(tmp_path, capsys):
    p = tmp_path / "mysite.toml"
    p.write_text(
        GPU_PROFILE.replace(
            'sources = ["tests"]', 'sources = ["tests"]\nhelp = "GPU jobs: srun -p gpu"'
        )
    )
    code, _, err = run_cli(["--profile", p, "--out", tmp_path / "k.toml"], capsys)
    assert code == 4 and "mysite: GPU jobs: srun -p gpu" in err
    code, result = match([p], capsys)
    assert (
        code == 4 and result["help"] == "GPU jobs: srun -p gpu" and "srun -p gpu" in result["fix"]
    )
    code, said = check(
        tmp_path, GPU_PROFILE.replace('sources = ["tests"]', 'help = "two\\nlines"'), capsys
    )
    assert code == 5 and "'help'" in said and "one line" in said
