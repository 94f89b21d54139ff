"""kernel-probe profiles: list, show, check, match; the CLI's consistency and its messages, and the
docs' worked example."""

from __future__ import annotations

import re

import pytest

from kernel_lock import toml
from kernel_probe import sites
from kernel_probe.cli import main
from tests.conftest import run_cli
from tests.kernel_probe.profiles.cases import BUILTIN, GPU_PROFILE, ROOT, match


def test_profile_check_missing_file(tmp_path, capsys):
    assert main(["profiles", "check", str(tmp_path / "nope.toml")]) == 5
    assert "no such file" in capsys.readouterr().err


# ---- 7. CLI consistency --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "action", [["list"], ["show", "mysite"], ["match", "mysite", "--node", "cpu"]]
)
@pytest.mark.parametrize("where", ["before", "after"])
def test_profiles_dir_before_or_after_the_action(action, where, tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    (d / "mysite.toml").write_text(GPU_PROFILE)
    flag = ["--profiles-dir", d]
    argv = ["profiles", *flag, *action] if where == "before" else ["profiles", *action, *flag]
    code, out, err = run_cli(argv, capsys)
    assert code in (0, 4) and "mysite" in out + err and "unknown profile" not in err


def test_usage_names_every_action(capsys):
    code, out, err = run_cli(["profiles", "--help"], capsys)
    assert code == 0 and "{list,show,check,match}" in out
    code, out, err = run_cli(["--help"], capsys)
    assert "match [NAME] [--node FILE]" in out


# ---- 8. messages and fix texts -------------------------------------------------------------------
def test_a_forbidden_library_fix_says_uninstall(tmp_path, capsys):
    p = tmp_path / "mysite.toml"
    p.write_text(
        GPU_PROFILE.replace('["cuda"]', '["cpu"]') + '[requires.forbidden]\nliger-kernel = ""\n'
    )
    code, _, err = run_cli(["--profile", p, "--out", tmp_path / "k.toml"], capsys)
    assert code == 4 and "uninstall the forbidden library, or use another environment" in err
    assert "run on a node of that site" not in err


def test_a_refused_user_is_told_what_to_do_not_how_to_edit_the_profile(tmp_path, capsys):
    code, _, err = run_cli(["--profile", "lumi-g", "--out", tmp_path / "k.toml"], capsys)
    assert code == 4 and "strictness" not in err
    assert "run on one of the site's GPU nodes" in err and "standard-g" in err  # lumi-g's help line


@pytest.mark.parametrize("name", BUILTIN)
def test_show_renders_the_profile_as_toml_with_its_strictness(name, capsys):
    code, out, _ = run_cli(["profiles", "show", name], capsys)
    assert code == 0 and "{'" not in out  # no Python dicts
    shown = toml.loads(out)
    written = toml.loads((sites.builtin_dir() / f"{name}.toml").read_text())
    assert shown["strictness"] == {"default": "error", "warn": []}
    written.setdefault("strictness", {}).setdefault("default", "error")
    written["strictness"].setdefault("warn", [])
    assert shown == written


def test_match_name_does_not_claim_a_flag(capsys):
    code, out, _ = run_cli(["profiles", "match", "cpu"], capsys)
    assert "explicit (--profile)" not in out and "named (profiles match NAME)" in out


def test_the_mn5_claim_in_the_docs_is_true(capsys):
    doc = (ROOT / "docs" / "profiles.md").read_text()
    assert "a GPP node (BSC_MACHINE=mn5, no GPU) gets the cpu profile" in doc
    code, result = match(["auto", "--node", "marenostrum5-gpp"], capsys)
    assert result["profile"] == "cpu"


# ---- the worked example of docs/profiles.md ------------------------------------------------------
def test_the_worked_example_in_the_docs_checks_and_matches(tmp_path, capsys):
    doc = (ROOT / "docs" / "profiles.md").read_text()
    block = re.search(r"<!-- worked-example -->\s*```toml\n(.*?)```", doc, re.S)
    assert block, "docs/profiles.md has the worked example"
    p = tmp_path / "isambard-ai.toml"
    p.write_text(block.group(1))
    assert run_cli(["profiles", "check", p], capsys)[0] == 0
    code, result = match(["auto", "--profiles-dir", tmp_path, "--node", "isambard-ai"], capsys)
    assert (
        code == 0
        and result["profile"] == "isambard-ai"
        and result["matched"] == "slurm-cluster:isambard-ai"
    )
    code, result = match(["auto", "--profiles-dir", tmp_path, "--node", "alps-gh200"], capsys)
    assert result["profile"] == "alps-gh200"  # same hardware, another site
    code, result = match(["isambard-ai", "--profiles-dir", tmp_path, "--node", "lumi-g"], capsys)
    assert code == 4
