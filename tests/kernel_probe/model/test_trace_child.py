"""The trace in its child process, as a user runs it: ``trace(spec)`` and ``kernel-probe model``;
the file form's sibling imports; the model's code failing, hanging or killing its child, each a
clear error naming the spec with its documented exit code; a trusted package's slot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kernel_lock.errors import ExitCode
from kernel_lock.model import Model, Site, Unreached
from kernel_probe.errors import InputFileError, ProbeError
from kernel_probe.model import child, trace
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow  # each trace starts a child that imports torch


def in_process(call: str, module: str) -> Model:
    spec = {"kind": "module", "source": module, "call": call, "text": call}
    value = child.trace_model({"spec": spec, "precision": "32-true", "trust": []})
    sites = tuple(Site(**{**s, "shapes": tuple(s["shapes"])}) for s in value["sites"])
    return Model.of(call, sites, tuple(Unreached(**u) for u in value["unreached"]))


def test_a_file_spec_traces_in_its_child_its_siblings_imported(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the working directory is not the model's folder
    model = trace(str(ROOT / "tests/models/variants.py:norms"))  # `from block import ...`
    assert model.traced == "meta"
    assert model.digest == in_process("norms", "tests.models.variants").digest
    assert model.spec.endswith("variants.py:norms") and model.intact


def test_the_command_prints_the_table_and_the_json(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = run_cli(["model", "tests/models/variants.py:mha", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["ok"] is True and data["traced"] == "meta" and data["notes"] == []
    assert [s["where"] for s in data["sites"]] == ["fc"]
    assert data["unreached"][0]["call"] == "torch.nn.MultiheadAttention"
    assert data["digest"] == in_process("mha", "tests.models.variants").digest
    code, out, err = run_cli(["model", "tests/models/block.py:build"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert "traced: meta" in lines[0]
    causal = next(line for line in lines if line.startswith(":scaled_dot_product_attention"))
    assert "is_causal=true" in causal and "2x4x16x16" in causal and "float32" in causal
    assert sum(line.split()[1:2] == ["Linear"] for line in lines[2:]) == 4


@pytest.mark.parametrize(
    ("call", "code", "said"),
    [
        ("raises", ExitCode.BAD_INPUT, "raises() raised ValueError: no weights here"),
        ("model_only", ExitCode.BAD_INPUT, "returned Linear, not (model, args)"),
        ("dies", ExitCode.FAILURE, "was killed by SIGKILL"),
    ],
)
def test_the_models_code_failing_is_named_with_its_exit_code(call, code, said, capsys):
    spec = f"{ROOT}/tests/models/broken.py:{call}"
    got, out, err = run_cli(["model", spec, "--json"], capsys)
    assert got == code, err
    error = json.loads(out)["error"]
    assert error["exit_code"] == code and said in error["problem"], error
    assert error["problem"].startswith(f"model {spec}: ") and error["fix"]


def test_a_model_that_hangs_is_killed_at_its_timeout():
    with pytest.raises(ProbeError) as caught:
        trace(f"{ROOT}/tests/models/broken.py:hangs", timeout=8)
    assert caught.value.exit_code == ExitCode.FAILURE
    assert "no trace within 8 s (the child was killed)" in caught.value.problem


def test_a_module_the_child_cannot_import_is_bad_input():
    with pytest.raises(InputFileError, match="working directory is not searched"):
        trace("no_such_model_module:build")


LAYERSCALE = """
import torch
from torch import nn
from kp_layerscale.layers import LayerScale

def build():
    return nn.Sequential(nn.Linear(8, 8), LayerScale(8)), (torch.randn(2, 8),)
"""


def test_a_trusted_packages_slot_is_a_site_and_only_then(tmp_path):
    from tests.kernel_probe.test_slot_from_outside import ENTRY_POINTS

    dist = tmp_path / "site" / "kp_layerscale-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kp-layerscale\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    (tmp_path / "scaled.py").write_text(LAYERSCALE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(dist.parent), os.environ["PYTHONPATH"]]),
    }
    env.pop("KERNEL_LOCK_TRUST", None)

    def sites(*trust: str) -> list[tuple[str, str]]:
        argv = [sys.executable, "-m", "kernel_probe", "model", "scaled.py:build", "--json"]
        argv += [a for t in trust for a in ("--trust", t)]
        proc = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        return [(s["where"], s["slot"]) for s in json.loads(proc.stdout)["sites"]]

    assert sites("kp_layerscale") == [("0", "Linear"), ("1", "LayerScale")]
    assert sites() == [("0", "Linear")]  # untrusted: its entry point is never loaded
