"""kernel_probe.profiles: a profile file read strictly (closed sets, contradictions, library
names, candidates); malformed files exit 5."""

from __future__ import annotations

import pytest

from kernel_probe.cli import main
from kernel_probe.profiles import load_file
from tests.conftest import run_cli
from tests.kernel_probe.profiles.cases import (
    BAD_VALUES,
    BUILTIN,
    BUILTIN_DIR,
    CONTRADICTIONS,
    GPU_PROFILE,
    MALFORMED,
    check,
    match,
)


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_profile_validates(name, capsys):
    prof = load_file(BUILTIN_DIR / f"{name}.toml")
    assert prof.name == name and prof.description and prof.sources
    assert prof.requires.get("device-type")
    assert main(["profiles", "check", str(BUILTIN_DIR / f"{name}.toml")]) == 0
    assert f"valid profile ({name})" in capsys.readouterr().out


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


# ---- profile candidates validated, a broken profile hides no other (hostile input, issue 14) -----
@pytest.mark.parametrize(
    "candidate,words",
    [
        (
            'id = "torch.layer_norm"\nslots = ["LayerNorm"]\ntarget = "site.Norm"',
            "built-in candidate's id",
        ),
        ('id = "site.x"\nslots = ["LayerNorm"]\ntarget = "site.Norm"\nargs = 3', "expected a list"),
        (
            'id = "site.x"\nslots = ["LayerNorm"]\ntarget = "site.Norm"\nkwargs = { eps = [1] }',
            "expected a string, a finite number",
        ),
        (
            'id = "site.x"\nslots = ["LayerNorm"]\ntarget = "site.Norm"\ntwin-kwargs = 1',
            "expected a table",
        ),
    ],
)
def test_profile_candidate_fields_are_validated(tmp_path, capsys, candidate, words):
    p = tmp_path / "site.toml"
    p.write_text(f'profile-version = "1"\nname = "site"\n[[candidate]]\n{candidate}\n')
    code, _, err = run_cli(["profiles", "check", p], capsys)
    assert code == 5 and words in err and "candidate[0]" in err, err


@pytest.mark.parametrize("line,key,words", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_closed_set_values_are_refused_naming_the_accepted_spellings(
    line, key, words, tmp_path, capsys
):
    text = (
        GPU_PROFILE.replace('device-type = ["cuda"]', line)
        if line.startswith("device-type")
        else GPU_PROFILE + line + "\n"
    )
    code, said = check(tmp_path, text, capsys)
    assert code == 5 and f"'{key}'" in said and words in said, said


def test_candidate_archs_use_the_same_syntax(tmp_path, capsys):
    cand = (
        '[[candidate]]\nid = "site.x"\nslots = ["LayerNorm"]\ntarget = "a.B"\narchs = { '
        'rocm = ["%s"] }\n'
    )
    code, said = check(tmp_path, GPU_PROFILE + cand % "gfx90a+", capsys)
    assert code == 5 and "'candidate[0].archs.rocm'" in said and "gfx archs match exactly" in said
    code, said = check(tmp_path, GPU_PROFILE + cand % "sm_90", capsys)
    assert code == 5 and "is a cuda arch, not a rocm one" in said
    assert check(tmp_path, GPU_PROFILE + cand % "gfx942", capsys)[0] == 0


def test_sm_plus_in_requires_means_that_or_newer(tmp_path, capsys):
    p = tmp_path / "hopper.toml"
    p.write_text(GPU_PROFILE.replace('"mysite"', '"hopper"') + 'device-arch = ["sm_80+"]\n')
    code, result = match([p, "--node", "alps-gh200"], capsys)  # sm_90, at another site (alps-gh200)
    assert code == 4 and [u["group"] for u in result["unmet"]] == ["site"], result["unmet"]
    p.write_text(GPU_PROFILE.replace('"mysite"', '"hopper"') + 'device-arch = ["sm_100+"]\n')
    code, result = match([p, "--node", "alps-gh200"], capsys)
    assert (
        code == 4
        and {"group": "device", "field": "device-arch", "expected": "sm_100+", "found": "sm_90"}
        in (result["unmet"])
    )


@pytest.mark.parametrize("extra,key", CONTRADICTIONS)
def test_a_library_required_and_forbidden_is_refused(extra, key, tmp_path, capsys):
    code, said = check(tmp_path, GPU_PROFILE + extra, capsys)
    assert code == 5 and f"'{key}'" in said and "no node can meet this profile" in said, said


def test_forbidding_one_variant_while_requiring_the_library_is_fine(tmp_path, capsys):
    extra = (
        "[requires.libraries]\ntransformer-engine = "
        '""\n[requires.forbidden]\n"transformer-engine@nvidia" '
        '= ""\n'
    )
    assert check(tmp_path, GPU_PROFILE.replace('["cuda"]', '["rocm"]') + extra, capsys)[0] == 0


def test_device_contradictions_are_refused(tmp_path, capsys):
    code, said = check(tmp_path, GPU_PROFILE + 'device-vendor = ["amd"]\n', capsys)
    assert code == 5 and "contradicts requires.device-type" in said
    code, said = check(
        tmp_path, GPU_PROFILE.replace('["cuda"]', '["cpu"]') + "min-device-count = 1\n", capsys
    )
    assert code == 5 and "allows only cpu" in said


# ---- 3. library names: the registry's, or declared as the site's ---------------------------------
def test_a_misspelt_forbidden_library_is_an_error(tmp_path, capsys):
    code, said = check(tmp_path, GPU_PROFILE + '[requires.forbidden]\napexx = ""\n', capsys)
    assert code == 5 and "'requires.forbidden.apexx'" in said and "forbid nothing" in said
    assert "did you mean 'apex'" in said and "site-libraries" in said


def test_site_libraries_and_candidate_distributions_are_known(tmp_path, capsys):
    site = (
        GPU_PROFILE
        + 'site-libraries = ["bsc-kernels"]\n[requires.libraries]\nbsc-kernels = ">=1"\n'
    )
    assert check(tmp_path, site, capsys)[0] == 0
    cand = (
        GPU_PROFILE + '[requires.libraries]\nsite-norms = ""\n'
        '[[candidate]]\nid = "site.ln"\nslots = ["LayerNorm"]\ntarget = '
        '"site_norms.LN"\ndistribution = "site-norms"\n'
    )
    assert check(tmp_path, cand, capsys)[0] == 0
    for dist in (
        "transformer-engine-cu12",
        "liger-kernel-nightly",
        "pytorch-triton-rocm",
    ):  # distribution names
        assert (
            check(tmp_path, GPU_PROFILE + f'[requires.forbidden]\n"{dist}" = ""\n', capsys)[0] == 0
        )


# ---- issue 34: policy rules ----------------------------------------------------------------------
def test_allowed_empty_allows_nothing_and_a_pin_or_preference_then_contradicts_it(tmp_path, capsys):
    from kernel_probe.profiles import parse

    text = GPU_PROFILE + "\n[policy.LayerNorm]\nallowed = []\n"
    prof = parse(text, "p.toml")
    assert prof.slots["LayerNorm"].allowed == ()
    code, out = check(tmp_path, text + 'pin = "torch.layer_norm"\n', capsys)
    assert code == 5 and "is not in policy.LayerNorm.allowed" in out


def test_allowed_empty_refuses_every_pin_on_the_command_line(tmp_path, capsys):
    from tests.kernel_probe.profiles.cases import CPU_PROFILE

    p = tmp_path / "mysite.toml"
    p.write_text(CPU_PROFILE + "\n[policy.LayerNorm]\nallowed = []\n")
    argv = [
        "--profile",
        str(p),
        "--out",
        str(tmp_path / "k.toml"),
        "--pin",
        "LayerNorm=torch.layer_norm",
    ]
    assert main([*argv, "--slot", "LayerNorm"]) == 2
    assert "does not allow it" in capsys.readouterr().err


def test_an_empty_pin_is_an_error(tmp_path, capsys):
    code, out = check(tmp_path, GPU_PROFILE + '\n[policy.LayerNorm]\npin = ""\n', capsys)
    assert code == 5 and "'policy.LayerNorm.pin'" in out and "pins nothing" in out


@pytest.mark.parametrize("target", ["pkg.__main__.Norm", "pkg._private.Norm"])
def test_a_candidate_target_goes_through_the_refusal_rules_of_candidate(tmp_path, capsys, target):
    extra = f'\n[[candidate]]\nid = "site.norm"\nslots = ["LayerNorm"]\ntarget = "{target}"\n'
    code, out = check(tmp_path, GPU_PROFILE + extra, capsys)
    assert code == 5 and "'candidate[0].target'" in out and "never imported" in out


@pytest.mark.parametrize("spelling", ["NVIDIA", "Nvidia"])
def test_a_variant_in_a_profile_is_case_insensitive(tmp_path, capsys, spelling):
    from kernel_probe.profiles import parse

    text = GPU_PROFILE.replace(
        "[requires]", f'[requires]\nforbidden = {{ "transformer-engine@{spelling}" = "" }}', 1
    )
    assert "transformer-engine@nvidia" in parse(text, "p.toml").requires["forbidden"]
