"""What a probe request means on this machine, decided before any candidate runs.

    p = planning.plan(ProbeRequest(shapes=("40320x1024",)))

``plan`` refuses every bad argument before any work (exit 2), a node the profile rules out (exit 4)
and a pin that cannot run here (exit 3); it detects the device, applies the site profile and its
per-slot rules, gathers the candidates and fixes the shapes, precision and repetitions, and the
digest of the inputs by which a lock is reused or probed again. ``kernel_probe.probe.pipeline``
runs the :class:`Plan`. Nothing here prints: what a person should see goes to an :class:`Events`
object.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_lock.format.slots import PRECISIONS, PROBED_BY_DEFAULT
from kernel_probe.errors import ForcedUnusable, UsageError
from kernel_probe.probe.limits import CHECK_TIMEOUT, IMPORT_TIMEOUT
from kernel_probe.probe.rules import SlotRule, slot_rules
from kernel_probe.shapes import normal_shapes, parse_shape

if TYPE_CHECKING:  # the warm path (a current lock) imports none of the probe's machinery
    from kernel_probe.candidates import Candidate
    from kernel_probe.isolation.protocol import TimingProgressMessage

DEFAULT_SHAPES = {"gpu": ("40320x1024", "542080x1024"), "cpu": ("2048x1024",)}
DEFAULT_REPS = {"gpu": 20, "cpu": 5}
DEFAULT_PRECISION = "bf16-mixed"
CPU_LARGE_ELEMENTS = (
    16 * 1024 * 1024
)  # 8x the CPU default shape: beyond it, timing on a CPU takes minutes


@dataclass(frozen=True)
class ProbeRequest:
    """What to probe; every field has the command line's default. Empty ``shapes``/``slots`` mean
    the profile's or the defaults; ``candidates`` are extra ``SLOT=dotted.path.Class`` offers."""

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
    # who probes where the launcher names this process's rank (kernel_probe.jobstart.ranks): "job"
    # (rank 0), "node-type" (one rank per kind of node; --out names {node-type}), "rank" (each rank
    # under the file lock); None: the profile's [policy] probe-per, else "job"
    probe_per: str | None = None
    # the Attention slot's timing geometry (HEADSxHEAD_DIMxSEQ[:window=W]); "": the default for the
    # device
    attention: str = ""
    # anemoi's GraphTransformer attention backend (kernel_probe.probe.graph_attention_check): "" =
    # not checked, "auto", "triton" or "pyg"; and whether a locked triton may fall back to pyg at
    # job start
    graph_attention: str = ""
    allow_graph_attention_fallback: bool = False
    # the model's gated mlp_implementation (kernel_lock.format.gating): "" leaves GatedMLP out
    # unless it is named
    mlp_implementation: str = ""
    # the Activation slot: the model's function
    # (kernel_lock.format.activations.ACTIVATION_FUNCTIONS, or other:module.Class; "":
    # torch.nn.GELU's gelu-erf), and whether an approximation of it may be accepted (recorded)
    activation: str = ""
    allow_approximation: bool = False


@dataclass(frozen=True)
class Plan:
    """What a request means on this machine, decided before any candidate runs."""

    request: ProbeRequest
    device: Mapping[str, Any]
    profile: Any  # kernel_probe.profiles.format.Profile | None
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
    attention: str = ""  # the Attention slot's timing geometry (attention_geometry)

    @property
    def canonical(self) -> dict[str, dict[str, Any]]:
        """Per slot, the canonical values the request sets: the model's attention window."""
        from kernel_probe.probe.attention_geometry import parse_geometry

        options = dict(parse_geometry(self.attention).options) if self.attention else {}
        out: dict[str, dict[str, Any]] = {"Attention": options} if options else {}
        if self.request.mlp_implementation:  # the model's gate, pinned in slots.GatedMLP's kwargs
            out["GatedMLP"] = {"mlp_implementation": self.request.mlp_implementation}
        # the model's activation function (the Activation slot's reference)
        if self.request.activation:
            out["Activation"] = {"function": self.request.activation}
        return out

    # the options the digest is of (recorded in the lock, so a lock probed with others can say which
    # differ)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    # the registry libraries this plan's candidates come from: version, "installed" or "" (not
    # installed)
    libraries: Mapping[str, str] = field(default_factory=dict)
    # library -> its candidates' ids
    library_candidates: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # per slot, what the command line and the profile say of it (rules.SlotRule): the one answer the
    # probe reads
    rules: Mapping[str, SlotRule] = field(default_factory=dict)

    @property
    def dtype(self) -> str:
        """The dtype the plan's precision checks and times in."""
        return PRECISIONS[self.precision].dtype

    @property
    def regime(self) -> str:
        """The regime of the plan's precision (true or mixed)."""
        return PRECISIONS[self.precision].regime


class Events:
    """What a probe tells a person while it runs. The defaults ignore everything; the command line
    subclasses it to print."""

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
        """A candidate's timing started (``message`` None) or progressed (a worker progress
        message)."""

    def done(self) -> None:
        """Checking and timing are over (also after an error)."""


def large_shape_warning(device_type: str, shapes: Sequence[str], reps: int) -> str | None:
    """On a CPU, the warning that GPU-sized shapes take minutes to time, and what to do instead."""
    if device_type != "cpu":
        return None
    large = [s for s in shapes if parse_shape(s)[0] * parse_shape(s)[1] > CPU_LARGE_ELEMENTS]
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
    """This machine's device facts (``kernel_lock.fingerprint.device_facts``): read without torch
    where every one of them can be (``kernel_lock.torchless``), else from torch."""
    from kernel_lock.torchless import device_here

    return device_here()


def gather_candidates(
    offered: Sequence[str], extra: Sequence[Candidate] = (), *, plugins: bool = True
):
    """(the registry with ``extra`` and the ``SLOT=dotted.path.Class`` offers, problems)."""
    from kernel_probe import candidates as cands

    return cands.registry(
        [*extra, *(cands.from_command_line(text) for text in offered)], entry_points=plugins
    )


def _refuse_bad_arguments(request: ProbeRequest) -> tuple[str, ...]:
    """The request's first stage: every argument checked before any work (exit 2), in this order:
    the shapes, repetitions, time limits, precision, the attention geometry, the activation
    function, ``--check`` with ``--force`` and the gate; the shapes asked for, normalised."""
    try:
        asked = normal_shapes(request.shapes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from kernel_probe.probe.limits import MAX_REPS, MAX_SECONDS

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
    if request.attention:
        from kernel_probe.probe.attention_geometry import FORM, parse_geometry

        try:
            parse_geometry(request.attention)
        except ValueError as exc:
            raise UsageError(
                f"--attention {exc}", fix=f"write it {FORM}, e.g. 16x128x40320:window=512"
            ) from None
    if request.activation:
        from kernel_lock.format.activations import function_problem

        problem = function_problem(request.activation)
        if problem:
            raise UsageError(
                f"--activation {problem}",
                fix="name the model's activation function, e.g. --activation gelu-erf",
            )
    if request.check_only and request.force:
        raise UsageError("--check and --force contradict each other")
    if request.mlp_implementation:
        from kernel_lock.format.gating import gate_for

        try:
            gate_for(request.mlp_implementation)
        except ValueError as exc:
            raise UsageError(f"--mlp-implementation: {exc}") from None
    return asked


def plan(request: ProbeRequest, events: Events | None = None) -> Plan:
    """Decide what ``request`` means here, refusing every bad argument before any work (exit 2), a
    node the profile rules out (exit 4) and a pin that cannot run here (exit 3)."""
    events = events or Events()
    asked = _refuse_bad_arguments(request)
    # a model with a gated mlp_implementation has the GatedMLP slot too
    slots = tuple(request.slots) or PROBED_BY_DEFAULT + (
        ("GatedMLP",) if request.mlp_implementation else ()
    )
    device = detect_device()
    profile, matched = _apply_profile(request, device, events)
    # the chain: the profile, its per-slot rules with the command line's, the candidates, the forced
    rules = slot_rules(slots, request.pins, request.prefers, profile)
    candidates, problems = gather_candidates(
        request.candidates, list(profile.candidates) if profile else [], plugins=request.plugins
    )
    from kernel_probe.isolation.protocol import interpreter_requested

    if interpreter_requested():
        problems = [
            *problems,
            "TRITON_INTERPRET is set: Triton kernels run in Triton's interpreter, not "
            "compiled; a candidate whose "
            "kernels ran interpreted is labelled so, never timed and never written to the lock",
        ]
    check_forced(
        request.pins,
        request.prefers,
        slots,
        candidates,
        device,
        rules=rules,
        with_compile=request.with_compile,
    )
    kind = "cpu" if device["type"] == "cpu" else "gpu"
    if asked:
        shapes, shapes_from = asked, ""
    elif profile and profile.shapes:
        shapes, shapes_from = normal_shapes(profile.shapes), f"profile {profile.name}"
    else:
        shapes, shapes_from = DEFAULT_SHAPES[kind], "defaults"
    precision = request.precision or (
        profile.precision if profile and profile.precision else DEFAULT_PRECISION
    )
    deterministic = request.deterministic or bool(profile and profile.deterministic)
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
    from kernel_probe.probe.attention_geometry import DEFAULT_GEOMETRY

    attention = request.attention or DEFAULT_GEOMETRY[kind]
    if "Attention" in slots:
        inputs["attention"] = attention
    # only when asked: a lock probed without it stays reusable as before
    if request.graph_attention:
        inputs["graph_attention"] = request.graph_attention
        inputs["allow_graph_attention_fallback"] = request.allow_graph_attention_fallback
    if "GatedMLP" in slots:
        inputs["mlp_implementation"] = request.mlp_implementation or "swiglu"
    if "Activation" in slots:
        from kernel_lock.format.slots import CANONICAL

        inputs["activation"] = request.activation or CANONICAL["Activation"]["function"]
    if request.allow_approximation:
        inputs["allow_approximation"] = True
    from kernel_probe.detect.libraries import by_library, installed_for

    probed = [c for c in candidates if set(c.slots) & set(slots)]
    from kernel_probe.probe.write import inputs_digest, trusted_roots

    return Plan(
        request,
        device,
        profile,
        matched,
        tuple(candidates),
        tuple(problems),
        slots,
        shapes,
        shapes_from,
        precision,
        request.reps or DEFAULT_REPS[kind],
        deterministic,
        inputs_digest(inputs),
        trusted_roots(candidates),
        attention,
        inputs,
        installed_for(probed),
        by_library(probed),
        rules,
    )


def _apply_profile(request: ProbeRequest, device: Mapping[str, Any], events: Events):
    """Load the profile (or auto-detect it), enforce its requirements (exit 4 on unmet)."""
    if not request.profile:
        return None, ""
    from kernel_lock import torchless
    from kernel_probe.profiles import discovery, requirements

    dirs = request.profiles_dirs
    # the directories surveyed once, for the profile named and for the site's signals alike
    found = None
    if not discovery.names_file(request.profile):
        found = discovery.survey(dirs)
    profile, matched, notes = requirements.choose(request.profile, dirs, device, found=found)
    for note in notes:
        events.note(f"profile {request.profile}: {note}")
    if profile is None:
        events.note("profile auto: no profile's site signals matched this machine; none applied")
        return None, ""
    if request.profile == "auto":
        events.note(f"profile auto: {profile.name} (matched {matched})")
    else:  # named: a node that its site signals place at another site is not this profile's
        seen, seen_by, _ = requirements.choose("auto", dirs, device, found=found)
        requirements.other_site(profile, seen, seen_by)
    libs = requirements.library_facts(requirements.required_libraries(profile))
    for warning in requirements.enforce(profile, torchless.for_check(), libs):
        events.warn(warning)
    return profile, matched


def check_forced(
    pins: Mapping[str, str],
    prefers: Mapping[str, str],
    slots: Sequence[str],
    candidates: Sequence[Candidate],
    device: Mapping[str, Any],
    *,
    rules: Mapping[str, SlotRule] | None = None,
    with_compile: bool = False,
) -> None:
    """Every --pin/--prefer checked before any work: the slot is probed, the id is a candidate of it
    (exit 2), the profile allows it (exit 2), and it can run here as far as is known without
    importing it (exit 3, with the reason and how to install it)."""
    from kernel_probe.candidates import for_slot

    for flag, forced in (("--pin", pins), ("--prefer", prefers)):
        for slot, cid in forced.items():
            said = f"{flag} {slot}={cid}"
            if slot not in slots:
                raise UsageError(
                    f"{said}: but --slot limits this probe to {', '.join(slots)}",
                    fix=f"add --slot {slot}, or drop {said}",
                )
            ids = [c.id for c in for_slot(candidates, slot)]
            if cid not in ids:
                raise UsageError(
                    f"{said}: {cid!r} is not a candidate for {slot} (known: {', '.join(ids)})",
                    fix="use one of those ids, or offer your own class with --candidate "
                    f"{slot}=module.Class",
                )
            rule = (rules or {}).get(slot)
            if rule is not None and rule.allowed is not None and rule.refuses(cid):
                raise UsageError(
                    f"{said}: {rule.allowed_by} does not allow it for {slot} "
                    f"(allowed: {', '.join(rule.allowed) or 'none: allowed = []'})",
                    fix=f"drop {said}, or use a profile that allows it",
                )
            from kernel_probe.probe.judge import static_problem  # only when something is forced

            cand = next(c for c in for_slot(candidates, slot) if c.id == cid)
            problem = static_problem(
                cand, slot, device["type"], device.get("arch") or "", with_compile=with_compile
            )
            if problem:
                status, reason = problem.status, problem.reason
                fix = (
                    "add --with-compile"
                    if status == "skipped"
                    else f"drop {said}, or run on a machine where it can run"
                )
                raise ForcedUnusable(
                    f"{said}: the candidate is {status} on this machine: {reason}",
                    fix=fix + "; a pinned or preferred kernel is never silently replaced",
                )
