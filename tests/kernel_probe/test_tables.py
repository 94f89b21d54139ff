"""kernel_probe.tables: the strict TableReader over parsed TOML (registry, profiles, candidate
files).

Each getter's value and default, its type errors; unknown keys refused with a "did you mean" hint or
the known keys; every error an InputFileError (exit 5) naming the file and the dotted key; regex and
PEP 440 specifier checks."""

from __future__ import annotations

import pytest

from kernel_lock.errors import ExitCode
from kernel_probe.errors import InputFileError
from kernel_probe.profiles import ProfileError
from kernel_probe.tables import CandidateDataError, TableReader

PATH = "site/registry.toml"


@pytest.fixture
def r() -> TableReader:
    return TableReader(PATH)


def raised(call) -> InputFileError:
    with pytest.raises(InputFileError) as info:
        call()
    return info.value


# ---- values and defaults -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "d, kwargs, expected",
    [
        ({"name": "liger"}, {}, "liger"),
        ({}, {}, None),
        ({}, {"default": "fallback"}, "fallback"),
        ({"name": "liger"}, {"default": "fallback"}, "liger"),
        ({"name": ""}, {"required": True}, ""),  # present, even if empty
    ],
)
def test_string(r, d, kwargs, expected):
    assert r.string(d, "name", "library[0].", **kwargs) == expected


@pytest.mark.parametrize(
    "d, expected",
    [
        ({"has-any": ["a.py", "b/c.py"]}, ("a.py", "b/c.py")),
        ({"has-any": "a.py"}, ("a.py",)),  # a lone string is a list of one
        ({"has-any": []}, ()),
        ({}, ()),
    ],
)
def test_strings(r, d, expected):
    assert r.strings(d, "has-any", "library[0].variant[1].") == expected


@pytest.mark.parametrize(
    "d, default, expected",
    [
        ({"usable": True}, False, True),
        ({"usable": False}, True, False),
        ({}, False, False),
        ({}, True, True),
    ],
)
def test_boolean(r, d, default, expected):
    assert r.boolean(d, "usable", "v.", default=default) is expected


@pytest.mark.parametrize(
    "d, expected",
    [
        ({"variables": {"A": "1", "B": "2"}}, {"A": "1", "B": "2"}),
        ({}, {}),
        ({"variables": {}}, {}),
    ],
)
def test_free_table_takes_any_keys(r, d, expected):
    assert r.free_table(d, "variables", "match.") == expected


def test_table_with_known_keys(r):
    assert r.table({"match": {"env": "x", "hostname": "y"}}, "match", ("env", "hostname"), "") == {
        "env": "x",
        "hostname": "y",
    }
    assert r.table({}, "match", ("env",), "") == {}


# ---- type errors: the file, the dotted key, exit 5 ---------------------------------------------
@pytest.mark.parametrize(
    "call, key, problem",
    [
        (
            lambda r: r.string({"name": 3}, "name", "library[2]."),
            "library[2].name",
            "expected string, got int 3",
        ),
        (
            lambda r: r.string({}, "name", "library[2].", required=True),
            "library[2].name",
            "required key is missing",
        ),
        (
            lambda r: r.string({"name": True}, "name", ""),
            "name",
            "expected string, got boolean True",
        ),
        (
            lambda r: r.strings({"has-any": 3}, "has-any", "v."),
            "v.has-any",
            "expected a list of strings, got int 3",
        ),
        (
            lambda r: r.strings({"has-any": ["a", 1]}, "has-any", "v."),
            "v.has-any[1]",
            "expected string, got int",
        ),
        (
            lambda r: r.boolean({"usable": "yes"}, "usable", "v."),
            "v.usable",
            "expected true or false, got str",
        ),
        (
            lambda r: r.boolean({"usable": 1}, "usable", "v."),
            "v.usable",
            "expected true or false, got int 1",
        ),
        (
            lambda r: r.free_table({"match": "x"}, "match", "p."),
            "p.match",
            "expected table, got str",
        ),
        (
            lambda r: r.table({"match": []}, "match", ("env",), "p."),
            "p.match",
            "expected table, got list",
        ),
    ],
)
def test_type_errors_name_the_file_and_dotted_key(r, call, key, problem):
    exc = raised(lambda: call(r))
    assert type(exc) is CandidateDataError and exc.exit_code == ExitCode.BAD_INPUT
    assert (exc.path, exc.key) == (PATH, key)
    assert problem in exc.problem
    assert str(exc).startswith(f"{PATH}: '{key}': ")


def test_read_completes_the_key_and_keeps_the_fix(r):
    from kernel_lock.tables import ReadError

    def getter():
        raise ReadError("bad value", "kwargs.eps", fix="use a float")

    exc = raised(lambda: r.read("candidate[0].", getter))
    assert (exc.key, exc.problem, exc.fix) == (
        "candidate[0].kwargs.eps",
        "bad value",
        "use a float",
    )
    assert str(exc).endswith("\n  fix: use a float")
    # `from None`: the ReadError is not chained
    assert exc.__cause__ is None and exc.__suppress_context__


def test_read_lets_other_errors_through(r):
    with pytest.raises(ZeroDivisionError):
        r.read("x.", lambda: 1 / 0)


# ---- unknown keys ------------------------------------------------------------------------------
KNOWN = ("name", "distributions", "module", "check", "about", "variant")


@pytest.mark.parametrize(
    "d, key, fix",
    [
        ({"name": "x", "modul": "y"}, "library[0].modul", "did you mean 'module'?"),
        ({"distribution": ["x"]}, "library[0].distribution", "did you mean 'distributions'?"),
        ({"chek": "x"}, "library[0].chek", "did you mean 'check'?"),
        ({"colour": "x"}, "library[0].colour", "known keys here: " + ", ".join(KNOWN)),
        (
            {"name": "x", "zz": 1, "modul": 2},
            "library[0].zz",
            "known keys here: ",
        ),  # the first one, in file order
    ],
)
def test_unknown_keys_are_refused_with_a_hint(r, d, key, fix):
    exc = raised(lambda: r.no_unknown(d, KNOWN, "library[0]."))
    assert (exc.path, exc.key) == (PATH, key)
    assert exc.problem == f"unknown key {key.rsplit('.', 1)[1]!r}"
    assert exc.fix.startswith(fix)


def test_known_keys_pass(r):
    assert r.no_unknown({"name": "x", "module": "y"}, KNOWN, "") is None
    assert r.no_unknown({}, KNOWN, "") is None


def test_table_refuses_an_unknown_key_inside_it(r):
    exc = raised(
        lambda: r.table({"match": {"hostnme": "x"}}, "match", ("hostname", "env"), "profile.")
    )
    assert exc.key == "profile.match.hostnme" and exc.fix == "did you mean 'hostname'?"


# ---- regular expressions and version specifiers ------------------------------------------------
@pytest.mark.parametrize("pattern", [r"^nid\d+$", "frontier.*", "", "a|b"])
def test_regex_accepts_a_valid_pattern(r, pattern):
    assert r.regex(pattern, "match.hostname") == pattern


@pytest.mark.parametrize("pattern", ["nid[0-9", "(unclosed", "*x", r"a{2,1}"])
def test_regex_refuses_an_invalid_pattern(r, pattern):
    exc = raised(lambda: r.regex(pattern, "match.hostname"))
    assert (exc.path, exc.key) == (PATH, "match.hostname")
    assert exc.problem.startswith(f"{pattern!r} is not a valid regular expression: ")


@pytest.mark.parametrize("spec", [">=2.4,<2.12", "==2.6.*", "~=3.1", "", "!=2.5.0"])
def test_specifier_accepts_pep440(r, spec):
    assert r.specifier(spec, "requires.torch") == spec


@pytest.mark.parametrize(
    "spec, problem",
    [
        (">=2.4;<2.12", "'>=2.4;<2.12' is not a PEP 440 version specifier like '>=2.4,<2.12'"),
        ("2.4", "'2.4' is not a PEP 440 version specifier"),
        ("=>2.4", "'=>2.4' is not a PEP 440 version specifier"),
        (2.4, "expected a PEP 440 specifier string, got float"),
        ([">=2.4"], "expected a PEP 440 specifier string, got list"),
    ],
)
def test_specifier_refuses_anything_else(r, spec, problem):
    exc = raised(lambda: r.specifier(spec, "requires.torch"))
    assert (exc.path, exc.key) == (PATH, "requires.torch")
    assert exc.problem.startswith(problem)


# ---- the error class is the reader's -----------------------------------------------------------
def test_a_subclass_raises_its_own_error():
    class ProfileReader(TableReader):
        error = ProfileError

    exc = raised(lambda: ProfileReader("lumi.toml").no_unknown({"x": 1}, ("match",), "profile."))
    assert type(exc) is ProfileError and exc.path == "lumi.toml" and exc.key == "profile.x"
    assert exc.exit_code == ExitCode.BAD_INPUT


def test_err_builds_without_raising(r):
    exc = r.err("a.b", "problem", "fix it")
    assert isinstance(exc, CandidateDataError)
    assert str(exc) == f"{PATH}: 'a.b': problem\n  fix: fix it"
