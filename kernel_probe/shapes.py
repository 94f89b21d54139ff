"""Model shapes as the command line and profiles write them: ROWSxHIDDEN (ROWSxINxOUT for
Linear), ``*`` and ``X`` read as ``x``, each normalised (:func:`normal_shape`) before it is
compared, digested or written, so ``2048*1024`` and ``2048x1024`` reuse one lock. No torch here."""

from __future__ import annotations

from collections.abc import Sequence


def parse_shape(text: str) -> tuple[int, int, int | None]:
    """'40320x1024' -> (40320, 1024, None); '8192x1024x4096' -> (8192, 1024, 4096) for Linear."""
    parts = text.strip().lower().replace("*", "x").split("x")
    if len(parts) not in (2, 3) or not all(
        p.isascii() and p.isdigit() and int(p) > 0 for p in parts
    ):
        raise ValueError(
            f"--shape {text!r}: expected ROWSxHIDDEN (e.g. 40320x1024) or ROWSxINxOUT for "
            "Linear, all positive integers"
        )
    rows, hidden = int(parts[0]), int(parts[1])
    out = int(parts[2]) if len(parts) == 3 else None
    return rows, hidden, out


def normal_shape(text: str) -> str:
    """The one spelling of a shape: '2048*1024', ' 2048X01024' -> '2048x1024' (ValueError if it is
    none)."""
    rows, hidden, out = parse_shape(text)
    return "x".join(str(n) for n in (rows, hidden, out) if n is not None)


def normal_shapes(texts: Sequence[str]) -> tuple[str, ...]:
    """Each shape normalised, the first of any repeated one kept (the order is the user's)."""
    return tuple(dict.fromkeys(normal_shape(t) for t in texts))
