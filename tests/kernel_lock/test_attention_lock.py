"""A lock's Attention slot: resolved to a module with SDPA's contract, refused where anemoi would
import another flash-attn generation, substituted by SDPA for inference (with anemoi's backend
variable), and exported as anemoi's per-component attention keys."""

from __future__ import annotations

import json

import pytest
import torch

import kernel_lock
from kernel_lock.anemoi import attention_export
from kernel_lock.errors import LockMismatch
from kernel_lock.trust import anemoi_flash_generation
from tests.conftest import MINIMAL_LOCK, run_cli, write_sealed

SDPA_SLOT = """
[slots.Attention]
implementation = "torch.sdpa.flash"
target = "kernel_lock.attention.SDPAttention"
semantics = "attention"
kwargs = { window = 3, softcap = 0.0, dropout = 0.0, alibi = false, backend = "flash" }
"""
FLASH2_SLOT = """
[slots.Attention]
implementation = "flash_attn.v2"
target = "kernel_lock.attention.FlashAttention2"
semantics = "attention"
kwargs = { window = 512, softcap = 0.0, dropout = 0.1, alibi = false }
requires = [{ name = "flash-attn", specifier = ">=2.6", module = "flash_attn" }]
twin = { target = "kernel_lock.attention.SDPAttention", kwargs = { window = 512, softcap = 0.0, dropout = 0.1, alibi = false }, state-dict = "interchangeable", max-error = 0.004 }
"""  # noqa: E501 (TOML inline tables are one line)


def test_the_slot_resolves_to_a_module_that_computes_windowed_attention():
    lock = kernel_lock.loads(MINIMAL_LOCK + SDPA_SLOT, emit_warnings=False)
    mod = lock.factory("Attention")()
    q, k, v = (torch.randn(1, 2, 10, 8) for _ in range(3))
    i = torch.arange(10)
    mask = (i[:, None] - i[None, :]).abs() <= 3
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(mod(q, k, v), ref, atol=1e-6)
    assert mod.backend == "flash" and mod.window == 3


def test_a_slot_the_lock_does_not_pin_is_torchs_sdpa():
    lock = kernel_lock.loads(MINIMAL_LOCK, emit_warnings=False)
    f = lock.factory("Attention")
    assert f.target == "kernel_lock.attention.SDPAttention" and f().window == -1


def _flash(root, *, v4: bool):
    pkg = root / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '2.8.3'\n")
    if v4:
        (pkg / "cute").mkdir()
        (pkg / "cute" / "__init__.py").write_text("")


@pytest.mark.parametrize("v4", [False, True])
def test_job_start_refuses_where_anemoi_would_pick_another_generation(tmp_path, monkeypatch, v4):
    _flash(tmp_path, v4=v4)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert anemoi_flash_generation() == (4 if v4 else 2)
    lock = kernel_lock.loads(MINIMAL_LOCK + FLASH2_SLOT, emit_warnings=False)
    if not v4:
        lock.verify("training")
        return
    with pytest.raises(LockMismatch) as exc:
        lock.verify("training")
    assert "flash_attn.cute is installed here" in str(exc.value) and "would run v4" in str(
        exc.value
    )
    # the torch-free job-start check (`kernel-probe verify --no-import`) says the same
    from kernel_lock.resolve import verify

    with pytest.raises(LockMismatch, match="would run v4"):
        verify(lock, "training", targets="static")


def test_inference_substitutes_sdpa_and_names_anemois_backend_variable(tmp_path, capsys):
    src = write_sealed(tmp_path / "train.toml", MINIMAL_LOCK + FLASH2_SLOT)
    out = tmp_path / "inference.toml"
    code, stdout, err = run_cli(["lock", "--for", "inference", src, out, "--json"], capsys)
    assert code == 0, err
    assert [(s["slot"], s["to"]) for s in json.loads(stdout)["substitutions"]] == [
        ("Attention", "kernel_lock.attention.SDPAttention")
    ]
    derived = kernel_lock.load(out, strict=True)
    assert derived.provenance["anemoi-environment"] == {
        "ANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND": "scaled_dot_product_attention"
    }
    options, _ = attention_export(derived)
    assert options == {
        "attention_implementation": "scaled_dot_product_attention",
        "window_size": 512,
        "dropout_p": 0.1,
    }


def test_export_emits_the_attention_keys(tmp_path, capsys):
    path = write_sealed(tmp_path / "l.toml", MINIMAL_LOCK + SDPA_SLOT)
    code, stdout, err = run_cli(["export", path, "--json"], capsys)
    assert code == 0, err
    attention = json.loads(stdout)["attention"]
    assert attention["options"] == {
        "attention_implementation": "scaled_dot_product_attention",
        "window_size": 3,
    }
    # the lock checked one backend; anemoi lets torch choose
    assert "sdpa_kernel" in attention["note"]
    code, stdout, err = run_cli(["export", path], capsys)
    assert (
        "processor:\n  attention_implementation: scaled_dot_product_attention\n  window_size: 3"
        in stdout
    )


# ---- causal, a mask's kind, grouped heads (issue 53) ---------------------------------------------
CAUSAL_SLOT = """
[slots.Attention]
implementation = "torch.sdpa"
target = "kernel_lock.attention.SDPAttention"
semantics = "attention"
causal = true
mask = "bool"
gqa = true
kwargs = { window = -1, softcap = 0.0, dropout = 0.0, alibi = false, causal = true }
"""


def test_a_causal_lock_builds_a_causal_attention_and_says_what_its_calls_pass():
    lock = kernel_lock.loads(MINIMAL_LOCK + CAUSAL_SLOT, emit_warnings=False)
    slot = lock.slots["Attention"]
    assert slot.extra == {"causal": True, "mask": "bool", "gqa": True}
    mod = lock.factory("Attention")()
    q, k, v = torch.randn(1, 4, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert mod.causal and torch.allclose(mod(q, k, v, enable_gqa=True), ref, atol=1e-6)
    again = kernel_lock.loads(lock.dumps(), emit_warnings=False)
    assert again.slots["Attention"] == slot and 'causal = true\nmask = "bool"' in lock.dumps()


@pytest.mark.parametrize(
    "old,new,said",
    [
        ("causal = true\n", "", "computes causal True, but the slot declares causal False"),
        (", causal = true }", " }", "computes causal False, but the slot declares causal True"),
    ],
)
def test_a_causal_table_and_a_target_that_is_not_are_told_apart(old, new, said):
    with pytest.raises(kernel_lock.errors.TargetNotAllowed) as info:
        kernel_lock.loads(MINIMAL_LOCK + CAUSAL_SLOT.replace(old, new, 1), emit_warnings=False)
    assert said in info.value.problem and info.value.exit_code == 5


@pytest.mark.parametrize(
    "old,new,key",
    [
        ('mask = "bool"', 'mask = "padding"', "mask"),
        ("causal = true\n", 'causal = "yes"\n', "causal"),
        ("gqa = true", "gqa = 2", "gqa"),
    ],
)
def test_the_attention_keys_are_read_with_their_type(old, new, key):
    with pytest.raises(kernel_lock.errors.LockFormatError) as info:
        kernel_lock.loads(MINIMAL_LOCK + CAUSAL_SLOT.replace(old, new, 1), emit_warnings=False)
    assert info.value.key.endswith(key)


def test_another_slot_never_records_causal():
    text = MINIMAL_LOCK.replace(
        'semantics = "layer_norm"', 'semantics = "layer_norm"\ncausal = true'
    )
    with pytest.raises(kernel_lock.errors.LockFormatError) as info:
        kernel_lock.loads(text, emit_warnings=False)
    assert "only the Attention slot records a causal mask" in info.value.problem


def test_a_causal_lock_is_not_exported_to_anemoi_whose_attention_never_is():
    lock = kernel_lock.loads(MINIMAL_LOCK + CAUSAL_SLOT, emit_warnings=False)
    options, note = attention_export(lock, verify_environment=False)
    assert options == {} and "causal" in note and "not exported" in note
