"""liger-kernel's real fused gates (LigerSiLUMulFunction, LigerGELUMulFunction) through the GatedMLP
check on this CPU, in Triton's interpreter, as test_check_liger does for liger's norms: the
registry's candidate with ``cpu`` added to its devices and its target pointing at
tests.liger_interpret_shims (which hands back the real ``kernel_lock.gated_mlp.LigerGatedMLP``), in
a worker started with ``TRITON_INTERPRET=1``. swiglu is accepted; geglu is rejected, naming liger's
tanh GELU against anemoi's erf. bf16 is left out (the interpreter computes it wrongly). Slow: one
worker, liger's import."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest

from kernel_probe.candidates import builtin
from kernel_probe.isolation.protocol import INTERPRETED
from kernel_probe.isolation.worker import Worker
from kernel_probe.probe.check import check_candidate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("liger_kernel") is None, reason="liger-kernel is not installed"
    ),
]
PLAN = [("float32", "true"), ("float16", "true")]


@pytest.fixture(scope="module")
def reports():
    from tests.liger_interpret_shims import version_problem

    problem = version_problem()
    if problem:
        pytest.fail(problem)
    cand = next(c for c in builtin() if c.id == "liger.gated_mlp")
    cand = dataclasses.replace(
        cand, devices=(*cand.devices, "cpu"), target="tests.liger_interpret_shims.LigerGatedMLP"
    )
    # the shims are a module of the checkout, named as a --candidate from the working directory is
    with Worker({**os.environ, "TRITON_INTERPRET": "1"}, local=("tests",)) as worker:
        return {
            impl: check_candidate(
                cand,
                "GatedMLP",
                "cpu",
                PLAN,
                worker,
                timeout=600,
                import_timeout=120,
                canonical={"mlp_implementation": impl},
            )
            for impl in ("swiglu", "geglu")
        }


def test_liger_swiglu_is_accepted_in_fp32_and_fp16(reports):
    report = reports["swiglu"]
    assert report.status == "accepted", report.reasons
    assert report.interpreted and all(INTERPRETED in v.notes for v in report.verdicts)
    assert [(v.dtype, v.status) for v in report.verdicts] == [
        ("float32", "accepted"),
        ("float16", "accepted"),
    ]
    assert all(0 < v.worst_ratio < 1 for v in report.verdicts)


def test_liger_geglu_is_rejected_for_its_tanh_gelu(reports):
    report = reports["geglu"]
    assert report.status == "rejected"
    assert "GELU's tanh approximation where anemoi's geglu gate is exact erf" in report.reasons[0]
