"""The probe as a library: a planned request in, a typed result out.

``probe_or_reuse`` reuses the lock if it answers the plan (``planning``), else checks every
candidate in an isolated worker, times the accepted ones, chooses per slot and writes the lock under
a file lock. It knows nothing of ranks (``kernel_probe.jobstart``) and prints nothing: what a person
should see goes to :class:`Events`, every failure they can act on is a ``LockError``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kernel_lock
from kernel_lock.errors import KernelUnavailable, LockError, LockFormatError, LockMismatch
from kernel_lock.model import Model, site_differences
from kernel_probe import slots as slot_behaviour
from kernel_probe.candidates import Candidate, default_for, for_slot, local_modules
from kernel_probe.detect.libraries import library_change
from kernel_probe.errors import InputFileError, StaleLock
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


# the options of the inputs digest as a person names them: these, and the flags of _FLAGS
OPTION_NAMES = {"shapes": "--shape", "slots": "--slot", "pins": "--pin", "prefers": "--prefer"}
OPTION_NAMES |= {"candidates": "candidates", "profile": "the profile's digest"}
OPTION_NAMES |= {"model": "--model (the trace's digest)"}
_FLAGS = ("precision", "with_compile", "deterministic", "allow_init_change", "strict_dtype")
_FLAGS_TOO = ("graph_attention", "allow_graph_attention_fallback", "allow_approximation")
OPTION_NAMES |= {key: "--" + key.replace("_", "-") for key in (*_FLAGS, *_FLAGS_TOO)}


def _option_name(key: str) -> str:
    """How a person names the option behind a digest key (a slot's: its declaring flag)."""
    for s in slot_behaviour.SLOTS.values():
        if s.option is not None and key in s.inputs("", "cpu"):
            return s.option.flag
    return OPTION_NAMES.get(key, key)


def _flat(value: Any) -> Any:
    """An option as the lock records it: a scalar (a list or table joined with ", "; absent: "")."""
    if value is None:
        return ""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return value


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value) if value != "" else "none"


def options_change(recorded: Mapping[str, Any] | None, now: Mapping[str, Any]) -> str:
    """The options that differ between a lock's (``provenance.options``) and this run's, old and
    new value each; the general reason for an older lock that records none."""
    if not isinstance(recorded, Mapping) or not recorded:
        return "it was probed with other options (shapes, precision, candidates, pins or profile)"
    changes = []
    for key, value in recorded_options(now).items():
        old = recorded.get(key, "")
        if old == value:
            continue
        if key == "candidates" and isinstance(old, str):
            was, new = set(filter(None, old.split(", "))), set(filter(None, value.split(", ")))
            parts = [f"new {', '.join(sorted(new - was))}"] if new - was else []
            parts += [f"no longer {', '.join(sorted(was - new))}"] if was - new else []
            changes.append(f"candidates: {'; '.join(parts)}")
        else:
            changes.append(f"{_option_name(key)}: {_shown(old)} -> {_shown(value)}")
    unknown = sorted(set(recorded) - set(now))
    if unknown:  # a newer kernel-probe's option
        changes.append(f"options this kernel-probe does not know: {', '.join(unknown)}")
    said = "; ".join(changes) or "(the same values, another encoding)"
    return "it was probed with other options: " + said


def recorded_options(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs as the lock records them (``provenance.options``): one scalar each."""
    return {k: _flat(v) for k, v in inputs.items()}


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
    if why := _other_model(lock, model):
        return None, why
    if lock.provenance.get("inputs") != digest:
        from kernel_probe.profile_match import profile_change  # only where a lock is stale

        # why: the profile's change where it changed, else the options that differ
        options = options_change(lock.provenance.get("options"), inputs or {})
        return None, profile_change(lock.profile, profile) or options
    if libraries is not None:
        changed = library_change(_recorded_libraries(lock, judged), libraries, judged)
        if changed:
            return (
                None,
                f"{changed} (re-probe to judge them: kernel-probe --out ... without --check)",
            )
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


def _other_model(lock: kernel_lock.KernelLock, model: Model | None) -> str:
    """Why the lock was not probed for ``model``'s trace (None: for no model); "" when it was."""
    if model is None:
        spec = lock.model.spec if lock.model is not None else ""
        return (
            f"it was probed for the model {spec}: check or probe it with --model {spec}"
            if spec
            else ""
        )
    if lock.model is None:
        return "it was not probed for a model (it has no [model] table): probe with --model"
    if lock.model.digest == model.digest:
        return ""
    differences = "; ".join(site_differences(lock.model, model))
    return f"it was probed for another model or other sizes: {differences}"


def _recorded_libraries(
    lock: kernel_lock.KernelLock, judged: Mapping[str, Sequence[str]]
) -> dict[str, str]:
    """What the lock's probe saw installed; a library it did not record (an older lock, or one
    keyed by a submodule before issue 52): "" where all its candidates' rows say not installed."""
    recorded = lock.provenance.get("libraries")
    out = {str(k): str(v) for k, v in recorded.items()} if isinstance(recorded, Mapping) else {}
    for name, ids in judged.items():
        if name in out:
            continue
        rows = [r for s in lock.slots for r in lock.slots[s].rejected if r.implementation in ids]
        if rows and all(any("not installed" in reason for reason in r.reasons) for r in rows):
            out[name] = ""
    return out


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

    def current() -> tuple[kernel_lock.KernelLock | None, str]:
        return reusable(
            out,
            p.digest,
            p.trust,
            p.profile,
            inputs=p.inputs,
            libraries=p.libraries,
            judged=p.library_candidates,
            model=p.model,
        )

    if not request.force:
        lock, why = current()
        if lock is not None:
            return ProbeResult(out, lock, True, p, seconds=time.perf_counter() - t_start)
        if request.check_only:
            raise StaleLock(
                f"{out} is stale or missing: {why}",
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
        if not request.force:  # another rank may have written it while we waited
            lock, _ = current()
            if lock is not None:
                return ProbeResult(out, lock, True, p, seconds=time.perf_counter() - t_start)
        for problem in p.problems:
            events.warn(problem)
        result = probe(p, events)
        if request.model and request.model_check:  # before writing: a diverging lock is not kept
            result.lock = checked(result.lock, request.model, p.trust, events.note, events.warn)
        elif request.model:
            events.note(f"model {request.model}: model check skipped ({FLAG}), none recorded")
        result.lock.dump(out)
    result.lock_path = out
    result.seconds = time.perf_counter() - t_start
    return result


def probe(p: Plan, events: Events | None = None) -> ProbeResult:
    """Check every candidate, time the accepted ones, choose, build the lock (not written)."""
    from kernel_probe.isolation.worker import START_TIMEOUT, WorkerPool  # pool: not on reuse
    from kernel_probe.probe.check import Checks, Timing, check_and_time  # checker: not on reuse
    from kernel_probe.probe.graph_attention import for_probe  # likewise

    events = events or Events()
    behaviour = {s: slot_behaviour.slot(s) for s in p.slots}
    warnings = [large_shape_warning(p.device["type"], p.shapes, p.reps)]
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
            fingerprint = pool.shared.call({"op": "fingerprint"}, START_TIMEOUT).fields
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


def _provenance(p: Plan, result: ProbeResult) -> dict[str, Any]:
    """What the lock records of how it was probed."""
    provenance: dict[str, Any] = {
        "inputs": p.digest,
        "command": p.request.command,
        "shapes": list(p.shapes),
        **p.slot_provenance,
        "options": recorded_options(p.inputs),
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
