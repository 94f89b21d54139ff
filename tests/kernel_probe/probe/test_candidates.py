"""The candidate registry: built-ins, command-line and entry-point candidates."""

from __future__ import annotations

import pytest

from kernel_lock.slots import SPECS
from kernel_probe import candidates as cands
from kernel_probe.errors import UsageError
from kernel_probe.probe.check import check_all, dtype_plan


def test_builtin_registry_is_consistent():
    ids = [c.id for c in cands.builtin()]
    assert len(ids) == len(set(ids))
    for c in cands.builtin():
        assert all(SPECS[s].semantics == c.semantics for s in c.slots), c.id
        assert c.twin_target.startswith(
            ("torch.nn.", "kernel_lock.attention.", "kernel_lock.gated_mlp.")
        ), c.id
    expected = {
        "torch.layer_norm",
        "torch.rms_norm",
        "torch.linear",
        "torch.linear.cublas",
        "torch.linear.cublaslt",
        "torch.linear.rocblas",
        "torch.linear.hipblaslt",
        "torch.compile.layer_norm",
        "torch.compile.rms_norm",
        "torch.compile.linear",
        "liger.layer_norm",
        "liger.rms_norm",
        "te.layer_norm",
        "te.rms_norm",
        "te.linear",
        "apex.layer_norm",
        "apex.rms_norm",
        "flash_attn.rms_norm",
        "quack.rms_norm",
        "torch.sdpa",
        "torch.sdpa.math",
        "torch.sdpa.flash",
        "torch.sdpa.efficient",
        "torch.sdpa.cudnn",
        "torch.flex",
        "flash_attn.v2",
        "flash_attn.v3",
        "flash_attn.v4",
        "te.dot_product_attention",
        "torch.gated_mlp",
        "torch.compile.gated_mlp",
        "liger.gated_mlp",
        "torch.gelu",
        "torch.gelu_tanh",
        "torch.silu",
        "torch.relu",
        "torch.sigmoid",
        "torch.compile.gelu",
        "torch.compile.gelu_tanh",
        "te.gelu",
        "te.relu",
    }
    assert set(ids) == expected


def test_liger_pins_the_traps():
    liger_rms = next(c for c in cands.builtin() if c.id == "liger.rms_norm")
    assert liger_rms.pinned_kwargs({"eps": 1e-6}) == {"eps": 1e-6, "in_place": False}
    liger_ln = next(c for c in cands.builtin() if c.id == "liger.layer_norm")
    assert liger_ln.pinned_kwargs({"eps": 1e-5}) == {"eps": 1e-5}  # not liger's 1e-6 default


@pytest.mark.parametrize(
    "text", ["LayerNorm", "LayerNorm=", "LayerNorm=Foo", "=a.B", "LayerNorm=a..B"]
)
def test_bad_command_line_candidates(text):
    with pytest.raises(UsageError):
        cands.from_command_line(text)


@pytest.mark.slow
def test_entry_point_candidates_and_broken_plugins(tmp_path, monkeypatch):
    dist = tmp_path / "kp_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kp-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[kernel_probe.probe.candidates]\ngood = kp_plugin:candidates\nbroken = "
        "kp_plugin:broken\nmissing = kp_nope:x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found, problems = cands.registry()
    plugin = [c for c in found if c.id == "plugin.layer_norm"]
    assert plugin and plugin[0].source == "entry-point:good"
    assert any("broken" in p and "this plug-in is broken" in p for p in problems)
    assert any("missing" in p and "kp_nope" in p for p in problems)
    reports = check_all(["LayerNorm"], plugin, "cpu", dtype_plan(["float32"]), timeout=60)
    assert reports["LayerNorm"][0].status == "accepted"


@pytest.mark.slow
def test_torch_compile_candidate_on_cpu():
    compiled = [c for c in cands.builtin() if c.id == "torch.compile.layer_norm"]
    skipped = check_all(["LayerNorm"], compiled, "cpu", dtype_plan(["float32"]), timeout=60)[
        "LayerNorm"
    ][0]
    assert skipped.status == "skipped" and "--with-compile" in skipped.reasons[0]
    rep = check_all(
        ["LayerNorm"], compiled, "cpu", dtype_plan(["float32"]), timeout=600, with_compile=True
    )["LayerNorm"][0]
    assert rep.status == "accepted", rep.reasons
    assert rep.twin["state_dict"] == "interchangeable"
