"""Reading TOML, and writing it canonically with ``tomli_w`` (imported only to write).
The layout is part of the contract (golden files: tests/kernel_lock/test_toml_bytes.py): keys in
schema order; scalar tables inline; other tables as sections; arrays on one line; tabs escaped."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["TOMLDecodeError", "dumps", "loads", "toml_key", "toml_value"]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TOMLDecodeError = tomllib.TOMLDecodeError
loads = tomllib.loads  # TOML text -> dict


def _tomli_w_value(value: Any) -> str:
    """A scalar as tomli-w writes it after ``key = ``."""
    import tomli_w  # only where writing happens: kernel_lock stays import-light for readers

    return tomli_w.dumps({"k": value})[len("k = ") : -1]


def toml_key(key: str) -> str:
    """A key as TOML writes it: bare when it can be, else quoted.

    >>> toml_key("eps"), toml_key("a b")
    ('eps', '"a b"')"""
    import tomli_w

    # a tab only inside a quoted key
    return tomli_w.dumps({key: 0})[: -len(" = 0\n")].replace("\t", "\\t")


def toml_value(value: Any) -> str:
    """A value on its key's line: scalars as tomli-w writes them, arrays on one line, a
    table inline.

    >>> toml_value([1, "a"]), toml_value({"eps": 1e-05})
    ('[1, "a"]', '{ eps = 1e-05 }')"""
    if isinstance(value, str):  # a tab escaped stays visible in a diff
        return _tomli_w_value(value).replace("\t", "\\t")
    if isinstance(value, (bool, int, float)):
        return _tomli_w_value(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list, tuple))


def _is_flat(value: Any) -> bool:
    """A table of scalars or lists of scalars: written inline."""
    return isinstance(value, dict) and all(
        _is_scalar(v) or (isinstance(v, (list, tuple)) and all(_is_scalar(i) for i in v))
        for v in value.values()
    )


def _is_leaf(value: Any) -> bool:
    """Written on one line after ``key =`` (short records, like requirements, stay inline)."""
    if _is_scalar(value) or _is_flat(value):
        return True
    return isinstance(value, (list, tuple)) and all(
        _is_scalar(v) or (_is_flat(v) and len(v) <= 3) for v in value
    )


def dumps(document: dict[str, Any]) -> str:
    """TOML text for ``document``: scalars before tables, keys in the mapping's order."""
    lines: list[str] = []
    _write_table(document, [], lines, header=None)
    return "\n".join(lines).strip("\n") + "\n"


def _write_table(
    table: dict[str, Any], path: list[str], lines: list[str], header: str | None
) -> None:
    inline = [(k, v) for k, v in table.items() if _is_leaf(v)]
    nested = [(k, v) for k, v in table.items() if not _is_leaf(v)]
    if header is not None and (inline or not nested):
        lines += ["", header]
    lines += [f"{toml_key(key)} = {toml_value(value)}" for key, value in inline]
    for key, value in nested:
        dotted = ".".join(toml_key(p) for p in [*path, key])
        if isinstance(value, dict):
            _write_table(value, [*path, key], lines, header=f"[{dotted}]")
            continue
        if not all(isinstance(item, dict) for item in value):
            raise TypeError(f"list {dotted!r} mixes tables and other values")
        for item in value:
            lines += ["", f"[[{dotted}]]"]
            # a nested table inside [[a.b]]: the schema never nests that deep (inlined or refused)
            for k, v in item.items():
                if not (_is_leaf(v) or all(_is_flat(x) for x in v)):
                    raise TypeError(
                        f"table array item key {k!r} is too deeply nested for the canonical writer"
                    )
                lines.append(f"{toml_key(k)} = {toml_value(v)}")
