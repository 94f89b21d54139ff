"""What a worker process does with each request: the probe's handlers over the worker's transport.

``kernel_probe.isolation.worker`` is the transport (``Worker`` and ``WorkerPool`` in the probe's
process; ``serve``, the loop of one request and one reply a line, in the worker's). A worker process
runs :func:`serve` here, which hands that loop :func:`dispatch`: the request's meaning (import a
class, check a candidate, time it, answer the fingerprint) is decided here: a candidate's requests
by its slot (``kernel_probe.slots``), whose measuring module is imported when a request for it
first comes: a worker serves one library's candidates, and loads no other slot's code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from kernel_probe import slots as slot_behaviour
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
    ProtocolError,
    Reply,
    Request,
    TimeRequest,
    TimingProgressMessage,
    TryReply,
    TryRequest,
)

__all__ = ["dispatch", "serve"]


def serve() -> None:
    """A worker process's main (started by ``child.spawn`` as ``worker.HANDLERS``): the transport's
    loop, answering with :func:`dispatch`."""
    worker.serve(dispatch)


def dispatch(
    request: Request[Any], emit: Callable[[TimingProgressMessage], None] | None = None
) -> Reply:
    """The reply to one request (``emit`` sends a timing request's progress before it)."""
    if isinstance(request, PingRequest):
        # torch and the measuring code once, up front, under the start timeout, before any candidate
        import torch  # noqa: F401

        from kernel_probe.probe import correctness  # noqa: F401  (and measure)

        worker.record_baseline()
        return PingReply(pid=os.getpid())
    if isinstance(request, FingerprintRequest):
        from kernel_lock.fingerprint import (
            with_torch,
        )  # imports torch: imported where torch already is

        return FingerprintReply(fields=with_torch.current())
    # the norms' and Linear's measuring code: loaded by the ping already (a cost paid at start-up)
    from kernel_probe.probe import measure

    if isinstance(request, GraphAttentionRequest):
        from kernel_probe.probe import graph_attention  # anemoi and PyG: only when asked

        measured = graph_attention.check(
            request.backend, request.device, list(request.dtypes), request.seed
        )
        return CheckReply(candidate=request.backend, device=request.device, rows=measured)

    # under its own time budget: a library that hangs here costs only that
    if isinstance(request, ImportRequest):
        start = time.perf_counter()
        try:
            measure.import_class(request.target)
        except ImportError as exc:
            return ImportReply(ok=False, kind="import", error=f"{type(exc).__name__}: {exc}")
        except (
            Exception,
            SystemExit,
        ) as exc:  # a library calling sys.exit() on import is broken, not absent
            return ImportReply(ok=False, kind="exception", error=f"{type(exc).__name__}: {exc}")
        return ImportReply(ok=True, seconds=time.perf_counter() - start)
    if isinstance(request, CandidateRequest):
        if request.slot not in slot_behaviour.SLOTS:  # a slot another package declares
            slot_behaviour.load_plugins((request.slot,))
        slot = slot_behaviour.slot(request.slot)
        if isinstance(request, CheckRequest):
            return slot.check(
                request.candidate,
                request.device,
                list(request.dtypes),
                canonical=request.canonical,
                seed=request.seed,
                hidden=request.hidden,
                baseline=request.baseline,
                # torch's side of each case (inputs, reference, torch.nn's pass) once per row
                shared=measure.SHARED,
            )
        if isinstance(request, TryRequest):
            return TryReply.from_json(slot.try_once(request.candidate, request.device))
        if isinstance(request, TimeRequest):
            return slot.time(
                request.candidate,
                request.device,
                list(request.shapes),
                request.dtype,
                request.regime,
                request.options,
                request.canonical,
                emit if request.progress else None,
            )
    raise ProtocolError(f"the worker has no handler for {type(request).__name__}")
