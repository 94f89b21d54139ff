"""kernel_probe.profile_match: recognising a site from its signals (strong decide, weak never
alone), marker files read safely."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import kernel_lock
from kernel_probe import profile_match, sites
from kernel_probe.cli import main
from kernel_probe.profiles import Profile, load_file, parse
from tests.kernel_probe.profiles.cases import (
    BUILTIN,
    BUILTIN_DIR,
    CPU_PROFILE,
    GPU_PROFILE,
    SIGNALS,
    check,
    described_node,
    files_profile,
    match,
    run_cli_process,
    sparse_file,
)


@pytest.mark.parametrize("name", BUILTIN)
def test_auto_detection_picks_each_builtin(name):
    env, host, cluster, device, files = SIGNALS[name]
    if cluster:
        env = {**env, "SLURM_CLUSTER_NAME": cluster}
    found = sites.survey().profiles.values()
    prof, matched, _ = profile_match.auto_detect(
        found,
        {"hostname": host, "slurm": {}},
        device,
        env=env,
        read_file=lambda path: files.get(path),
    )
    assert prof is not None and prof.name == name, matched
    assert matched  # which signal matched is reported
    if name != "cpu":
        assert not matched.startswith("device:")


def test_nid_hostname_alone_is_not_lumi():
    prof, matched, _ = profile_match.auto_detect(
        sites.survey().profiles.values(),
        {"hostname": "nid001234"},
        {"type": "cuda"},
        env={},
        read_file=lambda p: None,
    )
    assert prof is None  # a Cray nid outside LUMI-G's range says nothing


def test_juwels_via_systemname_env():
    prof, matched, _ = profile_match.auto_detect(
        sites.survey().profiles.values(),
        {"hostname": "x"},
        {"type": "cuda"},
        env={"SYSTEMNAME": "juwelsbooster"},
        read_file=lambda p: None,
    )
    assert prof.name == "juwels-booster" and matched == "env:SYSTEMNAME=juwelsbooster"


@pytest.mark.slow
def test_auto_on_this_machine_picks_cpu_and_records_it(tmp_path, capsys):
    out = tmp_path / "k.toml"
    assert main(["--profile", "auto", "--out", str(out), "--slot", "Linear"]) == 0
    assert "profile auto: cpu (matched device:type=cpu)" in capsys.readouterr().err
    lock = kernel_lock.load(out)
    assert lock.profile["name"] == "cpu" and lock.profile["matched"] == "device:type=cpu"
    assert lock.profile["digest"] == load_file(BUILTIN_DIR / "cpu.toml").digest
    skipped = {r.implementation: r for r in lock.slots["Linear"].rejected}
    assert skipped["te.linear"].status == "skipped" and skipped["te.linear"].reasons == (
        "not allowed by profile cpu",
    )


def test_ambiguous_auto_is_an_error(tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    for n in ("one", "two"):
        (d / f"{n}.toml").write_text(
            CPU_PROFILE.replace('"mysite"', f'"{n}"').replace('MYSITE = ""', 'KP_TEST_SITE = ""')
        )

    os.environ["KP_TEST_SITE"] = "1"
    try:
        assert (
            main(["--profile", "auto", "--profiles-dir", str(d), "--out", str(tmp_path / "k.toml")])
            == 4
        )
    finally:
        del os.environ["KP_TEST_SITE"]
    assert "ambiguous" in capsys.readouterr().err


def test_a_lumi_g_host_name_on_another_cray_is_not_lumi(tmp_path, capsys):
    # an Isambard-AI (or any HPE Cray EX) node named within LUMI-G's nid range
    node = described_node(
        tmp_path,
        "isambard-ai",
        site={"hostname": "nid005123", "slurm": {"SLURM_JOB_PARTITION": "gpu"}},
    )
    code, result = match(["auto", "--node", node], capsys)
    assert code == 0 and result["profile"] is None
    said = (
        "lumi-g: hostname:nid005123 matched, but not slurm-partition: a weak signal never "
        "decides alone"
    )
    assert any(said in n for n in result["notes"]), result["notes"]


def test_weak_only_detection_is_warned_and_undecidable_groups_refused(tmp_path, capsys):
    weak = GPU_PROFILE.replace('env = { MYSITE = "" }', 'hostname = ["^nid00[0-9]{4}$"]')
    code, said = check(tmp_path, weak, capsys)
    assert (
        code == 0 and "only weak signals (hostname)" in said and "never picks this profile" in said
    )
    group = GPU_PROFILE + '[[detect.all]]\nhostname = ["^nid"]\ndevice = { type = "cuda" }\n'
    code, said = check(tmp_path, group, capsys)
    assert code == 5 and "'detect.all[0]'" in said and "can never decide" in said
    beside = GPU_PROFILE.replace(
        'env = { MYSITE = "" }', 'env = { MYSITE = "" }\ndevice = { type = "cuda" }'
    )
    code, said = check(tmp_path, beside, capsys)
    assert code == 5 and "'detect.device'" in said and "[[detect.all]]" in said


def test_a_device_signal_takes_the_arch_syntax(tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    group = (
        '[[detect.all]]\nenv = { KP_SITE = "^x$" }\ndevice = { type = "cuda", arch = "sm_90+" }\n'
    )
    (d / "hopper.toml").write_text(
        GPU_PROFILE.replace('"mysite"', '"hopper"').replace('env = { MYSITE = "" }', group)
    )
    # sm_90, and no CLUSTER_NAME
    hopper = described_node(tmp_path, "alps-gh200", env={"KP_SITE": "x"})
    code, result = match(["auto", "--profiles-dir", d, "--node", hopper], capsys)
    assert (
        result["profile"] == "hopper"
        and result["matched"] == "env:KP_SITE=x + device:type=cuda,arch=sm_90+"
    )
    ampere = described_node(tmp_path, "juwels-booster", env={"KP_SITE": "x"})  # sm_80
    code, result = match(["auto", "--profiles-dir", d, "--node", ampere], capsys)
    assert result["profile"] == "juwels-booster"
    assert any(
        "hopper: env:KP_SITE=x matched, but not device:type=cuda,arch=sm_90+" in n
        for n in result["notes"]
    )


def test_a_group_of_both_weak_kinds_decides_below_a_strong_signal():
    def prof(name: str, detect: str) -> Profile:
        return parse(
            GPU_PROFILE.replace('"mysite"', f'"{name}"').replace('env = { MYSITE = "" }', detect),
            name,
        )

    group = prof("grouped", '[[detect.all]]\nhostname = ["^nid"]\nslurm-partition = ["^gpu$"]')
    strong = prof("strong", 'slurm-cluster = ["^c1$"]')
    facts = sites.SiteFacts(
        {"SLURM_JOB_PARTITION": "gpu", "SLURM_CLUSTER_NAME": "c1"}, "nid1", {}, {}, dict().get
    )
    chosen, matched, notes = profile_match.auto_detect([group, strong], facts)
    assert (
        chosen is strong
        and "grouped also matched (slurm-partition:gpu + hostname:nid1), more weakly" in notes
    )


@pytest.mark.slow  # two CLI runs in child processes per case (each imports torch)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "directory"])
def test_a_detect_file_that_is_not_a_small_regular_file_is_never_read(kind, tmp_path, request):
    target = {
        "fifo": lambda: request.getfixturevalue("fifo"),
        "dev-zero": lambda: Path("/dev/zero"),
        "huge": lambda: sparse_file(tmp_path / "huge", 1 << 34),  # 16 GiB, sparse: no disk used
        "directory": lambda: tmp_path,
    }[kind]()
    d = files_profile(tmp_path / "p", str(target))
    start = time.monotonic()
    done = run_cli_process(["profiles", "match", "auto", "--json"], d)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["profile"] == "cpu"  # fileprof did not match
    assert any(f"detect file {target}:" in n and "not read" in n for n in result["notes"]), result[
        "notes"
    ]
    done = run_cli_process(["--check", "--profile", "auto", "--out", tmp_path / "k.toml"], d)
    # no lock: and no hang
    assert done.returncode == 3 and "stale or missing" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - start < 240


def test_a_marker_file_is_read_like_every_input(tmp_path, fifo):
    import threading

    from kernel_probe.detect.host import read_marker

    (tmp_path / "m").write_text("juwelsbooster\nsecond line\n")
    assert read_marker(str(tmp_path / "m")) == ("juwelsbooster", "")
    assert read_marker(str(tmp_path / "absent")) == (None, "")
    value, problem = read_marker("/dev/zero")
    assert value is None and "character device" in problem
    big = sparse_file(tmp_path / "big", 1 << 34)
    value, problem = read_marker(str(big))
    assert value is None and f"{1 << 34} bytes, more than the" in problem
    said: list = []  # a FIFO without a writer: a blocking open would never return
    reader = threading.Thread(target=lambda: said.append(read_marker(str(fifo))), daemon=True)
    reader.start()
    reader.join(10)
    assert said and said[0][0] is None and "FIFO" in said[0][1]
