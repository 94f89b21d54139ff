"""kernel_lock.toml: the canonical TOML writer (inline tables, sections, arrays of tables)
and its reader."""

from __future__ import annotations

import math

import pytest

from kernel_lock import toml

# (value, how it is written after `k = `)
SCALARS = [
    (True, "true"),
    (False, "false"),
    (0, "0"),
    (-12, "-12"),
    (1.0, "1.0"),
    (1e-6, "1e-06"),
    (0.25, "0.25"),
    (1e20, "1e+20"),
    (-0.0, "-0.0"),
    (math.inf, "inf"),
    (-math.inf, "-inf"),
    (math.nan, "nan"),
    ("plain", '"plain"'),
    ('quote " here', '"quote \\" here"'),
    ("back\\slash", '"back\\\\slash"'),
    ("tab\tnew\nline\rret", '"tab\\tnew\\nline\\rret"'),
    ("bell\x07del\x7f", '"bell\\u0007del\\u007f"'),
    # tomli-w's compact escapes for backspace and form feed (the hand-written writer wrote \u0008,
    # \u000c)
    ("bs\bff\f", '"bs\\bff\\f"'),
    ("unicode é", '"unicode é"'),
    ([], "[]"),
    ([1, "a", 2.5], '[1, "a", 2.5]'),
    ((1, 2), "[1, 2]"),
    ({}, "{}"),
    ({"a": 1, "b c": [True]}, '{ a = 1, "b c" = [true] }'),
]


@pytest.mark.parametrize("value,text", SCALARS)
def test_values_are_written_canonically_and_read_back(value, text):
    out = toml.dumps({"k": value})
    assert out == f"k = {text}\n"
    back = toml.loads(out)["k"]
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(back)
    else:
        assert back == (list(value) if isinstance(value, tuple) else value)


@pytest.mark.parametrize(
    "key,text",
    [("plain-key_1", "plain-key_1"), ("dotted.key", '"dotted.key"'), ("a b", '"a b"'), ("", '""')],
)
def test_keys_are_quoted_only_when_they_must_be(key, text):
    out = toml.dumps({key: 1})
    assert out == f"{text} = 1\n" and toml.loads(out) == {key: 1}


def test_layout_scalars_first_then_sections_then_arrays_of_tables():
    doc = {
        "slots": {
            "LayerNorm": {
                "target": "torch.nn.LayerNorm",
                "twin": {"target": "t", "nested": {"x": 1}},
            }
        },
        "version": "1.0",
        "env": {"a": {"value": 1, "match": "exact"}},
        "evidence": [{"device": "cpu", "errors": {"y": 0.1}, "a": 1, "b": 2}, {"device": "cuda"}],
        "requires": [{"name": "torch"}],
    }
    text = toml.dumps(doc)
    assert text == (
        'version = "1.0"\n'
        'requires = [{ name = "torch" }]\n'
        "\n[slots.LayerNorm]\n"
        'target = "torch.nn.LayerNorm"\n'
        "\n[slots.LayerNorm.twin]\n"
        'target = "t"\n'
        "nested = { x = 1 }\n"
        "\n[env]\n"
        'a = { value = 1, match = "exact" }\n'
        "\n[[evidence]]\n"
        'device = "cpu"\n'
        "errors = { y = 0.1 }\n"
        "a = 1\n"
        "b = 2\n"
        "\n[[evidence]]\n"
        'device = "cuda"\n'
    )
    assert toml.loads(text) == doc


def test_a_table_of_only_tables_gets_no_header_of_its_own():
    doc = {"a": {"b": {"c": {"d": 1, "e": {"f": {"g": 1}}}}}}
    assert toml.dumps(doc) == "[a.b.c]\nd = 1\n\n[a.b.c.e]\nf = { g = 1 }\n"
    assert toml.loads(toml.dumps(doc)) == doc
    assert toml.dumps({"t": {}, "x": 1}) == "t = {}\nx = 1\n"  # an empty table is inline, in place
    assert toml.dumps({}) == "\n"


@pytest.mark.parametrize(
    "doc,words",
    [
        ({"k": object()}, "cannot write object to TOML"),
        ({"k": b"bytes"}, "cannot write bytes to TOML"),
        ({"k": [{"a": {"b": {}}}, 1]}, "list 'k' mixes tables and other values"),
        (
            {"k": [{"a": {"b": {"c": 1}}, "n": {"m": {}}}]},
            "too deeply nested for the canonical writer",
        ),
    ],
)
def test_what_cannot_be_written_is_refused(doc, words):
    with pytest.raises(TypeError, match=words):
        toml.dumps(doc)


def test_loads_raises_the_decode_error():
    with pytest.raises(toml.TOMLDecodeError):
        toml.loads("a = = 1")
    assert issubclass(toml.TOMLDecodeError, ValueError)
