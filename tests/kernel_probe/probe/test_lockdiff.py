"""kernel_probe.probe.derive.lock_differences: what changed between two locks (top-level keys,
environment, slots, and what they were probed for: kernel_probe.probe.stale, as --check)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from kernel_lock import toml
from kernel_lock.model import Model, Site
from kernel_probe.probe.derive import lock_differences
from tests.conftest import MINIMAL_LOCK, edited_lock, sealed_lock

HEAD = 'created-by = "hand"\n'
ENV = '[environment]\ndevice-type = { value = "cpu", match = "exact" }\n'


def profile(name: str, digest: str) -> str:
    return f'{HEAD}\n[profile]\nname = "{name}"\ndigest = "sha256:{digest * 64}"\n'


def diff(a: str, b: str):
    return lock_differences(sealed_lock(a), sealed_lock(b))


def test_a_lock_does_not_differ_from_itself():
    empty = {"lock": [], "environment": [], "slots": [], "probe": []}
    assert diff(MINIMAL_LOCK, MINIMAL_LOCK) == empty


@pytest.mark.parametrize(
    "edit,expected",
    [
        ({HEAD: HEAD + 'precision = "32-true"\n'}, {"key": "precision", "a": "", "b": "32-true"}),
        ({HEAD: HEAD + 'mode = "inference"\n'}, {"key": "mode", "a": "training", "b": "inference"}),
        (
            {'lock-version = "1.0"': 'lock-version = "1.1"'},
            {"key": "lock-version", "a": "1.0", "b": "1.1"},
        ),
    ],
)
def test_top_level_differences(edit, expected):
    result = diff(MINIMAL_LOCK, edited_lock(**edit))
    assert expected in result["lock"]
    assert result["slots"] == [] and result["environment"] == [] and result["probe"] == []


@pytest.mark.parametrize(
    "a,b,expected",
    [
        # the same profile name with another digest is another policy
        (("p", "a"), ("p", "b"), "profile p changed since the lock was written (digest sha256:aaa"),
        (("p", "a"), ("q", "b"), "it was written under profile p, this run applies q"),
        (None, ("q", "b"), "it was written under profile none, this run applies q"),
        (("p", "a"), None, "it was written under profile p and this run applies none"),
    ],
)
def test_profile_differences(a, b, expected):
    texts = [edited_lock(**{HEAD: profile(*x)}) if x else MINIMAL_LOCK for x in (a, b)]
    result = diff(*texts)
    assert result["lock"] == [] and [d["what"] for d in result["probe"]] == ["profile"]
    assert result["probe"][0]["why"].startswith(expected)
    assert result["probe"][0]["b"] == (
        {"name": b[0], "digest": "sha256:" + b[1] * 64} if b else {"name": None, "digest": None}
    )


def test_the_same_profile_does_not_differ():
    same = edited_lock(**{HEAD: profile("p", "a")})
    assert diff(same, same)["probe"] == []


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


# ---- what they were probed for (issue 56: `diff` saw none of what --check sees) ------------------
def probed(shapes: str, attention: str, liger: str, model: str = "") -> str:
    """MINIMAL_LOCK as probed with these options and liger-kernel ("": not installed)."""
    options = (
        f'options = {{ shapes = "{shapes}", attention = "{attention}", precision = "32-true" }}'
    )
    digest = hashlib.sha256(f"{shapes} {attention}".encode()).hexdigest()
    libraries = f'libraries = {{ apex = "", liger-kernel = "{liger}" }}'
    provenance = f'provenance = {{ inputs = "sha256:{digest}", {options}, {libraries} }}\n'
    return edited_lock(**{HEAD: HEAD + provenance}) + model


def test_other_shapes_geometry_and_libraries_are_named():
    a = probed("64x32", "4x32x256", "")
    b = probed("2048x1024", "16x64x1024:window=128", "0.8.5")
    result = diff(a, b)
    assert result["lock"] == result["environment"] == result["slots"] == []
    found = {d["what"]: d for d in result["probe"]}
    assert list(found) == ["options", "libraries"]
    options = found["options"]
    assert options["a"] == {"shapes": "64x32", "attention": "4x32x256"}
    assert options["b"] == {"shapes": "2048x1024", "attention": "16x64x1024:window=128"}
    assert "--shape: 64x32 -> 2048x1024" in options["why"]
    assert "--attention: 4x32x256 -> 16x64x1024:window=128" in options["why"]
    libraries = found["libraries"]
    assert libraries["a"] == {"liger-kernel": ""} and libraries["b"] == {"liger-kernel": "0.8.5"}
    assert "liger-kernel is installed now (0.8.5) but was not" in libraries["why"]
    # the same options and libraries: nothing
    assert diff(a, probed("64x32", "4x32x256", ""))["probe"] == []


def test_another_model_is_named_with_its_sites():
    norm = Site(slot="LayerNorm", where="norm", call="torch.nn.LayerNorm", shapes=("8x64",))
    models = [
        Model.of("m.py:build", (replace(norm, shapes=(shape,)),)) for shape in ("8x64", "8x128")
    ]
    a, b = (MINIMAL_LOCK + "\n" + toml.dumps({"model": m.to_dict()}) for m in models)
    found = diff(a, b)["probe"]
    assert [d["what"] for d in found] == ["model"]
    assert found[0]["why"] == (
        "it was probed for another model or other sizes: norm: shapes ['8x64'] in the lock, "
        "['8x128'] in the model"
    )
    assert found[0]["a"] == f"m.py:build ({models[0].digest})"
    assert "not probed for a model" in diff(MINIMAL_LOCK, a)["probe"][0]["why"]
    assert "probed for the model m.py:build" in diff(a, MINIMAL_LOCK)["probe"][0]["why"]
