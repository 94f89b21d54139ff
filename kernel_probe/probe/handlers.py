"""What a worker process does with each request: the probe's handlers over the worker's transport.

``kernel_probe.isolation.worker`` is the transport (``Worker`` and ``WorkerPool`` in the probe's
process; ``serve``, the loop of one request and one reply a line, in the worker's). A worker process
runs :func:`serve` here, which hands that loop :func:`dispatch`: the request's meaning (import a
class, check a candidate, time it, answer the fingerprint) is decided here, by the slot's own module
(``correctness`` for the norms and Linear, ``attention``, ``gated_mlp``, ``activation``,
``graph_attention``, ``timing``). Each slot's module is imported when a request for it first comes
(the function-level imports below): a worker serves one library's candidates, and loads no other
slot's code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from kernel_lock.format.slots import ACTIVATION, ATTENTION, GATED_MLP
from kernel_probe.isolation import worker
from kernel_probe.isolation.protocol import (
    INTERPRETED,
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
    TimeReply,
    TimeRequest,
    TimingProgressMessage,
    TimingRow,
    TryReply,
    TryRequest,
)

__all__ = ["dispatch", "serve"]


def serve() -> None:
    """A worker process's main (started by ``child.spawn`` as ``worker.HANDLERS``): the transport's
    loop, answering with :func:`dispatch`."""
    worker.serve(dispatch)


Progress = Callable[[TimingProgressMessage], None] | None


def _served(
    request: CandidateRequest[Any],
    emit: Progress,
    slot: str,
    check: Callable[[CheckRequest], Reply],
    try_once: Callable[[Any, str], dict[str, Any]],
    time_candidate: Callable[[TimeRequest, Progress], Reply],
) -> Reply:
    """A slot's check, try and timing requests, answered by that slot's own module's functions (each
    given the request; ``time_candidate`` also the progress channel when the request asks for
    it)."""
    if isinstance(request, CheckRequest):
        return check(request)
    if isinstance(request, TryRequest):
        return TryReply.from_json(try_once(request.candidate, request.device))
    if isinstance(request, TimeRequest):
        return time_candidate(request, emit if request.progress else None)
    raise ProtocolError(f"the worker has no {slot} handler for {type(request).__name__}")


def _attention(request: CandidateRequest[Any], emit: Progress) -> Reply:
    """The Attention slot's requests: its own checks and timing (kernel_probe.probe.attention)."""
    from kernel_probe.probe import (
        attention,
        slotcheck,
    )  # this slot's code, when its first request comes

    def check(r: CheckRequest) -> Reply:  # torch's side of each case once per slot and row (SHARED)
        return attention.check(
            r.candidate,
            r.device,
            list(r.dtypes),
            canonical_overrides=r.canonical,
            seed=r.seed,
            shared=slotcheck.SHARED,
        )

    def time_candidate(r: TimeRequest, progress: Progress) -> Reply:
        return attention.time_candidate(
            r.candidate,
            r.device,
            list(r.shapes),
            r.dtype,
            r.options,
            r.canonical,
            progress=progress,
        )

    return _served(request, emit, ATTENTION, check, attention.try_once, time_candidate)


def _gated_mlp(request: CandidateRequest[Any], emit: Progress) -> Reply:
    """The GatedMLP slot's requests: its own checks and timing (kernel_probe.probe.gated_mlp)."""
    from kernel_probe.probe import gated_mlp  # this slot's code, when its first request comes

    def check(r: CheckRequest) -> Reply:
        return gated_mlp.check(
            r.candidate, r.device, list(r.dtypes), canonical_overrides=r.canonical, hidden=r.hidden
        )

    # fixed repetitions: no progress
    def time_candidate(r: TimeRequest, progress: Progress) -> Reply:
        return gated_mlp.time_candidate(
            r.candidate, r.device, list(r.shapes), r.dtype, r.regime, r.options, r.canonical
        )

    return _served(request, emit, GATED_MLP, check, gated_mlp.try_once, time_candidate)


def _activation(request: CandidateRequest[Any], emit: Progress) -> Reply:
    """The Activation slot's requests: its checks and timing (no parameters, one function)."""
    from kernel_probe.probe import activation  # this slot's code, when its first request comes

    def check(r: CheckRequest) -> Reply:
        return activation.check(
            r.candidate, r.device, list(r.dtypes), canonical_overrides=r.canonical, seed=r.seed
        )

    def time_candidate(r: TimeRequest, progress: Progress) -> Reply:
        return activation.time_candidate(
            r.candidate, r.device, list(r.shapes), r.dtype, r.options, progress
        )

    return _served(request, emit, ACTIVATION, check, activation.try_once, time_candidate)


# the slots whose requests their own module answers (the norms and Linear: ``correctness``, below)
SLOT_MODULES: dict[str, Callable[[CandidateRequest[Any], Progress], Reply]] = {
    ATTENTION: _attention,
    GATED_MLP: _gated_mlp,
    ACTIVATION: _activation,
}


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
        from kernel_lock import fingerprint  # imports torch: imported where torch already is

        return FingerprintReply(fields=fingerprint.current())
    # the norms' and Linear's measuring code: loaded by the ping already (a cost paid at start-up)
    from kernel_probe.probe import correctness, measure, slotcheck
    from kernel_probe.probe.limits import CHECK_HIDDEN

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
    if isinstance(request, CandidateRequest) and request.slot in SLOT_MODULES:
        return SLOT_MODULES[request.slot](request, emit)
    if isinstance(request, CheckRequest):
        return correctness.check(
            request.candidate,
            request.slot,
            request.device,
            list(request.dtypes),
            canonical_overrides=request.canonical,
            seed=request.seed,
            hidden=CHECK_HIDDEN if request.hidden is None else request.hidden,
            baseline=request.baseline,
            # the inputs, reference and torch.nn's pass, once per slot and row
            shared=slotcheck.SHARED,
        )
    if isinstance(request, TryRequest):
        return TryReply.from_json(
            correctness.try_once(request.candidate, request.slot, request.device)
        )
    if isinstance(request, TimeRequest):
        from kernel_probe.probe import timing  # only once a candidate is timed

        try:
            measure.import_class(request.candidate.target)  # does its library bring Triton in?
        except Exception:
            pass  # timing reports it
        # interpreter times say nothing about the compiled kernel: never timed
        if worker.interpreting():
            rows: list[TimingRow] = [
                {
                    "implementation": request.candidate.id,
                    "shape": s,
                    "error": f"not timed: {INTERPRETED}",
                }
                for s in request.shapes
            ]
            return TimeReply(candidate=request.candidate.id, device=request.device, rows=rows)
        return timing.time_candidate(
            request.candidate,
            request.slot,
            request.device,
            list(request.shapes),
            request.dtype,
            request.regime,
            request.options,
            progress=emit if request.progress else None,
        )
    raise ProtocolError(f"the worker has no handler for {type(request).__name__}")
