"""kernel_lock.fingerprint: release numbers of versions as machines report them, and PEP 440
specifiers."""

from __future__ import annotations

import pytest

from kernel_lock.fingerprint import in_spec, release, release_text

# (text, release numbers)
RELEASES = [
    ("6.2.41134-65d174c3e", (6, 2, 41134)),  # torch.version.hip of ROCm wheels up to 2.9
    ("6.3.60300", (6, 3, 60300)),
    ("580.159.04", (580, 159, 4)),
    ("2.7.1+rocm6.2.4", (2, 7, 1)),
    ("12.4", (12, 4)),
    ("v1.2", (1, 2)),
    ("  3.11.7", (3, 11, 7)),
    ("2.6.0a0+git1234", (2, 6, 0)),
    ("1.2.3.4.5.6.7.8.9.10", (1, 2, 3, 4, 5, 6, 7, 8)),  # at most 8 parts
    ("7", (7,)),
    ("", ()),
    ("unknown", ()),
    ("N/A", ()),
    ("-1.0", ()),
]


@pytest.mark.parametrize("text,numbers", RELEASES)
def test_release(text, numbers):
    assert release(text) == numbers
    assert release_text(text) == ".".join(str(n) for n in numbers)


def test_release_of_a_non_string():
    assert release(12) == (12,) and release_text(None) == ""


# (spec, text, satisfies)
SPECS = [
    (">=6.2", "6.2.41134-65d174c3e", True),
    (">=6.3", "6.2.41134-65d174c3e", False),
    (">=2.4", "2.7.1+rocm6.2.4", True),
    ("<2.7", "2.7.1+rocm6.2.4", False),
    (">=2.5", "2.6.0a0+git1234", True),  # a pre-release counts (a site's nightly)
    (">=2.6", "2.6.0a0+git1234", False),  # ... compared as itself: before 2.6.0
    ("==12.4.*", "12.4", True),
    (">=550", "580.159.04", True),
    (">=550,<580", "580.159.04", False),
    ("", "1.0", True),
    (">=1", "", False),
    (">=1", "unknown", False),
    (">=0", "unknown", False),
]


@pytest.mark.parametrize("spec,text,ok", SPECS)
def test_in_spec(spec, text, ok):
    assert in_spec(spec, text) is ok
