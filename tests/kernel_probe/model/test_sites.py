"""Every call site of every slot, with its exact semantics, shapes, dtype and call count: the
trace's child body run in this process (the child itself: test_trace_child.py)."""

from __future__ import annotations

import sys

import pytest

from kernel_lock.model import Model, Site, Unreached
from kernel_probe.model import child
from kernel_probe.model.child import ModelCodeError, trace_model

pytest.importorskip("torch")

LN = {"normalized_shape": [64], "eps": 1e-5, "elementwise_affine": True, "bias": True}
ROWS = "2x16x64"


def traced(call: str, precision: str = "32-true", module: str = "tests.models.variants") -> dict:
    spec = {"kind": "module", "source": module, "call": call, "text": f"{module}:{call}"}
    return trace_model({"spec": spec, "precision": precision, "trust": []})


def sites(value: dict) -> dict[str, dict]:
    return {s["where"]: s for s in value["sites"]}


def linear(i: int, o: int, bias: bool = True) -> dict:
    return {"in_features": i, "out_features": o, "bias": bias}


def attention(**given) -> dict:
    base = dict(heads=4, kv_heads=4, head_dim=16, seq_q=16, seq_k=16, is_causal=False)
    base |= dict(mask="none", scale="none", dropout=0.0, enable_gqa=False)
    return base | given


def row(slot, call, shapes, semantics, calls=1, kind="module", dtype="float32") -> dict:
    return dict(slot=slot, kind=kind, call=call, calls=calls, dtype=dtype, shapes=shapes,
                semantics=semantics)  # fmt: skip


VARIANTS = "tests.models.variants"
SDPA = "torch.nn.functional.scaled_dot_product_attention"
QKV = ["2x4x16x16"] * 3
BLOCK = {
    "norm1": row("LayerNorm", "torch.nn.LayerNorm", [ROWS], LN),
    "qkv": row("Linear", "torch.nn.Linear", [ROWS], linear(64, 192)),
    ":scaled_dot_product_attention": row(
        "Attention", SDPA, QKV, attention(is_causal=True), kind="function"
    ),
    "proj": row("Linear", "torch.nn.Linear", [ROWS], linear(64, 64)),
    "norm2": row("LayerNorm", "torch.nn.LayerNorm", [ROWS], LN),
    "up": row("Linear", "torch.nn.Linear", [ROWS], linear(64, 256)),
    "act": row("Activation", "torch.nn.GELU", ["2x16x256"], {"function": "gelu-erf"}),
    "down": row("Linear", "torch.nn.Linear", ["2x16x256"], linear(256, 64)),
}


def without_where(found: dict) -> dict:
    return {w: {k: v for k, v in s.items() if k != "where"} for w, s in found.items()}


def test_the_block_every_site_exactly_in_call_order():
    value = traced("build", module="tests.models.block")
    assert value["traced"] == "meta" and value["unreached"] == [] and value["notes"] == []
    found = without_where(sites(value))
    assert list(found) == list(BLOCK)  # the order of the forward
    assert found == BLOCK


def test_a_block_called_twice_is_each_site_twice():
    found = without_where(sites(traced("twice")))
    assert found == {
        ("block." if w[0] != ":" else "block") + w: {**s, "calls": 2} for w, s in BLOCK.items()
    }


def test_a_site_called_again_at_other_shapes_keeps_its_first_saying_so():
    value = traced("two_sizes")
    (norm,) = value["sites"]
    assert norm["calls"] == 2 and norm["shapes"] == [ROWS]
    assert value["notes"] == [
        "norm: called again with shapes ['2x8x64']: the site keeps its first call's"
    ]


def test_layers_that_are_not_torchs_defaults():
    found = sites(traced("norms"))
    assert found["rms"]["semantics"] == {
        "normalized_shape": [64],
        "eps": "none",  # nn.RMSNorm(eps=None): torch's eps for the dtype, never a default's
        "elementwise_affine": True,
    }
    assert found["ln"]["semantics"] == {**LN, "bias": False}
    assert found["fc"]["semantics"] == linear(64, 64, bias=False)
    assert found["act"]["semantics"] == {"function": "gelu-tanh"}


def test_gqa_with_a_padding_mask():
    found = sites(traced("gqa"))
    sdpa = found[":scaled_dot_product_attention"]
    assert sdpa["shapes"] == ["2x8x16x8", "2x2x16x8", "2x2x16x8", "2x1x1x16"]
    assert sdpa["semantics"] == attention(
        heads=8, kv_heads=2, head_dim=8, mask="bool", enable_gqa=True
    )
    assert [w for w in found] == ["q", "kv", ":scaled_dot_product_attention", "out"]


def test_multihead_attention_is_out_of_reach_and_its_inner_calls_are_not_sites():
    value = traced("mha")
    assert list(sites(value)) == ["fc"]  # not its fused F.linear / attention calls
    (gone,) = value["unreached"]
    assert gone["where"] == "attn" and gone["call"] == "torch.nn.MultiheadAttention"
    assert "F.scaled_dot_product_attention" in gone["reason"]


def test_functional_calls_numbered_in_their_module():
    found = without_where(sites(traced("functional")))
    F = "torch.nn.functional."
    fn = dict(kind="function")
    assert found == {
        ":layer_norm": row(
            "LayerNorm", F + "layer_norm", [ROWS], {**LN, "eps": 1e-6, "bias": False}, **fn
        ),
        ":linear": row("Linear", F + "linear", [ROWS], linear(64, 128, bias=False), **fn),
        ":silu": row("Activation", F + "silu", ["2x16x128"], {"function": "silu"}, **fn),
        ":rms_norm": row(
            "RMSNorm", F + "rms_norm", ["2x16x128"],
            {"normalized_shape": [128], "eps": 1e-5, "elementwise_affine": False}, **fn,
        ),
        ":linear#2": row("Linear", F + "linear", ["2x16x128"], linear(128, 64, bias=False), **fn),
        ":scaled_dot_product_attention": row("Attention", SDPA, QKV, attention(scale=0.5), **fn),
        ":gelu": row("Activation", F + "gelu", [ROWS], {"function": "gelu-erf"}, **fn),
        ":layer_norm#2": row(
            "LayerNorm", F + "layer_norm", [ROWS],
            {**LN, "elementwise_affine": False, "bias": False}, **fn,
        ),
    }  # fmt: skip


def test_an_attention_slot_module_is_one_site_with_its_window():
    value = traced("windowed")
    assert value["traced"] == "meta"  # its forward's torch.zeros without a device: on meta too
    found = sites(value)
    assert list(found) == ["qkv", "attn"]  # its own inner SDPA call is not a second site
    attn = found["attn"]
    assert attn["call"] == "kernel_lock.attention.SDPAttention"
    assert attn["shapes"] == [*QKV, "16x16"]
    assert attn["semantics"] == attention(mask="float", scale=0.25, window=4)


def test_a_norm_subclass_is_its_site_a_gelu_with_its_own_forward_its_inner_call():
    value = traced("subclasses")
    norm, gelu = value["sites"]
    assert (norm["where"], norm["slot"], norm["call"]) == (
        "0",
        "LayerNorm",
        f"{VARIANTS}.LocalNorm",
    )
    assert norm["semantics"] == {**LN, "eps": 1e-3} and norm["shapes"] == ["2x64"]
    # a class outside torch is not judged by its base's name: its forward's own F.gelu is the site
    assert (gelu["where"], gelu["call"]) == ("1:gelu", "torch.nn.functional.gelu")
    assert gelu["semantics"] == {"function": "gelu-erf"} and value["unreached"] == []


def test_calls_no_slot_swaps_are_unreached_and_a_subclass_with_its_own_forward_is_no_site():
    value = traced("out_of_reach")
    assert [(s["where"], s["semantics"]) for s in value["sites"]] == [("norm:layer_norm", LN)]
    reasons = {u["where"]: u["reason"] for u in value["unreached"]}
    assert list(reasons) == ["relu", ":relu", ":linear"]
    assert reasons["relu"] == reasons[":relu"] and "in place" in reasons["relu"]
    assert reasons[":linear"] == "a 1-D weight: no Linear computes it"


def test_the_meta_device_falls_back_to_the_cpu_at_batch_1_saying_so():
    value = traced("data_dependent")
    assert value["traced"] == "cpu, batch 1 of 8"
    assert "meta device could not run it" in value["notes"][0] and ".item()" in value["notes"][0]
    found = sites(value)
    assert [found[w]["shapes"] for w in ("norm", "fc")] == [["8x16x64"], ["8x16x64"]]
    assert found["norm"]["semantics"] == LN and found["fc"]["calls"] == 1


def test_the_precision_regime_is_what_each_site_receives():
    true = sites(traced("build", "bf16-true", "tests.models.block"))
    assert {s["dtype"] for s in true.values()} == {"bfloat16"}
    mixed = sites(traced("build", "bf16-mixed", "tests.models.block"))
    # autocast: a Linear's output is bf16, a LayerNorm's float32, a residual sum float32
    assert {w: s["dtype"] for w, s in mixed.items()} == {
        "norm1": "float32",
        "qkv": "float32",
        ":scaled_dot_product_attention": "bfloat16",
        "proj": "bfloat16",
        "norm2": "float32",
        "up": "float32",
        "act": "bfloat16",
        "down": "bfloat16",
    }


def test_the_answer_reads_back_as_the_lock_table():
    value = traced("norms")
    model = Model.of(
        "x:y", tuple(Site(**{**s, "shapes": tuple(s["shapes"])}) for s in value["sites"])
    )
    assert model.intact and [s.where for s in model.by_slot()["RMSNorm"]] == ["rms"]
    assert Unreached(where="a", call="b", reason="c").to_dict()["reason"] == "c"


def test_sizes_at_the_model_batch_from_batches_1_and_2():
    one = {"x": {"shapes": ["1x16x64", "16x16"], "calls": 1, "semantics": {"n": [16], "h": 4}}}
    two = {"x": {"shapes": ["2x16x64", "16x16"], "calls": 2, "semantics": {"n": [32], "h": 4}}}
    out, notes = child._at_batch(one, two, 8)
    assert out["x"]["shapes"] == ["8x16x64", "16x16"] and out["x"]["calls"] == 8
    assert out["x"]["semantics"] == {"n": [128], "h": 4} and notes == []
    out, notes = child._at_batch({**one, "y": one["x"]}, two, 8)
    assert out["y"] == one["x"] and "not at batch 2" in notes[0]


@pytest.mark.parametrize(
    ("call", "said"),
    [
        ("model_only", "returned Linear, not (model, args) or (model, args, kwargs)"),
        ("not_a_module", "returned a str as the model, not an nn.Module"),
        ("bare_args", "as args, not a tuple of the forward's inputs (one input: (x,))"),
        ("needs_arguments", "takes required arguments"),
        ("raises", "raised ValueError: no weights here"),
        ("forward_raises", "raised RuntimeError"),
        ("no_such_callable", "has no 'no_such_callable'"),
        ("holder.build", "holder.build() raised RuntimeError: looked up"),
    ],
)
def test_what_the_models_code_gets_wrong_is_named(call, said):
    with pytest.raises(ModelCodeError) as caught:
        traced(call, module="tests.models.broken")
    assert said in str(caught.value)


def test_a_module_not_found_says_the_working_directory_is_not_searched():
    with pytest.raises(ModelCodeError, match="working directory is not searched"):
        traced("build", module="no_such_model_module")


def test_an_anemoi_config_is_built_by_the_anemoi_builder(monkeypatch):
    import types

    import torch

    built = []

    def build(config: str):
        built.append(config)
        return torch.nn.Linear(8, 4), (torch.randn(3, 8),)

    monkeypatch.setitem(
        sys.modules, "kernel_probe.anemoi.model", types.SimpleNamespace(build=build)
    )
    spec = {"kind": "anemoi", "source": "/cfg/o96.yaml", "call": "build", "text": "anemoi:x"}
    value = trace_model({"spec": spec, "precision": "32-true", "trust": []})
    assert built == ["/cfg/o96.yaml"] and value["traced"] == "meta"
    assert [(s["where"], s["semantics"]) for s in value["sites"]] == [("", linear(8, 4))]


def test_a_checkpointed_block_traces_in_the_mixed_regime_on_the_meta_device():
    """Its backward's recomputation runs outside the trace's mode (without the regime's casts,
    which torch's checkpoint refuses): the trace calls it plainly, the same sites, once each."""
    import torch.utils.checkpoint

    value = traced("checkpointed", "bf16-mixed")
    assert value["traced"] == "meta" and not value["notes"]
    found = sites(value)
    assert {w: (s["slot"], s["calls"], s["dtype"]) for w, s in found.items()} == {
        "up": ("Linear", 1, "float32"),
        "norm": ("LayerNorm", 1, "bfloat16"),
    }
    assert torch.utils.checkpoint.checkpoint.__name__ == "checkpoint"  # put back
