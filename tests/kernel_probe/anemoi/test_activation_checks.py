"""check-config on layer_kernels.Activation: a block whose Activation contradicts the lock's
(another class, the other GELU, per component), a GLU-family class refused with anemoi's own words,
and a real preset checked against a lock that pins the tanh GELU."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest

import kernel_lock
from kernel_lock.anemoi import GLU_REFUSAL, Exported
from kernel_probe.anemoi.checks import compare_with_lock
from kernel_probe.anemoi.config import Block
from kernel_probe.anemoi.entries import check_entry
from tests.conftest import MINIMAL_LOCK, write_sealed

ERF = Exported(
    "Activation",
    {"_target_": "torch.nn.GELU", "approximate": "none"},
    "the model's function gelu-erf",
)
FACTS = {"Activation": {"defaults": {"approximate": "none"}}}
W = "model.processor.layer_kernels"


@pytest.mark.parametrize(
    "content,found",
    [
        ({}, []),  # anemoi's default torch.nn.GELU() is the lock's erf GELU
        ({"Activation": {"_target_": "torch.nn.GELU"}}, []),
        (
            {"Activation": {"_target_": "torch.nn.GELU", "approximate": "tanh"}},
            [(f"{W}.Activation.approximate", "approximate is 'tanh', the lock pins 'none'")],
        ),
        (
            {"Activation": {"_target_": "torch.nn.SiLU"}},
            [
                (
                    f"{W}.Activation",
                    "builds torch.nn.SiLU, the lock pins torch.nn.GELU (the model's function "
                    "gelu-erf)",
                )
            ],
        ),
    ],
    ids=["default", "same", "tanh", "silu"],
)
def test_an_activation_contradicting_the_lock_is_an_error(content, found):
    got = compare_with_lock(Block(W, content=content), {"Activation": ERF}, FACTS)
    assert [(f.severity, f.kind, f.where) for f in got] == [
        ("error", "lock", where) for where, _ in found
    ]
    for f, (_, words) in zip(got, found, strict=True):
        assert words in f.problem, f.problem


@pytest.mark.parametrize("target", ["kp_activation.SwiGLUish", "torch.nn.GLU"])
def test_a_glu_class_is_refused_with_anemois_own_words(target):
    findings, _ = check_entry("Activation", {"_target_": target}, f"{W}.Activation")
    [f] = [f for f in findings if f.kind == "semantics"]
    assert f.severity == "error" and f.problem.endswith(
        f"anemoi-models raises ValueError: {GLU_REFUSAL}"
    )
    assert "mlp_implementation" in f.fix


def test_an_elementwise_activation_entry_passes():
    findings, facts = check_entry(
        "Activation", {"_target_": "torch.nn.GELU", "approximate": "tanh"}, W
    )
    assert [f for f in findings if f.severity == "error"] == [] and facts["defaults"] == {
        "approximate": "none"
    }


TANH_SLOT = """
[slots.Activation]
implementation = "torch.gelu_tanh"
target = "torch.nn.GELU"
semantics = "activation"
function = "gelu-tanh"
kwargs = { approximate = "tanh" }
"""


@pytest.mark.anemoi
@pytest.mark.slow
def test_a_preset_against_a_tanh_lock_is_compared_per_component(tmp_path):
    """graphtransformer.yaml as installed, its processor given its own block that agrees with the
    lock: the model-wide block (anemoi's default erf GELU) is refused, the processor's is not."""
    pytest.importorskip(
        "hydra", reason="hydra-core is not installed; `bash .ci/anemoi-install` installs it"
    )
    pytest.importorskip(
        "anemoi.training", reason="anemoi-training is not installed (`bash .ci/anemoi-install`)"
    )
    import yaml

    from kernel_probe.anemoi.pipelines import check_config

    preset = (
        Path(str(importlib.resources.files("anemoi.training") / "config"))
        / "model"
        / "graphtransformer.yaml"
    )
    data = yaml.safe_load(preset.read_text())
    shared = dict(data["layer_kernels"])
    data["processor"]["layer_kernels"] = {
        **shared,
        "Activation": {"_target_": "torch.nn.GELU", "approximate": "tanh"},
    }
    mine = tmp_path / "model" / preset.name
    mine.parent.mkdir()
    mine.write_text(yaml.safe_dump(data, sort_keys=False))
    lock = kernel_lock.load(write_sealed(tmp_path / "lock.toml", MINIMAL_LOCK + TANH_SLOT))
    result = check_config(mine, lock=lock)
    wrong = [
        (f.where, f.problem)
        for f in result.findings
        if f.severity == "error" and "Activation" in f.where
    ]
    assert result.exit_code == 3
    assert wrong == [
        (
            "model.layer_kernels.Activation.approximate",
            "approximate is not set (default 'none'), the lock pins 'tanh'",
        )
    ]
