"""The BLAS library a Linear runs under on a GPU, in the worker: the candidate's own
(``Candidate.blas``) while it is checked and timed, the classic one for torch.nn's baseline, and the
process's previous choice restored afterwards (a worker serves other candidates). Names and applying
one: ``kernel_lock.slots.linear``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from kernel_lock.slots import linear as blas_lib
from kernel_probe.candidates import Candidate


class BlasNotOffered(Exception):
    """The candidate's BLAS library is not one this torch build offers."""


def blas_device(cand: Candidate, device: str) -> str:
    """The device type whose BLAS libraries name the candidate's (``cuda``/``rocm``); '' where none
    applies."""
    return (
        blas_lib.device_of(cand.blas)
        if cand.blas
        else (device if device in blas_lib.LIBRARIES else "")
    )


@contextlib.contextmanager
def blas_library(cand: Candidate, device: str) -> Iterator[tuple[str, str]]:
    """Run a Linear under its candidate's BLAS library (``cand.blas``; none: the one torch picks by
    itself), restoring the process's previous choice afterwards (the worker serves other
    candidates). Yields (the library in effect, the build's default, i.e. torch's choice before any
    was set); ("", "") where no GPU BLAS library applies. Raises :class:`BlasNotOffered` when the
    build keeps another."""
    kind = blas_device(cand, device) if cand.semantics == "linear" else ""
    if not kind:
        yield "", ""
        return
    before = torch.backends.cuda.preferred_blas_library()
    default = blas_lib.name_of(before, kind)
    if not cand.blas:
        yield default, default
        return
    now = blas_lib.select(torch, cand.blas)
    try:
        if now != cand.blas:
            raise BlasNotOffered(f"this torch build does not offer {cand.blas}: torch kept {now}")
        yield now, default
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def baseline_blas(cand: Candidate, device: str) -> str:
    """The library torch.nn's baseline runs under when a Linear is checked on a GPU: the classic one
    (cuBLAS, rocBLAS), which torch used for every Linear before the Lt libraries became preferences
    and defaults (on LUMI the divergence came with hipBLASLt, anemoi-core #560). So a library that
    computes worse is judged against the classic library's error, never against its own."""
    kind = blas_device(cand, device) if cand.semantics == "linear" else ""
    return blas_lib.LIBRARIES[kind][0] if kind else ""


@contextlib.contextmanager
def blas_selected(library: str) -> Iterator[None]:
    """Run under ``library`` (''; as it is), then restore the process's choice."""
    if not library:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    blas_lib.select(torch, library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)
