"""kernel_lock.apply: a lock's classes put into a model that already exists, every site named;
what the lock did not check left exactly as written; portable() undoes it.

The models are tests/fakes/kp_blocks.py; their [model] tables are written here by hand, as the
trace (`kernel-probe model SPEC`) records them (kernel_lock.model's conventions)."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest
import torch
from kp_blocks import BATCH, DIM, HEADS, KV_HEADS, SEQ, Blocks, Unusual, block_input, padding_mask

import kernel_lock
from kernel_lock import LockError, toml
from kernel_lock.apply import RECORD, undo
from kernel_lock.model import Model, Site, Unreached

LOCK = """\
lock-version = "1.0"
created-by = "test"
trusted-modules = ["kp_zoo", "kp_activation"]

[environment]
device-type = { value = "cpu", match = "exact" }

[slots.LayerNorm]
implementation = "zoo.layer_norm"
target = "kp_zoo.norms.GoodLayerNorm"
semantics = "layer_norm"
kwargs = { eps = 1e-5 }
twin = { target = "torch.nn.LayerNorm", kwargs = { eps = 1e-5 }, state-dict = "interchangeable", max-error = 1e-6 }

[slots.Linear]
implementation = "zoo.linear"
target = "kp_zoo.norms.GoodLinear"
semantics = "linear"
kwargs = { bias = true }

[slots.Attention]
implementation = "torch.sdpa.math"
target = "kernel_lock.attention.SDPAttention"
semantics = "attention"
kwargs = { window = -1, softcap = 0.0, dropout = 0.0, alibi = false, backend = "math" }

[slots.Activation]
implementation = "exact.gelu"
target = "kp_activation.ExactGELU"
semantics = "activation"
function = "gelu-erf"
kwargs = {}
"""  # noqa: E501 (TOML inline tables are one line)

SHAPE = f"{BATCH}x{SEQ}x{DIM}"
SDPA = "torch.nn.functional.scaled_dot_product_attention"


def norm(where: str, **semantics) -> Site:
    values = {"normalized_shape": [DIM], "eps": 1e-5, "elementwise_affine": True, "bias": True}
    return Site(slot="LayerNorm", where=where, call="torch.nn.LayerNorm", dtype="float32",
                shapes=(SHAPE,), semantics=values | semantics)  # fmt: skip


def linear(where: str, n_in: int, n_out: int, bias: bool = True) -> Site:
    semantics = {"in_features": n_in, "out_features": n_out, "bias": bias}
    return Site(slot="Linear", where=where, call="torch.nn.Linear", dtype="float32",
                shapes=(f"{BATCH}x{SEQ}x{n_in}",), semantics=semantics)  # fmt: skip


def sdpa(where: str, kv_heads: int = HEADS, **semantics) -> Site:
    values = {"heads": HEADS, "kv_heads": kv_heads, "head_dim": DIM // HEADS, "seq_q": SEQ,
              "seq_k": SEQ, "is_causal": True, "mask": "none", "scale": "none", "dropout": 0.0,
              "enable_gqa": False}  # fmt: skip
    return Site(slot="Attention", where=f"{where}:scaled_dot_product_attention", kind="function",
                call=SDPA, dtype="float32", semantics=values | semantics)  # fmt: skip


def block_sites(i: int) -> tuple[Site, ...]:
    p = f"blocks.{i}"
    return (
        norm(f"{p}.norm1"),
        linear(f"{p}.qkv", DIM, 3 * DIM),
        sdpa(p),
        linear(f"{p}.proj", DIM, DIM),
        norm(f"{p}.norm2"),
        linear(f"{p}.fc1", DIM, 4 * DIM),
        Site(
            slot="Activation",
            where=f"{p}.act",
            call="torch.nn.GELU",
            semantics={"function": "gelu-erf"},
        ),  # fmt: skip
        linear(f"{p}.fc2", 4 * DIM, DIM),
    )


BLOCK_SITES = block_sites(0) + block_sites(1)
UNUSUAL_SITES = (
    Site(slot="RMSNorm", where="rms", call="torch.nn.RMSNorm",
         semantics={"normalized_shape": [DIM], "eps": "none", "elementwise_affine": True}),
    norm("norm", bias=False),
    linear("q", DIM, DIM),
    linear("kv", DIM, 2 * KV_HEADS * (DIM // HEADS)),
    sdpa("", kv_heads=KV_HEADS, is_causal=False, mask="bool", enable_gqa=True),
    linear("out", DIM, DIM, bias=False),
)  # fmt: skip


def lock_for(sites, text: str = LOCK, unreached=()) -> kernel_lock.KernelLock:
    if sites is not None:
        table = Model.of("kp_blocks.py:build", tuple(sites), tuple(unreached), traced="meta")
        text += "\n" + toml.dumps({"model": table.to_dict()})
    lock = kernel_lock.loads(text, path="test.toml", emit_warnings=False, trust=["kp_activation"])
    return lock.sealed()


def seeded(cls, seed: int = 0):
    torch.manual_seed(seed)
    return cls()


def assert_close(a, b):
    """Equal within float32 rounding (not torch.testing's: importing it costs seconds)."""
    assert a.shape == b.shape and torch.allclose(a, b, rtol=2e-5, atol=2e-6), (a - b).abs().max()


# 20 SGD steps, the demonstration (seconds on 2 busy cores: slow); 2 in the fast lane
@pytest.mark.parametrize("steps", [2, pytest.param(20, marks=pytest.mark.slow)])
def test_the_block_runs_the_locks_classes_and_trains_as_written(steps):
    written = seeded(Blocks)
    model = copy.deepcopy(written)
    # SGD on the parameters taken before apply: apply keeps the same tensors, so the gradients
    # land on them (torch.optim would do the same; building one imports seconds of torch)
    params = list(model.parameters())
    report = kernel_lock.apply(model, lock_for(BLOCK_SITES))
    assert {s.where for s in report.sites} == {s.where for s in BLOCK_SITES}
    assert not report.left, str(report)
    for i in range(2):
        block = model.blocks[i]
        assert type(block.norm1).__qualname__ == type(block.norm2).__qualname__ == "GoodLayerNorm"
        assert {type(m).__qualname__ for m in (block.qkv, block.proj, block.fc1, block.fc2)} == {
            "GoodLinear"
        }
        assert type(block.act).__qualname__ == "ExactGELU"
    assert model.state_dict().keys() == written.state_dict().keys()
    for step in range(steps):
        x = block_input(step)
        outputs = []
        for m, taken in ((written, list(written.parameters())), (model, params)):
            m.zero_grad()
            y = m(x)
            (y.square().mean()).backward()
            outputs.append((y.detach(), [p.grad.clone() for p in taken]))
            with torch.no_grad():
                for p in taken:
                    p -= 0.05 * p.grad
        assert_close(outputs[1][0], outputs[0][0])
        for a, b in zip(outputs[1][1], outputs[0][1], strict=True):
            assert_close(a, b)
    for (name, a), (_, b) in zip(model.named_parameters(), written.named_parameters(), strict=True):
        assert_close(a, b), name
    # every causal attention call went through the lock's class, none left
    assert report.calls() == {
        f"blocks.{i}:scaled_dot_product_attention": (steps, 0) for i in (0, 1)
    }
    text = str(report)
    assert "blocks.1.norm2" in text and "kp_zoo.norms.GoodLayerNorm" in text
    assert "kernel_lock.attention.SDPAttention" in text


def test_layers_that_are_not_torchs_defaults_compute_exactly_as_written():
    lock = lock_for(
        UNUSUAL_SITES,
        LOCK + '\n[slots.RMSNorm]\nimplementation = "torch.rms_norm"\ntarget = "torch.nn.RMSNorm"\n'
        'semantics = "rms_norm"\nkwargs = { eps = 1e-6 }\n',
    )
    written = seeded(Unusual)
    model = copy.deepcopy(written)
    report = kernel_lock.apply(model, lock)
    now = {s.where: s for s in report.sites}
    assert type(model.norm).__qualname__ == "GoodLayerNorm" and model.norm.bias is None
    # RMSNorm(eps=None), where the lock's slot pins (and so checked) 1e-6: kept, eps and all
    assert type(model.rms) is torch.nn.RMSNorm and model.rms.eps is None
    assert now["rms"].reason == "eps 'none', the lock's slot checked 1e-06"
    assert now[":scaled_dot_product_attention"].swapped
    assert model.state_dict().keys() == written.state_dict().keys()
    for key, value in written.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    x, mask = block_input(1).requires_grad_(), padding_mask()
    y0 = written(x, mask)
    y0.square().mean().backward()
    g0 = [x.grad.clone(), *(p.grad.clone() for p in written.parameters())]
    x.grad = None
    y1 = model(x, mask)
    y1.square().mean().backward()
    assert_close(y1, y0)
    for a, b in zip([x.grad, *(p.grad for p in model.parameters())], g0, strict=True):
        assert_close(a, b)
    assert report.calls() == {":scaled_dot_product_attention": (1, 0)}


def test_semantics_the_lock_did_not_check_are_left_as_written_and_named():
    sites = list(BLOCK_SITES)
    sites[0] = norm("blocks.0.norm1", eps=1e-6)  # the lock checked another eps
    sites[2] = sdpa("blocks.0", is_causal=False)  # and a non-causal attention
    gone = (Unreached(where="blocks.9", call="torch.nn.MultiheadAttention", reason="fused"),)
    written = seeded(Blocks)
    model = copy.deepcopy(written)
    report = kernel_lock.apply(model, lock_for(sites, unreached=gone))
    now = {s.where: s for s in report.sites}
    assert type(model.blocks[0].norm1) is torch.nn.LayerNorm
    assert now["blocks.0.norm1"].reason == "eps 1e-05, the lock checked 1e-06"
    assert now["blocks.9"].reason == "fused" and not now["blocks.9"].swapped
    assert type(model.blocks[0].norm2).__qualname__ == "GoodLayerNorm"
    x = block_input()
    assert_close(model(x), written(x))
    # the causal call is not the non-causal one the lock checked: left, and counted
    assert report.calls() == {
        "blocks.0:scaled_dot_product_attention": (0, 1),
        "blocks.1:scaled_dot_product_attention": (1, 0),
    }
    assert "blocks.0.norm1" in str(report) and "left as written" in str(report)


def test_module_sites_the_lock_has_no_trace_for_are_judged_by_its_slot_table():
    lock = lock_for(None, LOCK.replace("kwargs = { eps = 1e-5 }", "kwargs = { eps = 1e-6 }", 1))
    model = seeded(Blocks)
    report = kernel_lock.apply(model, lock)
    now = {s.where: s for s in report.sites}
    assert now["blocks.0.norm1"].reason == "eps 1e-05, the lock's slot checked 1e-06"
    assert type(model.blocks[0].norm1) is torch.nn.LayerNorm
    assert type(model.blocks[0].qkv).__qualname__ == "GoodLinear"
    assert report.router is None and "functional calls are not routed" in str(report)


def test_a_class_whose_state_dict_keys_differ_is_left_and_named():
    text = LOCK.replace("kp_zoo.norms.GoodLayerNorm", "kp_zoo.norms.ExtraStateLayerNorm").replace(
        'state-dict = "interchangeable"',
        'state-dict = "migrate", migration = ["drop:_extra_state"]',
    )
    model = seeded(Blocks)
    report = kernel_lock.apply(model, lock_for(BLOCK_SITES, text))
    now = {s.where: s for s in report.sites}
    assert type(model.blocks[0].norm1) is torch.nn.LayerNorm
    assert "state-dict keys would differ" in now["blocks.0.norm1"].reason
    assert "_extra_state" in now["blocks.0.norm1"].reason


def test_a_class_that_cannot_be_built_from_the_module_is_left_and_named():
    text = LOCK.replace("kp_zoo.norms.GoodLayerNorm", "kp_fastlib.FastLayerNorm")
    model = seeded(Blocks)
    report = kernel_lock.apply(model, lock_for(BLOCK_SITES, text))
    reason = {s.where: s for s in report.sites}["blocks.1.norm2"].reason
    assert reason.startswith("kp_fastlib.FastLayerNorm cannot be built with them (TypeError")
    assert type(model.blocks[1].norm2) is torch.nn.LayerNorm


def test_a_lock_unusable_here_raises_its_error_and_changes_nothing():
    text = LOCK.replace('value = "cpu"', 'value = "cuda"')
    model = seeded(Blocks)
    with pytest.raises(LockError, match="device-type"):
        kernel_lock.apply(model, lock_for(BLOCK_SITES, text))
    assert type(model.blocks[0].norm1) is torch.nn.LayerNorm
    assert getattr(model, RECORD, None) is None


def test_portable_undoes_apply_and_pickles_without_kernel_lock(tmp_path):
    written = seeded(Blocks)
    model = copy.deepcopy(written)
    kernel_lock.apply(model, lock_for(BLOCK_SITES))
    model(block_input()).sum().backward()  # a step, so that the state moved on
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    copied = kernel_lock.portable(model)
    assert type(copied.blocks[0].norm1) is torch.nn.LayerNorm
    assert (
        type(copied.blocks[0].qkv) is torch.nn.Linear
        and type(copied.blocks[1].act) is torch.nn.GELU
    )
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in copied.modules())
    assert getattr(copied, RECORD, None) is None and getattr(model, RECORD) is not None
    x = block_input(3)
    assert_close(copied(x), model(x))
    from kernel_lock.portability import pickled_modules

    names = pickled_modules(copied)
    assert not any(n.startswith(("kernel_lock", "kp_zoo", "kp_activation")) for n in names), names
    assert undo(model) and type(model.blocks[0].norm1) is torch.nn.LayerNorm
    assert_close(model(x), copied(x))


def function(slot: str, name: str, call: str, **semantics) -> Site:
    return Site(slot=slot, where=f":{name}", kind="function", call=call, semantics=semantics)


FUNCTIONAL_SITES = (
    function("LayerNorm", "layer_norm", "torch.nn.functional.layer_norm", normalized_shape=[DIM],
             eps=1e-5, elementwise_affine=True, bias=True),
    function("Linear", "linear", "torch.nn.functional.linear", in_features=DIM,
             out_features=DIM, bias=True),
    function("Activation", "gelu", "torch.nn.functional.gelu", function="gelu-erf"),
    function("Activation", "gelu#2", "torch.nn.functional.gelu", function="gelu-tanh"),
    function("RMSNorm", "rms_norm", "torch.nn.functional.rms_norm", normalized_shape=[DIM],
             eps=1e-6, elementwise_affine=True),
)  # fmt: skip
RMS_SLOT = """
[slots.RMSNorm]
implementation = "zoo.rms_norm"
target = "kp_zoo.norms.GoodRMSNorm"
semantics = "rms_norm"
kwargs = { eps = 1e-6 }
"""


def test_functional_calls_are_routed_to_the_locks_classes_with_the_calls_own_tensors():
    from kp_blocks import Functional

    written = seeded(Functional)
    model = copy.deepcopy(written)
    report = kernel_lock.apply(model, lock_for(FUNCTIONAL_SITES, LOCK + RMS_SLOT))
    now = {s.where: s for s in report.sites}
    assert now[":layer_norm"].now == "kp_zoo.norms.GoodLayerNorm"
    assert now[":rms_norm"].now == "kp_zoo.norms.GoodRMSNorm"
    assert now[":linear"].now == "kp_zoo.norms.GoodLinear"
    assert now[":gelu"].now == "kp_activation.ExactGELU"
    # the tanh form is not the function the lock's Activation slot checked: never routed
    assert now[":gelu#2"].reason == "function 'gelu-tanh', the lock's slot checked 'gelu-erf'"
    x = block_input(4)
    y0, y1 = written(x), model(x)
    assert_close(y1, y0)
    y0.sum().backward()
    y1.sum().backward()
    for a, b in zip(model.parameters(), written.parameters(), strict=True):
        assert_close(a.grad, b.grad)
    routed = {w: (1, 0) for w in (":layer_norm", ":linear", ":gelu", ":rms_norm")}
    assert report.calls() == routed | {":gelu#2": (0, 1)}


def test_a_module_of_the_attention_slot_keeps_its_own_options_and_portable_says_why():
    from kernel_lock.attention import FlashAttention2, SDPAttention
    from kernel_lock.portability import NotPortable

    model = torch.nn.Sequential(FlashAttention2(window=2, dropout=0.1))
    sites = (Site(slot="Attention", where="0", call="kernel_lock.attention.FlashAttention2",
                  semantics={"window": 2, "is_causal": False}),)  # fmt: skip
    text = LOCK.replace("window = -1, softcap = 0.0, dropout = 0.0", "window = 2, softcap = 0.0")
    report = kernel_lock.apply(model, lock_for(sites, text))
    assert type(model[0]) is SDPAttention and (model[0].window, model[0].dropout) == (2, 0.1)
    assert (
        model[0].backend == "math" and report.sites[0].now == "kernel_lock.attention.SDPAttention"
    )
    # portable restores the model's own module; a module of kernel_lock's has no torch.nn twin
    with pytest.raises(NotPortable, match="torch.nn has no module for it") as caught:
        kernel_lock.portable(model, lock_for(sites, text.replace("[slots.Activation]", TWIN)))
    assert "save a state dict instead" in str(caught.value)


TWIN = """twin = { target = "kernel_lock.attention.SDPAttention", kwargs = { window = 2 }, state-dict = "interchangeable", max-error = 0.0 }

[slots.Activation]"""  # noqa: E501


def test_a_forward_that_raises_leaves_no_mode_behind_and_apply_refuses_twice():
    model = seeded(Blocks)
    kernel_lock.apply(model, lock_for(BLOCK_SITES))
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 8, 31))  # the wrong width: blocks.0.norm1 raises inside blocks.0
    assert torch._C._len_torch_function_stack() == 0
    assert model(block_input()).shape == (BATCH, SEQ, DIM)
    with pytest.raises(ValueError, match="has a lock applied already"):
        kernel_lock.apply(model, lock_for(BLOCK_SITES))


def test_a_hand_edited_model_table_is_refused():
    lock = lock_for(BLOCK_SITES)
    table = lock.model
    edited = Model(spec=table.spec, digest=table.digest, sites=table.sites[1:])
    text = LOCK + "\n" + toml.dumps({"model": edited.to_dict()})
    bad = kernel_lock.loads(text, emit_warnings=False, trust=["kp_activation"]).sealed()
    with pytest.raises(kernel_lock.LockFormatError, match="model.digest"):
        kernel_lock.apply(seeded(Blocks), bad)


@pytest.mark.slow  # a child that imports torch: seconds
def test_the_portable_copy_unpickles_where_kernel_lock_and_the_libraries_cannot_import(tmp_path):
    model = seeded(Blocks)
    kernel_lock.apply(model, lock_for(BLOCK_SITES))
    copied, x = kernel_lock.portable(model), block_input(5)
    saved = tmp_path / "model.pkl"
    saved.write_bytes(pickle.dumps(copied))
    torch.save(x, tmp_path / "x.pt")
    program = (
        "import sys, pickle, torch\n"
        "for name in ('kernel_lock', 'kp_zoo', 'kp_activation'): sys.modules[name] = None\n"
        "m = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "y = m(torch.load(sys.argv[2]))\n"
        "torch.save(y, sys.argv[3]); print(sorted({type(c).__module__ for c in m.modules()}))"
    )
    argv = [sys.executable, "-c", program, str(saved), str(tmp_path / "x.pt"), str(tmp_path / "y")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "kernel_lock" not in proc.stdout and "kp_blocks" in proc.stdout
    assert_close(torch.load(tmp_path / "y"), copied(x))


NOT_HERE = LOCK.replace(
    'target = "kp_zoo.norms.GoodLayerNorm"',
    'target = "kp_not_installed.FastLayerNorm"\n'
    'requires = [{ name = "kp-not-installed", specifier = ">=1.0", module = "kp_not_installed" }]',
).replace('trusted-modules = ["kp_zoo"', 'trusted-modules = ["kp_not_installed", "kp_zoo"')


def test_a_slot_that_cannot_run_here_refuses_training_and_keeps_torch_for_inference():
    with pytest.raises(kernel_lock.KernelUnavailable, match="kp_not_installed"):
        kernel_lock.apply(seeded(Blocks), lock_for(BLOCK_SITES, NOT_HERE))
    # even where no LayerNorm of the model would be swapped (the lock checked another eps)
    other_eps = [norm(s.where, eps=1e-6) if s.slot == "LayerNorm" else s for s in BLOCK_SITES]
    with pytest.raises(kernel_lock.KernelUnavailable, match="kp_not_installed"):
        kernel_lock.apply(seeded(Blocks), lock_for(other_eps, NOT_HERE))
    model = seeded(Blocks)
    report = kernel_lock.apply(model, lock_for(BLOCK_SITES, NOT_HERE), mode="inference")
    now = {s.where: s for s in report.sites}
    # inference resolves the twin, torch.nn.LayerNorm: what the model holds already
    assert type(model.blocks[0].norm1) is torch.nn.LayerNorm
    assert now["blocks.0.norm1"].reason == "already torch.nn.LayerNorm"
    assert type(model.blocks[0].qkv).__qualname__ == "GoodLinear"


def test_a_module_shared_under_two_names_stays_one_module():
    shared = torch.nn.LayerNorm(DIM)
    model = torch.nn.Sequential(shared, torch.nn.Linear(DIM, DIM), shared)
    report = kernel_lock.apply(model, lock_for(None))
    assert model[0] is model[2] and type(model[0]).__qualname__ == "GoodLayerNorm"
    assert model[0].weight is shared.weight
    assert [s.where for s in report.sites] == ["0", "1"]
    copied = kernel_lock.portable(model)
    assert copied[0] is copied[2] and type(copied[0]) is torch.nn.LayerNorm


def test_an_applied_model_pickles_whole_and_its_copy_is_made_portable_too():
    model = seeded(Blocks)
    report = kernel_lock.apply(model, lock_for(BLOCK_SITES))
    loaded = pickle.loads(pickle.dumps(model))  # the record and the routes travel with it
    x = block_input(6)
    assert_close(loaded(x), model(x))
    assert report.calls()["blocks.0:scaled_dot_product_attention"] == (1, 0)
    copied = kernel_lock.portable(loaded)
    assert type(copied.blocks[1].norm2) is torch.nn.LayerNorm
    assert_close(copied(x), model(x))


def test_a_causal_lock_routes_the_models_causal_sdpa_call():
    """A lock probed for a causal model pins ``causal = true``: the model's causal SDPA call is
    routed to a class built causal as the call is (it was once built non-causal, and the site left
    as "causal False, the lock's slot checked True")."""
    from kernel_lock.slots import SPECS

    functional = SPECS["Attention"].calls.functions["scaled_dot_product_attention"]
    q = torch.zeros(1, 2, 4, 8)
    for causal in (True, False):
        semantics = functional.semantics((q, q, q), {"is_causal": causal})
        assert functional.build(semantics)[1]["causal"] is causal
