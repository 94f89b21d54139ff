"""``kernel-probe profiles list | show NAME | check PATH | match [NAME] [--node FILE]``: site
profiles (the work is kernel_probe.profiles'; here the arguments and the rendering)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kernel_lock import fingerprint
from kernel_lock.toml import toml_key, toml_value
from kernel_probe import output, profile_match, sites
from kernel_probe.errors import ProfileUnmet
from kernel_probe.output import comment, print_rows, safe
from kernel_probe.probe.planning import detect_device
from kernel_probe.profile_match import detect_warnings
from kernel_probe.profiles import DETECT_DEVICE_KEYS, load_file
from kernel_probe.sites import builtin_dir, names_file, resolve, survey

_ACTIONS = {
    "list": "every profile found, built-in and yours",
    "show": "one profile as TOML: detection, requirements, policy, strictness",
    "check": "validate a profile file (exit 5 on errors)",
    "match": "does this machine (or a described node, --node) meet a profile? exit 0 yes, 4 no: "
    "what --profile enforces",
}
_DIR_HELP = "extra directory of profiles (repeatable; also $KERNEL_PROBE_PROFILES)"


def add_profiles_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe profiles`` and its actions (list, show, check, match)."""
    # --profiles-dir is taken before the action (`profiles --profiles-dir D list`) and after it
    dirs: dict[str, Any] = dict(action="append", default=[], metavar="DIR", help=_DIR_HELP)
    p.add_argument("--profiles-dir", dest="profiles_dir", **dirs)
    sub = p.add_subparsers(dest="action", required=True, metavar="{list,show,check,match}")
    actions = {
        name: sub.add_parser(
            name,
            help=help,
            allow_abbrev=False,
            parents=[
                output.debug_flag(argparse.SUPPRESS),
                *([] if name == "check" else [output.json_flag()]),
            ],
        )
        for name, help in _ACTIONS.items()
    }
    actions["show"].add_argument("name", help="profile name or path")
    actions["check"].add_argument("path")
    match = actions["match"]
    match.add_argument(
        "name", nargs="?", default="auto", help="profile name or path, or auto (default)"
    )
    match.add_argument(
        "--node",
        metavar="FILE|NAME",
        help="judge a described node instead of this machine: a JSON file (`kernel-probe env "
        "--json` from the node, or the short form of docs/profiles.md), or the name of a shipped "
        "example",
    )
    for action in actions.values():
        action.add_argument("--profiles-dir", dest="profiles_dir_after", **dirs)


def run_profiles(args: argparse.Namespace) -> int:
    """``kernel-probe profiles ACTION``: list, show, check or match site profiles."""
    args.profiles_dir = [*args.profiles_dir, *getattr(args, "profiles_dir_after", [])]
    return {"list": _list, "show": _show, "check": _check, "match": _match}[args.action](args)


def _check(args: argparse.Namespace) -> int:
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


def _list(args: argparse.Namespace) -> int:
    found = survey(args.profiles_dir)
    for exc in found.broken:
        output.warn(f"broken profile, skipped: {exc}")
    for note in found.notes_for():
        output.warn(note)
    if args.json:
        broken = [
            {"path": exc.path, "broken": True, "error": exc.problem, "key": exc.key, "fix": exc.fix}
            for exc in found.broken
        ]
        output.print_json([_summary(p) for p in found.profiles.values()] + broken)
        return 0
    builtin = builtin_dir()
    rows = [
        (
            safe(prof.name),
            safe(prof.description),
            "built-in" if prof.path and Path(prof.path).parent == builtin else safe(prof.path),
        )
        for prof in found.profiles.values()
    ]
    print_rows(None, ("name", "description", "file"), rows, wrap=("description",))
    output.console().print(f"[dim]built-in: {safe(builtin)}[/]")
    return 0


def _show(args: argparse.Namespace) -> int:
    shown = None if names_file(args.name) else survey(args.profiles_dir)
    prof = resolve(args.name, args.profiles_dir, shown)
    for note in shown.notes_for(prof.name) if shown else ():
        output.warn(note)
    if args.json:
        output.print_json(_summary(prof))
        return 0
    for line in rendered(prof).splitlines():
        output.console().print(safe(line))
    return 0


def _summary(prof: Any) -> dict:
    return {
        **{k: getattr(prof, k) for k in ("name", "description", "help", "path", "digest")},
        "detect": {**prof.detect, **({"all": list(prof.detect_all)} if prof.detect_all else {})},
        **{k: getattr(prof, k) for k in ("requires", "precision")},
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


def rendered(prof: Any) -> str:
    """The profile as TOML, laid out as profiles are written (docs/profiles.md), with the strictness
    in force spelt out even where the file leaves it to the default."""
    doc = dict(prof.document)
    doc["strictness"] = {"default": prof.default_strictness, "warn": list(prof.warn_groups)}
    lines = [comment(prof.path), comment(prof.digest)]
    _render_table(doc, [], lines)
    return "\n".join(lines) + "\n"


def _tables(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(i, dict) for i in v)


def _render_table(table: dict, path: list[str], lines: list[str]) -> None:
    def inline(v: Any) -> bool:  # below the top level, a table of plain values stays on its line
        return not isinstance(v, dict) or (
            bool(path)
            and all(
                not isinstance(x, (dict, list)) or (isinstance(x, list) and not _tables(x))
                for x in v.values()
            )
        )

    lines += [
        f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items() if inline(v) and not _tables(v)
    ]
    for k, v in table.items():
        dotted = ".".join(toml_key(x) for x in [*path, k])
        if isinstance(v, dict) and not inline(v):
            lines += ["", f"[{dotted}]"]
            _render_table(v, [*path, k], lines)
        elif _tables(v):
            for item in v:
                lines += ["", f"[[{dotted}]]"]
                lines += [f"{toml_key(ik)} = {toml_value(iv)}" for ik, iv in item.items()]


# ---- match ------------------------------------------------------------------------------------
def _match(args: argparse.Namespace) -> int:
    """What ``--profile NAME`` would decide on this machine or a described node, without probing."""
    node = sites.load_node(args.node) if args.node else None
    if node is None:
        device, facts = detect_device(), None
    else:
        device = {key: node.fingerprint[f"device-{key}"] for key in DETECT_DEVICE_KEYS}
        facts = sites.node_facts(node)
    current: dict[str, Any] = dict(node.fingerprint) if node else fingerprint.current()
    where = f"the node described in {node.path}" if node else "this machine"
    judged = profile_match.judge(
        args.name,
        args.profiles_dir,
        device,
        lambda: current,
        facts=facts,
        described=node.libraries if node else None,
        named="named (profiles match NAME)",
        where=where,
    )
    profile, seen, notes = judged.profile, judged.seen, judged.notes
    if profile is not None and args.name != "auto" and (seen is None or seen.name != profile.name):
        notes.append(
            f"the site signals {'of this node' if node else 'here'} "
            + (f"point to profile {seen.name}" if seen else "match no profile")
            + f", not {profile.name}: is this the right profile?"
        )
    result: dict[str, Any] = {
        "profile": profile.name if profile else None,
        "node": args.node,
        "matched": judged.matched,
        "notes": notes,
        "unmet": [],
        "warnings": judged.warnings,
        "help": profile.help if profile else "",
        "device-name-note": None if node else fingerprint.device_name_note(current),
    }
    # requirements unmet come before another site's signals, whatever its hardware meets
    refusal = judged.refusal or judged.site_refusal
    code = 0 if refusal is None else 4
    if profile is not None:
        result["unmet"] = [
            {"group": u.group, "field": u.field, "expected": u.expected, "found": u.found}
            for u in judged.unmet
        ]
        if judged.site_refusal is not None:
            seen_by = f"{seen.name} ({judged.seen_by})" if seen else ""
            site = {"group": "site", "field": "site signals", "expected": profile.name}
            result["unmet"].insert(0, {**site, "found": seen_by})
        result["fix"] = refusal.fix if refusal else None
    if args.json:
        output.print_json(output.with_failure({**result, "exit_code": code}, refusal))
    else:
        _render_match(result, profile, where, code, refusal)
    return code


def _render_match(
    result: dict[str, Any], profile: Any, where: str, code: int, refusal: ProfileUnmet | None
) -> None:
    say = output.console().print
    for note in result["notes"]:
        say(f"note: {safe(note)}")
    if profile is None:
        say(f"no profile's site signals matched {where}")
        return
    verdict = "[green]meets[/]" if code == 0 else "[red]does not meet[/]"
    say(f"{where} {verdict} profile {safe(profile.name)} ({safe(result['matched'])})")
    for u in result["unmet"]:
        say(
            f"  - {safe(u['field'])}: expected {safe(u['expected'])}, found {safe(u['found'])} "
            f"({u['group']})"
        )
    for w in result["warnings"]:
        say(f"  warning: {safe(w)}")
    if refusal is not None and refusal.fix:
        say(f"  what to do: {safe(refusal.fix)}")
    if result["device-name-note"]:
        say(f"  note: {safe(result['device-name-note'])}")
