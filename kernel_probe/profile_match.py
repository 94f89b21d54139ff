"""A node against the site profiles: which profile's ``[detect]`` signals it shows (``--profile
auto``), which requirements it does not meet (exit 4), and whether a lock was written under the
same profile.

The node is this machine, or a described one (``profiles match PROFILE --node FILE``): what
``kernel-probe env --json`` prints on it (schema ``kernel-probe-env/1``: its ``fingerprint``,
``libraries`` and ``site`` are read, the rest ignored), or the short form ``kernel-probe-node/1``
with the same keys plus ``env`` and ``files`` (docs/profiles.md), so that a profile can be tested
from a login node. Ambiguity is an error, never a guess; libraries are never imported.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock import Difference
from kernel_lock.fingerprint.fields import FIELDS, library_versions
from kernel_lock.format.reading import (
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
from kernel_lock.format.versions import in_spec
from kernel_lock.trust.files import UnsafeFile, read_regular
from kernel_probe.candidates import DEVICE_TYPES, arch_satisfies
from kernel_probe.detect.libraries import known_libraries, locate
from kernel_probe.detect.site import detect_site, read_marker
from kernel_probe.errors import InputFileError, ProfileUnmet, UsageError
from kernel_probe.profiles import (
    MAX_SIGNAL_CHARS,
    STRONG,
    WEAK,
    Profile,
    Survey,
    builtin_dir,
    load_file,
    names_file,
    resolve,
    survey,
)

MAX_MARKER_BYTES = 64 << 10  # a marker file is one short line
NODE_SCHEMA = "kernel-probe-node/1"
ENV_SCHEMA = "kernel-probe-env/1"
EXAMPLES_DIR = "nodes"  # under kernel_probe/profiles/sites/
MAX_NODE_BYTES = 4 << 20  # an env --json report is some tens of kB
_NODE_KEYS = (
    "schema",
    "description",
    "sources",
    "fingerprint",
    "libraries",
    "site",
    "env",
    "files",
)
_SITE_KEYS = ("hostname", "slurm", "markers")
_LIBRARY_KEYS = ("version", "variant", "distributions")
# what a refused user can do, by group: about their job and environment, not about the profile
USER_FIX = {
    "device": "run on one of the site's GPU nodes, inside a GPU job",
    "count": "ask the job for GPUs and keep them visible (CUDA_VISIBLE_DEVICES, "
    "HIP_VISIBLE_DEVICES)",
    "versions": "use a torch build in the required range (the site's module or container)",
    "libraries": "install the required libraries in this environment (or load the site's module)",
    "forbidden": "uninstall the forbidden library, or use another environment without it",
}


# ---- recognising a site --------------------------------------------------------------------------
@dataclass(frozen=True)
class SiteFacts:
    """What a node shows of its site: its environment, host name, Slurm variables, device, and a
    reader of marker files (path -> first line, or None)."""

    env: Mapping[str, str]
    hostname: str
    slurm: Mapping[str, str]
    device: Mapping[str, Any]
    read_file: Callable[[str], str | None]

    def slurm_value(self, name: str) -> str | None:
        """A Slurm setting from the environment, else from the Slurm configuration."""
        return self.env.get(name) or self.slurm.get(name)


@dataclass(frozen=True)
class Hit:
    """One site signal that matched, as the notes and the lock's ``matched`` name it."""

    kind: str  # one of SIGNALS
    text: str  # "env:LUMI_STACK_PARTITION=G"


@dataclass(frozen=True)
class Detection:
    """Why auto-detection would pick a profile: ``rank`` 2 = a strong signal decided, 1 = a group of
    weak signals together, 0 = a device profile's device facts (only when no site matched)."""

    profile: Profile
    rank: int
    strength: int
    matched: str
    hits: int


def _search(pattern: str, value: str, what: str, notes: list[str]) -> bool:
    if len(value) > MAX_SIGNAL_CHARS:
        notes.append(
            f"{what} is {len(value)} characters long, more than {MAX_SIGNAL_CHARS}: not matched"
        )
        return False
    return re.search(pattern, value) is not None


def _evaluate(
    signals: Mapping[str, Any], facts: SiteFacts, notes: list[str]
) -> tuple[list[Hit], list[str]]:
    """(each signal that matched, each that did not): one per variable, file, pattern list and
    device table."""
    tried: list[tuple[str, bool, str, str]] = []  # kind, matched, as a hit, as a miss
    for var, pattern in signals.get("env", {}).items():
        value = facts.env.get(var)
        ok = value is not None and _search(pattern, value, f"${var}", notes)
        tried.append(("env", ok, f"env:{var}={value}", f"env:{var}"))
    for path, pattern in signals.get("files", {}).items():
        value = facts.read_file(path)
        ok = value is not None and _search(pattern, value, f"the first line of {path}", notes)
        tried.append(("files", ok, f"file:{path}={value}", f"file:{path}"))
    for kind, var in (
        ("slurm-cluster", "SLURM_CLUSTER_NAME"),
        ("slurm-partition", "SLURM_JOB_PARTITION"),
        ("hostname", ""),
    ):
        if kind in signals:
            value = facts.slurm_value(var) if var else facts.hostname
            ok = bool(value) and any(
                _search(pat, value or "", kind, notes) for pat in signals[kind]
            )
            tried.append((kind, ok, f"{kind}:{value}", kind))
    if dev := signals.get("device", {}):
        text = "device:" + ",".join(f"{k}={v}" for k, v in dev.items())
        found = {k: str(facts.device.get(k, "")) for k in dev}
        same = (
            arch_satisfies(found[k], v) if k == "arch" else found[k] == v for k, v in dev.items()
        )
        tried.append(("device", all(same), text, text))
    hits = [Hit(kind, text) for kind, ok, text, _ in tried if ok]
    return hits, [miss for _, ok, _, miss in tried if not ok]


def detect(profile: Profile, facts: SiteFacts, notes: list[str] | None = None) -> Detection | None:
    """How ``profile`` would be picked on a node with ``facts`` (None: it would not), with a note in
    ``notes`` when some of its signals matched but could not decide."""
    notes = [] if notes is None else notes
    seen: list[str] = []
    top, _ = _evaluate(profile.detect, facts, seen)
    found: list[Detection] = []
    strong = [h for h in top if h.kind in STRONG]
    if strong:
        best = max(strong, key=lambda h: STRONG[h.kind])
        found.append(Detection(profile, 2, STRONG[best.kind], best.text, len(top)))
    for group in profile.detect_all:
        hits, missed = _evaluate(group, facts, seen)
        kinds = {h.kind for h in hits}
        said = (
            f"{profile.name}: {', '.join(h.text for h in hits)} matched, but not "
            f"{', '.join(missed)}: "
        )
        if not missed:
            rank = 2 if kinds & set(STRONG) else 1
            strength = max((STRONG[k] for k in kinds if k in STRONG), default=1)
            matched = " + ".join(h.text for h in hits)
            found.append(Detection(profile, rank, strength, matched, len(hits)))
        elif kinds & set(STRONG):
            notes.append(said + "not one of its nodes")
        elif kinds & set(WEAK):
            notes.append(said + "a weak signal never decides alone (other sites share such names)")
    site_signals = any(k != "device" for k in profile.detect) or bool(profile.detect_all)
    device_hits = [h for h in top if h.kind == "device"]
    if device_hits and not site_signals:
        found.append(Detection(profile, 0, 0, device_hits[0].text, 1))
    weak = [h for h in top if h.kind in WEAK]
    if not found and weak:
        notes.append(
            f"{profile.name}: {', '.join(h.text for h in weak)} matched, but a weak signal never "
            "decides alone (other sites share such names): not picked"
        )
    notes.extend(f"{profile.name}: {n}" for n in dict.fromkeys(seen))
    return max(found, key=lambda x: (x.rank, x.strength, x.hits)) if found else None


def detect_warnings(profile: Profile) -> list[str]:
    """What `profiles check` says about a valid profile that --profile auto could never pick."""
    site = [k for k in profile.detect if k != "device"]
    if site and not any(k in STRONG for k in site) and not profile.detect_all:
        return [
            f"detect: only weak signals ({', '.join(site)}): --profile auto never picks this "
            "profile on them alone; add a strong signal (env, files, slurm-cluster) or a "
            "[[detect.all]] group (docs/profiles.md)"
        ]
    if not profile.detect and not profile.detect_all:
        return [
            "detect: no signal: --profile auto never picks this profile (name it with --profile)"
        ]
    return []


def _facts_here(
    site: Mapping[str, Any],
    device: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    read_file: Callable[[str], str | None] | None = None,
    problems: list[str] | None = None,
) -> SiteFacts:
    """This machine's site facts (``site`` from kernel_probe.detect.site); marker files read like
    every input (regular, non-blocking, capped), a refused one noted in ``problems``."""
    said = [] if problems is None else problems

    def read_marker_file(path: str) -> str | None:
        value, problem = read_marker(path, MAX_MARKER_BYTES)
        if problem:
            said.append(f"detect file {path}: {problem}")
        return value

    return SiteFacts(
        env=os.environ if env is None else env,
        hostname=str(site.get("hostname") or ""),
        slurm=dict(site.get("slurm") or {}),
        device=device,
        read_file=read_file or read_marker_file,
    )


def auto_detect(
    profiles: Iterable[Profile],
    site: Mapping[str, Any] | SiteFacts,
    device: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    read_file: Callable[[str], str | None] | None = None,
) -> tuple[Profile | None, str, list[str]]:
    """(profile, the signal that decided, notes); None when nothing decided. Ambiguity is an
    error (exit 4)."""
    problems: list[str] = []
    facts = (
        site
        if isinstance(site, SiteFacts)
        else _facts_here(site, device or {}, env, read_file, problems)
    )
    notes: list[str] = []
    scored = [d for d in (detect(prof, facts, notes) for prof in profiles) if d is not None]
    notes.extend(dict.fromkeys(problems))
    if not scored:
        return None, "", notes
    scored.sort(key=lambda d: (-d.rank, -d.strength, -d.hits, d.profile.name))
    best = scored[0]
    score = (best.rank, best.strength, best.hits)
    rivals = [d for d in scored[1:] if (d.rank, d.strength, d.hits) == score]
    if rivals:
        names = ", ".join(d.profile.name for d in [best, *rivals])
        raise ProfileUnmet(
            f"--profile auto is ambiguous: {names} match equally well ({best.matched})",
            fix="name the profile with --profile NAME",
        )
    notes += [f"{d.profile.name} also matched ({d.matched}), more weakly" for d in scored[1:]]
    return best.profile, best.matched, notes


def choose(
    spec: str,
    extra: Iterable[str],
    device: Mapping[str, Any],
    site: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    facts: SiteFacts | None = None,
    named: str = "explicit (--profile)",
    found: Survey | None = None,
) -> tuple[Profile | None, str, list[str]]:
    """The profile ``--profile NAME|PATH|auto`` names, how it was chosen (``named`` when named), and
    notes to show. ``facts``: a described node's site facts instead of this machine's; ``found``:
    the profile directories as already surveyed, else they are surveyed here."""
    if spec != "auto" and names_file(spec):
        return load_file(spec), named, []
    found = found or survey(extra)
    if spec != "auto":
        return resolve(spec, extra, found), named, found.notes_for(spec)
    notes = found.notes_for() + [f"broken profile, not considered: {exc}" for exc in found.broken]
    problems: list[str] = []
    if facts is None:
        facts = _facts_here(site or detect_site(env), device, env, problems=problems)
    profile, matched, more = auto_detect(found.profiles.values(), facts)
    return profile, matched, notes + more + list(dict.fromkeys(problems))


def other_site(
    profile: Profile, seen: Profile | None, matched: str, where: str = "this machine"
) -> None:
    """Raise ProfileUnmet (exit 4) when a named ``profile`` meets a node whose site signals identify
    another profile's site (``seen``, by ``matched``): hardware alone cannot tell apart sites with
    the same nodes (the A100s of JUWELS Booster, Leonardo and Perlmutter). A node that matches no
    profile, or only a device profile, is not refused: naming a profile is how such a site is
    used."""
    if seen is None or seen.name == profile.name or matched.startswith("device:"):
        return
    raise ProfileUnmet(
        f"{where} is a node of profile {seen.name!r} by its site signals ({matched}), not of "
        f"{profile.name!r}",
        path=profile.path,
        fix=f"use --profile {seen.name} (or --profile auto) here, or run on a node of "
        f"{profile.name}",
    )


# ---- what a site requires ------------------------------------------------------------------------
class Unmet(Difference):
    """One requirement of a profile a node does not meet, expected vs found: a fingerprint
    difference whose ``rule`` is the requirement's strictness group."""

    @property
    def group(self) -> str:
        """The strictness group (device, count, versions, libraries, forbidden)."""
        return self.rule

    def __str__(self) -> str:
        return f"{self.field}: expected {self.expected}, found {self.found}"


def unmet(
    profile: Profile, fingerprint: Mapping[str, Any], libraries: Mapping[str, str | None]
) -> list[Unmet]:
    """Every requirement of ``profile`` this machine does not meet (expected vs found)."""
    req, out = profile.requires, []
    cpu = fingerprint.get("device-type") == "cpu"
    for key in ("device-type", "device-vendor", "device-arch", "arch"):
        if not (allowed := req.get(key)):
            continue
        allowed = [allowed] if isinstance(allowed, str) else list(allowed)
        found = str(fingerprint.get(key, ""))
        if key == "device-vendor" and cpu:  # a CPU's vendor is not a GPU's
            found = f"none (no accelerator; CPU vendor {found})"
        if key == "device-arch" and found:
            ok = any(arch_satisfies(found, a) for a in allowed)
        else:
            ok = found in allowed
        if not ok:
            out.append(Unmet(key, " or ".join(allowed), found or "none", "device"))
    need, count = req.get("min-device-count", 0), fingerprint.get("device-count", 0)
    if need and (cpu or int(count) < need):
        out.append(
            Unmet("device-count", f">= {need} accelerator(s)", str(0 if cpu else count), "count")
        )
    for key in ("torch", "torch-cuda", "torch-hip", "driver"):
        found = str(fingerprint.get(key, ""))
        if (spec := req.get(key)) is not None and not in_spec(spec, found):
            out.append(Unmet(key, spec, found or "none", "versions"))
    for lib, spec in req.get("libraries", {}).items():
        if (version := libraries.get(lib)) is None:
            out.append(Unmet(f"library {lib}", spec or "installed", "not installed", "libraries"))
        elif spec and not in_spec(spec, version):
            out.append(Unmet(f"library {lib}", spec, version, "libraries"))
    for lib, spec in req.get("forbidden", {}).items():
        if (version := libraries.get(lib)) is not None and (not spec or in_spec(spec, version)):
            expected = f"not installed{' in ' + spec if spec else ''}"
            out.append(Unmet(f"library {lib}", expected, version, "forbidden"))
    return out


def enforce(
    profile: Profile, fingerprint: Mapping[str, Any], libraries: Mapping[str, str | None]
) -> list[str]:
    """Raise ProfileUnmet (exit 4) listing every unmet requirement that is an error; return
    warnings."""
    problems = unmet(profile, fingerprint, libraries)
    strict = profile.default_strictness == "error"
    errors = [u for u in problems if strict and u.group not in profile.warn_groups]
    warnings = [f"profile {profile.name}: {u}" for u in problems if u not in errors]
    if errors:
        lines = "\n".join(f"  - {u}" for u in errors)
        todo = [USER_FIX[g] for g in dict.fromkeys(u.group for u in errors)]
        if profile.help:
            todo.insert(0, f"{profile.name}: {profile.help}")
        raise ProfileUnmet(
            f"this machine does not meet profile {profile.name!r} ({len(errors)} unmet):\n{lines}",
            path=profile.path,
            fix="; ".join(todo)
            + "; or use the profile of the machine you are on (--profile NAME, or auto)",
        )
    return warnings


def required_libraries(profile: Profile) -> list[str]:
    """The library keys a profile's requirements name: a distribution, or
    ``distribution@variant``."""
    return sorted({*profile.requires.get("libraries", {}), *profile.requires.get("forbidden", {})})


def library_facts(
    keys: Iterable[str], described: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, str | None]:
    """Installed versions by profile key: on this machine from metadata and files only (nothing is
    imported), or on a ``described`` node (its libraries as ``kernel-probe env`` reports them).

    A library ``kernel_probe.detect.libraries`` knows is found under any of its distribution names;
    ``NAME@VARIANT`` (``transformer-engine@nvidia``) has a version only when that variant is what is
    installed (the ROCm fork of transformer-engine installs under NVIDIA's names). Any other key is
    one distribution's version."""
    known = {lib.name: lib for lib in known_libraries()}
    out: dict[str, str | None] = {}
    for key in keys:
        base, at, variant = key.partition("@")
        lib = known.get(base)
        if described is None:
            version, found = _library_here(base, lib)
        else:
            version, found = _library_described(base, lib, described)
        # a namesake (a variant that is not usable) never counts; NAME@VARIANT only that variant
        if found is not None and (not found.usable or (at and found.key != variant)):
            version = None
        out[key] = None if at and found is None else version
    return out


def _library_here(base: str, lib: Any) -> tuple[str | None, Any]:
    """(version, recognised variant) of a library or distribution on this machine."""
    if lib is None:
        return library_versions([base])[base], None
    located = locate(lib)
    version = next(iter(located.distributions.values()), None) if located.installed else None
    if located.installed and version is None:  # importable, e.g. a source build on the path
        version = "unknown (no distribution metadata)"
    return version, located.variant


def _library_described(
    base: str, lib: Any, described: Mapping[str, Mapping[str, Any]]
) -> tuple[str | None, Any]:
    """(version, variant) on a described node: by report name, or a distribution listed directly
    or among a library's."""
    entry = described.get(base)
    if entry is None:
        dists = (e.get("distributions") or {} for e in described.values())
        found = next((str(d[base]) for d in dists if isinstance(d, dict) and d.get(base)), None)
        return found, None
    version = entry.get("version") or next(iter((entry.get("distributions") or {}).values()), None)
    found = next((v for v in lib.variants if v.key == entry.get("variant")), None) if lib else None
    return None if version is None else str(version), found


def profile_change(recorded: Mapping[str, Any], profile: Profile | None) -> str | None:
    """Why a lock written under ``recorded`` (its [profile] table) is not this run's: the profile's
    name or its digest changed (None when the profile is the same, or neither has one)."""
    name, digest = recorded.get("name"), recorded.get("digest")
    if profile is None:
        return f"it was written under profile {name} and this run applies none" if name else None
    if name != profile.name:
        return f"it was written under profile {name or 'none'}, this run applies {profile.name}"
    if digest != profile.digest:
        return (
            f"profile {profile.name} changed since the lock was written (digest "
            f"{str(digest)[:19]}... -> {profile.digest[:19]}..., {profile.path})"
        )
    return None


# ---- a described node ----------------------------------------------------------------------------
class NodeError(InputFileError):
    """A malformed node description (exit 5), naming the file and the key."""


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


def examples_dir() -> Path:
    """The directory of the built-in node descriptions (``kernel_probe/profiles/sites/nodes``)."""
    return builtin_dir() / EXAMPLES_DIR


def examples() -> dict[str, Path]:
    """The shipped example descriptions by name (the built-in profile each describes)."""
    return {p.stem: p for p in sorted(examples_dir().glob("*.json"))}


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
    try:
        text = read_regular(spec, MAX_NODE_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise NodeError(
            "no such file",
            path=spec,
            fix="write one with `kernel-probe env --json > node.json` on the node",
        ) from None
    except UnsafeFile as exc:
        raise NodeError(exc.problem, path=spec, fix=exc.fix or None) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise NodeError(f"cannot read: {exc}", path=spec) from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise NodeError(f"not valid JSON: {exc}", path=spec) from None
    return parse_node(data, spec)


def parse_node(data: Any, path: str) -> Node:
    """The node described by ``data``, read by the typed reader: a value of the wrong type, an
    unknown key of the short form, a variant no library has, is a NodeError naming the key."""
    try:
        if not isinstance(data, dict):
            raise ReadError(
                "expected a JSON object (a node description or `kernel-probe env --json`), got "
                f"{type(data).__name__}"
            )
        schema = data.get("schema")
        if schema not in (NODE_SCHEMA, ENV_SCHEMA):
            raise ReadError(
                f"unknown schema {schema!r:.80}",
                "schema",
                fix=f"use {NODE_SCHEMA!r} (docs/profiles.md), or the output of `kernel-probe env "
                "--json`",
            )
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
    fp = get(data, "fingerprint", dict)
    if fp is None:
        raise ReadError(
            "required: an object of the node's facts (as `kernel-probe env --json` has)",
            "fingerprint",
        )
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
    """One library of a node: {version, variant (as the registry spells it), distributions}; None
    when ``env --json`` lists it as not installed."""
    if isinstance(value, str):
        value = {"version": value}
    if not isinstance(value, dict):
        raise ReadError(
            f"expected a version string or {{version, variant}}, got {type(value).__name__}"
        )
    if strict:
        refuse_unknown(value, _LIBRARY_KEYS)
    version = get_text(value, "version", None, limit=200)
    distributions = (
        get_string_map(value, "distributions", limit=200) if value.get("distributions") else {}
    )
    installed = get(value, "installed", bool, default=True)
    variant = None
    if value.get("variant") is not None:
        lib = next((lib for lib in known_libraries() if lib.name == name), None)
        keys = [v.key for v in lib.variants] if lib is not None else []
        if not keys:
            raise ReadError(
                f"{name} has no variants kernel-probe tells apart", "variant", "remove the variant"
            )
        variant = get_literal(value, "variant", keys, fold=True)  # NVIDIA -> nvidia
    if installed is False or version is None and not distributions:
        return None  # env --json lists every known library, installed or not
    return {"version": version, "variant": variant, "distributions": distributions}


def _with_site(
    data: Mapping[str, Any], strict: bool, path: str, fingerprint: dict, libraries: dict
) -> Node:
    """The node, with its site facts: host name, Slurm, and the variables and marker files."""
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
