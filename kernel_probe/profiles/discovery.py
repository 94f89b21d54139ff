"""Finding profiles: the built-ins shipped as package data, the user's directories, and a profile by
name.

``--profiles-dir`` directories come first, then ``$KERNEL_PROBE_PROFILES``, then the built-ins; the
first profile of a name wins and every shadowing is noted. Nothing is parsed until a profile is
asked for: ``survey`` reads the directories when it is called, never at import.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kernel_probe.errors import InputFileError, UsageError
from kernel_probe.profiles.format import MAX_BYTES, Profile, ProfileError, from_bytes, load_file

ENV_VAR = "KERNEL_PROBE_PROFILES"
BUILTIN_PACKAGE_DIR = (
    "sites"  # package data of kernel_probe.profiles; pyproject.toml's package-data names it too
)


class BuiltinProfilesMissing(InputFileError):
    """No built-in profile where the package ships them (exit 5): a broken installation, said loudly
    rather than listed as an empty table."""


def builtin_dir() -> Path:
    """The built-in profiles: package data of kernel_probe, found through importlib.resources, so a
    checkout, a venv, ``pip install --target``, ``--prefix`` and ``--user`` all find them the same
    way."""
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
    """Every profile found (by name: the first directory wins), the broken files, and notes:
    shadowed built-ins, duplicate names, a file named unlike its profile, files that are not
    profiles."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    broken: list[ProfileError] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (profile name or "", text)

    def notes_for(self, name: str | None = None) -> list[str]:
        """The survey's notes about profile ``name`` and the general ones (all notes when None)."""
        return [text for n, text in self.notes if name is None or n in (name, "")]


def survey(extra: Iterable[str] = ()) -> Survey:
    """Every valid profile of the user directories, then the built-ins (see :class:`Survey`); one
    broken file must not hide every other profile."""
    from kernel_lock.files import UnsafeFile, read_regular

    builtin = builtin_dir()
    if not (builtin.is_dir() and any(builtin.glob("*.toml"))):
        raise BuiltinProfilesMissing(
            "no built-in site profiles here: this kernel-probe installation is incomplete",
            path=str(builtin),
            fix="reinstall kernel-probe; the built-ins ship inside the package as "
            f"kernel_probe/{BUILTIN_PACKAGE_DIR}/*.toml",
        )
    out = Survey()
    for d in [*user_dirs(extra), builtin]:
        if not d.is_dir():
            raise UsageError(
                f"profiles directory {d} does not exist (from --profiles-dir or ${ENV_VAR})"
            )
        skipped = []
        for f in sorted(d.glob("*.toml")):
            try:
                raw = read_regular(f, MAX_BYTES)  # once: what is sniffed is what is parsed
                if not _DECLARES_PROFILE.search(raw):
                    skipped.append(f.name)
                    continue
                prof = from_bytes(raw, str(f))
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
                out.notes.append(
                    (prof.name, f"{first.path} shadows the built-in profile {prof.name!r}")
                )
            elif Path(first.path).parent == d:
                out.notes.append(
                    (
                        prof.name,
                        f"two profiles named {prof.name!r} in {d}: {Path(first.path).name} "
                        f"is used, {f.name} is ignored (rename one)",
                    )
                )
            else:
                out.notes.append(
                    (prof.name, f"{f} is shadowed by {first.path} (an earlier directory wins)")
                )
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


def names_file(spec: str) -> bool:
    """Whether ``--profile`` names a profile file (anything with a '/' or ending in .toml) rather
    than a profile by its name."""
    return "/" in spec or spec.endswith(".toml")


def resolve(spec: str, extra: Iterable[str] = (), found: Survey | None = None) -> Profile:
    """A profile by name, or by path (:func:`names_file`)."""
    if names_file(spec):
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
            + (
                f"; {len(broken)} profile file(s) are broken: `kernel-probe profiles list` "
                "names them"
                if broken
                else ""
            )
        )
    return found.profiles[spec]
