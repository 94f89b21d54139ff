"""The digest covers every table of the lock but the seal, by construction (issue 34: the digest
could stop covering [provenance], which decides whether a lock is reused, and no test noticed)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import tomllib

import kernel_lock
from kernel_lock import LockError, toml
from kernel_lock.document import SEAL, LockDocument
from kernel_lock.model import Model, Site, Unreached
from kernel_lock.tables import table_keys
from tests.kernel_lock.test_document import _full_lock

MODEL = Model.of(
    "block.py:build",
    (
        Site(
            slot="LayerNorm",
            where="norm",
            call="torch.nn.LayerNorm",
            dtype="float32",
            shapes=("2x16x64",),
            semantics={"eps": 1e-5, "bias": True},
        ),
    ),
    (Unreached(where="mha", call="torch.nn.MultiheadAttention", reason="fused projections"),),
    traced="meta",
)


def full_text() -> str:
    """A lock with every top-level key of the schema, sealed."""
    lock = _full_lock()
    text = lock.dumps().replace(f'{SEAL} = "{lock.digest}"\n', "")
    text += (
        '\n[profile]\nname = "site"\ndigest = "sha256:'
        + "0" * 64
        + '"\nmatched = "explicit"\nsource = "p.toml"\n'
        '\n[provenance]\ninputs = "sha256:'
        + "1"
        * 64
        + '"\ncommand = "kernel-probe --out k.toml"\n'
        'shapes = ["4096x1024"]\nattention = "16x64x4096"\ncheck-seconds = 4.5\ntime-seconds = '
        "2.25\n"
        "deterministic = true\n"
        '[provenance.options]\nprecision = "bf16-mixed"\nslots = "LayerNorm, Linear"\n'
        '[provenance.libraries]\nliger-kernel = "0.8.5"\n'
        "[provenance.anemoi-environment]\nANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND = "
        '"scaled_dot_product_attention"\n'
    )
    text += "\n" + toml.dumps({"model": MODEL.to_dict()})
    text = text.replace(
        'created-by = "hand"', 'created-by = "hand"\ncreated-at = "2026-12-01T00:00:00Z"'
    )
    sealed = kernel_lock.loads(text, emit_warnings=False).sealed()
    return sealed.dumps()


def leaves(d: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(d, dict):
        for k, v in d.items():
            yield from leaves(v, (*path, k))
    elif isinstance(d, list) and d:
        for i, v in enumerate(d):
            yield from leaves(v, (*path, i))
    else:
        yield path


# closed sets: another member (a value outside the set is refused before the digest is looked at)
OTHER = {("mode",): "inference", ("precision",): "32-true", ("lock-version",): "1.2"}


def edited(value: Any, path: tuple[Any, ...] = ()) -> Any:
    if path in OTHER:
        return OTHER[path]
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    return ["x"]  # an empty list


def test_the_full_lock_has_every_top_level_key_of_the_schema():
    data = tomllib.loads(full_text())
    assert set(table_keys(LockDocument)) <= set(data), set(table_keys(LockDocument)) - set(data)
    assert set(data) - {SEAL} == set(kernel_lock.loads(full_text()).covered())


def test_editing_any_value_of_any_table_is_seen_by_the_digest():
    text = full_text()
    assert kernel_lock.loads(text).intact
    data = tomllib.loads(text)
    paths = [p for p in leaves(data) if p[0] != SEAL]
    # every table, [provenance] included
    assert {p[0] for p in paths} == set(table_keys(LockDocument)) - {SEAL}
    # the paths whose edit was read and judged, not refused outright
    seen: set[tuple[Any, ...]] = set()
    for path in paths:
        changed = tomllib.loads(text)
        node = changed
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = edited(node[path[-1]], path)
        new_text = toml.dumps(changed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                lock = kernel_lock.loads(new_text, check_targets=False)
            except LockError:
                continue  # refused outright: no less safe
        assert not lock.intact, path
        assert any("digest" in str(w.message) for w in caught), path
        seen.add(path)
        with pytest.raises(LockError):
            kernel_lock.loads(new_text, strict=True, check_targets=False)
    # a table all of whose edits were refused would prove nothing about the digest: each had one
    # read
    assert {p[0] for p in seen} == {p[0] for p in paths}, {p[0] for p in paths} - {
        p[0] for p in seen
    }
    provenance = {p[1] for p in seen if p[0] == "provenance"}
    assert {
        "inputs",
        "command",
        "shapes",
        "options",
        "libraries",
        "anemoi-environment",
    } <= provenance, provenance
