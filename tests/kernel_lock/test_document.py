"""kernel_lock.document: the lock's top-level keys, the version and digest rules, canonical
round trips."""

from __future__ import annotations

import hashlib
import json
import warnings

import pytest

import kernel_lock
from kernel_lock import LockFormatError, LockVersionError, LockWarning
from kernel_lock.document import LockDocument
from kernel_lock.lock import KernelLock
from kernel_lock.schema import LOCK_VERSION
from tests.conftest import MINIMAL_LOCK, edited_lock, sealed_lock


def _full_lock() -> KernelLock:
    text = MINIMAL_LOCK.replace(
        '[environment]\ndevice-type = { value = "cpu", match = "exact" }',
        '[environment]\npython = { value = "3.11.7", match = "compatible" }\ndevice-type = { '
        'value = "cpu", match = "exact" }\ndevice-count = { value = 1, match = "ignore" '
        '}\n[environment.libraries]\nliger-kernel = { value = "0.8.5", match = "compatible" }',
    )
    text = text.replace(
        'created-by = "hand"',
        'created-by = "hand"\nprecision = "bf16-mixed"\ntrusted-modules = ["mylib"]',
    )
    text += """
[slots.LayerNorm.twin]
target = "torch.nn.LayerNorm"
kwargs = { eps = 1e-6 }
state-dict = "interchangeable"
max-error = 0.0

[[slots.LayerNorm.evidence]]
device = "cpu"
dtype = "bfloat16"
status = "accepted"
worst-error-ratio = 0.25
errors = { y = 0.001, dx = 0.002 }
failed = []

[[slots.LayerNorm.rejected]]
implementation = "liger.layer_norm"
target = "liger_kernel.transformers.LigerLayerNorm"
status = "unavailable"
reasons = ["0 active drivers", "quote \\" and unicode \u00e9"]

[graph-attention]
backend = "pyg"
reason = "pyg: what anemoi runs here (there is no GPU)"

[[graph-attention.evidence]]
backend = "pyg"
dtype = "float32"
status = "accepted"
worst-ratio = 0.25
deterministic = true
"""
    return sealed_lock(text)


def test_round_trip_is_byte_identical():
    lock = _full_lock()
    text = lock.dumps()
    again = kernel_lock.loads(text)
    assert again.dumps() == text
    assert again.intact and again.warnings == ()
    assert again == lock


def test_dump_is_canonical_regardless_of_input_key_order():
    lock = _full_lock()
    # reorder the top-level keys of the text: the canonical output must not change
    lines = lock.dumps().splitlines()
    head = [line for line in lines[:8] if " = " in line]
    shuffled = "\n".join(reversed(head)) + "\n" + "\n".join(lines[len(head) :]) + "\n"
    assert kernel_lock.loads(shuffled).dumps() == lock.dumps()


def test_floats_are_written_reproducibly():
    lock = _full_lock()
    text = lock.dumps()
    assert "eps = 1e-06" in text
    assert "worst-error-ratio = 0.25" in text


def test_digest_detects_hand_edit_and_strict_refuses(tmp_path):
    text = _full_lock().dumps()
    edited = text.replace("eps = 1e-06", "eps = 1e-05", 1)
    with pytest.warns(LockWarning, match="edited by hand"):
        lock = kernel_lock.loads(edited)
    assert not lock.intact
    with pytest.raises(LockFormatError, match="edited by hand") as exc:
        kernel_lock.loads(edited, strict=True)
    assert exc.value.key == "digest"


def test_missing_digest_is_a_warning():
    with pytest.warns(LockWarning, match="no digest"):
        lock = kernel_lock.loads(MINIMAL_LOCK)
    assert not lock.intact


def test_unknown_minor_version_and_unknown_keys_warn():
    text = MINIMAL_LOCK.replace('"1.0"', '"1.7"') + "\n[future]\nx = 1\n"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        lock = kernel_lock.loads(text)
    messages = " ".join(str(x.message) for x in w)
    assert "1.7" in messages and "'future'" in messages
    assert lock.slots["LayerNorm"].target == "torch.nn.LayerNorm"


def test_atomic_dump_leaves_no_temp_files(tmp_path):
    lock = _full_lock()
    target = tmp_path / "k.toml"
    lock.dump(target)
    lock.dump(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.toml"]
    assert kernel_lock.load(target).dumps() == lock.dumps()


def test_failed_dump_keeps_old_file(tmp_path, monkeypatch):
    lock = _full_lock()
    target = tmp_path / "k.toml"
    target.write_text("old")
    import kernel_lock.files as lockmod

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(lockmod.os, "fsync", boom)
    with pytest.raises(lockmod.WriteFailed, match="disk full.*nothing was written"):
        lock.dump(target)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.toml"]


def test_a_kernel_lock_is_a_document():
    assert issubclass(KernelLock, LockDocument)
    assert isinstance(sealed_lock(), LockDocument)


def test_to_dict_is_in_canonical_order_and_leaves_out_empty_optionals():
    lock = sealed_lock()
    assert list(lock.to_dict()) == [
        "lock-version",
        "created-by",
        "mode",
        "trusted-modules",
        "digest",
        "environment",
        "slots",
    ]
    assert list(lock.to_dict(with_digest=False)) == [
        "lock-version",
        "created-by",
        "mode",
        "trusted-modules",
        "environment",
        "slots",
    ]
    full = _full_lock().to_dict()
    assert list(full)[:6] == [
        "lock-version",
        "created-by",
        "mode",
        "precision",
        "trusted-modules",
        "digest",
    ]
    assert full["precision"] == "bf16-mixed" and full["trusted-modules"] == ["mylib"]
    # slots in the order of SLOTS, whatever the file's order
    text = (
        MINIMAL_LOCK.split("[slots.LayerNorm]")[0]
        + "[slots.Linear]"
        + MINIMAL_LOCK.split("[slots.Linear]")[1]
    )
    text += (
        "\n[slots.LayerNorm]"
        + MINIMAL_LOCK.split("[slots.LayerNorm]")[1].split("[slots.RMSNorm]")[0]
    )
    assert list(sealed_lock(text).to_dict()["slots"]) == ["LayerNorm", "Linear"]


def test_digest_is_sha256_of_the_canonical_json_without_the_digest():
    lock = sealed_lock()
    blob = json.dumps(
        lock.to_dict(with_digest=False), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )
    assert (
        lock.digest
        == "sha256:" + hashlib.sha256(blob.encode()).hexdigest()
        == lock.compute_digest()
    )
    unsealed = kernel_lock.loads(MINIMAL_LOCK, emit_warnings=False)
    assert unsealed.digest == "" and not unsealed.intact
    assert unsealed.compute_digest() == lock.digest  # the digest does not cover itself
    again = unsealed.sealed()
    assert again.intact and again.digest == lock.digest and again == lock


def test_a_change_of_content_changes_the_digest():
    a = sealed_lock()
    b = sealed_lock(edited_lock(**{"eps = 1e-6": "eps = 1e-5"}))
    c = sealed_lock(
        edited_lock(**{'created-by = "hand"': 'created-by = "hand"\nmode = "inference"'})
    )
    assert len({a.digest, b.digest, c.digest}) == 3


@pytest.mark.parametrize(
    "version,error,words,fix",
    [
        (
            "2.0",
            LockVersionError,
            "lock-version 2.0 is not supported (this kernel_lock reads 1.x)",
            "upgrade kernel-probe",
        ),
        (
            "0.9",
            LockVersionError,
            "lock-version 0.9 is not supported",
            "re-run `kernel-probe --force` to write a current",
        ),
        ("1", LockFormatError, "is not a MAJOR.MINOR version", None),
        ("1.0.0", LockFormatError, "is not a MAJOR.MINOR version", None),
        ("v1.0", LockFormatError, "is not a MAJOR.MINOR version", None),
    ],
)
def test_lock_version_is_checked(version, error, words, fix):
    with pytest.raises(error) as exc:
        kernel_lock.loads(edited_lock(**{'"1.0"': f'"{version}"'}), emit_warnings=False)
    assert (
        type(exc.value) is error and words in exc.value.problem and exc.value.key == "lock-version"
    )
    if fix is not None:
        assert fix in exc.value.fix


@pytest.mark.parametrize("version", ["1.0", LOCK_VERSION])
def test_the_current_version_and_an_older_minor_load_quietly(version):
    text = sealed_lock(edited_lock(**{'"1.0"': f'"{version}"'})).dumps()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lock = kernel_lock.loads(text)
    assert lock.lock_version == version and lock.warnings == ()


def test_a_newer_minor_warns():
    major, minor = LOCK_VERSION.split(".")
    newer = f"{major}.{int(minor) + 1}"
    lock = kernel_lock.loads(
        sealed_lock(edited_lock(**{'"1.0"': f'"{newer}"'})).dumps(), emit_warnings=False
    )
    assert any(f"minor version {newer} is newer than {LOCK_VERSION}" in w for w in lock.warnings), (
        lock.warnings
    )


@pytest.mark.parametrize(
    "old,new,words",
    [
        (
            "[slots.Linear]",
            "[slots.linear]",
            "did you mean 'Linear'? slot names are case-sensitive",
        ),
        (
            "[slots.Linear]",
            "[slots.Dense]",
            "known slots: LayerNorm, RMSNorm, Linear, Attention, GatedMLP, Activation",
        ),
    ],
)
def test_an_unknown_slot_says_which_ones_exist(old, new, words):
    with pytest.raises(LockFormatError) as exc:
        kernel_lock.loads(edited_lock(**{old: new}), emit_warnings=False)
    assert exc.value.fix == words and "unknown slot" in exc.value.problem


def test_strict_refuses_a_lock_without_environment():
    text = edited_lock(**{'[environment]\ndevice-type = { value = "cpu", match = "exact" }\n': ""})
    sealed = sealed_lock(text).dumps()
    assert kernel_lock.loads(sealed).environment.fields == {}
    with pytest.raises(LockFormatError, match="it would match any machine") as exc:
        kernel_lock.loads(sealed, strict=True)
    assert exc.value.key == "environment" and "kernel-probe --force" in exc.value.fix


def test_strict_accepts_a_sealed_lock():
    lock = kernel_lock.loads(sealed_lock().dumps(), strict=True)
    assert (
        lock.intact
        and lock.mode == "training"
        and lock.precision == ""
        and lock.trusted_modules == ()
    )


def test_equality_ignores_path_and_warnings():
    a = kernel_lock.loads(MINIMAL_LOCK, path="a.toml", emit_warnings=False)
    b = kernel_lock.loads(MINIMAL_LOCK, path="b.toml", emit_warnings=False)
    assert a == b and a.path == "a.toml" and b.path == "b.toml" and a.warnings
    assert a != a.sealed()  # the digest is content
