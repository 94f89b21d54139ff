"""The site data: profiles by name (``survey``: ``--profiles-dir``, ``$KERNEL_PROBE_PROFILES``,
then the built-ins ``kernel_probe/profiles/sites/*.toml``; the first of a name wins, shadowing is
noted), and a node's site facts: this machine's, or a described node's (``kernel-probe env --json``
or the short ``kernel-probe-node/1``, docs/profiles.md; examples in ``.../sites/nodes/*.json``)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from kernel_lock.files import UnsafeFile, read_regular
from kernel_lock.fingerprint import FIELDS
from kernel_lock.tables import (
    ReadError,
    context,
    get,
    get_int,
    get_literal,
    get_string_map,
    get_table,
    get_text,
    refuse_unknown,
)
from kernel_probe.candidates import DEVICE_TYPES
from kernel_probe.detect.host import read_marker
from kernel_probe.detect.libraries import known
from kernel_probe.errors import InputFileError, UsageError
from kernel_probe.profiles import MAX_BYTES, Profile, ProfileError, load_file, parse, read_text

ENV_VAR = "KERNEL_PROBE_PROFILES"
BUILTIN_PACKAGE_DIR = "sites"  # under kernel_probe/profiles/; pyproject.toml's package-data too
MAX_NODE_BYTES = 4 << 20  # an env --json report is some tens of kB
NODE_SCHEMA = "kernel-probe-node/1"
ENV_SCHEMA = "kernel-probe-env/1"
_NODE_KEYS = (
    *("schema", "description", "sources", "fingerprint", "libraries", "site", "env", "files"),
)
_SITE_KEYS = ("hostname", "slurm", "markers")
_LIBRARY_KEYS = ("version", "variant", "distributions")
# a profile file says so on a line of its own; anything else in a profiles directory (a lock, a
# config) is skipped, not reported as a broken profile
_DECLARES_PROFILE = re.compile(rb'^[ \t]*["\']?profile-version["\']?[ \t]*=', re.MULTILINE)


class BuiltinProfilesMissing(InputFileError):
    """No built-in profile where the package ships them (exit 5): a broken installation."""


class NodeError(InputFileError):
    """A malformed node description (exit 5), naming the file and the key."""


def builtin_dir() -> Path:
    """The built-in profiles: package data, found through importlib.resources (any layout)."""
    return Path(str(files("kernel_probe") / "profiles" / BUILTIN_PACKAGE_DIR))


@dataclass
class Survey:
    """Every profile found (by name: the first directory wins), the broken files, and notes:
    shadowed built-ins, duplicate names, a file named unlike its profile, non-profile files."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    broken: list[ProfileError] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (profile name or "", text)

    def notes_for(self, name: str | None = None) -> list[str]:
        """The survey's notes about profile ``name`` and the general ones (all notes when None)."""
        return [text for n, text in self.notes if name is None or n in (name, "")]

    def _add(self, prof: Profile, f: Path, d: Path, builtin: Path) -> None:
        name, first, said = prof.name, self.profiles.get(prof.name), []
        if name != f.stem:
            said.append(f"{f} declares name {name!r}: it is found as {name!r} (name the file ")
            said[-1] += f"{name}.toml to avoid surprises)"
        if first is None:
            self.profiles[name] = prof
        elif d == builtin:
            said.append(f"{first.path} shadows the built-in profile {name!r}")
        elif Path(first.path).parent == d:
            said.append(f"two profiles named {name!r} in {d}: {Path(first.path).name} is used, ")
            said[-1] += f"{f.name} is ignored (rename one)"
        else:
            said.append(f"{f} is shadowed by {first.path} (an earlier directory wins)")
        self.notes += [(name, text) for text in said]


def survey(extra: Iterable[str] = ()) -> Survey:
    """Every valid profile of ``extra`` (``--profiles-dir``), ``$KERNEL_PROBE_PROFILES``, then the
    built-ins; one broken file hides no other."""
    builtin = builtin_dir()
    if not (builtin.is_dir() and any(builtin.glob("*.toml"))):
        raise BuiltinProfilesMissing(
            "no built-in site profiles here: this kernel-probe installation is incomplete",
            path=str(builtin),
            fix="reinstall kernel-probe; the built-ins ship inside the package as "
            f"kernel_probe/{BUILTIN_PACKAGE_DIR}/*.toml",
        )
    env = [Path(x) for x in os.environ.get(ENV_VAR, "").split(os.pathsep) if x]
    out = Survey()
    for d in [*map(Path, extra), *env, builtin]:
        if not d.is_dir():
            said = f"profiles directory {d} does not exist (from --profiles-dir or ${ENV_VAR})"
            raise UsageError(said)
        skipped = []
        for f in sorted(d.glob("*.toml")):
            try:
                raw = read_regular(f, MAX_BYTES)  # once: what is sniffed is what is parsed
                if not _DECLARES_PROFILE.search(raw):
                    skipped.append(f.name)
                    continue
                out._add(parse(raw.decode("utf-8"), str(f)), f, d, builtin)
            except UnsafeFile:
                skipped.append(f.name)
            except (OSError, UnicodeDecodeError) as exc:
                out.broken.append(ProfileError(f"cannot read: {exc}", path=str(f)))
            except ProfileError as exc:
                out.broken.append(exc)
        if skipped:
            text = f"{d}: skipped {len(skipped)} file(s) that are not profiles (no profile-version"
            out.notes.append(("", text + f" line): {', '.join(skipped)}"))
    return out


def names_file(spec: str) -> bool:
    """Whether ``--profile`` names a profile file (a '/' in it, or ending in .toml), not a name."""
    return "/" in spec or spec.endswith(".toml")


def resolve(spec: str, extra: Iterable[str] = (), found: Survey | None = None) -> Profile:
    """A profile by name, or by path (:func:`names_file`)."""
    if names_file(spec):
        return load_file(spec)
    found = found or survey(extra)
    if spec in found.profiles:
        return found.profiles[spec]
    named = [e for e in found.broken if Path(e.path or "").stem == spec]
    if named:
        raise named[0]  # the profile asked for is the broken one: say why
    broken = len(found.broken)
    said = f"; {broken} profile file(s) are broken: `kernel-probe profiles list` names them"
    raise UsageError(
        f"unknown profile {spec!r}; available: {', '.join(sorted(found.profiles)) or 'none'}"
        " (or pass a path to a .toml file)" + (said if broken else "")
    )


# ---- a node's site facts -----------------------------------------------------------------------
@dataclass(frozen=True)
class SiteFacts:
    """A node's site: environment, host name, Slurm variables, device, and a marker-file reader."""

    env: Mapping[str, str]
    hostname: str
    slurm: Mapping[str, str]
    device: Mapping[str, Any]
    read_file: Callable[[str], str | None]


def site_facts(
    site: Mapping[str, Any],
    device: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    read_file: Callable[[str], str | None] | None = None,
    problems: list[str] | None = None,
) -> SiteFacts:
    """This machine's site facts (``site``: ``detect.host.detect_site``); a marker file refused by
    the safe reader is noted in ``problems``."""
    said = [] if problems is None else problems

    def read_marker_file(path: str) -> str | None:
        value, problem = read_marker(path)
        if problem:
            said.append(f"detect file {path}: {problem}")
        return value

    hostname, slurm = str(site.get("hostname") or ""), dict(site.get("slurm") or {})
    env = os.environ if env is None else env
    return SiteFacts(env, hostname, slurm, device, read_file or read_marker_file)


# ---- a described node ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """The facts of one node, as a profile sees them."""

    path: str
    description: str
    fingerprint: Mapping[str, Any]
    # report name or distribution -> {version, variant, distributions}
    libraries: Mapping[str, Mapping[str, Any]]
    hostname: str
    slurm: Mapping[str, str]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)


def examples() -> dict[str, Path]:
    """The shipped example descriptions (``kernel_probe/profiles/sites/nodes``) by name (the
    built-in profile each describes)."""
    return {p.stem: p for p in sorted((builtin_dir() / "nodes").glob("*.json"))}


def load_node(spec: str) -> Node:
    """A node description by path, or by the name of a shipped example (no '/', no '.json')."""
    if "/" not in spec and not spec.endswith(".json"):
        known = examples()
        if spec not in known:
            raise UsageError(
                f"--node {spec!r}: no such example node; examples: {', '.join(known) or 'none'}",
                fix="pass the path of a JSON description (e.g. `kernel-probe env --json > "
                "node.json` on the node)",
            )
        return load_node(str(known[spec]))
    missing = "write one with `kernel-probe env --json > node.json` on the node"
    text = read_text(spec, MAX_NODE_BYTES, NodeError, missing)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise NodeError(f"not valid JSON: {exc}", path=spec) from None
    return parse_node(data, spec)


def parse_node(data: Any, path: str) -> Node:
    """The node described by ``data`` (typed reader; NodeError names the key)."""
    try:
        if not isinstance(data, dict):
            said = "expected a JSON object (a node description or `kernel-probe env --json`), got"
            raise ReadError(f"{said} {type(data).__name__}")
        schema = data.get("schema")
        if schema not in (NODE_SCHEMA, ENV_SCHEMA):
            fix = f"use {NODE_SCHEMA!r} (docs/profiles.md), or the output of `kernel-probe env "
            fix += "--json`"
            raise ReadError(f"unknown schema {schema!r:.80}", "schema", fix=fix)
        strict = schema == NODE_SCHEMA
        if strict:
            refuse_unknown(data, _NODE_KEYS)
        fingerprint = _fingerprint(data, strict)
        libraries: dict[str, Mapping[str, Any]] = {}
        with context("libraries"):
            for name, value in get(data, "libraries", dict, default={}).items():
                with context(str(name)):
                    entry = _library(str(name), value, strict)
                if entry is not None:
                    libraries[str(name)] = entry
        return _with_site(data, strict, path, fingerprint, libraries)
    except ReadError as exc:
        raise NodeError(exc.problem, path=path, key=exc.key or None, fix=exc.fix) from None


def _fingerprint(data: Mapping[str, Any], strict: bool) -> dict[str, Any]:
    if (fp := get(data, "fingerprint", dict)) is None:
        said = "required: an object of the node's facts (as `kernel-probe env --json` has)"
        raise ReadError(said, "fingerprint")
    out: dict[str, Any] = {}
    with context("fingerprint"):
        if strict:
            refuse_unknown(fp, tuple(FIELDS))
        for name, spec in FIELDS.items():
            if spec.type is int:
                out[name] = get_int(fp, name, 0, 1 << 20, default=0)
            else:
                out[name] = get_text(fp, name, "", limit=400)
        out["device-type"] = get_literal(fp, "device-type", DEVICE_TYPES, default="", fold=True)
    return out


def _library(name: str, value: Any, strict: bool) -> Mapping[str, Any] | None:
    if isinstance(value, str):
        value = {"version": value}
    if not isinstance(value, dict):
        said = f"expected a version string or {{version, variant}}, got {type(value).__name__}"
        raise ReadError(said)
    if strict:
        refuse_unknown(value, _LIBRARY_KEYS)
    version = get_text(value, "version", None, limit=200)
    distributions = {}
    if value.get("distributions"):
        distributions = get_string_map(value, "distributions", limit=200)
    installed = get(value, "installed", bool, default=True)
    variant = None
    if value.get("variant") is not None:
        lib = known(name)
        keys = [v.key for v in lib.variants] if lib is not None else []
        if not keys:
            said = f"{name} has no variants kernel-probe tells apart"
            raise ReadError(said, "variant", "remove the variant")
        variant = get_literal(value, "variant", keys, fold=True)  # NVIDIA -> nvidia
    if installed is False or version is None and not distributions:
        return None  # env --json lists every known library, installed or not
    return {"version": version, "variant": variant, "distributions": distributions}


def _with_site(
    data: Mapping[str, Any], strict: bool, path: str, fingerprint: dict, libraries: dict
) -> Node:
    site = get_table(data, "site", _SITE_KEYS if strict else None)
    with context("site"):
        hostname = get_text(site, "hostname", "", limit=255) or ""
        slurm = get_string_map(site, "slurm")
        markers = get(site, "markers", list, default=[])
    env, files = get_string_map(data, "env"), get_string_map(data, "files")
    for i, marker in enumerate(markers):  # env --json: the site markers it found
        with context(f"site.markers[{i}]"):
            if not isinstance(marker, dict):
                raise ReadError(f"expected an object (signal, value), got {type(marker).__name__}")
            kind, _, name = (get_text(marker, "signal", "", limit=400) or "").partition(":")
            value = marker.get("value")
        if kind in ("env", "file") and isinstance(value, str):
            (env if kind == "env" else files).setdefault(name, value)
    get(data, "sources", list, default=[])
    description = get_text(data, "description", "") or ""
    return Node(path, description, fingerprint, libraries, hostname, slurm, env, files)


def node_facts(node: Node) -> SiteFacts:
    """The node's site facts, for auto-detection."""
    fp = node.fingerprint
    device = {"type": fp["device-type"], "vendor": fp["device-vendor"], "arch": fp["device-arch"]}
    env = {**node.slurm, **node.env}
    return SiteFacts(env, node.hostname, node.slurm, device, node.files.get)
