"""Model shapes as the command line and profiles write them: ROWSxHIDDEN (ROWSxINxOUT for
Linear), ``*`` and ``X`` read as ``x``, each normalised (:func:`normal_shape`) before it is
compared, digested or written, so ``2048*1024`` and ``2048x1024`` reuse one lock; ``SLOT=SHAPE``
(``--shape LayerNorm=8192x1024``) is one slot's own. Which form a slot takes is its own
(``Slot.shape_form``); :func:`refuse_misread` holds the shapes to it. No torch here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kernel_lock.slots import slot_name_fix
from kernel_probe.errors import UsageError

FORMS = (
    "expected ROWSxHIDDEN (e.g. 40320x1024), ROWSxINxOUT for Linear, or SLOT=SHAPE for one "
    "slot's own shape, all positive integers"
)


def parse_shape(text: str) -> tuple[int, int, int | None]:
    """'40320x1024' -> (40320, 1024, None); '8192x1024x4096' -> (8192, 1024, 4096) for Linear."""
    parts = text.strip().lower().replace("*", "x").split("x")
    if len(parts) not in (2, 3) or not all(
        p.isascii() and p.isdigit() and int(p) > 0 for p in parts
    ):
        raise ValueError(f"--shape {text!r}: {FORMS}")
    rows, hidden = int(parts[0]), int(parts[1])
    out = int(parts[2]) if len(parts) == 3 else None
    return rows, hidden, out


def shape_work(shape: str) -> float:
    """A norm's or Linear's shape: its rows x hidden elements (what a call's time grows with)."""
    rows, hidden, _ = parse_shape(shape)
    return float(rows * hidden)


def normal_shape(text: str) -> str:
    """The one spelling of a shape: '2048*1024', ' 2048X01024' -> '2048x1024' (ValueError if it is
    none)."""
    rows, hidden, out = parse_shape(text)
    return "x".join(str(n) for n in (rows, hidden, out) if n is not None)


def normal_shapes(texts: Sequence[str]) -> tuple[str, ...]:
    """Each shape normalised, the first of any repeated one kept (the order is the user's)."""
    return tuple(dict.fromkeys(normal_shape(t) for t in texts))


Split = tuple[tuple[str, ...], dict[str, tuple[str, ...]]]  # (every slot's, per slot its own)


def split_shapes(texts: Sequence[str]) -> Split:
    """``--shape``'s values as (the shapes of every slot, per slot its own ``SLOT=SHAPE``), each
    normalised (ValueError naming the value that is no shape).

    >>> split_shapes(["2048*1024", "LayerNorm=8192x1024", "2048x1024"])
    (('2048x1024',), {'LayerNorm': ('8192x1024',)})
    """
    own: dict[str, list[str]] = {}
    for text in texts:
        slot, sep, shape = text.partition("=")
        if sep:
            try:
                own.setdefault(slot.strip(), []).append(normal_shape(shape))
            except ValueError:
                raise ValueError(f"--shape {text!r}: {FORMS}") from None
    common = normal_shapes([t for t in texts if "=" not in t])
    return common, {slot: tuple(dict.fromkeys(shapes)) for slot, shapes in own.items()}


def recorded(own: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Per-slot shapes as the inputs digest and the lock's options record them, ``SLOT=SHAPE``
    each; none given: nothing, so a lock probed without them keeps its digest."""
    listed = [f"{slot}={shape}" for slot, shapes in sorted(own.items()) for shape in shapes]
    return {"slot_shapes": listed} if listed else {}


def refuse_misread(
    common: Sequence[str], own: Mapping[str, Sequence[str]], slots: Mapping[str, Any]
) -> None:
    """Exit 2 for a shape a probed slot (``slots``: name -> its ``Slot``) would misread: one with
    more parts than the slot's form (batch x sequence x hidden where a norm takes ROWSxHIDDEN),
    or a ``SLOT=SHAPE`` for a slot that is unknown, not probed or timed at its own declaration."""
    for name, shapes in own.items():
        said, slot = f"--shape {name}={shapes[0]}", slots.get(name)
        if slot is None:
            raise UsageError(f"{said}: {name!r} is not a slot this probe covers", fix=_fix(name))
        if not slot.shape_form:
            flag = slot.option.flag if slot.option is not None else "its own option"
            raise UsageError(f"{said}: {name} is not timed at a --shape", fix=f"use {flag}")
        if long := [shape for shape in shapes if _too_long(slot, shape)]:
            raise _misread(long[0], [name], [], own=True)
    for shape in common:
        rest = {n: s for n, s in slots.items() if n not in own}
        if misread := [n for n, s in rest.items() if _too_long(s, shape)]:
            takes = [n for n, s in rest.items() if _parts(s.shape_form) >= _parts(shape)]
            raise _misread(shape, misread, takes, own=False)


def _fix(name: str) -> str:
    from kernel_probe import slots as behaviour  # reason: the slots' registry imports this module

    if name in behaviour.SLOTS:
        return f"add --slot {name}, or drop its --shape"
    return slot_name_fix(name)


def _parts(form: str) -> int:
    return len(form.split("x")) if form else 0


def _too_long(slot: Any, shape: str) -> bool:
    """Whether ``shape`` has more parts than ``slot``'s form (a form of its own: never)."""
    return bool(slot.shape_form) and _parts(shape) > _parts(slot.shape_form)


def _misread(shape: str, misread: Sequence[str], takes: Sequence[str], *, own: bool) -> UsageError:
    """A three-part shape for slots that take two (``misread``; ``own``: as its own SLOT=SHAPE):
    how it reads (as ``takes`` take it), and the forms to use."""
    rows, width, out = parse_shape(shape)
    read = f"read as ROWSxINxOUT ({rows} rows, {width} in, {out} out)"
    read += f", as {', '.join(takes)} takes it" if takes else ""
    form = f"{', '.join(misread)} take{'s' if len(misread) == 1 else ''} ROWSxHIDDEN"
    rows_of, said = f"{rows * width}x{out}", f"{misread[0]}={shape}" if own else shape
    instead = f"--shape {misread[0]}={rows_of}" if own else f"--shape {rows_of}"
    if not own:  # or each slot its own
        one = [f"--shape {misread[0]}={rows_of}", *(f"--shape {n}={rows_of}xOUT" for n in takes)]
        instead += f" (one slot's own shape: {', '.join(one)})"
    return UsageError(
        f"--shape {said}: {read}, so {rows} rows, not {rows}*{width}; {form}",
        fix=f"if it is batch x sequence x hidden, the rows are {rows}*{width}: {instead}; or "
        "--model SPEC, which reads each call site's shape",
    )
