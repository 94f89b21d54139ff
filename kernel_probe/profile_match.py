"""A node (this machine, or one ``kernel_probe.sites`` describes) against the site profiles: which
profile's ``[detect]`` signals it shows (``--profile auto``; ambiguity is an error), which
requirements it does not meet (exit 4), whether a lock was written under the same profile."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel_lock import Difference
from kernel_lock.fingerprint import in_spec, library_versions
from kernel_probe.candidates import arch_satisfies
from kernel_probe.detect.host import detect_site
from kernel_probe.detect.libraries import known, locate
from kernel_probe.errors import ProfileUnmet
from kernel_probe.profiles import GROUPS, MAX_SIGNAL_CHARS, STRONG, WEAK, Profile
from kernel_probe.sites import SiteFacts, Survey, names_file, resolve, site_facts, survey

# the signals that match a name: the Slurm variable each reads ("": the host name)
NAMED_BY = {"slurm-cluster": "SLURM_CLUSTER_NAME", "slurm-partition": "SLURM_JOB_PARTITION"}
NAMED_BY["hostname"] = ""
NEVER_ALONE = "a weak signal never decides alone (other sites share such names)"


@dataclass(frozen=True)
class Hit:
    """One site signal that matched, as the notes and the lock's ``matched`` name it."""

    kind: str  # one of SIGNALS
    text: str  # "env:LUMI_STACK_PARTITION=G"


@dataclass(frozen=True)
class Detection:
    """Why auto-detection would pick a profile: ``rank`` 2 = a strong signal decided, 1 = a group of
    weak signals together, 0 = a device profile's device (only when no site matched)."""

    profile: Profile
    rank: int
    strength: int
    matched: str
    hits: int


def _search(pattern: str, value: str, what: str, notes: list[str]) -> bool:
    if len(value) > MAX_SIGNAL_CHARS:
        said = f"{what} is {len(value)} characters long, more than {MAX_SIGNAL_CHARS}: not matched"
        notes.append(said)
        return False
    return re.search(pattern, value) is not None


def _evaluate(
    signals: Mapping[str, Any], facts: SiteFacts, notes: list[str]
) -> tuple[list[Hit], list[str]]:
    tried: list[tuple[str, bool, str, str]] = []  # kind, matched, as a hit, as a miss
    for var, pattern in signals.get("env", {}).items():
        value = facts.env.get(var)
        ok = value is not None and _search(pattern, value, f"${var}", notes)
        tried.append(("env", ok, f"env:{var}={value}", f"env:{var}"))
    for path, pattern in signals.get("files", {}).items():
        value = facts.read_file(path)
        ok = value is not None and _search(pattern, value, f"the first line of {path}", notes)
        tried.append(("files", ok, f"file:{path}={value}", f"file:{path}"))
    for kind, var in NAMED_BY.items():
        if kind in signals:
            # a Slurm setting from the environment, else from the Slurm configuration
            value = (facts.env.get(var) or facts.slurm.get(var)) if var else facts.hostname
            ok = bool(value) and any(_search(p, value or "", kind, notes) for p in signals[kind])
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
    """How ``profile`` would be picked on a node with ``facts`` (None: not), with a note in
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
        said = f"{profile.name}: {', '.join(h.text for h in hits)} matched, but not "
        said += f"{', '.join(missed)}: "
        if not missed:
            rank = 2 if kinds & set(STRONG) else 1
            strength = max((STRONG[k] for k in kinds if k in STRONG), default=1)
            matched = " + ".join(h.text for h in hits)
            found.append(Detection(profile, rank, strength, matched, len(hits)))
        elif kinds & set(STRONG):
            notes.append(said + "not one of its nodes")
        elif kinds & set(WEAK):
            notes.append(said + NEVER_ALONE)
    site_signals = any(k != "device" for k in profile.detect) or bool(profile.detect_all)
    device_hits = [h for h in top if h.kind == "device"]
    if device_hits and not site_signals:
        found.append(Detection(profile, 0, 0, device_hits[0].text, 1))
    weak = [h for h in top if h.kind in WEAK]
    if not found and weak:
        said = f"{profile.name}: {', '.join(h.text for h in weak)} matched, but {NEVER_ALONE}"
        notes.append(said + ": not picked")
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


def auto_detect(
    profiles: Iterable[Profile],
    site: Mapping[str, Any] | SiteFacts,
    device: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    read_file: Callable[[str], str | None] | None = None,
) -> tuple[Profile | None, str, list[str]]:
    """(profile, the signal that decided, notes); None when nothing decided; ambiguity is exit 4."""
    problems: list[str] = []
    if isinstance(site, SiteFacts):
        facts = site
    else:
        facts = site_facts(site, device or {}, env, read_file, problems)
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
    facts: SiteFacts | None,
    named: str,
    found: Survey | None,
) -> tuple[Profile | None, str, list[str]]:
    """The profile ``--profile NAME|PATH|auto`` names, how it was chosen (``named`` when named), and
    notes; ``facts``: a described node's instead of this machine's; ``found``: an earlier survey."""
    if spec != "auto":  # a file is read alone; a name is looked up in ``found``
        return resolve(spec, extra, found), named, found.notes_for(spec) if found else []
    found = found or survey(extra)
    notes = found.notes_for() + [f"broken profile, not considered: {exc}" for exc in found.broken]
    problems: list[str] = []
    if facts is None:
        facts = site_facts(detect_site(), device, problems=problems)
    profile, matched, more = auto_detect(found.profiles.values(), facts)
    return profile, matched, notes + more + list(dict.fromkeys(problems))


def other_site(
    profile: Profile, seen: Profile | None, matched: str, where: str = "this machine"
) -> None:
    """Raise ProfileUnmet (exit 4) when the site signals place a node named for ``profile`` at
    another profile's site (``seen``, by ``matched``); a device profile's match refuses nothing."""
    if seen is None or seen.name == profile.name or matched.startswith("device:"):
        return
    fix = f"use --profile {seen.name} (or --profile auto) here, or run on a node of {profile.name}"
    raise ProfileUnmet(
        f"{where} is a node of profile {seen.name!r} by its site signals ({matched}), not of "
        f"{profile.name!r}",
        path=profile.path,
        fix=fix,
    )


class Unmet(Difference):
    """One requirement a node does not meet: a fingerprint difference; ``rule``: its group."""

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
        found = str(0 if cpu else count)
        out.append(Unmet("device-count", f">= {need} accelerator(s)", found, "count"))
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


def library_facts(
    keys: Iterable[str], described: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, str | None]:
    """Installed versions by profile key, on this machine (metadata and files, nothing imported) or
    on a ``described`` node: a known library under any of its distribution names; ``NAME@VARIANT``
    only when that variant is installed (TE's ROCm fork uses NVIDIA's names)."""
    out: dict[str, str | None] = {}
    for key in keys:
        base, at, variant = key.partition("@")
        lib, found = known(base), None
        if described is not None and (entry := described.get(base)) is not None:
            dists = entry.get("distributions") or {}
            version = entry.get("version") or next(iter(dists.values()), None)
            version = None if version is None else str(version)
            variants = lib.variants if lib else ()
            found = next((v for v in variants if v.key == entry.get("variant")), None)
        elif described is not None:  # by a distribution name of any library
            dists = (e.get("distributions") or {} for e in described.values())
            found_in = (str(d[base]) for d in dists if isinstance(d, dict) and d.get(base))
            version = next(found_in, None)
        elif lib is None:
            version = library_versions([base])[base]
        else:
            located, version = locate(lib), None
            unknown = "unknown (no distribution metadata)"  # importable, e.g. a source build
            if located.installed:
                version = next(iter(located.distributions.values()), unknown)
            found = located.variant
        # a namesake (a variant that is not usable) never counts; NAME@VARIANT only that variant
        if found is not None and (not found.usable or (at and found.key != variant)):
            version = None
        out[key] = None if at and found is None else version
    return out


@dataclass
class Judgement:
    """What ``--profile`` decides on a node (:func:`judge`); a refusal of either kind is exit 4."""

    profile: Profile | None
    matched: str
    notes: list[str]
    seen: Profile | None = None
    seen_by: str = ""
    site_refusal: ProfileUnmet | None = None
    unmet: list[Unmet] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    refusal: ProfileUnmet | None = None


def judge(
    spec: str,
    dirs: Sequence[str],
    device: Mapping[str, Any],
    fingerprint: Callable[[], Mapping[str, Any]],
    *,
    facts: SiteFacts | None = None,
    described: Mapping[str, Mapping[str, Any]] | None = None,
    named: str = "explicit (--profile)",
    where: str = "this machine",
) -> Judgement:
    """A node by the profile ``spec`` names (:func:`choose`), for a named one by its site signals
    (:func:`other_site`; ``seen``: where they point), then by its requirements (the refusal lists
    every unmet one that is an error). A described node: its site ``facts``, its libraries."""
    found = None if names_file(spec) else survey(dirs)
    profile, matched, notes = choose(spec, dirs, device, facts, named, found)
    out = Judgement(profile, matched, notes)
    if profile is None:
        return out
    if spec != "auto":  # named: a node its site signals place at another site is not its
        out.seen, out.seen_by, _ = choose("auto", dirs, device, facts, named, found)
        try:
            other_site(profile, out.seen, out.seen_by, where)
        except ProfileUnmet as exc:
            out.site_refusal = exc
    keys = sorted({*profile.requires.get("libraries", {}), *profile.requires.get("forbidden", {})})
    out.unmet = unmet(profile, fingerprint(), library_facts(keys, described))
    strict = profile.default_strictness == "error"
    errors = [u for u in out.unmet if strict and u.group not in profile.warn_groups]
    if not errors:
        out.warnings = [f"profile {profile.name}: {u}" for u in out.unmet]
        return out
    todo = [GROUPS[g] for g in dict.fromkeys(u.group for u in errors)]
    if profile.help:
        todo.insert(0, f"{profile.name}: {profile.help}")
    todo.append("or use the profile of the machine you are on (--profile NAME, or auto)")
    lines = "\n".join(f"  - {u}" for u in errors)
    out.refusal = ProfileUnmet(
        f"this machine does not meet profile {profile.name!r} ({len(errors)} unmet):\n{lines}",
        path=profile.path,
        fix="; ".join(todo),
    )
    return out
