"""kernel_probe.probe.onetensor's BLAS part: the BLAS library a Linear is checked and timed under,
and restored after."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kernel_probe import candidates as cands
from kernel_probe.probe.onetensor import (
    BlasNotOffered,
    baseline_blas,
    blas_device,
    blas_library,
    blas_selected,
)


def cand(cid: str):
    return next(c for c in cands.builtin() if c.id == cid)


class FakeBlas:
    """torch.backends.cuda.preferred_blas_library over a process-wide choice; ``offered``: what it
    takes."""

    def __init__(self, start: str = "Cublas", offered=("cublas", "cublaslt")):
        self.choice = SimpleNamespace(name=start)
        self.offered = offered
        self.calls: list[object] = []

    def __call__(self, backend=None):
        if backend is not None:
            self.calls.append(backend)
            if not isinstance(backend, str):  # a restore: torch's own member
                self.choice = backend
            elif backend in self.offered:
                self.choice = SimpleNamespace(name=backend.capitalize())
        return self.choice


@pytest.fixture
def fake(monkeypatch):
    def install(**kw) -> FakeBlas:
        blas = FakeBlas(**kw)
        monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", blas)
        return blas

    return install


@pytest.mark.parametrize(
    "cid,device,expected",
    [
        ("torch.linear", "cuda", "cuda"),
        ("torch.linear", "rocm", "rocm"),
        ("torch.linear", "cpu", ""),
        ("torch.linear.cublaslt", "rocm", "cuda"),  # the candidate's own library names its device
        ("torch.linear.hipblaslt", "cpu", "rocm"),
        ("torch.layer_norm", "cpu", ""),
    ],
)
def test_blas_device(cid, device, expected):
    assert blas_device(cand(cid), device) == expected


@pytest.mark.parametrize(
    "cid,device,expected",
    [
        ("torch.linear", "cuda", "cublas"),
        ("torch.linear", "rocm", "rocblas"),
        ("torch.linear.cublaslt", "cuda", "cublas"),  # never judged against its own library
        ("torch.linear.hipblaslt", "rocm", "rocblas"),
        ("torch.linear", "cpu", ""),
        ("torch.layer_norm", "cuda", ""),  # a norm runs no BLAS
    ],
)
def test_baseline_blas_is_the_classic_library(cid, device, expected):
    assert baseline_blas(cand(cid), device) == expected


@pytest.mark.parametrize(
    "cid,device",
    [("torch.layer_norm", "cuda"), ("torch.linear", "cpu"), ("torch.rms_norm", "rocm")],
)
def test_no_blas_library_applies(fake, cid, device):
    blas = fake()
    with blas_library(cand(cid), device) as got:
        assert got == ("", "")
    assert blas.calls == []


def test_a_linear_without_its_own_library_runs_under_torchs_choice(fake):
    blas = fake(start="Cublaslt")
    with blas_library(cand("torch.linear"), "cuda") as got:
        assert got == ("cublaslt", "cublaslt")
    assert blas.calls == []


def test_a_linear_runs_under_its_own_library_and_the_choice_is_restored(fake):
    blas = fake(start="Cublaslt")
    before = blas.choice
    with blas_library(cand("torch.linear.cublas"), "cuda") as got:
        assert got == ("cublas", "cublaslt")  # (in effect, the build's default)
        assert blas.choice.name == "Cublas"
    assert blas.choice is before


def test_a_library_the_build_does_not_offer_is_refused_and_the_choice_restored(fake):
    blas = fake(start="Cublas", offered=("cublas",))
    before = blas.choice
    with (
        pytest.raises(
            BlasNotOffered, match="this torch build does not offer cublaslt: torch kept cublas"
        ),
        blas_library(cand("torch.linear.cublaslt"), "cuda"),
    ):
        pass
    assert blas.choice is before


def test_blas_selected(fake):
    blas = fake(start="Cublaslt")
    before = blas.choice
    with blas_selected(""):
        assert blas.calls == []
    with blas_selected("cublas"):
        assert blas.choice.name == "Cublas"
    assert blas.choice is before and blas.calls[-1] is before
