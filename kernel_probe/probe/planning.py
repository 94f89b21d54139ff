"""What a probe request means on this machine, decided before any candidate runs: ``plan``
refuses bad arguments (exit 2), a node the profile rules out (exit 4) and a pin that cannot run
here (exit 3), and fixes the :class:`Plan` that ``pipeline`` runs. Nothing here prints: what a
person should see goes to :class:`Events`."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock import torchless as here
from kernel_lock.files import refuse_special
from kernel_lock.model import Model
from kernel_lock.slots import PRECISIONS, slot_name_fix
from kernel_lock.tables import nearest
from kernel_probe import candidates as cands
from kernel_probe import shapes as shaping
from kernel_probe import slots as slot_behaviour
from kernel_probe.candidates import Candidate, for_slot
from kernel_probe.detect.libraries import by_library, installed_for
from kernel_probe.errors import ForcedUnusable, UsageError
from kernel_probe.isolation.protocol import TimingProgressMessage, interpreter_requested
from kernel_probe.probe import frommodel
from kernel_probe.probe.limits import CHECK_TIMEOUT, IMPORT_TIMEOUT, MAX_REPS, MAX_SECONDS
from kernel_probe.probe.report import static_problem
from kernel_probe.probe.write import inputs_digest, trusted_roots

DEFAULT_SHAPES = {"gpu": ("40320x1024", "542080x1024"), "cpu": ("2048x1024",)}
DEFAULT_REPS = {"gpu": 20, "cpu": 5}
DEFAULT_PRECISION = "bf16-mixed"
CPU_LARGE_ELEMENTS = 16 * 1024 * 1024  # 8x the CPU default shape: timing it on a CPU takes minutes


@dataclass(frozen=True)
class ProbeRequest:
    """What to probe, with the command line's defaults. Empty ``shapes``/``slots``: the profile's or
    the defaults; ``candidates``: ``SLOT=dotted.path.Class`` offers; ``probe_per``: who probes
    under a launcher (None: the profile's, else "job"); ``graph_attention``: anemoi's backend to
    check ("": none); ``declared``: per slot, what the model declares (``Slot.option``)."""

    out: Path = Path("kernel-lock.toml")
    shapes: tuple[str, ...] = ()
    precision: str | None = None
    slots: tuple[str, ...] = ()
    pins: Mapping[str, str] = field(default_factory=dict)
    prefers: Mapping[str, str] = field(default_factory=dict)
    candidates: tuple[str, ...] = ()
    plugins: bool = True
    profile: str | None = None
    profiles_dirs: tuple[str, ...] = ()
    reps: int | None = None
    deterministic: bool = False
    with_compile: bool = False
    allow_init_change: bool = False
    strict_dtype: bool = False
    timeout: float = CHECK_TIMEOUT
    import_timeout: float = IMPORT_TIMEOUT
    force: bool = False
    check_only: bool = False
    lock_timeout: float = 1800.0
    command: str = "kernel-probe"  # recorded in the lock's provenance
    probe_per: str | None = None
    graph_attention: str = ""
    allow_graph_attention_fallback: bool = False
    declared: Mapping[str, str] = field(default_factory=dict)
    allow_approximation: bool = False
    model: str = ""  # --model SPEC: the model whose trace decides the slots, semantics and shapes
    model_check: bool = True  # with --model: check the model with the chosen lock


@dataclass(frozen=True, kw_only=True)
class SlotRule:
    """One slot's rule: ``pin`` / ``prefer`` and their ``origin`` ("": the command line, "profile
    NAME"); ``strict_prefer``: a preferred candidate not accepted is an error (``--prefer``), not
    skipped; ``allowed``: the only candidates checked (None: any), and who says so.

    >>> rule = SlotRule(allowed=("torch.layer_norm",), allowed_by="profile lumi-g")
    >>> rule.refuses("liger.layer_norm")
    'not allowed by profile lumi-g'
    >>> rule.refuses("torch.layer_norm") is None
    True
    """

    pin: str | None = None
    prefer: tuple[str, ...] = ()
    origin: str = ""
    strict_prefer: bool = True
    allowed: tuple[str, ...] | None = None
    allowed_by: str = ""

    def refuses(self, cid: str) -> str | None:
        """Why the candidate ``cid`` is skipped without being checked, or None."""
        if self.allowed is not None and cid not in self.allowed:
            return f"not allowed by {self.allowed_by}"
        return None

    def choice_options(self) -> dict[str, Any]:
        """The keyword arguments ``choose.choose`` takes from this rule."""
        if self.origin:
            return dict(
                pin=self.pin, prefer=list(self.prefer), origin=self.origin, strict_prefer=False
            )
        return {"pin": self.pin, "prefer": self.prefer[0] if self.prefer else None}


def slot_rules(
    slots: Sequence[str], pins: Mapping[str, str], prefers: Mapping[str, str], profile: Any = None
) -> dict[str, SlotRule]:
    """Per slot: ``--pin``/``--prefer`` where they name it, else the profile's policy; the
    profile's ``allowed`` holds either way.

    >>> slot_rules(["LayerNorm"], {"LayerNorm": "liger.layer_norm"}, {})["LayerNorm"].pin
    'liger.layer_norm'
    """
    rules = {}
    for slot in slots:
        policy = profile.slots.get(slot) if profile is not None else None
        allowed = None if policy is None or policy.allowed is None else tuple(policy.allowed)
        allowed_by = f"profile {profile.name}" if policy is not None else ""
        rule = functools.partial(SlotRule, allowed=allowed, allowed_by=allowed_by)
        if slot in pins or slot in prefers or policy is None:
            prefer = prefers.get(slot)
            rules[slot] = rule(pin=pins.get(slot), prefer=(prefer,) if prefer else ())
        else:
            preferred = tuple(policy.preferred)
            rules[slot] = rule(
                pin=policy.pin, prefer=preferred, origin=allowed_by, strict_prefer=False
            )
    return rules


@dataclass(frozen=True)
class Plan:
    """What a request means here. Per slot: ``canonical`` (what its declaration pins), ``timed_at``
    (its shapes), ``resolved`` (its declared value or default), ``rules``; ``inputs``: the options
    digested; ``libraries``: the candidates' registry libraries (version, "installed", "": absent),
    ``library_candidates``: their candidates' ids."""

    request: ProbeRequest
    device: Mapping[str, Any]
    profile: Any  # kernel_probe.profiles.Profile | None
    matched: str
    candidates: tuple[Candidate, ...]
    problems: tuple[str, ...]  # candidates that could not be offered (broken plug-ins)
    slots: tuple[str, ...]
    shapes: tuple[str, ...]
    shapes_from: str  # "" (asked for), "profile NAME" or "defaults"
    precision: str
    reps: int
    deterministic: bool
    digest: str  # of the inputs: a lock probed with other inputs is not reused
    trust: tuple[str, ...]
    canonical: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    timed_at: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    slot_provenance: Mapping[str, Any] = field(default_factory=dict)
    resolved: Mapping[str, str] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    libraries: Mapping[str, str] = field(default_factory=dict)
    library_candidates: Mapping[str, Sequence[str]] = field(default_factory=dict)
    rules: Mapping[str, SlotRule] = field(default_factory=dict)
    model: Model | None = None  # the trace of --model: the lock records it
    weights: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # shape -> calls
    not_covered: tuple[str, ...] = ()  # the model's sites the lock leaves as they are, and why

    @property
    def dtype(self) -> str:
        """The dtype the plan's precision checks and times in."""
        return PRECISIONS[self.precision].dtype

    @property
    def regime(self) -> str:
        """The regime of the plan's precision (true or mixed)."""
        return PRECISIONS[self.precision].regime


class Events:
    """What a probe tells a person while it runs (ignored here; the command line prints it)."""

    def note(self, text: str) -> None:
        """Something worth a line (the profile auto-detected, ...)."""

    def warn(self, text: str) -> None:
        """Something the user should act on that does not stop the probe."""

    def begin(self, total: int) -> None:
        """Checking starts: ``total`` candidates."""

    def checking(self, slot: str, cand_id: str, index: int, total: int) -> None:
        """Candidate ``index`` (1-based) of ``total`` is being checked."""

    def timing(
        self, slot: str, cand_id: str, shapes: Sequence[str], message: TimingProgressMessage | None
    ) -> None:
        """A candidate's timing started (``message`` None) or progressed."""

    def done(self) -> None:
        """Checking and timing are over (also after an error)."""


def large_shape_warning(device_type: str, shapes: Sequence[str], reps: int) -> str | None:
    """On a CPU, the warning that GPU-sized shapes take minutes to time, and what to do instead."""
    if device_type != "cpu":
        return None
    large = [s for s in shapes if shaping.shape_work(s) > CPU_LARGE_ELEMENTS]
    if not large:
        return None
    return (
        f"{', '.join(large)} "
        f"{'is a GPU-sized shape' if len(large) == 1 else 'are GPU-sized shapes'}: on a CPU, "
        f"timing every accepted candidate ({reps} repetitions, plus warm-up) can take minutes; "
        "progress follows per shape and repetition. For a CPU lock use the CPU default "
        f"({DEFAULT_SHAPES['cpu'][0]}: drop --shape), or lower --reps"
    )


def detect_device() -> dict[str, Any]:
    """This machine's device facts, read without torch where every one of them can be."""
    return here.device_here()


def gather_candidates(
    offered: Sequence[str], extra: Sequence[Candidate] = (), *, plugins: bool = True
) -> tuple[list[Candidate], list[str]]:
    """(the registry with ``extra`` and the ``SLOT=dotted.path.Class`` offers, problems)."""
    offers = [*extra, *(cands.from_command_line(text) for text in offered)]
    return cands.registry(offers, entry_points=plugins)


def plan(request: ProbeRequest, events: Events | None = None) -> Plan:
    """Decide what ``request`` means here (the module docstring's refusals first)."""
    events = events or Events()
    asked, own = _refuse_bad_arguments(request)
    slot_problems = slot_behaviour.load_plugins() if request.plugins else []
    forced = (("--pin", request.pins), ("--prefer", request.prefers))
    slots = select_slots(request.slots, request.declared, forced)
    shaping.refuse_misread(asked, own, {name: slot_behaviour.slot(name) for name in slots})
    device = detect_device()
    profile, matched = _apply_profile(request, device, events)
    precision = request.precision or (profile and profile.precision) or DEFAULT_PRECISION
    # with --model, the model's trace decides the slots, their semantics and their shapes
    traced = frommodel.for_request(request, precision, events.note)
    slots = traced.slots if traced is not None else slots
    rules = slot_rules(slots, request.pins, request.prefers, profile)
    candidates, problems = gather_candidates(
        request.candidates, list(profile.candidates) if profile else [], plugins=request.plugins
    )
    problems = [*slot_problems, *problems]
    if interpreter_requested():
        problems.append(
            "TRITON_INTERPRET is set: Triton kernels run in Triton's interpreter, not compiled; a "
            "candidate whose kernels ran interpreted is labelled so, never timed and never written "
            "to the lock"
        )
    check_forced(request, slots, candidates, device, rules)
    kind = "cpu" if device["type"] == "cpu" else "gpu"
    if traced is not None:
        shapes, shapes_from = traced.shapes, f"model {request.model}"
    elif asked:
        shapes, shapes_from = asked, ""
    elif profile and profile.shapes:
        shapes, shapes_from = shaping.normal_shapes(profile.shapes), f"profile {profile.name}"
    else:
        shapes, shapes_from = DEFAULT_SHAPES[kind], "defaults"
    deterministic = request.deterministic or bool(profile and profile.deterministic)
    inputs = _inputs(request, candidates, profile, precision, shapes, slots, deterministic)
    per_slot = _per_slot(request, slots, kind, (shapes, own), traced, inputs)
    probed = [c for c in candidates if set(c.slots) & set(slots)]
    return Plan(
        request=request,
        device=device,
        profile=profile,
        matched=matched,
        candidates=tuple(candidates),
        problems=tuple(problems),
        slots=slots,
        shapes=shapes,
        shapes_from=shapes_from,
        precision=precision,
        reps=request.reps or DEFAULT_REPS[kind],
        deterministic=deterministic,
        digest=inputs_digest(inputs),
        trust=trusted_roots(candidates),
        inputs=inputs,
        libraries=installed_for(probed),
        library_candidates=by_library(probed),
        rules=rules,
        **per_slot,
    )


def _per_slot(
    request: ProbeRequest,
    slots: Sequence[str],
    kind: str,
    shaped: shaping.Split,
    traced: frommodel.Traced | None,
    inputs: dict[str, Any],
) -> dict[str, Any]:
    """The plan's per-slot fields, from each slot's declaration or the model's trace (``inputs``
    gains the slots' own, their own --shape SLOT=SHAPE and the trace's digest)."""
    shapes, own = shaped
    inputs.update(shaping.recorded(own))
    declared = {name: request.declared.get(name, "") for name in slots}
    if traced is not None:
        declared = {name: traced.uses[name].declared for name in slots}
        inputs["model"] = traced.model.digest
    behaviour = {name: slot_behaviour.slot(name) for name in slots}
    ordered = [n for n in slot_behaviour.SLOTS if n in slots]  # the slots' order
    for name in ordered:
        inputs.update(behaviour[name].inputs(declared[name], kind))
    canonical = {n: b.canonical(declared[n], kind) for n, b in behaviour.items()}
    timed_at = {n: b.shapes(declared[n], kind, own.get(n, shapes)) for n, b in behaviour.items()}
    return {
        "canonical": {n: c for n, c in canonical.items() if c},
        "timed_at": timed_at,
        "slot_provenance": {
            k: v for n in ordered for k, v in behaviour[n].provenance(declared[n], kind).items()
        },
        "resolved": {
            n: s.resolved({**request.declared, **declared}.get(n, ""), kind)
            for n, s in slot_behaviour.SLOTS.items()
        },
        **(traced.plan_fields() if traced is not None else {}),
    }


def _inputs(
    request: ProbeRequest,
    candidates: Sequence[Candidate],
    profile: Any,
    precision: str,
    shapes: Sequence[str],
    slots: Sequence[str],
    deterministic: bool,
) -> dict[str, Any]:
    """The options the inputs digest is of, before the slots' own."""
    inputs = {
        "precision": precision,
        "shapes": list(shapes),
        "slots": list(slots),
        "pins": dict(request.pins),
        "prefers": dict(request.prefers),
        "candidates": sorted(f"{c.id}={c.target}" for c in candidates),
        "with_compile": request.with_compile,
        "profile": profile.digest if profile else None,
        "deterministic": deterministic,
        "allow_init_change": request.allow_init_change,
        "strict_dtype": request.strict_dtype,
    }
    # only when asked: a lock probed without them stays reusable as before
    if request.graph_attention:
        inputs["graph_attention"] = request.graph_attention
        inputs["allow_graph_attention_fallback"] = request.allow_graph_attention_fallback
    if request.allow_approximation:
        inputs["allow_approximation"] = True
    return inputs


def _refuse_bad_arguments(request: ProbeRequest) -> shaping.Split:
    """Every argument checked before any work (exit 2): shapes, repetitions, time limits,
    precision, the slots' declarations, ``--check`` with ``--force``; the shapes, normalised."""
    try:
        asked = shaping.split_shapes(request.shapes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if request.reps is not None and not 1 <= request.reps <= MAX_REPS:
        raise UsageError(f"--reps must be a whole number from 1 to {MAX_REPS}, not {request.reps}")
    for flag, value in (
        ("--timeout", request.timeout),
        ("--import-timeout", request.import_timeout),
        ("--lock-timeout", request.lock_timeout),
    ):
        if not (
            isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= MAX_SECONDS
        ):
            raise UsageError(
                f"{flag} must be a positive, finite number of seconds, at most "
                f"{MAX_SECONDS:g}, not {value}"
            )
    if request.precision is not None and request.precision not in PRECISIONS:
        raise UsageError(
            f"unknown precision {request.precision!r}", fix=f"use one of {', '.join(PRECISIONS)}"
        )
    refuse_declared(request.declared)
    frommodel.refuse(request)
    if request.check_only and request.force:
        raise UsageError("--check and --force contradict each other")
    if not request.check_only:  # a pipe (/dev/stdout) would be waited on, never written
        refuse_special(request.out, "--out")
    return asked


def select_slots(
    named: Sequence[str],
    declared: Mapping[str, str] | None = None,
    forced: Sequence[tuple[str, Mapping[str, str]]] = (),
) -> tuple[str, ...]:
    """The slots named (--slot; an unknown one, or one ``forced`` pairs name, is exit 2), else
    those each slot's declaration wants (none declared: the default ones)."""
    known = slot_behaviour.SLOTS
    pairs = [(f"{flag} {f'{n}={c}'!r}", n) for flag, given in forced for n, c in given.items()]
    for said, name in [*pairs, *((f"--slot {n}", n) for n in named)]:
        if name not in known:
            raise UsageError(f"{said}: unknown slot {name!r}", fix=slot_name_fix(name))
    wanted = (s.name for s in known.values() if s.wanted((declared or {}).get(s.name, "")))
    return tuple(named) or tuple(wanted)


def refuse_declared(declared: Mapping[str, str]) -> None:
    """What the model declares of each slot (``Slot.option``), checked (exit 2)."""
    for name, value in declared.items():
        if value:
            slot_behaviour.slot(name).refuse(value)


def _apply_profile(
    request: ProbeRequest, device: Mapping[str, Any], events: Events
) -> tuple[Any, str]:
    """Load the profile (or auto-detect it), enforce its requirements (exit 4 on unmet)."""
    if not request.profile:
        return None, ""
    from kernel_probe import profile_match  # never imported by a run without a profile

    judged = profile_match.judge(request.profile, request.profiles_dirs, device, here.for_check)
    for note in judged.notes:
        events.note(f"profile {request.profile}: {note}")
    if (profile := judged.profile) is None:
        events.note("profile auto: no profile's site signals matched this machine; none applied")
        return None, ""
    if request.profile == "auto":
        events.note(f"profile auto: {profile.name} (matched {judged.matched})")
    for refusal in (judged.site_refusal, judged.refusal):
        if refusal is not None:
            raise refusal
    for warning in judged.warnings:
        events.warn(warning)
    return profile, judged.matched


def check_forced(
    request: ProbeRequest,
    slots: Sequence[str],
    candidates: Sequence[Candidate],
    device: Mapping[str, Any],
    rules: Mapping[str, SlotRule],
) -> None:
    """Every --pin/--prefer checked before any work: the slot is probed, the id is its candidate,
    the profile allows it (exit 2), and it can run here as far as known unimported (exit 3)."""
    for flag, forced in (("--pin", request.pins), ("--prefer", request.prefers)):
        for slot, cid in forced.items():
            said = f"{flag} {slot}={cid}"
            if slot not in slots:
                raise UsageError(
                    f"{said}: but --slot limits this probe to {', '.join(slots)}",
                    fix=f"add --slot {slot}, or drop {said}",
                )
            offered = {c.id: c for c in for_slot(candidates, slot)}
            if cid not in offered:
                near = f"did you mean {nearest(cid, offered)!r}? " if nearest(cid, offered) else ""
                raise UsageError(
                    f"{said}: {cid!r} is not a candidate for {slot} (known: {', '.join(offered)})",
                    fix=f"{near}use one of those ids, or offer your own class with --candidate "
                    f"{slot}=module.Class",
                )
            rule = rules[slot]
            if rule.allowed is not None and rule.refuses(cid):
                raise UsageError(
                    f"{said}: {rule.allowed_by} does not allow it for {slot} "
                    f"(allowed: {', '.join(rule.allowed) or 'none: allowed = []'})",
                    fix=f"drop {said}, or use a profile that allows it",
                )
            arch, compiling = device.get("arch") or "", request.with_compile
            if problem := static_problem(
                offered[cid], slot, device["type"], arch, with_compile=compiling
            ):
                fix = f"drop {said}, or run on a machine where it can run"
                fix = "add --with-compile" if problem.status == "skipped" else fix
                raise ForcedUnusable(
                    f"{said}: the candidate is {problem.status} on this machine: {problem.reason}",
                    fix=fix + "; a pinned or preferred kernel is never silently replaced",
                )
