"""How many timed calls a candidate gets: only as many as can change the slot's choice.

``choose`` keeps the default unless a candidate is faster by more than the margin, ``max(5 %, 2 x
the larger relative spread)``. So a **sole** accepted candidate gets one measured call after its
check at the shape (that first call, when it took ``SOLE_SECOND_CALL_BELOW_S`` or more); the
**default** is timed first, as usual; every **other** is repeated until the sequential test decides
it, its share of the slot's budget is spent, or at ``MAX_FACTOR`` x the default's count; one whose
first call is ``FAR_SLOWER`` x (1 + margin) x the default's median is not repeated.

**The sequential test** (``decided``): from ``MIN_REPS`` calls, the medians' distribution-free
intervals (``LEVEL``) bound the time ratio; decided once that excludes ``1 / (1 + m)`` and ``1 +
m``, at the samples' margin ``m`` and at the smallest (a spread of four calls is noisy itself).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

MIN_MARGIN = 0.05  # the smallest margin a choice is made by (choose.py's rule)
MIN_REPS = 4  # calls before the test may decide (and the fewest that give a spread)
LEVEL = 0.8  # of each median's confidence interval
FAR_SLOWER = 2.0  # a first call slower than this x (1 + margin) x the default's: not repeated
SOLE_SECOND_CALL_BELOW_S = 1.0  # a sole candidate's first call under this: one more is measured
MAX_FACTOR = 4  # repetitions stop at this x the default's count at the latest
SLOT_BUDGET_S = {"cpu": 20.0, "gpu": 20.0}  # per slot, of timed calls (first calls, warm-ups count)


def spread(samples: Sequence[float]) -> float:
    """Relative noise: interquartile range / median (0 under 4 samples)."""
    if len(samples) < 4:
        return 0.0
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / max(statistics.median(samples), 1e-12)


def margin(*spreads: float) -> float:
    """The choice's margin for two candidates whose timings have these relative spreads.

    >>> margin(0.01, 0.02)  # quiet timings: the 5 % minimum
    0.05
    >>> margin(0.01, 0.04)  # twice the larger spread
    0.08
    """
    return max(MIN_MARGIN, 2 * max(spreads, default=0.0))


def median_interval(samples: Sequence[float], level: float = LEVEL) -> tuple[float, float] | None:
    """The median's distribution-free interval: ``(x_(k), x_(n+1-k))`` sorted, for the largest ``k``
    with ``P(Binomial(n, 1/2) < k) <= (1 - level) / 2``; None where there is none."""
    n = len(samples)
    tail = (1 - level) / 2
    k, below = 0, 0.0  # below: P(B < k + 1) as k grows
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if below > tail:
            break
        k += 1
    if k == 0:
        return None
    ordered = sorted(samples)
    return ordered[k - 1], ordered[n - k]


def ratio_interval(
    samples: Sequence[float], baseline: Sequence[float]
) -> tuple[float, float] | None:
    """An interval for median(samples) / median(baseline): both medians' intervals combined."""
    own, base = median_interval(samples), median_interval(baseline)
    if own is None or base is None or base[0] <= 0:
        return None
    return own[0] / base[1], own[1] / base[0]


def decided(samples: Sequence[float], baseline: Sequence[float]) -> bool:
    """Whether the samples so far decide the candidate against the default (module docstring)."""
    if len(samples) < MIN_REPS:
        return False
    interval = ratio_interval(samples, baseline)
    if interval is None:
        return False
    lo, hi = interval
    return not any(lo <= boundary <= hi for boundary in boundaries(samples, baseline))


def boundaries(samples: Sequence[float], baseline: Sequence[float]) -> tuple[float, ...]:
    """The time ratios where the choice changes, at the samples' margin and at the smallest."""
    m = margin(spread(samples), spread(baseline))
    return tuple(sorted({1 / (1 + m), 1 + m, 1 / (1 + MIN_MARGIN), 1 + MIN_MARGIN}))


def far_slower(first: float, baseline: Sequence[float]) -> bool:
    """Whether one timed call is so much slower than the default that no repetition can matter."""
    if not baseline:
        return False
    m = margin(spread(baseline))
    return first > FAR_SLOWER * (1 + m) * statistics.median(baseline)
