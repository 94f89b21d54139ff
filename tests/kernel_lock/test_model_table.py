"""The lock's [model] table: read back equal, its digest its sites', every bad field named."""

from __future__ import annotations

import dataclasses

import pytest

from kernel_lock import errors, toml
from kernel_lock.lock import load
from kernel_lock.model import Checked, Model, Site, Unreached, site_differences

SITES = (
    Site(
        slot="LayerNorm",
        where="blocks.0.norm1",
        call="torch.nn.LayerNorm",
        calls=2,
        dtype="float32",
        shapes=("8x128x256",),
        semantics={"eps": 1e-5, "bias": False, "normalized_shape": [256]},
    ),
    Site(
        slot="Attention",
        where="blocks.0:scaled_dot_product_attention",
        kind="function",
        call="torch.nn.functional.scaled_dot_product_attention",
        semantics={"is_causal": True, "mask": "none"},
    ),
)
GONE = (Unreached(where="mha", call="torch.nn.MultiheadAttention", reason="fused in-projection"),)


def with_model(text: str, model: Model) -> str:
    return text + "\n" + toml.dumps({"model": model.to_dict()})


def test_model_table_reads_back_equal(minimal_lock_text, tmp_path):
    model = Model.of("block.py:build", SITES, GONE, traced="meta")
    path = tmp_path / "k.toml"
    path.write_text(with_model(minimal_lock_text, model))
    lock = load(path, emit_warnings=False)
    assert lock.model == model and lock.model.intact
    assert lock.model.by_slot()["Attention"] == (SITES[1],)


def test_digest_covers_the_sites_not_the_spec():
    a = Model.of("block.py:build", SITES)
    assert Model.of("pkg.block:build", SITES).digest == a.digest
    other = Model.of("block.py:build", (SITES[0],))
    assert other.digest != a.digest
    assert site_differences(a, other) == ["blocks.0:scaled_dot_product_attention: not in the model"]


def test_a_changed_semantics_is_named():
    a = Model.of("m:f", SITES)
    changed = dataclasses.replace(SITES[0], semantics={**SITES[0].semantics, "eps": 1e-6})
    b = Model.of("m:f", (changed, SITES[1]))
    (line,) = site_differences(a, b)
    assert line.startswith("blocks.0.norm1: semantics") and "1e-06" in line


@pytest.mark.parametrize(
    "edit, key",
    [
        ({"kind": "method"}, "model.sites[0].kind"),
        ({"calls": 0}, "model.sites[0].calls"),
        ({"where": "a\nb"}, "model.sites[0].where"),
        ({"semantics": {"eps": float("nan")}}, "model.sites[0].semantics.eps"),
    ],
)
def test_a_bad_site_is_named(minimal_lock_text, tmp_path, edit, key):
    table = Model.of("m:f", SITES).to_dict()
    table["sites"][0].update(edit)
    path = tmp_path / "k.toml"
    path.write_text(minimal_lock_text + "\n" + toml.dumps({"model": table}))
    with pytest.raises(errors.LockFormatError) as info:
        load(path)
    assert info.value.key == key


def test_a_bad_digest_is_refused(minimal_lock_text, tmp_path):
    table = {**Model.of("m:f", SITES).to_dict(), "digest": "md5:1"}
    path = tmp_path / "k.toml"
    path.write_text(minimal_lock_text + "\n" + toml.dumps({"model": table}))
    with pytest.raises(errors.LockFormatError) as info:
        load(path)
    assert info.value.key == "model.digest"


CHECKED = Checked(
    verdict="agree",
    steps=3,
    phases=8,
    losses_agree_to=3e-7,
    step_ratio=1.12,
    step_interval=(1.05, 1.2),
    step_written=0.93,
    step_applied=0.83,
)


def test_the_model_check_reads_back_equal_and_says_one_line(minimal_lock_text, tmp_path):
    model = dataclasses.replace(Model.of("m:f", SITES), check=CHECKED)
    path = tmp_path / "k.toml"
    path.write_text(with_model(minimal_lock_text, model))
    lock = load(path, emit_warnings=False)
    assert lock.model == model and lock.model.intact  # the trace's digest: the sites only
    assert lock.model.check.line() == (
        "model check: agree over 3 steps (8 phases), losses agree to 3e-07; step 1.12x "
        "(0.93 -> 0.83 s, 95% interval 1.05-1.20x)"
    )
    diverging = Checked(verdict="diverging", steps=3, first="site norm1", phase="after step 1")
    assert diverging.line() == "model check: DIVERGING, first site norm1 (phase 'after step 1')"
    assert Checked(verdict="not-run", why="on the meta device").line().endswith("meta device")


def test_the_lock_digest_covers_the_model_check(minimal_lock_text, tmp_path):
    model = dataclasses.replace(Model.of("m:f", SITES), check=CHECKED)
    path = tmp_path / "k.toml"
    path.write_text(with_model(minimal_lock_text, model))
    sealed = load(path, emit_warnings=False).sealed()
    edited = dataclasses.replace(
        sealed.model, check=dataclasses.replace(CHECKED, verdict="diverging")
    )
    assert dataclasses.replace(sealed, model=edited).compute_digest() != sealed.digest


@pytest.mark.parametrize(
    "edit, key",
    [
        ({"verdict": "fine"}, "model.check.verdict"),
        ({"steps": -1}, "model.check.steps"),
        ({"step-ratio": -1.0}, "model.check.step-ratio"),
        ({"step-interval": [1.0]}, "model.check.step-interval"),
        ({"first": "a\nb"}, "model.check.first"),
    ],
)
def test_a_bad_model_check_is_named(minimal_lock_text, tmp_path, edit, key):
    table = dataclasses.replace(Model.of("m:f", SITES), check=CHECKED).to_dict()
    table["check"].update(edit)
    path = tmp_path / "k.toml"
    path.write_text(minimal_lock_text + "\n" + toml.dumps({"model": table}))
    with pytest.raises(errors.LockFormatError) as info:
        load(path)
    assert info.value.key == key
