"""Site profiles: the built-ins validate, auto-detection, enforcement (exit 4), malformed files (exit 5),
and a profile's policy changing the lock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kernel_lock
from kernel_probe.cli import main
from kernel_probe.profiles import autodetect, discovery
from kernel_probe.profiles.format import load_file
from tests.conftest import run_cli

BUILTIN_DIR = discovery.builtin_dir()
BUILTIN = sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))
GPU_PROFILES = [n for n in BUILTIN if n != "cpu"]


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


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_profile_validates(name, capsys):
    prof = load_file(BUILTIN_DIR / f"{name}.toml")
    assert prof.name == name and prof.description and prof.sources
    assert prof.requires.get("device-type")
    assert main(["profiles", "check", str(BUILTIN_DIR / f"{name}.toml")]) == 0
    assert f"valid profile ({name})" in capsys.readouterr().out


# name -> (env, hostname, slurm cluster, device, files) that should make auto-detection pick it
SIGNALS = {
    "lumi-g": ({"LUMI_STACK_PARTITION": "G"}, "nid005123", None, {"type": "rocm", "arch": "gfx90a"}, {}),
    "frontier": ({}, "frontier01234", "frontier", {"type": "rocm", "arch": "gfx90a"}, {}),
    "leonardo-booster": (
        {"SLURM_JOB_PARTITION": "boost_usr_prod"},
        "lrdn1234.leonardo.local",
        None,
        {"type": "cuda", "arch": "sm_80"},
        {},
    ),
    "juwels-booster": (
        {},
        "jwb0042",
        None,
        {"type": "cuda", "arch": "sm_80"},
        {"/etc/FZJ/systemname": "juwelsbooster"},
    ),
    "marenostrum5-acc": ({"BSC_MACHINE": "mn5"}, "as01r1b01", None, {"type": "cuda", "arch": "sm_90"}, {}),
    "alps-gh200": ({"CLUSTER_NAME": "clariden"}, "nid001234", None, {"type": "cuda", "arch": "sm_90"}, {}),
    "perlmutter": ({"NERSC_HOST": "perlmutter"}, "nid001234", "perlmutter", {"type": "cuda", "arch": "sm_80"}, {}),
    "cpu": ({}, "laptop", None, {"type": "cpu", "arch": ""}, {}),
}


@pytest.mark.parametrize("name", BUILTIN)
def test_auto_detection_picks_each_builtin(name):
    env, host, cluster, device, files = SIGNALS[name]
    if cluster:
        env = {**env, "SLURM_CLUSTER_NAME": cluster}
    found = discovery.available().values()
    prof, matched, _ = autodetect.auto_detect(
        found, {"hostname": host, "slurm": {}}, device, env=env, read_file=lambda path: files.get(path)
    )
    assert prof is not None and prof.name == name, matched
    assert matched  # which signal matched is reported
    if name != "cpu":
        assert not matched.startswith("device:")


def test_nid_hostname_alone_is_not_lumi():
    prof, matched, _ = autodetect.auto_detect(
        discovery.available().values(), {"hostname": "nid001234"}, {"type": "cuda"}, env={}, read_file=lambda p: None
    )
    assert prof is None  # a Cray nid outside LUMI-G's range says nothing


def test_juwels_via_systemname_env():
    prof, matched, _ = autodetect.auto_detect(
        discovery.available().values(),
        {"hostname": "x"},
        {"type": "cuda"},
        env={"SYSTEMNAME": "juwelsbooster"},
        read_file=lambda p: None,
    )
    assert prof.name == "juwels-booster" and matched == "env:SYSTEMNAME=juwelsbooster"


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
def test_auto_on_this_machine_picks_cpu_and_records_it(tmp_path, capsys):
    out = tmp_path / "k.toml"
    assert main(["--profile", "auto", "--out", str(out), "--slot", "Linear"]) == 0
    assert "profile auto: cpu (matched device:type=cpu)" in capsys.readouterr().err
    lock = kernel_lock.load(out)
    assert lock.profile["name"] == "cpu" and lock.profile["matched"] == "device:type=cpu"
    assert lock.profile["digest"] == load_file(BUILTIN_DIR / "cpu.toml").digest
    skipped = {r.implementation: r for r in lock.slots["Linear"].rejected}
    assert skipped["te.linear"].status == "skipped" and skipped["te.linear"].reasons == ("not allowed by profile cpu",)


GOOD = """profile-version = "1"
name = "mysite"
description = "test site"
sources = ["tests"]
[detect]
env = { MYSITE = "" }
[requires]
device-type = ["cpu"]
torch = ">=2.4"
"""

MALFORMED = [
    ("not toml", "[[[", "", "not valid TOML"),
    ("unknown top key", GOOD + "colour = 1\n", "colour", "unknown key"),
    ("unknown nested key", GOOD.replace("torch =", "torchh ="), "requires.torchh", "did you mean"),
    ("bad specifier", GOOD.replace('">=2.4"', '"~~2"'), "requires.torch", "PEP 440"),
    (
        "bad library specifier",
        GOOD + '[requires.libraries]\nliger-kernel = "bogus"\n',
        "requires.libraries.liger-kernel",
        "PEP 440",
    ),
    (
        "unknown candidate id",
        GOOD + '[policy.LayerNorm]\nallowed = ["liger.layernorm"]\n',
        "policy.LayerNorm.allowed",
        "unknown candidate id 'liger.layernorm'",
    ),
    (
        "candidate for another slot",
        GOOD + '[policy.LayerNorm]\npin = "torch.rms_norm"\n',
        "policy.LayerNorm.pin",
        "is for RMSNorm",
    ),
    (
        "pin not allowed",
        GOOD + '[policy.RMSNorm]\nallowed = ["torch.rms_norm"]\npin = "liger.rms_norm"\n',
        "policy.RMSNorm.pin",
        "not in policy.RMSNorm.allowed",
    ),
    ("unknown slot policy", GOOD + "[policy.Layernorm]\nallowed = []\n", "policy.Layernorm", "unknown key"),
    ("bad regex", GOOD.replace('MYSITE = ""', 'MYSITE = "(("'), "detect.env.MYSITE", "regular expression"),
    ("bad version", GOOD.replace('profile-version = "1"', 'profile-version = "9"'), "profile-version", "unsupported"),
    ("missing name", GOOD.replace('name = "mysite"\n', ""), "name", "required"),
    ("bad name", GOOD.replace('"mysite"', '"My Site"'), "name", "lower-case"),
    ("wrong type", GOOD.replace('device-type = ["cpu"]', "device-type = 3"), "requires.device-type", "list of strings"),
    ("bad count", GOOD + "min-device-count = -1\n", "requires.min-device-count", "non-negative"),
    ("bad precision", GOOD + '[policy]\nprecision = "fp8"\n', "policy.precision", "not one of"),
    ("bad shape", GOOD + '[policy]\nshapes = ["0x1"]\n', "policy.shapes[0]", "positive integers"),
    ("bad strictness group", GOOD + '[strictness]\nwarn = ["everything"]\n', "strictness.warn", "unknown group"),
    (
        "candidate unknown key",
        GOOD + '[[candidate]]\nid = "x"\nslots = ["LayerNorm"]\ntarget = "a.B"\ncolour = 1\n',
        "candidate[0].colour",
        "unknown key",
    ),
]


@pytest.mark.parametrize("name,text,key,words", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_profiles_exit_5(name, text, key, words, tmp_path, capsys):
    p = tmp_path / "mysite.toml"
    p.write_text(text)
    assert main(["profiles", "check", str(p)]) == 5
    err = capsys.readouterr().err
    assert str(p) in err and words in err and "Traceback" not in err
    if key:
        assert f"'{key}'" in err
    assert main(["--profile", str(p), "--out", str(tmp_path / "k.toml")]) == 5


def test_profile_check_missing_file(tmp_path, capsys):
    assert main(["profiles", "check", str(tmp_path / "nope.toml")]) == 5
    assert "no such file" in capsys.readouterr().err


def _write_profile(d: Path, extra: str) -> Path:
    d.mkdir(exist_ok=True)
    p = d / "mysite.toml"
    p.write_text(GOOD + extra)
    return p


PIN = """
[policy]
shapes = ["256x1000"]
[policy.LayerNorm]
pin = "site.good_layer_norm"
[[candidate]]
id = "site.good_layer_norm"
slots = ["LayerNorm"]
target = "kp_zoo.norms.GoodLayerNorm"
module = "kp_zoo"
twin-target = "torch.nn.LayerNorm"
"""


@pytest.mark.slow
def test_a_profile_pin_changes_the_lock(tmp_path, capsys):
    plain, pinned = tmp_path / "plain.toml", tmp_path / "pinned.toml"
    assert main(["--out", str(plain), "--slot", "LayerNorm", "--shape", "256x1000"]) == 0
    assert kernel_lock.load(plain).slots["LayerNorm"].implementation == "torch.layer_norm"
    _write_profile(tmp_path / "profiles", PIN)
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
    assert slot.implementation == "site.good_layer_norm" and "pinned by profile mysite" in slot.reason
    assert lock.profile["name"] == "mysite" and lock.profile["matched"] == "explicit (--profile)"
    assert lock.provenance["shapes"] == ["256x1000"]  # the profile's shapes were used
    assert type(lock.factory("LayerNorm")(8)).__name__ == "GoodLayerNorm"
    assert main(["diff", str(plain), str(pinned)]) == 0
    assert "slot LayerNorm implementation: 'torch.layer_norm' -> 'site.good_layer_norm'" in capsys.readouterr().out


def test_profiles_env_var_and_shadowing(tmp_path, monkeypatch, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "cpu.toml").write_text(GOOD.replace('"mysite"', '"cpu"').replace('"test site"', '"my own cpu profile"'))
    monkeypatch.setenv(discovery.ENV_VAR, str(d))
    assert discovery.resolve("cpu").description == "my own cpu profile"
    assert main(["profiles", "list", "--json"]) == 0
    names = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert names["cpu"]["description"] == "my own cpu profile" and "lumi-g" in names


@pytest.mark.slow
def test_forbidden_library_and_strictness(tmp_path, capsys):
    from importlib.metadata import version

    installed = version("liger-kernel")  # installed here (pyproject's test dependencies)
    forbid = '[requires.forbidden]\nliger-kernel = ">=0.1"\n'
    p = _write_profile(tmp_path / "a", forbid)
    assert main(["--profile", str(p), "--out", str(tmp_path / "k.toml")]) == 4
    err = capsys.readouterr().err
    assert f"library liger-kernel: expected not installed in >=0.1, found {installed}" in err
    assert "uninstall the forbidden library, or use another environment" in err
    p = _write_profile(tmp_path / "b", forbid + '[strictness]\nwarn = ["forbidden"]\n')
    assert main(["--profile", str(p), "--out", str(tmp_path / "k.toml"), "--slot", "Linear"]) == 0
    assert "warning: profile mysite: library liger-kernel" in capsys.readouterr().err


def test_unknown_profile_name(tmp_path, capsys):
    assert main(["--profile", "lumi", "--out", str(tmp_path / "k.toml")]) == 2
    assert "unknown profile 'lumi'" in capsys.readouterr().err


def test_ambiguous_auto_is_an_error(tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    for n in ("one", "two"):
        (d / f"{n}.toml").write_text(GOOD.replace('"mysite"', f'"{n}"').replace('MYSITE = ""', 'KP_TEST_SITE = ""'))
    import os

    os.environ["KP_TEST_SITE"] = "1"
    try:
        assert main(["--profile", "auto", "--profiles-dir", str(d), "--out", str(tmp_path / "k.toml")]) == 4
    finally:
        del os.environ["KP_TEST_SITE"]
    assert "ambiguous" in capsys.readouterr().err


# ---- profile candidates validated, a broken profile hides no other (hostile input, issue 14) ---------------
@pytest.mark.parametrize(
    "candidate,words",
    [
        ('id = "torch.layer_norm"\nslots = ["LayerNorm"]\ntarget = "site.Norm"', "built-in candidate's id"),
        ('id = "site.x"\nslots = ["LayerNorm"]\ntarget = "site.Norm"\nargs = 3', "expected a list"),
        (
            'id = "site.x"\nslots = ["LayerNorm"]\ntarget = "site.Norm"\nkwargs = { eps = [1] }',
            "expected a string, a finite number",
        ),
        ('id = "site.x"\nslots = ["LayerNorm"]\ntarget = "site.Norm"\ntwin-kwargs = 1', "expected a table"),
    ],
)
def test_profile_candidate_fields_are_validated(tmp_path, capsys, candidate, words):
    p = tmp_path / "site.toml"
    p.write_text(f'profile-version = "1"\nname = "site"\n[[candidate]]\n{candidate}\n')
    code, _, err = run_cli(["profiles", "check", p], capsys)
    assert code == 5 and words in err and "candidate[0]" in err, err


def test_one_broken_profile_does_not_hide_the_others(tmp_path, capsys, monkeypatch):
    (tmp_path / "broken.toml").write_text("profile-version = = 1\n")
    monkeypatch.setenv("KERNEL_PROBE_PROFILES", str(tmp_path))
    code, out, err = run_cli(["profiles", "show", "cpu"], capsys)
    assert code == 0 and "cpu" in out
    code, out, err = run_cli(["profiles", "list"], capsys)
    assert code == 0 and "broken profile" in err and "broken.toml" in err
    assert run_cli(["--profile", "broken", "--out", tmp_path / "k.toml"], capsys)[0] == 5
