"""The Attention slot as a model calls it (issue 53): causal, a padding mask of each kind, fewer
key/value heads (GQA). Each is checked against the float64 reference and pinned; a candidate that
ignores one is rejected, one that cannot take it is unavailable, never chosen."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kernel_lock.attention import FunctionAttention, SDPAttention, band_mask, causal_mask
from kernel_probe.slots import attention
from kernel_probe.slots.attention_reference import Options, call_mask, explicit, fused_path
from tests.kernel_probe.probe.test_attention import FP32, libraries, verdict  # noqa: F401

CALLS = [
    {"causal": True},
    {"mask": "bool"},
    {"mask": "float"},
    {"kv_heads": 2},
    {"causal": True, "mask": "float", "kv_heads": 2, "window": 6},
]


def _qkv(kv: int = 2, seq: int = 12):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, seq, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, kv, seq, 8, generator=gen, dtype=torch.float64) for _ in "kv")
    return q, k, v


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_the_reference_is_torchs_sdpa_with_the_same_mask_causal_and_groups(kind):
    q, k, v = _qkv()
    opts = Options(window=3, causal=True, mask=kind, kv=2)
    mask = call_mask(kind, q, k)
    tri, band = causal_mask(12, 12, "cpu"), band_mask(12, 12, 3, "cpu")
    both = tri & band
    whole = mask & both if kind == "bool" else mask.masked_fill(~both, -math.inf)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=whole, enable_gqa=True)
    assert torch.allclose(explicit(q, k, v, opts), want, atol=1e-12)
    assert bool((~mask if kind == "bool" else mask.isinf()).any())  # it masks keys...
    assert not bool((~mask if kind == "bool" else mask.isinf()).all(-1).any())  # ...no whole row


def test_the_fused_ordering_sums_a_grouped_heads_gradients():
    q, k, v = (t.float() for t in _qkv())
    go = torch.randn_like(q)
    opts = Options(causal=True, mask="float", kv=2)
    fused = fused_path(q, k, v, go, opts)
    qk, kk, vk = (t.clone().requires_grad_() for t in (q, k, v))
    out = explicit(qk, kk, vk, opts)
    dq, dk, dv = torch.autograd.grad(out, (qk, kk, vk), go)
    assert fused["dk"].shape == k.shape and torch.allclose(fused["dk"], dk, atol=1e-4)
    assert torch.allclose(fused["dv"], dv, atol=1e-4) and torch.allclose(fused["dq"], dq, atol=1e-4)


@pytest.mark.parametrize("kind", ["none", "bool", "float"])
@pytest.mark.parametrize("cls", [SDPAttention, FunctionAttention])
def test_a_causal_layer_is_causal_with_a_window_and_a_callers_mask(cls, kind):
    if cls is FunctionAttention:
        cls = type(
            "F", (FunctionAttention,), {"FUNCTION": staticmethod(F.scaled_dot_product_attention)}
        )
    q, k, v = _qkv(kv=4)
    mod = cls(window=4, causal=True)
    assert mod.causal and "causal=True" in repr(mod)
    mask = call_mask(kind, q, k)
    got = mod(q, k, v, attn_mask=mask) if mask is not None else mod(q, k, v)
    want = explicit(q, k, v, Options(window=4, causal=True, mask=kind))
    assert torch.allclose(got, want, atol=1e-12)
    # a causal call of a layer that is not causal is causal too (SDPA's is_causal)
    plain = cls(window=4)(q, k, v, is_causal=True)
    assert torch.allclose(plain, explicit(q, k, v, Options(window=4, causal=True)), atol=1e-12)


@pytest.mark.parametrize("options", CALLS)
def test_torchs_sdpa_is_accepted_as_the_model_calls_it(options):
    raw, report = verdict("torch.sdpa", options)
    assert report.status == "accepted", report.reasons
    caps = raw.capabilities
    assert {caps[c] for c in ("causal", "mask-bool", "mask-float", "gqa")} == {"honoured"}


@pytest.mark.parametrize(
    "target,options,status,reason",
    [
        ("kp_attention.ignores_causal", {"causal": True}, "rejected",
         "the model sets causal=True, and this candidate silently ignored it"),
        ("kp_attention.ignores_mask", {"mask": "bool"}, "rejected",
         "the model sets mask='bool', and this candidate silently ignored it"),
        ("kp_attention.bool_mask_only", {"mask": "float"}, "rejected",
         "the model sets mask='float', and this candidate computes it wrong"),
        ("kp_attention.NoOptions", {"causal": True}, "unavailable",
         "the model sets causal=True, and this candidate refuses it (TypeError"),
    ],
)  # fmt: skip
def test_a_candidate_that_cannot_take_the_models_call_is_never_accepted(
    target, options, status, reason
):
    _, report = verdict(target, options)
    assert report.status == status, report.reasons
    assert report.reasons[0].startswith(reason), report.reasons


def test_a_model_without_them_keeps_such_candidates():
    for target in ("kp_attention.ignores_causal", "kp_attention.bool_mask_only"):
        assert verdict(target)[1].status == "accepted"


def test_flash_attn_takes_causal_and_refuses_a_mask(libraries):  # noqa: F811
    fa2 = "kernel_lock.attention.FlashAttention2"
    raw, causal = verdict(fa2, {"causal": True})
    assert causal.status == "accepted" and raw.capabilities["causal"] == "honoured"
    _, masked = verdict(fa2, {"mask": "bool"})
    assert masked.status == "unavailable"
    assert masked.reasons[0].startswith("the model sets mask='bool', and this candidate refuses it")
    assert "flash-attn 2 takes no attn_mask" in masked.reasons[0]


def test_the_lock_keys_say_what_the_model_has_and_nothing_else():
    slot = attention.ATTENTION
    values = attention.canonical_options({"causal": True, "mask": "bool", "kv_heads": 2})
    assert slot.lock_keys(values, {}, None) == {"causal": True, "mask": "bool", "gqa": True}
    assert slot.lock_keys(attention.canonical_options(None), {}, None) == {}


def test_work_halves_for_a_causal_model():
    full, causal = (attention.ATTENTION.work(g) for g in ("2x8x64", "2x8x64:causal=true"))
    assert causal == full / 2
    g = attention.parse_geometry("8x64x128:kv_heads=2,mask=float,causal=true")
    assert (g.kv_heads, str(g)) == (2, "8x64x128:kv_heads=2,mask=float,causal=true")
    assert attention.parse_geometry("8x64x128:kv_heads=8").options == ()  # as many: no grouping
