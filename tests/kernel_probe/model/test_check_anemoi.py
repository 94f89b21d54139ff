"""check-model on anemoi's models (issue 54): anemoi-training's gnn, graphtransformer and
transformer presets, read from the installed package, at check-model's CPU-sized grid (an O16
dataset, 1,600 nodes; hidden nodes: an icosahedron r2, 162, or O16 for the transformer), run to a
verdict: the CPU build fills the graph with seeded values, every edge index in range (before:
uninitialised memory, an IndexError in the first forward, the check recorded "not run")."""

from __future__ import annotations

import pytest

from tests.conftest import needs_anemoi

pytest.importorskip("anemoi.training", reason="anemoi-training is not installed (its presets)")
pytestmark = [pytest.mark.anemoi, pytest.mark.slow, needs_anemoi]

from kernel_probe.model.check import check  # noqa: E402
from tests.anemoi_build import write_sized  # noqa: E402
from tests.kernel_probe.model.test_check import layer_norm_lock  # noqa: E402


@pytest.mark.parametrize("preset", ["gnn", "graphtransformer", "transformer"])
def test_check_model_runs_to_a_verdict_on_each_preset_at_a_cpu_grid(preset, tmp_path):
    """Correct float32 LayerNorm and Linear classes of another package (kp_zoo's two-pass
    GoodLayerNorm, GoodLinear) on every site anemoi builds from ``layer_kernels``: each phase
    agrees; the synthetic graph is said."""
    config = write_sized(tmp_path / "training.yaml", preset)
    path = tmp_path / "kernel-lock.toml"
    lock = layer_norm_lock("kp_zoo.norms.GoodLayerNorm", path, "kp_zoo.norms.GoodLinear")
    timed = preset == "gnn"  # the step timed on one preset (the cheapest); the others: verdicts
    result = check(f"anemoi:{config}", str(lock), steps=1, trust=["kp_zoo"], timing=timed)
    assert result.verdict == "agree", result.first
    assert len(result.phases) == 6 and result.sites
    assert all(s.split(".")[0] == "model" for s in result.sites)
    assert result.timing is None if not timed else result.timing["rounds"] >= 3, result.timing
    assert any("the graph is synthetic" in n for n in result.notes), result.notes
