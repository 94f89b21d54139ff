"""The slot protocol's kernel_probe half: what the probe does for one slot.

A :class:`Slot` pairs a slot's :class:`kernel_lock.slots.SlotSpec` with its behaviour: what the
model declares of it, how its candidates are judged, timed and written into the lock, and what its
worker runs. The defaults are those of a layer with parameters that maps one tensor (the norms,
Linear); a slot overrides what differs, and a slot with its own measurements names their module
(``kernels``). The generic stages call these methods and never name a slot. The probe's process
never imports torch: the worker methods (``check``, ``try_once``, ``time``) run in the worker.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernel_lock.slots import SlotSpec
from kernel_probe.isolation.protocol import INTERPRETED, TimeReply
from kernel_probe.probe.limits import CHECK_HIDDEN
from kernel_probe.shapes import parse_shape

if TYPE_CHECKING:  # the probe's side needs the types only; the worker imports what it runs
    from kernel_probe.candidates import Candidate
    from kernel_probe.isolation.protocol import CheckReply, TimingProgressMessage
    from kernel_probe.probe.judge import Policy, Problem
    from kernel_probe.probe.report import Report, ReportBase

__all__ = ["Option", "Slot", "shape_work"]


def shape_work(shape: str) -> float:
    """A norm's or Linear's shape: its rows x hidden elements (what a call's time grows with)."""
    rows, hidden, _ = parse_shape(shape)
    return float(rows * hidden)


@dataclass(frozen=True)
class Option:
    """The command-line option by which a model declares the slot (``--attention GEOMETRY``)."""

    flag: str
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under."""
        return self.flag.lstrip("-").replace("-", "_")


class Slot:
    """One slot's behaviour in the probe (by default: a layer with parameters, one tensor)."""

    option: Option | None = None  # how the model declares the slot; None: nothing to declare
    summary_key: str = ""  # the key its declared value has in the probe's JSON summary
    footnote: str = ""  # a line `kernel-probe check` prints under the verdict tables
    # the module of its own worker measurements (``check``, ``tiny_call``, ``time_candidate``,
    # importing torch); "": the norms' and Linear's (``correctness``, ``timing``)
    kernels: str = ""

    def __init__(self, spec: SlotSpec):
        self.spec = spec

    @property
    def name(self) -> str:
        """The slot's name (the spec's)."""
        return self.spec.name

    # ---- what the model declares, and what that means for a probe (the probe's process) --------
    def refuse(self, declared: str) -> None:
        """Raise UsageError (exit 2) where the declared value is not one the slot knows."""

    def wanted(self, declared: str) -> bool:
        """Whether a probe that names no slot covers this one."""
        return self.spec.by_default or bool(declared)

    def resolved(self, declared: str, kind: str) -> str:
        """The declared value, or what the probe assumes on a ``kind`` ("cpu", "gpu") device."""
        return declared

    def canonical(self, declared: str, kind: str | None) -> dict[str, Any]:
        """The canonical values the declaration sets (``kind`` None: `check`, no default)."""
        return {}

    def inputs(self, declared: str, kind: str) -> dict[str, Any]:
        """What the digest of a probe's inputs covers of the declaration."""
        return {}

    def shapes(self, declared: str, kind: str, shapes: Sequence[str]) -> tuple[str, ...]:
        """The shapes the slot is timed at (the probe's, unless the slot has its own)."""
        return tuple(shapes)

    def provenance(self, declared: str, kind: str) -> dict[str, Any]:
        """What the lock's provenance records of the declaration."""
        return {}

    def work(self, shape: str) -> float:
        """What a call's time grows with at ``shape`` (the progress line's estimate)."""
        return shape_work(shape)

    def warnings(self, device: str, dtype: str) -> list[str]:
        """What a probe of the slot warns about before it starts."""
        return []

    def notes(self, device: str, dtype: str, timings: Mapping[str, Sequence[Any]]) -> list[str]:
        """What a probe of the slot notes after timing it (``timings``: by candidate)."""
        return []

    # ---- judging, in the probe's process -----------------------------------------------------
    def static_problem(self, cand: Candidate, canonical: Mapping[str, Any]) -> Problem | None:
        """Why ``cand`` cannot be the slot's kernel, known before anything is imported."""
        return None

    def judge(
        self,
        raw: CheckReply,
        cand: Candidate,
        device: str,
        base: ReportBase,
        canonical: Mapping[str, Any],
        policy: Policy,
    ) -> Report:
        """The verdict on the worker's measurements."""
        from kernel_probe.probe import judge  # the judge imports the candidates' parser: not here

        return judge.judge_candidate(raw, cand, self.name, device, policy, base)

    def lock_keys(
        self, values: Mapping[str, Any], kwargs: Mapping[str, Any], report: Report
    ) -> dict[str, Any]:
        """The slot's own lock keys (``SlotSpec.keys``) for the chosen candidate: ``values`` are
        the slot's canonical values, ``kwargs`` the candidate's pinned ones."""
        return {}

    def evidence(self, report: Report) -> Callable[[str], dict[str, Any]]:
        """Per dtype, what the slot adds to an evidence row of the lock."""
        return lambda dtype: {}

    # ---- the worker (imports torch) ---------------------------------------------------------
    def check(
        self,
        cand: Candidate,
        device: str,
        dtypes: list[tuple[str, str]],
        *,
        canonical: Mapping[str, Any],
        seed: int,
        hidden: int | None,
        baseline: Candidate | None,
        shared: Any,
    ) -> CheckReply:
        """The raw measurements of one candidate at ``dtypes`` (dtype, regime)."""
        kw = dict(canonical_overrides=canonical, seed=seed, hidden=hidden, shared=shared)
        if self.kernels:
            return importlib.import_module(self.kernels).check(cand, device, dtypes, **kw)
        from kernel_probe.probe import correctness  # torch: in the worker only

        kw["hidden"] = CHECK_HIDDEN if hidden is None else hidden
        return correctness.check(cand, self.name, device, dtypes, baseline=baseline, **kw)

    def try_once(self, cand: Candidate, device: str) -> dict[str, Any]:
        """One tiny forward and backward on a device the candidate does not declare."""
        from kernel_probe.probe import correctness, measure  # torch: in the worker only

        if not self.kernels:
            return correctness.try_once(cand, self.name, device)
        tiny_call = importlib.import_module(self.kernels).tiny_call
        try:
            tiny_call(cand, device)
        except Exception as exc:
            return {"ran": False, "error": measure.first_line(exc, 500)}
        return {"ran": True}

    def time(
        self,
        cand: Candidate,
        device: str,
        shapes: list[str],
        dtype: str,
        regime: str,
        options: Mapping[str, Any],
        canonical: Mapping[str, Any],
        progress: Callable[[TimingProgressMessage], None] | None,
    ) -> TimeReply:
        """The candidate timed at each shape (never where its kernels run interpreted)."""
        if self.kernels:
            own = importlib.import_module(self.kernels)
            kw = dict(regime=regime, canonical_overrides=canonical, progress=progress)
            return own.time_candidate(cand, device, shapes, dtype, options, **kw)
        from kernel_probe.isolation import worker  # reason: the worker's machinery, not the probe's
        from kernel_probe.probe import measure, timing  # torch: in the worker only

        try:
            measure.import_class(cand.target)  # does its library bring Triton in?
        except Exception:
            pass  # timing reports it
        if worker.interpreting():  # interpreter times say nothing about the compiled kernel
            rows: list[Any] = [
                {"implementation": cand.id, "shape": s, "error": f"not timed: {INTERPRETED}"}
                for s in shapes
            ]
            return TimeReply(candidate=cand.id, device=device, rows=rows)
        return timing.time_candidate(
            cand, self.name, device, shapes, dtype, regime, options, progress=progress
        )
