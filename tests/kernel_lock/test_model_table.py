"""The lock's [model] table: read back equal, its digest its sites', every bad field named."""

from __future__ import annotations

import pytest

from kernel_lock import errors, toml
from kernel_lock.lock import load
from kernel_lock.model import Model, Site, Unreached, site_differences

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
    changed = Site(
        slot="LayerNorm",
        where="blocks.0.norm1",
        call="torch.nn.LayerNorm",
        calls=2,
        dtype="float32",
        shapes=("8x128x256",),
        semantics={"eps": 1e-6, "bias": False, "normalized_shape": [256]},
    )
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
