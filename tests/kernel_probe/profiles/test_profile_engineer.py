"""Site profiles as a site engineer writes, tests from a login node and trusts them (issue 30), and
profile signals read safely (issue 24, point 6).

Sections follow the issue's numbered points; node descriptions are the shipped examples
(``kernel_probe/profiles/sites/nodes/*.json``), so everything here runs without a GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kernel_lock import _toml
from kernel_lock.fingerprint import with_torch
from kernel_lock.lock import KernelLock
from kernel_lock.schema import Slot
from kernel_probe.probe import pipeline
from kernel_probe.probe import write as lockwrite
from kernel_probe.profiles import autodetect, discovery, nodes, requirements, signals
from kernel_probe.profiles.format import Profile, load_file, parse
from tests.conftest import run_cli
from tests.kernel_probe.profiles.test_profiles import GOOD as CPU_PROFILE

ROOT = Path(__file__).resolve().parents[3]
BUILTIN = sorted(p.stem for p in discovery.builtin_dir().glob("*.toml"))

GOOD = CPU_PROFILE.replace('device-type = ["cpu"]', 'device-type = ["cuda"]')  # a GPU site's profile


def check(tmp_path: Path, text: str, capsys, name: str = "mysite") -> tuple[int, str]:
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    code, out, err = run_cli(["profiles", "check", p], capsys)
    return code, out + err


def match(argv: list, capsys) -> tuple[int, dict]:
    code, out, err = run_cli(["profiles", "match", *argv, "--json"], capsys)
    return code, json.loads(out) if out.strip() else {"stderr": err}


# ---- 1. closed-set values, one GPU-arch syntax ------------------------------------------------------
BAD_VALUES = [
    ('device-type = ["CPU"]', "requires.device-type", "did you mean 'cpu'"),
    ('device-type = ["gpu"]', "requires.device-type", "accepted: cuda, rocm, xpu, mps, cpu"),
    ('arch = ["amd64"]', "requires.arch", "did you mean 'x86_64'"),
    ('arch = ["arm64"]', "requires.arch", "did you mean 'aarch64'"),
    ('device-vendor = ["NVIDIA"]', "requires.device-vendor", "did you mean 'nvidia'"),
    ('device-arch = ["9.0"]', "requires.device-arch", "is written 'sm_90'"),
    ('device-arch = ["gfx90a+"]', "requires.device-arch", "gfx archs match exactly"),
    ('device-arch = ["gfx90a"]', "requires.device-arch", "is a rocm arch, not a cuda one"),
]


@pytest.mark.parametrize("line,key,words", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_closed_set_values_are_refused_naming_the_accepted_spellings(line, key, words, tmp_path, capsys):
    text = GOOD.replace('device-type = ["cuda"]', line) if line.startswith("device-type") else GOOD + line + "\n"
    code, said = check(tmp_path, text, capsys)
    assert code == 5 and f"'{key}'" in said and words in said, said


def test_candidate_archs_use_the_same_syntax(tmp_path, capsys):
    cand = '[[candidate]]\nid = "site.x"\nslots = ["LayerNorm"]\ntarget = "a.B"\narchs = { rocm = ["%s"] }\n'
    code, said = check(tmp_path, GOOD + cand % "gfx90a+", capsys)
    assert code == 5 and "'candidate[0].archs.rocm'" in said and "gfx archs match exactly" in said
    code, said = check(tmp_path, GOOD + cand % "sm_90", capsys)
    assert code == 5 and "is a cuda arch, not a rocm one" in said
    assert check(tmp_path, GOOD + cand % "gfx942", capsys)[0] == 0


def test_sm_plus_in_requires_means_that_or_newer(tmp_path, capsys):
    p = tmp_path / "hopper.toml"
    p.write_text(GOOD.replace('"mysite"', '"hopper"') + 'device-arch = ["sm_80+"]\n')
    code, result = match([p, "--node", "alps-gh200"], capsys)  # sm_90, at another site (alps-gh200)
    assert code == 4 and [u["group"] for u in result["unmet"]] == ["site"], result["unmet"]
    p.write_text(GOOD.replace('"mysite"', '"hopper"') + 'device-arch = ["sm_100+"]\n')
    code, result = match([p, "--node", "alps-gh200"], capsys)
    assert (
        code == 4
        and {"group": "device", "field": "device-arch", "expected": "sm_100+", "found": "sm_90"} in (result["unmet"])
    )


# ---- 2. contradictions -------------------------------------------------------------------------------
CONTRADICTIONS = [
    ('[requires.libraries]\napex = ""\n[requires.forbidden]\napex = ""\n', "requires.forbidden.apex"),
    (
        '[requires.libraries]\n"transformer-engine@rocm-fork" = ""\n[requires.forbidden]\ntransformer-engine = ""\n',
        "requires.forbidden.transformer-engine",
    ),
    ('[requires.libraries]\napex = ">=0.1"\n[requires.forbidden]\napex = ">=0.1"\n', "requires.forbidden.apex"),
]


@pytest.mark.parametrize("extra,key", CONTRADICTIONS)
def test_a_library_required_and_forbidden_is_refused(extra, key, tmp_path, capsys):
    code, said = check(tmp_path, GOOD + extra, capsys)
    assert code == 5 and f"'{key}'" in said and "no node can meet this profile" in said, said


def test_forbidding_one_variant_while_requiring_the_library_is_fine(tmp_path, capsys):
    extra = '[requires.libraries]\ntransformer-engine = ""\n[requires.forbidden]\n"transformer-engine@nvidia" = ""\n'
    assert check(tmp_path, GOOD.replace('["cuda"]', '["rocm"]') + extra, capsys)[0] == 0


def test_device_contradictions_are_refused(tmp_path, capsys):
    code, said = check(tmp_path, GOOD + 'device-vendor = ["amd"]\n', capsys)
    assert code == 5 and "contradicts requires.device-type" in said
    code, said = check(tmp_path, GOOD.replace('["cuda"]', '["cpu"]') + "min-device-count = 1\n", capsys)
    assert code == 5 and "allows only cpu" in said


# ---- 3. library names: the registry's, or declared as the site's --------------------------------------
def test_a_misspelt_forbidden_library_is_an_error(tmp_path, capsys):
    code, said = check(tmp_path, GOOD + '[requires.forbidden]\napexx = ""\n', capsys)
    assert code == 5 and "'requires.forbidden.apexx'" in said and "forbid nothing" in said
    assert "did you mean 'apex'" in said and "site-libraries" in said


def test_site_libraries_and_candidate_distributions_are_known(tmp_path, capsys):
    site = GOOD + 'site-libraries = ["bsc-kernels"]\n[requires.libraries]\nbsc-kernels = ">=1"\n'
    assert check(tmp_path, site, capsys)[0] == 0
    cand = (
        GOOD + '[requires.libraries]\nsite-norms = ""\n'
        '[[candidate]]\nid = "site.ln"\nslots = ["LayerNorm"]\ntarget = "site_norms.LN"\ndistribution = "site-norms"\n'
    )
    assert check(tmp_path, cand, capsys)[0] == 0
    for dist in ("transformer-engine-cu12", "liger-kernel-nightly", "pytorch-triton-rocm"):  # distribution names
        assert check(tmp_path, GOOD + f'[requires.forbidden]\n"{dist}" = ""\n', capsys)[0] == 0


# ---- 4. duplicates, shadowing, files that are not profiles -----------------------------------------
def test_duplicates_shadowing_and_non_profiles_are_said(tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    (d / "a.toml").write_text(GOOD.replace('"mysite"', '"dup"'))
    (d / "b.toml").write_text(GOOD.replace('"mysite"', '"dup"').replace('"test site"', '"second"'))
    (d / "cpu.toml").write_text(GOOD.replace('"mysite"', '"cpu"'))
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
    code, said = check(tmp_path, GOOD, capsys, name="other")
    assert code == 0 and "declares name 'mysite'" in said


def test_a_broken_file_that_declares_a_profile_is_still_reported(tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    (d / "mine.toml").write_text('profile-version = "1"\nname = [\n')
    code, out, err = run_cli(["profiles", "list", "--profiles-dir", d], capsys)
    assert code == 0 and "broken profile, skipped" in err and "mine.toml" in err


# ---- 5. weak signals never decide alone ----------------------------------------------------------
def _described(tmp_path: Path, base: str, **changes) -> Path:
    data = json.loads((nodes.examples_dir() / f"{base}.json").read_text())
    for key, value in changes.items():
        data[key] = value
    p = tmp_path / f"{base}-changed.json"
    p.write_text(json.dumps(data))
    return p


def test_a_lumi_g_host_name_on_another_cray_is_not_lumi(tmp_path, capsys):
    # an Isambard-AI (or any HPE Cray EX) node named within LUMI-G's nid range
    node = _described(tmp_path, "isambard-ai", site={"hostname": "nid005123", "slurm": {"SLURM_JOB_PARTITION": "gpu"}})
    code, result = match(["auto", "--node", node], capsys)
    assert code == 0 and result["profile"] is None
    said = "lumi-g: hostname:nid005123 matched, but not slurm-partition: a weak signal never decides alone"
    assert any(said in n for n in result["notes"]), result["notes"]


def test_weak_only_detection_is_warned_and_undecidable_groups_refused(tmp_path, capsys):
    weak = GOOD.replace('env = { MYSITE = "" }', 'hostname = ["^nid00[0-9]{4}$"]')
    code, said = check(tmp_path, weak, capsys)
    assert code == 0 and "only weak signals (hostname)" in said and "never picks this profile" in said
    group = GOOD + '[[detect.all]]\nhostname = ["^nid"]\ndevice = { type = "cuda" }\n'
    code, said = check(tmp_path, group, capsys)
    assert code == 5 and "'detect.all[0]'" in said and "can never decide" in said
    beside = GOOD.replace('env = { MYSITE = "" }', 'env = { MYSITE = "" }\ndevice = { type = "cuda" }')
    code, said = check(tmp_path, beside, capsys)
    assert code == 5 and "'detect.device'" in said and "[[detect.all]]" in said


def test_a_device_signal_takes_the_arch_syntax(tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    group = '[[detect.all]]\nenv = { KP_SITE = "^x$" }\ndevice = { type = "cuda", arch = "sm_90+" }\n'
    (d / "hopper.toml").write_text(GOOD.replace('"mysite"', '"hopper"').replace('env = { MYSITE = "" }', group))
    hopper = _described(tmp_path, "alps-gh200", env={"KP_SITE": "x"})  # sm_90, and no CLUSTER_NAME
    code, result = match(["auto", "--profiles-dir", d, "--node", hopper], capsys)
    assert result["profile"] == "hopper" and result["matched"] == "env:KP_SITE=x + device:type=cuda,arch=sm_90+"
    ampere = _described(tmp_path, "juwels-booster", env={"KP_SITE": "x"})  # sm_80
    code, result = match(["auto", "--profiles-dir", d, "--node", ampere], capsys)
    assert result["profile"] == "juwels-booster"
    assert any("hopper: env:KP_SITE=x matched, but not device:type=cuda,arch=sm_90+" in n for n in result["notes"])


def test_a_group_of_both_weak_kinds_decides_below_a_strong_signal():
    def prof(name: str, detect: str) -> Profile:
        return parse(GOOD.replace('"mysite"', f'"{name}"').replace('env = { MYSITE = "" }', detect), name)

    group = prof("grouped", '[[detect.all]]\nhostname = ["^nid"]\nslurm-partition = ["^gpu$"]')
    strong = prof("strong", 'slurm-cluster = ["^c1$"]')
    facts = autodetect.SiteFacts({"SLURM_JOB_PARTITION": "gpu", "SLURM_CLUSTER_NAME": "c1"}, "nid1", {}, {}, dict().get)
    chosen, matched, notes = autodetect.auto_detect([group, strong], facts)
    assert chosen is strong and "grouped also matched (slurm-partition:gpu + hostname:nid1), more weakly" in notes


# ---- the built-ins against the shipped example nodes ---------------------------------------------
def test_every_builtin_has_an_example_node():
    assert set(BUILTIN) <= set(nodes.examples())


@pytest.mark.parametrize("name", BUILTIN)
def test_each_example_node_meets_its_own_profile_and_picks_only_it(name, capsys):
    code, result = match(["auto", "--node", name], capsys)
    assert code == 0 and result["profile"] == name and result["unmet"] == [], result
    code, result = match([name, "--node", name], capsys)
    assert code == 0 and result["unmet"] == [] and result["matched"] == "named (profiles match NAME)"
    assert not any("site signals" in n for n in result["notes"])


PAIRS = [(p, n) for p in BUILTIN for n in BUILTIN if p != n]
# Sites with the same hardware can have the same requirements: a JUWELS node does meet Perlmutter's
# (A100, x86_64, CUDA), a LUMI-G node Frontier's (MI250X; Frontier's ROCm floor is lower). What tells
# them apart is the site's signals: a node they place at another site is refused all the same.
SAME_HARDWARE = {
    frozenset(pair)
    for pair in [
        ("juwels-booster", "perlmutter"),
        ("juwels-booster", "leonardo-booster"),
        ("leonardo-booster", "perlmutter"),
        ("frontier", "lumi-g"),
    ]
}


@pytest.mark.parametrize("profile,node", PAIRS, ids=[f"{p}@{n}" for p, n in PAIRS])
def test_no_builtin_is_taken_for_another_sites_node(profile, node, capsys):
    code, result = match([profile, "--node", node], capsys)
    assert any(f"point to profile {node}, not {profile}" in n for n in result["notes"]), result["notes"]
    assert code == 4, result
    site = [u for u in result["unmet"] if u["group"] == "site"]
    hardware = [u for u in result["unmet"] if u["group"] != "site"]
    if node == "cpu":  # the cpu profile is picked by device facts, not site signals: its hardware refuses it
        assert hardware and not site, result["unmet"]
    else:
        assert site and site[0]["found"].startswith(f"{node} ("), result["unmet"]
    if frozenset((profile, node)) not in SAME_HARDWARE:
        assert hardware, result["unmet"]


@pytest.mark.parametrize(
    "profile,node",
    [("perlmutter", "juwels-booster"), ("leonardo-booster", "juwels-booster"), ("frontier", "lumi-g")],
)
def test_the_same_hardware_at_another_site_is_refused_by_the_site_signals_alone(profile, node, capsys):
    code, result = match([profile, "--node", node], capsys)
    assert code == 4 and [u["group"] for u in result["unmet"]] == ["site"], result["unmet"]
    assert f"--profile {node}" in result["fix"]


def test_job_start_refuses_a_named_profile_where_the_site_signals_place_the_node_elsewhere(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("LUMI_STACK_PARTITION", "G")  # LUMI's own stack variable: a strong signal
    code, _, err = run_cli(["--check", "--profile", "frontier", "--out", tmp_path / "k.toml"], capsys)
    assert code == 4 and "a node of profile 'lumi-g' by its site signals" in err and "--profile lumi-g" in err, err
    assert not (tmp_path / "k.toml").exists()


def test_a_named_profile_is_refused_at_job_start_on_another_sites_node(monkeypatch):
    """What match says is what --profile NAME decides at job start: a LUMI-G node (its LUMI_STACK_PARTITION
    signal) meets Frontier's requirements, and is refused for Frontier all the same; auto picks lumi-g."""
    from kernel_probe.errors import ProfileUnmet

    lumi = discovery.resolve("lumi-g", [])
    frontier = discovery.resolve("frontier", [])
    requirements.other_site(lumi, lumi, "env:LUMI_STACK_PARTITION=G")  # its own site: nothing raised
    requirements.other_site(frontier, None, "")  # no site's signals: a named profile is how such a site is used
    with pytest.raises(ProfileUnmet) as exc:
        requirements.other_site(frontier, lumi, "env:LUMI_STACK_PARTITION=G")
    assert exc.value.exit_code == 4 and "lumi-g" in str(exc.value) and "--profile lumi-g" in exc.value.fix


def test_mn5_gpp_is_not_taken_for_acc(capsys):
    code, result = match(["auto", "--node", "marenostrum5-gpp"], capsys)
    assert code == 0 and result["profile"] == "cpu"
    assert (
        "marenostrum5-acc: env:BSC_MACHINE=mn5 matched, but not device:type=cuda: not one of its nodes"
        in (result["notes"])
    )


def test_an_env_report_from_a_real_node_is_a_description(tmp_path, capsys):
    code, out, _ = run_cli(["env", "--json", "--no-import-checks"], capsys)
    assert code == 0
    (tmp_path / "here.json").write_text(out)
    code, result = match(["cpu", "--node", tmp_path / "here.json"], capsys)
    assert code == 0 and result["profile"] == "cpu"
    code, result = match(["lumi-g", "--node", tmp_path / "here.json"], capsys)
    assert code == 4 and any(u["field"] == "device-type" for u in result["unmet"])


@pytest.mark.parametrize(
    "doc,key",
    [
        ({"schema": "x"}, "schema"),
        ({"schema": "kernel-probe-node/1"}, "fingerprint"),
        ({"schema": "kernel-probe-node/1", "fingerprint": {"device-type": "gpu"}}, "fingerprint.device-type"),
        ({"schema": "kernel-probe-node/1", "fingerprint": {"device_type": "cuda"}}, "fingerprint.device_type"),
        ({"schema": "kernel-probe-node/1", "fingerprint": {"device-count": "4"}}, "fingerprint.device-count"),
        ({"schema": "kernel-probe-node/1", "fingerprint": {}, "colour": 1}, "colour"),
    ],
)
def test_a_malformed_node_description_exits_5(doc, key, tmp_path, capsys):
    p = tmp_path / "n.json"
    p.write_text(json.dumps(doc))
    code, out, err = run_cli(["profiles", "match", "cpu", "--node", p], capsys)
    assert code == 5 and f"'{key}'" in err and str(p) in err


def test_a_described_nodes_libraries_count_as_installed(capsys):
    code, result = match(["frontier", "--node", "alps-gh200"], capsys)
    forbidden = [u for u in result["unmet"] if u["group"] == "forbidden"]
    assert forbidden == [
        {
            "group": "forbidden",
            "field": "library transformer-engine@nvidia",
            "expected": "not installed",
            "found": "2.11.0",
        }
    ]


# ---- 6. the profile is part of the lock's identity ------------------------------------------------
def _lock(path: Path, profile: dict, inputs: str = "inputs-1") -> Path:
    env = lockwrite.environment(with_torch.current(), {})
    slot = Slot(
        name="LayerNorm",
        implementation="torch.layer_norm",
        target="torch.nn.LayerNorm",
        semantics="layer_norm",
        kwargs={"eps": 1e-5},
    )
    lock = KernelLock(
        created_by="test", environment=env, slots={"LayerNorm": slot}, profile=profile, provenance={"inputs": inputs}
    )
    lock.sealed().dump(path)
    return path


def test_diff_sees_a_changed_profile_digest(tmp_path, capsys):
    record = {"name": "mysite", "digest": "sha256:" + "a" * 64, "matched": "explicit (--profile)", "source": "x"}
    a = _lock(tmp_path / "a.toml", record)
    b = _lock(tmp_path / "b.toml", {**record, "digest": "sha256:" + "b" * 64})
    code, out, _ = run_cli(["diff", a, b, "--exit-code"], capsys)
    assert code == 6 and "profile-digest: 'sha256:aaaa" in out
    code, out, _ = run_cli(["diff", a, b, "--json"], capsys)
    assert json.loads(out)["lock"] == [{"key": "profile-digest", "a": record["digest"], "b": "sha256:" + "b" * 64}]
    assert run_cli(["diff", a, a, "--exit-code"], capsys)[0] == 0


def test_the_stale_lock_message_names_a_changed_profile(tmp_path):
    p = tmp_path / "mysite.toml"
    p.write_text(GOOD)
    prof = load_file(p)
    lock = _lock(tmp_path / "k.toml", {**prof.lock_record("explicit (--profile)"), "digest": "sha256:" + "0" * 64})
    found, why = pipeline.reusable(lock, "inputs-2", (), prof)
    assert found is None and "profile mysite changed since the lock was written" in why and str(p) in why
    found, why = pipeline.reusable(lock, "inputs-2", (), None)
    assert "written under profile mysite and this run applies none" in why


def test_a_profile_help_line_is_shown_on_refusal(tmp_path, capsys):
    p = tmp_path / "mysite.toml"
    p.write_text(GOOD.replace('sources = ["tests"]', 'sources = ["tests"]\nhelp = "GPU jobs: srun -p gpu"'))
    code, _, err = run_cli(["--profile", p, "--out", tmp_path / "k.toml"], capsys)
    assert code == 4 and "mysite: GPU jobs: srun -p gpu" in err
    code, result = match([p], capsys)
    assert code == 4 and result["help"] == "GPU jobs: srun -p gpu" and "srun -p gpu" in result["fix"]
    code, said = check(tmp_path, GOOD.replace('sources = ["tests"]', 'help = "two\\nlines"'), capsys)
    assert code == 5 and "'help'" in said and "one line" in said


# ---- 7. CLI consistency ---------------------------------------------------------------------------
@pytest.mark.parametrize("action", [["list"], ["show", "mysite"], ["match", "mysite", "--node", "cpu"]])
@pytest.mark.parametrize("where", ["before", "after"])
def test_profiles_dir_before_or_after_the_action(action, where, tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    (d / "mysite.toml").write_text(GOOD)
    flag = ["--profiles-dir", d]
    argv = ["profiles", *flag, *action] if where == "before" else ["profiles", *action, *flag]
    code, out, err = run_cli(argv, capsys)
    assert code in (0, 4) and "mysite" in out + err and "unknown profile" not in err


def test_usage_names_every_action(capsys):
    code, out, err = run_cli(["profiles", "--help"], capsys)
    assert code == 0 and "{list,show,check,match}" in out
    code, out, err = run_cli(["--help"], capsys)
    assert "match [NAME] [--node FILE]" in out


# ---- 8. messages and fix texts --------------------------------------------------------------------
def test_a_forbidden_library_fix_says_uninstall(tmp_path, capsys):
    p = tmp_path / "mysite.toml"
    p.write_text(GOOD.replace('["cuda"]', '["cpu"]') + '[requires.forbidden]\nliger-kernel = ""\n')
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
    shown = _toml.loads(out)
    written = _toml.loads((discovery.builtin_dir() / f"{name}.toml").read_text())
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


# ---- issue 24 point 6: profile signals read safely ---------------------------------------------------
def _files_profile(d: Path, path: str) -> Path:
    d.mkdir(exist_ok=True)
    p = d / "fileprof.toml"
    p.write_text(
        GOOD.replace('"mysite"', '"fileprof"').replace('env = { MYSITE = "" }', f'files = {{ "{path}" = "" }}')
    )
    return d


def _run(argv: list, env_dir: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, discovery.ENV_VAR: str(env_dir)}
    return subprocess.run(
        [sys.executable, "-m", "kernel_probe", *map(str, argv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.slow  # two CLI runs in child processes per case (each imports torch)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "directory"])
def test_a_detect_file_that_is_not_a_small_regular_file_is_never_read(kind, tmp_path, request):
    target = {
        "fifo": lambda: request.getfixturevalue("fifo"),
        "dev-zero": lambda: Path("/dev/zero"),
        "huge": lambda: _sparse(tmp_path / "huge", 1 << 34),  # 16 GiB, sparse: no disk used
        "directory": lambda: tmp_path,
    }[kind]()
    d = _files_profile(tmp_path / "p", str(target))
    start = time.monotonic()
    done = _run(["profiles", "match", "auto", "--json"], d)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["profile"] == "cpu"  # fileprof did not match
    assert any(f"detect file {target}:" in n and "not read" in n for n in result["notes"]), result["notes"]
    done = _run(["--check", "--profile", "auto", "--out", tmp_path / "k.toml"], d)
    assert done.returncode == 3 and "stale or missing" in done.stderr, done.stderr  # no lock: and no hang
    assert "Traceback" not in done.stderr and time.monotonic() - start < 240


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def test_a_marker_file_is_read_like_every_input(tmp_path, fifo):
    import threading

    from kernel_probe.detect.site import read_marker

    (tmp_path / "m").write_text("juwelsbooster\nsecond line\n")
    assert read_marker(str(tmp_path / "m")) == ("juwelsbooster", "")
    assert read_marker(str(tmp_path / "absent")) == (None, "")
    value, problem = read_marker("/dev/zero")
    assert value is None and "character device" in problem
    big = _sparse(tmp_path / "big", 1 << 34)
    value, problem = read_marker(str(big))
    assert value is None and f"{1 << 34} bytes, more than the" in problem
    said: list = []  # a FIFO without a writer: a blocking open would never return
    reader = threading.Thread(target=lambda: said.append(read_marker(str(fifo))), daemon=True)
    reader.start()
    reader.join(10)
    assert said and said[0][0] is None and "FIFO" in said[0][1]


CATASTROPHIC = ["^(a|aa)+$", "(a+)+b", "^(a*)*$", r"(\w+\s?)+$", r"(x+x+)+y", r"^(.*)\1$", "a*a*a*b", ".*.*.*x"]
PLAIN = [
    "^G$",
    "",
    "^(standard-g|small-g|dev-g)$",
    "^nid00(5[0-9]{3}|6[0-9]{3}|7[0-8][0-9]{2}|79[0-6][0-9]|797[0-7])$",
    r"^login[0-9]+\.frontier\.olcf\.ornl\.gov$",
    r"^jwb[0-9]{4}(\.juwels)?$",
    "^(a|b)+$",  # one character class to re: no backtracking
    "^boost_",
]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_catastrophic_patterns_are_refused_at_check(pattern, tmp_path, capsys):
    text = GOOD.replace('MYSITE = ""', f"KP_SITE = '{pattern}'")
    code, said = check(tmp_path, text, capsys)
    assert code == 5 and "'detect.env.KP_SITE'" in said and "exponential time" in said, said


@pytest.mark.parametrize("pattern", PLAIN)
def test_plain_patterns_pass(pattern):
    assert signals.pattern_problem(pattern) is None


def test_every_builtin_pattern_is_plain():
    for name in BUILTIN:
        prof = discovery.resolve(name, [])
        for table in (prof.detect, *prof.detect_all):
            for key in ("env", "files"):
                for pattern in table.get(key, {}).values():
                    assert signals.pattern_problem(pattern) is None, (name, pattern)
            for key in ("hostname", "slurm-cluster", "slurm-partition"):
                for pattern in table.get(key, []):
                    assert signals.pattern_problem(pattern) is None, (name, pattern)


def test_a_long_value_is_not_matched_and_the_match_is_bounded(tmp_path):
    # the worst pattern check lets through, on the longest value matched: milliseconds, not hours
    prof = parse(GOOD.replace('MYSITE = ""', "KP_SITE = '^[a-z]*[a-z]*!$'"), "x.toml")
    value = "a" * signals.MAX_SIGNAL_CHARS
    facts = autodetect.SiteFacts({"KP_SITE": value}, "", {}, {}, dict().get)
    start = time.perf_counter()
    assert autodetect.detect(prof, facts) is None
    assert time.perf_counter() - start < 2.0
    notes: list[str] = []
    long = replace(facts, env={"KP_SITE": "a" * 10_000 + "!"})
    assert autodetect.detect(prof, long, notes) is None
    assert any("10001 characters long" in n and "not matched" in n for n in notes)


# ---- the worked example of docs/profiles.md -------------------------------------------------------
def test_the_worked_example_in_the_docs_checks_and_matches(tmp_path, capsys):
    doc = (ROOT / "docs" / "profiles.md").read_text()
    block = re.search(r"<!-- worked-example -->\s*```toml\n(.*?)```", doc, re.S)
    assert block, "docs/profiles.md has the worked example"
    p = tmp_path / "isambard-ai.toml"
    p.write_text(block.group(1))
    assert run_cli(["profiles", "check", p], capsys)[0] == 0
    code, result = match(["auto", "--profiles-dir", tmp_path, "--node", "isambard-ai"], capsys)
    assert code == 0 and result["profile"] == "isambard-ai" and result["matched"] == "slurm-cluster:isambard-ai"
    code, result = match(["auto", "--profiles-dir", tmp_path, "--node", "alps-gh200"], capsys)
    assert result["profile"] == "alps-gh200"  # same hardware, another site
    code, result = match(["isambard-ai", "--profiles-dir", tmp_path, "--node", "lumi-g"], capsys)
    assert code == 4


def test_the_example_nodes_are_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"profiles/sites/nodes/*.json"' in text
