"""docs/anemoi.md's recipe, end to end, exit 0 (issue 53): the probe declares what the config
describes (``kernel_probe.anemoi.model.declaration``: the processor's heads, head_dim, hidden
nodes and window), ``export --format anemoi --config`` writes the overlay, merged in as the docs
say, and ``check-config --lock`` passes. On the presets anemoi-training 0.17.1's schema accepts
with its default config (gnn, graphtransformer), and transformer with the two keys its preset lacks
(tests/anemoi_build.py), its own ``flash_attention`` and ``window_size: 512`` kept in the overlay:
before, the lock had no window and check-config failed on ``window_size`` and
``attention_implementation``. The hidden grid is O16 (1,600 nodes) so that a CPU times the
attention in seconds; at the preset's own size a CPU refuses it, saying why
(tests/kernel_probe/probe/test_attention.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("hydra", reason="hydra-core is not installed; `bash .ci/anemoi-install`")
pytest.importorskip(
    "anemoi.training", reason="anemoi-training is not installed; `bash .ci/anemoi-install`"
)
pytestmark = [pytest.mark.anemoi, pytest.mark.slow]

from kernel_probe.anemoi.model import declaration  # noqa: E402
from tests.anemoi_build import deep_merge, write_overlay  # noqa: E402
from tests.conftest import run_cli  # noqa: E402


def users_config(tmp_path: Path, preset: str) -> Path:
    """The user's overlay: anemoi-training's defaults with ``model: <preset>``, small; for the
    transformer its preset's attention as shipped (flash_attention, window 512) on an O16 grid."""
    path = write_overlay(tmp_path / f"{preset}.yaml", preset)
    body = yaml.safe_load(path.read_text())
    if preset == "transformer":
        del body["model"]["processor"]["attention_implementation"]  # the preset's flash_attention
        body["graph"] = {"nodes": {"hidden": {"node_builder": {"grid": "o16"}}}}
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.mark.parametrize("preset", ["gnn", "graphtransformer", "transformer"])
def test_the_docs_recipe_ends_in_exit_0(tmp_path, capsys, preset):
    config, lock = users_config(tmp_path, preset), tmp_path / "kernel-lock.toml"
    declared = declaration(str(config))
    if preset == "transformer":  # 16 heads of 32 / 16 channels over O16's 1,600 nodes, window 512
        assert declared == {"--attention": "16x2x1600:window=512"}
    else:
        assert declared == {}
    flags = [arg for item in declared.items() for arg in item]
    code, _, err = run_cli(["--out", lock, *flags, "--reps", "2"], capsys)
    assert code == 0, err
    code, overlay, err = run_cli(["export", lock, "--format", "anemoi", "--config", config], capsys)
    assert code == 0, err
    merged = deep_merge(yaml.safe_load(config.read_text()), yaml.safe_load(overlay))
    if preset == "transformer":
        processor = merged["model"]["processor"]
        assert processor["attention_implementation"] == "scaled_dot_product_attention"
        assert "window_size" not in processor  # the preset's 512 stays: the overlay never sets it
    config.write_text(yaml.safe_dump(merged, sort_keys=False))
    code, out, err = run_cli(["check-config", config, "--lock", lock], capsys)
    assert code == 0, out + err
    assert "0 error(s)" in out
