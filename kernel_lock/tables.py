"""Typed getters over parsed TOML or JSON (one error type, :class:`ReadError`, whose key
:func:`context` prefixes as it unwinds), and tables declared by their fields' metadata: the
fields' order is the canonical key order, so the bytes and the digest follow.

    >>> from dataclasses import dataclass, field
    >>> @dataclass(frozen=True, kw_only=True, slots=True)
    ... class Pin:
    ...     target: str = field(metadata=toml_key("target", text(required=True)))
    ...     reason: str = field(default="", metadata=toml_key("reason", text(), omit=EMPTY))
    >>> to_dict(Pin(target="torch.nn.LayerNorm"))
    {'target': 'torch.nn.LayerNorm'}
    >>> table_keys(Pin)
    ('target', 'reason')"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, field, fields, is_dataclass
from typing import Any, TypeVar

__all__ = [
    "INT64",
    "CONTROL",
    "Raw",
    "ReadError",
    "Table",
    "canonical",
    "context",
    "did_you_mean",
    "flag",
    "from_dict",
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
    "identifier",
    "identifiers",
    "join",
    "nearest",
    "non_negative",
    "plain",
    "refuse_controls",
    "refuse_unknown",
    "strings",
    "table_keys",
    "text",
    "to_dict",
    "toml_field",
    "toml_key",
    "type_name",
    "unknown_keys",
    "value_problem",
]

_T = TypeVar("_T")
Raw = Mapping[str, Any]  # a table as parsed from TOML or JSON
MAX_TEXT = 4096  # characters of a free-text value (a problem, a fix, a description) unless told
FIX_MISSING = "add `{key} = ...` (see docs/lock-format.md)"
REST = "*"  # the key of a field that holds the table's other keys (``[environment]``'s fields)
INT64 = 1 << 63  # every integer read is in [-INT64, INT64): what a C int64 holds
# Never in a name, never rendered as itself (a renderer escapes them): C0 and C1 controls, Unicode's
# format characters (Cf: bidi controls, zero-width characters, tags ...), line and paragraph
# separators (tests compare it: Cf, Zl, Zp)
CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)
_TYPE_NAMES = {
    str: "string",
    int: "integer",
    float: "float",
    bool: "true or false",
    dict: "table",
    list: "array",
}


class ReadError(ValueError):
    """A value not what its reader declares: problem, dotted key, fix, final ``kind``."""

    def __init__(
        self,
        problem: str,
        key: str = "",
        fix: str | None = None,
        kind: type[Exception] | None = None,
    ):
        super().__init__(problem)
        self.problem, self.key, self.fix, self.kind = problem, key, fix, kind

    def __str__(self) -> str:
        return f"'{self.key}': {self.problem}" if self.key else self.problem


def join(outer: str, inner: str) -> str:
    """One dotted key: ``slots`` + ``Linear``, ``requires`` + ``[0]``."""
    if not outer or not inner:
        return outer or inner
    return outer + inner if inner.startswith("[") else f"{outer}.{inner}"


@contextmanager
def context(key: str) -> Iterator[None]:
    """Read a nested table: a :class:`ReadError` leaving the block gets ``key`` in front."""
    try:
        yield
    except ReadError as exc:
        exc.key = join(key, exc.key)
        raise


def type_name(t: Any) -> str:
    """How a message names a type read from TOML (``string``, ``table``, ``true or false``)."""
    if isinstance(t, tuple):
        return " or ".join(type_name(x) for x in t)
    return _TYPE_NAMES.get(t, t.__name__)


def get(d: Raw, key: str, typ: Any, default: Any = None) -> Any:
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
    problem = value_problem(value, finite=False)
    if problem:
        raise ReadError(problem, key, fix="write an integer within 64 bits")
    return value


def value_problem(value: Any, *, finite: bool) -> str | None:
    """Why a scalar cannot be used: an integer beyond 64 bits, or (``finite``) a float that is
    not finite (nan, inf, -inf)."""
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        digits = str(value)
        shown = f"{digits[:20]}..." if len(digits) > 20 else digits
        return f"integer {shown} is beyond 64 bits"
    if finite and isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    return None


def get_required(d: Raw, key: str, typ: Any, fix: str | None = None) -> Any:
    """``d[key]``, which must be there and be a ``typ``."""
    value = get(d, key, typ)
    if value is None:
        raise ReadError("required key is missing", key, fix)
    return value


def get_choice(
    d: Raw, key: str, choices: Sequence[str], default: str | None = None, fix: str | None = None
) -> str:
    """A string among ``choices``; required unless there is a ``default``."""
    value = get(d, key, str) if default is not None else get_required(d, key, str, fix)
    if value is None:
        return str(default)
    if value not in choices:
        raise ReadError(f"{value!r} is not one of {', '.join(choices)}", key)
    return value


def get_strings(d: Raw, key: str) -> tuple[str, ...]:
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


def get_tables(d: Raw, key: str) -> list[Raw]:
    """An array of tables (empty when absent)."""
    values = get(d, key, list, default=[])
    for i, v in enumerate(values):
        if not isinstance(v, dict):
            raise ReadError(f"expected table, got {type(v).__name__}", f"{key}[{i}]")
    return values


def unknown_keys(d: Raw, known: Sequence[str]) -> list[str]:
    """The keys of ``d`` not in ``known``, in file order."""
    return [str(k) for k in d if k not in known]


def get_int(d: Raw, key: str, lo: int, hi: int, default: int | None = None) -> int | None:
    """An integer in ``[lo, hi]`` (never a boolean, never a float); ``default`` when absent."""
    value = get(d, key, int, default)
    if value is not None and not lo <= value <= hi:
        raise ReadError(f"{value} is out of range: expected {lo} to {hi}", key)
    return value


def _too_long(value: str, limit: int, key: str) -> None:
    if len(value) > limit:
        raise ReadError(
            f"a string of {len(value)} characters, more than the {limit} this key may have", key
        )


def get_text(d: Raw, key: str, default: str | None = None, limit: int = MAX_TEXT) -> str | None:
    """A string of at most ``limit`` characters; ``default`` when absent."""
    value = get(d, key, str, default)
    if value is not None:
        _too_long(value, limit, key)
    return value


def refuse_controls(value: str, key: str) -> str:
    """``value``, a name or identifier (a backend, a device type): a control or format character in
    it (a newline that would add a line or a key to a rendered file) is a :class:`ReadError`."""
    found = CONTROL.search(value)
    if found:
        char = f"U+{ord(found.group()):04X}"
        said = f"{value!r:.80} holds the control character {char}: a name never does"
        raise ReadError(said, key, "remove it (kernel-probe never writes one), then rehash")
    return value


def get_literal(
    d: Raw, key: str, choices: Sequence[str], default: str | None = None, *, fold: bool = False
) -> str:
    """One of a closed set; ``fold``: case-insensitive. A near miss is named."""
    value = (
        get_text(d, key, default, limit=200) if default is not None else get_required(d, key, str)
    )
    assert value is not None
    if value in choices:
        return value
    folded = {c.lower(): c for c in choices} if fold else {}
    if value.lower() in folded:
        return folded[value.lower()]
    raise ReadError(
        f"{value!r:.80} is not one of {', '.join(choices)}", key, did_you_mean(value, choices)
    )


def nearest(word: Any, known: Iterable[Any]) -> str | None:
    """The one of ``known`` that ``word`` most likely misspells, compared case-insensitively: the
    project's one suggestion (options, subcommands, slots, keys, choices); None: none is near."""
    import difflib  # only on an error: kernel_lock's import stays light

    folded: dict[str, str] = {}
    for k in known:
        folded.setdefault(str(k).lower(), str(k))
    low = str(word).lower()
    close = [low] if low in folded else difflib.get_close_matches(low, folded, n=1, cutoff=0.6)
    return folded[close[0]] if close else None


def did_you_mean(word: Any, known: Sequence[Any], what: str = "known") -> str:
    """``did you mean 'x'?`` for the :func:`nearest` of ``known``, else the list of them."""
    near = nearest(word, known)
    return f"did you mean {near!r}?" if near else f"{what}: {', '.join(map(str, known))}"


def refuse_unknown(d: Raw, known: Sequence[str]) -> None:
    """A key of ``d`` not in ``known`` is a :class:`ReadError` (with "did you mean")."""
    for k in unknown_keys(d, known):
        raise ReadError(f"unknown key {k!r:.80}", k, did_you_mean(k, known))


def get_table(d: Raw, key: str, known: Sequence[str] | None = None) -> Raw:
    """A table (empty when absent); with ``known``, its unknown keys refused."""
    value = get(d, key, dict, default={})
    if known is not None:
        with context(key):
            refuse_unknown(value, known)
    return value


def get_string_map(d: Raw, key: str, limit: int = MAX_TEXT) -> dict[str, str]:
    """A table of strings to strings (empty when absent)."""
    value = get(d, key, dict, default={})
    for k, v in value.items():
        if not isinstance(v, str):
            raise ReadError(f"expected string, got {type(v).__name__}", join(key, str(k)))
        _too_long(v, limit, join(key, k))
    return dict(value)


# ---- tables declared by their fields' metadata ---------------------------------------------------
# (the reading state, the table, the key, the values read so far by this table) -> the field's value
Reader = Callable[[Any, Raw, str, Raw], Any]


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
    """A field's metadata: its TOML key, reader, writer (default :func:`plain`) and omission."""
    return {"key": name, "read": read, "omit": omit, "write": write or plain}


def toml_field(
    name: str,
    read: Reader,
    default: Any = MISSING,
    *,
    factory: Any = MISSING,
    omit: Callable[[Any], bool] | None = None,
    write: Callable[[Any], Any] | None = None,
) -> Any:
    """A dataclass field read from and written to the TOML key ``name`` (:func:`toml_key`);
    ``default`` or ``factory``: its value when the table has no such key."""
    metadata = toml_key(name, read, omit=omit, write=write)
    return field(default=default, default_factory=factory, metadata=metadata)


def table_keys(cls: type) -> tuple[str, ...]:
    """The TOML keys of the table ``cls``, in canonical order."""
    return tuple(
        f.metadata["key"] for f in fields(cls) if f.metadata.get("key") not in (None, REST)
    )


def from_dict(cls: type[_T], ctx: Any, d: Raw, known: Sequence[str] = (), **given: Any) -> _T:
    """The table ``d`` as a ``cls``, its unknown keys reported; ``given``: fields not in ``d``."""
    declared = [f for f in fields(cls) if "key" in f.metadata]  # type: ignore[arg-type]
    if all(f.metadata["key"] != REST for f in declared):
        ctx.unknown(d, (*table_keys(cls), *known))
    values: dict[str, Any] = dict(given)
    for f in declared:
        values[f.name] = f.metadata["read"](ctx, d, f.metadata["key"], values)
    return cls(**values)


def to_dict(table: Any, *, without: Sequence[str] = ()) -> dict[str, Any]:
    """The TOML-ready mapping of ``table``, keys in canonical order (``without``: left out)."""
    out: dict[str, Any] = {}
    for f in fields(table):
        name, omit = f.metadata.get("key"), f.metadata.get("omit")
        value = getattr(table, f.name)
        if name is None or name in without or (omit is not None and omit(value)):
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


def canonical(value: Any) -> str:
    """The JSON a digest hashes: :func:`plain`, keys sorted, compact, ASCII."""
    return json.dumps(plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def non_negative(ctx: Any, d: Raw, k: str, _: Raw) -> float | None:
    """A non-negative finite number (None when absent)."""
    value = get(d, k, float)
    if value is not None and (not math.isfinite(value) or value < 0):
        raise ReadError("must be a non-negative finite number", k)
    return value


def text(default: str = "", *, required: bool = False) -> Reader:
    """A string (``required``: missing, the fix points at docs/lock-format.md)."""
    if required:
        return lambda ctx, d, k, _: get_required(d, k, str, fix=FIX_MISSING.format(key=k))
    return lambda ctx, d, k, _: get(d, k, str, default=default)


def identifier(*, required: bool = False) -> Reader:
    """A name or identifier: :func:`text` without control or format characters."""
    read = text(required=required)
    return lambda ctx, d, k, so_far: refuse_controls(read(ctx, d, k, so_far), k)


def identifiers(ctx: Any, d: Raw, k: str, _: Raw) -> tuple[str, ...]:
    """An array of names (empty when absent), none with control or format characters."""
    values = get_strings(d, k)
    for i, value in enumerate(values):
        refuse_controls(value, f"{k}[{i}]")
    return values


def one_of(choices: Sequence[str], default: str | None = None) -> Reader:
    """A string among ``choices`` (required unless there is a ``default``)."""
    return lambda ctx, d, k, _: get_choice(d, k, choices, default, fix=FIX_MISSING.format(key=k))


def strings(ctx: Any, d: Raw, k: str, _: Raw) -> tuple[str, ...]:
    """An array of strings (empty when absent)."""
    return get_strings(d, k)


def flag(ctx: Any, d: Raw, k: str, _: Raw) -> bool:
    """``true`` or ``false`` (false when absent)."""
    return bool(get(d, k, bool, default=False))


class Table:
    """A table of the lock: its :meth:`to_dict` is the generic writer's."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """The TOML-ready table, keys in canonical order."""
        return to_dict(self)
