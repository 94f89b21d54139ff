"""Reading TOML, and writing it canonically.

Reading is tomllib's (tomli before Python 3.11). Writing is tomli-w's, the project's one TOML
writer: every key, string, number and boolean is formatted by ``tomli_w`` (its escapes, its float
forms). What tomli-w cannot be told is the lock's canonical *layout*, so that part is kept here,
because the lock's bytes are part of its contract: the same content always gives the same text,
``load`` then ``dump`` is the identity, and diffs between two locks show only what changed. Layout
rules: keys keep the order the schema gives them; a table whose values are all scalars (or lists of
scalars) is written inline; other tables become ``[sections]``; lists of tables become
``[[arrays]]``; an array is written on one line (tomli-w would break one longer than 100 columns); a
tab in a string is escaped (tomli-w leaves it raw). ``tomli_w`` is imported only when something is
written, so reading a lock stays light. Test: tests/kernel_lock/test_toml_bytes.py (the bytes the
earlier hand-written formatter produced, kept as golden files).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "TOMLDecodeError",
    "dumps",
    "loads",
    "toml_key",
    "toml_value",
]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TOMLDecodeError = tomllib.TOMLDecodeError


def loads(text: str) -> dict[str, Any]:
    """Parse TOML text (tomllib, or tomli before Python 3.11)."""
    return tomllib.loads(text)


def _tomli_w_line(key: str, value: Any) -> str:
    """``key = value`` as tomli-w writes it, for a key and a scalar value (no newline)."""
    import tomli_w  # only where writing happens: kernel_lock stays import-light for readers

    return tomli_w.dumps({key: value})[:-1]


def toml_key(key: str) -> str:
    """A key as TOML writes it: bare when it can be, else a quoted string (tomli-w's rule).

    >>> toml_key("eps"), toml_key("a b")
    ('eps', '"a b"')
    """
    # a tab only inside a quoted key
    return _tomli_w_line(key, 0)[: -len(" = 0")].replace("\t", "\\t")


def _string(value: str) -> str:
    return toml_value(value)


def toml_value(value: Any) -> str:
    """A value as the canonical layout writes it on its key's line: scalars as tomli-w writes them,
    arrays on one line, a table inline.

    >>> toml_value([1, "a"]), toml_value({"eps": 1e-05})
    ('[1, "a"]', '{ eps = 1e-05 }')
    """
    if isinstance(value, str):
        # tomli-w leaves a tab raw; escaped, it stays visible in a diff (and the bytes stay what
        # they were)
        return _tomli_w_line("k", value)[len("k = ") :].replace("\t", "\\t")
    if isinstance(value, (bool, int, float)):
        return _tomli_w_line("k", value)[len("k = ") :]
    if isinstance(value, (list, tuple)):  # one line, whatever its length (the layout rule above)
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list, tuple))


def _is_flat(value: Any) -> bool:
    """A table of scalars or lists of scalars: written inline as ``{ a = 1, b = [2] }``."""
    return isinstance(value, dict) and all(
        _is_scalar(v) or (isinstance(v, (list, tuple)) and all(_is_scalar(i) for i in v))
        for v in value.values()
    )


def _is_leaf(value: Any) -> bool:
    """True for values written on one line after ``key =``."""
    if _is_scalar(value) or _is_flat(value):
        return True
    if isinstance(value, (list, tuple)):
        # short records (e.g. requirements) stay inline; longer ones become [[tables]]
        return all(_is_scalar(v) or (_is_flat(v) and len(v) <= 3) for v in value)
    return False


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
        lines.append("")
        lines.append(header)
    for key, value in inline:
        lines.append(f"{toml_key(key)} = {toml_value(value)}")
    for key, value in nested:
        sub = path + [key]
        dotted = ".".join(toml_key(p) for p in sub)
        if isinstance(value, dict):
            _write_table(value, sub, lines, header=f"[{dotted}]")
        else:
            if not all(isinstance(item, dict) for item in value):
                raise TypeError(f"list {dotted!r} mixes tables and other values")
            for item in value:
                lines.append("")
                lines.append(f"[[{dotted}]]")
                _write_array_item(item, sub, lines)


def _write_array_item(item: dict[str, Any], path: list[str], lines: list[str]) -> None:
    # Inside [[a.b]], nested non-leaf tables would need [a.b.c] headers that bind to the last item;
    # the schema never nests that deep, so inline everything that is a leaf and refuse the rest.
    for key, value in item.items():
        if not (_is_leaf(value) or all(_is_flat(v) for v in value)):
            raise TypeError(
                f"table array item key {key!r} is too deeply nested for the canonical writer"
            )
        lines.append(f"{toml_key(key)} = {toml_value(value)}")
