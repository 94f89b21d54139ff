"""How a slot's candidates are timed against its default (docs/probe.md, "How many calls are
timed"): a sole candidate gets one measured call; several, paired rounds against the default whose
ratios' median and distribution-free interval (``median_interval``) decide, from ``MIN_ROUNDS``
until ``decided``, ``futile`` or the slot's budget ends them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

MIN_MARGIN = 0.05  # the smallest gain a choice is made for: ties go to the default
LEVEL = 0.98  # of the interval of the rounds' median ratio
MIN_ROUNDS = 7  # paired rounds before an interval exists (7: the extremes, at 98.4 %)
MAX_ROUNDS = 12  # rounds stop here at the latest
SOLE_SECOND_CALL_BELOW_S = 1.0  # a sole candidate's first call under this: one more is measured
SLOT_BUDGET_S = {"cpu": 20.0, "gpu": 20.0}  # per slot, of timed calls (first calls count)
Verdict = Literal["faster", "same", "slower", "not faster", "undecided"]


def spread(samples: Sequence[float]) -> float:
    """Relative noise: interquartile range / median (0 under 4 samples)."""
    if len(samples) < 4:
        return 0.0
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / max(statistics.median(samples), 1e-12)


def block(reps: int) -> int:
    """The calls of one block of a round: the count asked over ``MIN_ROUNDS``, at least one.

    >>> block(5), block(20), block(1)
    (1, 2, 1)
    """
    return max(1, reps // MIN_ROUNDS)


def order(n: int, level: float = LEVEL) -> int:
    """The largest ``k`` with ``P(Binomial(n, 1/2) < k) <= (1 - level) / 2`` (0: no interval).

    >>> order(6), order(7), order(10), order(11), order(12)
    (0, 1, 1, 2, 2)
    """
    tail = (1 - level) / 2
    k, below = 0, 0.0  # below: P(B < k + 1) as k grows
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if below > tail:
            break
        k += 1
    return k


def median_interval(samples: Sequence[float], level: float = LEVEL) -> tuple[float, float] | None:
    """The median's distribution-free interval: ``(x_(k), x_(n+1-k))`` sorted, ``k = order(n)``;
    None where there is none."""
    n, k = len(samples), order(len(samples), level)
    if k == 0:
        return None
    ordered = sorted(samples)
    return ordered[k - 1], ordered[n - k]


def lowest_high(samples: Sequence[float], rounds: int = MAX_ROUNDS) -> float | None:
    """The lowest upper end the interval could reach by ``rounds`` rounds, whatever the rounds left
    measure: every one below all of ``samples`` puts it at ``x_(n+1-k)``, ``k = order(rounds)``
    (a later round's ``k`` is no smaller, so the cap's is the lowest); None: no bound yet.

    >>> lowest_high([1.0, 0.9, 1.1, 1.0, 0.97, 1.2, 0.5]), lowest_high([1.0] * 5 + [0.5] * 2)
    (1.1, 1.0)
    """
    n, k = len(samples), order(rounds)
    return sorted(samples)[n - k] if 0 < k <= n else None


@dataclass(frozen=True)
class Ratio:
    """A candidate's time over the default's from paired rounds: the median of the rounds' ratios,
    its interval (None under ``MIN_ROUNDS``) and the number of rounds."""

    ratio: float
    interval: tuple[float, float] | None
    rounds: int
    reachable: float | None = None  # the lowest upper end ``MAX_ROUNDS`` rounds could give

    @property
    def futile(self) -> bool:
        """Undecided, and no rounds left before ``MAX_ROUNDS`` could make it faster: their
        decision would be this one's (the default kept), so they are not timed.

        >>> Ratio(0.99, (0.8, 1.2), 7, reachable=1.1).futile
        True
        >>> Ratio(0.9, (0.8, 1.2), 7, reachable=0.9).futile, Ratio(0.8, (0.7, 0.9), 7, 0.85).futile
        (False, False)
        """
        fast = 1 / (1 + MIN_MARGIN)
        return self.verdict == "undecided" and self.reachable is not None and self.reachable >= fast

    @property
    def verdict(self) -> Verdict:
        """What the interval says against the boundaries ``1 / (1 + m)`` and ``1 + m``.

        >>> Ratio(0.8, (0.78, 0.83), 6).verdict, Ratio(0.99, (0.97, 1.02), 6).verdict
        ('faster', 'same')
        >>> Ratio(0.5, (0.05, 1.2), 6).verdict, Ratio(0.5, None, 2).verdict
        ('undecided', 'undecided')
        >>> Ratio(1.2, (1.1, 1.3), 6).verdict, Ratio(1.02, (0.97, 1.2), 6).verdict
        ('slower', 'not faster')
        """
        if self.interval is None:
            return "undecided"
        low, high = self.interval
        fast, slow = 1 / (1 + MIN_MARGIN), 1 + MIN_MARGIN
        if high < fast:
            return "faster"
        if low > slow:
            return "slower"
        if low < fast:
            return "undecided"  # it may be faster by the margin, or not
        return "same" if high < slow else "not faster"

    @property
    def decided(self) -> bool:
        """Whether the interval is on one side of the faster boundary (more rounds: no change)."""
        return self.verdict != "undecided"

    def said(self) -> str:
        """The ratio with its interval, for a reason line.

        >>> Ratio(0.76, (0.72, 0.8), 6).said()
        'time ratio 0.76 (98 % interval 0.72-0.80, 6 paired rounds)'
        """
        rounds = f"{self.rounds} paired round{'s' if self.rounds != 1 else ''}"
        if not self.rounds:
            return f"time ratio {self.ratio:.2f} of the medians (no paired rounds: no interval)"
        if self.interval is None:
            return f"time ratio {self.ratio:.2f} ({rounds}: too few for an interval)"
        low, high = self.interval
        level = f"{LEVEL:.0%}".replace("%", " %")
        return f"time ratio {self.ratio:.2f} ({level} interval {low:.2f}-{high:.2f}, {rounds})"


Rows = Sequence[Mapping[str, Any]]


def round_ratios(
    rows: Rows, shapes: Sequence[str], weights: Mapping[str, int] | None
) -> list[float]:
    """Each round's ratio from a candidate's rows (their ``pairs``: per round, the default's block
    median and the candidate's, ms): the model's time in the slot with ``weights``, else the
    geometric mean over the shapes; [] where a shape has no pairs."""
    by = {r["shape"]: r.get("pairs") or [] for r in rows if "error" not in r}
    if not shapes or any(not by.get(s) for s in shapes):
        return []
    out = []
    for i in range(min(len(by[s]) for s in shapes)):
        if weights:
            own = sum(weights.get(s, 0) * by[s][i][1] for s in shapes)
            out.append(own / max(sum(weights.get(s, 0) * by[s][i][0] for s in shapes), 1e-12))
        else:
            logs = [math.log(by[s][i][1] / by[s][i][0]) for s in shapes]
            out.append(math.exp(sum(logs) / len(logs)))
    return out


def paired(
    rows: Rows, shapes: Sequence[str], weights: Mapping[str, int] | None = None
) -> Ratio | None:
    """The candidate's ``Ratio`` to the default from its paired rounds; None without any."""
    ratios = round_ratios(rows, shapes, weights)
    if not ratios:
        return None
    interval = median_interval(ratios) if len(ratios) >= MIN_ROUNDS else None
    reachable = lowest_high(ratios) if interval else None
    return Ratio(statistics.median(ratios), interval, len(ratios), reachable)
