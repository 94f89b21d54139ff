"""kernel-probe check-config: an anemoi config's layer_kernels blocks, on this machine and against a
lock."""

from __future__ import annotations

import json
import textwrap

import pytest

import kernel_lock
from kernel_lock.anemoi import layer_kernels
from tests.conftest import run_cli as run
from tests.conftest import write_sealed

# the training layout: defined once, inherited by every component
TRAINING = """\
model:
  num_channels: 64
  layer_kernels:
    LayerNorm: {_target_: torch.nn.LayerNorm, eps: 1e-6}
    Linear: {_target_: torch.nn.Linear, bias: false}
    Activation: {_target_: torch.nn.GELU}
  processor:
    _target_: anemoi.models.layers.processor.TransformerProcessor
    layer_kernels: ${model.layer_kernels}
  encoders:
    "0": {mapper: {layer_kernels: "${model.layer_kernels}"}}
  decoders:
    "0": {mapper: {layer_kernels: "${model.layer_kernels}"}}
"""


def write(tmp_path, text: str, name: str = "config.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def findings(tmp_path, capsys, text: str, *extra) -> tuple[int, dict]:
    code, out, err = run(["check-config", write(tmp_path, text), "--json", *extra], capsys)
    data = json.loads(out)
    assert data["exit_code"] == code, err
    return code, data


# ---- the command ---------------------------------------------------------------------------------
@pytest.fixture
def minimal_lock_path(tmp_path):
    return write_sealed(tmp_path / "kernel-lock.toml")


@pytest.mark.slow
def test_exported_block_passes_against_its_lock(tmp_path, capsys, minimal_lock_path):
    code, out, err = run(["export", minimal_lock_path], capsys)
    assert code == 0, err
    model = (
        "model:\n"
        + textwrap.indent(out, "  ")
        + "  processor: {layer_kernels: '${model.layer_kernels}'}\n"
    )
    code, out, err = run(
        ["check-config", write(tmp_path, model), "--lock", minimal_lock_path], capsys
    )
    assert code == 0, out + err
    assert (
        "model.processor.layer_kernels: inherits model.layer_kernels" in out and "0 error(s)" in out
    )
    # the training layout, whose block agrees with the lock, passes too
    code, data = findings(tmp_path, capsys, TRAINING, "--lock", minimal_lock_path)
    assert (
        code == 0
        and data["findings"] == []
        and data["expected"] == layer_kernels(kernel_lock.load(minimal_lock_path))
    )


@pytest.mark.slow
def test_disagreements_with_the_lock_exit_3(tmp_path, capsys, minimal_lock_path):
    code, data = findings(
        tmp_path,
        capsys,
        """\
        model:
          layer_kernels:
            LayerNorm: {_target_: kp_zoo.norms.GoodLayerNorm, eps: 1e-6}
            Linear: {_target_: torch.nn.Linear}
          processor:
            layer_kernels:
              LayerNorm: {_target_: torch.nn.LayerNorm}
              Linear: {_target_: torch.nn.Linear, bias: false}
    """,
        "--lock",
        minimal_lock_path,
    )
    problems = {(f["where"], f["problem"]) for f in data["findings"] if f["kind"] == "lock"}
    assert code == 3 and {f["severity"] for f in data["findings"]} == {"error"}
    assert problems == {
        (
            "model.layer_kernels.LayerNorm",
            "builds kp_zoo.norms.GoodLayerNorm, the lock pins torch.nn.LayerNorm",
        ),
        ("model.layer_kernels.Linear.bias", "bias is not set (default True), the lock pins False"),
        (
            "model.processor.layer_kernels.LayerNorm.eps",
            "eps is not set (default 1e-05), the lock pins 1e-06",
        ),
    }


@pytest.mark.slow
def test_config_errors_exit_5_and_win_over_lock_disagreements(tmp_path, capsys, minimal_lock_path):
    code, out, err = run(
        [
            "check-config",
            write(
                tmp_path,
                """\
        model:
          layer_kernels:
            Layernorm: {_target_: torch.nn.LayerNorm}
            LayerNorm: {_target_: torch.nn.RMSNorm, eps: 1e-6}
            Linear: {_target_: nolib.FastLinear}
    """,
            ),
            "--lock",
            minimal_lock_path,
        ],
        capsys,
    )
    assert code == 5, err
    for words in (
        "unknown key 'Layernorm'",
        "did you mean 'LayerNorm'",
        "semantics change",
        "No module named 'nolib'",
        "builds nolib.FastLinear, the lock pins torch.nn.Linear",
        "fix:",
    ):
        assert words in out, words


@pytest.mark.slow
def test_no_block_means_anemoi_defaults(tmp_path, capsys, minimal_lock_path):
    code, data = findings(tmp_path, capsys, "model: {num_channels: 64}\n")
    assert code == 0 and data["findings"][0]["problem"].startswith("no layer_kernels block found")
    code, data = findings(
        tmp_path, capsys, "model: {num_channels: 64}\n", "--lock", minimal_lock_path
    )
    assert code == 3  # anemoi's default torch.nn.Linear has a bias; the lock pins bias = false
    assert any(f["where"].startswith("(anemoi defaults).Linear") for f in data["findings"])


@pytest.mark.slow
def test_interpolation_problems(tmp_path, capsys):
    code, data = findings(
        tmp_path,
        capsys,
        """\
        model:
          layer_kernels: ${model.kernels}
          processor: {layer_kernels: {LayerNorm: {_target_: torch.nn.LayerNorm, eps: "${oc.env:EPS}x"}}}
    """,  # noqa: E501 (a YAML flow mapping kept on one line)
    )
    kinds = {(f["severity"], f["kind"], f["where"]) for f in data["findings"]}
    assert code == 5
    assert ("error", "interpolation", "model.layer_kernels") in kinds
    assert ("warning", "interpolation", "model.processor.layer_kernels.LayerNorm.eps") in kinds


@pytest.mark.slow
def test_a_crashing_import_is_a_finding_not_a_crash(tmp_path, capsys):
    code, data = findings(
        tmp_path,
        capsys,
        """\
        model:
          layer_kernels:
            LayerNorm: {_target_: kp_zoo.abort_on_import.X}
            Linear: {_target_: torch.nn.Linear}
    """,
    )
    [f] = [f for f in data["findings"] if f["severity"] == "error"]
    assert (
        code == 5
        and f["kind"] == "import"
        and "SIGABRT" in f["problem"]
        and f["where"].endswith(".LayerNorm")
    )


def test_an_unreadable_config_exits_5(tmp_path, capsys):
    # what makes a config unreadable: tests/kernel_probe/anemoi/test_config_file.py
    p = tmp_path / "c.yaml"
    p.write_text("model: [1, 2\n")
    code, _, err = run(["check-config", p], capsys)
    assert code == 5 and "not valid YAML at line" in err and "Traceback" not in err
