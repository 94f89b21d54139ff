"""What every slot's check shares in the worker: the import step, and the set-up its candidates
share.

**The import step** (``import_stop``): a check first imports the candidate's class; an ImportError
is an absent library (``kind="import"``), anything else a broken one (``kind="exception"``), and
either ends the check at ``phase="import"`` with the reason. Every slot's module (``correctness``,
``attention``, ``gated_mlp``, ``activation``) stops the same way.

**Shared set-up** (``SetupCache``): what a check computes that is the same for every candidate of a
slot (the seeded hard inputs, the float64 reference's forward and backward, torch.nn's own outputs
and errors, the yardstick every candidate is judged against) is computed once per worker process and
key, then reused by the slot's next candidates. The key is everything that determines it (slot,
semantics, device, size, the canonical overrides, the seed, the baseline class, the dtype and
regime, the baseline's BLAS library); the values are never handed to a candidate: a candidate runs
on clones (``measure.run_pass`` clones its input and grad_output), so one that writes into them in
place cannot change what the next one is judged against. A worker serves one library's candidates
(torch's own share one: ``isolation.worker.WorkerPool``), so the sharing stays inside one library's
process, and the handlers keep one cache per process (``SHARED``); a direct call of a check without
one computes everything itself, which is what the tests compare the sharing with.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from kernel_probe.candidates import Candidate
from kernel_probe.isolation.protocol import CheckReply, ImportKind
from kernel_probe.probe.measure import first_line, import_class

T = TypeVar("T")


def import_stop(
    cand: Candidate, device: str, *, needed: bool = True, whole: bool = False
) -> tuple[float, CheckReply | None]:
    """Import the candidate's class: (the seconds it took, None), or (0, the reply that stops the
    check at ``phase="import"``: an ImportError is an absent library, anything else a broken one),
    its error the exception's first line (``whole``: its whole message, as the norms' and Linear's
    checks say it). ``needed=False``: nothing to import (a bare function name), zero seconds."""
    start = time.perf_counter()
    if needed:
        try:
            import_class(cand.target)
        except Exception as exc:
            kind: ImportKind = "import" if isinstance(exc, ImportError) else "exception"
            error = f"{type(exc).__name__}: {exc}" if whole else first_line(exc, 400)
            return 0.0, CheckReply(
                candidate=cand.id, device=device, phase="import", kind=kind, error=error
            )
    return time.perf_counter() - start, None


class SetupCache:
    """The set-up a slot's candidates share, per key, computed by the first candidate that needs it.

    Bounded (``size`` entries, the least recently used dropped first): a worker serves the
    candidates of a slot one after another, so a few rows' worth is all that is ever reused.
    ``hits`` and ``misses`` say how often it served (the tests and the docs' figures)."""

    def __init__(self, size: int = 8):
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._size = size
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        """The entry for ``key``, made by ``make()`` the first time."""
        if key in self._entries:
            self._entries.move_to_end(key)
            self.hits += 1
            value: T = self._entries[key]
            return value
        self.misses += 1
        value = make()
        self._entries[key] = value
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return value


SHARED = SetupCache()  # the worker process's (kernel_probe.probe.handlers passes it to each check)
