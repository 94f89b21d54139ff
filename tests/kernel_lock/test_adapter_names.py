"""kernel_lock.registry: the adapters' tables and the generic naming scheme, read without
torch."""

from __future__ import annotations

import pytest

from kernel_lock.registry import (
    ADAPTERS,
    AUTOCAST_ADAPTERS,
    SIZE_ADAPTERS,
    adapter_for,
    generic_kernel,
    generic_parts,
    size_parameter,
    wrapping_adapter_for,
)


@pytest.mark.parametrize(
    "name,parts",
    [
        (
            "Autocast__site_kernels__norms__FastLayerNorm",
            ("Autocast", "site_kernels.norms.FastLayerNorm"),
        ),
        ("Sized__mylib__Norm", ("Sized", "mylib.Norm")),
        ("Autocast__a__B", ("Autocast", "a.B")),
        ("Autocast__Norm", None),  # a module and a class at least
        ("Other__a__B", None),  # an unknown prefix
        ("Autocast", None),
        ("CompiledLayerNorm", None),
        ("Autocast__a___b__C", None),  # a private component
        ("Autocast__a____C", None),  # an empty component
        ("Autocast__a__1B", None),  # not an identifier
        ("Autocast__a__B-C", None),
    ],
)
def test_generic_parts(name, parts):
    assert generic_parts(name) == parts


@pytest.mark.parametrize(
    "target,kernel",
    [
        (
            "kernel_lock.adapters.Autocast__site_kernels__norms__FastLayerNorm",
            "site_kernels.norms.FastLayerNorm",
        ),
        ("kernel_lock.adapters.Sized__mylib__Norm", "mylib.Norm"),
        ("kernel_lock.adapters.CompiledLayerNorm", None),
        ("kernel_lock.adapters.sub.Autocast__a__B", None),  # not kernel_lock.adapters itself
        ("mylib.Autocast__a__B", None),
        ("Autocast__a__B", None),
    ],
)
def test_generic_kernel(target, kernel):
    assert generic_kernel(target) == kernel


@pytest.mark.parametrize(
    "target,adapter",
    [
        ("liger_kernel.transformers.LigerLayerNorm", f"{ADAPTERS}.LigerLayerNormAnemoi"),
        ("liger_kernel.transformers.LigerRMSNorm", f"{ADAPTERS}.LigerRMSNormAnemoi"),
        ("flash_attn.ops.triton.layer_norm.RMSNorm", f"{ADAPTERS}.FlashAttnRMSNormAnemoi"),
        ("torch.nn.LayerNorm", None),
        ("liger_kernel.transformers.LigerLayerNormAnemoi", None),
    ],
)
def test_adapter_for(target, adapter):
    assert adapter_for(target) == adapter


@pytest.mark.parametrize(
    "prefix,target,adapter",
    [
        ("Autocast", f"{ADAPTERS}.CompiledLayerNorm", f"{ADAPTERS}.AutocastCompiledLayerNorm"),
        (
            "Autocast",
            f"{ADAPTERS}.LigerLayerNormAnemoi",
            f"{ADAPTERS}.AutocastLigerLayerNormAnemoi",
        ),
        ("Autocast", "transformer_engine.pytorch.LayerNorm", f"{ADAPTERS}.AutocastTELayerNorm"),
        ("Autocast", "apex.normalization.FusedLayerNorm", f"{ADAPTERS}.AutocastFusedLayerNorm"),
        ("Autocast", "torch.nn.LayerNorm", None),
        ("Sized", "apex.normalization.FusedLayerNorm", None),  # no table for that prefix
    ],
)
def test_wrapping_adapter_for(prefix, target, adapter):
    assert wrapping_adapter_for(prefix, target) == adapter


def test_the_tables_name_distinct_adapters():
    assert not set(SIZE_ADAPTERS) & set(AUTOCAST_ADAPTERS)
    for name in (*SIZE_ADAPTERS, *AUTOCAST_ADAPTERS):
        # no table name reads as a generic one
        assert name.isidentifier() and generic_parts(name) is None


class _HiddenSize:
    def __init__(self, hidden_size, eps=1e-6):
        pass


class _Dim:
    def __init__(self, dim):
        pass


class _Shape:
    def __init__(self, normalized_shape, hidden_size=None):
        pass


class _Other:
    def __init__(self, features):
        pass


class _Nothing:
    def __init__(self):
        pass


def _function(hidden_size):
    pass


@pytest.mark.parametrize(
    "cls,name",
    [
        (_HiddenSize, "hidden_size"),
        (_Dim, "dim"),
        (_Shape, None),  # anemoi's own argument: no adapter needed
        (_Other, None),
        (_Nothing, None),
        (_function, "hidden_size"),
        (int, None),  # no signature
    ],
)
def test_size_parameter(cls, name):
    assert size_parameter(cls) == name
