"""kernel_lock.slots: the slots' facts, the closed sets, and what a module class computes."""

from __future__ import annotations

import inspect

import pytest
import torch

from kernel_lock import slots
from kernel_lock.slots import (
    DTYPES,
    PRECISIONS,
    SLOTS,
    SPECS,
    STATUSES,
    canonical_target,
    class_semantics,
    dtype_named,
    short_dtype,
    slot_name_fix,
    target_facts,
    torch_device,
    twin_semantics,
)


def test_every_slot_has_its_facts():
    assert SLOTS == ("LayerNorm", "RMSNorm", "Linear", "Attention", "GatedMLP", "Activation")
    assert tuple(SPECS)[: len(SLOTS)] == SLOTS
    assert len(set(slots.semantics())) == len(SPECS)
    for spec in SPECS.values():
        facts = target_facts(spec.default_target)
        assert facts is not None and facts.semantics == spec.semantics
        assert set(spec.call_kwargs) <= set(spec.canonical)
    confusable = {s.semantics: s.confusable for s in SPECS.values() if s.confusable}
    assert confusable == {"layer_norm": "rms_norm", "rms_norm": "layer_norm"}


@pytest.mark.parametrize("target", ["torch.nn.LayerNorm", "torch.nn.RMSNorm", "torch.nn.Linear"])
def test_known_torch_targets_list_every_constructor_keyword(target):
    cls = eval(target, {"torch": torch})
    params = {n for n in inspect.signature(cls).parameters if n != "self"}
    facts = target_facts(target)
    assert facts is not None and facts.params == frozenset(params) and facts.complete


@pytest.mark.parametrize(
    "name,canonical",
    [
        ("torch.nn.modules.normalization.LayerNorm", "torch.nn.LayerNorm"),
        ("torch.nn.modules.LayerNorm", "torch.nn.LayerNorm"),
        ("torch.nn.modules.normalization.RMSNorm", "torch.nn.RMSNorm"),
        ("torch.nn.modules.linear.Linear", "torch.nn.Linear"),
        ("torch.nn.modules.Linear", "torch.nn.Linear"),
        ("torch.nn.LayerNorm", "torch.nn.LayerNorm"),
        (
            "torch.nn.modules.linear.LayerNorm",
            "torch.nn.modules.linear.LayerNorm",
        ),  # not a real alias
        ("mylib.Norm", "mylib.Norm"),
    ],
)
def test_canonical_target(name, canonical):
    assert canonical_target(name) == canonical


@pytest.mark.parametrize(
    "target,semantics",
    [
        ("torch.nn.LayerNorm", "layer_norm"),
        ("torch.nn.modules.normalization.RMSNorm", "rms_norm"),
        ("torch.nn.modules.linear.Linear", "linear"),
        ("kernel_lock.adapters.CompiledRMSNorm", "rms_norm"),
    ],
)
def test_twin_semantics(target, semantics):
    assert twin_semantics(target) == semantics
    assert twin_semantics("mylib.Norm") is None


def test_precisions_and_dtypes():
    assert list(PRECISIONS) == ["32-true", "bf16-true", "16-true", "bf16-mixed", "16-mixed"]
    assert (
        PRECISIONS["bf16-mixed"] == ("bfloat16", "mixed")
        and PRECISIONS["16-true"].dtype == "float16"
    )
    assert list(DTYPES) == ["float32", "bfloat16", "float16"]
    for d in DTYPES.values():
        assert d.eps == torch.finfo(getattr(torch, d.name)).eps
    assert {p.dtype for p in PRECISIONS.values()} == set(DTYPES)
    assert STATUSES == ("crashed", "timeout", "rejected", "unavailable", "accepted", "skipped")
    assert slots.MODES == ("training", "inference")


@pytest.mark.parametrize(
    "name,short",
    [
        ("float32", "fp32"),
        ("bfloat16", "bf16"),
        ("float16", "fp16"),
        ("float64", "float64"),
        ("", ""),
    ],
)
def test_short_dtype(name, short):
    assert short_dtype(name) == short


@pytest.mark.parametrize(
    "text,name",
    [
        ("bf16", "bfloat16"),
        ("BF16", "bfloat16"),
        (" float16 ", "float16"),
        ("FP32", "float32"),
        ("float64", None),
        ("half", None),
        ("", None),
    ],
)
def test_dtype_named(text, name):
    assert dtype_named(text) == name


@pytest.mark.parametrize(
    "device,torch_type", [("rocm", "cuda"), ("cuda", "cuda"), ("cpu", "cpu"), ("mps", "mps")]
)
def test_torch_device(device, torch_type):
    assert torch_device(device) == torch_type


KNOWN = "known slots: LayerNorm, RMSNorm, Linear, Attention, GatedMLP, Activation"


@pytest.mark.parametrize(
    "name,fix",
    [
        ("layernorm", "did you mean 'LayerNorm'? slot names are case-sensitive"),
        ("RMSNORM", "did you mean 'RMSNorm'? slot names are case-sensitive"),
        ("linear", "did you mean 'Linear'? slot names are case-sensitive"),
        ("Dense", KNOWN),
        ("Layer_Norm", f"did you mean 'LayerNorm'? {KNOWN}"),
        ("LayerNrom", f"did you mean 'LayerNorm'? {KNOWN}"),
    ],
)
def test_slot_name_fix(name, fix):
    assert slot_name_fix(name) == fix


class _MyLayerNorm(torch.nn.LayerNorm):
    pass


class _MyRMSNorm(torch.nn.RMSNorm):
    pass


class _Unrelated(torch.nn.Module):
    pass


@pytest.mark.parametrize(
    "cls,semantics",
    [
        (torch.nn.LayerNorm, "layer_norm"),
        (torch.nn.RMSNorm, "rms_norm"),
        (torch.nn.Linear, "linear"),
        (_MyLayerNorm, "layer_norm"),
        (_MyRMSNorm, "rms_norm"),
        (torch.nn.Identity, "other: Identity"),
        (torch.nn.GroupNorm, "other: GroupNorm"),
        (_Unrelated, None),  # another library's class is not judged by its hierarchy
        (torch.nn.LayerNorm(4), None),  # an instance, not a class
        ("torch.nn.LayerNorm", None),
    ],
)
def test_class_semantics(cls, semantics):
    assert class_semantics(cls) == semantics


def test_class_semantics_of_quantized_and_fused_classes():
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    assert issubclass(DynamicLinear, torch.nn.Module)
    assert class_semantics(DynamicLinear) == "other: Linear (quantized or fused)"
    fused = type("Sub", (DynamicLinear,), {"__module__": "mylib"})
    # a class it derives from is one
    assert class_semantics(fused) == "other: Sub (quantized or fused)"
