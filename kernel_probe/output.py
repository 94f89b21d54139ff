"""What every command shares: one rich console per stream, tables, JSON and the one failure shape
of ``--json``; the shared arguments, declared once, and opening a lock. Every string from a file or
a library is printed through ``safe``/``plain``."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import kernel_lock
from kernel_lock.errors import LockError
from kernel_lock.tables import CONTROL as CONTROL  # what every renderer escapes
from kernel_probe.probe.limits import MAX_SECONDS

_consoles: dict[str, Any] = {}
DEFAULT_LOCK = "kernel-lock.toml"
MAX_COUNT = 1_000_000
TRUST_HELP = (
    "trust this top-level package beyond the built-in allow-list (repeatable; also "
    "$KERNEL_LOCK_TRUST). A lock's own trusted-modules only ask for it"
)


DEBUG_HELP = "show tracebacks and debug logs"


def debug_flag(default: Any = False) -> argparse.ArgumentParser:
    """``--debug`` as an argparse parent (``parents=[debug_flag()]``): every command takes it; a
    subcommand's action takes it too, ``default`` ``argparse.SUPPRESS`` (the command's stands)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--debug", action="store_true", default=default, help=DEBUG_HELP)
    return p


def json_flag(help: str | None = None) -> argparse.ArgumentParser:
    """``--json`` as an argparse parent, ``help`` saying what it prints."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--json", action="store_true", help=help)
    return p


def console(stderr: bool = False):
    """The shared rich console on stdout (or stderr), created on first use."""
    key = "err" if stderr else "out"
    if key not in _consoles:
        from rich.console import Console  # rich: not on the job-start path

        _consoles[key] = Console(stderr=stderr, highlight=False, soft_wrap=True)
    return _consoles[key]


def reset() -> None:
    """Forget the consoles (tests redirect sys.stdout between calls)."""
    _consoles.clear()


def safe(value: Any) -> str:
    """``value`` as text for a rich console: control and format characters, rich markup escaped."""
    from rich.markup import escape

    return escape(_escaped(str(value)))


def _escaped(text: str) -> str:
    return CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def plain(value: Any) -> str:
    """``value`` as text for a plain stream: each line's control characters shown as escapes."""
    return "\n".join(_escaped(line) for line in str(value).split("\n"))


def comment(value: Any) -> str:
    """``value`` as one YAML or TOML comment line (``# ...``): every control character escaped, a
    newline too, so no text from a file or a library can end the comment and add a line."""
    return "# " + _escaped(str(value))


def table(title: str | None = None, **options: Any):
    """A compact rich table (one header rule, no outer frame): the probe's tables fit 80 columns."""
    from rich import box
    from rich.table import Table

    defaults = dict(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left")
    return Table(title=title, **{**defaults, **options})


def print_table(tbl: Any, *, stderr: bool = False) -> None:
    """Print ``tbl``: ``no_wrap`` columns (ids, shapes, numbers) never cut or wrapped, the others
    wrapped at spaces; a table that cannot fit is printed wider than the console, not cut."""
    from rich.measure import Measurement
    from rich.text import Text

    con = console(stderr)
    for column in tbl.columns:  # a wrapping column is at least as wide as its longest word
        if not column.no_wrap:
            cells = (
                Text.from_markup(c).plain if isinstance(c, str) else str(c) for c in column.cells
            )
            words = [w for cell in cells for w in cell.split()]
            column.min_width = max([column.min_width or 0, *(len(w) for w in words)])
    width, need = con.width, Measurement.get(con, con.options.update(width=100_000), tbl)
    try:  # rich squeezes a table wider than the console by cutting ids: unwrapped, wider, instead
        con.width = need.maximum if need.minimum > width else width
        con.print(tbl)
    finally:
        con.width = width


def print_rows(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    wrap: Sequence[str] = (),
    right: Sequence[str] = (),
    whole: bool = False,
) -> None:
    """Print ``rows`` (cells made ``safe``) as a :func:`table`, wrapping only ``wrap`` columns
    (``whole``: none, every column as wide as its widest cell, for logs and grep)."""
    tbl, rows = table(title), list(rows)
    for i, col in enumerate(columns):
        width = max([len(col), *(len(r[i]) for r in rows)]) if whole else None
        justify = "right" if col in right else "left"
        tbl.add_column(col, no_wrap=col not in wrap, justify=justify, min_width=width)
    for row in rows:
        tbl.add_row(*row)
    print_table(tbl)


def failure(
    problem: str,
    exit_code: int,
    *,
    kind: str,
    file: str | None = None,
    key: str | None = None,
    fix: str | None = None,
) -> dict[str, Any]:
    """The one shape of a ``--json`` failure: ``{"ok": false, "error": {...}}`` (docs/cli.md)."""
    error = {"type": kind, "exit_code": int(exit_code), "problem": problem}
    return {"ok": False, "error": {**error, "file": file, "key": key, "fix": fix}}


def with_failure(body: dict[str, Any], exc: Any, exit_code: int | None = None) -> dict[str, Any]:
    """``body`` (a command's own JSON fields) with ``ok``, and ``exc``'s error (a LockError)."""
    if exc is None:
        return {"ok": True, **{k: v for k, v in body.items() if k != "ok"}}
    code = exc.exit_code if exit_code is None else exit_code
    fail = failure(
        exc.problem, code, kind=type(exc).__name__, file=exc.path, key=exc.key, fix=exc.fix
    )
    return {**fail, **{k: v for k, v in body.items() if k not in fail}}


def print_json(data: Any) -> None:
    """Write ``data`` to stdout as indented, strict JSON (``NaN`` is not JSON: a number that is not
    finite is written as TOML spells it, the string ``"nan"``, ``"inf"`` or ``"-inf"``)."""
    text = json.dumps(json_numbers(data), indent=2, sort_keys=False, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def json_numbers(value: Any) -> Any:
    """``value`` with each float that is not finite replaced by its TOML spelling (docs/cli.md)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: json_numbers(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_numbers(v) for v in value]
    return value


def error(message: str) -> None:
    """An error on stderr (each line of a message with its fix made safe)."""
    _say("[bold red]error:[/]", message)


def warn(message: str) -> None:
    """A warning on stderr."""
    _say("[yellow]warning:[/]", message)


def _say(label: str, message: str) -> None:
    console(stderr=True).print(label, "\n".join(safe(line) for line in str(message).split("\n")))


def info(message: str) -> None:
    """A plain line on stderr, without rich (the warm path of a job start must not import it)."""
    sys.stderr.write(plain(message) + "\n")
    sys.stderr.flush()


# ---- the arguments the commands share ---------------------------------------------------------
def default_lock_path() -> str:
    """The lock a command reads when none is named: $KERNEL_LOCK, else ./kernel-lock.toml."""
    return os.environ.get("KERNEL_LOCK", DEFAULT_LOCK)


def add_lock_argument(p: argparse.ArgumentParser, what: str = "lock file") -> None:
    """The optional LOCK positional (``args.lock``; None when not given: ``default_lock_path``)."""
    p.add_argument(
        "lock", nargs="?", default=None, help=f"{what} (default: $KERNEL_LOCK or ./{DEFAULT_LOCK})"
    )


def add_flags(p: argparse.ArgumentParser, flags: dict[str, str]) -> None:
    """An on/off option for each ``flag: help``."""
    for flag, help in flags.items():
        p.add_argument(flag, action="store_true", help=help)


def add_trust_argument(p: argparse.ArgumentParser) -> None:
    """``--trust MODULE`` (repeatable, ``args.trust``)."""
    p.add_argument("--trust", action="append", default=[], metavar="MODULE", help=TRUST_HELP)


def load_lock(path: str, strict: bool = False, **options: Any) -> kernel_lock.KernelLock:
    """``kernel_lock.load`` for a command: warnings on stderr, a missing ``$KERNEL_LOCK`` named."""
    try:
        lock = kernel_lock.load(path, strict=strict, emit_warnings=False, **options)
    except LockError as exc:
        env = os.environ.get("KERNEL_LOCK")
        if env is None or env != path or os.path.isfile(path):
            raise
        # a missing lock named by the environment rather than by the user: say where it came from
        exc.problem += " ($KERNEL_LOCK names this path)"
        exc.fix = (
            "unset KERNEL_LOCK or point it at the lock, or name the lock on the command "
            f"line; {exc.fix or ''}"
        ).rstrip("; ")
        exc.args = (exc._render(),)
        raise
    for message in lock.warnings:
        warn(message)
    return lock


def open_lock(args: argparse.Namespace, **options: Any) -> kernel_lock.KernelLock:
    """:func:`load_lock` of ``args.lock``, set to :func:`default_lock_path` when not given."""
    args.lock = args.lock or default_lock_path()
    return load_lock(args.lock, **options)


def seconds(text: str, *, limit: float = MAX_SECONDS) -> float:
    """An argparse type: a positive, finite number of seconds, at most ``limit`` (a week)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 < value <= limit):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a time budget must be a positive, finite number of seconds, at most "
            f"{limit:g}"
        )
    return value


def count(lo: int = 1, hi: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse type: a whole number in ``[lo, hi]``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10) if text.strip().isascii() else None
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number from {lo} to {hi}")
        return value

    parse.__name__ = "count"
    return parse
