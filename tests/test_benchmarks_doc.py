"""docs/benchmarks.md's CPU plot: drawn by benchmarks/timing_plot.py from committed data that names
its command and machine; every slot has a series at every shape (issue 37)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location(
        "timing_plot", ROOT / "benchmarks" / "timing_plot.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_plot_has_its_data_command_and_machine():
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "](img/cpu-timing.svg)" in doc and "benchmarks/timing_plot.py --run" in doc
    assert (ROOT / "docs" / "img" / "cpu-timing.svg").read_text().lstrip().startswith("<?xml")
    data = json.loads((ROOT / "docs" / "data" / "cpu-timing.json").read_text())
    assert data["machine"]["command"].startswith("kernel-probe ") and data["machine"]["cores"] >= 1
    series = _script().series(data)
    assert set(series) == {"LayerNorm", "RMSNorm", "Linear"}
    for slot, cands in series.items():
        chosen = cands[data["slots"][slot]["chosen"]]
        assert set(chosen) == set(data["shapes"]) and all(ms > 0 for ms in chosen.values())


@pytest.mark.slow
def test_the_plot_is_drawn_from_the_data(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots extra (matplotlib) is not installed")
    data = json.loads((ROOT / "docs" / "data" / "cpu-timing.json").read_text())
    _script().plot(data, tmp_path / "plot.svg")
    assert (tmp_path / "plot.svg").stat().st_size > 10_000
