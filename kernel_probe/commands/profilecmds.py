"""kernel-probe profiles list | show NAME | check PATH."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import output
from ..output import safe


def add_profiles_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profiles-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="extra directory of profiles (repeatable; also $KERNEL_PROBE_PROFILES)",
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="{list,show,check}")
    ls = sub.add_parser("list", help="every profile found, built-in and yours")
    ls.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="one profile: what it requires and its policy")
    show.add_argument("name", help="profile name or path")
    show.add_argument("--json", action="store_true")
    check = sub.add_parser("check", help="validate a profile file (exit 5 on errors)")
    check.add_argument("path")
    match = sub.add_parser(
        "match", help="does this machine meet a profile? (exit 0 yes, 4 no): what --profile enforces"
    )
    match.add_argument("name", nargs="?", default="auto", help="profile name or path, or auto (default)")
    match.add_argument("--json", action="store_true")


def _summary(prof) -> dict:
    return {
        "name": prof.name,
        "description": prof.description,
        "path": prof.path,
        "digest": prof.digest,
        "detect": prof.detect,
        "requires": prof.requires,
        "precision": prof.precision,
        "shapes": list(prof.shapes),
        "deterministic": prof.deterministic,
        "policy": {
            s: {"allowed": list(p.allowed), "preferred": list(p.preferred), "pin": p.pin} for s, p in prof.slots.items()
        },
        "candidates": [c.id for c in prof.candidates],
        "sources": list(prof.sources),
        "unknown": list(prof.unknown),
        "strictness": {"default": prof.default_strictness, "warn": list(prof.warn_groups)},
    }


def run_profiles(args: argparse.Namespace) -> int:
    from .. import profiles

    if args.action == "match":
        return _match(args)
    if args.action == "check":
        prof = profiles.load_file(args.path)
        output.console().print(f"ok: {safe(args.path)} is a valid profile ({safe(prof.name)})")
        return 0
    if args.action == "list":
        found, broken = profiles.scan(args.profiles_dir)
        for exc in broken:
            output.warn(f"broken profile, skipped: {exc}")
        if args.json:
            output.print_json(
                [_summary(p) for p in found.values()]
                + [
                    {"path": exc.path, "broken": True, "error": exc.problem, "key": exc.key, "fix": exc.fix}
                    for exc in broken
                ]
            )
            return 0
        table = output.table()
        table.add_column("name", no_wrap=True)
        table.add_column("description")
        table.add_column("file", no_wrap=True)
        builtin = profiles.builtin_dir()
        for prof in found.values():
            where = "built-in" if prof.path and Path(prof.path).parent == builtin else safe(prof.path)
            table.add_row(safe(prof.name), safe(prof.description), where)
        output.print_table(table)
        output.console().print(f"[dim]built-in: {safe(builtin)}[/]")
        return 0
    prof = profiles.resolve(args.name, args.profiles_dir)
    data = _summary(prof)
    if args.json:
        output.print_json(data)
        return 0
    con = output.console()
    con.print(f"[bold]{safe(prof.name)}[/]: {safe(prof.description)}")
    con.print(f"file: {safe(prof.path)} ({prof.digest[:19]}...)")
    for key in ("detect", "requires", "policy"):
        con.print(f"{key}: {safe(str(data[key]))}")
    con.print(f"precision: {safe(prof.precision or 'not set')}; shapes: {safe(', '.join(prof.shapes) or 'not set')}")
    for s in prof.sources:
        con.print(f"source: {safe(s)}")
    for u in prof.unknown:
        con.print(f"[yellow]not documented:[/] {safe(u)}")
    return 0


def _match(args: argparse.Namespace) -> int:
    """What ``--profile NAME`` would decide on this machine, without probing anything."""
    from kernel_lock import fingerprint

    from .. import profiles
    from ..errors import ProfileUnmet
    from ..pipeline import detect_device

    device = detect_device()
    profile, matched, notes = profiles.choose(args.name, args.profiles_dir, device)
    current = fingerprint.current()
    result: dict[str, Any] = {
        "profile": profile.name if profile else None,
        "matched": matched,
        "notes": notes,
        "unmet": [],
        "warnings": [],
        "device-name-note": fingerprint.device_name_note(current),
    }
    code = 0
    if profile is not None:
        libs = profiles.library_facts(profiles.required_libraries(profile))
        problems = profiles.unmet(profile, current, libs)
        try:
            result["warnings"] = profiles.enforce(profile, current, libs)
        except ProfileUnmet:
            code = 4
        result["unmet"] = [
            {"group": u.group, "field": u.field, "expected": u.expected, "found": u.found} for u in problems
        ]
    if args.json:
        output.print_json({**result, "exit_code": code})
        return code
    con = output.console()
    for note in notes:
        con.print(f"note: {safe(note)}")
    if profile is None:
        con.print("no profile's site signals matched this machine")
        return 0
    verdict = "[green]meets[/]" if code == 0 else "[red]does not meet[/]"
    con.print(f"this machine {verdict} profile {safe(profile.name)} ({safe(matched)})")
    for u in result["unmet"]:
        con.print(f"  - {safe(u['field'])}: expected {safe(u['expected'])}, found {safe(u['found'])} ({u['group']})")
    for w in result["warnings"]:
        con.print(f"  warning: {safe(w)}")
    if result["device-name-note"]:
        con.print(f"  note: {safe(result['device-name-note'])}")
    return code
