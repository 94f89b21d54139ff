"""The GatedMLP slot and anemoi: export writes mlp_implementation where anemoi-training's configs
keep it, check-config compares it per component and refuses a contradiction, and the lock's gate
formula is read strictly. The configs are read from the installed anemoi-training package."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest
import yaml

import kernel_lock
from kernel_lock.anemoi import gated_mlp_export
from kernel_lock.errors import LockFormatError
from kernel_probe.anemoi.components import gated_components as components
from kernel_probe.anemoi.components import gated_findings as findings
from tests.conftest import MINIMAL_LOCK

pytest.importorskip("anemoi.training", reason="anemoi-training is installed with the test extras")
CONFIG_DIR = Path(str(importlib.resources.files("anemoi.training") / "config"))
# where anemoi-training's transformer preset sets mlp_implementation (the model file is the model
# node)
COMPONENTS = ["processor", "encoders.0.mapper", "decoders.0.mapper"]


def gated(
    implementation="geglu",
    gate="gelu_erf(gate_proj(x)) * value_proj(x)",
    target="kernel_lock.gated_mlp.GatedMLP",
):
    return (
        "\n[slots.GatedMLP]\n"
        'implementation = "torch.gated_mlp"\n'
        f'target = "{target}"\n'
        'semantics = "gated_mlp"\n'
        f'kwargs = {{ mlp_implementation = "{implementation}", bias = true }}\n'
        + (f'gate = "{gate}"\n' if gate is not None else "")
    )


def lock(text=""):
    return kernel_lock.loads(MINIMAL_LOCK + text, emit_warnings=False)


def preset(name="transformer"):
    return yaml.safe_load((CONFIG_DIR / "model" / f"{name}.yaml").read_text())


def test_the_presets_set_it_on_the_processor_and_each_mapper():
    assert [w for w, _ in components(preset())] == COMPONENTS
    assert [w for w, _ in components(preset("gnn"))] == COMPONENTS
    assert all(c["mlp_implementation"] == "mlp" for _, c in components(preset()))


def test_a_preset_that_contradicts_the_lock_is_refused_per_component():
    got = findings(preset(), lock(gated()))
    assert [(f.severity, f.kind, f.where) for f in got] == [
        ("error", "lock", f"{w}.mlp_implementation") for w in COMPONENTS
    ]
    assert "checked geglu (gelu_erf(gate_proj(x)) * value_proj(x))" in got[0].problem
    assert "builds a Linear and the Activation slot (mlp), no gated layer" in got[0].problem
    tree = preset()
    tree["processor"]["mlp_implementation"] = "swiglu"
    [one, *_] = findings(tree, lock(gated()))
    assert one.where == "processor.mlp_implementation" and one.problem.endswith(
        "this component builds swiglu"
    )
    assert "--mlp-implementation swiglu" in one.fix


def test_what_export_writes_satisfies_check_config():
    from kernel_probe.anemoi.pipelines import export_for_config

    the_lock = lock(gated())
    result = export_for_config(the_lock, CONFIG_DIR / "model" / "transformer.yaml", compose=False)
    overlay = result.overlay()
    assert overlay["processor"] == {"mlp_implementation": "geglu"}
    assert overlay["encoders"]["0"]["mapper"] == {"mlp_implementation": "geglu"}
    assert overlay["decoders"]["0"]["mapper"] == {"mlp_implementation": "geglu"}
    tree = preset()
    for where in COMPONENTS:
        node = tree
        for part in where.split("."):
            node = node[part]
        node["mlp_implementation"] = "geglu"
    assert findings(tree, the_lock) == []


def test_a_gated_model_with_a_lock_that_never_checked_it_is_warned():
    tree = preset()
    tree["processor"]["mlp_implementation"] = "reglu"
    [warning] = findings(tree, lock())
    assert warning.severity == "warning" and warning.where == "processor.mlp_implementation"
    assert "--mlp-implementation reglu" in warning.fix
    assert findings(tree, None) == []  # no lock: nothing to compare with


def test_a_value_anemoi_rejects_is_refused_in_anemois_words():
    from anemoi.models.layers.mlp import _build_gating_activation

    with pytest.raises(ValueError) as anemoi:
        _build_gating_activation("swish")
    tree = preset()
    tree["processor"]["mlp_implementation"] = "swish"
    [error] = findings(tree, None)
    assert error.problem == f"anemoi raises: {anemoi.value}"


def test_export_notes_a_kernel_anemoi_cannot_build_itself():
    options, note = gated_mlp_export(lock(gated(target="kernel_lock.gated_mlp.CompiledGatedMLP")))
    assert options == {"mlp_implementation": "geglu"}
    assert "swap_gated_layers" in note
    assert gated_mlp_export(lock()) is None


@pytest.mark.parametrize(
    "text,where,words",
    [
        (
            gated(gate="silu(gate_proj(x)) * value_proj(x)"),
            "slots.GatedMLP.gate",
            "is not what mlp_implementation 'geglu' computes",
        ),
        (gated(gate=None), "slots.GatedMLP.gate", "missing"),
        (
            gated(implementation="mlp"),
            "slots.GatedMLP.kwargs.mlp_implementation",
            "'mlp' is not a gated MLP",
        ),
    ],
)
def test_the_locks_gate_is_read_strictly(text, where, words):
    with pytest.raises(LockFormatError) as exc:
        lock(text)
    assert where in str(exc.value) and words in str(exc.value)


def test_only_the_gated_slot_records_a_gate():
    text = MINIMAL_LOCK.replace(
        "kwargs = { bias = false }", 'kwargs = { bias = false }\ngate = "x"'
    )
    with pytest.raises(LockFormatError, match="only the GatedMLP slot records a gate formula"):
        kernel_lock.loads(text, emit_warnings=False)


def test_a_lock_pins_the_class_and_its_gate():
    the_lock = lock(gated())
    assert the_lock.slots["GatedMLP"].extra["gate"] == "gelu_erf(gate_proj(x)) * value_proj(x)"
    assert the_lock.slots["GatedMLP"].to_dict()["gate"] == "gelu_erf(gate_proj(x)) * value_proj(x)"
    f = the_lock.factory("GatedMLP")
    layer = f(16, 24)
    assert layer.mlp_implementation == "geglu"
    assert list(layer.state_dict()) == [
        "gate_proj.weight",
        "gate_proj.bias",
        "value_proj.weight",
        "value_proj.bias",
    ]


def test_the_export_command_prints_it_for_the_components(tmp_path, capsys):
    import json

    from tests.conftest import run_cli

    path = tmp_path / "kernel-lock.toml"
    path.write_text(MINIMAL_LOCK + gated())
    code, out, err = run_cli(["export", path, "--format", "anemoi", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["gated_mlp"]["options"] == {"mlp_implementation": "geglu"}
    code, out, err = run_cli(["export", path, "--format", "anemoi"], capsys)
    assert code == 0, err
    block = yaml.safe_load(out.split("# GatedMLP (slots.GatedMLP)", 1)[1].split("\n", 1)[1])
    assert block == {"processor": {"mlp_implementation": "geglu"}}
    code, out, err = run_cli(
        ["export", path, "--config", CONFIG_DIR / "model" / "gnn.yaml", "--json"], capsys
    )
    assert code == 0, err
    overlay = json.loads(out)["overlay"]
    assert overlay["processor"]["mlp_implementation"] == "geglu"
    assert overlay["encoders"]["0"]["mapper"]["mlp_implementation"] == "geglu"
