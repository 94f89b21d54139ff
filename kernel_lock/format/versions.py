"""Version strings as machines report them, compared by their release part.

``torch.version.hip`` of PyTorch's ROCm wheels up to 2.9 carries a git hash
(``6.2.41134-65d174c3e``, pytorch issues #166068, #166085), which PEP 440 cannot parse; drivers
report ``6.3.60300`` or ``580.159.04``; torch reports ``2.7.1+rocm6.2.4``. One rule for all of them,
used by the fingerprint, the site profiles and the library requirements alike: the leading dotted
numbers are the release, everything after them (a local tag, a hash, a suffix) is ignored.
"""

from __future__ import annotations

import re

__all__ = [
    "in_spec",
    "release",
    "release_text",
]

_LEADING = re.compile(r"\s*v?([0-9]+(?:\.[0-9]+)*)", re.ASCII)


def release(text: str) -> tuple[int, ...]:
    """The release numbers of ``text``: ``'6.2.41134-65d174c3e'`` -> ``(6, 2, 41134)``; ``()`` if
    none."""
    m = _LEADING.match(str(text))
    if not m:
        return ()
    return tuple(int(part) for part in m.group(1).split(".")[:8])


def release_text(text: str) -> str:
    """``'6.2.41134-65d174c3e'`` -> ``'6.2.41134'``; ``''`` when there is no release."""
    return ".".join(str(n) for n in release(text))


def in_spec(spec: str, text: str) -> bool:
    """Does ``text``'s release satisfy the PEP 440 specifier ``spec``? A version without a release
    never does.

    Pre-releases count (a site's nightly build is still that release); a PEP 440 version compares
    as itself, anything else by its release part.
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if not text:
        return False
    try:
        version = Version(text)
    except InvalidVersion:
        numbers = release_text(text)
        if not numbers:
            return False
        version = Version(numbers)
    return SpecifierSet(spec).contains(version, prereleases=True)
