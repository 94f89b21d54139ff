"""Where a slot's implementation is chosen, from verdicts and timings.

Eligible: candidates ``accepted`` and timed without error at every shape. Each is scored by the
geometric mean over the shapes of its median time / the torch.nn default's. The default keeps the
slot unless another candidate is faster by more than the margin:

    score <= 1 / (1 + margin),   margin = max(5 %, 2 x the larger relative spread (IQR / median)
                                               of the two candidates' timings at any shape)

so timing noise never flips the choice. Of those clearing it the lowest score wins (ties: declared
first). ``--pin`` forces an accepted candidate; ``--prefer`` takes it when accepted and not slower
beyond the margin; ``--deterministic`` keeps only bitwise repeatable ones; Triton kernels that ran
interpreted are never eligible. A pinned or preferred candidate not eligible is an error.
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

How = Literal["fastest", "default", "pinned", "preferred"]  # how a slot's implementation was chosen
FORCED = {"pin": "pinned", "prefer": "preferred"}  # the flag (--pin) -> what it makes a candidate
Rows = Sequence[Mapping[str, Any]]
Weights = Mapping[str, int] | None  # a model's calls per forward at each shape


@dataclass
class Choice:
    """One slot's implementation: its report, how and why chosen, time ratios to the default."""

    slot: str
    report: Report
    how: How
    reason: str
    scores: dict[str, float] = field(default_factory=dict)
    weighted: bool = False  # the scores are of a model's time in the slot (calls x median)


def clears_margin(score: float, spread: float) -> bool:
    """Does a time ratio to the default of ``score`` replace it (``spread``: the larger of the
    two's relative spreads)?

    >>> clears_margin(0.9, 0.0)  # 1.11x faster: beyond the 5 % margin
    True
    >>> clears_margin(0.96, 0.0)  # 1.04x faster: timing noise could do that
    False
    >>> clears_margin(0.9, 0.08)  # a spread of 8 % makes the margin 16 %: 1.11x is not enough
    False
    """
    return score <= 1 / (1 + repetitions.margin(spread))


def within_margin(score: float, spread: float) -> bool:
    """Is a preferred candidate taken over the default: not slower by more than the margin?

    >>> within_margin(1.04, 0.0), within_margin(1.06, 0.0)  # 4 % slower: taken; 6 %: not
    (True, False)
    >>> within_margin(1.06, 0.05)  # noisier timings: a margin of 10 %
    True
    """
    return score <= 1 + repetitions.margin(spread)


def _ok_timings(rows: Rows | None, shapes: Sequence[str]) -> bool:
    got = {r["shape"] for r in rows or () if "error" not in r}
    return bool(rows) and all(s in got for s in shapes)


def _why_none(reports: Sequence[Report], timings: Mapping[str, Rows]) -> str:
    """Why no candidate is eligible: each accepted one's timing error, then a count of the rest.

    >>> r = Report(id="a", target="t", slot="S", semantics="s", device="cpu", status="accepted")
    >>> _why_none([r], {"a": [{"shape": "2x2", "error": "RuntimeError: too big"}]})
    'a not timed at 2x2: RuntimeError: too big'
    """
    said = []
    for r in reports:
        errors = [row for row in timings.get(r.id) or () if "error" in row]
        if r.status != "accepted":
            continue
        if errors:
            said.append(f"{r.id} not timed at {errors[0]['shape']}: {errors[0]['error']}")
        elif r.interpreted or not timings.get(r.id):
            said.append(f"{r.id} not timed{' (it ran interpreted)' if r.interpreted else ''}")
        else:
            said.append(f"{r.id} not bitwise repeatable (--deterministic)")
    rest = [r for r in reports if r.status != "accepted"]
    if rest:
        statuses = sorted({r.status for r in rest})
        said.append(f"{len(rest)} not accepted ({', '.join(statuses)})")
    return "; ".join(said) or "no candidate"


def _ratios(rows: Rows, base_rows: Rows, shapes: Sequence[str]) -> dict[str, float]:
    by, base = {r["shape"]: r for r in rows}, {r["shape"]: r for r in base_rows}
    return {s: by[s]["median_ms"] / base[s]["median_ms"] for s in shapes}


def _score(
    rows: Rows, base_rows: Rows, shapes: Sequence[str], weights: Weights = None
) -> tuple[float, float]:
    """(the time ratio to the default, the larger relative spread seen): with ``weights`` (a
    model's calls per shape), the ratio of the model's time in the slot, sum(calls x median); else
    the geometric mean over the shapes."""
    by, base = {r["shape"]: r for r in rows}, {r["shape"]: r for r in base_rows}
    spread = max([0.0] + [t[s].get("spread", 0.0) for s in shapes for t in (by, base)])
    if weights:
        total = sum(weights.get(s, 0) * by[s]["median_ms"] for s in shapes)
        return total / sum(weights.get(s, 0) * base[s]["median_ms"] for s in shapes), spread
    logs = [math.log(r) for r in _ratios(rows, base_rows, shapes).values()]
    return math.exp(sum(logs) / len(logs)), spread


def beats_default(rows: Rows | None, base_rows: Rows | None, shapes: Sequence[str]) -> bool:
    """Whether a candidate's timing rows beat the default's (False where either lacks a shape)."""
    if not _ok_timings(rows, shapes) or not _ok_timings(base_rows, shapes):
        return False
    assert rows is not None and base_rows is not None
    return clears_margin(*_score(rows, base_rows, shapes))


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
    weights: Weights = None,
) -> Choice:
    """The slot's implementation by the rule above. ``prefer``: may be a profile's ordered list (the
    first within the margin wins); ``strict_prefer``: one not accepted is an error; ``origin``:
    where a pin or preference came from ("profile lumi-g"; "": the command line); ``weights``: a
    model's calls per forward at each shape (the score is then the model's time in the slot)."""
    choice = _choose(
        slot, reports, timings, shapes, dtype, default_id, pin, prefer, origin, strict_prefer,
        deterministic, weights,
    )  # fmt: skip
    choice.weighted = bool(weights) and bool(choice.scores)
    return choice


def _choose(
    slot: str,
    reports: list[Report],
    timings: Mapping[str, list[Mapping[str, Any]]],
    shapes: list[str],
    dtype: str,
    default_id: str,
    pin: str | None,
    prefer: str | Sequence[str] | None,
    origin: str,
    strict_prefer: bool,
    deterministic: bool,
    weights: Weights,
) -> Choice:
    """``choose``'s rule."""
    by_id = {r.id: r for r in reports}
    prefers = [prefer] if isinstance(prefer, str) else list(prefer or ())
    forced = [(pin, "pin")] + ([(p, "prefer") for p in prefers] if strict_prefer else [])
    for cid, kind in forced:
        if cid is not None:
            _check_forced(slot, by_id, cid, kind, origin, deterministic)
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
            f"no candidate for {slot} was {what} on this machine: {_why_none(reports, timings)}",
            fix="run `kernel-probe check --slot " + slot + "` to see every verdict and its reasons",
        )
    default = next((r for r in eligible if r.id == default_id), None)
    if default is None:  # torch.nn itself failed here (or is not deterministic): say so
        base = eligible[0]
        best = min(
            eligible,
            key=lambda r: (
                _score(timings[r.id], timings[base.id], shapes, weights)[0],
                eligible.index(r),
            ),
        )
        default_was = any(r.id == default_id and r.status == "accepted" for r in reports)
        why = "not accepted here"
        why = "not deterministic here (--deterministic)" if deterministic and default_was else why
        reason = f"{best.id} fastest accepted candidate; the default {default_id} was {why}"
        return Choice(slot, best, "fastest", reason)
    scored = {
        r.id: _score(timings[r.id], timings[default.id], shapes, weights)
        for r in eligible
        if r is not default
    }
    scores = {r.id: scored[r.id][0] if r is not default else 1.0 for r in eligible}
    for cid in prefers:
        if cid == default.id:
            said = f"{cid} preferred by {origin or '--prefer'}"
            return Choice(slot, default, "preferred", said, scores)
        if cid in scored and within_margin(*scored[cid]):
            said = f"{cid} preferred by {origin or '--prefer'} ({1 / scores[cid]:.2f}x the "
            said += "default's speed)"
            return Choice(slot, by_id[cid], "preferred", said, scores)
    over = _over(shapes, dtype, weights)
    return _fastest_or_default(
        slot, reports, eligible, default, timings, shapes, dtype, scored, over
    )


def _over(shapes: Sequence[str], dtype: str, weights: Weights) -> str:
    """Over what a candidate is faster: the shape, the shapes, or the model's time in the slot."""
    if weights:
        calls = sum(weights.get(s, 0) for s in shapes)
        return f"in the model's time in the slot ({calls} calls at {len(shapes)} shapes, {dtype})"
    if len(shapes) == 1:
        return f"at {shapes[0]} {dtype}"
    return f"over {len(shapes)} shapes {dtype} (geometric mean)"


def _check_forced(
    slot: str, by_id: Mapping[str, Report], cid: str, kind: str, origin: str, deterministic: bool
) -> None:
    """A pinned or preferred candidate that is not eligible: an error, never silently replaced."""
    said = f"{origin} {kind} {slot}={cid}" if origin else f"--{kind} {slot}={cid}"
    way_out = f"remove the {kind} from {origin}" if origin else f"drop --{kind} {slot}={cid}"
    r = by_id.get(cid)
    if r is None:
        raise UsageError(
            f"{said}: no such candidate for {slot} (known: {', '.join(sorted(by_id))})",
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
            fix=f"{way_out}, or unset TRITON_INTERPRET and probe again where its kernels compile",
        )
    if deterministic and r.deterministic is not True:
        notes = [n for v in r.verdicts for n in v.notes if n.startswith("not deterministic")]
        raise ForcedUnusable(
            f"{said}: --deterministic, but the candidate is not bitwise repeatable here "
            f"({'; '.join(notes) or 'not measured'})",
            fix=f"{way_out}, or drop --deterministic (and the profile's `deterministic = true`)",
        )


def _fastest_or_default(
    slot: str,
    reports: Sequence[Report],
    eligible: list[Report],
    default: Report,
    timings: Mapping[str, Rows],
    shapes: list[str],
    dtype: str,
    scored: Mapping[str, tuple[float, float]],
    over: str,
) -> Choice:
    """The fastest candidate clearing the margin, else the default, and why (``over``: what the
    score is over, ``_over``)."""
    scores = {r.id: scored[r.id][0] if r is not default else 1.0 for r in eligible}
    others = [r for r in eligible if r is not default]
    clear = [
        (scores[r.id], i, r)
        for i, r in enumerate(eligible)
        if r.id in scored and clears_margin(*scored[r.id])
    ]
    if clear:
        score, _, best = min(clear, key=lambda t: (t[0], t[1]))
        reason = f"{best.id} {1 / score:.2f}x faster than {default.id} {over}"
        return Choice(slot, best, "fastest", reason, scores)
    if not others:
        rejected = [r for r in reports if r.status != "accepted"]
        note = f"no other candidate was accepted ({len(rejected)} not accepted)"
        note = note if rejected else "no other candidate"
        return Choice(slot, default, "default", f"{default.id} is the default; {note}", scores)
    fastest = min(others, key=lambda r: (scores[r.id], eligible.index(r)))
    s = scores[fastest.id]
    if s >= 1:
        ratios = _ratios(timings[fastest.id], timings[default.id], shapes)
        shape = max(ratios, key=lambda k: abs(math.log(ratios[k])))  # the worst
        detail = f"{fastest.id} {ratios[shape]:.2f}x slower at {shape} {dtype}"
    else:
        detail = f"{fastest.id} only {1 / s:.2f}x faster, inside the noise margin"
    return Choice(slot, default, "default", f"{default.id} is the default; {detail}", scores)
