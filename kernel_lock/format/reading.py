"""Typed getters over a parsed TOML or JSON mapping: the one family every reader of kernel-probe
uses.

Modelled on the pylock reader in pypa/packaging: small getters (:func:`get`, :func:`get_required`,
:func:`get_choice`, :func:`get_strings`, :func:`get_tables`) raise one error type,
:class:`ReadError`, naming only the key they were given. Where that key sits (``slots.Linear.blas``)
is added as the error unwinds: a reader wraps each nested table in :func:`context`, which prefixes
its own key, so no getter takes a path argument. The reader that started (the lock's, a candidate
file's, a site profile's, the worker protocol's) turns the finished error into its own exception
with the file name, the dotted key and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = [
    "MAX_TEXT",
    "ReadError",
    "context",
    "did_you_mean",
    "get",
    "get_choice",
    "get_int",
    "get_literal",
    "get_required",
    "get_string_map",
    "get_strings",
    "get_table",
    "get_tables",
    "get_text",
    "join",
    "refuse_unknown",
    "type_name",
    "unknown_keys",
]


class ReadError(ValueError):
    """A value that is not what its reader declares: the problem, the dotted key so far, the fix.

    ``kind`` is the exception class the reader should raise in the end (``None``: the reader's own),
    for the rare error whose class says more than its text (a target outside the allow-list)."""

    def __init__(
        self,
        problem: str,
        key: str = "",
        fix: str | None = None,
        kind: type[Exception] | None = None,
    ):
        super().__init__(problem)
        self.problem = problem
        self.key = key
        self.fix = fix
        self.kind = kind

    def __str__(self) -> str:
        return f"'{self.key}': {self.problem}" if self.key else self.problem


def join(outer: str, inner: str) -> str:
    """``outer`` and ``inner`` as one dotted key: ``slots`` + ``Linear`` and ``requires`` +
    ``[0]``."""
    if not outer or not inner:
        return outer or inner
    return outer + inner if inner.startswith("[") else f"{outer}.{inner}"


@contextmanager
def context(key: str) -> Iterator[None]:
    """Read a nested table: a :class:`ReadError` leaving the block gets ``key`` in front of its
    own."""
    try:
        yield
    except ReadError as exc:
        exc.key = join(key, exc.key)
        raise


def type_name(t: Any) -> str:
    """How a message names a Python type read from TOML (``string``, ``table``, ``true or
    false``)."""
    if isinstance(t, tuple):
        return " or ".join(type_name(x) for x in t)
    names = {
        str: "string",
        int: "integer",
        float: "float",
        bool: "true or false",
        dict: "table",
        list: "array",
    }
    return names.get(t, t.__name__)


def get(d: Mapping[str, Any], key: str, typ: Any, default: Any = None) -> Any:
    """``d[key]`` if it is a ``typ`` (an int is taken for a float), ``default`` when absent."""
    value = d.get(key)
    if value is None:
        return default
    # TOML booleans are ints to Python; never accept one where the other is meant
    if isinstance(value, bool) and typ is not bool and not (isinstance(typ, tuple) and bool in typ):
        raise ReadError(f"expected {type_name(typ)}, got boolean {value!r}", key)
    if typ is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, typ):
        raise ReadError(f"expected {type_name(typ)}, got {type(value).__name__} {value!r:.60}", key)
    return value


def get_required(d: Mapping[str, Any], key: str, typ: Any, fix: str | None = None) -> Any:
    """``d[key]``, which must be there and be a ``typ``."""
    value = get(d, key, typ)
    if value is None:
        raise ReadError("required key is missing", key, fix)
    return value


def get_choice(
    d: Mapping[str, Any],
    key: str,
    choices: Sequence[str],
    default: str | None = None,
    fix: str | None = None,
) -> str:
    """A string among ``choices``; required unless there is a ``default``."""
    value = get(d, key, str) if default is not None else get_required(d, key, str, fix)
    if value is None:
        assert default is not None  # without a default, get_required has raised on a missing key
        return default
    if value not in choices:
        raise ReadError(f"{value!r} is not one of {', '.join(choices)}", key)
    return value


def get_strings(d: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """An array of strings (empty when absent)."""
    values = d.get(key, [])
    if not isinstance(values, list):
        raise ReadError(
            f"expected a list of strings, got {type(values).__name__} {values!r:.60}", key
        )
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise ReadError(f"expected string, got {type(v).__name__}", f"{key}[{i}]")
    return tuple(values)


def get_tables(d: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """An array of tables (empty when absent)."""
    values = get(d, key, list, default=[])
    for i, v in enumerate(values):
        if not isinstance(v, dict):
            raise ReadError(f"expected table, got {type(v).__name__}", f"{key}[{i}]")
    return values


def unknown_keys(d: Mapping[str, Any], known: Sequence[str]) -> list[str]:
    """The keys of ``d`` not in ``known``, in file order (the reader warns or refuses)."""
    return [str(k) for k in d if k not in known]


# ---- bounded values: what every reader of a JSON or TOML input that is not the lock uses ---------
MAX_TEXT = 4096  # characters of a free-text value (a problem, a fix, a description) unless told


def get_int(
    d: Mapping[str, Any], key: str, lo: int, hi: int, default: int | None = None
) -> int | None:
    """An integer in ``[lo, hi]`` (never a boolean, never a float); ``default`` when absent."""
    value = get(d, key, int, default)
    if value is not None and not lo <= value <= hi:
        raise ReadError(f"{value} is out of range: expected {lo} to {hi}", key)
    return value


def get_text(
    d: Mapping[str, Any], key: str, default: str | None = None, limit: int = MAX_TEXT
) -> str | None:
    """A string of at most ``limit`` characters; ``default`` when absent."""
    value = get(d, key, str, default)
    if value is not None and len(value) > limit:
        raise ReadError(
            f"a string of {len(value)} characters, more than the {limit} this key may have", key
        )
    return value


def get_literal(
    d: Mapping[str, Any],
    key: str,
    choices: Sequence[str],
    default: str | None = None,
    *,
    fold: bool = False,
) -> str:
    """One of a closed set (``choices``; a ``Literal``'s values). ``fold``: the vocabulary is
    case-insensitive, and the value is returned as ``choices`` spell it. A near miss is named."""
    value = (
        get_text(d, key, default, limit=200) if default is not None else get_required(d, key, str)
    )
    assert value is not None
    if value in choices:
        return value
    if fold:
        folded = {c.lower(): c for c in choices}
        if value.lower() in folded:
            return folded[value.lower()]
    raise ReadError(
        f"{value!r:.80} is not one of {', '.join(choices)}", key, did_you_mean(value, choices)
    )


def did_you_mean(word: str, known: Sequence[str]) -> str:
    """``did you mean 'x'?`` for the closest of ``known``, else the list of them."""
    import difflib

    close = difflib.get_close_matches(
        str(word).lower(), [str(k).lower() for k in known], n=1, cutoff=0.6
    )
    if close:
        return f"did you mean {next(k for k in known if str(k).lower() == close[0])!r}?"
    return f"known: {', '.join(map(str, known))}"


def refuse_unknown(d: Mapping[str, Any], known: Sequence[str]) -> None:
    """A key of ``d`` not in ``known`` is a :class:`ReadError` (with "did you mean")."""
    for k in unknown_keys(d, known):
        raise ReadError(f"unknown key {k!r:.80}", k, did_you_mean(k, known))


def get_table(
    d: Mapping[str, Any], key: str, known: Sequence[str] | None = None
) -> Mapping[str, Any]:
    """A table (empty when absent); with ``known``, its unknown keys refused (the key added as it
    unwinds)."""
    value = get(d, key, dict, default={})
    if known is not None:
        with context(key):
            refuse_unknown(value, known)
    return value


def get_string_map(d: Mapping[str, Any], key: str, limit: int = MAX_TEXT) -> dict[str, str]:
    """A table of strings to strings (empty when absent)."""
    value = get(d, key, dict, default={})
    for k, v in value.items():
        if not isinstance(v, str):
            raise ReadError(f"expected string, got {type(v).__name__}", join(key, str(k)))
        if len(v) > limit:
            raise ReadError(
                f"a string of {len(v)} characters, more than the {limit} this key may have",
                join(key, k),
            )
    return dict(value)
