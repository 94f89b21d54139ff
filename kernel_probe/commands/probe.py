"""The main command: detect, check, time, choose, write the lock — or reuse the one that is there."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import kernel_lock
from kernel_lock.errors import LockError, LockMismatch
from kernel_lock.lock import SLOTS

from .. import output
from ..output import safe
from ..errors import InputFileError, StaleLock, UsageError
from .check import add_candidate_arguments, detect_device, gather_candidates, policy_from
from .lockcmds import DEFAULT_LOCK

PRECISIONS = {  # Lightning / anemoi names -> (dtype, regime)
    "32-true": ("float32", "true"),
    "bf16-true": ("bfloat16", "true"),
    "16-true": ("float16", "true"),
    "bf16-mixed": ("bfloat16", "mixed"),
    "16-mixed": ("float16", "mixed"),
}
DEFAULT_SHAPES = {"gpu": ["40320x1024", "542080x1024"], "cpu": ["2048x1024"]}
DEFAULT_REPS = {"gpu": 20, "cpu": 5}
TIMING_TIMEOUT = 600.0  # seconds one candidate's timing at every shape may take (it passed its checks already)  # CPU timings of bf16 under autocast are slow; 5 keep a cold probe short


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=DEFAULT_LOCK, help=f"where to write the lock (default ./{DEFAULT_LOCK})")
    p.add_argument("--shape", action="append", default=[], metavar="ROWSxHIDDEN",
                   help="model shape to time at, e.g. 40320x1024 (repeatable; Linear: ROWSxINxOUT). "
                   f"Default: {' and '.join(DEFAULT_SHAPES['gpu'])} on GPU, {' and '.join(DEFAULT_SHAPES['cpu'])} on CPU")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default=None,
                   help="the training precision regime to verify and time in (default: the profile's, else bf16-mixed)")
    p.add_argument("--profile", default=None, metavar="NAME|PATH|auto",
                   help="apply a site profile: its requirements are enforced (exit 4), its policy applied; "
                   "auto picks one from the site signals")
    p.add_argument("--profiles-dir", action="append", default=[], metavar="DIR",
                   help="extra directory of profiles (repeatable; also $KERNEL_PROBE_PROFILES, os.pathsep-separated)")
    p.add_argument("--prefer", action="append", default=[], metavar="SLOT=ID",
                   help="take this candidate if accepted and not slower than the default beyond the noise margin")
    p.add_argument("--pin", action="append", default=[], metavar="SLOT=ID",
                   help="take this candidate if accepted, whatever its speed")
    p.add_argument("--force", action="store_true", help="probe again even if the lock is current; replace a corrupt lock")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 0 if the lock is current for this machine, 3 if stale or missing")
    p.add_argument("--json", action="store_true", help="machine-readable summary on stdout")
    p.add_argument("--reps", type=int, default=None, help=f"timed repetitions per shape (at least; default "
                   f"{DEFAULT_REPS['gpu']} on GPU, {DEFAULT_REPS['cpu']} on CPU)")
    p.add_argument("--lock-timeout", type=float, default=1800.0,
                   help="seconds to wait for another kernel-probe writing the same lock (default 1800)")
    p.add_argument("--deterministic", action="store_true",
                   help="choose only candidates whose forward and backward are bitwise repeatable (for training in a "
                   "deterministic mode); a pin that is not is an error")
    add_candidate_arguments(p)
    # not an option of the probe (it takes --precision); kept hidden to answer with a helpful message
    p.add_argument("--dtype", action="append", default=[], help=argparse.SUPPRESS)


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for text in values:
        slot, sep, cid = text.partition("=")
        if not sep or not cid:
            raise UsageError(f"{flag} {text!r}: expected SLOT=ID, e.g. {flag} RMSNorm=liger.rms_norm")
        if slot not in SLOTS:
            raise UsageError(f"{flag} {text!r}: unknown slot {slot!r} (known: {', '.join(SLOTS)})")
        out[slot] = cid
    return out


def check_forced(pins: dict[str, str], prefers: dict[str, str], slots: list[str], candidates: list, device: dict[str, Any],
                 *, profile=None, with_compile: bool = False) -> None:  # fmt: skip
    """Every --pin/--prefer checked before any work: the slot is probed, the id is a candidate of it
    (exit 2), the profile allows it (exit 2), and it can run here as far as is known without importing
    it (exit 3, with the reason and how to install it)."""
    from ..candidates import for_slot
    from ..checker import static_problem
    from ..errors import ForcedUnusable

    for flag, forced in (("--pin", pins), ("--prefer", prefers)):
        for slot, cid in forced.items():
            said = f"{flag} {slot}={cid}"
            if slot not in slots:
                raise UsageError(f"{said}: but --slot limits this probe to {', '.join(slots)}",
                                 fix=f"add --slot {slot}, or drop {said}")  # fmt: skip
            ids = [c.id for c in for_slot(candidates, slot)]
            if cid not in ids:
                raise UsageError(f"{said}: {cid!r} is not a candidate for {slot} (known: {', '.join(ids)})",
                                 fix=f"use one of those ids, or offer your own class with --candidate {slot}=module.Class")  # fmt: skip
            sp = profile.slots.get(slot) if profile else None
            if sp is not None and sp.allowed and cid not in sp.allowed:
                raise UsageError(f"{said}: profile {profile.name} does not allow it for {slot} "
                                 f"(allowed: {', '.join(sp.allowed)})",
                                 fix=f"drop {said}, or use a profile that allows it")  # fmt: skip
            cand = next(c for c in for_slot(candidates, slot) if c.id == cid)
            problem = static_problem(cand, slot, device["type"], device.get("arch") or "", with_compile=with_compile)
            if problem:
                status, reason = problem
                fix = ("add --with-compile" if status == "skipped" else
                       f"drop {said}, or run on a machine where it can run")  # fmt: skip
                raise ForcedUnusable(f"{said}: the candidate is {status} on this machine: {reason}",
                                     fix=fix + "; a pinned or preferred kernel is never silently replaced")  # fmt: skip


def _reusable(path: Path, digest: str, trust: tuple[str, ...] = ()) -> tuple[kernel_lock.KernelLock | None, str]:
    """(the lock, "") if it can be reused; (None, why not) otherwise. Raises for a corrupt lock.

    ``trust``: the libraries of this run's own candidates (the command line, the profile, plug-ins):
    offering them is the grant a lock written for them needs."""
    if not path.exists():
        return None, f"{path} does not exist"
    try:
        lock = kernel_lock.load(path, emit_warnings=False, trust=trust)
    except LockError as exc:
        raise InputFileError(f"the existing lock is not valid: {exc.problem}", path=str(path), key=exc.key,
                             fix="re-run with --force to replace it (nothing was overwritten)") from None  # fmt: skip
    if not lock.intact:
        raise InputFileError("the existing lock was edited by hand (its digest does not match)", path=str(path),
                             fix="re-run with --force to replace it, or accept the edit with `kernel-probe rehash`")  # fmt: skip
    if lock.provenance.get("inputs") != digest:
        return None, "it was probed with other options (shapes, precision, candidates, pins or profile)"
    try:
        lock.verify()
    except LockMismatch as exc:
        return None, "this machine differs: " + "; ".join(str(d) for d in exc.differences)
    return lock, ""


def run_probe(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    out = Path(args.out)
    pins, prefers = _pairs(args.pin, "--pin"), _pairs(args.prefer, "--prefer")
    if args.dtype:
        raise UsageError("the main probe takes --precision (e.g. bf16-mixed), not --dtype; --dtype is for `kernel-probe check`")
    from ..timing import parse_shape

    try:
        for s in args.shape:
            parse_shape(s)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.reps is not None and args.reps < 1:
        raise UsageError("--reps must be at least 1")
    slots = args.slot or list(SLOTS)
    device = detect_device()
    profile, matched = _apply_profile(args, device)
    candidates, problems = gather_candidates(args, extra=list(profile.candidates) if profile else [])
    check_forced(pins, prefers, slots, candidates, device, profile=profile, with_compile=args.with_compile)
    kind = "cpu" if device["type"] == "cpu" else "gpu"
    if args.shape:
        shapes, shapes_from = args.shape, ""
    elif profile and profile.shapes:
        shapes, shapes_from = list(profile.shapes), f" (from profile {profile.name})"
    else:
        shapes, shapes_from = DEFAULT_SHAPES[kind], " (defaults)"
    args.shapes_from = shapes_from
    args.precision = args.precision or (profile.precision if profile and profile.precision else "bf16-mixed")
    dtype, regime = PRECISIONS[args.precision]
    args.reps = args.reps or DEFAULT_REPS[kind]
    policy = {}
    if profile is not None:
        for slot, sp in profile.slots.items():
            policy[slot] = {"allowed": list(sp.allowed), "preferred": list(sp.preferred), "pin": sp.pin}
    args.deterministic = args.deterministic or bool(profile and profile.deterministic)
    inputs = {
        "precision": args.precision, "shapes": shapes, "slots": slots, "pins": pins, "prefers": prefers,
        "candidates": sorted(f"{c.id}={c.target}" for c in candidates), "with_compile": args.with_compile,
        "profile": profile.digest if profile else None, "deterministic": args.deterministic,
        "allow_init_change": args.allow_init_change, "strict_dtype": args.strict_dtype,
    }  # fmt: skip
    from ..lockwrite import inputs_digest, trusted_roots

    digest = inputs_digest(inputs)
    trust = trusted_roots(candidates)
    from ..lockwrite import check_writable, exclusive

    if not args.check:
        out = check_writable(out)  # the real path: a symbolic link is written through
    if not args.force:
        lock, why = _reusable(out, digest, trust)
        if lock is not None:
            return _reused(args, out, lock, t_start)
        if args.check:
            raise StaleLock(f"{out} is stale or missing: {why}", fix="run `kernel-probe` (without --check) to probe and write it")
    elif args.check:
        raise UsageError("--check and --force contradict each other")
    with exclusive(out, args.lock_timeout) as locked:
        if not locked:
            output.warn(f"{out.parent}: this file system does not do file locks, so concurrent probes of {out.name} are "
                        "not kept apart (each write stays atomic: a reader sees one whole lock)")  # fmt: skip
        if not args.force:  # another rank may have written it while we waited
            lock, _ = _reusable(out, digest, trust)
            if lock is not None:
                return _reused(args, out, lock, t_start)
        for problem in problems:
            output.warn(problem)
        result = _probe(args, out, slots, candidates, device, shapes, dtype, regime, pins, prefers, digest,
                        profile=profile, matched=matched)
    result["seconds"] = round(time.perf_counter() - t_start, 2)
    _report(args, result)
    return 0


def _reused(args, out: Path, lock, t_start: float) -> int:
    seconds = time.perf_counter() - t_start
    if args.json:
        output.print_json({"lock": str(out), "reused": True, "seconds": round(seconds, 2),
                           "slots": {n: {"chosen": s.implementation, "reason": s.reason} for n, s in lock.slots.items()}})  # fmt: skip
    else:
        choices = ", ".join(f"{n} -> {s.implementation}" for n, s in lock.slots.items())
        output.info(f"{out}: current for this machine, reused without probing ({choices})")
    return 0


def _apply_profile(args, device):
    """Load the profile (or auto-detect it), enforce its requirements (exit 4 on unmet)."""
    if not args.profile:
        return None, ""
    from kernel_lock import fingerprint

    from .. import profiles

    profile, matched, notes = profiles.choose(args.profile, args.profiles_dir, device)
    for note in notes:
        output.info(f"profile {args.profile}: {note}")
    if profile is None:
        output.info("profile auto: no profile's site signals matched this machine; none applied")
        return None, ""
    if args.profile == "auto":
        output.info(f"profile auto: {profile.name} (matched {matched})")
    libs = profiles.library_facts(profiles.required_libraries(profile))
    for warning in profiles.enforce(profile, fingerprint.current(), libs):
        output.warn(warning)
    return profile, matched


CPU_LARGE_ELEMENTS = 16 * 1024 * 1024  # 8x the CPU default shape: beyond it, timing on a CPU takes minutes


def warn_large_shapes(device_type: str, shapes: list[str], reps: int) -> None:
    """On a CPU, say up front that GPU-sized shapes take minutes to time, and what to do instead."""
    from ..timing import parse_shape

    if device_type != "cpu":
        return
    large = [s for s in shapes if parse_shape(s)[0] * parse_shape(s)[1] > CPU_LARGE_ELEMENTS]
    if large:
        output.warn(f"{', '.join(large)} {'is a GPU-sized shape' if len(large) == 1 else 'are GPU-sized shapes'}: on "
                    f"a CPU, timing every accepted candidate ({reps} repetitions, plus warm-up) can take minutes; progress follows per shape and "
                    f"repetition. For a CPU lock use the CPU default ({DEFAULT_SHAPES['cpu'][0]}: drop --shape), "
                    "or lower --reps")  # fmt: skip


class TimingProgress:
    """Turns a timing worker's progress messages into one line: where it is, and how long is left.

    In a terminal the line updates in place (``show`` updates the progress bar); in a log a line is
    written when a shape starts and ends, and at most every ``every`` seconds in between."""

    def __init__(self, what: str, shapes: list[str], show, every: float = 10.0):
        self.what, self.shapes, self.show, self.every = what, shapes, show, every
        self._last = -float("inf")
        self._shape = None

    def __call__(self, msg: dict[str, Any]) -> None:
        now = time.monotonic()
        new_shape = msg["shape"] != self._shape
        last_call = msg["phase"] == "rep" and msg["done"] == msg["total"]
        if not (new_shape or last_call or now - self._last >= self.every):
            return
        self._shape, self._last = msg["shape"], now
        self.show(self.text(msg))

    def text(self, msg: dict[str, Any]) -> str:
        where = f"{self.what} at {msg['shape']} (shape {msg['index'] + 1}/{msg['of']})"
        if msg["phase"] != "rep":
            return f"{where}: {msg['phase']} {msg['done']}/{msg['total']}, {msg['seconds']:.1f} s so far"
        calls = msg["done"] + 1  # the first call, then the repetitions (warm-up folded into the average)
        per_call = msg["seconds"] / calls
        left = per_call * (msg["total"] - msg["done"])
        text = f"{where}: rep {msg['done']}/{msg['total']}, {per_call:.2g} s per call"
        if msg["done"] < msg["total"]:
            text += f", about {left:.0f} s left at this shape"
        from ..timing import parse_shape

        rows, hidden, _ = parse_shape(msg["shape"])
        later = sum(parse_shape(s)[0] * parse_shape(s)[1] for s in self.shapes[msg["index"] + 1:])
        if later:
            text += f", about {per_call * (msg['total'] + 1) * later / (rows * hidden):.0f} s for the shapes after it"
        return text


def _probe(args, out, slots, candidates, device, shapes, dtype, regime, pins, prefers, digest, *, profile=None,
           matched="") -> dict[str, Any]:  # fmt: skip
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from kernel_lock import fingerprint

    from ..candidates import default_for, for_slot
    from ..checker import Report, check_candidate
    from ..choose import choose
    from ..lockwrite import build_lock
    from ..worker import WorkerDied, WorkerPool

    # fp32 as a sanity baseline, plus the regime the model trains in
    plan = [("float32", "true")] + ([(dtype, regime)] if dtype != "float32" else [])
    per_slot = {s: for_slot(candidates, s) for s in slots}
    total = sum(len(v) for v in per_slot.values())
    reports: dict[str, list] = {s: [] for s in slots}
    timings: dict[str, dict[str, list]] = {s: {} for s in slots}
    terminal = output.console(stderr=True).is_terminal
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=output.console(stderr=True), transient=True,
                        disable=args.json or not terminal)  # fmt: skip
    warn_large_shapes(device["type"], shapes, args.reps)
    check_s = time_s = 0.0
    done = 0
    with WorkerPool() as pool, progress:
        task = progress.add_task("checking", total=total)
        pool.prepare()  # torch's own worker, started before any library is imported
        for slot, cands in per_slot.items():
            allowed = profile.slots[slot].allowed if profile and slot in profile.slots else ()
            for cand in cands:
                done += 1
                progress.update(task, description=f"checking {slot}: {cand.id}")
                if not terminal:  # a batch log: one line per candidate, so a slow one is visible
                    output.info(f"checking {slot}: {cand.id} ({done}/{total})")
                if allowed and cand.id not in allowed:
                    reports[slot].append(Report(cand.id, cand.target, slot, cand.semantics, device["type"], "skipped",
                                                [f"not allowed by profile {profile.name}"], source=cand.source,
                                                candidate=cand))  # fmt: skip
                    progress.advance(task)
                    continue
                # checked, then (if accepted) timed, in the same worker: torch's, or the library's own
                with pool.worker_for(cand) as worker:
                    t0 = time.perf_counter()
                    r = check_candidate(cand, slot, device["type"], plan, worker, arch=device["arch"],
                                        timeout=args.timeout,
                                        import_timeout=args.import_timeout, with_compile=args.with_compile,
                                        policy=policy_from(args))  # fmt: skip
                    reports[slot].append(r)
                    t1 = time.perf_counter()
                    check_s += t1 - t0
                    if r.status == "accepted":
                        progress.update(task, description=f"timing {slot}: {cand.id}")
                        report_progress = TimingProgress(f"timing {slot}: {cand.id}", shapes,
                                                         (lambda text: progress.update(task, description=text))
                                                         if terminal else output.info)  # fmt: skip
                        request = {"op": "time", "candidate": cand.to_json(), "slot": slot, "device": device["type"],
                                   "shapes": shapes, "dtype": dtype, "regime": regime, "progress": True,
                                   "options": {"reps": args.reps, "warmup": min(3, args.reps),
                                               "min_seconds": 0.2 if device["type"] != "cpu" else 0.0}}  # fmt: skip
                        try:
                            reply = worker.call(request, TIMING_TIMEOUT, on_progress=report_progress)
                            if reply.get("tampered"):
                                r.status = "rejected"
                                r.reasons = [f"while timing it replaced torch's own {', '.join(reply['tampered'])}"] + r.reasons
                            else:
                                timings[slot][r.id] = reply["rows"]
                        except WorkerDied as exc:
                            r.status, r.reasons = exc.status, [f"while timing: {exc.reason}"] + r.reasons
                        time_s += time.perf_counter() - t1
                progress.advance(task)
    choices = {}
    for slot in slots:
        sp = profile.slots.get(slot) if profile else None
        if slot in pins or slot in prefers or sp is None:
            choices[slot] = choose(slot, reports[slot], timings[slot], shapes, dtype, default_for(slot).id,
                                   pin=pins.get(slot), prefer=prefers.get(slot), deterministic=args.deterministic)  # fmt: skip
        else:
            origin = f"profile {profile.name}"
            choices[slot] = choose(slot, reports[slot], timings[slot], shapes, dtype, default_for(slot).id, pin=sp.pin,
                                   prefer=list(sp.preferred), origin=origin, strict_prefer=False,
                                   deterministic=args.deterministic)  # fmt: skip
    current = fingerprint.current()
    provenance = {"inputs": digest, "command": ("kernel-probe " + shlex.join(sys.argv[1:])).strip(), "shapes": list(shapes),
                  "check-seconds": round(check_s, 2), "time-seconds": round(time_s, 2)}  # fmt: skip
    if args.deterministic:
        provenance["deterministic"] = True
    lock = build_lock(choices, reports, timings, current, precision=args.precision, provenance=provenance,
                      profile=profile.lock_record(matched) if profile else None)  # fmt: skip
    lock.dump(out)
    return {"lock": str(out), "reused": False, "device": device, "shapes": shapes, "precision": args.precision,
            "choices": choices, "reports": reports, "timings": timings, "check_s": check_s, "time_s": time_s}  # fmt: skip


def _report(args, result: dict[str, Any]) -> None:
    choices, reports, timings = result["choices"], result["reports"], result["timings"]
    if args.json:
        output.print_json({
            "lock": result["lock"], "reused": False, "seconds": result["seconds"], "device": result["device"],
            "precision": result["precision"], "shapes": result["shapes"],
            "check_seconds": round(result["check_s"], 2), "time_seconds": round(result["time_s"], 2),
            "slots": {
                slot: {
                    "chosen": c.report.id, "how": c.how, "reason": c.reason,
                    "candidates": [dict(r.to_json(), timings=timings[slot].get(r.id, [])) for r in reports[slot]],
                }
                for slot, c in choices.items()
            },
        })  # fmt: skip
        return
    from .check import STATUS_STYLE

    con = output.console()
    dev = result["device"]
    on_gpu = dev["type"] != "cpu"
    con.print(f"device {dev['type']} ({safe(str(dev['name']))}), precision {result['precision']}, "
              f"shapes {', '.join(result['shapes'])}{args.shapes_from}")  # fmt: skip
    for slot, c in choices.items():
        table = output.table(slot)
        for col, right in (("candidate", False), ("verdict", False), ("shape", False), ("ms", True)) + (
                (("GB/s", True), ("% copy", True)) if on_gpu else ()):  # fmt: skip
            table.add_column(col, no_wrap=True, justify="right" if right else "left")
        for r in reports[slot]:
            chosen = r.id == c.report.id
            status = "[bold green]chosen[/]" if chosen else f"[{STATUS_STYLE.get(r.status, '')}]{r.status}[/]"
            for i, t in enumerate(timings[slot].get(r.id) or [None]):
                cells = ["-", ""] + (["", ""] if on_gpu else [])
                if t is not None and "error" in t:
                    cells = [t["shape"], "error"] + (["", ""] if on_gpu else [])
                elif t is not None:
                    cells = [t["shape"], f"{t['median_ms']:.3f}"]
                    if on_gpu:
                        cells += [f"{t['gbps']:.3g}", f"{t['copy_percent']:.0f}" if "copy_percent" in t else "-"]
                table.add_row(safe(r.id) if i == 0 else "", status if i == 0 else "", *cells)
        output.print_table(table)
        for r in reports[slot]:
            if r.status != "accepted" and r.reasons:
                con.print(f"  [dim]{safe(r.id)} {r.status}: {safe(r.reasons[0])}[/]")
            for t in timings[slot].get(r.id) or ():
                if "error" in t:
                    con.print(f"  [dim]{safe(r.id)} at {safe(t['shape'])}: {safe(t['error'])}[/]")
    if not on_gpu:
        con.print("[dim]ms: median forward + backward; bandwidth figures (GB/s, % of a copy) are shown on GPUs "
                  "only (on a CPU a copy of a cache-sized buffer is no ceiling)[/]")  # fmt: skip
    for slot, c in choices.items():
        con.print(f"[bold]{slot}[/] -> {safe(c.report.id)} ({safe(c.reason)})")
    con.print(f"wrote {safe(result['lock'])} in {result['seconds']:.1f} s (check {result['check_s']:.1f} s, timing {result['time_s']:.1f} s)")
