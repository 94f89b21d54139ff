"""Finding profiles (kernel_probe.sites): the built-in site profiles are data read on
first use.

Importing the command line, the probe and every profiles module parses nothing (a job start that
names no profile never pays for them); the first ``survey`` reads each built-in once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kernel_probe import sites
from kernel_probe.cli import main
from tests.conftest import run_cli
from tests.kernel_probe.profiles.cases import (
    BUILTIN,
    CPU_PROFILE,
    GPU_PROFILE,
    check,
    match,
)

# In a fresh interpreter: every file opened under the built-in profiles directory, at import and on
# use.
_CODE = r"""
import json, os, sys
opened = []
def seen(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        opened.append(os.fsdecode(args[0]))
sys.addaudithook(seen)
import kernel_probe.cli, kernel_probe.probe.pipeline, kernel_probe.commands.profiles
from kernel_probe import profile_match, profiles, sites
from kernel_probe.cli import SUBCOMMANDS, build_subparser
for name in SUBCOMMANDS:
    build_subparser(name)  # every subcommand's flags and help texts, as `--help` builds them
builtin = str(sites.builtin_dir())
at_import = sorted(p for p in opened if p.startswith(builtin))
found = sites.survey().profiles
on_use = sorted({p for p in opened if p.startswith(builtin)})
print(json.dumps({"at_import": at_import, "on_use": on_use, "found": sorted(found)}))
"""


def test_the_builtin_profiles_are_read_on_first_use_not_at_import():
    env = {k: v for k, v in os.environ.items() if k != sites.ENV_VAR}
    proc = subprocess.run(
        [sys.executable, "-c", _CODE], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["at_import"] == [], "importing kernel-probe read built-in profiles"
    shipped = sorted(str(p) for p in sites.builtin_dir().glob("*.toml"))
    assert seen["on_use"] == shipped  # the hook sees the reads it is there to catch
    assert seen["found"] == sorted(os.path.basename(p)[: -len(".toml")] for p in shipped)


def test_a_survey_is_read_when_called(tmp_path, monkeypatch):
    """A profile written after import is found: nothing is cached at import time."""
    monkeypatch.delenv(sites.ENV_VAR, raising=False)
    assert "mine" not in sites.survey([str(tmp_path)]).profiles
    text = (sites.builtin_dir() / "cpu.toml").read_text().replace('name = "cpu"', 'name = "mine"')
    (tmp_path / "mine.toml").write_text(text)
    assert sites.survey([str(tmp_path)]).profiles["mine"].path == str(tmp_path / "mine.toml")


def test_the_required_sites_are_shipped():
    assert {
        "lumi-g",
        "leonardo-booster",
        "juwels-booster",
        "marenostrum5-acc",
        "alps-gh200",
        "perlmutter",
        "frontier",
        "cpu",
    } <= set(BUILTIN)


def test_profiles_env_var_and_shadowing(tmp_path, monkeypatch, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "cpu.toml").write_text(
        CPU_PROFILE.replace('"mysite"', '"cpu"').replace('"test site"', '"my own cpu profile"')
    )
    monkeypatch.setenv(sites.ENV_VAR, str(d))
    assert sites.resolve("cpu").description == "my own cpu profile"
    assert main(["profiles", "list", "--json"]) == 0
    names = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert names["cpu"]["description"] == "my own cpu profile" and "lumi-g" in names


def test_unknown_profile_name(tmp_path, capsys):
    assert main(["--profile", "lumi", "--out", str(tmp_path / "k.toml")]) == 2
    assert "unknown profile 'lumi'" in capsys.readouterr().err


def test_one_broken_profile_does_not_hide_the_others(tmp_path, capsys, monkeypatch):
    (tmp_path / "broken.toml").write_text("profile-version = = 1\n")
    monkeypatch.setenv("KERNEL_PROBE_PROFILES", str(tmp_path))
    code, out, err = run_cli(["profiles", "show", "cpu"], capsys)
    assert code == 0 and "cpu" in out
    code, out, err = run_cli(["profiles", "list"], capsys)
    assert code == 0 and "broken profile" in err and "broken.toml" in err
    assert run_cli(["--profile", "broken", "--out", tmp_path / "k.toml"], capsys)[0] == 5


# ---- 4. duplicates, shadowing, files that are not profiles ---------------------------------------
def test_duplicates_shadowing_and_non_profiles_are_said(tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    (d / "a.toml").write_text(GPU_PROFILE.replace('"mysite"', '"dup"'))
    (d / "b.toml").write_text(
        GPU_PROFILE.replace('"mysite"', '"dup"').replace('"test site"', '"second"')
    )
    (d / "cpu.toml").write_text(GPU_PROFILE.replace('"mysite"', '"cpu"'))
    (d / "kernel-lock.toml").write_text('lock-version = "1"\n[environment]\n')
    (d / "notes.toml").write_text("[[[")  # not TOML, and no profile-version line: not a profile
    code, out, err = run_cli(["profiles", "list", "--profiles-dir", d], capsys)
    assert code == 0
    assert "two profiles named 'dup'" in err and "a.toml is used, b.toml is ignored" in err
    assert "shadows the built-in profile 'cpu'" in err
    assert "a.toml declares name 'dup'" in err  # named unlike its file
    skipped = [line for line in err.splitlines() if "not profiles" in line]
    assert len(skipped) == 1 and "kernel-lock.toml" in skipped[0] and "notes.toml" in skipped[0]
    assert "broken" not in err
    code, result = match(["cpu", "--profiles-dir", d, "--node", "cpu"], capsys)
    assert any("shadows the built-in profile 'cpu'" in n for n in result["notes"])


def test_check_says_when_a_file_is_named_unlike_its_profile(tmp_path, capsys):
    code, said = check(tmp_path, GPU_PROFILE, capsys, name="other")
    assert code == 0 and "declares name 'mysite'" in said


def test_a_broken_file_that_declares_a_profile_is_still_reported(tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    (d / "mine.toml").write_text('profile-version = "1"\nname = [\n')
    code, out, err = run_cli(["profiles", "list", "--profiles-dir", d], capsys)
    assert code == 0 and "broken profile, skipped" in err and "mine.toml" in err
