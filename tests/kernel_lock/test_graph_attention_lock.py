"""The lock's [graph-attention] table (issue 39): read, written, sealed, and the job-start refusal
of a machine where anemoi would fall back from the locked triton kernel to pyg, unless the lock
allows it."""

from __future__ import annotations

import pytest

import kernel_lock
from kernel_lock import LockFormatError, LockMismatch
from kernel_lock import graph_attention as ga
from tests.conftest import MINIMAL_LOCK

GPU = {"device-type": "cuda"}
CPU = {"device-type": "cpu"}


def lock_with(table: str, device: str = "cuda") -> kernel_lock.KernelLock:
    text = MINIMAL_LOCK.replace(
        'device-type = { value = "cpu"', f'device-type = {{ value = "{device}"'
    )
    return kernel_lock.loads(text + "\n[graph-attention]\n" + table, emit_warnings=False).sealed()


def test_the_table_round_trips_and_is_sealed():
    lock = lock_with('backend = "triton"\nallow-fallback = true\nreason = "r"\n')
    assert lock.graph_attention == ga.GraphAttention(
        backend="triton", allow_fallback=True, reason="r"
    )
    again = kernel_lock.loads(lock.dumps())
    assert again == lock and again.intact
    edited = lock.dumps().replace("allow-fallback = true", "allow-fallback = false")
    assert not kernel_lock.loads(edited, emit_warnings=False).intact  # the digest covers it


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('backend = "flash"\n', "graph-attention.backend"),
        ("reason = 'x'\n", "graph-attention.backend"),
        ('backend = "pyg"\nallow-fallback = true\n', "only a triton backend can fall back"),
        ('backend = "triton"\nallow-fallback = "yes"\n', "graph-attention.allow-fallback"),
    ],
)
def test_a_bad_table_names_its_key(table, problem):
    with pytest.raises(LockFormatError, match=problem):
        lock_with(table)


@pytest.mark.parametrize(
    ("current", "triton", "cause"),
    [
        (CPU, True, "there is no GPU (device type cpu"),
        (GPU, False, "triton is not installed"),
        (CPU, False, "triton is not installed and there is no GPU"),
    ],
)
def test_the_fallback_cause(current, triton, cause):
    assert cause in ga.fallback_cause(current, triton)
    # ROCm: torch.cuda.is_available()
    assert ga.fallback_cause({"device-type": "rocm"}, True) is None


def test_a_locked_triton_refuses_a_machine_without_a_gpu_naming_cause_and_fix():
    lock = lock_with('backend = "triton"\n', device="cpu")
    with pytest.raises(LockMismatch) as exc:
        lock.verify(current={"device-type": "cpu"})
    text = str(exc.value)
    assert (
        "graph-attention.backend" in text
        and "there is no GPU" in text
        and "falls back to PyG" in text
    )
    assert "--allow-graph-attention-fallback" in text and "pip install triton" in text
    assert exc.value.exit_code == kernel_lock.ExitCode.MISMATCH


def test_a_locked_triton_refuses_a_gpu_machine_without_triton(monkeypatch):
    monkeypatch.setattr(ga, "triton_installed", lambda: False)
    lock = lock_with('backend = "triton"\n')
    with pytest.raises(LockMismatch, match="triton is not installed"):
        lock.verify(current={"device-type": "cuda"})
    monkeypatch.setattr(ga, "triton_installed", lambda: True)
    assert not any("graph attention" in n for n in lock.verify(current={"device-type": "cuda"}))


def test_an_allowed_fallback_is_a_note_and_pyg_needs_nothing():
    lock = lock_with('backend = "triton"\nallow-fallback = true\n', device="cpu")
    notes = lock.verify(current={"device-type": "cpu"})
    assert any(
        "anemoi runs pyg here, not the locked triton" in n and "allow-fallback" in n for n in notes
    )
    pyg = lock_with('backend = "pyg"\n', device="cpu")
    assert not any("graph attention" in n for n in pyg.verify(current={"device-type": "cpu"}))


def test_other_differences_keep_their_fix_beside_the_graph_attentions():
    lock = lock_with('backend = "triton"\n', device="cuda")
    with pytest.raises(LockMismatch) as exc:
        lock.verify(current={"device-type": "cpu"})
    assert "device-type" in str(exc.value) and "for [graph-attention]" in str(exc.value)


def test_inference_only_notes_the_fallback():
    lock = lock_with('backend = "triton"\n', device="cuda")
    notes = lock.verify(mode="inference", current={"device-type": "cpu"})
    assert any("anemoi runs pyg here" in n and "inference" in n for n in notes)
