"""kernel-probe profiles list | show NAME | check PATH | match [NAME] [--node FILE]."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kernel_probe import output
from kernel_probe.output import safe

_PROFILES_DIR_HELP = "extra directory of profiles (repeatable; also $KERNEL_PROBE_PROFILES)"


def _profiles_dir(p: argparse.ArgumentParser, dest: str) -> None:
    p.add_argument(
        "--profiles-dir",
        dest=dest,
        action="append",
        default=[],
        metavar="DIR",
        help=_PROFILES_DIR_HELP,
    )


def add_profiles_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe profiles`` and its actions (list, show, check, match)."""
    # accepted before the action (`profiles --profiles-dir D list`) and after it (`profiles list
    # --profiles-dir D`)
    _profiles_dir(p, "profiles_dir")
    sub = p.add_subparsers(dest="action", required=True, metavar="{list,show,check,match}")
    ls = sub.add_parser(
        "list", help="every profile found, built-in and yours", parents=[output.json_flag()]
    )
    show = sub.add_parser(
        "show",
        help="one profile as TOML: detection, requirements, policy, strictness",
        parents=[output.json_flag()],
    )
    show.add_argument("name", help="profile name or path")
    check = sub.add_parser("check", help="validate a profile file (exit 5 on errors)")
    check.add_argument("path")
    match = sub.add_parser(
        "match",
        help="does this machine (or a described node, --node) meet a profile? exit 0 yes, 4 no: "
        "what --profile enforces",
        parents=[output.json_flag()],
    )
    match.add_argument(
        "name", nargs="?", default="auto", help="profile name or path, or auto (default)"
    )
    match.add_argument(
        "--node",
        metavar="FILE|NAME",
        help="judge a described node instead of this machine: a JSON file (`kernel-probe env "
        "--json` "
        "from the node, or the short form of docs/profiles.md), or the name of a shipped example",
    )
    for action in (ls, show, check, match):
        _profiles_dir(action, "profiles_dir_after")


def _summary(prof) -> dict:
    return {
        "name": prof.name,
        "description": prof.description,
        "help": prof.help,
        "path": prof.path,
        "digest": prof.digest,
        "detect": {**prof.detect, **({"all": list(prof.detect_all)} if prof.detect_all else {})},
        "requires": prof.requires,
        "precision": prof.precision,
        "shapes": list(prof.shapes),
        "deterministic": prof.deterministic,
        "policy": {
            s: {
                "allowed": None if p.allowed is None else list(p.allowed),
                "preferred": list(p.preferred),
                "pin": p.pin,
            }
            for s, p in prof.slots.items()
        },
        "candidates": [c.id for c in prof.candidates],
        "sources": list(prof.sources),
        "unknown": list(prof.unknown),
        "strictness": {"default": prof.default_strictness, "warn": list(prof.warn_groups)},
    }


def rendered(prof) -> str:
    """The profile as TOML, laid out as profiles are written (docs/profiles.md), with the strictness
    in force spelt out even where the file leaves it to the default."""
    doc = dict(prof.document)
    doc["strictness"] = {"default": prof.default_strictness, "warn": list(prof.warn_groups)}
    lines = [f"# {prof.path}", f"# {prof.digest}"]
    _render_table(doc, [], lines)
    return "\n".join(lines) + "\n"


def _render_table(table: dict, path: list[str], lines: list[str]) -> None:
    from kernel_lock.format.toml import toml_key, toml_value

    def is_array_of_tables(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(i, dict) for i in v)

    def inline(
        v: Any,
    ) -> bool:  # below the top level, a table of plain values stays on its key's line
        return not isinstance(v, dict) or (
            bool(path)
            and all(
                not isinstance(x, (dict, list))
                or (isinstance(x, list) and not is_array_of_tables(x))
                for x in v.values()
            )
        )

    for k, v in table.items():
        if inline(v) and not is_array_of_tables(v):
            lines.append(f"{toml_key(k)} = {toml_value(v)}")
    for k, v in table.items():
        dotted = ".".join(toml_key(x) for x in [*path, k])
        if isinstance(v, dict) and not inline(v):
            lines += ["", f"[{dotted}]"]
            _render_table(v, [*path, k], lines)
        elif is_array_of_tables(v):
            for item in v:
                lines += ["", f"[[{dotted}]]"]
                lines += [f"{toml_key(ik)} = {toml_value(iv)}" for ik, iv in item.items()]


def run_profiles(args: argparse.Namespace) -> int:
    """``kernel-probe profiles ACTION``: list, show, check or match site profiles."""
    from kernel_probe.profiles.autodetect import detect_warnings
    from kernel_probe.profiles.discovery import builtin_dir, names_file, resolve, survey
    from kernel_probe.profiles.format import load_file

    args.profiles_dir = [*args.profiles_dir, *getattr(args, "profiles_dir_after", [])]
    if args.action == "match":
        return _match(args)
    if args.action == "check":
        prof = load_file(args.path)
        if Path(args.path).stem != prof.name:
            output.warn(
                f"{args.path}: declares name {prof.name!r}: in a profiles directory it is "
                "found as that name"
            )
        for warning in detect_warnings(prof):
            output.warn(f"{args.path}: {warning}")
        output.console().print(f"ok: {safe(args.path)} is a valid profile ({safe(prof.name)})")
        return 0
    if args.action == "list":
        found = survey(args.profiles_dir)
        for exc in found.broken:
            output.warn(f"broken profile, skipped: {exc}")
        for note in found.notes_for():
            output.warn(note)
        if args.json:
            output.print_json(
                [_summary(p) for p in found.profiles.values()]
                + [
                    {
                        "path": exc.path,
                        "broken": True,
                        "error": exc.problem,
                        "key": exc.key,
                        "fix": exc.fix,
                    }
                    for exc in found.broken
                ]
            )
            return 0
        table = output.table()
        table.add_column("name", no_wrap=True)
        table.add_column("description")
        table.add_column("file", no_wrap=True)
        builtin = builtin_dir()
        for prof in found.profiles.values():
            where = (
                "built-in" if prof.path and Path(prof.path).parent == builtin else safe(prof.path)
            )
            table.add_row(safe(prof.name), safe(prof.description), where)
        output.print_table(table)
        output.console().print(f"[dim]built-in: {safe(builtin)}[/]")
        return 0
    by_path = names_file(args.name)
    shown = None if by_path else survey(args.profiles_dir)
    prof = resolve(args.name, args.profiles_dir, shown)
    for note in shown.notes_for(prof.name) if shown else ():
        output.warn(note)
    if args.json:
        output.print_json(_summary(prof))
        return 0
    con = output.console()
    for line in rendered(prof).splitlines():
        con.print(safe(line))
    return 0


def _match(args: argparse.Namespace) -> int:
    """What ``--profile NAME`` would decide on this machine or a described node, without probing."""
    from kernel_probe.errors import ProfileUnmet
    from kernel_probe.probe.planning import detect_device
    from kernel_probe.profiles import nodes, requirements
    from kernel_probe.profiles.signals import DETECT_DEVICE_KEYS

    named = "named (profiles match NAME)"
    device: dict[str, Any] = {}
    if args.node:
        node = nodes.load(args.node)
        device = {key: node.fingerprint[f"device-{key}"] for key in DETECT_DEVICE_KEYS}
        profile, matched, notes = requirements.choose(
            args.name, args.profiles_dir, device, facts=nodes.site_facts(node), named=named
        )
        current: dict[str, Any] = dict(node.fingerprint)
        where = f"the node described in {node.path}"

        def libraries(keys):
            return requirements.library_facts(keys, node.libraries)

        name_note = None
    else:
        from kernel_lock import fingerprint

        profile, matched, notes = requirements.choose(
            args.name, args.profiles_dir, detect_device(), named=named
        )
        current = fingerprint.current()
        where = "this machine"
        libraries = requirements.library_facts
        name_note = fingerprint.device_name_note(current)
    site_refusal: ProfileUnmet | None = None
    if profile is not None and args.name != "auto":  # named: do the site's signals agree?
        facts = nodes.site_facts(node) if args.node else None
        seen, seen_by, _ = requirements.choose(
            "auto", args.profiles_dir, device if args.node else detect_device(), facts=facts
        )
        seen_by_text = f"{seen.name} ({seen_by})" if seen else ""
        try:
            requirements.other_site(profile, seen, seen_by, where)
        except ProfileUnmet as exc:
            site_refusal = exc
        if seen is None or seen.name != profile.name:
            notes.append(
                f"the site signals {'of this node' if args.node else 'here'} "
                + (f"point to profile {seen.name}" if seen else "match no profile")
                + f", not {profile.name}: is this the right profile?"
            )
    result: dict[str, Any] = {
        "profile": profile.name if profile else None,
        "node": args.node,
        "matched": matched,
        "notes": notes,
        "unmet": [],
        "warnings": [],
        "help": profile.help if profile else "",
        "device-name-note": name_note,
    }
    code = 0
    refusal = None
    if profile is not None:
        libs = libraries(requirements.required_libraries(profile))
        problems = requirements.unmet(profile, current, libs)
        try:
            result["warnings"] = requirements.enforce(profile, current, libs)
        except ProfileUnmet as exc:
            code, refusal = 4, exc
        result["unmet"] = [
            {"group": u.group, "field": u.field, "expected": u.expected, "found": u.found}
            for u in problems
        ]
        if site_refusal is not None:  # another site's node, whatever its hardware meets
            code, refusal = 4, refusal or site_refusal
            result["unmet"].insert(
                0,
                {
                    "group": "site",
                    "field": "site signals",
                    "expected": profile.name,
                    "found": seen_by_text,
                },
            )
        result["fix"] = refusal.fix if refusal else None
    if args.json:
        output.print_json(output.with_failure({**result, "exit_code": code}, refusal))
        return code
    con = output.console()
    for note in notes:
        con.print(f"note: {safe(note)}")
    if profile is None:
        con.print(f"no profile's site signals matched {where}")
        return 0
    verdict = "[green]meets[/]" if code == 0 else "[red]does not meet[/]"
    con.print(f"{where} {verdict} profile {safe(profile.name)} ({safe(matched)})")
    for u in result["unmet"]:
        con.print(
            f"  - {safe(u['field'])}: expected {safe(u['expected'])}, found {safe(u['found'])} "
            f"({u['group']})"
        )
    for w in result["warnings"]:
        con.print(f"  warning: {safe(w)}")
    if refusal is not None and refusal.fix:
        con.print(f"  what to do: {safe(refusal.fix)}")
    if result["device-name-note"]:
        con.print(f"  note: {safe(result['device-name-note'])}")
    return code
