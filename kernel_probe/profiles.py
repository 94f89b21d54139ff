"""Site profiles: what a site's nodes are expected to be, how to recognise the site, and its policy.

A profile is data (the built-ins are package data, ``kernel_probe/site_profiles/*.toml``; the format
is documented in ``docs/profiles.md``); this module parses and validates it strictly (unknown keys
are errors: a typo in a policy must not silently widen it), matches profiles against the site
signals, and lists every requirement a machine does not meet.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock import _toml
from kernel_lock.slots import PRECISIONS, SLOTS
from kernel_lock.versions import in_spec

from .candidates import BUILTIN, Candidate, TableReader, read_candidates
from .detect.site import first_line
from .errors import InputFileError, ProfileUnmet, UsageError

PROFILE_VERSION = "1"
ENV_VAR = "KERNEL_PROBE_PROFILES"
BUILTIN_PACKAGE_DIR = "site_profiles"  # package data of kernel_probe; pyproject.toml's package-data names it too
GROUPS = ("device", "count", "versions", "libraries", "forbidden")  # strictness groups
STRENGTH = {"env": 3, "file": 3, "slurm-cluster": 2, "slurm-partition": 2, "hostname": 1, "device": 0}


class ProfileError(InputFileError):
    """A malformed profile (exit 5); the message names the file and the dotted key."""


@dataclass(frozen=True)
class SlotPolicy:
    allowed: tuple[str, ...] = ()
    preferred: tuple[str, ...] = ()
    pin: str | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    path: str
    digest: str
    sources: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    detect: Mapping[str, Any] = field(default_factory=dict)
    requires: Mapping[str, Any] = field(default_factory=dict)
    precision: str | None = None
    shapes: tuple[str, ...] = ()
    deterministic: bool = False  # [policy] deterministic: only bitwise repeatable candidates are chosen
    probe_per: str | None = None  # [policy] probe-per: who probes at job start (kernel_probe.jobstart.PROBE_PER)
    slots: Mapping[str, SlotPolicy] = field(default_factory=dict)
    candidates: tuple[Candidate, ...] = ()
    default_strictness: str = "error"
    warn_groups: tuple[str, ...] = ()

    def lock_record(self, matched: str) -> dict[str, Any]:
        return {"name": self.name, "digest": self.digest, "matched": matched, "source": self.path}


# ---- parsing ------------------------------------------------------------------------------------
class _P(TableReader):
    """The strict reader (kernel_probe.candidates.TableReader), raising ProfileError."""

    error = ProfileError


_TOP = (
    "profile-version",
    "name",
    "description",
    "sources",
    "unknown",
    "detect",
    "requires",
    "policy",
    "candidate",
    "strictness",
)
_DETECT = ("env", "files", "hostname", "slurm-cluster", "slurm-partition", "device")
_REQUIRES = (
    "device-type",
    "device-vendor",
    "device-arch",
    "min-device-count",
    "arch",
    "torch",
    "torch-cuda",
    "torch-hip",
    "driver",
    "libraries",
    "forbidden",
)
_POLICY = ("precision", "shapes", "deterministic", "probe-per", *SLOTS)
_SLOT_POLICY = ("allowed", "preferred", "pin")


def parse(text: str, path: str) -> Profile:
    p = _P(path)
    try:
        d = _toml.loads(text)
    except (_toml.TOMLDecodeError, ValueError, RecursionError) as exc:  # ValueError: e.g. a 5,000-digit integer
        raise p.err("", f"not valid TOML: {exc}") from None
    p.no_unknown(d, _TOP, "")
    version = p.string(d, "profile-version", "", required=True)
    if version != PROFILE_VERSION:
        raise p.err(
            "profile-version", f"unsupported profile-version {version!r} (this kernel-probe reads {PROFILE_VERSION!r})"
        )
    name = p.string(d, "name", "", required=True)
    if not re.match(r"^[a-z0-9][a-z0-9._-]*$", name):
        raise p.err("name", f"{name!r}: use lower-case letters, digits, '.', '_' and '-'")
    detect = p.table(d, "detect", _DETECT, "")
    for key in ("env", "files"):
        table = p.free_table(detect, key, "detect.")
        for k, v in table.items():
            if not isinstance(v, str):
                raise p.err(f"detect.{key}.{k}", "expected a regular expression string ('' = present)")
            p.regex(v, f"detect.{key}.{k}")
    for key in ("hostname", "slurm-cluster", "slurm-partition"):
        for i, pattern in enumerate(p.strings(detect, key, "detect.")):
            p.regex(pattern, f"detect.{key}[{i}]")
    p.table(detect, "device", ("type", "vendor", "arch"), "detect.")
    requires = p.table(d, "requires", _REQUIRES, "")
    for key in ("device-type", "device-vendor", "device-arch", "arch"):
        p.strings(requires, key, "requires.")
    count = requires.get("min-device-count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise p.err("requires.min-device-count", "expected a non-negative integer")
    for key in ("torch", "torch-cuda", "torch-hip", "driver"):
        if key in requires:
            p.specifier(requires[key], f"requires.{key}")
    for key in ("libraries", "forbidden"):
        table = p.free_table(requires, key, "requires.")
        for lib, spec in table.items():
            p.specifier(spec, f"requires.{key}.{lib}")
            base, at, variant = lib.partition("@")
            if at:
                known = variants_of(base)
                if variant not in known:
                    raise p.err(
                        f"requires.{key}.{lib}",
                        f"{variant!r} is not a known variant of {base}",
                        fix=f"known variants: {', '.join(known) or 'none'} (kernel_probe/detect/libraries.py)",
                    )
    declared = read_candidates(p, d, source=f"profile:{name}", reserved={b.id for b in BUILTIN})
    known_ids = {c.id: c for c in (*BUILTIN, *declared)}
    policy = p.table(d, "policy", _POLICY, "")
    precision = p.string(policy, "precision", "policy.")
    if precision is not None and precision not in PRECISIONS:
        raise p.err("policy.precision", f"{precision!r} is not one of {', '.join(PRECISIONS)}")
    shapes = p.strings(policy, "shapes", "policy.")
    deterministic = policy.get("deterministic", False)
    if not isinstance(deterministic, bool):
        raise p.err("policy.deterministic", f"expected true or false, got {type(deterministic).__name__}")
    probe_per = p.string(policy, "probe-per", "policy.")
    if probe_per is not None and probe_per not in ("job", "node-type", "rank"):
        raise p.err("policy.probe-per", f"{probe_per!r} is not one of job, node-type, rank")
    from .shapes import parse_shape

    for i, s in enumerate(shapes):
        try:
            parse_shape(s)
        except ValueError as exc:
            raise p.err(f"policy.shapes[{i}]", str(exc).replace("--shape ", "")) from None
    slots = {}
    for slot in SLOTS:
        if slot not in policy:
            continue
        sp = p.table(policy, slot, _SLOT_POLICY, "policy.")
        allowed, preferred = p.strings(sp, "allowed", f"policy.{slot}."), p.strings(sp, "preferred", f"policy.{slot}.")
        pin = p.string(sp, "pin", f"policy.{slot}.")
        for key, ids in (("allowed", allowed), ("preferred", preferred), ("pin", (pin,) if pin else ())):
            for cid in ids:
                cand = known_ids.get(cid)
                if cand is None:
                    raise p.err(
                        f"policy.{slot}.{key}",
                        f"unknown candidate id {cid!r}",
                        fix="use an id from `kernel-probe check` (e.g. torch.layer_norm, liger.rms_norm) "
                        "or declare it in a [[candidate]] table",
                    )
                if slot not in cand.slots:
                    raise p.err(f"policy.{slot}.{key}", f"candidate {cid!r} is for {', '.join(cand.slots)}, not {slot}")
        if allowed:
            for key, ids in (("preferred", preferred), ("pin", (pin,) if pin else ())):
                for cid in ids:
                    if cid not in allowed:
                        raise p.err(f"policy.{slot}.{key}", f"{cid!r} is not in policy.{slot}.allowed")
        slots[slot] = SlotPolicy(allowed, preferred, pin)
    strict = p.table(d, "strictness", ("default", "warn"), "")
    default = p.string(strict, "default", "strictness.", default="error")
    if default not in ("error", "warn"):
        raise p.err("strictness.default", f"{default!r} is not 'error' or 'warn'")
    warn = p.strings(strict, "warn", "strictness.")
    for g in warn:
        if g not in GROUPS:
            raise p.err("strictness.warn", f"unknown group {g!r}; groups: {', '.join(GROUPS)}")
    return Profile(
        name=name,
        description=p.string(d, "description", "", default="") or "",
        path=path,
        digest="sha256:" + hashlib.sha256(text.encode()).hexdigest(),
        sources=p.strings(d, "sources", ""),
        unknown=p.strings(d, "unknown", ""),
        detect=detect,
        requires=requires,
        precision=precision,
        shapes=shapes,
        deterministic=deterministic,
        probe_per=probe_per,
        slots=slots,
        candidates=declared,
        default_strictness=default,
        warn_groups=warn,
    )


MAX_BYTES = 1 << 20  # a profile is a few kB


def load_file(path: str | os.PathLike[str]) -> Profile:
    from kernel_lock._files import UnsafeFile, read_regular

    p = Path(path)
    try:
        text = read_regular(p, MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ProfileError(
            "no such file", path=str(p), fix="check the path, or use `kernel-probe profiles list`"
        ) from None
    except UnsafeFile as exc:
        fix = "pass a .toml file, or use --profiles-dir" if "directory" in exc.problem else exc.fix
        raise ProfileError(exc.problem, path=str(p), fix=fix or None) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read: {exc}", path=str(p)) from None
    return parse(text, str(p))


# ---- finding profiles ---------------------------------------------------------------------------
class BuiltinProfilesMissing(InputFileError):
    """No built-in profile where the package ships them (exit 5): a broken installation, said loudly
    rather than listed as an empty table."""


def builtin_dir() -> Path:
    """The built-in profiles: package data of kernel_probe, found through importlib.resources, so a
    checkout, a venv, ``pip install --target``, ``--prefix`` and ``--user`` all find them the same way."""
    from importlib.resources import files

    return Path(str(files(__package__).joinpath(BUILTIN_PACKAGE_DIR)))


def user_dirs(extra: Iterable[str] = ()) -> list[Path]:
    """The user's profile directories: ``--profiles-dir`` first, then ``$KERNEL_PROBE_PROFILES``."""
    env = [x for x in os.environ.get(ENV_VAR, "").split(os.pathsep) if x]
    return [Path(x) for x in (*extra, *env)]


def scan(extra: Iterable[str] = ()) -> tuple[dict[str, Profile], list[ProfileError]]:
    """Every valid profile by name (user directories, then the built-ins: the first of a name wins), and
    the profile files that are broken: one broken file must not hide every other profile."""
    builtin = builtin_dir()
    if not (builtin.is_dir() and any(builtin.glob("*.toml"))):
        raise BuiltinProfilesMissing(
            "no built-in site profiles here: this kernel-probe installation is incomplete",
            path=str(builtin),
            fix=f"reinstall kernel-probe; the built-ins ship inside the package as kernel_probe/{BUILTIN_PACKAGE_DIR}/*.toml",
        )
    out: dict[str, Profile] = {}
    broken: list[ProfileError] = []
    for d in [*user_dirs(extra), builtin]:
        if not d.is_dir():
            raise UsageError(f"profiles directory {d} does not exist (from --profiles-dir or ${ENV_VAR})")
        for f in sorted(d.glob("*.toml")):
            try:
                prof = load_file(f)
            except ProfileError as exc:
                broken.append(exc)
                continue
            out.setdefault(prof.name, prof)
    return out, broken


def available(extra: Iterable[str] = ()) -> dict[str, Profile]:
    """Every valid profile by name (see :func:`scan`)."""
    return scan(extra)[0]


def resolve(spec: str, extra: Iterable[str] = ()) -> Profile:
    """A profile by name, or by path (anything with a '/' or ending in .toml)."""
    if "/" in spec or spec.endswith(".toml"):
        return load_file(spec)
    profiles, broken = scan(extra)
    if spec not in profiles:
        named = [e for e in broken if Path(e.path or "").stem == spec]
        if named:
            raise named[0]  # the profile asked for is the broken one: say why
        raise UsageError(
            f"unknown profile {spec!r}; available: {', '.join(sorted(profiles)) or 'none'}"
            " (or pass a path to a .toml file)"
            + (f"; {len(broken)} profile file(s) are broken: `kernel-probe profiles list` names them" if broken else "")
        )
    return profiles[spec]


# ---- detection ----------------------------------------------------------------------------------
def signals_matched(
    profile: Profile,
    site: Mapping[str, Any],
    device: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    read_file=None,
) -> list[tuple[int, str]]:
    """Every detect signal of ``profile`` that matches, as (strength, description)."""
    env = os.environ if env is None else env
    det = profile.detect
    hits: list[tuple[int, str]] = []
    for var, pattern in det.get("env", {}).items():
        value = env.get(var)
        if value is not None and re.search(pattern, value):
            hits.append((STRENGTH["env"], f"env:{var}={value}"))
    for path, pattern in det.get("files", {}).items():
        value = (read_file or first_line)(path)
        if value is not None and re.search(pattern, value):
            hits.append((STRENGTH["file"], f"file:{path}={value}"))
    cluster = env.get("SLURM_CLUSTER_NAME") or (site.get("slurm") or {}).get("SLURM_CLUSTER_NAME")
    for pattern in det.get("slurm-cluster", []):
        if cluster and re.search(pattern, cluster):
            hits.append((STRENGTH["slurm-cluster"], f"slurm-cluster:{cluster}"))
    partition = env.get("SLURM_JOB_PARTITION") or (site.get("slurm") or {}).get("SLURM_JOB_PARTITION")
    for pattern in det.get("slurm-partition", []):
        if partition and re.search(pattern, partition):
            hits.append((STRENGTH["slurm-partition"], f"slurm-partition:{partition}"))
    host = site.get("hostname") or ""
    for pattern in det.get("hostname", []):
        if host and re.search(pattern, host):
            hits.append((STRENGTH["hostname"], f"hostname:{host}"))
    dev = det.get("device", {})
    if dev and all(str(device.get(k, "")) == str(v) for k, v in dev.items()):
        hits.append((STRENGTH["device"], "device:" + ",".join(f"{k}={v}" for k, v in dev.items())))
    return sorted(hits, reverse=True)


def auto_detect(
    profiles: Iterable[Profile],
    site: Mapping[str, Any],
    device: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    read_file=None,
) -> tuple[Profile | None, str, list[str]]:
    """(profile, the signal that matched, notes). None when nothing matched. Ambiguity is an error."""
    scored = []
    for prof in profiles:
        hits = signals_matched(prof, site, device, env, read_file)
        if hits:
            scored.append((hits[0][0], len(hits), prof, hits))
    if not scored:
        return None, "", ["no profile's site signals matched this machine"]
    scored.sort(key=lambda t: (-t[0], -t[1], t[2].name))
    best = scored[0]
    rivals = [s for s in scored[1:] if s[0] == best[0] and s[1] == best[1]]
    if rivals:
        names = ", ".join(p.name for _, _, p, _ in [best, *rivals])
        raise ProfileUnmet(
            f"--profile auto is ambiguous: {names} match equally well ({best[3][0][1]})",
            fix="name the profile with --profile NAME",
        )
    notes = [f"{p.name} also matched ({h[0][1]}), more weakly" for _, _, p, h in scored[1:]]
    return best[2], best[3][0][1], notes


# ---- enforcement --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unmet:
    group: str
    field: str
    expected: str
    found: str

    def __str__(self) -> str:
        return f"{self.field}: expected {self.expected}, found {self.found}"


def unmet(profile: Profile, fingerprint: Mapping[str, Any], libraries: Mapping[str, str | None]) -> list[Unmet]:
    """Every requirement of ``profile`` this machine does not meet (expected vs found)."""
    req = profile.requires
    out: list[Unmet] = []
    for key in ("device-type", "device-vendor", "device-arch", "arch"):
        allowed = req.get(key)
        if allowed:
            allowed = [allowed] if isinstance(allowed, str) else list(allowed)
            found = str(fingerprint.get(key, ""))
            if key == "device-vendor" and fingerprint.get("device-type") == "cpu":
                found = f"none (no accelerator; CPU vendor {found})"  # a CPU's vendor is not a GPU's
            if found not in allowed:
                out.append(Unmet("device", key, " or ".join(allowed), found or "none"))
    need = req.get("min-device-count", 0)
    if need and (fingerprint.get("device-type") == "cpu" or int(fingerprint.get("device-count", 0)) < need):
        have = 0 if fingerprint.get("device-type") == "cpu" else fingerprint.get("device-count", 0)
        out.append(Unmet("count", "device-count", f">= {need} accelerator(s)", str(have)))
    for key in ("torch", "torch-cuda", "torch-hip", "driver"):
        spec = req.get(key)
        if spec is not None:
            found = str(fingerprint.get(key, ""))
            if not in_spec(spec, found):
                out.append(Unmet("versions", key, spec, found or "none"))
    for lib, spec in req.get("libraries", {}).items():
        version = libraries.get(lib)
        if version is None:
            out.append(Unmet("libraries", f"library {lib}", spec or "installed", "not installed"))
        elif spec and not in_spec(spec, version):
            out.append(Unmet("libraries", f"library {lib}", spec, version))
    for lib, spec in req.get("forbidden", {}).items():
        version = libraries.get(lib)
        if version is not None and (not spec or in_spec(spec, version)):
            out.append(Unmet("forbidden", f"library {lib}", f"not installed{' in ' + spec if spec else ''}", version))
    return out


def enforce(profile: Profile, fingerprint: Mapping[str, Any], libraries: Mapping[str, str | None]) -> list[str]:
    """Raise ProfileUnmet (exit 4) listing every unmet requirement that is an error; return warnings."""
    problems = unmet(profile, fingerprint, libraries)
    errors = [u for u in problems if profile.default_strictness == "error" and u.group not in profile.warn_groups]
    warnings = [f"profile {profile.name}: {u}" for u in problems if u not in errors]
    if errors:
        lines = "\n".join(f"  - {u}" for u in errors)
        raise ProfileUnmet(
            f"this machine does not meet profile {profile.name!r} ({len(errors)} unmet):\n{lines}",
            path=profile.path,
            fix="run on a node of that site, choose another --profile, or relax the profile's [strictness]",
        )
    return warnings


def required_libraries(profile: Profile) -> list[str]:
    """The library keys a profile's requirements name: a distribution, or ``distribution@variant``."""
    return sorted({*profile.requires.get("libraries", {}), *profile.requires.get("forbidden", {})})


def variants_of(base: str) -> list[str]:
    """The variant keys ``kernel_probe.detect.libraries`` can tell apart for a library (by its report name)."""
    from .detect.libraries import KNOWN_LIBRARIES

    lib = next((lib for lib in KNOWN_LIBRARIES if lib.name == base), None)
    return [v.key for v in lib.variants if v.usable] if lib is not None else []


def library_facts(keys: Iterable[str]) -> dict[str, str | None]:
    """Installed versions by profile key, from metadata and files only (nothing is imported).

    A library ``kernel_probe.detect.libraries`` knows (``transformer-engine``, ``apex``, ...) is
    found under any of its distribution names; ``NAME@VARIANT`` (``transformer-engine@nvidia``)
    has a version only when what is installed is that variant: the ROCm fork of transformer-engine
    installs under the same names as NVIDIA's. Any other key is one distribution's version.
    """
    from kernel_lock.fingerprint import library_versions

    from .detect.libraries import KNOWN_LIBRARIES, locate

    known = {lib.name: lib for lib in KNOWN_LIBRARIES}
    out: dict[str, str | None] = {}
    for key in keys:
        base, at, variant = key.partition("@")
        lib = known.get(base)
        if lib is None:
            out[key] = library_versions([base])[base] if not at else None
            continue
        located = locate(lib)
        version = next(iter(located.distributions.values()), None) if located.installed else None
        if located.installed and version is None:
            version = "unknown (no distribution metadata)"  # importable, e.g. a source build on the path
        if (
            located.variant is not None
            and (not located.variant.usable or (at and located.variant.key != variant))
            or at
            and located.variant is None
        ):
            version = None
        out[key] = version
    return out


def choose(
    spec: str,
    extra: Iterable[str],
    device: Mapping[str, Any],
    site: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[Profile | None, str, list[str]]:
    """The profile ``--profile NAME|PATH|auto`` names, how it was chosen, and notes to show."""
    if spec != "auto":
        return resolve(spec, extra), "explicit (--profile)", []
    from .detect.site import detect_site

    found, broken = scan(extra)
    notes = [f"broken profile, not considered: {exc}" for exc in broken]
    profile, matched, more = auto_detect(found.values(), site or detect_site(env), device, env)
    return profile, matched, notes + more
