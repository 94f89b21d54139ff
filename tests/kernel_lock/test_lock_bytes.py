"""Every committed lock keeps its bytes through the generic reader and writer (issue 40).

The locks in data/locks/ were written by kernel-probe on a CPU machine (a probe in 32-true, one of
the GatedMLP slot with ``[graph-attention]``, ``lock --for inference`` of the first, and one
accepted with ``rehash``) before the lock's tables were declared by their fields' metadata; the
golden files in data/toml-golden/ are older still. Read and written back, each gives the same bytes
(key order, float and string forms, what is left out) and the same digest."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernel_lock
from kernel_lock import toml

ROOT = Path(__file__).resolve().parent.parent
LOCKS = sorted(p for p in ROOT.rglob("*.toml") if "lock-version" in toml.loads(p.read_text()))


def test_the_fixtures_are_found():
    names = {p.name for p in LOCKS}
    assert {
        "probe-cpu-32-true.toml",
        "probe-cpu-gated-mlp-graph-attention.toml",
        "inference-cpu.toml",
        "build-lock-every-slot.toml",  # RMSNorm, Attention, GatedMLP, Activation
        "derived-inference-every-slot.toml",
    } <= names
    assert {"probe-cpu-linear.toml", "lock-format-example.toml"} <= names


@pytest.mark.parametrize("path", LOCKS, ids=[p.stem for p in LOCKS])
def test_a_committed_lock_is_written_back_byte_for_byte(path):
    text = path.read_text()
    lock = kernel_lock.loads(text, path=str(path), emit_warnings=False, check_targets=False)
    assert lock.dumps() == text
    if lock.intact:  # the sealed ones: the digest of the content read is the one recorded
        assert lock.compute_digest() == lock.digest
    again = kernel_lock.loads(lock.dumps(), emit_warnings=False, check_targets=False)
    assert again == lock and again.dumps() == text


def test_the_probe_locks_are_sealed_and_cover_every_table_kind():
    probed = [p for p in LOCKS if p.parent.name == "locks"]
    locks = [kernel_lock.loads(p.read_text(), emit_warnings=False) for p in probed]
    assert all(lock.intact for lock in locks)
    text = "".join(p.read_text() for p in probed)
    for table in (
        "[graph-attention]",
        "[[graph-attention.evidence]]",
        ".twin]",
        ".rejected]]",
        ".timing]]",
        "[provenance]",
    ):
        assert table in text, table
    assert any(lock.mode == "inference" for lock in locks) and any(
        "GatedMLP" in lock.slots for lock in locks
    )
