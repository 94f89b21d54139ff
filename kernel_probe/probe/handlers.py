"""What a worker process does with each request: one handler per op (``OPS``). A candidate's
check, try and timing go to its slot, whose code is imported at its first request.
"""

from __future__ import annotations

import os
import time
import typing
from collections.abc import Callable
from typing import Any

from kernel_probe import slots as slot_behaviour
from kernel_probe.candidates import Candidate
from kernel_probe.isolation import worker
from kernel_probe.isolation.protocol import (
    CandidateRequest,
    CheckReply,
    CheckRequest,
    FingerprintReply,
    FingerprintRequest,
    GraphAttentionRequest,
    ImportReply,
    ImportRequest,
    PingReply,
    PingRequest,
    Reply,
    Request,
    TimeRequest,
    TimingProgressMessage,
    TryReply,
    TryRequest,
)
from kernel_probe.slots import Slot

__all__ = ["OPS", "dispatch", "serve"]

Progress = Callable[[TimingProgressMessage], None] | None


def serve() -> None:
    """A worker process's main (``worker.HANDLERS``): the transport's loop over :func:`dispatch`."""
    worker.serve(dispatch)


def _ping(request: PingRequest, emit: Progress) -> Reply:
    # torch and the measuring code once, up front, under the start timeout, before any candidate
    import torch  # noqa: F401

    from kernel_probe.probe import correctness  # noqa: F401  (torch; and measure)

    worker.record_baseline()
    return PingReply(pid=os.getpid())


def _fingerprint(request: FingerprintRequest, emit: Progress) -> Reply:
    from kernel_lock import fingerprint as with_torch  # imports torch: where torch already is

    return FingerprintReply(fields=with_torch.current())


def _graph_attention(request: GraphAttentionRequest, emit: Progress) -> Reply:
    from kernel_probe.probe import graph_attention  # anemoi and PyG: only when asked

    backend, device = request.backend, request.device
    rows = graph_attention.check(backend, device, list(request.dtypes), request.seed)
    return CheckReply(candidate=backend, device=device, rows=rows)


def _import(request: ImportRequest, emit: Progress) -> Reply:
    """Under its own time budget: a library that hangs here costs only that."""
    from kernel_probe.probe import measure  # torch: loaded by the ping already

    start = time.perf_counter()
    try:
        measure.import_class(request.target)
    except ImportError as exc:
        return ImportReply(ok=False, kind="import", error=f"{type(exc).__name__}: {exc}")
    except (Exception, SystemExit) as exc:  # a library calling sys.exit() on import is broken
        return ImportReply(ok=False, kind="exception", error=f"{type(exc).__name__}: {exc}")
    return ImportReply(ok=True, seconds=time.perf_counter() - start)


def _slot(request: CandidateRequest) -> tuple[Slot, Candidate]:
    """The request's slot (one another package declares: loaded at its first request), candidate."""
    if request.slot not in slot_behaviour.SLOTS:
        slot_behaviour.load_plugins((request.slot,))
    return slot_behaviour.slot(request.slot), Candidate.from_json(request.candidate)


def _check(request: CheckRequest, emit: Progress) -> Reply:
    from kernel_probe.probe import measure  # torch: loaded by the ping already

    slot, cand, baseline = *_slot(request), request.baseline
    return slot.check(
        cand,
        request.device,
        list(request.dtypes),
        canonical=request.canonical,
        seed=request.seed,
        hidden=request.hidden,
        baseline=None if baseline is None else Candidate.from_json(baseline),
        shared=measure.SHARED,  # the inputs, reference and torch's pass, once per slot and row
    )


def _try(request: TryRequest, emit: Progress) -> Reply:
    slot, cand = _slot(request)
    return TryReply.from_json(slot.try_once(cand, request.device))


def _time(request: TimeRequest, emit: Progress) -> Reply:
    slot, cand = _slot(request)
    return slot.time(
        cand,
        request.device,
        list(request.shapes),
        request.dtype,
        request.regime,
        request.options,
        request.canonical,
        emit if request.progress else None,
    )


# each op's handler, by the request class it takes (``protocol.REQUESTS``: op -> that class)
_HANDLERS = (_ping, _fingerprint, _import, _check, _try, _time, _graph_attention)
OPS: dict[type[Request], Callable[[Any, Progress], Reply]] = {
    typing.get_type_hints(handler)["request"]: handler for handler in _HANDLERS
}


def dispatch(request: Request, emit: Progress = None) -> Reply:
    """The reply to one request (``emit`` sends a timing request's progress before it)."""
    return OPS[type(request)](request, emit)
