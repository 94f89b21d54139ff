"""check-config's attention findings: the options anemoi's backends drop or refuse, and the lock's
slot."""

from __future__ import annotations

import pytest

import kernel_lock
from kernel_probe.anemoi import components as attention_checks
from kernel_probe.anemoi.components import attention_findings as findings
from tests.conftest import MINIMAL_LOCK

FLASH2 = """
[slots.Attention]
implementation = "flash_attn.v2"
target = "kernel_lock.attention.FlashAttention2"
semantics = "attention"
kwargs = { window = 512, softcap = 0.0, dropout = 0.0, alibi = false }
"""
SDPA = """
[slots.Attention]
implementation = "torch.sdpa"
target = "kernel_lock.attention.SDPAttention"
semantics = "attention"
kwargs = { window = 512, softcap = 0.0, dropout = 0.0, alibi = false }
"""


def tree(**processor):
    return {
        "model": {
            "processor": {
                "attention_implementation": "flash_attention",
                "window_size": 512,
                **processor,
            }
        }
    }


def lock(text):
    return kernel_lock.loads(MINIMAL_LOCK + text, emit_warnings=False)


@pytest.mark.parametrize(
    "generation,options,refused",
    [
        (4, {"dropout_p": 0.1}, ["dropout_p"]),
        (4, {"softcap": 30.0, "use_alibi_slopes": True}, ["softcap", "use_alibi_slopes"]),
        (3, {"dropout_p": 0.1, "softcap": 30.0}, ["dropout_p"]),
        (3, {"use_alibi_slopes": True}, ["use_alibi_slopes"]),
        (2, {"dropout_p": 0.1, "softcap": 30.0, "use_alibi_slopes": True}, []),
        (4, {"dropout_p": 0.0, "softcap": None}, []),
    ],
)
def test_options_the_flash_generation_drops_are_refused(monkeypatch, generation, options, refused):
    monkeypatch.setattr(attention_checks, "anemoi_flash_generation", lambda: generation)
    got = findings(tree(**options), None)
    assert [f.where.rsplit(".", 1)[1] for f in got] == refused
    assert all(f.severity == "error" for f in got)
    if generation == 3 and refused == ["use_alibi_slopes"]:
        assert "Alibi slopes is currently not supported by flash attention v3" in got[0].problem


def test_sdpa_refuses_softcap_and_alibi_in_anemois_words():
    got = findings(
        tree(
            attention_implementation="scaled_dot_product_attention",
            softcap=30.0,
            use_alibi_slopes=True,
        ),
        None,
    )
    assert [f.problem for f in got] == [
        f"anemoi raises: {attention_checks.SDPA_SOFTCAP}",
        f"anemoi raises: {attention_checks.SDPA_ALIBI}",
    ]


def test_flash_attention_where_flash_attn_is_not_importable(monkeypatch):
    monkeypatch.setattr(attention_checks, "anemoi_flash_generation", lambda: None)
    [note] = findings(tree(), None)
    assert note.severity == "warning" and "Flash attention is not installed" in note.problem
    # against a lock that pins flash-attn, it is an error: the job would not start
    [error] = findings(tree(), lock(FLASH2))
    assert error.severity == "error" and error.kind == "import"


def test_against_the_lock(monkeypatch):
    monkeypatch.setattr(attention_checks, "anemoi_flash_generation", lambda: 4)
    # the lock chose v2 for this model: its generation decides what is dropped (v2 drops nothing)
    assert findings(tree(dropout_p=0.1), lock(FLASH2)) == []
    got = findings(tree(window_size=256), lock(SDPA))
    assert [(f.kind, f.where) for f in got] == [
        ("lock", "model.processor.attention_implementation"),
        ("lock", "model.processor.window_size"),
    ]
    assert (
        findings({"model": {"processor": {"attention_implementation": "${x}"}}}, lock(SDPA)) == []
    )


def test_export_config_sets_the_locked_implementation_and_never_the_models_window():
    """Issue 53: export --config left the preset's flash_attention, so check-config --lock failed
    on attention_implementation. Now the overlay sets the lock's implementation on each component
    with attention; the model's window is never written: where the lock checked another, a note."""
    same, _ = attention_checks.attention_overlay(tree(), lock(SDPA))
    assert same == {"model.processor": {"attention_implementation": "scaled_dot_product_attention"}}
    other = lock(SDPA.replace("window = 512", "window = -1"))
    keys, notes = attention_checks.attention_overlay(tree(), other)
    assert "window_size" not in keys["model.processor"]
    assert any(
        where == "model.processor.window_size" and "the lock checked window -1" in note
        for where, note in notes
    )
    assert attention_checks.attention_overlay(tree(), lock("")) == ({}, [])
