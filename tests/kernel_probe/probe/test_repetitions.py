"""kernel_probe.probe.repetitions: the sequential test that ends a candidate's repetitions, and with
it ``timing.repeat``'s adaptive mode, on synthetic candidates whose calls take known times (sleeps).

The public names used: ``median_interval``, ``ratio_interval``, ``decided``, ``far_slower``,
``margin``, ``spread``, ``MIN_REPS``, ``MAX_FACTOR``; ``timing.repeat``; ``choose.choose``.
"""

from __future__ import annotations

import math
import time

import pytest

from kernel_probe.probe import repetitions
from kernel_probe.probe.choose import choose
from kernel_probe.probe.report import Report
from kernel_probe.probe.timing import _Clock, repeat


# ---- the confidence interval of a median ---------------------------------------------------------
@pytest.mark.parametrize(
    "n, k",
    [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (7, 2), (8, 2), (12, 4), (20, 7)],
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


def test_the_ratio_interval_combines_both_medians():
    assert repetitions.ratio_interval([2.0, 3.0, 4.0, 5.0], [10.0, 11.0, 12.0, 13.0]) == (
        2.0 / 13.0,
        5.0 / 10.0,
    )
    # too few to say
    assert repetitions.ratio_interval([1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]) is None


def test_the_margin_is_the_choices():
    assert repetitions.margin() == repetitions.MIN_MARGIN == 0.05
    assert repetitions.margin(0.01, 0.02) == 0.05
    assert repetitions.margin(0.01, 0.2) == pytest.approx(0.4)


@pytest.mark.parametrize(
    "samples, baseline, expected",
    [
        ([0.80, 0.81, 0.80, 0.82], [1.0, 1.01, 1.0, 0.99], True),  # clearly faster: chosen, decided
        (
            [0.97, 0.98, 0.97, 0.97],
            [1.0, 1.01, 1.0, 0.99],
            True,
        ),  # inside the margin, surely: default, decided
        ([1.50, 1.52, 1.49, 1.5], [1.0, 1.01, 1.0, 0.99], True),  # clearly slower
        (
            [0.95, 0.96, 0.94, 0.95],
            [1.0, 1.01, 1.0, 0.99],
            False,
        ),  # at the margin's boundary: more samples
        (
            [0.80, 0.81, 0.80],
            [1.0, 1.01, 1.0, 0.99],
            False,
        ),  # under MIN_REPS calls nothing is decided
        (
            [0.5, 0.95, 0.96, 0.97, 1.0],
            [1.0, 1.01, 1.0, 0.99],
            False,
        ),  # one outlying call: its interval straddles
        (
            [0.80, 0.80, 0.80, 0.99],
            [1.0, 1.01, 1.0, 0.99],
            False,
        ),  # one slow call widens the margin: not enough
    ],
)
def test_decided_once_the_interval_clears_both_boundaries(samples, baseline, expected):
    assert repetitions.decided(samples, baseline) is expected


def test_far_slower_is_far_beyond_the_margin():
    base = [1.0, 1.0, 1.0, 1.0, 1.0]
    limit = repetitions.FAR_SLOWER * (1 + repetitions.MIN_MARGIN)
    assert repetitions.far_slower(limit * 1.01, base) and not repetitions.far_slower(
        limit * 0.99, base
    )
    assert not repetitions.far_slower(100.0, [])  # no default timed: nothing to be far from


# ---- a synthetic pair of candidates, timed adaptively, then chosen -------------------------------
# one call of the synthetic default; sleeps keep the relative noise small even on a busy machine
BASE_S = 0.02


def _takes(seconds: float):
    """A synthetic candidate's call: a sleep, then a spin to the exact time (a sleep alone
    overshoots by milliseconds on a loaded machine)."""

    def call() -> None:
        end = time.perf_counter() + seconds
        time.sleep(max(seconds - 0.003, 0.0))
        while time.perf_counter() < end:
            pass

    return call


OPTS = {"warmup": 1, "reps": 5, "min_seconds": 0.0, "max_reps": 200, "mode": "adaptive"}


def _row(name: str, samples: list[float], how: str) -> dict:
    import statistics

    return {
        "implementation": name,
        "shape": "64x32",
        "dtype": "float32",
        "regime": "true",
        "median_ms": statistics.median(samples) * 1000,
        "spread": repetitions.spread(samples),
        "reps": len(samples),
        "timed": how,
    }


def _report(cid: str) -> Report:
    return Report(
        id=cid,
        target=f"x.{cid}",
        slot="LayerNorm",
        semantics="layer_norm",
        device="cpu",
        status="accepted",
    )


def test_a_far_slower_candidate_is_not_repeated():
    clock = _Clock("cpu")
    base = [BASE_S] * 5
    slow, how = repeat(clock, _takes(BASE_S * 3), OPTS, against=base)
    assert (how, len(slow)) == ("far slower", 1)


def test_the_deadline_ends_an_undecided_candidate():
    clock = _Clock("cpu")
    straddling = [1e-4, 1.0, 1e-4, 1.0]  # so wide that no candidate's interval can clear a boundary
    t0 = time.perf_counter()
    samples, how = repeat(clock, _takes(0.001), OPTS, against=straddling, deadline=t0 + 0.005)
    assert how == "budget" and 1 <= len(samples) < repetitions.MAX_FACTOR * OPTS["reps"]


class _SyntheticClock:
    """A clock whose calls take a known time with seeded relative noise: what the sequential test
    sees of a candidate on a machine with that noise, the same in every run."""

    def __init__(self, seconds: float, noise: float, seed: int) -> None:
        import random

        self.seconds, self.noise, self.random = seconds, noise, random.Random(seed)

    def time(self, fn) -> float:
        fn()
        # noise only ever slows a call
        return self.seconds * (1 + abs(self.random.gauss(0.0, self.noise)))

    def sync(self) -> None:
        pass


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("factor, chosen", [(0.97, "default"), (0.80, "fast")])
def test_the_sequential_test_decides_a_synthetic_pair_in_few_calls(factor, chosen, seed):
    """2 % noise: the 20 % faster candidate is decided at the fewest calls; the 3 % faster one, 2 %
    from the margin's boundary, gets more calls, never beyond the cap (where the default's own five
    calls leave it undecided, the medians of the extra calls decide, as the choice's rule says); and
    the choice over the adaptive samples is the one the true times give."""
    base, base_how = repeat(_SyntheticClock(1.0, 0.02, seed), lambda: None, OPTS)
    fast, how = repeat(_SyntheticClock(factor, 0.02, seed + 100), lambda: None, OPTS, against=base)
    assert base_how == "baseline" and len(base) == OPTS["reps"]
    if factor == 0.80:
        assert (how, len(fast)) == (
            "decided",
            repetitions.MIN_REPS,
        )  # fewer calls than the default's count
    else:
        assert how in ("decided", "max-reps") and len(fast) >= repetitions.MIN_REPS
        assert len(fast) <= repetitions.MAX_FACTOR * OPTS["reps"]
        assert (how == "decided") == (len(fast) < repetitions.MAX_FACTOR * OPTS["reps"])
    timings = {"default": [_row("default", base, base_how)], "fast": [_row("fast", fast, how)]}
    choice = choose(
        "LayerNorm", [_report("default"), _report("fast")], timings, ["64x32"], "float32", "default"
    )
    assert choice.report.id == chosen, (choice.reason, fast, base)


# ---- real probes: several accepted candidates, adaptive repetitions ------------------------------
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
            # the default is timed first, the other against it; where the other's first run beat
            # it by the margin, the default is timed again after it (a rematch: a loaded machine
            # can slow the default's first run), and a far slower candidate never causes one
            assert timed[slot][default] in ("baseline", "rematch")
            assert timed[slot][own] in ("decided", "far slower", "max-reps", "budget")
            if timed[slot][default] == "rematch":
                assert timed[slot][own] != "far slower", timed
