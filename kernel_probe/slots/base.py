"""The slot protocol's kernel_probe half: a :class:`Slot` pairs a slot's
:class:`kernel_lock.slots.SlotSpec` with what the probe does for it (docs/architecture.md); its
defaults are a one-tensor layer's with parameters. torch is imported in the worker methods only."""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernel_lock.model import NONE_VALUE, Site
from kernel_lock.slots import SlotSpec
from kernel_probe.isolation.protocol import INTERPRETED, TimeReply
from kernel_probe.probe.limits import CHECK_HIDDEN
from kernel_probe.shapes import shape_work

if TYPE_CHECKING:  # the probe's side needs the types only; the worker imports what it runs
    from kernel_probe.candidates import Candidate
    from kernel_probe.isolation.protocol import CheckReply, TimingProgressMessage
    from kernel_probe.probe.judge import Policy, Problem
    from kernel_probe.probe.report import Report, ReportBase

__all__ = ["Option", "Slot", "Use", "dims", "shape_work"]


def dims(shape: str) -> tuple[int, ...]:
    """A traced input shape ("8x128x256") as its dimensions; () for a scalar ("")."""
    return tuple(int(d) for d in shape.split("x")) if shape else ()


@dataclass(frozen=True)
class Use:
    """What a model's trace says of one slot (:meth:`Slot.use`): the semantics pinned (the most
    calls'), as the slot's option says them, each shape timed at with its calls per forward, the
    sites covered, and (site, why) for the others."""

    canonical: Mapping[str, Any] = field(default_factory=dict)
    declared: str = ""
    weights: Mapping[str, int] = field(default_factory=dict)
    covered: tuple[str, ...] = ()
    uncovered: tuple[tuple[str, str], ...] = ()

    @property
    def shapes(self) -> tuple[str, ...]:
        """The shapes timed at, most-called first."""
        return tuple(self.weights)


def _value(v: Any) -> str:
    return NONE_VALUE if v is None else json.dumps(v)


def _differ(values: Mapping[str, Any], canonical: Mapping[str, Any]) -> str:
    """How a site's semantics differ from the lock's: ``eps=1e-06 (the lock's 1e-05)``."""
    keys = [k for k in {**canonical, **values} if values.get(k) != canonical.get(k)]
    return ", ".join(
        f"{k}={_value(values.get(k))} (the lock's {_value(canonical.get(k))})" for k in keys
    )


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
    shape_form: str = "ROWSxHIDDEN"  # the --shape form timed at; "": its own declaration's
    # the module of its own worker measurements (``check``, ``tiny_call``, ``time_candidate``);
    # "": the one-tensor layers' (``correctness``, ``timing``)
    kernels: str = ""
    option_key: str = (
        ""  # the canonical key whose value the option declares (Activation's function)
    )

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
        """The canonical values the declaration sets (``kind`` None: `check`, no default): its
        value under ``option_key``."""
        return {self.option_key: declared} if declared and self.option_key else {}

    def inputs(self, declared: str, kind: str) -> dict[str, Any]:
        """What the digest of a probe's inputs covers of the declaration: under the option's
        name, the declared value, else the spec's canonical one."""
        if not self.option_key or self.option is None:
            return {}
        return {self.option.dest: declared or self.spec.canonical[self.option_key]}

    def shapes(self, declared: str, kind: str, shapes: Sequence[str]) -> tuple[str, ...]:
        """The shapes the slot is timed at (the probe's, unless the slot has its own)."""
        return tuple(shapes)

    def provenance(self, declared: str, kind: str) -> dict[str, Any]:
        """What the lock's provenance records of the declaration."""
        return {}

    def too_large(self, shape: str, kind: str) -> str:
        """Why a ``kind`` device cannot time the slot at ``shape`` ("": it can): exit 3 up front."""
        return ""

    def work(self, shape: str) -> float:
        """What a call's time grows with at ``shape`` (the progress line's estimate)."""
        return shape_work(shape)

    def warnings(self, device: str, dtype: str) -> list[str]:
        """What a probe of the slot warns about before it starts."""
        return []

    def notes(self, device: str, dtype: str, timings: Mapping[str, Sequence[Any]]) -> list[str]:
        """What a probe of the slot notes after timing it (``timings``: by candidate)."""
        return []

    # ---- what a model's trace says of the slot (``--model``; the probe's process) --------------
    def traced(self, site: Site) -> tuple[dict[str, Any], str]:
        """(the semantics of ``site`` the spec knows, why the slot cannot pin them or ""): a
        value its ``params`` refuse cannot be pinned."""
        known = {**self.spec.canonical, **self.spec.params}
        values = {
            k: None if v == NONE_VALUE else v for k, v in site.semantics.items() if k in known
        }
        for k, v in values.items():
            param = self.spec.params.get(k)
            problem = param.problem(v) if param is not None else None
            if problem:
                return (
                    values,
                    f"{k}={_value(v)}: the {self.name} slot cannot pin it ({problem})",
                )
        return values, ""

    def site_shape(self, site: Site) -> tuple[str, int]:
        """(the shape ``site`` is timed at, how many of its calls one timed call is): the first
        input's ROWSxLAST, once."""
        d = dims(site.shapes[0]) if site.shapes else ()
        if not d:
            raise ValueError(f"{site.where or '<model>'}: no input shape was traced")
        return f"{math.prod(d[:-1])}x{d[-1]}", 1

    def declaration(self, canonical: Mapping[str, Any], shapes: Sequence[str]) -> str:
        """What the model's semantics amount to as the slot's option says it ("": none)."""
        return str(canonical.get(self.option_key, "")) if self.option_key else ""

    def use(
        self, sites: Sequence[Site], refuse: Callable[[Mapping[str, Any]], str] = lambda _: ""
    ) -> Use:
        """The slot's sites as the probe uses them: the semantics of the most calls (ties: the
        first site's) pinned, each covered site's shape weighted by its calls; the others (other
        semantics, or ones the slot cannot pin or ``refuse`` refuses) named with why."""
        uncovered: list[tuple[str, str]] = []
        found: list[tuple[Site, dict[str, Any]]] = []
        for site in sites:
            values, why = self.traced(site)
            why = why or refuse(values)
            if why:
                uncovered.append((site.where, why))
            else:
                found.append((site, values))
        calls: dict[str, int] = {}
        for site, values in found:
            key = json.dumps(values, sort_keys=True, default=str)
            calls[key] = calls.get(key, 0) + site.calls
        if not found:
            return Use(uncovered=tuple(uncovered))
        best = max(calls, key=lambda k: calls[k])  # the first of the most-called
        canonical = next(v for _, v in found if json.dumps(v, sort_keys=True, default=str) == best)
        weights: dict[str, int] = {}
        covered = []
        for site, values in found:
            if values != canonical:
                why = f"{_differ(values, canonical)}: the lock checks the semantics of "
                why += f"{calls[best]} of {sum(calls.values())} calls"
                uncovered.append((site.where, why))
                continue
            shape, per = self.site_shape(site)
            weights[shape] = weights.get(shape, 0) + site.calls * per
            covered.append(site.where)
        weights = dict(sorted(weights.items(), key=lambda kv: -kv[1]))
        declared = self.declaration(canonical, tuple(weights))
        return Use(canonical, declared, weights, tuple(covered), tuple(uncovered))

    # ---- judging, in the probe's process -----------------------------------------------------
    def contradiction(self, cand: Candidate, canonical: Mapping[str, Any]) -> str:
        """Where ``cand``'s declaration pins a value of the model's semantics other than the
        model's (the lock would pin it); "" where it pins none."""
        for k, v in cand.kwargs.items():
            if k in canonical and not str(v).startswith("$") and v != canonical[k]:
                return f"{cand.target} is declared with {k}={_value(v)}; the model's is " + (
                    _value(canonical[k])
                )
        return ""

    def static_problem(self, cand: Candidate, canonical: Mapping[str, Any]) -> Problem | None:
        """Why ``cand`` cannot be the slot's kernel, known before any import (its
        ``contradiction``)."""
        from kernel_probe.probe.report import Problem  # the judge imports the candidates' parser

        why = self.contradiction(cand, canonical)
        return Problem("skipped", why) if why else None

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
        """The slot's own lock keys (``SlotSpec.keys``) for the chosen candidate: one with a
        ``derive`` computed from its pinned ``kwargs``, another as its canonical ``values`` hold."""
        keys = self.spec.keys
        derived = {k.name: k.derive(kwargs) for k in keys if k.derive is not None}
        return derived | {k.name: values[k.name] for k in keys if k.name in values and not k.derive}

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

        own = importlib.import_module(self.kernels) if self.kernels else None
        try:
            with measure.on_device(device):
                if own is not None:
                    own.tiny_call(cand, device)
                else:
                    correctness.tiny_call(cand, self.name, device)
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
            cand,
            self.name,
            device,
            shapes,
            dtype,
            regime,
            options,
            progress=progress,
            canonical=canonical,
        )
