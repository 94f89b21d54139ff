"""kernel_lock.fingerprint: the fields' catalogue, the match rules, and the comparison with a
lock."""

from __future__ import annotations

import pytest

from kernel_lock.errors import Difference
from kernel_lock.fingerprint import (
    BUILD_FIELDS,
    DEVICE_FIELDS,
    FIELDS,
    NUMERICS_ENV,
    compare,
    device_name_note,
    field_matches,
    library_versions,
    numerics_env,
    unchecked_fields,
)
from kernel_lock.schema import MATCH_RULES, EnvField


def test_the_catalogue():
    assert set(DEVICE_FIELDS) | set(BUILD_FIELDS) <= set(FIELDS)
    for name, spec in FIELDS.items():
        assert spec.default_match in MATCH_RULES, name
        assert spec.kind in ("version", "text", "count"), name
        assert spec.doc, name
        assert (spec.kind == "count") == (spec.type is int), name
    assert (
        FIELDS["device-count"].default_match == "ignore"
        and FIELDS["torch"].default_match == "compatible"
    )


# (kind, rule, expected, found, matches)
MATCHES = [
    ("version", "ignore", "2.6.0", "9.9", True),
    ("text", "ignore", "x86_64", None, True),
    ("version", "exact", "2.6.0", "2.6.0", True),
    ("version", "exact", "2.6.0", "2.6.1", False),
    ("version", "compatible", "2.6.0", "2.6.3", True),  # a patch keeps the lock valid
    ("version", "compatible", "2.6.0", "2.7.0", False),  # a minor does not
    ("version", "compatible", "2.6.0+cu124", "2.6.1+cu126", True),
    ("version", "compatible", "6.2.41134-65d174c3e", "6.2.41133-abc", True),
    ("version", "compatible", "580.159.04", "580.65.06", False),
    ("version", "compatible", "12", "12.4", False),  # one number: not the same major.minor
    ("version", "compatible", "", "", True),
    ("version", "compatible", "", "12.4", False),  # a CPU build against a CUDA one
    ("version", "compatible", "12.4", "", False),
    ("version", "compatible", "12.4", None, False),
    ("version", "compatible", "unknown", "unknown", True),  # no release: compared as text
    ("version", "compatible", "unknown", "other", False),
    ("text", "compatible", "linux", "linux", True),  # compatible on text is equality
    ("text", "compatible", "linux", "Linux", False),
    ("count", "compatible", 8, 8, True),
    ("count", "exact", 8, 4, False),
]


@pytest.mark.parametrize("kind,rule,expected,found,ok", MATCHES)
def test_field_matches(kind, rule, expected, found, ok):
    assert field_matches(kind, rule, expected, found) is ok


def test_compare_lists_every_difference():
    expected = {
        "torch": EnvField(value="2.6.0", match="compatible"),
        "arch": EnvField(value="x86_64", match="exact"),
        "device-count": EnvField(value=8, match="ignore"),
        "python": EnvField(value="3.11.7", match="compatible"),
        # a newer kernel-probe's field: not checked
        "future-field": EnvField(value="x", match="exact"),
    }
    found = {"torch": "2.7.1", "arch": "x86_64", "device-count": 1, "python": "3.11.9"}
    libraries = {
        "liger-kernel": EnvField(value="0.5.2", match="compatible"),
        "apex": EnvField(value="0.1", match="exact"),
        "quack": EnvField(value="1.0", match="ignore"),
        "triton": EnvField(value="3.1.0", match="compatible"),
    }
    installed = {"liger-kernel": "0.6.0", "apex": None, "quack": None, "triton": "3.1.5"}
    assert compare(expected, found, libraries, installed) == [
        Difference("torch", "2.6.0", "2.7.1", "compatible"),
        Difference("libraries.liger-kernel", "0.5.2", "0.6.0", "compatible"),
        Difference("libraries.apex", "0.1", "not installed", "exact"),
    ]
    assert compare({}, found, {}, {}) == []
    assert compare({"arch": EnvField(value="x86_64")}, {}, {}, {}) == [
        Difference("arch", "x86_64", None, "exact")
    ]


def test_unchecked_fields():
    assert unchecked_fields({"torch": 1, "future-field": 2, "other": 3}) == [
        "future-field",
        "other",
    ]
    assert unchecked_fields({name: 1 for name in FIELDS}) == []


@pytest.mark.parametrize(
    "env,text",
    [
        ({}, ""),
        ({"PATH": "/bin"}, ""),
        ({"HSA_XNACK": "1"}, "HSA_XNACK=1"),
        (
            {
                "TORCH_BLAS_PREFER_HIPBLASLT": "0",
                "ROCBLAS_INTERNAL_FP16_ALT_IMPL": "1",
                "HOME": "/h",
            },
            # NUMERICS_ENV's order
            "ROCBLAS_INTERNAL_FP16_ALT_IMPL=1;TORCH_BLAS_PREFER_HIPBLASLT=0",
        ),
        ({"HSA_XNACK": ""}, "HSA_XNACK="),  # set but empty is still set
    ],
)
def test_numerics_env(env, text):
    assert numerics_env(env) == text


def test_numerics_env_reads_this_process_by_default(monkeypatch):
    for name in NUMERICS_ENV:
        monkeypatch.delenv(name, raising=False)
    assert numerics_env() == ""
    monkeypatch.setenv("PYTORCH_TUNABLEOP_ENABLED", "1")
    assert numerics_env() == "PYTORCH_TUNABLEOP_ENABLED=1"


@pytest.mark.parametrize(
    "current,noted",
    [
        (
            {"device-type": "rocm", "device-name": "AMD Radeon Graphics", "device-arch": "gfx90a"},
            True,
        ),
        ({"device-type": "cuda", "device-name": "", "device-arch": "sm_90"}, True),
        ({"device-type": "rocm"}, True),
        (
            {"device-type": "rocm", "device-name": "AMD Instinct MI250X", "device-arch": "gfx90a"},
            False,
        ),
        ({"device-type": "cpu", "device-name": ""}, False),
        ({}, False),
    ],
)
def test_device_name_note(current, noted):
    note = device_name_note(current)
    assert (note is not None) is noted
    if noted:
        assert "does not identify the device" in note and repr(current.get("device-arch")) in note


def test_library_versions_reads_metadata_only():
    import pytest as pytest_module

    got = library_versions(["pytest", "no-such-distribution-kp"])
    assert got == {"pytest": pytest_module.__version__, "no-such-distribution-kp": None}
    assert library_versions([]) == {}
