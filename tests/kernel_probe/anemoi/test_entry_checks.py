"""kernel_probe/anemoi/entries.py: one layer_kernels entry against anemoi, in-process (the same
function check-config's child runs): the key, the import, the signature, the semantics."""

from __future__ import annotations

import pytest
import torch

from kernel_probe.anemoi.entries import (
    check_entries,
    check_entry,
    constructor_defaults,
    key_suggestion,
    norm_family,
)

ENTRIES = [
    # key, entry, severity, kind, words
    ("Layernorm", {"_target_": "torch.nn.LayerNorm"}, "error", "key", "did you mean 'LayerNorm'"),
    ("querynorm", {"_target_": "torch.nn.LayerNorm"}, "error", "key", "did you mean 'QueryNorm'"),
    ("LayerNorm", {"_target_": "nolib.FastNorm"}, "error", "import", "No module named 'nolib'"),
    (
        "LayerNorm",
        {"_target_": "torch.nn.NoSuchNorm"},
        "error",
        "import",
        "has no attribute 'NoSuchNorm'",
    ),
    (
        "LayerNorm",
        {"_target_": "kp_zoo.missing_dependency.X"},
        "error",
        "import",
        "does not import here",
    ),
    ("LayerNorm", {"eps": 1e-5}, "error", "entry", "no _target_"),
    ("LayerNorm", "torch.nn.LayerNorm", "error", "entry", "expected a mapping"),
    (
        "LayerNorm",
        {"_target_": "kp_zoo.norms.HiddenSizeLayerNorm"},
        "error",
        "signature",
        "LayerNorm(normalized_shape=C) fails: missing a required argument: 'hidden_size'",
    ),
    (
        "QueryNorm",
        {"_target_": "torch.nn.LayerNorm", "unknown_kw": 1},
        "error",
        "signature",
        "QueryNorm(head_dim) fails",
    ),
    (
        "Linear",
        {"_target_": "kp_zoo.norms.GoodLinear", "init": "xavier"},
        "error",
        "signature",
        "Linear(in, out) fails",
    ),
    (
        "Activation",
        {"_target_": "torch.nn.GELU", "approximate": "tanh", "dim": 3},
        "error",
        "signature",
        "Activation() fails",
    ),
    (
        "LayerNorm",
        {"_target_": "torch.nn.RMSNorm", "eps": 1e-6},
        "error",
        "semantics",
        "RMSNorm under the LayerNorm key",
    ),
    (
        "KeyNorm",
        {"_target_": "kp_zoo.norms.GoodRMSNorm"},
        "error",
        "semantics",
        "RMSNorm under the KeyNorm key",
    ),
    (
        "Linear",
        {"_target_": "torch.nn.LayerNorm"},
        "error",
        "semantics",
        "a norm (layer_norm) under the Linear key",
    ),
    ("Activation", {"_target_": "torch.nn.GLU"}, "error", "semantics", "GLU-family"),
    (
        "LayerNorm",
        {"_target_": "torch.nn.LayerNorm", "normalized_shape": 64},
        "warning",
        "dimension",
        "multiple values",
    ),
    ("LayerNorm", {"_target_": "torch.nn.LayerNorm", "_args_": [64]}, "warning", "entry", "_args_"),
]


@pytest.mark.parametrize(
    "key,entry,severity,kind,words",
    ENTRIES,
    ids=[f"{e[0]}-{e[3]}-{i}" for i, e in enumerate(ENTRIES)],
)
def test_entry_findings(key, entry, severity, kind, words):
    found, _ = check_entry(key, entry, f"model.layer_kernels.{key}")
    hits = [f for f in found if f.kind == kind]
    assert hits, found
    assert hits[0].severity == severity and hits[0].where == f"model.layer_kernels.{key}"
    assert words in f"{hits[0].problem} fix: {hits[0].fix}"


@pytest.mark.parametrize(
    "key,entry",
    [
        ("LayerNorm", {"_target_": "torch.nn.LayerNorm", "eps": 1e-5, "bias": False}),
        ("LayerNorm", {"_target_": "kp_zoo.norms.GoodLayerNorm", "_partial_": True}),
        pytest.param(  # compiles C++ with torch.compile on a CPU: seconds
            "LayerNorm",
            {"_target_": "kernel_lock.adapters.CompiledLayerNorm"},
            marks=pytest.mark.slow,
        ),
        ("QueryNorm", {"_target_": "torch.nn.LayerNorm", "bias": False}),
        ("Linear", {"_target_": "torch.nn.Linear", "bias": False}),
        ("Linear", {"_target_": "kp_zoo.norms.GoodLinear"}),
        ("Activation", {"_target_": "torch.nn.SiLU"}),
    ],
)
def test_entries_that_fit(key, entry):
    found, facts = check_entry(key, entry, "x")
    assert found == [] and facts["imported"]


def test_semantics_change_can_be_declared_deliberate():
    found, facts = check_entry(
        "LayerNorm", {"_target_": "torch.nn.RMSNorm"}, "x", allow_semantics_change=True
    )
    assert [(f.severity, f.kind) for f in found] == [("warning", "semantics")] and facts[
        "family"
    ] == "rms_norm"


@pytest.mark.parametrize(
    "key,entry,severity,kind,words",
    [
        (
            "LayerNorm",
            {"_target_": "kp_zoo.norms.GoodLayerNorm", "_recursive_": False},
            "warning",
            "entry",
            "_recursive_",
        ),
        (
            "LayerNorm",
            {"_target_": "torch.nn.functional.layer_norm"},
            "error",
            "signature",
            "does not fit",
        ),
        (
            "LayerNorm",
            {"_target_": "torch.float32"},
            "error",
            "entry",
            "is a dtype, not a class anemoi can call",
        ),
        (
            "Activation",
            {"_target_": "collections.OrderedDict"},
            "error",
            "entry",
            "not a torch.nn.Module subclass",
        ),
        (
            "Linear",
            {"_target_": "torch.nn.Linear", "in_features": 8, "out_features": 4},
            "warning",
            "dimension",
            "'in_features'",
        ),
        ("LayerNorm", {"_target_": ""}, "error", "entry", "no _target_"),
        ("LayerNorm", {"_target_": 3}, "error", "entry", "no _target_"),
    ],
    ids=[
        "hydra-option",
        "function",
        "not-callable",
        "not-a-module",
        "linear-dims",
        "empty-target",
        "int-target",
    ],
)
def test_more_entry_findings(key, entry, severity, kind, words):
    found, _ = check_entry(key, entry, "w")
    hits = [f for f in found if f.kind == kind]
    assert hits and hits[0].severity == severity and words in hits[0].problem + hits[0].fix, found


def test_an_unknown_key_stops_before_anything_is_imported():
    found, facts = check_entry("Norm", {"_target_": "kp_no_such_module.X"}, "w")
    assert [f.kind for f in found] == ["key"]  # no import finding: nothing was looked at
    assert facts == {"target": None, "imported": False, "family": None, "defaults": {}}


def test_facts_of_an_entry_that_imports():
    found, facts = check_entry("LayerNorm", {"_target_": "torch.nn.LayerNorm", "eps": 1e-6}, "w")
    assert found == [] and facts["target"] == "torch.nn.LayerNorm" and facts["imported"]
    assert facts["family"] == "layer_norm"
    assert facts["defaults"]["eps"] == 1e-5 and facts["defaults"]["bias"] is True
    _, facts = check_entry("LayerNorm", {"_target_": "nolib.X"}, "w")
    assert facts["target"] == "nolib.X" and not facts["imported"]


def test_a_signature_error_names_the_adapter_where_a_table_row_has_one(monkeypatch):
    from kernel_lock import registry

    entry = {"_target_": "kp_zoo.norms.HiddenSizeLayerNorm"}
    [f] = [f for f in check_entry("LayerNorm", entry, "w")[0] if f.kind == "signature"]
    assert (
        f.fix
        == "use a class whose constructor takes anemoi's arguments, or a thin subclass adapting it"
    )
    monkeypatch.setitem(
        registry.SIZE_ADAPTERS,
        "HiddenSizeLayerNormAnemoi",
        ("kp_zoo.norms.HiddenSizeLayerNorm", "hidden_size"),
    )
    [f] = [f for f in check_entry("LayerNorm", entry, "w")[0] if f.kind == "signature"]
    assert f.fix.startswith("use `_target_: kernel_lock.adapters.HiddenSizeLayerNormAnemoi`")


class MyRMSNormAdapter(torch.nn.RMSNorm):
    pass


class ConditionalLayerNormLike(torch.nn.Module):
    pass


class HandRolledRmsNorm(torch.nn.Module):
    pass


class AdaptedLayerNorm(torch.nn.LayerNorm):
    pass


@pytest.mark.parametrize(
    "cls,family",
    [
        (torch.nn.LayerNorm, "layer_norm"),
        (torch.nn.RMSNorm, "rms_norm"),
        (MyRMSNormAdapter, "rms_norm"),  # by its base
        (HandRolledRmsNorm, "rms_norm"),  # by its name
        (ConditionalLayerNormLike, "conditional"),  # before layer_norm
        (AdaptedLayerNorm, "layer_norm"),
        (torch.nn.Linear, None),
        (torch.nn.GELU, None),
        (torch.nn.functional.layer_norm, None),  # not a class
    ],
)
def test_norm_family(cls, family):
    assert norm_family(cls) == family


@pytest.mark.parametrize(
    "key,words",
    [
        ("layernorm", "did you mean 'LayerNorm'? keys are case-sensitive; anemoi knows"),
        ("LayerNrom", "did you mean 'LayerNorm'?"),
        ("Linaer", "did you mean 'Linear'?"),
        ("Dropout", "anemoi knows Linear, LayerNorm, Activation, QueryNorm, KeyNorm"),
    ],
)
def test_key_suggestion(key, words):
    hint = key_suggestion(key)
    assert hint.startswith(words) or words in hint
    assert hint.endswith("anemoi knows Linear, LayerNorm, Activation, QueryNorm, KeyNorm")
    assert ("did you mean" in hint) is (key != "Dropout")


class PassesArgsOn(torch.nn.LayerNorm):
    """anemoi's AutocastLayerNorm: *args, **kwargs, the defaults are its base's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)


class ObjectDefault(torch.nn.Module):
    def __init__(self, size, eps=1e-3, init=object(), name="x", flag=None):
        super().__init__()


@pytest.mark.parametrize(
    "cls,defaults",
    [
        (torch.nn.GELU, {"approximate": "none"}),
        (
            PassesArgsOn,
            {"eps": 1e-5, "elementwise_affine": True, "bias": True, "device": None, "dtype": None},
        ),
        (
            ObjectDefault,
            {"eps": 1e-3, "name": "x", "flag": None},
        ),  # a non-plain default is left out
        (len, {}),
    ],
)
def test_constructor_defaults(cls, defaults):
    assert constructor_defaults(cls) == defaults


def test_check_entries_is_json_in_json_out():
    out = check_entries(
        [
            {"key": "LayerNorm", "entry": {"_target_": "torch.nn.RMSNorm"}, "where": "a"},
            {
                "key": "LayerNorm",
                "entry": {"_target_": "torch.nn.RMSNorm"},
                "where": "b",
                "allow_semantics_change": True,
            },
        ]
    )
    assert [[(f["severity"], f["kind"], f["where"]) for f in r["findings"]] for r in out] == [
        [("error", "semantics", "a")],
        [("warning", "semantics", "b")],
    ]
    assert out[0]["facts"]["family"] == "rms_norm" and out[0]["facts"]["defaults"]["eps"] is None
