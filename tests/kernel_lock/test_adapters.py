"""kernel_lock.adapters: the classes built by name (size, autocast, torch-init, generic), on
torch.nn and the fake zoo's classes. The compiled forwards (torch.compile, seconds) are not run
here."""

from __future__ import annotations

import inspect
import math
import pickle

import pytest
import torch
from torch import nn

from kernel_lock import adapters
from kernel_lock.adapters import (
    autocast_adapter,
    normalized_shape_adapter,
    torch_init,
    torch_init_adapter,
)


class _Hidden(nn.Module):
    def __init__(self, hidden_size, eps=1e-6, *, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps, self.has_bias = eps, bias


Sized = normalized_shape_adapter(_Hidden, "hidden_size", "SizedHidden")


@pytest.mark.parametrize(
    "args,kwargs,size,eps",
    [
        ((8,), {}, 8, 1e-6),
        (((8,),), {}, 8, 1e-6),
        ((), {"normalized_shape": 8, "eps": 1e-3}, 8, 1e-3),
        ((), {"normalized_shape": [4]}, 4, 1e-6),
        ((), {"hidden_size": 5}, 5, 1e-6),  # the library's own keyword still works
        ((6, 1e-2), {}, 6, 1e-2),
    ],
)
def test_normalized_shape_adapter_builds(args, kwargs, size, eps):
    m = Sized(*args, **kwargs)
    assert isinstance(m, _Hidden) and m.weight.shape == (size,) and m.eps == eps


@pytest.mark.parametrize(
    "args,kwargs,error",
    [
        ((), {}, "SizedHidden() missing required argument: 'normalized_shape'"),
        ((8,), {"hidden_size": 8}, "SizedHidden() got both normalized_shape and hidden_size"),
        (
            ((2, 8),),
            {},
            "SizedHidden normalizes over the last dimension only; got normalized_shape=(2, 8)",
        ),
    ],
)
def test_normalized_shape_adapter_refuses(args, kwargs, error):
    with pytest.raises((TypeError, ValueError)) as exc:
        Sized(*args, **kwargs)
    assert str(exc.value) == error


def test_normalized_shape_adapter_signature_and_name():
    params = list(inspect.signature(Sized).parameters)
    assert params == ["normalized_shape", "eps", "bias"]
    assert (
        inspect.signature(Sized).parameters["normalized_shape"].default is inspect.Parameter.empty
    )
    assert (Sized.__name__, Sized.__qualname__, Sized.__module__) == (
        "SizedHidden",
        "SizedHidden",
        "kernel_lock.adapters",
    )
    assert "_Hidden" in Sized.__doc__
    assert Sized(3).state_dict().keys() == _Hidden(3).state_dict().keys()


def test_autocast_adapter_casts_back_to_the_input_dtype():
    class Up(nn.Module):
        def forward(self, x, scale=1.0):
            return x.float() * scale

    Cast = autocast_adapter(Up, "AutocastUp")
    x = torch.ones(2, dtype=torch.bfloat16)
    assert Up()(x).dtype == torch.float32
    y = Cast()(x, 2.0)
    assert y.dtype == torch.bfloat16 and y.tolist() == [2.0, 2.0]
    assert (
        issubclass(Cast, Up)
        and Cast.__qualname__ == "AutocastUp"
        and Cast.forward.__qualname__ == "AutocastUp.forward"
    )


@pytest.mark.parametrize("semantics", ["layer_norm", "rms_norm"])
def test_torch_init_of_a_norm(semantics):
    m = nn.LayerNorm(4)
    with torch.no_grad():
        m.weight.fill_(3.0)
        m.bias.fill_(3.0)
    torch_init(m, semantics)
    assert m.weight.tolist() == [1.0] * 4 and m.bias.tolist() == [0.0] * 4


def test_torch_init_of_a_linear():
    torch.manual_seed(0)
    m = nn.Linear(16, 8)
    with torch.no_grad():
        m.weight.normal_(0, 10.0)
        m.bias.fill_(5.0)
    torch_init(m, "linear")
    bound = 1 / math.sqrt(16)
    assert m.weight.abs().max() <= bound and m.bias.abs().max() <= bound and m.bias.abs().max() > 0
    with pytest.warns(UserWarning, match="zero-element"):
        torch_init(nn.Linear(0, 2), "linear")  # no fan-in: a zero bound, no division by zero
    torch_init(nn.Identity(), "linear")  # no parameters: nothing to do


def test_torch_init_adapter():
    class FarInit(nn.Linear):
        def __init__(self, in_features, out_features, bias=True):
            super().__init__(in_features, out_features, bias)
            with torch.no_grad():
                self.weight.fill_(7.0)

    Init = torch_init_adapter(FarInit, "linear", "InitFar")
    m = Init(16, 4)
    assert m.weight.abs().max() <= 1 / math.sqrt(16)
    assert inspect.signature(Init) == inspect.signature(FarInit)
    assert Init.__init__.__qualname__ == "InitFar.__init__" and issubclass(Init, FarInit)


@pytest.mark.parametrize(
    "cls,base",
    [
        (adapters.CompiledLayerNorm, nn.LayerNorm),
        (adapters.CompiledRMSNorm, nn.RMSNorm),
        (adapters.CompiledLinear, nn.Linear),
    ],
)
def test_compiled_classes_keep_their_base(cls, base):
    assert issubclass(cls, base) and inspect.signature(cls) == inspect.signature(base)


def test_generic_adapters_are_built_by_name_and_pickle():
    Autocast = adapters.Autocast__kp_zoo__norms__HiddenSizeLayerNorm
    Sized_ = adapters.Sized__kp_zoo__norms__HiddenSizeLayerNorm
    from kp_zoo.norms import HiddenSizeLayerNorm

    assert issubclass(Autocast, Sized_) and issubclass(Sized_, HiddenSizeLayerNorm)
    assert adapters.Autocast__kp_zoo__norms__HiddenSizeLayerNorm is Autocast  # built once
    m = Autocast(normalized_shape=8)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    assert m(x).dtype == torch.bfloat16
    again = pickle.loads(pickle.dumps(m))
    assert type(again) is Autocast and torch.equal(again(x), m(x))
    # a kernel that takes normalized_shape already: Autocast wraps it directly
    Good = adapters.Autocast__kp_zoo__norms__GoodLayerNorm
    from kp_zoo.norms import GoodLayerNorm

    assert Good.__bases__ == (GoodLayerNorm,)


@pytest.mark.parametrize(
    "name,error,words",
    [
        ("Sized__kp_zoo__norms__GoodLayerNorm", TypeError, "already takes normalized_shape"),
        ("Autocast__kp_notmodule__NotAModule", TypeError, "is not a torch.nn.Module class"),
        (
            "Autocast__kp_zoo__missing_dependency__X",
            ImportError,
            "kp_this_dependency_does_not_exist",
        ),
        (
            "NoSuchAdapter",
            AttributeError,
            "module 'kernel_lock.adapters' has no attribute 'NoSuchAdapter'",
        ),
        ("Autocast___private__X", AttributeError, "has no attribute"),
    ],
)
def test_names_that_build_nothing(name, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(")):
        getattr(adapters, name)


def test_dir_lists_the_tables():
    names = dir(adapters)
    for name in ("CompiledLayerNorm", "LigerLayerNormAnemoi", "AutocastTELayerNorm", "TELinear"):
        assert name in names
