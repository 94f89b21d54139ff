"""The fingerprint a check takes: torch's where torch is imported already, else the torch-free read.

Where torch is imported (a training or inference process), asking it costs nothing and is what a
lock was written from; elsewhere (a job's start) ``torchless`` reads the same facts from files.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from . import with_torch

__all__ = [
    "USE_IMPORTED_TORCH",
    "device_here",
    "for_check",
]

# ``torchless`` (the file readers: torch's version file, NVML, KFD, visibility) is imported only
# where torch is not: a process that has torch asks it, and pays nothing for the readers it does not
# use

# Where torch is imported already (a training or inference process), asking it costs nothing and is
# what a lock was written from; tests turn this off to read the files in a process that has torch.
USE_IMPORTED_TORCH = True


def for_check(checked: Iterable[str] | None = None) -> dict[str, Any]:
    """The fingerprint a check compares with a lock: from torch where it is imported already, else
    read without importing it (``torchless``), which falls back to torch for a fact in
    ``checked`` (default: all) that it cannot read with certainty, saying which and why at DEBUG."""
    if USE_IMPORTED_TORCH and "torch" in sys.modules:
        return with_torch.current()
    from . import torchless

    return torchless.current(checked)


def device_here() -> dict[str, Any]:
    """``device_facts`` of this machine, by the same rule as :func:`for_check` (torch-free where
    torch is not imported and every device fact can be read without it)."""
    if not (USE_IMPORTED_TORCH and "torch" in sys.modules):
        from . import torchless

        facts = torchless.device()
        if facts is not None:
            return facts
    return with_torch.device_facts(with_torch.import_torch())
