"""The child process of the job-start check: resolves the slots it is given with ``factory`` and
prints one line of verdicts. Started by ``kernel_lock.trust.confirming.child_verdicts`` (``python
-c``), so the foreign code an import runs never runs in the checking process; nothing imports this
module.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ..errors import KernelUnavailable, LockError
from ..lock import loads
from ..resolve import factory
from .confirming import MARK

__all__ = [
    "main",
]


def _child_verdict(request: Mapping[str, Any], slot: str) -> dict[str, Any] | None:
    """What ``factory`` said of ``slot``: None when it built, else the error as a dict."""
    try:
        lock = loads(
            request["text"], path=request["path"], trust=request["trust"], emit_warnings=False
        )
        factory(lock, slot, request["mode"], verify_environment=False)
        return None
    except LockError as exc:
        return {"exit_code": exc.exit_code, "problem": exc.problem, "key": exc.key, "fix": exc.fix}
    except BaseException as exc:  # the import path reports it as unavailable too
        return {
            "exit_code": KernelUnavailable.exit_code,
            "problem": f"slot {slot}: resolving it raised {type(exc).__name__}: {exc}",
            "key": f"slots.{slot}",
            "fix": "repair or reinstall that library, or re-run `kernel-probe`",
        }


def main(request: Mapping[str, Any]) -> None:
    """The child of ``confirming.child_verdicts``: ``factory`` for each slot asked, one JSON line of
    verdicts."""
    import json
    import os

    verdicts: dict[str, Any] = {}
    try:
        for slot in request["slots"]:
            verdicts[slot] = _child_verdict(request, slot)
    finally:
        sys.stdout.write("\n" + MARK + json.dumps(verdicts) + "\n")
        sys.stdout.flush()
        os._exit(0)  # no atexit hook or thread of an imported library decides the outcome
