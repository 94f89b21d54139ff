"""What a worker process does with each request: one handler per op (``OPS``), over the transport
of ``kernel_probe.isolation.worker``. A candidate's check, try and timing go to its slot's module,
imported at its first request: a worker serves one library, and loads no other slot's code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from kernel_lock.format.slots import ACTIVATION, ATTENTION, GATED_MLP
from kernel_probe.candidates import Candidate
from kernel_probe.isolation import worker
from kernel_probe.isolation.protocol import (
    INTERPRETED,
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
    TimeReply,
    TimeRequest,
    TimingProgressMessage,
    TimingRow,
    TryReply,
    TryRequest,
)

__all__ = ["OPS", "dispatch", "serve"]

Progress = Callable[[TimingProgressMessage], None] | None


def serve() -> None:
    """A worker process's main (``worker.HANDLERS``): the transport's loop over :func:`dispatch`."""
    worker.serve(dispatch)


def _cand(request: CandidateRequest) -> Candidate:
    return Candidate.from_json(request["candidate"])


def _dtypes(request: CheckRequest) -> list[tuple[str, str]]:
    return [(dtype, regime) for dtype, regime in request["dtypes"]]


def _served(
    request: CandidateRequest,
    emit: Progress,
    check: Callable[[CheckRequest], Reply],
    try_once: Callable[[Any, str], dict[str, Any]],
    time_candidate: Callable[[TimeRequest, Progress], Reply],
) -> Reply:
    """A slot's check, try and timing requests, answered by that slot's own module's functions."""
    if request["op"] == "check":
        return check(request)
    if request["op"] == "try":
        return TryReply.from_json(try_once(_cand(request), request["device"]))
    return time_candidate(request, emit if request.get("progress") else None)


def _attention(request: CandidateRequest, emit: Progress) -> Reply:
    """The Attention slot's requests: its own checks and timing (kernel_probe.probe.attention)."""
    from kernel_probe.probe import attention, slotcheck  # this slot's code, at its first request

    def check(r: CheckRequest) -> Reply:  # torch's side of each case once per slot and row (SHARED)
        return attention.check(
            _cand(r),
            r["device"],
            _dtypes(r),
            canonical_overrides=r.get("canonical", {}),
            seed=r.get("seed", 0),
            shared=slotcheck.SHARED,
        )

    def time_candidate(r: TimeRequest, progress: Progress) -> Reply:
        return attention.time_candidate(
            _cand(r),
            r["device"],
            list(r["shapes"]),
            r["dtype"],
            r.get("options", {}),
            r.get("canonical", {}),
            progress=progress,
        )

    return _served(request, emit, check, attention.try_once, time_candidate)


def _gated_mlp(request: CandidateRequest, emit: Progress) -> Reply:
    """The GatedMLP slot's requests: its own checks and timing (kernel_probe.probe.gated_mlp)."""
    from kernel_probe.probe import gated_mlp  # this slot's code, when its first request comes

    def check(r: CheckRequest) -> Reply:
        return gated_mlp.check(
            _cand(r),
            r["device"],
            _dtypes(r),
            canonical_overrides=r.get("canonical", {}),
            hidden=r.get("hidden"),
        )

    def time_candidate(r: TimeRequest, progress: Progress) -> Reply:  # fixed repetitions
        return gated_mlp.time_candidate(
            _cand(r),
            r["device"],
            list(r["shapes"]),
            r["dtype"],
            r["regime"],
            r.get("options", {}),
            r.get("canonical", {}),
        )

    return _served(request, emit, check, gated_mlp.try_once, time_candidate)


def _activation(request: CandidateRequest, emit: Progress) -> Reply:
    """The Activation slot's requests: its checks and timing (no parameters, one function)."""
    from kernel_probe.probe import activation  # this slot's code, when its first request comes

    def check(r: CheckRequest) -> Reply:
        return activation.check(
            _cand(r),
            r["device"],
            _dtypes(r),
            canonical_overrides=r.get("canonical", {}),
            seed=r.get("seed", 0),
        )

    def time_candidate(r: TimeRequest, progress: Progress) -> Reply:
        return activation.time_candidate(
            _cand(r), r["device"], list(r["shapes"]), r["dtype"], r.get("options", {}), progress
        )

    return _served(request, emit, check, activation.try_once, time_candidate)


# the slots whose requests their own module answers (the norms and Linear: ``correctness``, below)
SLOT_MODULES: dict[str, Callable[[CandidateRequest, Progress], Reply]] = {
    ATTENTION: _attention,
    GATED_MLP: _gated_mlp,
    ACTIVATION: _activation,
}


def _ping(request: Request, emit: Progress) -> Reply:
    # torch and the measuring code once, up front, under the start timeout, before any candidate
    import torch  # noqa: F401

    from kernel_probe.probe import correctness  # noqa: F401  (torch; and measure)

    worker.record_baseline()
    return PingReply(pid=os.getpid())


def _fingerprint(request: Request, emit: Progress) -> Reply:
    from kernel_lock.fingerprint import with_torch  # imports torch: where torch already is

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


def _check(request: CheckRequest, emit: Progress) -> Reply:
    from kernel_probe.probe import correctness, slotcheck  # torch: loaded by the ping already
    from kernel_probe.probe.limits import CHECK_HIDDEN

    baseline, hidden = request.get("baseline"), request.get("hidden")
    return correctness.check(
        _cand(request),
        request["slot"],
        request["device"],
        _dtypes(request),
        canonical_overrides=request.get("canonical", {}),
        seed=request.get("seed", 0),
        hidden=CHECK_HIDDEN if hidden is None else hidden,
        baseline=None if baseline is None else Candidate.from_json(baseline),
        shared=slotcheck.SHARED,  # the inputs, reference and torch.nn's pass, once per slot and row
    )


def _try(request: TryRequest, emit: Progress) -> Reply:
    from kernel_probe.probe import correctness  # torch: loaded by the ping already

    ran = correctness.try_once(_cand(request), request["slot"], request["device"])
    return TryReply.from_json(ran)


def _time(request: TimeRequest, emit: Progress) -> Reply:
    from kernel_probe.probe import measure, timing  # torch; timing only once a candidate is timed

    cand = _cand(request)
    try:
        measure.import_class(cand.target)  # does its library bring Triton in?
    except Exception:
        pass  # timing reports it
    if worker.interpreting():  # interpreter times say nothing about the compiled kernel
        rows: list[TimingRow] = [
            {"implementation": cand.id, "shape": s, "error": f"not timed: {INTERPRETED}"}
            for s in request["shapes"]
        ]
        return TimeReply(candidate=cand.id, device=request["device"], rows=rows)
    return timing.time_candidate(
        cand,
        request["slot"],
        request["device"],
        list(request["shapes"]),
        request["dtype"],
        request["regime"],
        request.get("options", {}),
        progress=emit if request.get("progress") else None,
    )


def _candidate(request: CandidateRequest, emit: Progress) -> Reply:
    if request["slot"] in SLOT_MODULES:
        return SLOT_MODULES[request["slot"]](request, emit)
    if request["op"] == "check":
        return _check(request, emit)
    return _try(request, emit) if request["op"] == "try" else _time(request, emit)


OPS: dict[str, Callable[[Any, Progress], Reply]] = {
    "ping": _ping,
    "fingerprint": _fingerprint,
    "import": _import,
    "check": _candidate,
    "try": _candidate,
    "time": _candidate,
    "graph-attention": _graph_attention,
}


def dispatch(request: Request, emit: Progress = None) -> Reply:
    """The reply to one request (``emit`` sends a timing request's progress before it)."""
    return OPS[request["op"]](request, emit)
