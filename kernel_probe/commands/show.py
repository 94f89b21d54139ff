"""``kernel-probe show [LOCK]``: a lock in readable form (environment, slots, reasons) or as
JSON."""

from __future__ import annotations

import argparse

from kernel_probe import output
from kernel_probe.commands.lockfile import add_lock_argument, default_lock_path, load_lock
from kernel_probe.output import safe


def add_show_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe show``."""
    add_lock_argument(p)


def run_show(args: argparse.Namespace) -> int:
    """``kernel-probe show [LOCK]``: the lock's pins, fingerprint and evidence, as text or JSON."""
    args.lock = args.lock or default_lock_path()
    lock = load_lock(args.lock, check_targets=False)
    if args.json:
        output.print_json(lock.to_dict())
        return 0
    con = output.console()
    con.print(
        f"[bold]{safe(args.lock)}[/]  lock-version {safe(lock.lock_version)}, "
        f"{safe(lock.created_by)}, {safe(lock.created_at or 'no date')}"
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
