"""The profile format: what a site's nodes are expected to be, and its policy, read from TOML.

A profile is data (the built-ins are package data, ``kernel_probe/profiles/sites/*.toml``; the
format is documented in ``docs/profiles.md``); this module parses and validates it strictly (unknown
keys are errors: a typo in a policy must not silently widen it), and refuses requirements no node
can meet.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock.format import toml
from kernel_lock.format.slots import PRECISIONS, SLOTS
from kernel_probe.candidates import (
    DEVICE_TYPES,
    Candidate,
    builtin,
    gpu_arch_problem,
    read_candidates,
)
from kernel_probe.errors import InputFileError
from kernel_probe.jobstart.handoff import PROBE_PER
from kernel_probe.profiles.signals import (
    DETECT_DEVICE_KEYS,
    MAX_VARIABLE_REPEATS,
    SIGNALS,
    STRONG,
    WEAK,
    pattern_problem,
)
from kernel_probe.tables import TableReader

PROFILE_VERSION = "1"
GROUPS = ("device", "count", "versions", "libraries", "forbidden")  # strictness groups
MAX_BYTES = 1 << 20  # a profile is a few kB

# ---- closed sets of [requires] values -----------------------------------------------------------
DEVICE_VENDOR = {
    "cuda": "nvidia",
    "rocm": "amd",
    "mps": "apple",
    "xpu": "intel",
}  # device type -> vendor
CPU_ARCHES = (
    "x86_64",
    "aarch64",
    "ppc64le",
    "s390x",
    "riscv64",
)  # platform.machine() on Linux nodes
_ARCH_SPELLINGS = {
    "amd64": "x86_64",
    "x64": "x86_64",
    "x86-64": "x86_64",
    "arm64": "aarch64",
    "armv8": "aarch64",
}


class ProfileError(InputFileError):
    """A malformed profile (exit 5); the message names the file and the dotted key."""


@dataclass(frozen=True)
class SlotPolicy:
    """A profile's ``[policy.<slot>]``: the candidates allowed (None: the key is absent, any;
    ``()``: ``allowed = []``, none), preferred, or pinned."""

    allowed: tuple[str, ...] | None = None
    preferred: tuple[str, ...] = ()
    pin: str | None = None


@dataclass(frozen=True)
class Profile:
    """One parsed, validated site profile: how to recognise the site, what it requires, its
    policy."""

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
    deterministic: bool = (
        False  # [policy] deterministic: only bitwise repeatable candidates are chosen
    )
    probe_per: str | None = (
        # [policy] probe-per: who probes at job start (kernel_probe.jobstart.handoff.PROBE_PER)
        None
    )
    slots: Mapping[str, SlotPolicy] = field(default_factory=dict)
    candidates: tuple[Candidate, ...] = ()
    default_strictness: str = "error"
    warn_groups: tuple[str, ...] = ()
    # [[detect.all]]: groups whose signals must all match
    detect_all: tuple[Mapping[str, Any], ...] = ()
    help: str = ""  # one line for the profile's users, shown when a node is refused
    # library names the registry does not know, declared on purpose
    site_libraries: tuple[str, ...] = ()
    # the parsed TOML, for `profiles show`
    document: Mapping[str, Any] = field(default_factory=dict)

    def lock_record(self, matched: str) -> dict[str, Any]:
        """The lock's ``[profile]`` table for this profile, matched as ``matched``."""
        return {"name": self.name, "digest": self.digest, "matched": matched, "source": self.path}


# ---- parsing ------------------------------------------------------------------------------------
class _P(TableReader):
    """The strict reader (kernel_probe.tables.TableReader), raising ProfileError."""

    error = ProfileError

    def regex(self, pattern: str, key: str) -> str:
        super().regex(pattern, key)
        problem = pattern_problem(pattern)
        if problem:
            raise self.err(
                key,
                f"{pattern!r}: {problem}; such a pattern can take exponential time on a "
                "crafted value",
                fix="match the value with a plain pattern: anchors, literals, character "
                "classes and at most "
                f"{MAX_VARIABLE_REPEATS} repeats, none inside another (e.g. '^(a|aa)+$' -> '^a+$')",
            )
        return pattern


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
    """One set of detect signals (``[detect]`` itself, or one ``[[detect.all]]`` group),
    validated."""
    out: dict[str, Any] = {}
    for key in ("env", "files"):
        if key not in table:
            continue
        values = p.free_table(table, key, where)
        for k, v in values.items():
            if not isinstance(v, str):
                raise p.err(
                    f"{where}{key}.{k}", "expected a regular expression string ('' = present)"
                )
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
            _closed(
                p, [dev["vendor"]], tuple(DEVICE_VENDOR.values()), f"{where}device.vendor", "vendor"
            )
        if "arch" in dev:
            problem = gpu_arch_problem(dev["arch"])
            if problem:
                raise p.err(f"{where}device.arch", problem)
        out["device"] = dev
    return out


def _closed(
    p: _P, values: Iterable[str], accepted: Sequence[str], key: str, what: str, spellings=None
) -> None:
    """Every value one of ``accepted``: a wrong spelling is refused naming the accepted ones."""
    import difflib

    for value in values:
        if value in accepted:
            continue
        near = (spellings or {}).get(value.lower()) or (
            value.lower() if value.lower() in accepted else None
        )
        near = near or next(
            iter(difflib.get_close_matches(value.lower(), list(accepted), n=1, cutoff=0.6)), None
        )
        raise p.err(
            key,
            f"{value!r} is not a {what} kernel-probe reports",
            fix=(f"did you mean {near!r}? " if near else "") + f"accepted: {', '.join(accepted)}",
        )


def _known_libraries(declared: Iterable[Candidate]) -> dict[str, str]:
    """Library names a profile may require or forbid -> what they are: the registry's libraries (by
    name and by each distribution name), Triton's distributions, and the profile's own
    candidates'."""
    from kernel_probe.detect.libraries import known_libraries
    from kernel_probe.detect.triton import TRITON_DISTRIBUTIONS

    known = {lib.name: "registry" for lib in known_libraries()}
    known.update(
        {dist: f"registry ({lib.name})" for lib in known_libraries() for dist in lib.distributions}
    )
    known.update({dist: "triton" for dist in TRITON_DISTRIBUTIONS})
    known.update({c.distribution: f"candidate {c.id}" for c in declared if c.distribution})
    return known


def _check_requires(
    p: _P, requires: Mapping[str, Any], declared: Iterable[Candidate]
) -> tuple[str, ...]:
    """Every [requires] value against its closed set, library names against the registry, and
    requirements that contradict each other (a profile no node can meet)."""
    types = p.strings(requires, "device-type", "requires.")
    _closed(p, types, DEVICE_TYPES, "requires.device-type", "device type")
    vendors = p.strings(requires, "device-vendor", "requires.")
    _closed(p, vendors, tuple(DEVICE_VENDOR.values()), "requires.device-vendor", "device vendor")
    _closed(
        p,
        p.strings(requires, "arch", "requires."),
        CPU_ARCHES,
        "requires.arch",
        "CPU arch",
        _ARCH_SPELLINGS,
    )
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
                + (
                    "a CPU-only node has no accelerator vendor"
                    if not accel
                    else "no such device has that vendor"
                ),
                fix="make them agree: "
                + ", ".join(f"{t} -> {v}" for t, v in DEVICE_VENDOR.items()),
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
        for lib, spec in list(table.items()):
            p.specifier(spec, f"requires.{key}.{lib}")
            base, at, variant = lib.partition("@")
            if at:
                known_variants = variants_of(base)
                spelt = {v.lower(): v for v in known_variants}.get(variant.lower())
                # variants are case-insensitive: NVIDIA is nvidia
                if spelt is not None and spelt != variant:
                    table[f"{base}@{spelt}"] = table.pop(lib)
                    variant = spelt
                if variant not in known_variants:
                    raise p.err(
                        f"requires.{key}.{lib}",
                        f"{variant!r} is not a known variant of {base}",
                        fix=f"known variants: {', '.join(known_variants) or 'none'} "
                        "(kernel_lock/registry.toml)",
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
            # forbidding a library forbids each of its variants; forbidding one variant leaves the
            # others
            same = required == lib or ("@" not in lib and required.partition("@")[0] == lib)
            if same and (not spec or spec == rspec):
                raise p.err(
                    f"requires.forbidden.{lib}",
                    f"{lib} is forbidden{' in ' + spec if spec else ''} but "
                    f"requires.libraries.{required} "
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
                f"this group ({', '.join(sorted(kinds)) or 'empty'}) can never decide: weak "
                "signals (hostname, slurm-partition) and the device do not identify a site alone",
                fix="add a strong signal (env, files, slurm-cluster), or require both hostname "
                "and slurm-partition",
            )


def parse(text: str, path: str) -> Profile:
    """The profile in TOML ``text`` (from ``path``); ProfileError names the file, key and fix."""
    p = _P(path)
    try:
        d = toml.loads(text)
    except (
        toml.TOMLDecodeError,
        ValueError,
        RecursionError,
    ) as exc:  # ValueError: e.g. a 5,000-digit integer
        raise p.err("", f"not valid TOML: {exc}") from None
    p.no_unknown(d, _TOP, "")
    version = p.string(d, "profile-version", "", required=True)
    if version != PROFILE_VERSION:
        raise p.err(
            "profile-version",
            f"unsupported profile-version {version!r} (this kernel-probe reads "
            f"{PROFILE_VERSION!r})",
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
        raise p.err(
            "policy.deterministic", f"expected true or false, got {type(deterministic).__name__}"
        )
    probe_per = p.string(policy, "probe-per", "policy.")
    if probe_per is not None and probe_per not in PROBE_PER:
        raise p.err("policy.probe-per", f"{probe_per!r} is not one of {', '.join(PROBE_PER)}")
    from kernel_probe.shapes import parse_shape

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
        allowed = p.strings(sp, "allowed", f"policy.{slot}.") if "allowed" in sp else None
        preferred = p.strings(sp, "preferred", f"policy.{slot}.")
        pin = p.string(sp, "pin", f"policy.{slot}.")
        if pin is not None and not pin.strip():
            raise p.err(
                f"policy.{slot}.pin",
                "an empty pin pins nothing",
                fix="name a candidate id (e.g. torch.layer_norm), or remove the key",
            )
        for key, ids in (
            ("allowed", allowed or ()),
            ("preferred", preferred),
            ("pin", (pin,) if pin else ()),
        ):
            for cid in ids:
                cand = known_ids.get(cid)
                if cand is None:
                    raise p.err(
                        f"policy.{slot}.{key}",
                        f"unknown candidate id {cid!r}",
                        fix="use an id from `kernel-probe check` (e.g. torch.layer_norm, "
                        "liger.rms_norm) or declare it in a [[candidate]] table",
                    )
                if slot not in cand.slots:
                    raise p.err(
                        f"policy.{slot}.{key}",
                        f"candidate {cid!r} is for {', '.join(cand.slots)}, not {slot}",
                    )
        # `allowed = []` allows nothing: a preference or a pin is then a contradiction
        if allowed is not None:
            for key, ids in (("preferred", preferred), ("pin", (pin,) if pin else ())):
                for cid in ids:
                    if cid not in allowed:
                        raise p.err(
                            f"policy.{slot}.{key}", f"{cid!r} is not in policy.{slot}.allowed"
                        )
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


def load_file(path: str | os.PathLike[str]) -> Profile:
    """The profile file at ``path``, read through the safe reader, parsed by :func:`from_bytes`."""
    from kernel_lock.files import UnsafeFile, read_regular

    p = Path(path)
    try:
        raw = read_regular(p, MAX_BYTES)
    except FileNotFoundError:
        raise ProfileError(
            "no such file", path=str(p), fix="check the path, or use `kernel-probe profiles list`"
        ) from None
    except UnsafeFile as exc:
        fix = "pass a .toml file, or use --profiles-dir" if "directory" in exc.problem else exc.fix
        raise ProfileError(exc.problem, path=str(p), fix=fix or None) from None
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc}", path=str(p)) from None
    return from_bytes(raw, str(p))


def from_bytes(raw: bytes, path: str) -> Profile:
    """The profile in the bytes read from the file ``path`` (UTF-8 TOML), parsed; ProfileError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"cannot read: {exc}", path=path) from None
    return parse(text, path)


def variants_of(base: str) -> list[str]:
    """The variant keys ``kernel_probe.detect.libraries`` can tell apart for a library (by its
    report name)."""
    from kernel_probe.detect.libraries import known_libraries

    lib = next((lib for lib in known_libraries() if lib.name == base), None)
    return [v.key for v in lib.variants if v.usable] if lib is not None else []
