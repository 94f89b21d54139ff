"""kernel_lock.tables: the typed getters, their one error type, and the dotted key built as
it unwinds."""

from __future__ import annotations

import pytest

from kernel_lock.tables import (
    ReadError,
    context,
    get,
    get_choice,
    get_required,
    get_strings,
    get_tables,
    join,
    type_name,
    unknown_keys,
)


@pytest.mark.parametrize(
    "outer,inner,joined",
    [
        ("slots", "Linear", "slots.Linear"),
        ("requires", "[0]", "requires[0]"),
        ("", "digest", "digest"),
        ("slots", "", "slots"),
        ("", "", ""),
        ("slots.LayerNorm", "requires[1].name", "slots.LayerNorm.requires[1].name"),
    ],
)
def test_join(outer, inner, joined):
    assert join(outer, inner) == joined


@pytest.mark.parametrize(
    "typ,name",
    [
        (str, "string"),
        (int, "integer"),
        (float, "float"),
        (bool, "true or false"),
        (dict, "table"),
        (list, "array"),
        ((int, float), "integer or float"),
        (bytes, "bytes"),
    ],
)
def test_type_name(typ, name):
    assert type_name(typ) == name


def test_read_error_text_names_its_key():
    assert str(ReadError("bad", "slots.Linear", fix="f")) == "'slots.Linear': bad"
    assert str(ReadError("bad")) == "bad"
    exc = ReadError("bad", "k", fix="f", kind=KeyError)
    assert (exc.problem, exc.key, exc.fix, exc.kind) == ("bad", "k", "f", KeyError)
    assert isinstance(exc, ValueError)


def test_context_prefixes_keys_as_the_error_unwinds():
    with (
        pytest.raises(ReadError) as exc,
        context("slots"),
        context("LayerNorm"),
        context("requires"),
        context("[0]"),
    ):
        raise ReadError("expected string", "name")
    assert exc.value.key == "slots.LayerNorm.requires[0].name"
    assert str(exc.value) == "'slots.LayerNorm.requires[0].name': expected string"


def test_context_leaves_other_errors_alone():
    with pytest.raises(KeyError), context("slots"):
        raise KeyError("x")
    with context("slots"):  # no error: nothing happens
        pass


# (mapping, key, type, default, value returned)
GOOD = [
    ({"a": "x"}, "a", str, None, "x"),
    ({}, "a", str, None, None),
    ({}, "a", str, "d", "d"),
    ({"a": None}, "a", int, 3, 3),
    ({"a": 1}, "a", float, None, 1.0),
    ({"a": 1.5}, "a", float, None, 1.5),
    ({"a": True}, "a", bool, None, True),
    ({"a": False}, "a", (bool, str), None, False),
    ({"a": 0}, "a", int, 7, 0),
    ({"a": [1]}, "a", list, None, [1]),
]


@pytest.mark.parametrize("d,key,typ,default,value", GOOD)
def test_get(d, key, typ, default, value):
    got = get(d, key, typ, default)
    assert got == value and type(got) is type(value)


# (mapping, key, type, words in the message)
BAD = [
    ({"a": True}, "a", int, "expected integer, got boolean True"),
    ({"a": False}, "a", str, "expected string, got boolean False"),
    ({"a": True}, "a", float, "expected float, got boolean True"),
    ({"a": 1}, "a", str, "expected string, got int 1"),
    ({"a": "1"}, "a", int, "expected integer, got str '1'"),
    ({"a": 1.5}, "a", int, "expected integer, got float 1.5"),
    ({"a": [1]}, "a", dict, "expected table, got list [1]"),
    ({"a": "x"}, "a", (int, float), "expected integer or float, got str 'x'"),
]


@pytest.mark.parametrize("d,key,typ,words", BAD)
def test_get_refuses(d, key, typ, words):
    with pytest.raises(ReadError) as exc:
        get(d, key, typ)
    assert exc.value.problem == words and exc.value.key == key


def test_get_shortens_a_long_value_in_its_message():
    with pytest.raises(ReadError) as exc:
        get({"a": "y" * 500}, "a", int)
    assert len(exc.value.problem) < 100


def test_get_required():
    assert get_required({"a": 2}, "a", int) == 2
    with pytest.raises(ReadError) as exc:
        get_required({}, "a", int, fix="add a")
    assert (exc.value.problem, exc.value.key, exc.value.fix) == (
        "required key is missing",
        "a",
        "add a",
    )
    with pytest.raises(ReadError, match="expected integer"):
        get_required({"a": "x"}, "a", int)


@pytest.mark.parametrize(
    "d,default,value",
    [({"m": "b"}, None, "b"), ({"m": "a"}, "b", "a"), ({}, "b", "b")],
)
def test_get_choice(d, default, value):
    assert get_choice(d, "m", ("a", "b"), default=default) == value


@pytest.mark.parametrize(
    "d,default,problem",
    [
        ({"m": "c"}, None, "'c' is not one of a, b"),
        ({"m": "c"}, "a", "'c' is not one of a, b"),
        ({}, None, "required key is missing"),
        ({"m": 1}, "a", "expected string, got int 1"),
    ],
)
def test_get_choice_refuses(d, default, problem):
    with pytest.raises(ReadError) as exc:
        get_choice(d, "m", ("a", "b"), default=default, fix="pick one")
    assert exc.value.problem == problem and exc.value.key == "m"


@pytest.mark.parametrize("d,value", [({}, ()), ({"s": []}, ()), ({"s": ["a", "b"]}, ("a", "b"))])
def test_get_strings(d, value):
    assert get_strings(d, "s") == value


@pytest.mark.parametrize(
    "d,key,problem",
    [
        ({"s": "a"}, "s", "expected a list of strings, got str 'a'"),
        ({"s": {"a": 1}}, "s", "expected a list of strings, got dict {'a': 1}"),
        ({"s": ["a", 2]}, "s[1]", "expected string, got int"),
    ],
)
def test_get_strings_refuses(d, key, problem):
    with pytest.raises(ReadError) as exc:
        get_strings(d, "s")
    assert (exc.value.key, exc.value.problem) == (key, problem)


@pytest.mark.parametrize(
    "d,value", [({}, []), ({"t": []}, []), ({"t": [{"a": 1}, {}]}, [{"a": 1}, {}])]
)
def test_get_tables(d, value):
    assert get_tables(d, "t") == value


@pytest.mark.parametrize(
    "d,key,problem",
    [
        ({"t": {"a": 1}}, "t", "expected array, got dict {'a': 1}"),
        ({"t": [{}, "x"]}, "t[1]", "expected table, got str"),
    ],
)
def test_get_tables_refuses(d, key, problem):
    with pytest.raises(ReadError) as exc:
        get_tables(d, "t")
    assert (exc.value.key, exc.value.problem) == (key, problem)


@pytest.mark.parametrize(
    "d,known,unknown",
    [
        ({}, ("a",), []),
        ({"a": 1, "b": 2}, ("a", "b"), []),
        ({"z": 1, "a": 1, "b": 2}, ("a",), ["z", "b"]),
    ],
)
def test_unknown_keys_in_file_order(d, known, unknown):
    assert unknown_keys(d, known) == unknown
