"""The lock the probe writes in-process from a fixed set of reports keeps its bytes (issue 40).

``build_lock`` is given fixed reports (a chosen LayerNorm with its twin, a Linear under a BLAS
library, an Activation, rejected candidates, timings, a profile, provenance and
``[graph-attention]``); with its clock and version fixed, the lock it writes is byte for byte the
golden file, which was written by the code before the lock's tables were declared by their fields'
metadata.

The second pair covers the slots that one lacks: an RMSNorm with its twin, an Attention with its
options, a GatedMLP with its gate, a SiLU Activation, and the inference lock ``derive_inference``
writes from a lock whose RMSNorm needs a GPU library (its twin substituted). Both were written by
the code before the Slot protocol (6d29f99, issue 51) from these same reports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import kernel_lock
from kernel_lock.fingerprint import FIELDS
from kernel_lock.graph_attention import GraphAttention
from kernel_probe import candidates as cands
from kernel_probe.probe.choose import Choice
from kernel_probe.probe.derive import derive_inference
from kernel_probe.probe.report import Report, Verdict, report_base
from kernel_probe.probe.write import build_lock

GOLDEN = (
    Path(__file__).resolve().parents[2]
    / "kernel_lock"
    / "data"
    / "locks"
    / "build-lock-fixed-reports.toml"
)
EVERY_SLOT = GOLDEN.with_name("build-lock-every-slot.toml")
DERIVED = GOLDEN.with_name("derived-inference-every-slot.toml")


def _timed(implementation: str, shape: str) -> dict:
    """A timing row as the timer reports it (more digits than the lock keeps)."""
    figures = {
        "median_ms": 0.0456789,
        "spread": 0.0345,
        "gbps": 45.6789,
        "compile_s": 0.00456789,
        "reps": 3,
        "load_average": 1.23456,
        "busy_processes": 1,
        # paired rounds against the default (lock 1.4): ratio, interval and rounds in the lock
        "pairs": [[0.05, 0.0456789 * k] for k in (0.9, 1.0, 1.1, 0.95, 1.05, 1.0, 1.0)],
    }
    return {
        "implementation": implementation,
        "shape": shape,
        "dtype": "float32",
        "regime": "true",
        **figures,
    }


def _builtin(cid: str) -> cands.Candidate:
    return next(c for c in cands.builtin() if c.id == cid)


def _report(cid: str, status: str = "accepted", reasons: tuple[str, ...] = (), **more) -> Report:
    cand = _builtin(cid)
    return Report(
        **report_base(cand, cand.slots[0], "cpu"), status=status, reasons=list(reasons), **more
    )


def _verdict(cid: str, **more) -> Verdict:
    return Verdict(
        cid, "cpu", "float32", "true", "accepted", worst_ratio=0.123456, deterministic=True, **more
    )


def fixed_lock() -> kernel_lock.KernelLock:
    """The lock ``build_lock`` writes from the fixed reports, its clock and version fixed,
    sealed."""
    twin = {"state_dict": "interchangeable", "max_error": 0.00123456}
    norm = _report(
        "torch.compile.layer_norm", verdicts=[_verdict("torch.compile.layer_norm", twin=twin)]
    )
    linear = _report(
        "torch.linear.cublas", verdicts=[_verdict("torch.linear.cublas")], blas="cublas"
    )
    linear.blas_default = "cublaslt"
    gelu = _report("torch.gelu", verdicts=[_verdict("torch.gelu")], changes=["records a change"])
    reports = {
        "LayerNorm": [
            norm,
            _report("liger.layer_norm", "unavailable", ("runs on cuda, rocm, xpu",)),
        ],
        "Linear": [linear, _report("torch.linear", "rejected", ("slower",))],
        "Activation": [gelu],
    }
    choices = {
        "LayerNorm": Choice("LayerNorm", norm, "fastest", "fastest: 1.5x torch.layer_norm", {}),
        "Linear": Choice("Linear", linear, "pinned", "pinned with --pin", {}),
        "Activation": Choice("Activation", gelu, "default", "kept the default", {}),
    }
    timings = {
        "LayerNorm": {"torch.compile.layer_norm": [_timed("torch.compile.layer_norm", "64x32")]},
        "Linear": {"torch.linear.cublas": [_timed("torch.linear.cublas", "64x32x16")]},
    }
    current = {name: f"v-{name}" for name in FIELDS}
    current["device-type"], current["device-count"] = "cpu", 1
    graph = GraphAttention(
        backend="triton", allow_fallback=True, reason="asked for", evidence=({"dtype": "float32"},)
    )
    lock = build_lock(
        choices,
        reports,
        timings,
        current,
        precision="32-true",
        profile={"name": "site", "digest": "sha256:" + "0" * 64},
        provenance={
            "command": "kernel-probe --out k.toml",
            "check-seconds": 1.25,
            "shapes": ["64x32"],
        },
        graph_attention=graph,
    )
    return dataclasses.replace(
        lock, created_at="2026-12-01T00:00:00Z", created_by="kernel-probe 0.0.0"
    ).sealed()


def test_the_lock_written_in_process_is_the_golden_file_byte_for_byte():
    lock = fixed_lock()
    assert lock.dumps() == GOLDEN.read_text()
    assert kernel_lock.loads(GOLDEN.read_text(), emit_warnings=False).digest == lock.digest


def _fixed(lock: kernel_lock.KernelLock) -> kernel_lock.KernelLock:
    return dataclasses.replace(
        lock, created_at="2026-12-01T00:00:00Z", created_by="kernel-probe 0.0.0"
    ).sealed()


def every_slot_locks() -> tuple[kernel_lock.KernelLock, kernel_lock.KernelLock]:
    """The lock ``build_lock`` writes for RMSNorm, Attention, GatedMLP and Activation from fixed
    reports, and the inference lock derived for a CPU from one whose RMSNorm is liger's."""
    twin = {"state_dict": "interchangeable", "max_error": 0.00123456}

    def accepted(cid: str, **verdict) -> Report:
        return _report(cid, verdicts=[_verdict(cid, **verdict)])

    rms, att = accepted("torch.compile.rms_norm", twin=twin), accepted("torch.sdpa.math", twin=twin)
    gated, silu = accepted("torch.compile.gated_mlp", twin=twin), accepted("torch.silu")
    reports = {
        "RMSNorm": [rms, _report("liger.rms_norm", "unavailable", ("runs on cuda, rocm, xpu",))],
        "Attention": [att, _report("torch.flex", "rejected", ("drops the window",))],
        "GatedMLP": [gated],
        "Activation": [silu],
    }
    choices = {
        "RMSNorm": Choice("RMSNorm", rms, "fastest", "fastest: 1.2x torch.rms_norm", {}),
        "Attention": Choice("Attention", att, "fastest", "fastest: 1.1x torch.sdpa", {}),
        "GatedMLP": Choice("GatedMLP", gated, "pinned", "pinned with --pin", {}),
        "Activation": Choice("Activation", silu, "default", "kept the default", {}),
    }
    timings = {
        "RMSNorm": {"torch.compile.rms_norm": [_timed("torch.compile.rms_norm", "64x32")]},
        "Attention": {"torch.sdpa.math": [_timed("torch.sdpa.math", "2x16x64")]},
        "GatedMLP": {"torch.compile.gated_mlp": [_timed("torch.compile.gated_mlp", "64x32x48")]},
    }
    for rows in timings.values():
        for row in rows.values():
            row[0]["compile_s"] = 0.0
    canonical = {
        "RMSNorm": {"eps": 1e-5},
        "Attention": {"num_heads": 2, "head_dim": 8, "window": 4, "dropout": 0.0},
        "GatedMLP": {"mlp_implementation": "geglu"},
        "Activation": {"function": "silu"},
    }
    current: dict = {name: f"v-{name}" for name in FIELDS}
    current["device-type"], current["device-count"] = "cpu", 1
    provenance = {"command": "kernel-probe --out k.toml", "check-seconds": 1.25}
    lock = build_lock(
        choices, reports, timings, current, precision="32-true", canonical=canonical,
        provenance=provenance,
    )  # fmt: skip
    liger = accepted("liger.rms_norm", twin=twin)
    choices["RMSNorm"] = Choice("RMSNorm", liger, "fastest", "fastest: 2x torch.rms_norm", {})
    gpu = {**current, "device-type": "cuda"}
    trained = _fixed(
        build_lock(choices, {**reports, "RMSNorm": [liger]}, {}, gpu, precision="32-true",
                   canonical=canonical)
    )  # fmt: skip
    derived, _ = derive_inference(trained, current, source="trained.toml")
    return _fixed(lock), _fixed(derived)


def test_every_slot_and_the_inference_lock_keep_the_bytes_written_before_the_slot_protocol():
    lock, derived = every_slot_locks()
    assert lock.dumps() == EVERY_SLOT.read_text()
    assert derived.dumps() == DERIVED.read_text()
    assert derived.mode == "inference" and derived.slots["RMSNorm"].target == "torch.nn.RMSNorm"
    assert lock.slots["GatedMLP"].extra["gate"] and lock.slots["Activation"].extra["function"]
