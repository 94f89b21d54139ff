"""kernel_probe/commands/locks.py: ``kernel-probe lock --for inference IN OUT``, its arguments and
run_lock called directly. The derivation itself (which slot takes its twin, and why) is
kernel_probe/probe/derive.py's; the whole command through the CLI:
tests/kernel_lock/test_resolve_inference.py."""

from __future__ import annotations

import argparse
import json

import pytest

import kernel_lock
from kernel_lock.errors import ExitCode
from kernel_probe.commands.locks import add_lock_arguments, run_lock
from kernel_probe.errors import ProbeError, UsageError
from tests.conftest import edited_lock, write_sealed

# LayerNorm pinned to a library not installed here, with its verified torch.nn twin
SUBSTITUTED = edited_lock(
    **{
        'created-by = "hand"': 'created-by = "hand"\ntrusted-modules = ["kp_not_installed"]',
        'implementation = "torch.layer_norm"\ntarget = "torch.nn.LayerNorm"': (
            'implementation = "fast.layer_norm"\ntarget = "kp_not_installed.FastLayerNorm"\n'
            'requires = [{ name = "kp-not-installed", specifier = ">=1.0", module = '
            '"kp_not_installed" }]\n'
            'twin = { target = "torch.nn.LayerNorm", kwargs = { eps = 1e-6 }, state-dict = '
            '"interchangeable", '
            "max-error = 0.002 }"
        ),
    }
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_lock_arguments(p)
    p.add_argument("--json", action="store_true")  # the CLI's common flag
    return p


@pytest.mark.parametrize(
    "argv,parsed",
    [
        (
            ["--for", "inference", "in.toml", "out.toml"],
            ("inference", "in.toml", "out.toml", False, []),
        ),
        (
            [
                "in.toml",
                "out.toml",
                "--for",
                "inference",
                "--force",
                "--trust",
                "a",
                "--trust",
                "b",
            ],
            ("inference", "in.toml", "out.toml", True, ["a", "b"]),
        ),
    ],
)
def test_arguments(argv, parsed):
    args = parser().parse_args(argv)
    assert (args.purpose, args.source, args.out, args.force, args.trust) == parsed


@pytest.mark.parametrize(
    "argv",
    [
        ["in.toml", "out.toml"],
        ["--for", "training", "in.toml", "out.toml"],
        ["--for", "inference", "in.toml"],
    ],
)
def test_bad_arguments(argv, capsys):
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        parser().parse_args(argv)


def lock_args(src, out, *extra: str):
    return parser().parse_args(["--for", "inference", str(src), str(out), *extra])


def test_out_a_directory_is_a_usage_error(tmp_path, lock_file):
    with pytest.raises(UsageError) as exc:
        run_lock(lock_args(lock_file, tmp_path))
    assert exc.value.exit_code == ExitCode.USAGE and "is a directory" in exc.value.problem
    assert str(tmp_path / "kernel-lock.inference.toml") in exc.value.fix


def test_an_existing_out_is_kept_without_force(tmp_path, lock_file):
    out = tmp_path / "inference.toml"
    out.write_text("precious")
    with pytest.raises(ProbeError) as exc:
        run_lock(lock_args(lock_file, out))
    # issue 37: a usage error (exit 2), not the "bug" code 1
    assert exc.value.exit_code == ExitCode.USAGE and "not replacing it" in exc.value.problem
    assert "--force" in exc.value.fix and out.read_text() == "precious"


def test_every_slot_that_runs_here_is_kept(tmp_path, capsys):
    src = write_sealed(tmp_path / "train.toml")
    out = tmp_path / "inference.toml"
    assert run_lock(lock_args(src, out, "--json")) == 0
    summary = json.loads(capsys.readouterr().out)
    derived = kernel_lock.load(out, strict=True)
    source = kernel_lock.load(src)
    assert summary == {
        "source": str(src),
        "source-digest": source.digest,
        "out": str(out),
        "digest": derived.digest,
        "substitutions": [],
        "kept": ["LayerNorm", "Linear", "RMSNorm"],
    }
    assert derived.mode == "inference" and derived.slots == source.slots


def test_the_text_summary_names_each_slot_in_slot_order(tmp_path, capsys):
    src = write_sealed(tmp_path / "train.toml")
    out = tmp_path / "inference.toml"
    assert run_lock(lock_args(src, out)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"wrote {out}: inference lock derived from {src}"
    assert [line.strip() for line in lines[1:]] == [
        "LayerNorm: torch.layer_norm (runs here, kept)",
        "RMSNorm: torch.rms_norm (runs here, kept)",
        "Linear: torch.linear (runs here, kept)",
    ]


def test_a_substitution_is_recorded_in_full(tmp_path, capsys):
    src = write_sealed(tmp_path / "train.toml", SUBSTITUTED)
    out = tmp_path / "inference.toml"
    assert run_lock(lock_args(src, out, "--json", "--force")) == 0
    summary = json.loads(capsys.readouterr().out)
    [sub] = summary["substitutions"]
    assert {k: sub[k] for k in ("slot", "from", "from-target", "to", "max-error")} == {
        "slot": "LayerNorm",
        "from": "fast.layer_norm",
        "from-target": "kp_not_installed.FastLayerNorm",
        "to": "torch.nn.LayerNorm",
        "max-error": 0.002,
    }
    assert "kp-not-installed" in sub["reason"] and summary["kept"] == ["Linear", "RMSNorm"]
    assert run_lock(lock_args(src, tmp_path / "text.toml")) == 0
    text = capsys.readouterr().out
    assert "LayerNorm: fast.layer_norm -> torch.nn.LayerNorm (max error 0.002)" in text
    assert "LayerNorm: torch.layer_norm" not in text


@pytest.mark.parametrize(
    "provenance,derived_from",
    [
        ('[provenance]\nsource = "train.toml"\n', "derived from train.toml"),
        ("", "derived from an unrecorded lock"),
    ],
)
def test_an_inference_lock_is_not_derived_again(tmp_path, provenance, derived_from):
    text = (
        edited_lock(**{'created-by = "hand"': 'created-by = "hand"\nmode = "inference"'})
        + provenance
    )
    src = write_sealed(tmp_path / "inference.toml", text)
    out = tmp_path / "again.toml"
    with pytest.raises(UsageError) as exc:
        run_lock(lock_args(src, out))
    assert f"is already an inference lock ({derived_from})" in exc.value.problem
    assert exc.value.fix == "derive from the training lock itself" and not out.exists()
