"""Where a slot's implementation is chosen, from verdicts and timings: the torch.nn default keeps
the slot unless an eligible candidate's paired-rounds interval (``repetitions.Ratio``) is wholly
below ``1 / (1 + 5 %)``; ``--pin``, ``--prefer`` and ``--deterministic`` as docs/probe.md (step 5,
Choose) says. A pinned or preferred candidate not eligible is an error."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kernel_probe.errors import ForcedUnusable, ProbeError, UsageError
from kernel_probe.isolation.protocol import INTERPRETED
from kernel_probe.probe import repetitions
from kernel_probe.probe.repetitions import Ratio
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
    ratios: dict[str, Ratio] = field(default_factory=dict)  # each other candidate's, to the default


def acceptable(ratio: repetitions.Ratio) -> bool:
    """Is a preferred candidate taken over the default: not decided slower beyond the margin (no
    interval: its ratio is not beyond it)?

    >>> from kernel_probe.probe.repetitions import Ratio
    >>> acceptable(Ratio(1.04, (1.02, 1.06), 6)), acceptable(Ratio(1.2, (1.1, 1.3), 6))
    (True, False)
    >>> acceptable(Ratio(1.04, None, 1)), acceptable(Ratio(1.06, None, 1))
    (True, False)
    """
    if ratio.interval is None:
        return ratio.ratio <= 1 + repetitions.MIN_MARGIN
    return ratio.verdict != "slower"


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


def _score(rows: Rows, base_rows: Rows, shapes: Sequence[str], weights: Weights = None) -> float:
    """The ratio of the medians to the default's: with ``weights`` (a model's calls per shape), of
    the model's time in the slot, sum(calls x median); else the geometric mean over the shapes."""
    by, base = {r["shape"]: r for r in rows}, {r["shape"]: r for r in base_rows}
    if weights:
        total = sum(weights.get(s, 0) * by[s]["median_ms"] for s in shapes)
        return total / sum(weights.get(s, 0) * base[s]["median_ms"] for s in shapes)
    logs = [math.log(by[s]["median_ms"] / base[s]["median_ms"]) for s in shapes]
    return math.exp(sum(logs) / len(logs))


def _ratio(rows: Rows, base_rows: Rows, shapes: Sequence[str], weights: Weights) -> Ratio:
    """The paired rounds' ratio; without pairs (a candidate timed apart) the medians', with no
    interval: undecided."""
    paired = repetitions.paired(rows, shapes, weights)
    return paired or Ratio(_score(rows, base_rows, shapes, weights), None, 0)


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
        why = "not accepted here"
        if deterministic and any(r.id == default_id and r.status == "accepted" for r in reports):
            why = "not deterministic here (--deterministic)"
        return _without_default(slot, eligible, timings, shapes, weights, f"{default_id} was {why}")
    scored = {
        r.id: _ratio(timings[r.id], timings[default.id], shapes, weights)
        for r in eligible
        if r is not default
    }
    scores = {r.id: scored[r.id].ratio if r is not default else 1.0 for r in eligible}
    for cid in prefers:
        said = f"{cid} preferred by {origin or '--prefer'}"
        if cid == default.id:
            return Choice(slot, default, "preferred", said, scores, bool(weights), scored)
        if cid in scored and acceptable(scored[cid]):
            said += f" (not slower than the default beyond the margin: {scored[cid].said()})"
            return Choice(slot, by_id[cid], "preferred", said, scores, bool(weights), scored)
    choice = _fastest_or_default(
        slot, reports, eligible, default, scored, _over(shapes, dtype, weights)
    )
    choice.weighted = bool(weights) and bool(choice.scores)
    return choice


def _without_default(
    slot: str,
    eligible: list[Report],
    timings: Mapping[str, Rows],
    shapes: list[str],
    weights: Weights,
    why: str,
) -> Choice:
    """The fastest eligible candidate (by the medians) where the default is not eligible."""
    base = timings[eligible[0].id]
    best = min(
        eligible, key=lambda r: (_score(timings[r.id], base, shapes, weights), eligible.index(r))
    )
    if len(eligible) == 1:
        why = f"the only candidate accepted and timed; the default {why}: nothing was compared"
        return Choice(slot, best, "fastest", f"{best.id} {why}")
    return Choice(slot, best, "fastest", f"{best.id} fastest accepted candidate; the default {why}")


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
    scored: Mapping[str, Ratio],
    over: str,
) -> Choice:
    """The fastest candidate decided faster, else the default, and why (``over``: what the ratio
    is over, ``_over``)."""
    scores = {r.id: scored[r.id].ratio if r is not default else 1.0 for r in eligible}
    others = [r for r in eligible if r is not default]
    ratios = dict(scored)
    clear = [(scores[r.id], i, r) for i, r in enumerate(others) if scored[r.id].verdict == "faster"]
    if clear:
        score, _, best = min(clear, key=lambda t: (t[0], t[1]))
        reason = f"{best.id} {1 / score:.2f}x faster than {default.id} {over}: "
        return Choice(slot, best, "fastest", reason + scored[best.id].said(), scores, ratios=ratios)
    if not others:
        rejected = [r for r in reports if r.status != "accepted"]
        note = f"no other candidate was accepted ({len(rejected)} not accepted)"
        note = note if rejected else "no other candidate"
        reason = f"{default.id} is the default; {note}: nothing was compared, so nothing decided"
        return Choice(slot, default, "default", reason, scores)
    undecided = [r for r in others if scored[r.id].verdict == "undecided"]
    closest = min(undecided or others, key=lambda r: (scores[r.id], eligible.index(r)))
    said, margin = scored[closest.id].said(), f"{repetitions.MIN_MARGIN:.0%}".replace("%", " %")
    if undecided:
        detail = f"undecided (keeping the default): {closest.id} {over}: {said}"
        detail += f" straddles the {margin} margin" if scored[closest.id].interval else ""
        cap = f", and could not clear it in {repetitions.MAX_ROUNDS} rounds"
        detail += cap if scored[closest.id].futile else ""
    else:
        verdict = scored[closest.id].verdict
        words = {"same": f"the same speed within {margin}", "slower": "slower"}
        detail = f"{closest.id} {words.get(verdict, f'not faster by the {margin} margin')} {over}"
        detail += f": {said}"
    reason = f"{default.id} is the default; {detail}"
    return Choice(slot, default, "default", reason, scores, ratios=ratios)


def load_warnings(
    choices: Mapping[str, Choice], timings: Mapping[str, Mapping[str, Rows]]
) -> list[str]:
    """A line per slot whose candidates were compared while other processes were busy: the paired
    rounds share the load, but it can still sway a choice (and it leaves some undecided)."""
    out = []
    for slot, choice in choices.items():
        rows = [row for rows in timings.get(slot, {}).values() for row in rows or ()]
        busy = max((int(r.get("busy_processes", 0)) for r in rows), default=0)
        busy += max((int(r.get("gpu_processes", 0)) for r in rows), default=0)
        if not choice.ratios or busy < 1:
            continue
        load = max(float(r.get("load_average", 0.0)) for r in rows)
        undecided = sorted(k for k, r in choice.ratios.items() if r.verdict == "undecided")
        what = f"it left {', '.join(undecided)} undecided" if undecided else "a close call"
        what += " may differ on an idle machine" if not undecided else ""
        out.append(
            f"{slot} was timed while {busy} other process{'es were' if busy > 1 else ' was'} busy "
            f"(a tenth of a core or more, or computing on the GPU; load average {load:.1f}): the "
            f"paired rounds share that load, but {what}; probe on a quiet machine (or the job's "
            "own nodes) to be sure"
        )
    return out
