"""Site profiles: what a site's nodes are expected to be, and its policy, read from TOML
(docs/profiles.md) strictly (an unknown key is an error: a typo must not silently widen a policy),
refusing requirements no node can meet; ``kernel_probe.sites`` finds them.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock import toml
from kernel_lock.files import UnsafeFile, read_regular
from kernel_lock.slots import PRECISIONS, SLOTS
from kernel_lock.tables import nearest
from kernel_probe import candidates as cands
from kernel_probe.detect.libraries import TRITON_DISTRIBUTIONS, known, known_libraries
from kernel_probe.errors import InputFileError
from kernel_probe.ranks import PROBE_PER
from kernel_probe.shapes import parse_shape
from kernel_probe.tables import TableReader

PROFILE_VERSION = "1"
# the strictness groups, each with what a refused user can do (about their job, not the profile)
GROUPS = {
    "device": "run on one of the site's GPU nodes, inside a GPU job",
    "count": "ask the job for GPUs and keep them visible (CUDA_VISIBLE_DEVICES, "
    "HIP_VISIBLE_DEVICES)",
    "versions": "use a torch build in the required range (the site's module or container)",
    "libraries": "install the required libraries in this environment (or load the site's module)",
    "forbidden": "uninstall the forbidden library, or use another environment without it",
}
MAX_BYTES = 1 << 20  # a profile is a few kB

# [detect] signals. A strong one names the site (its own variable or marker file, the Slurm
# cluster); a weak one follows a naming scheme other sites share (Cray nidNNNNNN, "gpu" partitions)
# and never decides alone; the device describes hardware, not a site (docs/profiles.md)
STRONG = {"env": 3, "files": 3, "slurm-cluster": 2}
WEAK = ("hostname", "slurm-partition")
SIGNALS = (*STRONG, *WEAK, "device")
DETECT_DEVICE_KEYS = ("type", "vendor", "arch")
MAX_SIGNAL_CHARS = 256  # a longer value never matches: it bounds every pattern's matching time
MAX_VARIABLE_REPEATS = 2  # per pattern; with MAX_SIGNAL_CHARS, a search stays within milliseconds

DEVICE_VENDOR = {"cuda": "nvidia", "rocm": "amd", "mps": "apple", "xpu": "intel"}
VENDORS = tuple(DEVICE_VENDOR.values())
CPU_ARCHES = ("x86_64", "aarch64", "ppc64le", "s390x", "riscv64")  # as Linux nodes report them
_ARCH_SPELLINGS = {
    **dict.fromkeys(("amd64", "x64", "x86-64"), "x86_64"),
    **dict.fromkeys(("arm64", "armv8"), "aarch64"),
}
_TOP = (
    *("profile-version", "name", "description", "help", "sources", "unknown", "detect"),
    *("requires", "policy", "candidate", "strictness"),
)
_REQUIRES = (
    *("device-type", "device-vendor", "device-arch", "min-device-count", "arch", "torch"),
    *("torch-cuda", "torch-hip", "driver", "libraries", "forbidden", "site-libraries"),
)
_VERSIONS = ("torch", "torch-cuda", "torch-hip", "driver")
_POLICY = ("precision", "shapes", "deterministic", "probe-per", *SLOTS)


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
    """One validated site profile: how to recognise the site, what it requires, its policy."""

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
    deterministic: bool = False  # only bitwise repeatable candidates are chosen
    probe_per: str | None = None  # who probes at job start (kernel_probe.ranks.PROBE_PER)
    slots: Mapping[str, SlotPolicy] = field(default_factory=dict)
    candidates: tuple[cands.Candidate, ...] = ()
    default_strictness: str = "error"
    warn_groups: tuple[str, ...] = ()
    detect_all: tuple[Mapping[str, Any], ...] = ()  # [[detect.all]]: each group matches whole
    help: str = ""  # one line for the profile's users, shown when a node is refused
    site_libraries: tuple[str, ...] = ()  # library names the registry lacks, declared on purpose
    document: Mapping[str, Any] = field(default_factory=dict)  # the parsed TOML (`profiles show`)

    def lock_record(self, matched: str) -> dict[str, Any]:
        """The lock's ``[profile]`` table for this profile, matched as ``matched``."""
        return {"name": self.name, "digest": self.digest, "matched": matched, "source": self.path}


def pattern_problem(pattern: str) -> str | None:
    """Why a detect pattern could backtrack without bound (None if it cannot): a repeat or an
    alternation inside a repeat, a backreference, over MAX_VARIABLE_REPEATS variable repeats."""
    # the stdlib's own parser, the tree re compiles (re._parser since 3.11, sre_parse before)
    try:
        sre, c = importlib.import_module("re._parser"), importlib.import_module("re._constants")
    except ImportError:  # Python 3.10
        sre, c = importlib.import_module("sre_parse"), importlib.import_module("sre_constants")
    names = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
    repeats = tuple(getattr(c, n) for n in names if hasattr(c, n))
    counted = 0

    def walk(items: Any, in_repeat: bool) -> str | None:
        nonlocal counted
        for op, av in items:
            inner, subs = in_repeat, []
            if op in (c.GROUPREF, c.GROUPREF_EXISTS):
                return "a backreference"
            if op in repeats:
                lo, hi, sub = av
                variable = hi != lo and hi > 1
                if in_repeat and variable:
                    return "a repeat inside a repeat"
                counted += variable
                inner, subs = in_repeat or hi > 1, [sub]
            elif op is c.BRANCH:
                if in_repeat:
                    return "an alternation inside a repeat"
                subs = av[1]
            elif op in (c.SUBPATTERN, c.ASSERT, c.ASSERT_NOT):
                subs = [av[-1]]
            elif op is getattr(c, "ATOMIC_GROUP", None):
                subs = [av]
            if found := next((x for x in (walk(sub, inner) for sub in subs) if x), None):
                return found
        return None

    found = walk(sre.parse(pattern), False)
    if found is None and counted > MAX_VARIABLE_REPEATS:
        found = f"{counted} variable repeats (at most {MAX_VARIABLE_REPEATS})"
    return found


# ---- parsing ------------------------------------------------------------------------------------
class _Reader(TableReader):
    error = ProfileError

    def regex(self, pattern: str, key: str) -> str:
        super().regex(pattern, key)
        if problem := pattern_problem(pattern):
            raise self.err(
                key,
                f"{pattern!r}: {problem}; such a pattern can take exponential time on a "
                "crafted value",
                fix="match the value with a plain pattern: anchors, literals, character "
                "classes and at most "
                f"{MAX_VARIABLE_REPEATS} repeats, none inside another (e.g. '^(a|aa)+$' -> '^a+$')",
            )
        return pattern


def _closed(
    p: _Reader, values: Iterable[str], accepted: Sequence[str], key: str, what: str, spellings=None
) -> None:
    for value in values:
        if value in accepted:
            continue
        near = (spellings or {}).get(value.lower()) or nearest(value, accepted)
        fix = (f"did you mean {near!r}? " if near else "") + f"accepted: {', '.join(accepted)}"
        raise p.err(key, f"{value!r} is not a {what} kernel-probe reports", fix=fix)


def _signals(p: _Reader, table: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("env", "files"):
        if key in table:
            out[key] = p.free_table(table, key, where)
            for k, v in out[key].items():
                if not isinstance(v, str):
                    said = "expected a regular expression string ('' = present)"
                    raise p.err(f"{where}{key}.{k}", said)
                p.regex(v, f"{where}{key}.{k}")
    for key in ("hostname", "slurm-cluster", "slurm-partition"):
        if key in table:
            out[key] = list(p.strings(table, key, where))
            for i, pattern in enumerate(out[key]):
                p.regex(pattern, f"{where}{key}[{i}]")
    if "device" not in table:
        return out
    dev = out["device"] = p.table(table, "device", DETECT_DEVICE_KEYS, where)
    for k, v in dev.items():
        if not isinstance(v, str):
            raise p.err(f"{where}device.{k}", f"expected a string, got {type(v).__name__}")
    if "type" in dev:
        _closed(p, [dev["type"]], cands.DEVICE_TYPES, f"{where}device.type", "device type")
    if "vendor" in dev:
        _closed(p, [dev["vendor"]], VENDORS, f"{where}device.vendor", "vendor")
    if "arch" in dev and (problem := cands.gpu_arch_problem(dev["arch"])):
        raise p.err(f"{where}device.arch", problem)
    return out


def _read_detect(p: _Reader, d: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    raw = p.table(d, "detect", (*SIGNALS, "all"), "")
    detect = _signals(p, raw, "detect.")
    tables = raw.get("all", [])
    if not isinstance(tables, list) or not all(isinstance(x, dict) for x in tables):
        raise p.err("detect.all", "expected an array of tables ([[detect.all]])")
    groups = []
    for i, group in enumerate(tables):
        p.no_unknown(group, SIGNALS, f"detect.all[{i}].")
        groups.append(_signals(p, group, f"detect.all[{i}]."))
    if "device" in detect and ([k for k in detect if k != "device"] or any(groups)):
        raise p.err(
            "detect.device",
            "a device signal next to site signals would pick this profile on any such device",
            fix="put it in a [[detect.all]] group with the site signal it qualifies "
            '(e.g. env = { BSC_MACHINE = "^mn5$" }, device = { type = "cuda" })',
        )
    for i, group in enumerate(groups):
        if not (set(group) & set(STRONG)) and not set(WEAK) <= set(group):
            raise p.err(
                f"detect.all[{i}]",
                f"this group ({', '.join(sorted(group)) or 'empty'}) can never decide: weak "
                "signals (hostname, slurm-partition) and the device do not identify a site alone",
                fix="add a strong signal (env, files, slurm-cluster), or require both hostname "
                "and slurm-partition",
            )
    return detect, groups


def _check_devices(p: _Reader, requires: Mapping[str, Any]) -> None:
    types = p.strings(requires, "device-type", "requires.")
    _closed(p, types, cands.DEVICE_TYPES, "requires.device-type", "device type")
    vendors = p.strings(requires, "device-vendor", "requires.")
    _closed(p, vendors, VENDORS, "requires.device-vendor", "device vendor")
    arches = p.strings(requires, "arch", "requires.")
    _closed(p, arches, CPU_ARCHES, "requires.arch", "CPU arch", _ARCH_SPELLINGS)
    gpu_types = [t for t in types if t in ("cuda", "rocm")] or ["cuda", "rocm"]
    for arch in p.strings(requires, "device-arch", "requires."):
        if problem := cands.gpu_arch_problem(arch, gpu_types):
            fix = "NVIDIA: sm_80, sm_90, sm_80+ (that or newer); AMD: gfx90a, gfx942 (exactly)"
            raise p.err("requires.device-arch", problem, fix=fix)
    count = requires.get("min-device-count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise p.err("requires.min-device-count", "expected a non-negative integer")
    accel = [t for t in types if t != "cpu"]
    if types and vendors and not any(DEVICE_VENDOR.get(t) in vendors for t in accel):
        why = "a CPU-only node has no accelerator vendor"
        why = "no such device has that vendor" if accel else why
        raise p.err(
            "requires.device-vendor",
            f"{', '.join(vendors)} contradicts requires.device-type {', '.join(types)}: {why}",
            fix="make them agree: " + ", ".join(f"{t} -> {v}" for t, v in DEVICE_VENDOR.items()),
        )
    if types and count and not accel:
        said = f"{count} accelerator(s) required, but requires.device-type allows only cpu"
        fix = "drop min-device-count, or require an accelerator type"
        raise p.err("requires.min-device-count", said, fix=fix)


def _check_libraries(
    p: _Reader, requires: Mapping[str, Any], declared: Iterable[cands.Candidate]
) -> tuple[str, ...]:
    site_libraries = p.strings(requires, "site-libraries", "requires.")
    libs = known_libraries()
    names = {lib.name for lib in libs} | {d for lib in libs for d in lib.distributions}
    names |= {*TRITON_DISTRIBUTIONS, *(c.distribution for c in declared if c.distribution)}
    tables = {key: p.free_table(requires, key, "requires.") for key in ("libraries", "forbidden")}
    for key, table in tables.items():
        for lib, spec in list(table.items()):
            p.specifier(spec, f"requires.{key}.{lib}")
            base, at, variant = lib.partition("@")
            if at:
                found = known(base)
                variants = [v.key for v in found.variants if v.usable] if found else []
                # variants are case-insensitive: NVIDIA is nvidia
                spelt = {v.lower(): v for v in variants}.get(variant.lower())
                if spelt is not None and spelt != variant:
                    table[f"{base}@{spelt}"] = table.pop(lib)
                    variant = spelt
                if variant not in variants:
                    fix = f"known variants: {', '.join(variants) or 'none'}"
                    fix += " (kernel_lock/registry.toml)"
                    said = f"{variant!r} is not a known variant of {base}"
                    raise p.err(f"requires.{key}.{lib}", said, fix=fix)
            elif base not in names and base not in site_libraries:
                close = nearest(base, names)
                raise p.err(
                    f"requires.{key}.{lib}",
                    f"unknown library {base!r}: a misspelt name would "
                    + ("forbid nothing" if key == "forbidden" else "never be found"),
                    fix=(f"did you mean {close!r}? " if close else "")
                    + "use a library of kernel_lock/registry.toml (`kernel-probe env` lists them), "
                    f"or declare a site's own distribution in requires.site-libraries = [{base!r}]",
                )
    for lib, spec in tables["forbidden"].items():
        for required, rspec in tables["libraries"].items():
            # forbidding a library forbids each of its variants; forbidding one leaves the others
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


def _slot_policy(p: _Reader, policy: Mapping[str, Any], slot: str, known: Mapping) -> SlotPolicy:
    where = f"policy.{slot}."
    sp = p.table(policy, slot, ("allowed", "preferred", "pin"), "policy.")
    allowed = p.strings(sp, "allowed", where) if "allowed" in sp else None
    preferred = p.strings(sp, "preferred", where)
    pin = p.string(sp, "pin", where)
    if pin is not None and not pin.strip():
        fix = "name a candidate id (e.g. torch.layer_norm), or remove the key"
        raise p.err(f"{where}pin", "an empty pin pins nothing", fix=fix)
    named = {"allowed": allowed or (), "preferred": preferred, "pin": (pin,) if pin else ()}
    for key, ids in named.items():
        for cid in ids:
            if (cand := known.get(cid)) is None:
                fix = "use an id from `kernel-probe check` (e.g. torch.layer_norm, liger.rms_norm)"
                fix += " or declare it in a [[candidate]] table"
                raise p.err(f"{where}{key}", f"unknown candidate id {cid!r}", fix=fix)
            if slot not in cand.slots:
                problem = f"candidate {cid!r} is for {', '.join(cand.slots)}, not {slot}"
                raise p.err(f"{where}{key}", problem)
    # `allowed = []` allows nothing: a preference or a pin is then a contradiction
    for key in ("preferred", "pin"):
        if allowed is not None and (out := [c for c in named[key] if c not in allowed]):
            raise p.err(f"{where}{key}", f"{out[0]!r} is not in policy.{slot}.allowed")
    return SlotPolicy(allowed, preferred, pin)


def _read_policy(p: _Reader, d: Mapping[str, Any], known: Mapping) -> dict[str, Any]:
    policy = p.table(d, "policy", _POLICY, "")

    def closed(key: str, accepted: Sequence[str]) -> None:
        value = p.string(policy, key, "policy.")
        if value is not None and value not in accepted:
            raise p.err(f"policy.{key}", f"{value!r} is not one of {', '.join(accepted)}")

    closed("precision", tuple(PRECISIONS))
    shapes = p.strings(policy, "shapes", "policy.")
    deterministic = policy.get("deterministic", False)
    if not isinstance(deterministic, bool):
        problem = f"expected true or false, got {type(deterministic).__name__}"
        raise p.err("policy.deterministic", problem)
    closed("probe-per", PROBE_PER)
    for i, s in enumerate(shapes):
        try:
            parse_shape(s)
        except ValueError as exc:
            raise p.err(f"policy.shapes[{i}]", str(exc).replace("--shape ", "")) from None
    slots = {slot: _slot_policy(p, policy, slot, known) for slot in SLOTS if slot in policy}
    out = dict(precision=policy.get("precision"), shapes=shapes, deterministic=deterministic)
    return out | dict(probe_per=policy.get("probe-per"), slots=slots)


def parse(text: str, path: str) -> Profile:
    """The profile in TOML ``text`` (from ``path``); ProfileError names the file, key and fix."""
    p = _Reader(path)
    try:
        d = toml.loads(text)
    except (toml.TOMLDecodeError, ValueError, RecursionError) as exc:  # a 5,000-digit integer
        raise p.err("", f"not valid TOML: {exc}") from None
    p.no_unknown(d, _TOP, "")
    version = p.string(d, "profile-version", "", required=True)
    if version != PROFILE_VERSION:
        problem = f"unsupported profile-version {version!r} (this kernel-probe reads "
        raise p.err("profile-version", problem + f"{PROFILE_VERSION!r})")
    name = p.string(d, "name", "", required=True)
    if not re.match(r"^[a-z0-9][a-z0-9._-]*$", name):
        raise p.err("name", f"{name!r}: use lower-case letters, digits, '.', '_' and '-'")
    help_line = p.string(d, "help", "", default="")
    if "\n" in help_line or len(help_line) > 300:
        raise p.err("help", "one line of at most 300 characters", fix="point to a page for more")
    detect, groups = _read_detect(p, d)
    requires = p.table(d, "requires", _REQUIRES, "")
    for key in _VERSIONS:
        if key in requires:
            p.specifier(requires[key], f"requires.{key}")
    builtin = cands.builtin()
    reserved = {b.id for b in builtin}
    declared = cands.read_candidates(p, d, source=f"profile:{name}", reserved=reserved)
    policy = _read_policy(p, d, {c.id: c for c in (*builtin, *declared)})
    strict = p.table(d, "strictness", ("default", "warn"), "")
    default = p.string(strict, "default", "strictness.", default="error")
    if default not in ("error", "warn"):
        raise p.err("strictness.default", f"{default!r} is not 'error' or 'warn'")
    warn = p.strings(strict, "warn", "strictness.")
    if unknown := [g for g in warn if g not in GROUPS]:
        raise p.err("strictness.warn", f"unknown group {unknown[0]!r}; groups: {', '.join(GROUPS)}")
    _check_devices(p, requires)
    site_libraries = _check_libraries(p, requires, declared)
    return Profile(
        name=name,
        description=p.string(d, "description", "", default=""),
        path=path,
        digest="sha256:" + hashlib.sha256(text.encode()).hexdigest(),
        sources=p.strings(d, "sources", ""),
        unknown=p.strings(d, "unknown", ""),
        detect=detect,
        requires=requires,
        **policy,
        candidates=declared,
        default_strictness=default,
        warn_groups=warn,
        detect_all=tuple(groups),
        help=help_line,
        site_libraries=site_libraries,
        document=d,
    )


def read_text(
    path: str, limit: int, error: type[InputFileError], missing: str, directory: str | None = None
) -> str:
    """The UTF-8 text of the regular file at ``path`` (at most ``limit`` bytes), else ``error``
    (exit 5) says why: ``missing``, the fix for no such file; ``directory``, for a directory."""
    try:
        return read_regular(path, limit).decode("utf-8")
    except FileNotFoundError:
        raise error("no such file", path=path, fix=missing) from None
    except UnsafeFile as exc:
        fix = directory if directory and "directory" in exc.problem else exc.fix
        raise error(exc.problem, path=path, fix=fix or None) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read: {exc}", path=path) from None


def load_file(path: str | os.PathLike[str]) -> Profile:
    """The profile file at ``path``, read through the safe reader (:func:`read_text`), parsed."""
    p = str(Path(path))
    missing = "check the path, or use `kernel-probe profiles list`"
    directory = "pass a .toml file, or use --profiles-dir"
    return parse(read_text(p, MAX_BYTES, ProfileError, missing, directory), p)
