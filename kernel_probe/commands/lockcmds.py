"""Subcommands that read locks: verify, show, rehash."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import kernel_lock
from kernel_lock.errors import LOCKS_DIFFER, LockError, LockMismatch
from kernel_lock.slots import MODES, short_dtype, slot_name_fix
from kernel_probe import output
from kernel_probe.output import safe

DEFAULT_LOCK = "kernel-lock.toml"


def default_lock_path() -> str:
    return os.environ.get("KERNEL_LOCK", DEFAULT_LOCK)


def add_trust_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="MODULE",
        help="trust this top-level package beyond the built-in allow-list (repeatable; also "
        "$KERNEL_LOCK_TRUST). A lock's own trusted-modules only ask for it",
    )


def _load(
    path: str, strict: bool = False, *, trust: list[str] | tuple[str, ...] = (), check_targets: bool = True
) -> kernel_lock.KernelLock:
    """Load a lock for a command; its warnings go to stderr. ``check_targets=False`` for commands that
    only print a lock (nothing is imported)."""
    lock = kernel_lock.load(path, strict=strict, emit_warnings=False, trust=trust, check_targets=check_targets)
    for message in lock.warnings:
        output.warn(message)
    return lock


# ---- verify ---------------------------------------------------------------------------------
def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("lock", nargs="?", default=None, help=f"lock file (default: $KERNEL_LOCK or ./{DEFAULT_LOCK})")
    p.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="training: this machine must match the lock; inference: substitute verified twins where "
        "needed (default: the lock's own mode, `mode` in the file)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="a hand-edited lock (digest mismatch), or one without an environment, is an error",
    )
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.add_argument(
        "--no-import",
        action="store_true",
        help="check the machine and each slot's requirements from files and package metadata only, "
        "importing no kernel library and not torch (the check for every rank at job start); by "
        "default each slot's class is also imported",
    )
    add_trust_argument(p)


def run_verify(args: argparse.Namespace) -> int:
    from kernel_lock.resolve import factory, resolve_slot

    path = args.lock or default_lock_path()
    lock = _load(path, strict=args.strict, trust=args.trust)
    args.mode = args.mode or lock.mode
    result: dict[str, Any] = {
        "lock": path,
        "mode": args.mode,
        "ok": True,
        "differences": [],
        "notes": [],
        "warnings": list(lock.warnings),
        "slots": {},
        "imported": not args.no_import,
    }
    try:
        # the machine is read without torch where every checked fact can be (kernel_lock.torchless)
        # with --no-import, each slot's class and kwargs are judged from the tables of known classes; one
        # they cannot judge is an error (not confirmed), never current (kernel_lock.resolve.confirm_targets)
        result["notes"] = lock.verify(args.mode, targets="static" if args.no_import else None)
    except LockError as exc:
        if not args.json:
            raise
        result["ok"] = False
        result["differences"] = [
            {"field": d.field, "expected": d.expected, "found": d.found, "rule": d.rule}
            for d in getattr(exc, "differences", ())
        ]
        if not isinstance(exc, LockMismatch):
            result["error"] = {"problem": exc.problem, "key": exc.key, "fix": exc.fix, "exit_code": exc.exit_code}
        output.print_json(result)
        return exc.exit_code
    for slot in kernel_lock.SLOTS:
        try:
            if args.no_import:  # the decision only: requirements from metadata, nothing imported
                r = resolve_slot(lock, slot, args.mode, import_classes=False)
                found = (r.implementation, r.target, dict(r.kwargs), r.substituted_from, r.max_error)
            else:
                f = factory(lock, slot, mode=args.mode, verify_environment=False)
                found = (f.implementation, f.target, dict(f.keywords), f.substituted_from, f.max_error)
        except LockError as exc:  # e.g. installed but broken on import, with no usable twin
            if not args.json:
                raise
            result["ok"] = False
            result["slots"][slot] = {"error": exc.problem, "exit_code": exc.exit_code}
            continue
        result["slots"][slot] = dict(
            zip(("implementation", "target", "kwargs", "substituted_from", "max_error"), found, strict=True)
        )
    if args.json:
        output.print_json(result)
        failed = [r["exit_code"] for r in result["slots"].values() if "exit_code" in r]
        return max(failed) if failed else 0
    # plain lines (no rich): this is every rank's job-start output, and its cost is counted
    verdict = "matches this machine" if args.mode == "training" else "can run on this machine"
    imported = "" if not args.no_import else ", classes not imported"
    lines = [f"ok: {path} {verdict} ({args.mode} mode{imported})", *(f"  note: {note}" for note in result["notes"])]
    for slot, s in result["slots"].items():
        extra = ""
        if s["substituted_from"]:
            error = "not recorded" if s["max_error"] is None else f"{s['max_error']:.3g}"
            extra = f" (substituted for {s['substituted_from']}, verified max error {error})"
        lines.append(f"  {slot:<10} -> {s['target']} {s['kwargs']}{extra}")
    sys.stdout.write(output.plain("\n".join(lines)) + "\n")
    return 0


# ---- show -----------------------------------------------------------------------------------
LOCK_HELP = f"lock file (default: $KERNEL_LOCK or ./{DEFAULT_LOCK})"


def add_show_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("lock", nargs="?", default=None, help=LOCK_HELP)
    p.add_argument("--json", action="store_true", help="the lock's content as JSON")


def run_show(args: argparse.Namespace) -> int:
    args.lock = args.lock or default_lock_path()
    lock = _load(args.lock, check_targets=False)
    if args.json:
        output.print_json(lock.to_dict())
        return 0
    con = output.console()
    con.print(
        f"[bold]{safe(args.lock)}[/]  lock-version {safe(lock.lock_version)}, {safe(lock.created_by)}, "
        f"{safe(lock.created_at or 'no date')}"
    )
    con.print(
        f"mode {lock.mode}; precision {lock.precision or 'not recorded'}; "
        f"digest {'intact' if lock.intact else '[yellow]NOT intact[/]'}"
    )
    if lock.profile:
        con.print(f"profile: {safe(lock.profile.get('name', '?'))}")
    env = output.table("environment")
    env.add_column("field", no_wrap=True)
    env.add_column("value")
    env.add_column("match", no_wrap=True)
    for name, f in lock.environment.fields.items():
        env.add_row(safe(name), safe(f.value), f.match)
    for name, f in lock.environment.libraries.items():
        env.add_row(f"library {safe(name)}", safe(f.value), f.match)
    output.print_table(env)
    slots = output.table("slots")
    for col in ("slot", "implementation", "target"):
        slots.add_column(col, no_wrap=True)
    slots.add_column("kwargs")
    slots.add_column("twin")
    for name, s in lock.slots.items():
        twin = "-" if s.twin is None else f"{safe(s.twin.target)} ({s.twin.state_dict})"
        slots.add_row(name, safe(s.implementation), safe(s.target), safe(dict(s.kwargs)), twin)
    output.print_table(slots)
    for name, s in lock.slots.items():
        if s.reason:
            con.print(f"{name}: {safe(s.reason)}")
    return 0


# ---- rehash ---------------------------------------------------------------------------------
def add_rehash_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "lock",
        nargs="?",
        default=None,
        help=f"lock file to re-seal after a deliberate hand edit (default: $KERNEL_LOCK or ./{DEFAULT_LOCK})",
    )
    add_trust_argument(p)


def run_rehash(args: argparse.Namespace) -> int:
    args.lock = args.lock or default_lock_path()
    lock = kernel_lock.load(args.lock, emit_warnings=False, trust=args.trust)  # still fully validated
    sealed = lock.sealed()
    sealed.dump(args.lock)
    output.info(f"{args.lock}: digest {'unchanged' if sealed.digest == lock.digest else 'updated'} ({sealed.digest})")
    return 0


# ---- explain --------------------------------------------------------------------------------
def add_explain_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "args",
        nargs="+",
        metavar="[LOCK] SLOT",
        help=f"the lock file (default: $KERNEL_LOCK or ./{DEFAULT_LOCK}) and the slot: {', '.join(kernel_lock.SLOTS)}",
    )
    p.add_argument("--json", action="store_true", help="the slot's entry as JSON")


def slot_argument(text: str) -> str:
    """A slot name from the command line; a wrong one is a usage error (exit 2) with the near miss."""
    from kernel_probe.errors import UsageError

    if text in kernel_lock.SLOTS:
        return text
    raise UsageError(f"unknown slot {text!r}", fix=slot_name_fix(text))


def run_explain(args: argparse.Namespace) -> int:
    from kernel_probe.errors import UsageError

    if len(args.args) > 2:
        raise UsageError(f"explain takes [LOCK] SLOT, got {len(args.args)} arguments: {' '.join(args.args)}")
    args.lock, args.slot = args.args if len(args.args) == 2 else [default_lock_path(), args.args[0]]
    slot_argument(args.slot)  # before reading the file: a typo is the argument's fault, not the lock's
    lock = _load(args.lock, check_targets=False)
    slot = lock.slots.get(args.slot)
    if args.json:
        output.print_json(
            slot.to_dict() if slot else {"implementation": None, "note": "not pinned: resolves to torch.nn"}
        )
        return 0
    con = output.console()
    if slot is None:
        con.print(f"{safe(args.slot)} is not pinned in {safe(args.lock)}: it resolves to torch.nn (the default)")
        return 0
    con.print(f"[bold]{args.slot}[/] -> {safe(slot.implementation)} ({safe(slot.target)})")
    con.print(f"  why: {safe(slot.reason or 'no reason recorded')}")
    con.print(
        f"  kwargs: {safe(dict(slot.kwargs))}; requires: "
        f"{safe(', '.join(f'{r.name}{r.specifier}' for r in slot.requires) or 'torch only')}"
    )
    if slot.twin:
        twin = slot.twin
        con.print(
            f"  twin for inference: {safe(twin.target)} {safe(dict(twin.kwargs))}, state dict {twin.state_dict}"
            + (f" ({safe(', '.join(twin.migration))})" if twin.migration else "")
            + (f", verified max error {twin.max_error}" if twin.max_error is not None else "")
        )
    else:
        con.print("  no portable twin: inference needs the same library")
    if slot.evidence:
        ev = output.table("correctness evidence")
        for col in ("device", "dtype", "regime", "status", "error/tol"):
            ev.add_column(col, no_wrap=True)
        ev.add_column("failed")
        for e in slot.evidence:
            ev.add_row(
                *(safe(e.get(k, "")) for k in ("device", "dtype", "regime", "status", "worst-error-ratio")),
                safe(", ".join(map(str, e.get("failed", [])))),
            )
        output.print_table(ev)
        con.print("  error/tol: the worst error over the tolerance (< 1 passes)")
    if slot.timing:
        tt = output.table("timings (forward + backward)")
        on_gpu = any("copy-percent" in t for t in slot.timing)  # measured on GPUs only
        cols = ("implementation", "shape", "dtype", "ms", "first call s") + (("GB/s", "% copy") if on_gpu else ())
        for col in cols:
            tt.add_column(col, no_wrap=True, justify="left" if col in ("implementation", "shape", "dtype") else "right")
        for t in slot.timing:
            dtype = f"{short_dtype(t.get('dtype', ''))} {t.get('regime', '')}"
            ms = t.get("median-ms")
            cells = [
                t.get("implementation", ""),
                t.get("shape", ""),
                dtype,
                f"{ms:.3f}" if isinstance(ms, (int, float)) else t.get("error", ""),
                _fmt(t.get("compile-s")),
            ]
            if on_gpu:
                cells += [_fmt(t.get("gbps")), _fmt(t.get("copy-percent"), ".0f")]
            tt.add_row(*(safe(c) for c in cells))
        output.print_table(tt)
        for t in slot.timing:
            if "error" in t:
                con.print(f"  {safe(t.get('implementation', ''))} at {safe(t.get('shape', ''))}: {safe(t['error'])}")
    for r in slot.rejected:
        con.print(f"  not chosen: {safe(r.implementation)} {safe(f'[{r.status}]')} {safe('; '.join(r.reasons))}")
    return 0


def _fmt(value: Any, spec: str = ".3g") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


# ---- diff -----------------------------------------------------------------------------------
def add_diff_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="old lock")
    p.add_argument("b", help="new lock")
    p.add_argument("--json", action="store_true", help="the differences as JSON")
    p.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 6 when the locks differ, 0 when they do not (git diff --exit-code uses 1, which "
        "kernel-probe keeps for failures)",
    )


def run_diff(args: argparse.Namespace) -> int:
    a, b = _load(args.a, check_targets=False), _load(args.b, check_targets=False)
    from kernel_probe.probe.lockdiff import lock_differences

    diffs = lock_differences(a, b)
    differ = any(diffs.values())
    if args.json:
        output.print_json(diffs)
    else:
        con = output.console()
        if not differ:
            con.print("no differences in environment or choices")
        for d in diffs["lock"]:
            con.print(f"{d['key']}: {safe(repr(d['a']))} -> {safe(repr(d['b']))}")
        for d in diffs["environment"]:
            fa = d["a"]["value"] if d["a"] else "absent"
            fb = d["b"]["value"] if d["b"] else "absent"
            con.print(f"environment {safe(d['field'])}: {safe(repr(fa))} -> {safe(repr(fb))}")
        for d in diffs["slots"]:
            con.print(f"slot {d['slot']} {d['key']}: {safe(repr(d['a']))} -> {safe(repr(d['b']))}")
    return LOCKS_DIFFER if (differ and args.exit_code) else 0
