"""Recognising a site: which profile's ``[detect]`` signals a node shows (``--profile auto``).

The signals and their strength are ``kernel_probe.profiles.signals``; here they are matched against
a node's facts (this machine's, or a described node's), and the best match decides. Ambiguity is an
error, never a guess.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kernel_probe.errors import ProfileUnmet
from kernel_probe.profiles.format import Profile
from kernel_probe.profiles.signals import MAX_SIGNAL_CHARS, STRONG, WEAK

MAX_MARKER_BYTES = 64 << 10  # a marker file is one short line


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
    """One site signal that matched on a node, as the notes and the lock's ``matched`` name it."""

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
    """(each signal of ``signals`` that matched, each that did not): one entry per variable, file,
    pattern list and device table."""
    hits: list[Hit] = []
    missed: list[str] = []
    for var, pattern in signals.get("env", {}).items():
        value = facts.env.get(var)
        ok = value is not None and _search(pattern, value, f"${var}", notes)
        (hits.append(Hit("env", f"env:{var}={value}")) if ok else missed.append(f"env:{var}"))
    for path, pattern in signals.get("files", {}).items():
        value = facts.read_file(path)
        ok = value is not None and _search(pattern, value, f"the first line of {path}", notes)
        (hits.append(Hit("files", f"file:{path}={value}")) if ok else missed.append(f"file:{path}"))
    for kind in ("slurm-cluster", "slurm-partition", "hostname"):
        if kind not in signals:
            continue
        name = {
            "slurm-cluster": "SLURM_CLUSTER_NAME",
            "slurm-partition": "SLURM_JOB_PARTITION",
        }.get(kind)
        value = facts.slurm_value(name) if name else facts.hostname
        ok = bool(value) and any(_search(pat, value or "", kind, notes) for pat in signals[kind])
        (hits.append(Hit(kind, f"{kind}:{value}")) if ok else missed.append(kind))
    dev = signals.get("device", {})
    if dev:
        text = "device:" + ",".join(f"{k}={v}" for k, v in dev.items())
        from kernel_probe.candidates import arch_satisfies

        found = {k: str(facts.device.get(k, "")) for k in dev}
        same = all(
            arch_satisfies(found[k], v) if k == "arch" else found[k] == v for k, v in dev.items()
        )
        (hits.append(Hit("device", text)) if same else missed.append(text))
    return hits, missed


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
        if not missed:
            strength = max((STRONG[k] for k in kinds if k in STRONG), default=1)
            found.append(
                Detection(
                    profile,
                    2 if kinds & set(STRONG) else 1,
                    strength,
                    " + ".join(h.text for h in hits),
                    len(hits),
                )
            )
        elif kinds & set(STRONG):
            notes.append(
                f"{profile.name}: {', '.join(h.text for h in hits)} matched, but not "
                f"{', '.join(missed)}: not one of its nodes"
            )
        elif kinds & set(WEAK):
            notes.append(
                f"{profile.name}: {', '.join(h.text for h in hits)} matched, but not "
                f"{', '.join(missed)}: "
                "a weak signal never decides alone (other sites share such names)"
            )
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


def site_facts(
    site: Mapping[str, Any],
    device: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    read_file: Callable[[str], str | None] | None = None,
    problems: list[str] | None = None,
) -> SiteFacts:
    """The site facts of this machine (``site`` from kernel_probe.detect.host); marker files are
    read like every input (regular files only, non-blocking, capped), a refused one noted in
    ``problems``."""
    if read_file is None:
        from kernel_probe.detect.host import read_marker

        said = [] if problems is None else problems

        def read_file(path: str) -> str | None:
            value, problem = read_marker(path, MAX_MARKER_BYTES)
            if problem:
                said.append(f"detect file {path}: {problem}")
            return value

    return SiteFacts(
        env=os.environ if env is None else env,
        hostname=str(site.get("hostname") or ""),
        slurm=dict(site.get("slurm") or {}),
        device=device,
        read_file=read_file,
    )


def auto_detect(
    profiles: Iterable[Profile],
    site: Mapping[str, Any] | SiteFacts,
    device: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    read_file: Callable[[str], str | None] | None = None,
) -> tuple[Profile | None, str, list[str]]:
    """(profile, the signal that decided, notes). None when nothing decided. Ambiguity is an
    error."""
    problems: list[str] = []
    facts = (
        site
        if isinstance(site, SiteFacts)
        else site_facts(site, device or {}, env, read_file, problems)
    )
    notes: list[str] = []
    scored = [d for d in (detect(prof, facts, notes) for prof in profiles) if d is not None]
    notes.extend(dict.fromkeys(problems))
    if not scored:
        return None, "", notes
    scored.sort(key=lambda d: (-d.rank, -d.strength, -d.hits, d.profile.name))
    best = scored[0]
    rivals = [
        d
        for d in scored[1:]
        if (d.rank, d.strength, d.hits) == (best.rank, best.strength, best.hits)
    ]
    if rivals:
        names = ", ".join(d.profile.name for d in [best, *rivals])
        raise ProfileUnmet(
            f"--profile auto is ambiguous: {names} match equally well ({best.matched})",
            fix="name the profile with --profile NAME",
        )
    notes += [f"{d.profile.name} also matched ({d.matched}), more weakly" for d in scored[1:]]
    return best.profile, best.matched, notes
