"""Site profiles: what a site's nodes are expected to be, how to recognise the site, and its policy.

A profile is data (the built-ins are package data, ``kernel_probe/profiles/sites/*.toml``; the format
is documented in ``docs/profiles.md``); this module parses and validates it strictly (unknown keys
are errors: a typo in a policy must not silently widen it), matches profiles against the site
signals, and lists every requirement a machine does not meet.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock import _toml
from kernel_lock.slots import PRECISIONS, SLOTS
from kernel_lock.versions import in_spec
from kernel_probe.detect.site import read_marker
from kernel_probe.errors import InputFileError, ProfileUnmet, UsageError
from kernel_probe.probe.candidates import (
    DEVICE_TYPES,
    Candidate,
    TableReader,
    builtin,
    gpu_arch_problem,
    read_candidates,
)

PROFILE_VERSION = "1"
ENV_VAR = "KERNEL_PROBE_PROFILES"
BUILTIN_PACKAGE_DIR = "sites"  # package data of kernel_probe.profiles; pyproject.toml's package-data names it too
GROUPS = ("device", "count", "versions", "libraries", "forbidden")  # strictness groups

# ---- site signals (docs/profiles.md "Auto-detection") -----------------------------------------------
# A strong signal names the site itself (a site's own environment variable or marker file, the Slurm
# cluster name); a weak one follows a naming scheme other sites share (HPE Cray EX nodes are all
# nidNNNNNN; "gpu" or "small-g" partitions exist anywhere): it never decides alone, only together with a
# strong one or with the other weak kind in a [[detect.all]] group. The device describes hardware, not a
# site: alone, it only picks a device profile (one with no site signal, like the built-in cpu).
STRONG = {"env": 3, "files": 3, "slurm-cluster": 2}
WEAK = ("hostname", "slurm-partition")
SIGNALS = (*STRONG, *WEAK, "device")
DETECT_DEVICE_KEYS = ("type", "vendor", "arch")
MAX_SIGNAL_CHARS = 256  # a longer value never matches: it bounds every pattern's matching time
MAX_MARKER_BYTES = 64 << 10  # a marker file is one short line
MAX_VARIABLE_REPEATS = 2  # per pattern; with MAX_SIGNAL_CHARS, a search stays within milliseconds

# ---- closed sets of [requires] values -----------------------------------------------------------
DEVICE_VENDOR = {"cuda": "nvidia", "rocm": "amd", "mps": "apple", "xpu": "intel"}  # device type -> vendor
CPU_ARCHES = ("x86_64", "aarch64", "ppc64le", "s390x", "riscv64")  # platform.machine() on Linux nodes
_ARCH_SPELLINGS = {"amd64": "x86_64", "x64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64", "armv8": "aarch64"}


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
    probe_per: str | None = (
        None  # [policy] probe-per: who probes at job start (kernel_probe.jobstart.sharing.PROBE_PER)
    )
    slots: Mapping[str, SlotPolicy] = field(default_factory=dict)
    candidates: tuple[Candidate, ...] = ()
    default_strictness: str = "error"
    warn_groups: tuple[str, ...] = ()
    detect_all: tuple[Mapping[str, Any], ...] = ()  # [[detect.all]]: groups whose signals must all match
    help: str = ""  # one line for the profile's users, shown when a node is refused
    site_libraries: tuple[str, ...] = ()  # library names the registry does not know, declared on purpose
    document: Mapping[str, Any] = field(default_factory=dict)  # the parsed TOML, for `profiles show`

    def lock_record(self, matched: str) -> dict[str, Any]:
        return {"name": self.name, "digest": self.digest, "matched": matched, "source": self.path}


# ---- parsing ------------------------------------------------------------------------------------
class _P(TableReader):
    """The strict reader (kernel_probe.probe.candidates.TableReader), raising ProfileError."""

    error = ProfileError

    def regex(self, pattern: str, key: str) -> str:
        super().regex(pattern, key)
        problem = pattern_problem(pattern)
        if problem:
            raise self.err(
                key,
                f"{pattern!r}: {problem}; such a pattern can take exponential time on a crafted value",
                fix="match the value with a plain pattern: anchors, literals, character classes and at most "
                f"{MAX_VARIABLE_REPEATS} repeats, none inside another (e.g. '^(a|aa)+$' -> '^a+$')",
            )
        return pattern


def pattern_problem(pattern: str) -> str | None:
    """Why a detect pattern could backtrack without bound (None if it cannot).

    Refused: a repeat inside a repeat, an alternation inside a repeat (``(a|aa)+``), a backreference,
    more than MAX_VARIABLE_REPEATS variable repeats. What remains, on a value of at most
    MAX_SIGNAL_CHARS, matches in a few milliseconds. The tree is the one ``re`` itself compiles."""
    import importlib

    # the stdlib's own parser (re._parser since 3.11, sre_parse before): the tree re compiles
    try:
        sre, c = importlib.import_module("re._parser"), importlib.import_module("re._constants")
    except ImportError:  # Python 3.10
        sre, c = importlib.import_module("sre_parse"), importlib.import_module("sre_constants")

    repeats = tuple(getattr(c, n) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(c, n))
    counted = 0

    def walk(items: Any, in_repeat: bool) -> str | None:
        nonlocal counted
        for op, av in items:
            if op in repeats:
                lo, hi, sub = av
                variable = hi != lo and hi > 1
                if in_repeat and variable:
                    return "a repeat inside a repeat"
                counted += variable
                found = walk(sub, in_repeat or hi > 1)
            elif op is c.BRANCH:
                if in_repeat:
                    return "an alternation inside a repeat"
                found = next((x for x in (walk(b, in_repeat) for b in av[1]) if x), None)
            elif op is c.SUBPATTERN:
                found = walk(av[-1], in_repeat)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                found = walk(av[1], in_repeat)
            elif op in (c.GROUPREF, c.GROUPREF_EXISTS):
                return "a backreference"
            elif op is getattr(c, "ATOMIC_GROUP", None):
                found = walk(av, in_repeat)
            else:
                continue
            if found:
                return found
        return None

    found = walk(sre.parse(pattern), False)
    if found is None and counted > MAX_VARIABLE_REPEATS:
        found = f"{counted} variable repeats (at most {MAX_VARIABLE_REPEATS})"
    return found


_TOP = (
    "profile-version",
    "name",
    "description",
    "help",
    "sources",
    "unknown",
    "detect",
    "requires",
    "policy",
    "candidate",
    "strictness",
)
_DETECT = (*SIGNALS, "all")
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
    "site-libraries",
)
_POLICY = ("precision", "shapes", "deterministic", "probe-per", *SLOTS)
_SLOT_POLICY = ("allowed", "preferred", "pin")


def _signals(p: _P, table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One set of detect signals (``[detect]`` itself, or one ``[[detect.all]]`` group), validated."""
    out: dict[str, Any] = {}
    for key in ("env", "files"):
        if key not in table:
            continue
        values = p.free_table(table, key, where)
        for k, v in values.items():
            if not isinstance(v, str):
                raise p.err(f"{where}{key}.{k}", "expected a regular expression string ('' = present)")
            p.regex(v, f"{where}{key}.{k}")
        out[key] = values
    for key in ("hostname", "slurm-cluster", "slurm-partition"):
        if key not in table:
            continue
        patterns = p.strings(table, key, where)
        for i, pattern in enumerate(patterns):
            p.regex(pattern, f"{where}{key}[{i}]")
        out[key] = list(patterns)
    if "device" in table:
        dev = p.table(table, "device", DETECT_DEVICE_KEYS, where)
        for k, v in dev.items():
            if not isinstance(v, str):
                raise p.err(f"{where}device.{k}", f"expected a string, got {type(v).__name__}")
        if "type" in dev:
            _closed(p, [dev["type"]], DEVICE_TYPES, f"{where}device.type", "device type")
        if "vendor" in dev:
            _closed(p, [dev["vendor"]], tuple(DEVICE_VENDOR.values()), f"{where}device.vendor", "vendor")
        if "arch" in dev:
            problem = gpu_arch_problem(dev["arch"])
            if problem:
                raise p.err(f"{where}device.arch", problem)
        out["device"] = dev
    return out


def _closed(p: _P, values: Iterable[str], accepted: Sequence[str], key: str, what: str, spellings=None) -> None:
    """Every value one of ``accepted``: a wrong spelling is refused naming the accepted ones."""
    import difflib

    for value in values:
        if value in accepted:
            continue
        near = (spellings or {}).get(value.lower()) or (value.lower() if value.lower() in accepted else None)
        near = near or next(iter(difflib.get_close_matches(value.lower(), list(accepted), n=1, cutoff=0.6)), None)
        raise p.err(
            key,
            f"{value!r} is not a {what} kernel-probe reports",
            fix=(f"did you mean {near!r}? " if near else "") + f"accepted: {', '.join(accepted)}",
        )


def _known_libraries(declared: Iterable[Candidate]) -> dict[str, str]:
    """Library names a profile may require or forbid -> what they are: the registry's libraries (by name
    and by each distribution name), Triton's distributions, and the profile's own candidates'."""
    from kernel_probe.detect.libraries import known_libraries
    from kernel_probe.detect.triton import TRITON_DISTRIBUTIONS

    known = {lib.name: "registry" for lib in known_libraries()}
    known.update({dist: f"registry ({lib.name})" for lib in known_libraries() for dist in lib.distributions})
    known.update({dist: "triton" for dist in TRITON_DISTRIBUTIONS})
    known.update({c.distribution: f"candidate {c.id}" for c in declared if c.distribution})
    return known


def _check_requires(p: _P, requires: Mapping[str, Any], declared: Iterable[Candidate]) -> tuple[str, ...]:
    """Every [requires] value against its closed set, library names against the registry, and
    requirements that contradict each other (a profile no node can meet)."""
    types = p.strings(requires, "device-type", "requires.")
    _closed(p, types, DEVICE_TYPES, "requires.device-type", "device type")
    vendors = p.strings(requires, "device-vendor", "requires.")
    _closed(p, vendors, tuple(DEVICE_VENDOR.values()), "requires.device-vendor", "device vendor")
    _closed(p, p.strings(requires, "arch", "requires."), CPU_ARCHES, "requires.arch", "CPU arch", _ARCH_SPELLINGS)
    gpu_types = [t for t in types if t in ("cuda", "rocm")] or ["cuda", "rocm"]
    for arch in p.strings(requires, "device-arch", "requires."):
        problem = gpu_arch_problem(arch, gpu_types)
        if problem:
            raise p.err(
                "requires.device-arch",
                problem,
                fix="NVIDIA: sm_80, sm_90, sm_80+ (that or newer); AMD: gfx90a, gfx942 (exactly)",
            )
    count = requires.get("min-device-count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise p.err("requires.min-device-count", "expected a non-negative integer")
    # contradictions: no node could ever meet these together
    if types:
        accel = [t for t in types if t != "cpu"]
        if vendors and not any(DEVICE_VENDOR.get(t) in vendors for t in accel):
            raise p.err(
                "requires.device-vendor",
                f"{', '.join(vendors)} contradicts requires.device-type {', '.join(types)}: "
                + ("a CPU-only node has no accelerator vendor" if not accel else "no such device has that vendor"),
                fix="make them agree: " + ", ".join(f"{t} -> {v}" for t, v in DEVICE_VENDOR.items()),
            )
        if count and not accel:
            raise p.err(
                "requires.min-device-count",
                f"{count} accelerator(s) required, but requires.device-type allows only cpu",
                fix="drop min-device-count, or require an accelerator type",
            )
    site_libraries = p.strings(requires, "site-libraries", "requires.")
    known = _known_libraries(declared)
    tables = {key: p.free_table(requires, key, "requires.") for key in ("libraries", "forbidden")}
    for key, table in tables.items():
        for lib, spec in table.items():
            p.specifier(spec, f"requires.{key}.{lib}")
            base, at, variant = lib.partition("@")
            if at:
                known_variants = variants_of(base)
                if variant not in known_variants:
                    raise p.err(
                        f"requires.{key}.{lib}",
                        f"{variant!r} is not a known variant of {base}",
                        fix=f"known variants: {', '.join(known_variants) or 'none'} (kernel_lock/registry.toml)",
                    )
            elif base not in known and base not in site_libraries:
                import difflib

                close = difflib.get_close_matches(base, list(known), n=1, cutoff=0.75)
                raise p.err(
                    f"requires.{key}.{lib}",
                    f"unknown library {base!r}: a misspelt name would "
                    + ("forbid nothing" if key == "forbidden" else "never be found"),
                    fix=(f"did you mean {close[0]!r}? " if close else "")
                    + "use a library of kernel_lock/registry.toml (`kernel-probe env` lists them), "
                    f"or declare a site's own distribution in requires.site-libraries = [{base!r}]",
                )
    for lib, spec in tables["forbidden"].items():
        for required, rspec in tables["libraries"].items():
            # forbidding a library forbids each of its variants; forbidding one variant leaves the others
            same = required == lib or ("@" not in lib and required.partition("@")[0] == lib)
            if same and (not spec or spec == rspec):
                raise p.err(
                    f"requires.forbidden.{lib}",
                    f"{lib} is forbidden{' in ' + spec if spec else ''} but requires.libraries.{required} "
                    f"requires it{' in ' + rspec if rspec else ''}: no node can meet this profile",
                    fix="keep one of them, or forbid only a range the requirement does not allow",
                )
    return site_libraries


def _check_detect(p: _P, detect: Mapping[str, Any], groups: Sequence[Mapping[str, Any]]) -> None:
    """A site profile's device signal and every group must be able to decide (docs/profiles.md)."""
    site_signals = [k for k in detect if k != "device"] + [k for g in groups for k in g]
    if "device" in detect and site_signals:
        raise p.err(
            "detect.device",
            "a device signal next to site signals would pick this profile on any such device",
            fix="put it in a [[detect.all]] group with the site signal it qualifies "
            '(e.g. env = { BSC_MACHINE = "^mn5$" }, device = { type = "cuda" })',
        )
    for i, group in enumerate(groups):
        kinds = set(group)
        if not (kinds & set(STRONG)) and not set(WEAK) <= kinds:
            raise p.err(
                f"detect.all[{i}]",
                f"this group ({', '.join(sorted(kinds)) or 'empty'}) can never decide: "
                "weak signals (hostname, slurm-partition) and the device do not identify a site alone",
                fix="add a strong signal (env, files, slurm-cluster), or require both hostname and slurm-partition",
            )


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
    help_line = p.string(d, "help", "", default="") or ""
    if "\n" in help_line or len(help_line) > 300:
        raise p.err("help", "one line of at most 300 characters", fix="point to a page for more")
    raw_detect = p.table(d, "detect", _DETECT, "")
    detect = _signals(p, raw_detect, "detect.")
    all_tables = raw_detect.get("all", [])
    if not isinstance(all_tables, list) or not all(isinstance(x, dict) for x in all_tables):
        raise p.err("detect.all", "expected an array of tables ([[detect.all]])")
    groups = []
    for i, group in enumerate(all_tables):
        p.no_unknown(group, SIGNALS, f"detect.all[{i}].")
        groups.append(_signals(p, group, f"detect.all[{i}]."))
    _check_detect(p, detect, groups)
    requires = p.table(d, "requires", _REQUIRES, "")
    for key in ("torch", "torch-cuda", "torch-hip", "driver"):
        if key in requires:
            p.specifier(requires[key], f"requires.{key}")
    declared = read_candidates(p, d, source=f"profile:{name}", reserved={b.id for b in builtin()})
    known_ids = {c.id: c for c in (*builtin(), *declared)}
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
    from kernel_probe.probe.shapes import parse_shape

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
    site_libraries = _check_requires(p, requires, declared)
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
        detect_all=tuple(groups),
        help=help_line,
        site_libraries=site_libraries,
        document=d,
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


# a profile file says so on a line of its own; anything else in a profiles directory (a lock, a
# config) is skipped, not reported as a broken profile
_DECLARES_PROFILE = re.compile(rb'^[ \t]*["\']?profile-version["\']?[ \t]*=', re.MULTILINE)


@dataclass
class Survey:
    """Every profile found (by name: the first directory wins), the broken files, and notes: shadowed
    built-ins, duplicate names, a file named unlike its profile, files that are not profiles."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    broken: list[ProfileError] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (profile name or "", text)

    def notes_for(self, name: str | None = None) -> list[str]:
        return [text for n, text in self.notes if name is None or n in (name, "")]


def survey(extra: Iterable[str] = ()) -> Survey:
    """Every valid profile of the user directories, then the built-ins (see :class:`Survey`); one
    broken file must not hide every other profile."""
    from kernel_lock._files import UnsafeFile, read_regular

    builtin = builtin_dir()
    if not (builtin.is_dir() and any(builtin.glob("*.toml"))):
        raise BuiltinProfilesMissing(
            "no built-in site profiles here: this kernel-probe installation is incomplete",
            path=str(builtin),
            fix=f"reinstall kernel-probe; the built-ins ship inside the package as kernel_probe/{BUILTIN_PACKAGE_DIR}/*.toml",
        )
    out = Survey()
    for d in [*user_dirs(extra), builtin]:
        if not d.is_dir():
            raise UsageError(f"profiles directory {d} does not exist (from --profiles-dir or ${ENV_VAR})")
        skipped = []
        for f in sorted(d.glob("*.toml")):
            try:
                if not _DECLARES_PROFILE.search(read_regular(f, MAX_BYTES)):
                    skipped.append(f.name)
                    continue
                prof = load_file(f)
            except UnsafeFile:
                skipped.append(f.name)
                continue
            except OSError as exc:
                out.broken.append(ProfileError(f"cannot read: {exc}", path=str(f)))
                continue
            except ProfileError as exc:
                out.broken.append(exc)
                continue
            if prof.name != f.stem:
                out.notes.append(
                    (
                        prof.name,
                        f"{f} declares name {prof.name!r}: it is found as {prof.name!r} "
                        f"(name the file {prof.name}.toml to avoid surprises)",
                    )
                )
            first = out.profiles.get(prof.name)
            if first is None:
                out.profiles[prof.name] = prof
            elif d == builtin:
                out.notes.append((prof.name, f"{first.path} shadows the built-in profile {prof.name!r}"))
            elif Path(first.path).parent == d:
                out.notes.append(
                    (
                        prof.name,
                        f"two profiles named {prof.name!r} in {d}: {Path(first.path).name} "
                        f"is used, {f.name} is ignored (rename one)",
                    )
                )
            else:
                out.notes.append((prof.name, f"{f} is shadowed by {first.path} (an earlier directory wins)"))
        if skipped:
            out.notes.append(
                (
                    "",
                    f"{d}: skipped {len(skipped)} file(s) that are not profiles "
                    f"(no profile-version line): {', '.join(skipped)}",
                )
            )
    return out


def scan(extra: Iterable[str] = ()) -> tuple[dict[str, Profile], list[ProfileError]]:
    """Every valid profile by name, and the broken profile files (see :func:`survey`)."""
    found = survey(extra)
    return found.profiles, found.broken


def available(extra: Iterable[str] = ()) -> dict[str, Profile]:
    """Every valid profile by name (see :func:`survey`)."""
    return survey(extra).profiles


def resolve(spec: str, extra: Iterable[str] = (), found: Survey | None = None) -> Profile:
    """A profile by name, or by path (anything with a '/' or ending in .toml)."""
    if "/" in spec or spec.endswith(".toml"):
        return load_file(spec)
    found = found or survey(extra)
    if spec not in found.profiles:
        named = [e for e in found.broken if Path(e.path or "").stem == spec]
        if named:
            raise named[0]  # the profile asked for is the broken one: say why
        broken = found.broken
        raise UsageError(
            f"unknown profile {spec!r}; available: {', '.join(sorted(found.profiles)) or 'none'}"
            " (or pass a path to a .toml file)"
            + (f"; {len(broken)} profile file(s) are broken: `kernel-probe profiles list` names them" if broken else "")
        )
    return found.profiles[spec]


# ---- detection ----------------------------------------------------------------------------------
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
        return self.env.get(name) or self.slurm.get(name)


@dataclass(frozen=True)
class Hit:
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
        notes.append(f"{what} is {len(value)} characters long, more than {MAX_SIGNAL_CHARS}: not matched")
        return False
    return re.search(pattern, value) is not None


def _evaluate(signals: Mapping[str, Any], facts: SiteFacts, notes: list[str]) -> tuple[list[Hit], list[str]]:
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
        name = {"slurm-cluster": "SLURM_CLUSTER_NAME", "slurm-partition": "SLURM_JOB_PARTITION"}.get(kind)
        value = facts.slurm_value(name) if name else facts.hostname
        ok = bool(value) and any(_search(pat, value or "", kind, notes) for pat in signals[kind])
        (hits.append(Hit(kind, f"{kind}:{value}")) if ok else missed.append(kind))
    dev = signals.get("device", {})
    if dev:
        text = "device:" + ",".join(f"{k}={v}" for k, v in dev.items())
        from kernel_probe.probe.candidates import arch_satisfies

        found = {k: str(facts.device.get(k, "")) for k in dev}
        same = all(arch_satisfies(found[k], v) if k == "arch" else found[k] == v for k, v in dev.items())
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
                    profile, 2 if kinds & set(STRONG) else 1, strength, " + ".join(h.text for h in hits), len(hits)
                )
            )
        elif kinds & set(STRONG):
            notes.append(
                f"{profile.name}: {', '.join(h.text for h in hits)} matched, but not {', '.join(missed)}: "
                "not one of its nodes"
            )
        elif kinds & set(WEAK):
            notes.append(
                f"{profile.name}: {', '.join(h.text for h in hits)} matched, but not {', '.join(missed)}: "
                "a weak signal never decides alone (other sites share such names)"
            )
    site_signals = any(k != "device" for k in profile.detect) or bool(profile.detect_all)
    device_hits = [h for h in top if h.kind == "device"]
    if device_hits and not site_signals:
        found.append(Detection(profile, 0, 0, device_hits[0].text, 1))
    weak = [h for h in top if h.kind in WEAK]
    if not found and weak:
        notes.append(
            f"{profile.name}: {', '.join(h.text for h in weak)} matched, but a weak signal never decides "
            "alone (other sites share such names): not picked"
        )
    notes.extend(f"{profile.name}: {n}" for n in dict.fromkeys(seen))
    return max(found, key=lambda x: (x.rank, x.strength, x.hits)) if found else None


def detect_warnings(profile: Profile) -> list[str]:
    """What `profiles check` says about a valid profile that --profile auto could never pick."""
    site = [k for k in profile.detect if k != "device"]
    if site and not any(k in STRONG for k in site) and not profile.detect_all:
        return [
            f"detect: only weak signals ({', '.join(site)}): --profile auto never picks this profile on them "
            "alone; add a strong signal (env, files, slurm-cluster) or a [[detect.all]] group (docs/profiles.md)"
        ]
    if not profile.detect and not profile.detect_all:
        return ["detect: no signal: --profile auto never picks this profile (name it with --profile)"]
    return []


def site_facts(
    site: Mapping[str, Any],
    device: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    read_file: Callable[[str], str | None] | None = None,
    problems: list[str] | None = None,
) -> SiteFacts:
    """The site facts of this machine (``site`` from kernel_probe.detect.site); marker files are read
    like every input (regular files only, non-blocking, capped), a refused one noted in ``problems``."""
    if read_file is None:
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
    """(profile, the signal that decided, notes). None when nothing decided. Ambiguity is an error."""
    problems: list[str] = []
    facts = site if isinstance(site, SiteFacts) else site_facts(site, device or {}, env, read_file, problems)
    notes: list[str] = []
    scored = [d for d in (detect(prof, facts, notes) for prof in profiles) if d is not None]
    notes.extend(dict.fromkeys(problems))
    if not scored:
        return None, "", notes
    scored.sort(key=lambda d: (-d.rank, -d.strength, -d.hits, d.profile.name))
    best = scored[0]
    rivals = [d for d in scored[1:] if (d.rank, d.strength, d.hits) == (best.rank, best.strength, best.hits)]
    if rivals:
        names = ", ".join(d.profile.name for d in [best, *rivals])
        raise ProfileUnmet(
            f"--profile auto is ambiguous: {names} match equally well ({best.matched})",
            fix="name the profile with --profile NAME",
        )
    notes += [f"{d.profile.name} also matched ({d.matched}), more weakly" for d in scored[1:]]
    return best.profile, best.matched, notes


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
            f"profile {profile.name} changed since the lock was written (digest {str(digest)[:19]}... -> "
            f"{profile.digest[:19]}..., {profile.path})"
        )
    return None


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
    from kernel_probe.probe.candidates import arch_satisfies

    for key in ("device-type", "device-vendor", "device-arch", "arch"):
        allowed = req.get(key)
        if allowed:
            allowed = [allowed] if isinstance(allowed, str) else list(allowed)
            found = str(fingerprint.get(key, ""))
            if key == "device-vendor" and fingerprint.get("device-type") == "cpu":
                found = f"none (no accelerator; CPU vendor {found})"  # a CPU's vendor is not a GPU's
            ok = any(arch_satisfies(found, a) for a in allowed) if key == "device-arch" and found else found in allowed
            if not ok:
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


# what a refused user can do, by group: about their job and environment, not about the profile
USER_FIX = {
    "device": "run on one of the site's GPU nodes, inside a GPU job",
    "count": "ask the job for GPUs and keep them visible (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES)",
    "versions": "use a torch build in the required range (the site's module or container)",
    "libraries": "install the required libraries in this environment (or load the site's module)",
    "forbidden": "uninstall the forbidden library, or use another environment without it",
}


def enforce(profile: Profile, fingerprint: Mapping[str, Any], libraries: Mapping[str, str | None]) -> list[str]:
    """Raise ProfileUnmet (exit 4) listing every unmet requirement that is an error; return warnings."""
    problems = unmet(profile, fingerprint, libraries)
    errors = [u for u in problems if profile.default_strictness == "error" and u.group not in profile.warn_groups]
    warnings = [f"profile {profile.name}: {u}" for u in problems if u not in errors]
    if errors:
        lines = "\n".join(f"  - {u}" for u in errors)
        todo = [USER_FIX[g] for g in dict.fromkeys(u.group for u in errors)]
        if profile.help:
            todo.insert(0, f"{profile.name}: {profile.help}")
        raise ProfileUnmet(
            f"this machine does not meet profile {profile.name!r} ({len(errors)} unmet):\n{lines}",
            path=profile.path,
            fix="; ".join(todo) + "; or use the profile of the machine you are on (--profile NAME, or auto)",
        )
    return warnings


def other_site(profile: Profile, seen: Profile | None, matched: str, where: str = "this machine") -> None:
    """Raise ProfileUnmet (exit 4) when a named ``profile`` meets a node whose site signals identify another
    profile's site (``seen``, by ``matched``). Hardware alone cannot tell apart sites with the same nodes
    (the A100s of JUWELS Booster, Leonardo and Perlmutter; the MI250X of LUMI-G and Frontier): their strong
    site signals can. A node whose signals match no profile, or only a device profile by its device facts
    (``cpu`` on any CPU node), is not refused: naming a profile is how a site without signals is used."""
    if seen is None or seen.name == profile.name or matched.startswith("device:"):
        return
    raise ProfileUnmet(
        f"{where} is a node of profile {seen.name!r} by its site signals ({matched}), not of {profile.name!r}",
        path=profile.path,
        fix=f"use --profile {seen.name} (or --profile auto) here, or run on a node of {profile.name}",
    )


def required_libraries(profile: Profile) -> list[str]:
    """The library keys a profile's requirements name: a distribution, or ``distribution@variant``."""
    return sorted({*profile.requires.get("libraries", {}), *profile.requires.get("forbidden", {})})


def variants_of(base: str) -> list[str]:
    """The variant keys ``kernel_probe.detect.libraries`` can tell apart for a library (by its report name)."""
    from kernel_probe.detect.libraries import known_libraries

    lib = next((lib for lib in known_libraries() if lib.name == base), None)
    return [v.key for v in lib.variants if v.usable] if lib is not None else []


def library_facts(
    keys: Iterable[str], described: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, str | None]:
    """Installed versions by profile key: on this machine from metadata and files only (nothing is
    imported), or on a ``described`` node (kernel_probe.profiles.nodes: its libraries as ``kernel-probe env``
    reports them).

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
        version, found = _library_here(base, lib) if described is None else _library_described(base, lib, described)
        # a namesake (a variant that is not usable) never counts; NAME@VARIANT only that variant
        if found is not None and (not found.usable or (at and found.key != variant)) or at and found is None:
            version = None
        out[key] = version
    return out


def _library_here(base: str, lib: Any) -> tuple[str | None, Any]:
    """(version, recognised variant) of a library or distribution on this machine."""
    from kernel_lock.fingerprint.fields import library_versions
    from kernel_probe.detect.libraries import locate

    if lib is None:
        return library_versions([base])[base], None
    located = locate(lib)
    version = next(iter(located.distributions.values()), None) if located.installed else None
    if located.installed and version is None:
        version = "unknown (no distribution metadata)"  # importable, e.g. a source build on the path
    return version, located.variant


def _library_described(base: str, lib: Any, described: Mapping[str, Mapping[str, Any]]) -> tuple[str | None, Any]:
    """(version, variant) of a library on a described node: by its report name (its ``variant`` as
    ``kernel-probe env`` names it), or a distribution listed directly or among a library's."""
    entry = described.get(base)
    if entry is None:
        dists = (e.get("distributions") or {} for e in described.values())
        return next((str(d[base]) for d in dists if isinstance(d, dict) and d.get(base)), None), None
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
) -> tuple[Profile | None, str, list[str]]:
    """The profile ``--profile NAME|PATH|auto`` names, how it was chosen (``named`` when named), and
    notes to show. ``facts``: another node's site facts (a node description) instead of this one's."""
    if spec != "auto":
        if "/" in spec or spec.endswith(".toml"):
            return load_file(spec), named, []
        found = survey(extra)
        return resolve(spec, extra, found), named, found.notes_for(spec)
    from kernel_probe.detect.site import detect_site

    found = survey(extra)
    notes = found.notes_for() + [f"broken profile, not considered: {exc}" for exc in found.broken]
    problems: list[str] = []
    if facts is None:
        facts = site_facts(site or detect_site(env), device, env, problems=problems)
    profile, matched, more = auto_detect(found.profiles.values(), facts)
    return profile, matched, notes + more + list(dict.fromkeys(problems))
