"""kernel_probe.probe.repetitions: the distribution-free interval of the paired rounds' median
ratio, and what it decides (the rounds themselves: test_rounds.py)."""

from __future__ import annotations

import math
import random

import pytest

from kernel_probe.probe import repetitions
from kernel_probe.probe.repetitions import Ratio


# ---- the confidence interval of a median ---------------------------------------------------------
@pytest.mark.parametrize(
    "n, k",
    [(1, 0), (2, 0), (6, 0), (7, 1), (8, 1), (10, 1), (11, 2), (12, 2), (20, 5)],
)
def test_the_median_interval_is_the_order_statistics_the_binomial_law_gives(n, k):
    samples = [float(i) for i in range(n, 0, -1)]  # given unsorted
    got = repetitions.median_interval(samples)
    tail = (1 - repetitions.LEVEL) / 2
    if k == 0:
        assert got is None
        # even (min, max) would cover the median less often than LEVEL
        assert math.comb(n, 0) / 2**n > tail
        return
    assert got == (float(k), float(n + 1 - k))
    cover = sum(math.comb(n, j) for j in range(k)) / 2**n  # P(Binomial(n, 1/2) < k)
    assert cover <= tail < cover + math.comb(n, k) / 2**n  # the largest k that keeps the level


def test_an_interval_takes_min_rounds():
    rows = [{"shape": "s", "pairs": [[1.0, 0.5]] * (repetitions.MIN_ROUNDS - 1)}]
    assert repetitions.paired(rows, ["s"]).interval is None
    rows[0]["pairs"].append([1.0, 0.5])
    assert repetitions.paired(rows, ["s"]).interval == (0.5, 0.5)


def _rows(pairs_at: dict[str, list[list[float]]]) -> list[dict]:
    return [{"shape": s, "median_ms": 1.0, "pairs": p} for s, p in pairs_at.items()]


def test_a_rounds_ratio_is_the_geometric_mean_or_the_models_time():
    rows = _rows({"a": [[1.0, 0.5], [2.0, 1.0]], "b": [[1.0, 2.0], [1.0, 2.0]]})
    assert repetitions.round_ratios(rows, ["a", "b"], None) == pytest.approx([1.0, 1.0])
    # the model calls b ten times as often: its time in the slot is mostly b's
    weighted = repetitions.round_ratios(rows, ["a", "b"], {"a": 1, "b": 10})
    assert weighted == pytest.approx([(0.5 + 20) / 11, (1.0 + 20) / 12])
    assert repetitions.round_ratios(rows, ["a", "c"], None) == []  # a shape without pairs
    assert repetitions.paired(_rows({"a": []}), ["a"]) is None


@pytest.mark.parametrize(
    "ratios, verdict",
    [
        ([0.80, 0.81, 0.79, 0.82, 0.80, 0.80, 0.81], "faster"),
        ([0.99, 1.01, 1.0, 0.98, 1.02, 1.0, 1.0], "same"),
        ([1.50, 1.52, 1.49, 1.5, 1.51, 1.5, 1.5], "slower"),
        ([1.0, 1.2, 1.0, 1.1, 1.0, 1.1, 1.0], "not faster"),
        ([0.80, 0.81, 0.79, 0.82, 0.80, 0.8], "undecided"),  # under MIN_ROUNDS: no interval
        ([0.5, 0.9, 0.6, 1.3, 0.6, 0.7, 0.6], "undecided"),  # one round on the other side
        ([0.06, 0.05, 1.1, 0.07, 0.06, 0.05, 0.06], "undecided"),  # the "16x" under load
    ],
)
def test_the_verdict_is_where_the_interval_lies(ratios, verdict):
    got = repetitions.paired(_rows({"s": [[1.0, r] for r in ratios]}), ["s"])
    assert got is not None and got.verdict == verdict and got.rounds == len(ratios)
    assert got.decided is (verdict != "undecided")


@pytest.mark.parametrize("seed", range(40))
def test_a_futile_candidate_would_not_have_been_faster_at_the_cap(seed):
    """The futility rule changes no decision: wherever it stops the rounds, the same rounds and
    any that the cap allowed after them would not have made the candidate faster; and the rounds
    it lets go on can still make it so."""
    rng = random.Random(seed)
    centre = rng.choice([0.85, 0.9, 0.93, 0.95, 1.0, 1.1])
    n = repetitions.MAX_ROUNDS
    ratios = [
        centre * rng.uniform(0.85, 1.15) * (rng.choice([0.1, 10]) if rng.random() < 0.1 else 1)
        for _ in range(n)
    ]
    for rounds in range(repetitions.MIN_ROUNDS, n + 1):
        got = repetitions.paired(_rows({"s": [[1.0, r] for r in ratios[:rounds]]}), ["s"])
        assert got is not None
        best = ratios[:rounds] + [1e-9] * (n - rounds)  # the best the rounds left could measure
        at_cap = repetitions.paired(_rows({"s": [[1.0, r] for r in best]}), ["s"])
        assert at_cap is not None
        assert got.futile is (got.verdict == "undecided" and at_cap.verdict != "faster")
        if got.futile:  # what the cap would have decided on the real rounds: not faster either
            real = repetitions.paired(_rows({"s": [[1.0, r] for r in ratios]}), ["s"])
            assert real is not None and real.verdict != "faster"
            break
    assert got.futile or got.verdict != "undecided"  # at the cap, undecided is futile


def test_said_names_the_ratio_its_interval_and_the_rounds():
    assert Ratio(0.5, None, 0).said() == (
        "time ratio 0.50 of the medians (no paired rounds: no interval)"
    )
    assert "1 paired round: too few" in Ratio(0.5, None, 1).said()
    assert Ratio(1.1, (1.06, 1.45), 6).said() == (
        "time ratio 1.10 (98 % interval 1.06-1.45, 6 paired rounds)"
    )


# ---- real probes: several accepted candidates, paired rounds ------------------------------
@pytest.mark.slow
@pytest.mark.timing  # a choice by measured speed: runs alone under pytest-xdist (conftest)
def test_two_consecutive_cold_probes_choose_the_same_in_every_slot(tmp_path):
    """Linear with a second correct candidate of the same speed (the case noise could flip),
    LayerNorm with a slower one, RMSNorm alone (one measured call): two cold probes (no lock to
    reuse) choose the same implementation in every slot, and each lock says how each candidate's
    repetitions were decided."""
    from kernel_lock import load
    from kernel_probe.cli import main

    argv = [
        "--precision",
        "32-true",
        "--shape",
        "512x128",
        "--candidate",
        "Linear=kp_fastlib.FastLinear",
        "--candidate",
        "LayerNorm=kp_fastlib.FastLayerNorm",
    ]
    locks = []
    for i in range(2):
        out = tmp_path / f"lock{i}.toml"
        assert main(["--out", str(out), *argv]) == 0
        locks.append(load(out))
    chosen = [{name: slot.implementation for name, slot in lock.slots.items()} for lock in locks]
    assert chosen[0] == chosen[1] and set(chosen[0]) == {
        "LayerNorm",
        "RMSNorm",
        "Linear",
        "Attention",
        "Activation",
    }
    for lock in locks:
        timed = {
            name: {t["implementation"]: t["timed"] for t in slot.timing}
            for name, slot in lock.slots.items()
        }
        assert timed["RMSNorm"] == {"torch.rms_norm": "sole candidate"}
        # the tanh GELU is refused for erf
        assert timed["Activation"] == {"torch.gelu": "sole candidate"}
        for slot, default, own in (
            ("Linear", "torch.linear", "custom:kp_fastlib.FastLinear"),
            ("LayerNorm", "torch.layer_norm", "custom:kp_fastlib.FastLayerNorm"),
        ):
            # the other is timed against the default in paired rounds until decided, or undecided
            # when no round left could make it faster or the slot's budget ran out; each row
            # records its load
            assert timed[slot][default] == "default"
            assert timed[slot][own] in ("decided", "futile", "budget")
            rows = {t["implementation"]: t for t in lock.slots[slot].timing}
            assert rows[own]["rounds"] >= 1 and "busy-processes" in rows[default]
