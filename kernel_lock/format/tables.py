"""The lock's tables declared once: each field's TOML key, reader and writing rule in its metadata,
read and written by one generic pair (:func:`from_dict`, :func:`to_dict`).

Modelled on pypa/packaging's ``pylock.py``: every table of the lock (``[slots.X]``, its ``twin``,
its ``requires``, ``[environment]``, ``[graph-attention]``, the document itself) is a frozen,
keyword-only, slotted dataclass. A field the file holds says so in its metadata (:func:`toml_key`):
its TOML key, the typed reader that builds its value (the getters of
:mod:`kernel_lock.format.reading`, each error naming its key as it unwinds) and when it is left out
of the written table. The order of the fields is the canonical key order of the written lock, so the
bytes and the digest follow from the declaration; a field without a key (a slot's name, where a lock
was read from) is the caller's to give.

    >>> from dataclasses import dataclass, field
    >>> @dataclass(frozen=True, kw_only=True, slots=True)
    ... class Pin:
    ...     target: str = field(metadata=toml_key("target", text(required=True)))
    ...     reason: str = field(default="", metadata=toml_key("reason", text(), omit=EMPTY))
    >>> to_dict(Pin(target="torch.nn.LayerNorm"))
    {'target': 'torch.nn.LayerNorm'}
    >>> table_keys(Pin)
    ('target', 'reason')

Importing this module costs what :mod:`dataclasses` costs: nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import Any, Protocol, TypeVar

from .reading import get, get_choice, get_required, get_strings

__all__ = [
    "EMPTY",
    "FIX_MISSING",
    "NONE",
    "REST",
    "Reader",
    "Reading",
    "Table",
    "flag",
    "from_dict",
    "one_of",
    "plain",
    "strings",
    "table_keys",
    "text",
    "to_dict",
    "toml_key",
]

_T = TypeVar("_T")
FIX_MISSING = "add `{key} = ...` (see docs/lock-format.md)"
REST = "*"  # the key of a field that holds the table's other keys (``[environment]``'s fields)


class Reading(Protocol):
    """What a reader is given besides the table: the state of reading one lock (schema.Context)."""

    def unknown(self, d: Mapping[str, Any], known: Sequence[str], what: str = "key") -> None:
        """Report each key of ``d`` not in ``known`` (a newer writer's)."""


# (the reading state, the table, the key, the values read so far by this table) -> the field's value
Reader = Callable[[Any, Mapping[str, Any], str, Mapping[str, Any]], Any]


def EMPTY(value: Any) -> bool:
    """Left out when empty (``""``, ``()``, ``{}``, ``False``, ``None``)."""
    return not value


def NONE(value: Any) -> bool:
    """Left out when None (a ``0.0`` is written)."""
    return value is None


def toml_key(
    name: str,
    read: Reader,
    *,
    omit: Callable[[Any], bool] | None = None,
    write: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """The metadata of a field the lock holds at ``name``: read by ``read``; written by ``write``
    (default :func:`plain`), unless ``omit(value)``."""
    return {"key": name, "read": read, "omit": omit, "write": write or plain}


def table_keys(cls: type) -> tuple[str, ...]:
    """The TOML keys of the table ``cls``, in canonical order (the keys a reader knows)."""
    return tuple(
        f.metadata["key"] for f in fields(cls) if "key" in f.metadata and f.metadata["key"] != REST
    )


def from_dict(
    cls: type[_T], ctx: Reading, d: Mapping[str, Any], known: Sequence[str] = (), **given: Any
) -> _T:
    """The table ``d`` as a ``cls``: each field read by its reader, in canonical order, after the
    keys neither a field nor ``known`` declares are reported (``ctx.unknown``: a newer writer's,
    ignored); ``given``: the fields the file does not hold."""
    declared = [f for f in fields(cls) if "key" in f.metadata]  # type: ignore[arg-type]
    if all(f.metadata["key"] != REST for f in declared):
        ctx.unknown(d, (*table_keys(cls), *known))
    values: dict[str, Any] = dict(given)
    for f in declared:
        values[f.name] = f.metadata["read"](ctx, d, f.metadata["key"], values)
    return cls(**values)


def to_dict(table: Any, *, without: Sequence[str] = ()) -> dict[str, Any]:
    """The TOML-ready mapping of ``table``, keys in canonical order (``without``: keys left out)."""
    out: dict[str, Any] = {}
    for f in fields(table):
        name = f.metadata.get("key")
        if name is None or name in without:
            continue
        value = getattr(table, f.name)
        omit = f.metadata["omit"]
        if omit is not None and omit(value):
            continue
        written = f.metadata["write"](value)
        if name == REST:
            out.update(written)
        else:
            out[name] = written
    return out


def plain(value: Any) -> Any:
    """A value as TOML (and the digest's JSON) takes it: a table as its mapping, tuples as lists."""
    if is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


# ---- the readers most fields use -----------------------------------------------------------------
def text(default: str = "", *, required: bool = False) -> Reader:
    """A string (``required``: missing, the fix points at docs/lock-format.md)."""
    if required:
        return lambda ctx, d, k, _: get_required(d, k, str, fix=FIX_MISSING.format(key=k))
    return lambda ctx, d, k, _: get(d, k, str, default=default)


def one_of(choices: Sequence[str], default: str | None = None) -> Reader:
    """A string among ``choices`` (required unless there is a ``default``)."""
    return lambda ctx, d, k, _: get_choice(d, k, choices, default, fix=FIX_MISSING.format(key=k))


def strings(ctx: Any, d: Mapping[str, Any], k: str, _: Mapping[str, Any]) -> tuple[str, ...]:
    """An array of strings (empty when absent)."""
    return get_strings(d, k)


def flag(ctx: Any, d: Mapping[str, Any], k: str, _: Mapping[str, Any]) -> bool:
    """``true`` or ``false`` (false when absent)."""
    return bool(get(d, k, bool, default=False))


class Table:
    """A table of the lock: its :meth:`to_dict` is the generic writer's."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready table, keys in canonical order."""
        return to_dict(self)
