"""Described nodes (kernel_probe.sites, profile_match): the built-ins against the shipped example
nodes, and ``profiles match --node``."""

from __future__ import annotations

import json

import pytest

from kernel_probe import profile_match, sites
from tests.conftest import run_cli
from tests.kernel_probe.profiles.cases import BUILTIN, PAIRS, ROOT, SAME_HARDWARE, match


# ---- the built-ins against the shipped example nodes ---------------------------------------------
def test_every_builtin_has_an_example_node():
    assert set(BUILTIN) <= set(sites.examples())


@pytest.mark.parametrize("name", BUILTIN)
def test_each_example_node_meets_its_own_profile_and_picks_only_it(name, capsys):
    code, result = match(["auto", "--node", name], capsys)
    assert code == 0 and result["profile"] == name and result["unmet"] == [], result
    code, result = match([name, "--node", name], capsys)
    assert (
        code == 0 and result["unmet"] == [] and result["matched"] == "named (profiles match NAME)"
    )
    assert not any("site signals" in n for n in result["notes"])


@pytest.mark.parametrize("profile,node", PAIRS, ids=[f"{p}@{n}" for p, n in PAIRS])
def test_no_builtin_is_taken_for_another_sites_node(profile, node, capsys):
    code, result = match([profile, "--node", node], capsys)
    assert any(f"point to profile {node}, not {profile}" in n for n in result["notes"]), result[
        "notes"
    ]
    assert code == 4, result
    site = [u for u in result["unmet"] if u["group"] == "site"]
    hardware = [u for u in result["unmet"] if u["group"] != "site"]
    # the cpu profile is picked by device facts, not site signals: its hardware refuses it
    if node == "cpu":
        assert hardware and not site, result["unmet"]
    else:
        assert site and site[0]["found"].startswith(f"{node} ("), result["unmet"]
    if frozenset((profile, node)) not in SAME_HARDWARE:
        assert hardware, result["unmet"]


@pytest.mark.parametrize(
    "profile,node",
    [
        ("perlmutter", "juwels-booster"),
        ("leonardo-booster", "juwels-booster"),
        ("frontier", "lumi-g"),
    ],
)
def test_the_same_hardware_at_another_site_is_refused_by_the_site_signals_alone(
    profile, node, capsys
):
    code, result = match([profile, "--node", node], capsys)
    assert code == 4 and [u["group"] for u in result["unmet"]] == ["site"], result["unmet"]
    assert f"--profile {node}" in result["fix"]


def test_job_start_refuses_a_named_profile_where_the_site_signals_place_the_node_elsewhere(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("LUMI_STACK_PARTITION", "G")  # LUMI's own stack variable: a strong signal
    code, _, err = run_cli(
        ["--check", "--profile", "frontier", "--out", tmp_path / "k.toml"], capsys
    )
    assert (
        code == 4
        and "a node of profile 'lumi-g' by its site signals" in err
        and "--profile lumi-g" in err
    ), err
    assert not (tmp_path / "k.toml").exists()


def test_a_named_profile_is_refused_at_job_start_on_another_sites_node(monkeypatch):
    """What match says is what --profile NAME decides at job start: a LUMI-G node (its
    LUMI_STACK_PARTITION signal) meets Frontier's requirements, and is refused for Frontier all the
    same; auto picks lumi-g."""
    from kernel_probe.errors import ProfileUnmet

    lumi = sites.resolve("lumi-g", [])
    frontier = sites.resolve("frontier", [])
    # its own site: nothing raised
    profile_match.other_site(lumi, lumi, "env:LUMI_STACK_PARTITION=G")
    # no site's signals: a named profile is how such a site is used
    profile_match.other_site(frontier, None, "")
    with pytest.raises(ProfileUnmet) as exc:
        profile_match.other_site(frontier, lumi, "env:LUMI_STACK_PARTITION=G")
    assert (
        exc.value.exit_code == 4
        and "lumi-g" in str(exc.value)
        and "--profile lumi-g" in exc.value.fix
    )


def test_mn5_gpp_is_not_taken_for_acc(capsys):
    code, result = match(["auto", "--node", "marenostrum5-gpp"], capsys)
    assert code == 0 and result["profile"] == "cpu"
    assert (
        "marenostrum5-acc: env:BSC_MACHINE=mn5 matched, but not device:type=cuda: not one of "
        "its nodes" in (result["notes"])
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
        (
            {"schema": "kernel-probe-node/1", "fingerprint": {"device-type": "gpu"}},
            "fingerprint.device-type",
        ),
        (
            {"schema": "kernel-probe-node/1", "fingerprint": {"device_type": "cuda"}},
            "fingerprint.device_type",
        ),
        (
            {"schema": "kernel-probe-node/1", "fingerprint": {"device-count": "4"}},
            "fingerprint.device-count",
        ),
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


def test_the_example_nodes_are_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"profiles/sites/nodes/*.json"' in text


# ---- issue 34: every value through the typed reader; variants case-insensitive -------------------
def _alps(**change) -> dict:
    doc = json.loads((sites.examples()["alps-gh200"]).read_text())
    for dotted, value in change.items():
        *path, last = dotted.split("__")
        node = doc
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return doc


@pytest.mark.parametrize(
    "change,key",
    [
        ({"site__markers": 5}, "site.markers"),  # once an unexpected TypeError (exit 1)
        ({"site__markers": [5]}, "site.markers[0]"),
        (
            {"libraries__transformer-engine__distributions": "abc"},
            "libraries.transformer-engine.distributions",
        ),
        (
            {"libraries__transformer-engine__variant": ["nvidia"]},
            "libraries.transformer-engine.variant",
        ),
        (
            {"libraries__transformer-engine__variant": "nvidai"},
            "libraries.transformer-engine.variant",
        ),
        ({"libraries__transformer-engine__version": 2}, "libraries.transformer-engine.version"),
        ({"fingerprint__device-count": 10**12}, "fingerprint.device-count"),
        ({"site__hostname": "h" * 1000}, "site.hostname"),
        ({"env": {"A": 1}}, "env.A"),
    ],
)
def test_a_wrong_type_anywhere_in_a_node_is_exit_5_naming_the_key(change, key, tmp_path, capsys):
    p = tmp_path / "n.json"
    p.write_text(json.dumps(_alps(**change)))
    code, out, err = run_cli(["profiles", "match", "frontier", "--node", p], capsys)
    assert code == 5 and f"'{key}'" in err and str(p) in err and "unexpected" not in err, err


def test_a_variant_is_case_insensitive_on_the_node(tmp_path, capsys):
    """A node whose TE variant read "NVIDIA" once met a profile forbidding
    transformer-engine@nvidia."""
    p = tmp_path / "n.json"
    p.write_text(json.dumps(_alps(**{"libraries__transformer-engine__variant": "NVIDIA"})))
    code, result = match(["frontier", "--node", str(p)], capsys)
    assert code == 4 and any(
        u["field"] == "library transformer-engine@nvidia" for u in result["unmet"]
    )
