"""Typed getters over a parsed TOML or JSON mapping: the one family every reader of kernel-probe uses.

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


class ReadError(ValueError):
    """A value that is not what its reader declares: the problem, the dotted key so far, the fix.

    ``kind`` is the exception class the reader should raise in the end (``None``: the reader's own),
    for the rare error whose class says more than its text (a target outside the allow-list)."""

    def __init__(self, problem: str, key: str = "", fix: str | None = None, kind: type[Exception] | None = None):
        super().__init__(problem)
        self.problem = problem
        self.key = key
        self.fix = fix
        self.kind = kind

    def __str__(self) -> str:
        return f"'{self.key}': {self.problem}" if self.key else self.problem


def join(outer: str, inner: str) -> str:
    """``outer`` and ``inner`` as one dotted key: ``slots`` + ``Linear`` and ``requires`` + ``[0]``."""
    if not outer or not inner:
        return outer or inner
    return outer + inner if inner.startswith("[") else f"{outer}.{inner}"


@contextmanager
def context(key: str) -> Iterator[None]:
    """Read a nested table: a :class:`ReadError` leaving the block gets ``key`` in front of its own."""
    try:
        yield
    except ReadError as exc:
        exc.key = join(key, exc.key)
        raise


def type_name(t: Any) -> str:
    """How a message names a Python type read from TOML (``string``, ``table``, ``true or false``)."""
    if isinstance(t, tuple):
        return " or ".join(type_name(x) for x in t)
    names = {str: "string", int: "integer", float: "float", bool: "true or false", dict: "table", list: "array"}
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
    d: Mapping[str, Any], key: str, choices: Sequence[str], default: str | None = None, fix: str | None = None
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
        raise ReadError(f"expected a list of strings, got {type(values).__name__} {values!r:.60}", key)
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
