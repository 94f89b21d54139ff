"""Nothing a default invents changes what a model computes (issue 53): a default gives sizes to
time at, never a semantic option; each slot's canonical values are its default class's own."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
import torch

import kernel_lock
from kernel_lock.slots import DTYPES, SPECS
from kernel_probe import candidates as cands
from kernel_probe import slots as slot_behaviour
from kernel_probe.probe import planning
from kernel_probe.probe.judge import Policy
from kernel_probe.probe.planning import ProbeRequest, plan
from kernel_probe.probe.report import report_base
from kernel_probe.slots.attention import DEFAULT_GEOMETRY, parse_geometry
from kernel_probe.slots.norms import EPS_NONE

CUDA = {"type": "cuda", "arch": "sm_90"}


@pytest.fixture
def gpu(monkeypatch):
    """Plan as if on a CUDA GPU (its facts), without TRITON_INTERPRET."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(planning, "detect_device", lambda: dict(CUDA))


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_a_default_geometry_names_sizes_and_no_option(kind):
    assert parse_geometry(DEFAULT_GEOMETRY[kind]).options == ()


def test_a_gpu_probe_without_attention_pins_no_option(gpu):
    p = plan(ProbeRequest(slots=("Attention",)))
    assert p.inputs["attention"] == DEFAULT_GEOMETRY["gpu"] == "16x128x8192"
    assert "Attention" not in p.canonical  # the slot's own values: global, no softcap, no dropout
    assert SPECS["Attention"].canonical["window"] == -1


def _default_class(spec):
    module, _, name = spec.default_target.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("name", list(SPECS))
def test_each_slots_canonical_values_are_its_default_classs_own(name):
    """What a lock records where the model says nothing is what torch's class computes when the
    model sets nothing: never a value of another library (RMSNorm's eps was liger's 1e-6)."""
    spec = SPECS[name]
    params = inspect.signature(_default_class(spec)).parameters
    computes = spec.computes(spec.default_target, {}, None) if spec.computes else {}
    for key, value in spec.canonical.items():
        own = params[key].default if key in params else (computes or {}).get(key, "unknown")
        assert own == value and type(own) is type(value), (name, key, value, own)


def test_rms_norms_eps_is_torchs_none_in_the_digest():
    assert SPECS["RMSNorm"].canonical["eps"] is None
    p = plan(ProbeRequest(slots=("RMSNorm",)))
    assert p.inputs["RMSNorm.eps"] == EPS_NONE  # a lock probed when it was 1e-6 is not reused
    assert "LayerNorm.eps" not in plan(ProbeRequest(slots=("LayerNorm",))).inputs


def _verdict(target: str, dtypes, canonical=None):
    cand = (
        next(c for c in cands.builtin() if c.id == target)
        if target.startswith("torch.")
        else cands.from_command_line(f"RMSNorm={target}")
    )
    slot = slot_behaviour.slot("RMSNorm")
    raw = slot.check(
        cand, "cpu", dtypes, canonical=canonical or {}, seed=0, hidden=None, baseline=None,
        shared=None,
    )  # fmt: skip
    return slot.judge(raw, cand, "cpu", report_base(cand, "RMSNorm", "cpu"), {}, Policy())


def test_eps_none_is_checked_as_torch_computes_it():
    """torch.nn.RMSNorm(eps=None) against a float64 reference with the eps torch adds (float32's,
    whatever the input dtype); a kernel that turns None into liger's 1e-6 fails on the
    tiny-variance input in every dtype, and so does one that adds the input dtype's own eps."""
    fp32, bf16 = [("float32", "true")], [("bfloat16", "true")]
    torch_own = _verdict("torch.rms_norm", fp32 + bf16)
    assert torch_own.status == "accepted"
    for v in torch_own.verdicts:  # the reference is torch's maths: its own error stays small
        assert v.errors["tiny-variance"]["y"][1] < 2 * DTYPES[v.dtype].eps, v.errors
    for rows in (fp32, bf16):
        wrong = _verdict("kp_zoo.norms.FixedEpsRMSNorm", rows)
        assert wrong.status == "rejected" and "tiny-variance" in wrong.reasons[0], wrong.reasons
    assert _verdict("kp_zoo.norms.DtypeEpsRMSNorm", fp32).status == "accepted"
    assert _verdict("kp_zoo.norms.DtypeEpsRMSNorm", bf16).status == "rejected"
    # for a model that sets liger's eps, the same class is right
    assert _verdict("kp_zoo.norms.FixedEpsRMSNorm", fp32, {"eps": 1e-6}).status == "accepted"


# ---- the Must show: a probe on a simulated GPU -------------------------------------------
def simulated_gpu_probe(monkeypatch, tmp_path, attention: str = ""):
    """RMSNorm and Attention probed on a simulated H100 (the device surface patched as
    tests/kernel_lock/test_blas.py does; the worker's handlers run here, on the CPU), torch's own
    candidates only. The default geometry's sizes are made small (a CPU times it); its options are
    the real default's: none."""
    import kernel_lock.fingerprint as fingerprint
    from kernel_probe.isolation import worker
    from kernel_probe.probe import pipeline
    from kernel_probe.slots import attention as attention_slot
    from tests.kernel_lock.test_blas import H100, InProcessPool

    real = fingerprint.current()
    monkeypatch.setattr(fingerprint, "current", lambda *a, **k: {**real, **H100})
    monkeypatch.setattr(planning, "detect_device", lambda: dict(CUDA, name=H100["device-name"]))
    monkeypatch.setattr(worker, "WorkerPool", InProcessPool)
    small = DEFAULT_GEOMETRY["gpu"].replace("16x128x8192", "2x16x64")
    monkeypatch.setitem(attention_slot.DEFAULT_GEOMETRY, "gpu", small)
    request = ProbeRequest(
        out=tmp_path / "k.toml",
        slots=("RMSNorm", "Attention"),
        shapes=("64x32",),
        precision="bf16-true",
        reps=2,
        plugins=False,
        declared={"Attention": attention} if attention else {},
    )
    p = plan(request)
    torch_own = ("torch.rms_norm", "torch.sdpa", "torch.sdpa.math")
    offered = tuple(c for c in p.candidates if c.id in torch_own)
    return pipeline.probe(dataclasses.replace(p, candidates=offered)).lock


@pytest.mark.slow
def test_a_gpu_lock_pins_nothing_the_model_does_not_have(monkeypatch, tmp_path):
    """A model with global, non-causal attention and RMSNorm(eps=None), probed without a
    declaration on a (simulated) GPU: no window, causal flag or eps appears in the lock."""
    lock = simulated_gpu_probe(monkeypatch, tmp_path)
    assert 'device-type = { value = "cuda"' in lock.dumps()
    rms, att = lock.slots["RMSNorm"], lock.slots["Attention"]
    assert rms.kwargs["eps"] is None and rms.twin is not None and rms.twin.kwargs["eps"] is None
    assert att.kwargs == {"window": -1, "softcap": 0.0, "dropout": 0.0, "alibi": False, **(
        {"backend": "math"} if att.implementation == "torch.sdpa.math" else {})}  # fmt: skip
    assert att.extra == {} and att.twin is not None and "causal" not in att.twin.kwargs
    text = lock.dumps()
    pinned = [line for line in text.splitlines() if line.startswith(("kwargs =", "causal ="))]
    assert pinned and not any("causal" in line or "e-0" in line for line in pinned), pinned
    assert 'kwargs = { eps = "none", elementwise_affine = true }' in pinned
    assert "kwargs = { window = -1, softcap = 0.0, dropout = 0.0, alibi = false" in text
    assert lock.provenance["attention"] == "2x16x64"
    back = kernel_lock.loads(text, emit_warnings=False)
    assert back.slots == lock.slots
    module = back.factory("RMSNorm")(32)
    assert type(module) is torch.nn.RMSNorm and module.eps is None


@pytest.mark.slow
def test_a_causal_model_gets_a_causal_lock_and_a_causal_attention(monkeypatch, tmp_path):
    lock = simulated_gpu_probe(monkeypatch, tmp_path, attention="2x16x64:causal=true")
    att = lock.slots["Attention"]
    assert att.extra == {"causal": True} and att.kwargs["causal"] is True
    assert att.twin is not None and att.twin.kwargs["causal"] is True
    assert "causal = true" in lock.dumps()
    mod = kernel_lock.loads(lock.dumps(), emit_warnings=False).factory("Attention")()
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert mod.causal and torch.allclose(mod(q, k, v), want, atol=1e-6)
