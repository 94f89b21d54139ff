"""kernel_probe.probe.derive.lock_differences: what changed between two locks (top-level keys,
environment, slots)."""

from __future__ import annotations

import pytest

from kernel_probe.probe.derive import lock_differences
from tests.conftest import MINIMAL_LOCK, edited_lock, sealed_lock

HEAD = 'created-by = "hand"\n'
ENV = '[environment]\ndevice-type = { value = "cpu", match = "exact" }\n'


def profile(name: str, digest: str) -> str:
    return f'{HEAD}\n[profile]\nname = "{name}"\ndigest = "sha256:{digest * 64}"\n'


def diff(a: str, b: str):
    return lock_differences(sealed_lock(a), sealed_lock(b))


def test_a_lock_does_not_differ_from_itself():
    assert diff(MINIMAL_LOCK, MINIMAL_LOCK) == {"lock": [], "environment": [], "slots": []}


@pytest.mark.parametrize(
    "edit,expected",
    [
        ({HEAD: HEAD + 'precision = "32-true"\n'}, {"key": "precision", "a": "", "b": "32-true"}),
        ({HEAD: HEAD + 'mode = "inference"\n'}, {"key": "mode", "a": "training", "b": "inference"}),
        (
            {'lock-version = "1.0"': 'lock-version = "1.1"'},
            {"key": "lock-version", "a": "1.0", "b": "1.1"},
        ),
        ({HEAD: profile("site", "a")}, {"key": "profile", "a": None, "b": "site"}),
    ],
)
def test_top_level_differences(edit, expected):
    result = diff(MINIMAL_LOCK, edited_lock(**edit))
    assert expected in result["lock"]
    assert result["slots"] == [] and result["environment"] == []


@pytest.mark.parametrize(
    "a,b,expected",
    [
        # the same profile name with another digest is another policy
        (
            ("p", "a"),
            ("p", "b"),
            [{"key": "profile-digest", "a": "sha256:" + "a" * 64, "b": "sha256:" + "b" * 64}],
        ),
        # another name: the name says it, the digest is not listed besides
        (("p", "a"), ("q", "b"), [{"key": "profile", "a": "p", "b": "q"}]),
        (("p", "a"), ("p", "a"), []),
    ],
)
def test_profile_differences(a, b, expected):
    result = diff(edited_lock(**{HEAD: profile(*a)}), edited_lock(**{HEAD: profile(*b)}))
    assert result["lock"] == expected


@pytest.mark.parametrize(
    "edit,expected",
    [
        (
            {'"cpu", match = "exact"': '"cuda", match = "exact"'},
            {
                "field": "device-type",
                "a": {"value": "cpu", "match": "exact"},
                "b": {"value": "cuda", "match": "exact"},
            },
        ),
        (  # the match rule alone is a difference
            {'"cpu", match = "exact"': '"cpu", match = "ignore"'},
            {
                "field": "device-type",
                "a": {"value": "cpu", "match": "exact"},
                "b": {"value": "cpu", "match": "ignore"},
            },
        ),
        (
            {ENV: ENV + 'torch = { value = "2.5.1", match = "compatible" }\n'},
            {"field": "torch", "a": None, "b": {"value": "2.5.1", "match": "compatible"}},
        ),
        (
            {
                ENV: ENV + '\n[environment.libraries]\nliger-kernel = { value = "0.5.2", match = '
                '"compatible" }\n'
            },
            {
                "field": "libraries.liger-kernel",
                "a": None,
                "b": {"value": "0.5.2", "match": "compatible"},
            },
        ),
    ],
)
def test_environment_differences(edit, expected):
    result = diff(MINIMAL_LOCK, edited_lock(**edit))
    assert result["environment"] == [expected]
    # and the other way round
    back = diff(edited_lock(**edit), MINIMAL_LOCK)["environment"]
    assert back == [{**expected, "a": expected["b"], "b": expected["a"]}]


def test_a_library_differs_by_version_not_by_match():
    lib = '\n[environment.libraries]\nliger-kernel = { value = "0.5.2", match = "%s" }\n'
    a = edited_lock(**{ENV: ENV + lib % "compatible"})
    b = edited_lock(**{ENV: ENV + lib % "exact"})
    assert diff(a, b)["environment"] == []


@pytest.mark.parametrize(
    "edit,expected",
    [
        (
            {"kwargs = { eps = 1e-6 }\n": "kwargs = { eps = 1e-5 }\n"},  # the first: LayerNorm
            [{"slot": "LayerNorm", "key": "kwargs", "a": {"eps": 1e-6}, "b": {"eps": 1e-5}}],
        ),
        (
            {
                'implementation = "torch.linear"\ntarget = "torch.nn.Linear"': "implementation = "
                '"torch.linear.cublas"\ntarget = "torch.nn.Linear"'
            },
            [
                {
                    "slot": "Linear",
                    "key": "implementation",
                    "a": "torch.linear",
                    "b": "torch.linear.cublas",
                }
            ],
        ),
        (
            {
                '[slots.RMSNorm]\nimplementation = "torch.rms_norm"\ntarget = '
                '"torch.nn.RMSNorm"\nsemantics = '
                '"rms_norm"\n'
                "kwargs = { eps = 1e-6 }\n": ""
            },
            [
                {"slot": "RMSNorm", "key": "implementation", "a": "torch.rms_norm", "b": None},
                {"slot": "RMSNorm", "key": "target", "a": "torch.nn.RMSNorm", "b": None},
                {"slot": "RMSNorm", "key": "kwargs", "a": {"eps": 1e-6}, "b": None},
            ],
        ),
    ],
)
def test_slot_differences(edit, expected):
    result = diff(MINIMAL_LOCK, edited_lock(**edit))
    assert result["slots"] == expected and result["lock"] == []
