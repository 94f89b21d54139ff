"""The commands that read a lock: ``show``, ``explain``, ``diff``, ``verify``, ``rehash`` and
``lock --for inference``: each opens it with kernel_probe.output, calls the library, renders."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

import kernel_lock
from kernel_lock import fingerprint as with_torch
from kernel_lock.errors import ExitCode, LockError
from kernel_lock.files import refuse_special
from kernel_lock.fingerprint import Unsettled, torch_build
from kernel_lock.launch import before_sealing
from kernel_lock.resolve import as_locked, factory, resolve_slot
from kernel_lock.slots import MODES, short_dtype, slot_name_fix
from kernel_probe import output
from kernel_probe.errors import ProbeError, UsageError
from kernel_probe.output import print_rows, safe
from kernel_probe.probe.derive import derive_inference, lock_differences

_SLOT_NAMES = ", ".join(kernel_lock.SLOTS)


def _say(*lines: str) -> None:
    for line in lines:
        output.console().print(line)


def _json(body: dict[str, Any], exc: LockError | None) -> int:
    """``body`` as JSON with ``ok`` and ``exc`` as its error (also on stderr); the exit code."""
    output.print_json(output.with_failure(body, exc))
    if exc is not None:
        output.error(str(exc))
    return exc.exit_code if exc else 0


# ---- show -------------------------------------------------------------------------------------
add_show_arguments = output.add_lock_argument  # the arguments of ``kernel-probe show``


def run_show(args: argparse.Namespace) -> int:
    """``kernel-probe show [LOCK]``: the lock's pins, fingerprint and evidence, as text or JSON."""
    lock = output.open_lock(args, check_targets=False)
    # the lock's slots, then every other slot this kernel_lock knows (each resolves to its default)
    every = [*lock.slots, *(name for name in kernel_lock.SLOTS if name not in lock.slots)]
    resolved = [as_locked(lock, name) for name in every]
    if args.json:
        output.print_json(
            {**lock.to_dict(), "resolves-to": {r.slot: r.to_json() for r in resolved}}
        )
        return 0
    _say(
        f"[bold]{safe(args.lock)}[/]  lock-version {safe(lock.lock_version)}, "
        f"{safe(lock.created_by)}, {safe(lock.created_at or 'no date')}",
        f"mode {lock.mode}; precision {lock.precision or 'not recorded'}; "
        f"digest {'intact' if lock.intact else '[yellow]NOT intact[/]'}",
        *([f"profile: {safe(lock.profile.get('name', '?'))}"] if lock.profile else []),
    )
    env = lock.environment
    fields = [(safe(n), safe(f.value), f.match) for n, f in env.fields.items()]
    fields += [(f"library {safe(n)}", safe(f.value), f.match) for n, f in env.libraries.items()]
    print_rows("environment", ("field", "value", "match"), fields, wrap=("value",))
    slots = [
        (r.slot, *map(safe, (r.implementation, r.target, dict(r.kwargs))), _twin(lock, r.slot))
        for r in resolved
    ]
    columns = ("slot", "implementation", "target", "kwargs", "twin")
    print_rows("slots", columns, slots, wrap=("kwargs", "twin"))
    _say(*(f"{name}: {safe(s.reason)}" for name, s in lock.slots.items() if s.reason))
    _model_check(lock)
    return 0


def _model_check(lock: Any) -> None:
    """The recorded model-level check in one line (a lock probed with --model)."""
    if lock.model is not None and lock.model.check is not None:
        _say(safe(lock.model.check.line()))


def _twin(lock: kernel_lock.KernelLock, slot: str) -> str:
    twin = lock.slots[slot].twin if slot in lock.slots else None
    return "-" if twin is None else f"{safe(twin.target)} ({twin.state_dict})"


# ---- explain ----------------------------------------------------------------------------------
def add_explain_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe explain``."""
    lock = f"the lock file (default: $KERNEL_LOCK or ./{output.DEFAULT_LOCK}) and the slot: "
    p.add_argument("args", nargs="+", metavar="[LOCK] SLOT", help=lock + _SLOT_NAMES)


def slot_argument(text: str) -> str:
    """A slot name from the command line; a wrong one is a usage error naming the near miss."""
    if text in kernel_lock.SLOTS:
        return text
    raise UsageError(f"unknown slot {text!r}", fix=slot_name_fix(text))


def run_explain(args: argparse.Namespace) -> int:
    """``kernel-probe explain [LOCK] SLOT``: why the lock pins what it pins for one slot."""
    words = args.args
    if len(words) > 2:
        raise UsageError(
            f"explain takes [LOCK] SLOT, got {len(words)} arguments: {' '.join(words)}"
        )
    # a lock's path rather than a mistyped slot: it exists, or is named like a file
    one = words[0] if len(words) == 1 and words[0] not in kernel_lock.SLOTS else ""
    if one and (os.path.exists(one) or one.endswith(".toml") or os.sep in one):
        raise UsageError(
            f"explain {one}: which slot? explain takes [LOCK] SLOT",
            fix=f"name the slot after the lock: kernel-probe explain {one} SLOT ({_SLOT_NAMES})",
        )
    args.lock, args.slot = words if len(words) == 2 else [output.default_lock_path(), words[0]]
    slot_argument(args.slot)  # before reading the file: a typo is the argument's fault
    lock = output.load_lock(args.lock, check_targets=False)
    slot, resolved = lock.slots.get(args.slot), as_locked(lock, args.slot)
    if args.json:
        unpinned = {"implementation": None, "note": f"not pinned: resolves to {resolved.target}"}
        output.print_json(
            {**(slot.to_dict() if slot else unpinned), "resolves-to": resolved.to_json()}
        )
    elif slot is None:
        where = f"{safe(args.slot)} is not pinned in {safe(args.lock)}"
        _say(f"{where}: it resolves to {safe(resolved.target)}, the slot's default")
    else:
        _explain(resolved, slot)
        _model_check(lock)
    return 0


def _explain(resolved: Any, slot: Any) -> None:
    requires = ", ".join(f"{r.name}{r.specifier}" for r in slot.requires) or "torch only"
    _say(
        f"[bold]{resolved.slot}[/] -> {safe(resolved.implementation)} ({safe(resolved.target)})",
        f"  why: {safe(slot.reason or 'no reason recorded')}",
        f"  kwargs: {safe(dict(slot.kwargs))}; requires: {safe(requires)}",
    )
    if twin := slot.twin:
        _say(
            f"  twin for inference: {safe(twin.target)} {safe(dict(twin.kwargs))}, state dict "
            f"{twin.state_dict}"
            + (f" ({safe(', '.join(twin.migration))})" if twin.migration else "")
            + (f", verified max error {twin.max_error}" if twin.max_error is not None else "")
        )
    else:
        _say("  no portable twin: inference needs the same library")
    if slot.evidence:
        keys = ("device", "dtype", "regime", "status", "worst-error-ratio")
        rows = [
            [*(safe(e.get(k, "")) for k in keys), safe(", ".join(map(str, e.get("failed", []))))]
            for e in slot.evidence
        ]
        columns = ("device", "dtype", "regime", "status", "error/tol", "failed")
        print_rows("correctness evidence", columns, rows, wrap=("failed",))
        _say("  error/tol: the worst error over the tolerance (< 1 passes)")
    if slot.timing:
        _timings(slot.timing, slot.implementation)
    for r in slot.rejected:
        why = f"{safe(f'[{r.status}]')} {safe('; '.join(r.reasons))}"
        _say(f"  not chosen: {safe(r.implementation)} {why}")


def _timings(timing: Any, chosen: str) -> None:
    on_gpu = any("copy-percent" in t for t in timing)  # measured on GPUs only
    columns: tuple[str, ...] = ("implementation", "shape", "dtype", "ms", "first call s")
    columns += ("GB/s", "% copy") if on_gpu else ()
    columns += ("vs default", "load")
    rows = []
    for t in timing:
        ms = t.get("median-ms")
        cells = [
            t.get("implementation", ""),
            t.get("shape", ""),
            f"{short_dtype(t.get('dtype', ''))} {t.get('regime', '')}",
            f"{ms:.3f}" if isinstance(ms, (int, float)) else t.get("error", ""),
            _fmt(t.get("compile-s")),
            *([_fmt(t.get("gbps")), _fmt(t.get("copy-percent"), ".0f")] if on_gpu else []),
            _versus(t),
            _load(t),
        ]
        rows.append([safe(c) for c in cells])
    print_rows("timings (forward + backward)", columns, rows, right=columns[3:])
    if any("ratio" in t for t in timing):
        _say(
            "  vs default: the median time ratio of the paired rounds, its interval, x rounds; "
            "load: the load average / other busy processes (/ on the GPU) while timed"
        )
    for t in (t for t in timing if "error" in t):
        where = f"{safe(t.get('implementation', ''))} at {safe(t.get('shape', ''))}"
        _say(f"  {where}: {safe(t['error'])}")
    for line in bar_chart(timing, chosen=chosen):
        output.console().print(safe(line), soft_wrap=False)


def _versus(t: Any) -> str:
    """A row's paired ratio to the default: ``0.91 [0.82, 1.00] x6``; "" where it has none."""
    ratio, interval = t.get("ratio"), t.get("interval")
    if not isinstance(ratio, (int, float)):
        return ""
    pair = isinstance(interval, list) and len(interval) == 2
    if pair and all(isinstance(x, (int, float)) for x in interval):
        return f"{ratio:.2f} [{interval[0]:.2f}, {interval[1]:.2f}] x{t.get('rounds', '?')}"
    return f"{ratio:.2f} x{t.get('rounds', '?')}"


def _load(t: Any) -> str:
    """The load seen while a row was timed: ``3.1 / 2``; "" for a lock before 1.4."""
    load, busy, gpu = t.get("load-average"), t.get("busy-processes"), t.get("gpu-processes")
    if not isinstance(load, (int, float)):
        return ""
    said = f"{load:.1f} / {busy}" if isinstance(busy, int) else f"{load:.1f}"
    return said + (f" / GPU {gpu}" if isinstance(gpu, int) else "")


def bar_chart(rows: Any, *, chosen: str = "", width: int = 80) -> list[str]:
    """The candidates' median times as plain text bars in ``width`` columns, one group per shape and
    precision, each scaled to the slowest there; the chosen one is marked ``*``."""
    groups: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for t in rows:
        ms = t.get("median-ms")
        # a record may hold inf or nan (docs/lock-format.md): no bar for a time not measured
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and 0 < ms < math.inf:
            precision = f"{short_dtype(t.get('dtype', ''))} {t.get('regime', '')}".strip()
            group = groups.setdefault((str(t.get("shape", "")), precision), [])
            group.append((str(t.get("implementation", "")), float(ms)))
    if not groups:
        return []
    name_w = min(32, max(len(name) for rs in groups.values() for name, _ in rs) + 2)
    room = max(1, width - 4 - name_w - 10)
    lines = ["  median ms, forward + backward (* chosen; bars scaled to the slowest per shape)"]
    for (shape, precision), rs in groups.items():
        lines.append(f"  {shape} {precision}")
        slowest = max(ms for _, ms in rs)
        for name, ms in sorted(rs, key=lambda r: r[1]):
            label = (("* " if name == chosen else "  ") + name)[:name_w].ljust(name_w)
            lines.append(f"    {label}{'#' * max(1, round(room * ms / slowest))} {ms:.3g}")
    return lines


def _fmt(value: Any, spec: str = ".3g") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


# ---- diff -------------------------------------------------------------------------------------
def add_diff_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe diff``."""
    p.add_argument("a", help="old lock")
    p.add_argument("b", help="new lock")
    exit_help = (
        f"exit {ExitCode.LOCKS_DIFFER.value} when the locks differ, 0 when they do not (git diff "
        "--exit-code uses 1, which kernel-probe keeps for failures)"
    )
    p.add_argument("--exit-code", action="store_true", help=exit_help)


def run_diff(args: argparse.Namespace) -> int:
    """``kernel-probe diff A B``: what differs between two locks, as text or JSON."""
    a, b = (output.load_lock(path, check_targets=False) for path in (args.a, args.b))
    diffs = lock_differences(a, b)
    differ = any(diffs.values())
    code = ExitCode.LOCKS_DIFFER if (differ and args.exit_code) else 0
    if args.json:
        failed = ProbeError(f"{args.a} and {args.b} differ (see the differences)") if code else None
        output.print_json(output.with_failure(dict(diffs), failed, code))
        if failed is not None:
            output.error(f"{failed.problem} (exit {code}, --exit-code)")
        return code
    if not differ:
        _say("no differences in environment, choices or what they were probed for")
    changes = [(d["key"], d["a"], d["b"]) for d in diffs["lock"]]
    for d in diffs["environment"]:
        fa, fb = (x["value"] if x else "absent" for x in (d["a"], d["b"]))
        changes.append((f"environment {d['field']}", fa, fb))
    changes += [(f"slot {d['slot']} {d['key']}", d["a"], d["b"]) for d in diffs["slots"]]
    _say(*(f"{safe(what)}: {safe(repr(x))} -> {safe(repr(y))}" for what, x, y in changes))
    if diffs["probe"]:  # in --check's words (kernel_probe.probe.stale)
        _say(
            f"probed for other things, as --check says it ({safe(args.a)} is 'the lock', "
            f"{safe(args.b)} 'now' / 'this run'):"
        )
        _say(*(f"  {d['what']}: {safe(d['why'])}" for d in diffs["probe"]))
    return code


# ---- verify -----------------------------------------------------------------------------------
def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe verify``."""
    output.add_lock_argument(p)
    mode = (
        "training: this machine must match the lock; inference: substitute verified twins "
        "where needed (default: the lock's own mode, `mode` in the file)"
    )
    p.add_argument("--mode", choices=MODES, default=None, help=mode)
    output.add_flags(
        p,
        {
            "--strict": "a hand-edited lock (digest mismatch), or one without an environment, is "
            "an error",
            "--no-import": "check the machine and each slot's requirements from files and package "
            "metadata only, importing no kernel library and not torch (the check for every rank "
            "at job start); by default each slot's class is also imported",
        },
    )
    output.add_trust_argument(p)


_RESOLVED = ("implementation", "target", "kwargs", "substituted_from", "max_error")


def run_verify(args: argparse.Namespace) -> int:
    """``kernel-probe verify [LOCK]``: does this machine match the lock, does each slot resolve."""
    lock = output.open_lock(args, strict=args.strict, trust=args.trust)
    args.mode = args.mode or lock.mode
    result: dict[str, Any] = {"lock": args.lock, "mode": args.mode, "differences": [], "notes": []}
    result |= {"warnings": list(lock.warnings), "slots": {}, "imported": not args.no_import}
    try:
        # with --no-import the machine is read without torch where every checked fact can be, and
        # each class judged from the tables of known classes: one they cannot judge is an error
        # (not confirmed), never current (kernel_lock.resolve.confirm_targets)
        result["notes"] = lock.verify(args.mode, targets="static" if args.no_import else None)
    except LockError as exc:
        if not args.json:
            raise
        result["differences"] = [
            {"field": d.field, "expected": d.expected, "found": d.found, "rule": d.rule}
            for d in getattr(exc, "differences", ())
        ]
        return _json(result, exc)
    failures: list[LockError] = []
    for slot in kernel_lock.SLOTS:
        try:
            result["slots"][slot] = _resolve(lock, slot, args.mode, args.no_import)
        except LockError as exc:  # e.g. installed but broken on import, with no usable twin
            if not args.json:
                raise
            result["slots"][slot] = dict(error=exc.problem, fix=exc.fix, exit_code=exc.exit_code)
            failures.append(exc)
    if args.json:
        return _json(result, max(failures, key=lambda e: e.exit_code, default=None))
    # plain lines (no rich): this is every rank's job-start output, and its cost is counted
    verdict = "matches this machine" if args.mode == "training" else "can run on this machine"
    imported = ", classes not imported" if args.no_import else ""
    lines = [f"ok: {args.lock} {verdict} ({args.mode} mode{imported})"]
    lines += [f"  note: {note}" for note in result["notes"]]
    for slot, s in result["slots"].items():
        extra = ""
        if s["substituted_from"]:
            error = "not recorded" if s["max_error"] is None else f"{s['max_error']:.3g}"
            extra = f" (substituted for {s['substituted_from']}, verified max error {error})"
        lines.append(f"  {slot:<10} -> {s['target']} {s['kwargs']}{extra}")
    sys.stdout.write(output.plain("\n".join(lines)) + "\n")
    return 0


def _resolve(lock: kernel_lock.KernelLock, slot: str, mode: str, no_import: bool) -> dict:
    if no_import:  # the decision only: requirements from metadata, nothing imported
        r = resolve_slot(lock, slot, mode, import_classes=False)
        found = (r.implementation, r.target, dict(r.kwargs), r.substituted_from, r.max_error)
    else:
        f = factory(lock, slot, mode=mode, verify_environment=False)
        found = (f.implementation, f.target, dict(f.keywords), f.substituted_from, f.max_error)
    return dict(zip(_RESOLVED, found, strict=True))


# ---- rehash -----------------------------------------------------------------------------------
def add_rehash_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe rehash``."""
    output.add_lock_argument(p, "lock file to re-seal after a deliberate hand edit")
    output.add_trust_argument(p)


def run_rehash(args: argparse.Namespace) -> int:
    """``kernel-probe rehash [LOCK]``: re-seal a hand-edited lock, atomically; one that ``verify``
    and the runtime would refuse is not sealed (``kernel_lock.launch.before_sealing``)."""
    args.lock = args.lock or output.default_lock_path()
    refuse_special(args.lock, "LOCK")  # read, then replaced: a regular file only
    lock = kernel_lock.load(args.lock, emit_warnings=False, trust=args.trust)
    unjudged = before_sealing(lock, _torch_version(lock))
    sealed = lock.sealed()
    sealed.dump(args.lock)
    same = "unchanged" if sealed.digest == lock.digest else "updated"
    output.info(f"{args.lock}: digest {same} ({sealed.digest})")
    for line in unjudged:
        output.info(f"  note: {line}")
    return 0


def _torch_version(lock: kernel_lock.KernelLock) -> str:
    """The lock's torch, else this machine's (read without torch), else "" (nothing judged)."""
    if (recorded := lock.environment.fields.get("torch")) is not None:
        return str(recorded.value)
    try:
        return torch_build().version
    except Unsettled:
        return ""


# ---- lock --for inference ---------------------------------------------------------------------
def add_lock_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe lock``."""
    purpose = (
        "what the new lock is for (inference: substitute verified torch.nn twins where the "
        "training libraries cannot run)"
    )
    p.add_argument("--for", dest="purpose", required=True, choices=("inference",), help=purpose)
    p.add_argument("source", metavar="IN", help="the training lock")
    p.add_argument("out", metavar="OUT", help="where to write the inference lock (atomically)")
    output.add_flags(p, {"--force": "replace OUT if it exists"})
    output.add_trust_argument(p)


# each substitution's JSON key: the attribute it holds
_SUBSTITUTION = {"slot": "slot", "from": "training", "from-target": "training_target"}
_SUBSTITUTION |= {"to": "twin_target", "reason": "reason", "max-error": "max_error"}


def run_lock(args: argparse.Namespace) -> int:
    """``kernel-probe lock --for inference IN OUT``: each slot that cannot run here replaced by its
    verified twin (as ``factory(..., mode="inference")`` would); a slot with none writes nothing."""
    out = Path(args.out)
    if out.is_dir():
        fix = f"name the lock file, e.g. {out / 'kernel-lock.inference.toml'}"
        raise UsageError(f"{out} is a directory", fix=fix)
    refuse_special(out, "OUT")
    if out.exists() and not args.force:
        fix = "pass --force to replace it, or choose another OUT"
        raise UsageError(f"{out} exists; not replacing it", fix=fix)
    lock = output.load_lock(args.source, trust=args.trust)
    if lock.mode != "training":
        source_of = lock.provenance.get("source", "an unrecorded lock")
        raise UsageError(
            f"{args.source} is already an inference lock (derived from {source_of})",
            fix="derive from the training lock itself",
        )
    current = with_torch.current()
    derived, subs = derive_inference(lock, current, source=str(args.source))
    derived.verify("inference", current=current)  # what it promises holds here
    derived.dump(out)
    swapped = {s.slot for s in subs}
    kept = [name for name in kernel_lock.SLOTS if name in derived.slots and name not in swapped]
    if args.json:
        body = {"source": str(args.source), "source-digest": derived.provenance["source-digest"]}
        body |= {"out": str(out), "digest": derived.digest}
        body["substitutions"] = [{k: getattr(s, n) for k, n in _SUBSTITUTION.items()} for s in subs]
        body["kept"] = sorted(name for name in derived.slots if name not in swapped)
        output.print_json(body)
        return 0
    _say(
        f"[green]wrote[/] {safe(str(out))}: inference lock derived from {safe(str(args.source))}",
        *(f"  [yellow]{safe(str(s))}[/]: {safe(s.reason)}" for s in subs),
        *(f"  {n}: {safe(derived.slots[n].implementation)} (runs here, kept)" for n in kept),
    )
    return 0
