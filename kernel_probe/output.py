"""Presentation helpers: one rich console on stdout, one on stderr, JSON printing.

rich honours NO_COLOR and narrow terminals by itself; we only make sure nothing is wrapped in JSON
mode and that errors go to stderr.
"""

from __future__ import annotations

import json
import sys
from typing import Any

_consoles: dict[str, Any] = {}


def console(stderr: bool = False):
    key = "err" if stderr else "out"
    if key not in _consoles:
        from rich.console import Console

        _consoles[key] = Console(stderr=stderr, highlight=False, soft_wrap=True)
    return _consoles[key]


def reset() -> None:
    """Forget the consoles (tests redirect sys.stdout between calls)."""
    _consoles.clear()


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def error(message: str) -> None:
    from rich.markup import escape

    console(stderr=True).print(f"[bold red]error:[/] {escape(message)}")


def warn(message: str) -> None:
    from rich.markup import escape

    console(stderr=True).print(f"[yellow]warning:[/] {escape(message)}")


def info(message: str) -> None:
    from rich.markup import escape

    console(stderr=True).print(escape(message))
