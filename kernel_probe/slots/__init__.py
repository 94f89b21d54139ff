"""The slots the probe covers: one :class:`Slot` each, in a registry the generic stages read;
another package's through the ``kernel_probe.slots`` entry points (:func:`load_plugins`)."""

from __future__ import annotations

from kernel_lock import slots as specs

from . import activation, attention, gated_mlp, linear, norms
from .base import Option, Slot, Use

__all__ = ["ENTRY_POINTS", "SLOTS", "Option", "Slot", "Use", "load_plugins", "slot"]

ENTRY_POINTS = "kernel_probe.slots"

SLOTS: dict[str, Slot] = {
    s.name: s
    for s in (
        norms.LAYER_NORM,
        norms.RMS_NORM,
        linear.LINEAR,
        attention.ATTENTION,
        gated_mlp.GATED_MLP,
        activation.ACTIVATION,
    )
}


def slot(name: str) -> Slot:
    """The slot ``name`` (built in or loaded); KeyError for another."""
    return SLOTS[name]


def load_plugins(names: tuple[str, ...] | None = None) -> list[str]:
    """Load the slots other packages declare (``names``: only these); the problems, one a line."""
    from importlib.metadata import entry_points  # ~100 ms: only where plug-ins are asked for

    problems = []
    for ep in entry_points(group=ENTRY_POINTS):
        if ep.name in SLOTS or (names is not None and ep.name not in names):
            continue
        try:
            obj = ep.load()
            if not isinstance(obj, Slot) or obj.name != ep.name:
                raise TypeError(f"expected a kernel_probe.slots.Slot named {ep.name!r}")
            specs.register(obj.spec)
            SLOTS[obj.name] = obj
        except Exception as exc:  # a plug-in's bug must not stop the probe; it is reported
            problems.append(f"entry point {ep.name!r} ({ep.value}): {type(exc).__name__}: {exc}")
    return problems
