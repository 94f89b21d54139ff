"""Presentation helpers: one rich console on stdout, one on stderr, JSON printing, and the two flags
every command shares to choose its presentation (``--json``, ``--debug``), declared once as argparse
parents.

rich honours NO_COLOR and narrow terminals by itself; we only make sure nothing is wrapped in JSON
mode and that errors go to stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

_consoles: dict[str, Any] = {}


def debug_flag() -> argparse.ArgumentParser:
    """``--debug`` as an argparse parent (``parents=[debug_flag()]``): every command takes it."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    return p


def json_flag(help: str | None = None) -> argparse.ArgumentParser:
    """``--json`` as an argparse parent: every command that can print JSON takes it, ``help`` saying
    what it prints; its usage errors and failures are then JSON objects on stdout too
    (kernel_probe.cli)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", help=help)
    return p


def console(stderr: bool = False):
    """The shared rich console on stdout (or stderr), created on first use."""
    key = "err" if stderr else "out"
    if key not in _consoles:
        from rich.console import Console

        _consoles[key] = Console(stderr=stderr, highlight=False, soft_wrap=True)
    return _consoles[key]


def reset() -> None:
    """Forget the consoles (tests redirect sys.stdout between calls)."""
    _consoles.clear()


# What is never printed as itself: C0 and C1 controls, and Unicode's invisible format characters
# (category Cf: bidi embeddings, overrides and isolates U+202A-U+202E and U+2066-U+2069, zero-width
# U+200B-U+200F, U+2060-U+2064, U+FEFF, soft hyphen, tags ...) and the line and paragraph separators
# U+2028 / U+2029, which can make a lock's text read as something else (tests compare this with
# unicodedata's Cf, Zl and Zp sets).
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)


def safe(value: Any) -> str:
    """``value`` as text for a rich console: control and format characters shown as escapes (no
    terminal sequence from a file ever reaches the terminal) and rich markup escaped (``[/bold]`` in
    a lock is printed, not interpreted). Every string that comes from a file or a library goes
    through this."""
    from rich.markup import escape

    return escape(_controls_escaped(str(value)))


def _controls_escaped(text: str) -> str:
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def table(title: str | None = None, **options: Any):
    """A compact rich table (one header rule, no outer frame): the probe's tables fit 80 columns."""
    from rich import box
    from rich.table import Table

    options = {
        "box": box.SIMPLE_HEAD,
        "show_edge": False,
        "pad_edge": False,
        "title_justify": "left",
        **options,
    }
    return Table(title=title, **options)


def print_table(tbl: Any, *, stderr: bool = False) -> None:
    """Print ``tbl`` no narrower than it needs: columns marked ``no_wrap`` (ids, shapes, numbers)
    are never cut or wrapped mid-word, even at 80 columns or in a log without a terminal; other
    columns wrap at spaces. A table that cannot fit is printed wider than the console instead of
    truncated."""
    from rich.measure import Measurement
    from rich.text import Text

    con = console(stderr)
    for column in tbl.columns:  # a wrapping column is at least as wide as its longest word
        if not column.no_wrap:
            words = [
                w
                for cell in column.cells
                for w in (
                    Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)
                ).split()
            ]
            column.min_width = max([column.min_width or 0, *(len(w) for w in words)])
    need = Measurement.get(con, con.options.update(width=100_000), tbl).minimum
    width = con.width
    try:
        con.width = max(width, need)
        con.print(tbl)
    finally:
        con.width = width


def failure(
    problem: str,
    exit_code: int,
    *,
    kind: str,
    file: str | None = None,
    key: str | None = None,
    fix: str | None = None,
) -> dict[str, Any]:
    """The one shape of a failure under ``--json``, for every command: ``{"ok": false, "error":
    {...}}`` (a command adds its own fields beside ``ok`` and ``error``; docs/cli.md)."""
    return {
        "ok": False,
        "error": {
            "type": kind,
            "exit_code": int(exit_code),
            "problem": problem,
            "file": file,
            "key": key,
            "fix": fix,
        },
    }


def with_failure(body: dict[str, Any], exc: Any, exit_code: int | None = None) -> dict[str, Any]:
    """``body`` (a command's own JSON fields) with ``ok`` and, when ``exc`` (a LockError) is given,
    its ``error`` in the shape of :func:`failure`."""
    if exc is None:
        return {"ok": True, **{k: v for k, v in body.items() if k != "ok"}}
    code = exc.exit_code if exit_code is None else exit_code
    fail = failure(
        exc.problem, code, kind=type(exc).__name__, file=exc.path, key=exc.key, fix=exc.fix
    )
    return {**fail, **{k: v for k, v in body.items() if k not in fail}}


def print_json(data: Any) -> None:
    """Write ``data`` to stdout as indented JSON."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def _lines(message: str) -> str:
    """A multi-line message (an error with its fix) keeps its lines; each is made safe."""
    return "\n".join(safe(line) for line in str(message).split("\n"))


def error(message: str) -> None:
    """An error line on stderr."""
    console(stderr=True).print(f"[bold red]error:[/] {_lines(message)}")


def warn(message: str) -> None:
    """A warning line on stderr."""
    console(stderr=True).print(f"[yellow]warning:[/] {_lines(message)}")


def info(message: str) -> None:
    """A plain line on stderr, written without rich (the warm path of a job start prints one line
    and must not pay for importing rich); control characters are shown as escapes, as ``safe``
    does."""
    sys.stderr.write(plain(message) + "\n")
    sys.stderr.flush()


def plain(value: Any) -> str:
    """``value`` as text for a plain stream: each line's control characters shown as escapes."""
    return "\n".join(_controls_escaped(line) for line in str(value).split("\n"))
