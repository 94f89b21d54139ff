"""What a site requires: the profile that applies here, every requirement a node does not meet, and
whether a lock was written under the same profile.

``choose`` finds the profile ``--profile NAME|PATH|auto`` names; ``enforce`` refuses a node that
does not meet it (exit 4), ``other_site`` one whose site signals place it at another site;
``library_facts`` reads the library versions a profile's requirements name without importing them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kernel_lock import Difference
from kernel_lock.format.versions import in_spec
from kernel_probe.errors import ProfileUnmet
from kernel_probe.profiles.autodetect import SiteFacts, auto_detect, site_facts
from kernel_probe.profiles.discovery import Survey, names_file, resolve, survey
from kernel_probe.profiles.format import Profile, load_file


class Unmet(Difference):
    """One requirement of a profile a node does not meet, expected vs found: a fingerprint
    difference (kernel_lock's, one home) whose ``rule`` is the requirement's strictness group."""

    @property
    def group(self) -> str:
        """The strictness group (device, count, versions, libraries, forbidden) a profile may make
        warn only."""
        return self.rule

    def __str__(self) -> str:
        return f"{self.field}: expected {self.expected}, found {self.found}"


def unmet(
    profile: Profile, fingerprint: Mapping[str, Any], libraries: Mapping[str, str | None]
) -> list[Unmet]:
    """Every requirement of ``profile`` this machine does not meet (expected vs found)."""
    req = profile.requires
    out: list[Unmet] = []
    from kernel_probe.candidates import arch_satisfies

    for key in ("device-type", "device-vendor", "device-arch", "arch"):
        allowed = req.get(key)
        if allowed:
            allowed = [allowed] if isinstance(allowed, str) else list(allowed)
            found = str(fingerprint.get(key, ""))
            if key == "device-vendor" and fingerprint.get("device-type") == "cpu":
                found = (
                    f"none (no accelerator; CPU vendor {found})"  # a CPU's vendor is not a GPU's
                )
            ok = (
                any(arch_satisfies(found, a) for a in allowed)
                if key == "device-arch" and found
                else found in allowed
            )
            if not ok:
                out.append(Unmet(key, " or ".join(allowed), found or "none", "device"))
    need = req.get("min-device-count", 0)
    if need and (
        fingerprint.get("device-type") == "cpu" or int(fingerprint.get("device-count", 0)) < need
    ):
        have = 0 if fingerprint.get("device-type") == "cpu" else fingerprint.get("device-count", 0)
        out.append(Unmet("device-count", f">= {need} accelerator(s)", str(have), "count"))
    for key in ("torch", "torch-cuda", "torch-hip", "driver"):
        spec = req.get(key)
        if spec is not None:
            found = str(fingerprint.get(key, ""))
            if not in_spec(spec, found):
                out.append(Unmet(key, spec, found or "none", "versions"))
    for lib, spec in req.get("libraries", {}).items():
        version = libraries.get(lib)
        if version is None:
            out.append(Unmet(f"library {lib}", spec or "installed", "not installed", "libraries"))
        elif spec and not in_spec(spec, version):
            out.append(Unmet(f"library {lib}", spec, version, "libraries"))
    for lib, spec in req.get("forbidden", {}).items():
        version = libraries.get(lib)
        if version is not None and (not spec or in_spec(spec, version)):
            out.append(
                Unmet(
                    f"library {lib}",
                    f"not installed{' in ' + spec if spec else ''}",
                    version,
                    "forbidden",
                )
            )
    return out


# what a refused user can do, by group: about their job and environment, not about the profile
USER_FIX = {
    "device": "run on one of the site's GPU nodes, inside a GPU job",
    "count": "ask the job for GPUs and keep them visible (CUDA_VISIBLE_DEVICES, "
    "HIP_VISIBLE_DEVICES)",
    "versions": "use a torch build in the required range (the site's module or container)",
    "libraries": "install the required libraries in this environment (or load the site's module)",
    "forbidden": "uninstall the forbidden library, or use another environment without it",
}


def enforce(
    profile: Profile, fingerprint: Mapping[str, Any], libraries: Mapping[str, str | None]
) -> list[str]:
    """Raise ProfileUnmet (exit 4) listing every unmet requirement that is an error; return
    warnings."""
    problems = unmet(profile, fingerprint, libraries)
    errors = [
        u
        for u in problems
        if profile.default_strictness == "error" and u.group not in profile.warn_groups
    ]
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


def other_site(
    profile: Profile, seen: Profile | None, matched: str, where: str = "this machine"
) -> None:
    """Raise ProfileUnmet (exit 4) when a named ``profile`` meets a node whose site signals identify
    another profile's site (``seen``, by ``matched``). Hardware alone cannot tell apart sites with
    the same nodes (the A100s of JUWELS Booster, Leonardo and Perlmutter; the MI250X of LUMI-G and
    Frontier): their strong site signals can. A node whose signals match no profile, or only a
    device profile by its device facts (``cpu`` on any CPU node), is not refused: naming a profile
    is how a site without signals is used."""
    if seen is None or seen.name == profile.name or matched.startswith("device:"):
        return
    raise ProfileUnmet(
        f"{where} is a node of profile {seen.name!r} by its site signals ({matched}), not of "
        f"{profile.name!r}",
        path=profile.path,
        fix=f"use --profile {seen.name} (or --profile auto) here, or run on a node of "
        f"{profile.name}",
    )


def required_libraries(profile: Profile) -> list[str]:
    """The library keys a profile's requirements name: a distribution, or
    ``distribution@variant``."""
    return sorted({*profile.requires.get("libraries", {}), *profile.requires.get("forbidden", {})})


def library_facts(
    keys: Iterable[str], described: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, str | None]:
    """Installed versions by profile key: on this machine from metadata and files only (nothing is
    imported), or on a ``described`` node (kernel_probe.profiles.nodes: its libraries as
    ``kernel-probe env`` reports them).

    A library ``kernel_probe.detect.libraries`` knows (``transformer-engine``, ``apex``, ...) is
    found under any of its distribution names; ``NAME@VARIANT`` (``transformer-engine@nvidia``)
    has a version only when what is installed is that variant: the ROCm fork of transformer-engine
    installs under the same names as NVIDIA's. Any other key is one distribution's version.
    """
    from kernel_probe.detect.libraries import known_libraries

    known = {lib.name: lib for lib in known_libraries()}
    out: dict[str, str | None] = {}
    for key in keys:
        base, at, variant = key.partition("@")
        lib = known.get(base)
        version, found = (
            _library_here(base, lib)
            if described is None
            else _library_described(base, lib, described)
        )
        # a namesake (a variant that is not usable) never counts; NAME@VARIANT only that variant
        if (
            found is not None
            and (not found.usable or (at and found.key != variant))
            or at
            and found is None
        ):
            version = None
        out[key] = version
    return out


def _library_here(base: str, lib: Any) -> tuple[str | None, Any]:
    """(version, recognised variant) of a library or distribution on this machine."""
    from kernel_lock.fingerprint import library_versions
    from kernel_probe.detect.libraries import locate

    if lib is None:
        return library_versions([base])[base], None
    located = locate(lib)
    version = next(iter(located.distributions.values()), None) if located.installed else None
    if located.installed and version is None:
        version = (
            "unknown (no distribution metadata)"  # importable, e.g. a source build on the path
        )
    return version, located.variant


def _library_described(
    base: str, lib: Any, described: Mapping[str, Mapping[str, Any]]
) -> tuple[str | None, Any]:
    """(version, variant) of a library on a described node: by its report name (its ``variant`` as
    ``kernel-probe env`` names it), or a distribution listed directly or among a library's."""
    entry = described.get(base)
    if entry is None:
        dists = (e.get("distributions") or {} for e in described.values())
        return next(
            (str(d[base]) for d in dists if isinstance(d, dict) and d.get(base)), None
        ), None
    version = entry.get("version") or next(iter((entry.get("distributions") or {}).values()), None)
    found = next((v for v in lib.variants if v.key == entry.get("variant")), None) if lib else None
    return None if version is None else str(version), found


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
    notes to show. ``facts``: another node's site facts (a node description) instead of this
    one's; ``found``: the profile directories as already surveyed (``discovery.survey``), else
    they are surveyed here."""
    if spec != "auto":
        if names_file(spec):
            return load_file(spec), named, []
        if found is None:
            found = survey(extra)
        return resolve(spec, extra, found), named, found.notes_for(spec)
    from kernel_probe.detect.site import detect_site

    if found is None:
        found = survey(extra)
    notes = found.notes_for() + [f"broken profile, not considered: {exc}" for exc in found.broken]
    problems: list[str] = []
    if facts is None:
        facts = site_facts(site or detect_site(env), device, env, problems=problems)
    profile, matched, more = auto_detect(found.profiles.values(), facts)
    return profile, matched, notes + more + list(dict.fromkeys(problems))


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
