"""What the trace's child (imports torch) knows of its own: which torch callables are the
functions the slots route (``F.layer_norm`` and ``torch.layer_norm`` are both ``layer_norm``).
What a call site computes with, which modules are sites and their public names are the slots'
(``SlotSpec.calls``, ``kernel_lock.slots.site_of``, ``public_name``): what ``kernel_lock.apply``
reads too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kernel_lock import slots as specs
from kernel_lock.slots.base import Functional, bound

__all__ = ["Function", "functions"]


@dataclass(frozen=True)
class Function:
    """A torch function of a slot: its public name, its name, and the slot's knowledge of it."""

    slot: str
    call: str
    name: str
    functional: Functional

    def inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        """The call's tensor inputs, in the slot's order (their shapes are the site's)."""
        given = bound(args, kwargs, self.functional.args)
        return [t for n in self.functional.inputs if isinstance(t := given.get(n), torch.Tensor)]


def functions() -> dict[Any, Function]:
    """Every torch callable of a function a slot routes (the slots registered now), by the
    callable: ``torch.nn.functional``'s first, then ``torch``'s own of the same name."""
    found: dict[Any, Function] = {}
    for spec in specs.SPECS.values():
        for name, functional in (spec.calls.functions if spec.calls else {}).items():
            for path, where in (("torch.nn.functional", F), ("torch", torch)):
                fn = getattr(where, name, None)
                if fn is not None and fn not in found:
                    found[fn] = Function(spec.name, f"{path}.{name}", name, functional)
    return found
