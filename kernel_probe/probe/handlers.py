"""What a worker process does with each request: one handler per op (``OPS``). A candidate's
check, try and timing go to its slot, whose code is imported at its first request.
"""

from __future__ import annotations

import os
import time
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
    GraphAttentionRequest,
    ImportReply,
    ImportRequest,
    PingReply,
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


def _cand(request: CandidateRequest) -> Candidate:
    return Candidate.from_json(request["candidate"])


def _ping(request: Request, emit: Progress) -> Reply:
    # torch and the measuring code once, up front, under the start timeout, before any candidate
    import torch  # noqa: F401

    from kernel_probe.probe import correctness  # noqa: F401  (torch; and measure)

    worker.record_baseline()
    return PingReply(pid=os.getpid())


def _fingerprint(request: Request, emit: Progress) -> Reply:
    from kernel_lock import fingerprint as with_torch  # imports torch: where torch already is

    return FingerprintReply(fields=with_torch.current())


def _graph_attention(request: GraphAttentionRequest, emit: Progress) -> Reply:
    from kernel_probe.probe import graph_attention  # anemoi and PyG: only when asked

    backend, device = request["backend"], request["device"]
    rows = graph_attention.check(backend, device, list(request["dtypes"]), request.get("seed", 0))
    return CheckReply(candidate=backend, device=device, rows=rows)


def _import(request: ImportRequest, emit: Progress) -> Reply:
    """Under its own time budget: a library that hangs here costs only that."""
    from kernel_probe.probe import measure  # torch: loaded by the ping already

    start = time.perf_counter()
    try:
        measure.import_class(request["target"])
    except ImportError as exc:
        return ImportReply(ok=False, kind="import", error=f"{type(exc).__name__}: {exc}")
    except (Exception, SystemExit) as exc:  # a library calling sys.exit() on import is broken
        return ImportReply(ok=False, kind="exception", error=f"{type(exc).__name__}: {exc}")
    return ImportReply(ok=True, seconds=time.perf_counter() - start)


def _slot(request: CandidateRequest) -> Slot:
    """The request's slot (one another package declares: loaded at its first request)."""
    if request["slot"] not in slot_behaviour.SLOTS:
        slot_behaviour.load_plugins((request["slot"],))
    return slot_behaviour.slot(request["slot"])


def _check(request: CheckRequest, emit: Progress) -> Reply:
    from kernel_probe.probe import measure  # torch: loaded by the ping already

    baseline = request.get("baseline")
    return _slot(request).check(
        _cand(request),
        request["device"],
        [(dtype, regime) for dtype, regime in request["dtypes"]],
        canonical=request.get("canonical", {}),
        seed=request.get("seed", 0),
        hidden=request.get("hidden"),
        baseline=None if baseline is None else Candidate.from_json(baseline),
        shared=measure.SHARED,  # the inputs, reference and torch's pass, once per slot and row
    )


def _try(request: TryRequest, emit: Progress) -> Reply:
    return TryReply.from_json(_slot(request).try_once(_cand(request), request["device"]))


def _time(request: TimeRequest, emit: Progress) -> Reply:
    return _slot(request).time(
        _cand(request),
        request["device"],
        list(request["shapes"]),
        request["dtype"],
        request["regime"],
        request.get("options", {}),
        request.get("canonical", {}),
        emit if request.get("progress") else None,
    )


OPS: dict[str, Callable[[Any, Progress], Reply]] = {
    "ping": _ping,
    "fingerprint": _fingerprint,
    "import": _import,
    "check": _check,
    "try": _try,
    "time": _time,
    "graph-attention": _graph_attention,
}


def dispatch(request: Request, emit: Progress = None) -> Reply:
    """The reply to one request (``emit`` sends a timing request's progress before it)."""
    return OPS[request["op"]](request, emit)
