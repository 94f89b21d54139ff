"""``kernel_probe.anemoi.model.build(CONFIG)``, the builder behind ``anemoi:CONFIG``, on the meta
device: every model preset anemoi-training 0.17.1 ships (read from the installed package) either
builds at its real sizes and runs a forward and backward, or is refused with the reason; the model
built is anemoi-training's own (the same modules under the same names as the whole model
tests/anemoi_build.py builds on a real 40-node graph)."""

from __future__ import annotations

import importlib.resources
import warnings
from pathlib import Path

import pytest

pytest.importorskip("hydra", reason="hydra-core is not installed; `bash .ci/anemoi-install`")
pytest.importorskip(
    "anemoi.training", reason="anemoi-training is not installed; `bash .ci/anemoi-install`"
)
pytest.importorskip(
    "torch_geometric", reason="torch-geometric is not installed; `bash .ci/anemoi-install`"
)
pytestmark = [pytest.mark.anemoi, pytest.mark.slow]

import torch  # noqa: E402

from kernel_probe.anemoi import model as anemoi_model  # noqa: E402
from kernel_probe.errors import InputFileError  # noqa: E402
from tests import anemoi_build  # noqa: E402

PRESETS = sorted(
    p.stem
    for p in Path(str(importlib.resources.files("anemoi.training") / "config" / "model")).glob(
        "*.yaml"
    )
)
# (data nodes, hidden nodes) of the presets that build: as composed with the config that ships them
BUILDS = {
    "gnn": (542_080, 10_242),  # config.yaml: the dataset is `???`: N320 assumed; TriNodes r5
    "graphtransformer": (542_080, 10_242),
    "transformer_ens": (40_320, 10_944),  # ensemble_crps.yaml: an o96 dataset; an o48 hidden grid
}
# why the others are refused: anemoi-training 0.17.1's own schema, or what the builder does not do
REFUSED = {
    "transformer": "schema rejects it",
    "point_wise": "schema rejects it",
    "transformer_transformermapper": "schema rejects it",
    "graphtransformer_ens": "not a forecaster",
}


def _built(config: str):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with torch.device("meta"):
            model, args, kwargs = anemoi_model.build(config)
            out = model(*args, **kwargs)
            sum(o.float().sum() for o in out.values()).backward()
    return model, args, kwargs, out, [str(w.message) for w in said]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_shipped_preset_builds_at_its_real_sizes_or_is_refused_saying_why(preset):
    if preset not in BUILDS:
        with pytest.raises(InputFileError) as caught:
            _built(preset)
        text = str(caught.value)
        assert text.startswith(preset) and caught.value.fix
        expected = REFUSED.get(preset, "transport" if "transport" in preset else "")
        assert expected in text or "cannot" in text, text
        return
    model, (batch,), kwargs, out, said = _built(preset)
    from anemoi.models.interface import AnemoiModelInterface

    assert type(model) is AnemoiModelInterface
    data, hidden = BUILDS[preset]
    assert batch["data"].shape[3] == data and batch["data"].device.type == "meta"
    assert out["data"].shape[3] == data
    assert model.model.node_attributes.num_nodes["hidden"] == hidden
    assert all(p.device.type == "meta" for p in model.model.parameters())
    assert all(p.grad is not None for p in model.model.parameters() if p.requires_grad)
    assert kwargs == ({"fcstep": 0} if preset.endswith("_ens") else {})
    if preset == "gnn":
        assert any("N320 (542,080 nodes, AIFS's data grid) assumed" in s for s in said)


def test_the_transformer_overlay_builds_with_the_preset_window_and_heads(tmp_path):
    """The user's transformer overlay (anemoi-training's two drift keys set, tests/anemoi_build.py)
    builds, its processor attention is the preset's, called through the Attention slot's module
    with the preset's window (which the trace then records: anemoi's SDPA path says it only as a
    boolean mask)."""
    from kernel_lock.attention import SDPAttention

    path = anemoi_build.write_overlay(tmp_path / "transformer.yaml", "transformer")
    model, (batch,), _, _, _ = _built(str(path))
    proc = model.model.processor
    attention = [m for m in proc.modules() if type(m).__name__ == "MultiHeadSelfAttention"]
    assert attention and all(a.num_heads == 16 and a.window_size == 512 for a in attention)
    slots = [a.attention.slot for a in attention]
    assert all(type(s) is SDPAttention and s.window == 512 and not s.causal for s in slots)
    assert not any(True for a in attention for _ in a.attention.state_dict())
    # encoder_decoder_only's hidden grid: o48
    assert model.model.node_attributes.num_nodes["hidden"] == 10_944


def test_the_model_built_is_the_one_anemoi_training_builds(tmp_path):
    """Same modules, same classes, same names as the whole model built on a real (tiny) graph the
    way anemoi-training builds it; only the sizes differ."""
    path = anemoi_build.write_overlay(tmp_path / "gnn.yaml", "gnn")
    real, _ = anemoi_build.build(anemoi_build.validated(anemoi_build.compose_file(path)))
    traced, *_ = _built(str(path))

    def layout(m: torch.nn.Module) -> list[tuple[str, str]]:
        return [(n, type(x).__qualname__) for n, x in m.named_modules()]

    assert layout(traced) == layout(real)
    assert sorted(traced.state_dict()) == sorted(real.state_dict())


def test_a_name_that_is_no_config_is_refused_listing_the_shipped_ones():
    with pytest.raises(InputFileError) as caught:
        anemoi_model.build("transfomer")
    assert "transfomer" in str(caught.value) and "transformer_ens" in (caught.value.fix or "")


def test_a_shipped_model_file_by_its_path_is_read_as_its_name_is():
    """The packaged file itself (config/model/graphtransformer.yaml, in its model/ directory): a
    preset composed as training composes it, the same model as by name."""
    path = Path(str(importlib.resources.files("anemoi.training") / "config" / "model"))
    by_path, *_ = _built(str(path / "graphtransformer.yaml"))
    by_name, *_ = _built("graphtransformer")
    assert sorted(by_path.state_dict()) == sorted(by_name.state_dict())


def test_the_trace_names_the_activation_the_config_sets(tmp_path):
    """The config's ``layer_kernels.Activation`` reaches the trace as the function it computes
    (what `--activation` declared before --model), in the probe's default regime."""
    import yaml

    from kernel_probe.model import trace

    path = anemoi_build.write_overlay(tmp_path / "gnn.yaml", "gnn")
    body = yaml.safe_load(path.read_text())
    body["model"]["layer_kernels"] = {"Activation": {"_target_": "torch.nn.SiLU"}}
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    model = trace(f"anemoi:{path}", precision="bf16-mixed")
    assert model.traced == "meta"
    modules = [s for s in model.by_slot()["Activation"] if s.kind == "module"]
    assert modules and {(s.call, s.semantics["function"]) for s in modules} == {
        ("torch.nn.SiLU", "silu")
    }


@pytest.mark.parametrize("preset", sorted(BUILDS))
def test_the_real_size_trace_of_each_preset_that_builds(preset):
    """``kernel-probe model anemoi:<preset>``: in its child, on the meta device, in the probe's
    default regime (bf16-mixed: anemoi's checkpointed blocks included), at the preset's own sizes;
    the ensemble transformer's processor attention with its window."""
    from kernel_probe.model import trace

    model = trace(f"anemoi:{preset}", precision="bf16-mixed")
    assert model.traced == "meta" and model.intact
    slots = model.by_slot()
    assert {"LayerNorm", "Linear", "Activation"} <= set(slots)
    data, hidden = BUILDS[preset]
    attention = slots.get("Attention", ())
    if preset == "transformer_ens":  # 16 heads over O48's hidden nodes, window 512
        assert attention and all(
            s.kind == "module"
            and (s.semantics["heads"], s.semantics["seq_q"], s.semantics["window"])
            == (16, hidden, 512)
            for s in attention
        )
    else:
        assert not attention
