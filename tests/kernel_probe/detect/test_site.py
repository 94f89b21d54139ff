"""kernel_probe.detect.host (site signals): hostname, Slurm variables and site markers, as found."""

from __future__ import annotations

import os
import socket

import pytest

from kernel_probe.detect import host


def test_site_signals(tmp_path):
    systemname = tmp_path / "systemname"
    systemname.write_text("juwelsbooster\n")
    markers = host.SITE_MARKERS + (
        host.SiteMarker("file", str(systemname), "JSC"),
        host.SiteMarker("file", str(tmp_path / "absent"), "nowhere"),
    )
    env = {
        "LUMI_STACK_NAME": "LUMI",
        "SLURM_JOB_ID": "123",
        "SLURM_CLUSTER_NAME": "lumi",
        "HOME": "/users/x",
        "SLURM_SECRET_UNLISTED": "x",
    }
    s = host.detect_site(env, hostname="nid005123", markers=markers)
    assert s["hostname"] == "nid005123"
    assert s["slurm"] == {"SLURM_CLUSTER_NAME": "lumi", "SLURM_JOB_ID": "123"}
    signals = {m["signal"]: m["value"] for m in s["markers"]}
    assert signals["env:LUMI_STACK_NAME"] == "LUMI"
    assert signals[f"file:{systemname}"] == "juwelsbooster"
    assert not any("absent" in k for k in signals)


def test_site_markers_cover_the_issue_list():
    names = {m.name for m in host.SITE_MARKERS}
    wanted = {
        "LUMI_STACK_NAME",
        "SYSTEMNAME",
        "/etc/FZJ/systemname",
        "CLUSTER_NAME",
        "NERSC_HOST",
        "BSC_MACHINE",
    }
    assert wanted <= names


# ---- marker files: read safely, first line only ------------------------------------------------
@pytest.mark.parametrize(
    "content, value",
    [
        ("juwelsbooster\n", "juwelsbooster"),
        ("  jurecadc  \nsecond line\n", "jurecadc"),
        ("no newline", "no newline"),
        ("\nsecond line only\n", None),  # an empty first line says nothing
        ("", None),
        ("   \n", None),
    ],
)
def test_read_marker_takes_the_first_line(tmp_path, content, value):
    path = tmp_path / "systemname"
    path.write_text(content)
    assert host.read_marker(str(path)) == (value, "")
    assert host.first_line(str(path)) == value


def test_read_marker_of_an_absent_file_is_silent(tmp_path):
    assert host.read_marker(str(tmp_path / "absent")) == (None, "")


def test_read_marker_refuses_a_directory(tmp_path):
    value, why = host.read_marker(str(tmp_path))
    assert value is None and why.startswith("is a directory, not a") and why.endswith(": not read")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_read_marker_never_blocks_on_a_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    value, why = host.read_marker(str(fifo))
    assert value is None and "not a regular file" in why and why.endswith(": not read")


def test_read_marker_refuses_a_file_over_its_limit(tmp_path):
    path = tmp_path / "big"
    path.write_text("x" * 100 + "\n")
    value, why = host.read_marker(str(path), limit=10)
    assert value is None and "more than the 10" in why
    assert host.read_marker(str(path), limit=200) == ("x" * 100, "")


def test_read_marker_replaces_undecodable_bytes(tmp_path):
    path = tmp_path / "m"
    path.write_bytes(b"lumi\xff\n")
    assert host.read_marker(str(path)) == ("lumi\ufffd", "")


# ---- detect_site -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env, markers",
    [
        ({}, []),
        ({"NERSC_HOST": "perlmutter"}, [("env:NERSC_HOST", "perlmutter", "NERSC (perlmutter)")]),
        ({"NERSC_HOST": ""}, []),  # set but empty: no signal
        (
            {"BSC_MACHINE": "mn5", "CLUSTER_NAME": "daint"},  # in the table's order, not the env's
            [
                ("env:CLUSTER_NAME", "daint", "CSCS Alps (daint, clariden, santis)"),
                ("env:BSC_MACHINE", "mn5", "BSC (mn5)"),
            ],
        ),
    ],
)
def test_detect_site_env_markers(env, markers):
    env_only = tuple(m for m in host.SITE_MARKERS if m.kind == "env")
    found = host.detect_site(env, hostname="h", markers=env_only)["markers"]
    assert [(m["signal"], m["value"], m["hint"]) for m in found] == markers


def test_detect_site_keeps_only_the_listed_slurm_variables():
    env = {name: str(i) for i, name in enumerate(host.SLURM_VARIABLES)} | {
        "SLURM_JOB_NAME": "secret",
        "PATH": "/x",
    }
    slurm = host.detect_site(env, hostname="h", markers=())["slurm"]
    # every one, in the table's order, nothing else
    assert list(slurm) == list(host.SLURM_VARIABLES)


def test_detect_site_defaults_to_this_host_and_environment(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    s = host.detect_site(markers=())
    assert s["hostname"] == socket.gethostname()
    assert s["slurm"]["SLURM_JOB_ID"] == "4242"
