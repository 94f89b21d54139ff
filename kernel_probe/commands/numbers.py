"""The argparse types of every numeric option: finite, positive, bounded (one home, so no option
takes ``nan``, ``inf`` or ``-1`` and then waits forever, busy-polls or gives up at once)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from kernel_probe.probe.limits import MAX_SECONDS

MAX_COUNT = 1_000_000


def seconds(text: str, *, limit: float = MAX_SECONDS) -> float:
    """A positive, finite number of seconds, at most ``limit`` (a week)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 < value <= limit):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a time budget must be a positive, finite number of seconds, at most "
            f"{limit:g}"
        )
    return value


def count(lo: int = 1, hi: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse type: a whole number in ``[lo, hi]``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10) if text.strip().isascii() else None
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number from {lo} to {hi}")
        return value

    parse.__name__ = "count"
    return parse
