"""Each pytest-xdist worker computes on its share of the cores (tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import _threads_per_worker


@pytest.mark.parametrize(
    ("cores", "workers", "threads"),
    [(2, "2", 1), (16, "4", 4), (3, "2", 1), (1, "4", 1), (8, "", 8)],
)
def test_the_cores_are_shared_out_among_the_workers(monkeypatch, cores, workers, threads):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    assert _threads_per_worker() == threads


@pytest.mark.skipif(
    not os.environ.get("PYTEST_XDIST_WORKER"),
    reason="only a pytest-xdist worker limits its threads",
)
def test_this_workers_torch_uses_its_share():
    import torch

    # the conftest set the variable before torch's import, unless the caller chose one
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])
