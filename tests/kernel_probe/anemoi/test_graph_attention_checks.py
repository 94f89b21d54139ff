"""check-config and export on graph_attention_backend (issue 39), per GraphTransformer component."""

from __future__ import annotations

import pytest

import kernel_lock
from kernel_probe.anemoi.components import export_setting, overlay_settings
from kernel_probe.anemoi.components import graph_components as components
from kernel_probe.anemoi.components import graph_findings as findings
from tests.conftest import MINIMAL_LOCK

PROCESSOR = "anemoi.models.layers.processor.GraphTransformerProcessor"
FORWARD = "anemoi.models.layers.mapper.GraphTransformerForwardMapper"
GPU, CPU = {"device-type": "cuda"}, {"device-type": "cpu"}


def tree(processor=None, encoder=None, decoder=None):
    def comp(target, value):
        return {"_target_": target, **({} if value is None else {"graph_attention_backend": value})}

    return {
        "model": {
            "processor": comp(PROCESSOR, processor),
            "encoders": {"0": {"mapper": comp(FORWARD, encoder)}},
            "decoders": {
                "0": {"mapper": {"graph_attention_backend": decoder or "triton", "_target_": "x.Y"}}
            },
        }
    }


def lock(table: str | None) -> kernel_lock.KernelLock:
    text = MINIMAL_LOCK + (f"\n[graph-attention]\n{table}" if table else "")
    return kernel_lock.loads(text, emit_warnings=False)


def where(found, severity="error"):
    return sorted(f.where for f in found if f.severity == severity)


def test_components_are_the_gt_targets_and_any_mapping_that_sets_the_key():
    assert [w for w, _ in components(tree())] == [
        "model.processor",
        "model.encoders.0.mapper",
        "model.decoders.0.mapper",
    ]


def test_a_backend_anemoi_does_not_know_is_an_error_in_anemois_words():
    found = findings(tree(encoder="cuda"), None, GPU)
    assert where(found) == ["model.encoders.0.mapper.graph_attention_backend"]
    assert "Backend 'cuda' not supported for GraphTransformerBlock" in found[0].problem


def test_each_component_that_contradicts_the_lock_is_an_error():
    found = findings(tree(processor="triton", encoder="pyg"), lock('backend = "pyg"\n'), CPU)
    # the processor says triton; the decoder leaves it unset: anemoi's default, triton
    assert where(found) == [
        "model.decoders.0.mapper.graph_attention_backend",
        "model.processor.graph_attention_backend",
    ]
    assert all(
        f.kind == "lock" and "--graph-attention" in f.fix for f in found if f.severity == "error"
    )
    unset = findings(
        tree(processor=None, encoder="pyg", decoder="pyg"), lock('backend = "pyg"\n'), CPU
    )
    assert (
        where(unset) == ["model.processor.graph_attention_backend"]
        and "anemoi's default triton" in unset[0].problem
    )


def test_a_triton_config_on_a_machine_that_falls_back_is_a_warning_without_a_lock():
    found = findings(tree("triton", "triton", "triton"), None, CPU)
    assert where(found) == [] and len(where(found, "warning")) == 3
    assert "falls back to pyg here: there is no GPU" in found[0].problem
    allowed = findings(
        tree("triton", "triton", "triton"), lock('backend = "triton"\nallow-fallback = true\n'), CPU
    )
    assert where(allowed) == [] and len(where(allowed, "note")) == 3


def test_a_locked_triton_on_a_gpu_with_triton_is_clean(monkeypatch):
    from kernel_lock import graph_attention

    monkeypatch.setattr(graph_attention, "triton_installed", lambda: True)
    assert findings(tree("triton", "triton", "triton"), lock('backend = "triton"\n'), GPU) == []
    monkeypatch.setattr(graph_attention, "triton_installed", lambda: False)
    assert len(where(findings(tree("triton", "triton", "triton"), None, GPU), "warning")) == 3


def test_interpolations_are_left_to_composition():
    assert (
        findings(
            tree(processor="${model.backend}", encoder="pyg", decoder="pyg"),
            lock('backend = "pyg"\n'),
            CPU,
        )
        == []
    )


@pytest.mark.parametrize("model_file", [True, False])
def test_export_sets_every_component_relative_to_the_model_node(model_file):
    t = tree()
    settings = overlay_settings(
        t["model"] if model_file else t,
        lock('backend = "pyg"\nreason = "r"\n'),
        model_file=model_file,
    )
    assert settings == {"processor": "pyg", "encoders.0.mapper": "pyg", "decoders.0.mapper": "pyg"}
    assert (
        export_setting(lock(None)) is None
        and overlay_settings(t, lock(None), model_file=False) == {}
    )
    backend, note = export_setting(
        lock('backend = "triton"\nallow-fallback = true\nreason = "r"\n')
    )
    assert backend == "triton" and "the lock allows it" in note
