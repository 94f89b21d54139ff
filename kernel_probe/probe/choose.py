"""Where a slot's implementation is chosen, from verdicts and timings.

The rule. Only candidates ``accepted`` by the correctness kernels and timed without error at every
requested shape are eligible. Each is scored by the geometric mean, over the shapes, of its median
time divided by the torch.nn default's. The default keeps the slot unless another candidate is
faster by more than the margin:

    score <= 1 / (1 + margin),   margin = max(5 %, 2 x the larger relative spread (IQR / median)
                                               of the two candidates' timings at any shape)

so a difference timing noise could produce never flips the choice, and repeated probes on one
machine choose the same. Among candidates that clear the margin the lowest score wins; exact ties go
to the candidate declared first. ``--pin SLOT=ID`` forces an accepted candidate whatever its speed;
``--prefer SLOT=ID`` takes it when it is accepted and not slower than the default by more than the
margin. A pinned or preferred candidate that is not accepted is an error, never silently dropped.
``--deterministic`` keeps only candidates whose forward and backward were bitwise repeatable in
every checked dtype; a pinned or preferred one that is not is an error. A candidate whose Triton
kernels ran in Triton's interpreter (``TRITON_INTERPRET=1``) is never eligible, and pinning it is an
error: its verdict says what the interpreter computes, not what the compiled kernel does or how
fast.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kernel_probe.errors import ForcedUnusable, ProbeError, UsageError
from kernel_probe.isolation.protocol import INTERPRETED
from kernel_probe.probe import repetitions
from kernel_probe.probe.report import Report

MIN_MARGIN = repetitions.MIN_MARGIN
How = Literal["fastest", "default", "pinned", "preferred"]  # how a slot's implementation was chosen
FORCED = {"pin": "pinned", "prefer": "preferred"}  # the flag (--pin) -> what it makes a candidate


@dataclass
class Choice:
    """The implementation chosen for one slot: its report, how it was chosen (fastest, default,
    pinned, preferred), why, and the time ratios to the default it was chosen by."""

    slot: str
    report: Report
    how: How
    reason: str
    scores: dict[str, float] = field(default_factory=dict)


def clears_margin(score: float, spread: float) -> bool:
    """Does a candidate whose time ratio to the default is ``score`` replace the default? Only when
    it is faster by more than the margin (``spread``: the larger relative spread of the two's
    timings).

    >>> clears_margin(0.9, 0.0)  # 1.11x faster: beyond the 5 % margin
    True
    >>> clears_margin(0.96, 0.0)  # 1.04x faster: timing noise could do that
    False
    >>> clears_margin(0.9, 0.08)  # a spread of 8 % makes the margin 16 %: 1.11x is not enough
    False
    """
    return score <= 1 / (1 + repetitions.margin(spread))


def within_margin(score: float, spread: float) -> bool:
    """Is a preferred candidate (``--prefer``, a profile's preference) taken over the default? When
    it is not slower than the default by more than the margin.

    >>> within_margin(1.04, 0.0), within_margin(1.06, 0.0)  # 4 % slower: taken; 6 %: not
    (True, False)
    >>> within_margin(1.06, 0.05)  # noisier timings: a margin of 10 %
    True
    """
    return score <= 1 + repetitions.margin(spread)


def _ok_timings(rows: Sequence[Mapping[str, Any]] | None, shapes: Sequence[str]) -> bool:
    if not rows:
        return False
    got = {r["shape"]: r for r in rows if "error" not in r}
    return all(s in got for s in shapes)


def _score(rows, base_rows, shapes) -> tuple[float, float]:
    """(geometric mean time ratio to the default, the larger relative spread seen)."""
    by = {r["shape"]: r for r in rows}
    base = {r["shape"]: r for r in base_rows}
    logs, spread = [], 0.0
    for s in shapes:
        logs.append(math.log(by[s]["median_ms"] / base[s]["median_ms"]))
        spread = max(spread, by[s].get("spread", 0.0), base[s].get("spread", 0.0))
    return math.exp(sum(logs) / len(logs)), spread


def beats_default(
    rows: Sequence[Mapping[str, Any]] | None,
    base_rows: Sequence[Mapping[str, Any]] | None,
    shapes: Sequence[str],
) -> bool:
    """Whether a candidate's timing rows replace the default's by ``choose``'s rule (faster beyond
    the margin at the geometric mean over ``shapes``); False when either side lacks a shape."""
    if not _ok_timings(rows, shapes) or not _ok_timings(base_rows, shapes):
        return False
    assert rows is not None and base_rows is not None
    return clears_margin(*_score(rows, base_rows, shapes))


def _worst_shape(rows, base_rows, shapes) -> tuple[str, float]:
    by = {r["shape"]: r for r in rows}
    base = {r["shape"]: r for r in base_rows}
    ratios = {s: by[s]["median_ms"] / base[s]["median_ms"] for s in shapes}
    s = max(ratios, key=lambda k: abs(math.log(ratios[k])))
    return s, ratios[s]


def choose(
    slot: str,
    reports: list[Report],
    timings: Mapping[str, list[Mapping[str, Any]]],
    shapes: list[str],
    dtype: str,
    default_id: str,
    *,
    pin: str | None = None,
    prefer: str | Sequence[str] | None = None,
    origin: str = "",
    strict_prefer: bool = True,
    deterministic: bool = False,
) -> Choice:
    """``prefer`` may be an ordered list (a profile's preferences): the first preferred candidate
    that is eligible and within the margin wins. With ``strict_prefer`` (the command line), a
    preferred candidate that is not accepted is an error; a profile's list just moves on.
    ``deterministic`` restricts the choice to bitwise repeatable candidates. ``origin`` names where
    a pin or preference came from ("profile lumi-g"); empty means the command line
    (``--pin``/``--prefer``)."""
    by_id = {r.id: r for r in reports}
    prefers = [prefer] if isinstance(prefer, str) else list(prefer or ())
    checks = [(pin, "pin")] + ([(p, "prefer") for p in prefers] if strict_prefer else [])
    for forced, kind in checks:
        if forced is None:
            continue
        said = f"{origin} {kind} {slot}={forced}" if origin else f"--{kind} {slot}={forced}"
        way_out = f"remove the {kind} from {origin}" if origin else f"drop --{kind} {slot}={forced}"
        r = by_id.get(forced)
        if r is None:
            known = ", ".join(sorted(by_id))
            raise UsageError(
                f"{said}: no such candidate for {slot} (known: {known})",
                fix="use one of the ids `kernel-probe check` lists",
            )
        if r.status != "accepted":
            raise ForcedUnusable(
                f"{said}: the candidate is {r.status} on this machine: "
                f"{'; '.join(r.reasons[:3]) or 'no reason recorded'}",
                fix=f"{way_out}, or fix the candidate; a {FORCED[kind]} kernel is never "
                "silently replaced",
            )
        if r.interpreted:
            raise ForcedUnusable(
                f"{said}: the candidate's verdict is {INTERPRETED}",
                fix=f"{way_out}, or unset TRITON_INTERPRET and probe again where its kernels "
                "compile",
            )
        if deterministic and r.deterministic is not True:
            why = (
                "; ".join(
                    n for v in r.verdicts for n in v.notes if n.startswith("not deterministic")
                )
                or "not measured"
            )
            raise ForcedUnusable(
                f"{said}: --deterministic, but the candidate is not bitwise repeatable here "
                f"({why})",
                fix=f"{way_out}, or drop --deterministic (and the profile's `deterministic = "
                "true`)",
            )
    eligible = [
        r
        for r in reports
        if r.status == "accepted"
        and not r.interpreted
        and _ok_timings(timings.get(r.id), shapes)
        and (r.deterministic is True or not deterministic)
    ]
    if pin is not None:
        return Choice(slot, by_id[pin], "pinned", f"{pin} pinned by {origin or '--pin'}")
    if not eligible:
        what = "accepted, deterministic and timed" if deterministic else "both accepted and timed"
        raise ProbeError(
            f"no candidate for {slot} was {what} on this machine",
            fix="run `kernel-probe check --slot " + slot + "` to see every verdict and its reasons",
        )
    default = next((r for r in eligible if r.id == default_id), None)
    # torch.nn itself failed here (or is not deterministic): take the fastest eligible, say so
    if default is None:
        base = eligible[0]
        best = min(
            eligible,
            key=lambda r: (_score(timings[r.id], timings[base.id], shapes)[0], eligible.index(r)),
        )
        why = (
            "not deterministic here (--deterministic)"
            if deterministic and any(r.id == default_id and r.status == "accepted" for r in reports)
            else "not accepted here"
        )
        return Choice(
            slot,
            best,
            "fastest",
            f"{best.id} fastest accepted candidate; the default {default_id} was {why}",
        )
    scores: dict[str, float] = {}
    spreads: dict[str, float] = {}
    clear: list[tuple[float, int, Report]] = []
    for i, r in enumerate(eligible):
        if r is default:
            scores[r.id] = 1.0
            continue
        score, spread = _score(timings[r.id], timings[default.id], shapes)
        scores[r.id] = score
        spreads[r.id] = spread
        if clears_margin(score, spread):
            clear.append((score, i, r))
    for cid in prefers:
        if cid == default.id:
            return Choice(
                slot, default, "preferred", f"{cid} preferred by {origin or '--prefer'}", scores
            )
        r = next((e for e in eligible if e.id == cid), None)
        if r is not None and within_margin(scores[r.id], spreads[r.id]):
            return Choice(
                slot,
                r,
                "preferred",
                f"{r.id} preferred by {origin or '--prefer'} ({1 / scores[r.id]:.2f}x the "
                "default's speed)",
                scores,
            )
    others = [r for r in eligible if r is not default]
    if clear:
        score, _, best = min(clear, key=lambda t: (t[0], t[1]))
        shape, ratio = _worst_shape(timings[best.id], timings[default.id], shapes)
        where = (
            f"at {shapes[0]} {dtype}"
            if len(shapes) == 1
            else f"over {len(shapes)} shapes {dtype} (geometric mean)"
        )
        return Choice(
            slot,
            best,
            "fastest",
            f"{best.id} {1 / score:.2f}x faster than {default.id} {where}",
            scores,
        )
    if not others:
        rejected = [r for r in reports if r.status != "accepted"]
        note = (
            f"no other candidate was accepted ({len(rejected)} not accepted)"
            if rejected
            else "no other candidate"
        )
        return Choice(slot, default, "default", f"{default.id} is the default; {note}", scores)
    fastest_other = min(others, key=lambda r: (scores[r.id], eligible.index(r)))
    s = scores[fastest_other.id]
    if s >= 1:
        shape, ratio = _worst_shape(timings[fastest_other.id], timings[default.id], shapes)
        detail = f"{fastest_other.id} {ratio:.2f}x slower at {shape} {dtype}"
    else:
        detail = f"{fastest_other.id} only {1 / s:.2f}x faster, inside the noise margin"
    return Choice(slot, default, "default", f"{default.id} is the default; {detail}", scores)
