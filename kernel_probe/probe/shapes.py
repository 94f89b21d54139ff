"""Model shapes as the command line and profiles write them (no torch here: profiles load without it)."""

from __future__ import annotations


def parse_shape(text: str) -> tuple[int, int, int | None]:
    """'40320x1024' -> (40320, 1024, None); '8192x1024x4096' -> (8192, 1024, 4096) for Linear."""
    parts = text.lower().replace("*", "x").split("x")
    if len(parts) not in (2, 3) or not all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(
            f"--shape {text!r}: expected ROWSxHIDDEN (e.g. 40320x1024) or ROWSxINxOUT for Linear, all positive integers"
        )
    rows, hidden = int(parts[0]), int(parts[1])
    out = int(parts[2]) if len(parts) == 3 else None
    return rows, hidden, out
