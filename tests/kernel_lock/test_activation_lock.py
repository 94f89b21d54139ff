"""A lock's Activation slot: the facts told without importing (which function a class computes), the
lock's ``function`` key (required there, refused elsewhere), the slot resolved and substituted for
inference, and exported as anemoi's ``layer_kernels.Activation``."""

from __future__ import annotations

import inspect

import pytest
import torch

import kernel_lock
from kernel_lock.anemoi import GLU_REFUSAL, glu_refused, layer_kernels
from kernel_lock.errors import LockFormatError
from kernel_lock.slots import SPECS, class_semantics, target_facts
from kernel_lock.slots.activation import function_of, function_problem, is_approximation
from tests.conftest import MINIMAL_LOCK

GELU_SLOT = """
[slots.Activation]
implementation = "torch.gelu_tanh"
target = "torch.nn.GELU"
semantics = "activation"
function = "gelu-tanh"
kwargs = { approximate = "tanh" }
twin = { target = "torch.nn.GELU", kwargs = { approximate = "tanh" }, state-dict = "interchangeable", max-error = 0.0 }
"""  # noqa: E501 (TOML inline tables are one line)
TE_SLOT = """
[slots.Activation]
implementation = "te.gelu"
target = "transformer_engine.pytorch.ops.GELU"
semantics = "activation"
function = "gelu-erf"
kwargs = {}
requires = [{ name = "transformer-engine", specifier = ">=1.13", module = "transformer_engine" }]
accepted-changes = ["approximation: computes gelu-tanh, not the model's gelu-erf (accepted with --allow-approximation)"]
twin = { target = "torch.nn.GELU", kwargs = { approximate = "tanh" }, state-dict = "interchangeable", max-error = 0.0 }
"""  # noqa: E501 (TOML inline tables are one line)


@pytest.mark.parametrize(
    "target", ["torch.nn.GELU", "torch.nn.SiLU", "torch.nn.ReLU", "torch.nn.Sigmoid"]
)
def test_known_activation_targets_list_every_constructor_keyword(target):
    cls = eval(target, {"torch": torch})
    params = {n for n in inspect.signature(cls).parameters if n != "self"}
    # Sigmoid: Module's (*args, **kwargs), which accepts none
    if cls.__init__ is torch.nn.Module.__init__:
        params = set()
        with pytest.raises(TypeError):
            cls(inplace=True)
    assert (
        target_facts(target).params == frozenset(params)
        and target_facts(target).semantics == "activation"
    )


@pytest.mark.parametrize(
    "target,kwargs,function",
    [
        ("torch.nn.GELU", {}, "gelu-erf"),
        ("torch.nn.GELU", {"approximate": "none"}, "gelu-erf"),
        ("torch.nn.GELU", {"approximate": "tanh"}, "gelu-tanh"),
        ("torch.nn.modules.activation.GELU", {"approximate": "tanh"}, "gelu-tanh"),
        ("kernel_lock.adapters.CompiledGELU", {"approximate": "tanh"}, "gelu-tanh"),
        ("torch.nn.SiLU", {}, "silu"),
        ("torch.nn.ReLU", {}, "relu"),
        ("torch.nn.Sigmoid", {}, "sigmoid"),
        ("transformer_engine.pytorch.ops.GELU", {}, "gelu-tanh"),  # TE's gelu is the tanh form
        ("anemoi.models.layers.activations.Sine", {}, None),  # measured, not told
    ],
)
def test_function_of(target, kwargs, function):
    assert function_of(target, kwargs) == function


@pytest.mark.parametrize(
    "cls,semantics",
    [
        (torch.nn.GELU, "activation"),
        (torch.nn.SiLU, "activation"),
        (torch.nn.Mish, "activation"),
        (torch.nn.GLU, "other: GLU"),  # halves the last dimension
        (torch.nn.Softmax, "other: Softmax"),
        (torch.nn.MultiheadAttention, "other: MultiheadAttention"),
    ],
)
def test_class_semantics_of_torchs_activations(cls, semantics):
    assert class_semantics(cls) == semantics


def test_the_compiled_gelu_adapter_computes_what_torch_does():
    from kernel_lock.adapters import CompiledGELU

    assert class_semantics(CompiledGELU) == "activation"
    assert CompiledGELU(approximate="tanh").approximate == "tanh" and not list(
        CompiledGELU().parameters()
    )


@pytest.mark.parametrize(
    "text,ok",
    [("gelu-erf", True), ("sigmoid", True), ("other:anemoi.models.layers.activations.Sine", True),
     ("gelu", False), ("GELU-ERF", False), ("other:", False), ("other:Sine", False),
     ("other:a._b.C", False)],
)  # fmt: skip
def test_function_problem(text, ok):
    assert (function_problem(text) is None) == ok
    if not ok:
        assert "gelu-erf" in function_problem(text) or "dotted path" in function_problem(text)


def test_the_approximation_pair_is_gelus_two_forms_only():
    assert is_approximation("gelu-erf", "gelu-tanh") and is_approximation("gelu-tanh", "gelu-erf")
    assert not is_approximation("gelu-erf", "silu") and not is_approximation("gelu-erf", "gelu-erf")
    spec = SPECS["Activation"]
    assert spec.default_target == "torch.nn.GELU" and spec.canonical == {"function": "gelu-erf"}


# ---- the lock's function key ---------------------------------------------------------------------
def test_the_slot_resolves_to_the_pinned_gelu():
    lock = kernel_lock.loads(MINIMAL_LOCK + GELU_SLOT, emit_warnings=False)
    assert lock.slots["Activation"].extra["function"] == "gelu-tanh"
    mod = lock.factory("Activation")()
    assert isinstance(mod, torch.nn.GELU) and mod.approximate == "tanh"
    assert 'function = "gelu-tanh"' in lock.dumps()


def test_a_lock_without_the_slot_resolves_to_erf_gelu():
    f = kernel_lock.loads(MINIMAL_LOCK, emit_warnings=False).factory("Activation")
    assert f.target == "torch.nn.GELU" and f().approximate == "none"


@pytest.mark.parametrize(
    "text,words",
    [
        (
            MINIMAL_LOCK + GELU_SLOT.replace('function = "gelu-tanh"\n', ""),
            "required key is missing",
        ),
        (
            MINIMAL_LOCK + GELU_SLOT.replace('"gelu-tanh"\n', '"gelu"\n', 1),
            "'gelu' is not an activation function",
        ),
        (
            MINIMAL_LOCK.replace('semantics = "linear"', 'semantics = "linear"\nfunction = "silu"'),
            "only the Activation slot records a function",
        ),
        (
            MINIMAL_LOCK + GELU_SLOT.replace("torch.nn.GELU", "torch.nn.Linear", 1),
            "computes linear, not activation",
        ),
    ],
)
def test_a_bad_function_or_target_is_refused_naming_the_key(text, words):
    with pytest.raises(LockFormatError) as info:
        kernel_lock.loads(text, emit_warnings=False).factory("Activation")
    assert words in str(info.value)


def test_inference_substitutes_the_tanh_twin_for_an_approximation_the_lock_accepted():
    lock = kernel_lock.loads(MINIMAL_LOCK + TE_SLOT, emit_warnings=False)
    f = lock.factory("Activation", mode="inference")  # transformer-engine is not installed here
    assert f.target == "torch.nn.GELU" and f().approximate == "tanh"
    assert lock.slots["Activation"].changes[0].startswith("approximation: computes gelu-tanh")


# ---- anemoi --------------------------------------------------------------------------------------
def test_the_export_writes_layer_kernels_activation_from_the_lock():
    lock = kernel_lock.loads(MINIMAL_LOCK + GELU_SLOT, emit_warnings=False)
    block = layer_kernels(lock)
    assert block["Activation"] == {"_target_": "torch.nn.GELU", "approximate": "tanh"}
    assert "Activation" not in layer_kernels(kernel_lock.loads(MINIMAL_LOCK, emit_warnings=False))


def test_anemois_glu_refusal_is_quoted_from_the_installed_anemoi_models():
    mlp = pytest.importorskip("anemoi.models.layers.mlp", reason="anemoi-models is not installed")
    from anemoi.models.layers.utils import load_layer_kernels

    assert all(
        glu_refused(n) for n in ("GLU", "GEGLU", "SwiGLU", "LigerSiLUMulGLU")
    ) and not glu_refused("GELU")

    class SwiGLU(torch.nn.Module):
        def forward(self, x):
            return x

    kernels = load_layer_kernels({"Activation": {"_target_": "torch.nn.GELU"}})
    kernels["Activation"] = SwiGLU
    with pytest.raises(ValueError) as info:
        mlp.build_feedforward_modules(8, 8, kernels)
    assert str(info.value) == GLU_REFUSAL


def test_a_portable_model_gets_the_activation_twin_in_place_of_the_pinned_class():
    from kernel_lock.portability import portable

    header = MINIMAL_LOCK[: MINIMAL_LOCK.index("[slots.LayerNorm]")]  # only the Activation slot
    text = header.replace(
        'created-by = "hand"', 'created-by = "hand"\ntrusted-modules = ["kp_activation"]'
    ) + (
        GELU_SLOT.replace('"torch.gelu_tanh"', '"custom:kp_activation.FastGELU"').replace(
            'target = "torch.nn.GELU"\nsemantics', 'target = "kp_activation.FastGELU"\nsemantics'
        )
    ).replace('kwargs = { approximate = "tanh" }\ntwin', "kwargs = {}\ntwin")
    lock = kernel_lock.loads(text, emit_warnings=False, trust=["kp_activation"])
    from kp_activation import FastGELU

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), FastGELU(), torch.nn.Linear(4, 2))
    out = portable(model, lock)
    assert isinstance(out[1], torch.nn.GELU) and out[1].approximate == "tanh"
    x = torch.randn(3, 4)
    assert torch.allclose(out(x), model(x), atol=1e-6)
