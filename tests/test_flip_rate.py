"""benchmarks/flip_rate.py (issue 56): the winner flip rate of cold probes under a CPU hog, before
and after in one run. Its arithmetic here; its smallest run in the slow lane, so it cannot rot."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("flip_rate", ROOT / "benchmarks" / "flip_rate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(winner: str, ratios: dict[str, float], recorded: dict | None = None) -> dict:
    return {"Attention": {"winner": winner, "ratios": ratios, "recorded": recorded or {}}}


def test_the_flip_rate_counts_the_probes_off_the_most_common_winner():
    flip_rate = _script().flip_rate
    assert flip_rate(["a"] * 10) == (0, "a")
    assert flip_rate(["a"] * 9 + ["b"]) == (1, "a")
    assert flip_rate(["b", "a", "a", "b", "b"]) == (2, "b")
    assert flip_rate([]) == (0, "")


def test_the_summary_names_winners_ratios_and_recorded_intervals():
    runs = [
        run("torch.sdpa", {"torch.sdpa.flash": 0.98}),
        run("torch.sdpa.flash", {"torch.sdpa.flash": 1.30}, {"torch.sdpa.flash": {"ratio": 1.3}}),
        run("torch.sdpa", {"torch.sdpa.flash": 1.02}),
    ]
    lines = _script().summary(runs)
    assert lines[0] == (
        "  Attention: flip rate 1/3 (most often torch.sdpa; torch.sdpa x2, torch.sdpa.flash x1)"
    )
    assert lines[1].startswith("    torch.sdpa.flash: default / it 1.020 (range 0.980-1.300 over 3")
    assert "recorded: {'ratio': 1.3}" in lines[1]


@pytest.mark.slow
def test_the_smallest_run_prints_both_trees(capsys, monkeypatch):
    if subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True
    ).returncode:
        pytest.skip("not a git checkout: the 'before' tree is exported with git archive")
    script = _script()
    started = []
    start = script.launch.start

    def recorded(argv, **kw):
        started.append((list(argv), start(argv, **kw)))
        return started[-1][1]

    monkeypatch.setattr(script.launch, "start", recorded)
    argv = ["--runs", "1", "--before", "HEAD", "--slots", "LayerNorm", "--shape", "64x32"]
    assert script.main([*argv, "--", "--precision", "32-true"]) == 0
    out = capsys.readouterr().out
    assert "hog: one core busy" in out and "before: HEAD (git archive)" in out
    assert out.count("LayerNorm: flip rate 0/1 (most often torch.layer_norm") == 2
    (hog,) = [proc for argv, proc in started if script.HOG in argv]
    assert hog.returncode is not None  # the hog was killed and reaped
