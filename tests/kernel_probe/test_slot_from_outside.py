"""A slot declared by a package outside kernel-probe (issue 51): ``tests/fakes/kp_layerscale``
declares LayerScale through the slot protocol's entry points, and the probe checks, times, chooses
and locks it, ``verify`` checks the lock and a training process resolves it, with nothing of it in
kernel_probe or kernel_lock. Every run is a fresh process: the slot is registered where its
package is loaded, never in this test process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

ENTRY_POINTS = """\
[kernel_lock.slots]
LayerScale = kp_layerscale.spec:SPEC

[kernel_probe.slots]
LayerScale = kp_layerscale.probe:SLOT

[kernel_probe.probe.candidates]
layerscale = kp_layerscale.probe:candidates
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """An environment where kp_layerscale is installed: its dist-info on the search path."""
    site = tmp_path_factory.mktemp("site")
    dist = site / "kp_layerscale-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kp-layerscale\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    env.pop("KERNEL_LOCK_TRUST", None)
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def probed(installed, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A probe of the LayerScale slot alone, on this CPU."""
    where = tmp_path_factory.mktemp("probe")
    lock = where / "kernel-lock.toml"
    args = ["-m", "kernel_probe", "--out", str(lock), "--slot", "LayerScale"]
    args += ["--precision", "bf16-mixed", "--shape", "256x96", "--json"]
    return lock, _run(args, installed, where)


@pytest.mark.slow
def test_the_probe_checks_times_and_locks_a_slot_declared_outside(probed):
    lock, done = probed
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)["slots"]["LayerScale"]
    by_id = {c["id"]: c for c in summary["candidates"]}
    assert set(by_id) == {"layerscale.torch", "layerscale.fused", "layerscale.halfgrad"}
    assert by_id["layerscale.torch"]["status"] == by_id["layerscale.fused"]["status"] == "accepted"
    # the half weight gradient is measured and rejected by the one rule, per output
    bad = by_id["layerscale.halfgrad"]
    assert bad["status"] == "rejected" and "dweight" in " ".join(bad["reasons"])
    assert all(by_id[c]["timings"] for c in ("layerscale.torch", "layerscale.fused"))
    assert summary["chosen"] in ("layerscale.torch", "layerscale.fused")
    text = lock.read_text()
    assert "[slots.LayerScale]" in text and 'semantics = "layer_scale"' in text
    assert 'trusted-modules = ["kp_layerscale"]' in text


@pytest.mark.slow
def test_a_lock_of_an_outside_slot_verifies_and_resolves_where_its_package_is_trusted(
    probed, installed, tmp_path
):
    lock, done = probed
    assert done.returncode == 0, done.stderr
    trusted = _run(
        ["-m", "kernel_probe", "verify", str(lock), "--trust", "kp_layerscale"], installed, tmp_path
    )
    assert trusted.returncode == 0, trusted.stderr
    # without trust the slot's package is never imported: a format error naming the fix
    refused = _run(["-m", "kernel_probe", "verify", str(lock)], installed, tmp_path)
    assert refused.returncode == 5, refused.stderr
    assert "kernel_lock.slots" in refused.stderr and "--trust kp_layerscale" in refused.stderr
    code = (
        "import kernel_lock\n"
        f"lock = kernel_lock.load({str(lock)!r}, trust=['kp_layerscale'])\n"
        "f = lock.factory('LayerScale')\n"
        "m = f(8)\n"
        "print(type(m).__module__, type(m).__name__, f.implementation, float(m.gamma[0]))"
    )
    resolved = _run(["-c", code], installed, tmp_path)
    assert resolved.returncode == 0, resolved.stderr
    module, name, implementation, gamma = resolved.stdout.split()
    assert module == "kp_layerscale.layers" and implementation.startswith("layerscale.")
    assert name in ("LayerScale", "FusedLayerScale") and float(gamma) == pytest.approx(1e-5)


def test_nothing_of_the_outside_slot_is_in_the_two_packages():
    for package in ("kernel_lock", "kernel_probe"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            assert "LayerScale" not in text and "kp_layerscale" not in text, path
