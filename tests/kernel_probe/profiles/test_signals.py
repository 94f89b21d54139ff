"""kernel_probe.profiles: the site-signal patterns, bounded (catastrophic patterns refused,
long values not matched)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from kernel_probe import profile_match, profiles, sites
from kernel_probe.profiles import parse
from tests.kernel_probe.profiles.cases import BUILTIN, CATASTROPHIC, GPU_PROFILE, PLAIN, check


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_catastrophic_patterns_are_refused_at_check(pattern, tmp_path, capsys):
    text = GPU_PROFILE.replace('MYSITE = ""', f"KP_SITE = '{pattern}'")
    code, said = check(tmp_path, text, capsys)
    assert code == 5 and "'detect.env.KP_SITE'" in said and "exponential time" in said, said


@pytest.mark.parametrize("pattern", PLAIN)
def test_plain_patterns_pass(pattern):
    assert profiles.pattern_problem(pattern) is None


def test_every_builtin_pattern_is_plain():
    for name in BUILTIN:
        prof = sites.resolve(name, [])
        for table in (prof.detect, *prof.detect_all):
            for key in ("env", "files"):
                for pattern in table.get(key, {}).values():
                    assert profiles.pattern_problem(pattern) is None, (name, pattern)
            for key in ("hostname", "slurm-cluster", "slurm-partition"):
                for pattern in table.get(key, []):
                    assert profiles.pattern_problem(pattern) is None, (name, pattern)


def test_a_long_value_is_not_matched_and_the_match_is_bounded(tmp_path):
    # the worst pattern check lets through, on the longest value matched: milliseconds, not hours
    prof = parse(GPU_PROFILE.replace('MYSITE = ""', "KP_SITE = '^[a-z]*[a-z]*!$'"), "x.toml")
    value = "a" * profiles.MAX_SIGNAL_CHARS
    facts = sites.SiteFacts({"KP_SITE": value}, "", {}, {}, dict().get)
    start = time.perf_counter()
    assert profile_match.detect(prof, facts) is None
    assert time.perf_counter() - start < 2.0
    notes: list[str] = []
    long = replace(facts, env={"KP_SITE": "a" * 10_000 + "!"})
    assert profile_match.detect(prof, long, notes) is None
    assert any("10001 characters long" in n and "not matched" in n for n in notes)
