"""Subcommands that read locks: verify, show, rehash."""

from __future__ import annotations

import argparse
import os
from typing import Any

import kernel_lock
from kernel_lock.errors import LockMismatch

from .. import output

DEFAULT_LOCK = "kernel-lock.toml"


def default_lock_path() -> str:
    return os.environ.get("KERNEL_LOCK", DEFAULT_LOCK)


def _load(path: str, strict: bool = False) -> kernel_lock.KernelLock:
    lock = kernel_lock.load(path, strict=strict, emit_warnings=False)
    for message in lock.warnings:
        output.warn(message)
    return lock


# ---- verify ---------------------------------------------------------------------------------
def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("lock", nargs="?", default=None, help=f"lock file (default: $KERNEL_LOCK or ./{DEFAULT_LOCK})")
    p.add_argument("--mode", choices=("training", "inference"), default="training",
                   help="training: this machine must match the lock; inference: substitute verified twins where needed")
    p.add_argument("--strict", action="store_true", help="a hand-edited lock (digest mismatch) is an error")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")


def run_verify(args: argparse.Namespace) -> int:
    from kernel_lock import fingerprint
    from kernel_lock.resolve import factory

    path = args.lock or default_lock_path()
    lock = _load(path, strict=args.strict)
    current = fingerprint.current()
    result: dict[str, Any] = {"lock": path, "mode": args.mode, "ok": True, "differences": [], "notes": [],
                              "warnings": list(lock.warnings), "slots": {}}
    try:
        result["notes"] = lock.verify(args.mode, current=current)
    except LockMismatch as exc:
        if not args.json:
            raise
        result["ok"] = False
        result["differences"] = [
            {"field": d.field, "expected": d.expected, "found": d.found, "rule": d.rule} for d in exc.differences
        ]
        output.print_json(result)
        return exc.exit_code
    for slot in kernel_lock.SLOTS:
        f = factory(lock, slot, mode=args.mode, verify_environment=False)
        result["slots"][slot] = {
            "implementation": f.implementation,
            "target": f.target,
            "kwargs": dict(f.keywords),
            "substituted_from": f.substituted_from,
        }
    if args.json:
        output.print_json(result)
        return 0
    con = output.console()
    con.print(f"[green]ok[/]: {path} matches this machine ({args.mode} mode)")
    for note in result["notes"]:
        con.print(f"  note: {note}")
    for slot, r in result["slots"].items():
        extra = f" [yellow](substituted for {r['substituted_from']})[/]" if r["substituted_from"] else ""
        con.print(f"  {slot:<10} -> {r['target']} {r['kwargs']}{extra}")
    return 0


# ---- show -----------------------------------------------------------------------------------
def add_show_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("lock", help="lock file")
    p.add_argument("--json", action="store_true", help="the lock's content as JSON")


def run_show(args: argparse.Namespace) -> int:
    lock = _load(args.lock)
    if args.json:
        output.print_json(lock.to_dict())
        return 0
    from rich.table import Table

    con = output.console()
    con.print(f"[bold]{args.lock}[/]  lock-version {lock.lock_version}, {lock.created_by}, {lock.created_at or 'no date'}")
    con.print(f"mode {lock.mode}; precision {lock.precision or 'not recorded'}; "
              f"digest {'intact' if lock.intact else '[yellow]NOT intact[/]'}")
    if lock.profile:
        con.print(f"profile: {lock.profile.get('name', '?')}")
    env = Table(title="environment", show_edge=False)
    for col in ("field", "value", "match"):
        env.add_column(col)
    for name, f in lock.environment.fields.items():
        env.add_row(name, str(f.value), f.match)
    for name, f in lock.environment.libraries.items():
        env.add_row(f"library {name}", str(f.value), f.match)
    con.print(env)
    slots = Table(title="slots", show_edge=False)
    for col in ("slot", "implementation", "target", "kwargs", "twin"):
        slots.add_column(col, overflow="fold")
    for name, s in lock.slots.items():
        twin = "-" if s.twin is None else f"{s.twin.target} ({s.twin.state_dict})"
        slots.add_row(name, s.implementation, s.target, str(dict(s.kwargs)), twin)
    con.print(slots)
    for name, s in lock.slots.items():
        if s.reason:
            con.print(f"{name}: {s.reason}")
    return 0


# ---- rehash ---------------------------------------------------------------------------------
def add_rehash_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("lock", help="lock file to re-seal after a deliberate hand edit")


def run_rehash(args: argparse.Namespace) -> int:
    lock = kernel_lock.load(args.lock, emit_warnings=False)  # still fully validated
    sealed = lock.sealed()
    sealed.dump(args.lock)
    output.info(f"{args.lock}: digest {'unchanged' if sealed.digest == lock.digest else 'updated'} ({sealed.digest})")
    return 0
