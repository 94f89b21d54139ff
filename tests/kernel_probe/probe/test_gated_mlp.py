"""The GatedMLP slot: anemoi's GatedMLPLayer against kernel_lock.gated_mlp's classes and fused-gate
fakes (tests/fakes/kp_gated.py), each accepted or rejected for its reason, judged by the one
rule."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from kernel_lock import gated_mlp as classes
from kernel_lock.slots.gated_mlp import GATES, formula, gate_for
from kernel_probe import candidates as cands
from kernel_probe.probe import lifecycle
from kernel_probe.probe.report import report_base
from kernel_probe.slots import gated_mlp, gated_mlp_kernels

FAKES = Path(__file__).resolve().parents[2] / "fakes"
FP32 = [("float32", "true")]
FP16 = [("float32", "true"), ("float16", "true")]
mlp = pytest.importorskip(
    "anemoi.models.layers.mlp", reason="anemoi-models is installed with the test extras"
)


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKES))


def verdict(
    target_or_id: str, implementation: str = "swiglu", dtypes=FP32, hidden: int | None = None
):
    if target_or_id.startswith("kp_"):
        cand = cands.from_command_line(f"GatedMLP={target_or_id}")
    else:
        cand = next(c for c in cands.builtin() if c.id == target_or_id)
    raw = gated_mlp_kernels.check(
        cand,
        "cpu",
        dtypes,
        canonical_overrides={"mlp_implementation": implementation},
        hidden=hidden,
    )
    return raw, gated_mlp.judge(raw, cand, "cpu", report_base(cand, "GatedMLP", "cpu"))


def anemoi_layer(implementation: str, n_in: int = 16, n_out: int = 24):
    return mlp.GatedMLPLayer(
        n_in, n_out, types.SimpleNamespace(Linear=torch.nn.Linear), implementation
    )


# ---- the facts: anemoi's own table ---------------------------------------------------------------
@pytest.mark.parametrize("implementation", list(GATES))
def test_the_gate_table_is_anemois(implementation):
    gate = anemoi_layer(implementation).gating
    want = GATES[implementation].anemoi_module.rpartition(".")[2]
    assert type(gate).__name__ == want
    assert (
        formula(implementation)
        == f"{gate_for(implementation).function}(gate_proj(x)) * value_proj(x)"
    )
    if implementation == "geglu":
        assert gate.approximate == "none"  # exact erf, as the table says


def test_mlp_is_not_gated_and_says_so():
    with pytest.raises(ValueError, match="'mlp' has no gate"):
        gate_for("mlp")
    with pytest.raises(ValueError, match="one of glu, swiglu, geglu, reglu"):
        gate_for("swish")


@pytest.mark.parametrize("ratio", [1.0, 2.67, 8 / 3, 4.0, 0.5])
def test_hidden_dim_is_anemois(ratio):
    from anemoi.models.layers.utils import compute_mlp_hidden_dim

    for channels in (96, 512, 1024):
        assert gated_mlp_kernels.hidden_dim(channels, ratio) == compute_mlp_hidden_dim(
            channels, ratio
        )
    assert gated_mlp_kernels.hidden_dim(1024, gated_mlp_kernels.CHECK_RATIO) == 2734


# ---- the adapters keep anemoi's interface --------------------------------------------------------
@pytest.mark.parametrize("implementation", list(GATES))
@pytest.mark.parametrize("cls", [classes.GatedMLP, classes.CompiledGatedMLP])
def test_state_dict_keys_and_forward_are_anemois(implementation, cls):
    theirs = anemoi_layer(implementation)
    ours = classes.from_anemoi(theirs, classes.GatedMLP)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert list(ours.state_dict()) == [
        "gate_proj.weight",
        "gate_proj.bias",
        "value_proj.weight",
        "value_proj.bias",
    ]
    x = torch.randn(5, 16)
    assert torch.equal(ours(x), theirs(x))
    back = anemoi_layer(implementation)
    back.load_state_dict(ours.state_dict(), strict=True)
    assert all(
        torch.equal(a, b)
        for a, b in zip(back.state_dict().values(), theirs.state_dict().values(), strict=True)
    )
    assert list(cls(16, 24, implementation).state_dict()) == list(theirs.state_dict())


@pytest.mark.filterwarnings(
    "ignore:mlp_implementation=.*uses its own gating activation"
)  # anemoi's own note
def test_swap_gated_layers_replaces_anemois_layers_in_a_model():
    kernels = types.SimpleNamespace(Linear=torch.nn.Linear, LayerNorm=torch.nn.LayerNorm)
    model = mlp.MLP(16, 24, 8, kernels, n_extra_layers=1, mlp_implementation="geglu")
    keys, x = list(model.state_dict()), torch.randn(3, 16)
    y = model(x)
    assert classes.swap_gated_layers(model, classes.GatedMLP) == 2
    assert not any(type(m).__name__ == "GatedMLPLayer" for m in model.modules())
    assert list(model.state_dict()) == keys and torch.equal(model(x), y)
    assert all(
        m.mlp_implementation == "geglu" for m in model.modules() if isinstance(m, classes.GatedMLP)
    )


def test_a_gated_layer_built_from_a_tanh_gelu_is_no_implementation():
    layer = anemoi_layer("geglu")
    layer.gating = torch.nn.GELU(approximate="tanh")
    with pytest.raises(ValueError, match="which no mlp_implementation builds"):
        classes.anemoi_implementation(layer)


@pytest.mark.slow  # importing liger-kernel (and triton): ~7 s
def test_liger_is_looked_up_lazily_and_refuses_gates_it_has_not():
    import kernel_lock.gated_mlp as module

    pytest.importorskip("liger_kernel", reason="liger-kernel is installed with the liger extra")
    Liger = module.LigerGatedMLP
    assert Liger.__module__ == "kernel_lock.gated_mlp" and Liger.__qualname__ == "LigerGatedMLP"
    for implementation in ("glu", "reglu"):
        with pytest.raises(ValueError, match="liger-kernel has no fused"):
            Liger(16, 24, implementation)
    assert list(Liger(16, 24, "swiglu").state_dict()) == list(anemoi_layer("swiglu").state_dict())
    with pytest.raises(AttributeError):
        module.NoSuchClass  # noqa: B018


# ---- verdicts ------------------------------------------------------------------------------------
@pytest.mark.parametrize("implementation", list(GATES))
def test_torchs_gated_layer_is_accepted_against_anemois(implementation):
    raw, report = verdict("torch.gated_mlp", implementation, FP16)
    assert report.status == "accepted", report.reasons
    for v in report.verdicts:
        assert 0 < v.worst_ratio < 1
        assert set(v.statistics) == {"max", "rms", "bias"}
        # the inference cases judge the forward only; the overflow case runs in fp16 and bf16
        assert all(
            set(e) == ({"y"} if c in lifecycle.INFERENCE else set(gated_mlp_kernels.OUTPUTS))
            for c, e in v.errors.items()
        )
        assert set(v.errors) == set(gated_mlp.HINTS) - (
            {"overflow"} if v.dtype == "float32" else set()
        )


@pytest.mark.slow  # fp16 matmuls of 8 x 1024 x 2734 on a CPU: ~10 s
def test_anemois_shape_in_fp32_and_fp16():
    raw, report = verdict("torch.gated_mlp", "swiglu", FP16, hidden=gated_mlp_kernels.ANEMOI_IN)
    assert report.status == "accepted", report.reasons
    assert gated_mlp_kernels.canonical(None, gated_mlp_kernels.ANEMOI_IN)["out_features"] == 2734


@pytest.mark.parametrize(
    "fake,implementation,reason",
    [
        ("kp_gated.SwappedGatedMLP", "swiglu", "gate and value swapped"),
        ("kp_gated.SwappedGatedMLP", "geglu", "gate and value swapped"),
        ("kp_gated.BiasDroppedGatedMLP", "swiglu", "drops the projections' biases"),
        (
            "kp_gated.TanhGatedMLP",
            "geglu",
            "GELU's tanh approximation where anemoi's geglu gate is exact erf",
        ),
    ],
)
def test_a_fused_kernel_with_a_real_flaw_is_rejected_naming_it(fakes, fake, implementation, reason):
    raw, report = verdict(fake, implementation)
    assert report.status == "rejected"
    assert reason in report.reasons[0], report.reasons
    assert any("error" in r for r in report.reasons[1:])  # and the figures behind it


def test_a_tanh_gelu_is_rejected_in_bf16_too_where_it_is_within_rounding(fakes):
    # bf16's rounding hides the tanh-erf difference (fp16's did too, measured: liger's geglu 0.31
    # of the tolerance, until the overflow case's gate tails showed it); told in float32, the
    # mistake fails every row
    raw, report = verdict("kp_gated.TanhGatedMLP", "geglu", [("bfloat16", "true")])
    [v] = report.verdicts
    assert report.status == "rejected" and v.failed == ("gelu_tanh",)
    assert v.reasons == (
        gated_mlp_kernels.MISTAKES["gelu_tanh"]
        + " (measured in float32; in bfloat16 it is within rounding)",
    )


def test_a_tanh_gate_offered_for_swiglu_is_not_blamed_on_gelu(fakes):
    # TanhGatedMLP ignores the implementation: for swiglu it computes a GELU, which is simply wrong
    raw, report = verdict("kp_gated.TanhGatedMLP", "swiglu")
    assert report.status == "rejected" and "tanh" not in report.reasons[0]


def test_a_fused_layout_is_rejected_for_its_state_dict(fakes):
    raw, report = verdict("kp_gated.FusedKeysGatedMLP")
    assert report.status == "rejected"
    assert "state dict is not anemoi-models' GatedMLPLayer's" in report.reasons[0]
    assert (
        "missing ['gate_proj.bias', 'gate_proj.weight', 'value_proj.bias', 'value_proj.weight']"
        in report.reasons[0]
    )
    assert "unexpected ['fc1.bias', 'fc1.weight']" in report.reasons[0]


def test_a_model_that_is_not_gated_is_refused_before_anything_runs():
    raw, report = verdict("torch.gated_mlp", "mlp")
    assert report.status == "unavailable" and "'mlp' has no gate" in report.reasons[0]
    assert raw.rows == []


def test_a_missing_library_is_unavailable(fakes):
    raw, report = verdict("kp_gated_absent.Nothing")
    assert (
        report.status == "unavailable"
        and "import of kp_gated_absent.Nothing failed" in report.reasons[0]
    )


def test_a_layer_without_biases_is_not_anemois():
    # anemoi's GatedMLPLayer always builds Linear(in, out): biases included
    cand = next(c for c in cands.builtin() if c.id == "torch.gated_mlp")
    raw = gated_mlp_kernels.check(
        cand, "cpu", FP32, canonical_overrides={"mlp_implementation": "reglu", "bias": False}
    )
    report = gated_mlp.judge(raw, cand, "cpu", report_base(cand, "GatedMLP", "cpu"))
    assert report.status == "rejected"
    assert "missing ['gate_proj.bias', 'value_proj.bias']" in report.reasons[0]
