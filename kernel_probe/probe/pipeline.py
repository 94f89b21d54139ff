"""The probe as a library: ``probe_or_reuse`` reuses the lock if it answers the plan, else checks
every candidate in an isolated worker, times the accepted ones, chooses per slot and writes the lock
under a file lock. It prints nothing (:class:`Events`); a failure a person can act on is a
``LockError``."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kernel_lock
from kernel_lock.errors import KernelUnavailable, LockError, LockFormatError, LockMismatch
from kernel_lock.model import Model
from kernel_probe import slots as slot_behaviour
from kernel_probe.candidates import Candidate, default_for, for_slot, local_modules
from kernel_probe.errors import InputFileError, StaleLock, TooLarge
from kernel_probe.isolation.protocol import FingerprintRequest
from kernel_probe.probe import stale
from kernel_probe.probe.choose import Choice, choose, load_warnings
from kernel_probe.probe.judge import Policy
from kernel_probe.probe.modelcheck import FLAG, checked
from kernel_probe.probe.planning import Events, Plan, ProbeRequest, SlotRule, large_shape_warning
from kernel_probe.probe.report import Report
from kernel_probe.probe.write import build_lock, check_writable, exclusive, resolve_out


@dataclass
class ProbeResult:
    """What a probe did; ``source``: reused, who wrote the lock for this job ("": it was there)."""

    lock_path: Path
    lock: kernel_lock.KernelLock
    reused: bool
    plan: Plan
    seconds: float = 0.0
    choices: dict[str, Choice] = field(default_factory=dict)
    reports: dict[str, list[Report]] = field(default_factory=dict)
    timings: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    check_seconds: float = 0.0
    time_seconds: float = 0.0
    source: str = ""
    replaced: str = ""  # a probe that replaced a lock: why, as --check says it


def reusable(
    path: Path,
    digest: str,
    trust: Sequence[str] = (),
    profile: Any = None,
    *,
    inputs: Mapping[str, Any] | None = None,
    libraries: Mapping[str, str] | None = None,
    judged: Mapping[str, Sequence[str]] = {},
    model: Model | None = None,
) -> tuple[kernel_lock.KernelLock | None, str]:
    """(the lock, "") if it can be reused; (None, why not) otherwise. Raises for a corrupt lock.
    ``trust``: this run's own candidates' libraries; ``inputs``: this run's options (to name those
    that differ); ``libraries``: the candidates' registry libraries installed now (one installed or
    removed since makes the lock stale); ``judged``: library -> its candidates' ids; ``model``:
    the trace of --model (a lock probed for no model, or for other call sites, is stale)."""
    if not path.exists():
        return None, f"{path} does not exist"
    rerun = "re-run with --force to replace it (nothing was overwritten)"
    try:
        lock = kernel_lock.load(path, emit_warnings=False, trust=tuple(trust))
    except LockError as exc:
        problem = f"the existing lock is not valid: {exc.problem}"
        raise InputFileError(problem, path=str(path), key=exc.key, fix=rerun) from None
    if not lock.intact:
        raise InputFileError(
            "the existing lock was edited by hand (its digest does not match)",
            path=str(path),
            fix="re-run with --force to replace it, or accept the edit with `kernel-probe rehash`",
        )
    now = stale.Probed(
        digest,
        None if inputs is None else stale.recorded_options(inputs),
        libraries,
        profile.lock_record("") if profile is not None else {},
        model,
    )
    # the first difference, the most telling: the model, the profile, the options, the libraries
    for d in stale.differences(stale.Probed.of_lock(lock, judged), now, judged):
        again = " (re-probe to judge them: kernel-probe --out ... without --check)"
        return None, d.why + (again if d.what == "libraries" else "")
    try:  # each slot's class and kwargs as `verify` and `factory` judge them
        lock.verify(targets="child")
    except LockMismatch as exc:
        return None, "this machine differs: " + "; ".join(str(d) for d in exc.differences)
    except LockFormatError as exc:
        fix = (exc.fix + "; or " if exc.fix else "") + rerun
        problem = f"the existing lock is not valid: {exc.problem}"
        raise InputFileError(problem, path=str(path), key=exc.key, fix=fix) from None
    except KernelUnavailable as exc:
        return None, exc.problem
    return lock, ""


def probe_or_reuse(
    request: ProbeRequest,
    p: Plan,
    given: Path,
    events: Events,
    t_start: float,
    *,
    unlocked: str | None = None,
) -> ProbeResult:
    """Reuse the lock at ``given`` if current, else probe and write it under a file lock."""
    # a symbolic link is written through; write access is needed only once a probe will run
    out = given if request.check_only else resolve_out(given)

    def current() -> tuple[ProbeResult | None, str]:
        lock, why = reusable(
            out,
            p.digest,
            p.trust,
            p.profile,
            inputs=p.inputs,
            libraries=p.libraries,
            judged=p.library_candidates,
            model=p.model,
        )
        seconds = time.perf_counter() - t_start
        return (ProbeResult(out, lock, True, p, seconds=seconds) if lock is not None else None), why

    if not request.force:
        if (reused := current())[0] is not None:
            return reused[0]
        if request.check_only:
            raise StaleLock(
                f"{out} is stale or missing: {reused[1]}",
                fix="run `kernel-probe` (without --check) to probe and write it",
            )
    check_writable(out)
    with exclusive(out, request.lock_timeout, events.note) as locked:
        if not locked:
            events.warn(
                unlocked
                or f"{out.parent}: this file system does not do file locks, so concurrent "
                f"probes of {out.name} are not kept apart (each write stays atomic: a reader sees "
                "one whole lock); under a launcher that sets rank variables (Slurm, torchrun, "
                "MPI) one rank probes without them"
            )
        replaced = f"{out}: probing again to replace it (--force)"
        if not request.force:  # another rank may have written it while we waited
            if (reused := current())[0] is not None:
                return reused[0]
            replaced = f"{out} is stale, probing again to replace it: {reused[1]}"
        replaced = replaced if out.exists() else ""
        if replaced:  # in one line, as --check says why it is stale
            events.note(replaced)
        for problem in p.problems:
            events.warn(problem)
        result = probe(p, events)
        if request.model and request.model_check:  # before writing: a diverging lock is not kept
            result.lock = checked(result.lock, request.model, p.trust, events.note, events.warn)
        elif request.model:
            events.note(f"model {request.model}: model check skipped ({FLAG}), none recorded")
        result.lock.dump(out)
    result.lock_path, result.replaced = out, replaced
    result.seconds = time.perf_counter() - t_start
    return result


def probe(p: Plan, events: Events | None = None) -> ProbeResult:
    """Check every candidate, time the accepted ones, choose, build the lock (not written)."""
    from kernel_probe.isolation.worker import START_TIMEOUT, WorkerPool  # pool: not on reuse
    from kernel_probe.probe.check import Checks, Timing, check_and_time  # checker: not on reuse
    from kernel_probe.probe.graph_attention import for_probe  # likewise

    events = events or Events()
    behaviour = {s: slot_behaviour.slot(s) for s in p.slots}
    refuse_too_large(p, behaviour)
    own = [text.partition("=")[2] for text in p.inputs.get("slot_shapes", ())]  # SLOT=SHAPE
    warnings = [large_shape_warning(p.device["type"], [*p.shapes, *own], p.reps)]
    warnings += [line for b in behaviour.values() for line in b.warnings(p.device["type"], p.dtype)]
    for line in filter(None, warnings):
        events.warn(line)
    # fp32 as a sanity baseline, plus the regime the model trains in
    rows = [("float32", "true")] + ([(p.dtype, p.regime)] if p.dtype != "float32" else [])
    request = p.request
    policy = Policy(request.allow_init_change, request.strict_dtype, request.allow_approximation)
    checks = Checks(
        p.device["type"],
        rows,
        arch=p.device["arch"],
        timeout=request.timeout,
        import_timeout=request.import_timeout,
        with_compile=request.with_compile,
        policy=policy,
        canonical=p.canonical,
    )
    fixed = request.reps is not None  # --reps N: N calls for every accepted candidate
    timing = Timing(
        tuple(p.shapes), p.dtype, p.regime, p.reps, events.timing,
        timed_at=p.timed_at, fixed=fixed, weights=p.weights,
    )  # fmt: skip
    # the lock: set below by build_lock, so a returned ProbeResult always has one
    result = ProbeResult(request.out, None, False, p)  # type: ignore[arg-type]
    result.reports, result.timings = {s: [] for s in p.slots}, {s: {} for s in p.slots}
    per_slot = {s: for_slot(p.candidates, s) for s in p.slots}
    events.begin(sum(len(v) for v in per_slot.values()))
    try:
        with WorkerPool(local=local_modules(p.candidates)) as pool:
            refuse = functools.partial(_refused, p)
            for done in check_and_time(
                per_slot, checks, pool, timing=timing, refuse=refuse, checking=events.checking
            ):
                result.reports[done.slot].append(done.report)
                if done.timings is not None:
                    result.timings[done.slot][done.report.id] = done.timings
                result.check_seconds += done.check_seconds
                result.time_seconds += done.time_seconds
            # from the worker whose torch ran the checks: this process never imports torch
            fingerprint = pool.shared.call(FingerprintRequest(), START_TIMEOUT).fields
    finally:
        events.done()
    for name, b in behaviour.items():
        for line in b.notes(p.device["type"], p.dtype, result.timings[name]):
            events.note(line)
    result.choices = choose_all(p, result.reports, result.timings)
    for line in load_warnings(result.choices, result.timings):
        events.warn(line)
    graph = for_probe(
        request, p.device["type"], [d for d, _ in rows], fingerprint, p.deterministic, events.note
    )
    result.lock = build_lock(
        result.choices,
        result.reports,
        result.timings,
        fingerprint,
        precision=p.precision,
        provenance=_provenance(p, result),
        profile=p.profile.lock_record(p.matched) if p.profile else None,
        canonical=p.canonical,
        graph_attention=graph,
        model=p.model,
    )
    return result


def refuse_too_large(p: Plan, behaviour: Mapping[str, slot_behaviour.Slot]) -> None:
    """Raise TooLarge (exit 3) for a shape a slot says this device cannot time, before any worker
    starts, with what to do instead."""
    kind = "cpu" if p.device["type"] == "cpu" else "gpu"
    for name, b in behaviour.items():
        for shape in p.timed_at.get(name, ()):
            if why := b.too_large(shape, kind):
                flag = b.option.flag if b.option and not p.request.model else ""
                smaller = f"; or declare a size this {kind} can time ({flag})" if flag else ""
                raise TooLarge(
                    f"{name} at {shape} cannot be timed on this {kind}: {why}",
                    fix=f"probe where the model trains (a GPU node){smaller}; or leave {name} "
                    "out: --slot for each other slot (nothing was checked or written)",
                )


def _provenance(p: Plan, result: ProbeResult) -> dict[str, Any]:
    """What the lock records of how it was probed."""
    provenance: dict[str, Any] = {
        "inputs": p.digest,
        "command": p.request.command,
        "shapes": list(p.shapes),
        **p.slot_provenance,
        "options": stale.recorded_options(p.inputs),
        "libraries": dict(p.libraries),
        "check-seconds": round(result.check_seconds, 2),
        "time-seconds": round(result.time_seconds, 2),
    }
    if p.deterministic:
        provenance["deterministic"] = True
    if p.not_covered:  # the model's sites the lock leaves as the model has them, and why
        provenance["not-covered"] = list(p.not_covered)
    return provenance


def _refused(p: Plan, slot: str, cand: Candidate) -> str | None:
    """Why ``cand`` is skipped for ``slot`` without being checked (the slot's rule), or None."""
    rule = p.rules.get(slot)
    return rule.refuses(cand.id) if rule is not None else None


def choose_all(
    p: Plan, reports: Mapping[str, list[Report]], timings: Mapping[str, Mapping[str, list]]
) -> dict[str, Choice]:
    """Per slot: the choice under the slot's rule (the command line's, else the profile's)."""
    choices = {}
    for slot in p.slots:
        rule = p.rules.get(slot) or SlotRule()
        choices[slot] = choose(
            slot,
            reports[slot],
            dict(timings[slot]),
            list(p.timed_at[slot]),
            p.dtype,
            default_for(slot).id,
            deterministic=p.deterministic,
            weights=p.weights.get(slot),
            **rule.choice_options(),
        )
    return choices
