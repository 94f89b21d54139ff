"""docs/anemoi.md's recipe, end to end, exit 0 (issue 53): ``kernel-probe --model anemoi:CONFIG``
traces the model the config describes and probes each slot with its semantics at its shapes,
``export --format anemoi --config`` writes the overlay, merged in as the docs say, and
``check-config --lock`` passes. On the presets anemoi-training 0.17.1's schema accepts with its
default config (gnn, graphtransformer), and transformer with the two keys its preset lacks
(tests/anemoi_build.py), its own ``flash_attention`` and ``window_size: 512`` kept: the trace
records the window (the processor's attention through the Attention slot's module), the lock pins
it, and check-config agrees (before, the lock had no window and check-config failed on
``window_size``). The config is the preset composed as shipped with only the sizes a CPU can time
in seconds: an O16 dataset (1,600 data nodes), a small hidden grid (TriNodes r2, or O16 for the
transformer), 32 channels and 2 layers; at the presets' own sizes a CPU refuses the attention,
saying why (tests/kernel_probe/probe/test_attention.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("hydra", reason="hydra-core is not installed; `bash .ci/anemoi-install`")
pytest.importorskip(
    "anemoi.training", reason="anemoi-training is not installed; `bash .ci/anemoi-install`"
)
pytestmark = [pytest.mark.anemoi, pytest.mark.slow]

import kernel_lock  # noqa: E402
from tests.anemoi_build import CPU_HEADS, deep_merge, write_overlay  # noqa: E402
from tests.conftest import run_cli  # noqa: E402

# a dataset name carrying its grid (kernel_probe.anemoi.grids): O16's 4 * 16 * 25 = 1,600 points
DATASET = "/nonexistent/aifs-o16-unused.zarr"


def users_config(tmp_path: Path, preset: str) -> Path:
    """The user's overlay: anemoi-training's defaults with ``model: <preset>``, CPU-sized; for the
    transformer its preset's attention as shipped (flash_attention, window 512) with CPU_HEADS
    heads."""
    path = write_overlay(tmp_path / f"{preset}.yaml", preset)
    body = yaml.safe_load(path.read_text())
    body["system"]["input"]["dataset"] = DATASET
    hidden: dict[str, object] = {"resolution": 2}  # multi_scale's TriNodes: 162 nodes
    if preset == "transformer":
        del body["model"]["processor"]["attention_implementation"]  # the preset's flash_attention
        body["model"]["processor"]["num_heads"] = CPU_HEADS
        hidden = {"grid": "o16"}  # encoder_decoder_only's reduced Gaussian grid: 1,600 nodes
    body["graph"] = {"nodes": {"hidden": {"node_builder": hidden}}}
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.mark.parametrize("preset", ["gnn", "graphtransformer", "transformer"])
def test_the_docs_recipe_ends_in_exit_0(tmp_path, capsys, preset):
    config, lock = users_config(tmp_path, preset), tmp_path / "kernel-lock.toml"
    code, _, err = run_cli(["--model", f"anemoi:{config}", "--out", lock], capsys)
    assert code == 0, err
    written = kernel_lock.load(lock)
    assert written.model is not None and written.model.spec == f"anemoi:{config}"
    attention = [s for s in written.model.sites if s.slot == "Attention"]
    if preset == "transformer":  # 2 heads of 32 / 2 channels over O16's 1,600 nodes
        assert len(attention) == 2 and all(
            s.kind == "module" and s.semantics["window"] == 512 and s.semantics["seq_q"] == 1600
            for s in attention
        )
        assert written.slots["Attention"].kwargs["window"] == 512
    else:
        assert not attention and "Attention" not in written.slots
    code, overlay, err = run_cli(["export", lock, "--format", "anemoi", "--config", config], capsys)
    assert code == 0, err
    merged = deep_merge(yaml.safe_load(config.read_text()), yaml.safe_load(overlay))
    if preset == "transformer":
        processor = merged["model"]["processor"]
        assert processor["attention_implementation"] == "scaled_dot_product_attention"
        assert processor.get("window_size", 512) == 512  # the preset's, as the lock checked
    config.write_text(yaml.safe_dump(merged, sort_keys=False))
    code, out, err = run_cli(["check-config", config, "--lock", lock], capsys)
    assert code == 0, out + err
    assert "0 error(s)" in out
