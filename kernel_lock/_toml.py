"""Reading TOML, and writing it canonically.

The writer is ours (not tomli-w) because the lock's bytes are part of its contract: the same
content must always give the same text, so ``load`` then ``dump`` is the identity and diffs between
two locks show only what changed. Rules: keys keep the order the schema gives them; a table whose
values are all scalars (or lists of scalars) is written inline; other tables become ``[sections]``;
lists of tables become ``[[arrays]]``; floats use Python's shortest round-trip ``repr``.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TOMLDecodeError = tomllib.TOMLDecodeError
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def loads(text: str) -> dict[str, Any]:
    """Parse TOML text (tomllib, or tomli before Python 3.11)."""
    return tomllib.loads(text)


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _string(value: str) -> str:
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_key(k)} = {_scalar(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list, tuple))


def _is_flat(value: Any) -> bool:
    """A table of scalars or lists of scalars: written inline as ``{ a = 1, b = [2] }``."""
    return isinstance(value, dict) and all(
        _is_scalar(v) or (isinstance(v, (list, tuple)) and all(_is_scalar(i) for i in v)) for v in value.values()
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


def _write_table(table: dict[str, Any], path: list[str], lines: list[str], header: str | None) -> None:
    inline = [(k, v) for k, v in table.items() if _is_leaf(v)]
    nested = [(k, v) for k, v in table.items() if not _is_leaf(v)]
    if header is not None and (inline or not nested):
        lines.append("")
        lines.append(header)
    for key, value in inline:
        lines.append(f"{_key(key)} = {_scalar(value)}")
    for key, value in nested:
        sub = path + [key]
        dotted = ".".join(_key(p) for p in sub)
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
            raise TypeError(f"table array item key {key!r} is too deeply nested for the canonical writer")
        lines.append(f"{_key(key)} = {_scalar(value)}")
