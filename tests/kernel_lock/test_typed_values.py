"""Issue 52, typed values: each slot's keywords are read with the type and range its spec declares
(``SlotSpec.params``), every integer within 64 bits, and every lock writer reads back what it
wrote before the rename. The property test over the same readers and writers is in
test_typed_roundtrip.py (hypothesis: the slow lane)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

import kernel_lock
from kernel_lock import LockFormatError
from kernel_lock.checkpoint import attach
from kernel_lock.errors import ExitCode
from kernel_lock.files import UnsafeWrite, write_file
from kernel_lock.slots import SPECS
from tests.conftest import MINIMAL_LOCK, sealed_lock

ATTENTION = """
[slots.Attention]
implementation = "torch.sdpa"
target = "kernel_lock.attention.SDPAttention"
semantics = "attention"
kwargs = { window = -1, softcap = 0.0, dropout = 0.0, alibi = false }

[slots.Attention.twin]
target = "kernel_lock.attention.SDPAttention"
kwargs = { window = -1, softcap = 0.0, dropout = 0.0, alibi = false }
"""
LOCK = MINIMAL_LOCK + ATTENTION
KWARGS = "kwargs = { window = -1, softcap = 0.0, dropout = 0.0, alibi = false }"


def _refused(text: str) -> LockFormatError:
    with pytest.raises(LockFormatError) as info:
        kernel_lock.loads(text, emit_warnings=False)
    assert info.value.exit_code == ExitCode.BAD_INPUT == 5
    return info.value


def _kwargs(**values: str) -> str:
    said = {"window": "-1", "softcap": "0.0", "dropout": "0.0", "alibi": "false", **values}
    return "kwargs = { " + ", ".join(f"{k} = {v}" for k, v in said.items()) + " }"


@pytest.mark.parametrize(
    "name, value, problem",
    [
        ("alibi", '"false"', "'false' is a string, not true or false"),  # issue 52: alibi on
        ("dropout", "1.5", "1.5 is out of range"),  # issue 52: raised only when built
        ("dropout", "1.0", "1.0 is out of range"),
        ("window", "-2", "-2 is out of range"),
        ("window", "4294967296", "4294967296 is out of range"),
        ("window", "4.0", "4.0 is a float, not an integer"),
        ("softcap", "-1.0", "-1.0 is out of range"),
        ("alibi", "1", "1 is an integer, not true or false"),
        ("backend", '"fast"', "'fast' is not one of the values it may be"),
    ],
)
@pytest.mark.parametrize("where", ["kwargs", "twin.kwargs"])
def test_attention_keywords_are_typed(name, value, problem, where):
    head, slot, twin = LOCK.split(KWARGS)
    edited = _kwargs(**{name: value})
    text = head + (KWARGS + slot + edited if where == "twin.kwargs" else edited + slot + KWARGS)
    exc = _refused(text + twin)
    assert exc.key == f"slots.Attention.{where}.{name}"
    assert problem in exc.problem and f"{name} must be " in exc.fix


@pytest.mark.parametrize(
    "slot, kwargs, key",
    [
        ("LayerNorm", "{ eps = -1e-6 }", "eps"),
        ("RMSNorm", '{ eps = "1e-6" }', "eps"),
        ("Linear", '{ bias = "no" }', "bias"),
    ],
)
def test_every_slot_declares_its_keywords(slot, kwargs, key):
    head, tail = MINIMAL_LOCK.split(f"[slots.{slot}]")
    table, *rest = tail.split("\n\n")
    table = "\n".join(
        f"kwargs = {kwargs}" if ln.startswith("kwargs") else ln for ln in table.split("\n")
    )
    text = head + f"[slots.{slot}]" + "\n\n".join([table, *rest])
    assert _refused(text).key == f"slots.{slot}.kwargs.{key}"


def test_the_declared_values_are_the_canonical_ones_and_read():
    """Each slot's canonical values are of its declared types (else every default lock fails)."""
    for spec in SPECS.values():
        for name, value in spec.canonical.items():
            if name in spec.params:
                assert spec.params[name].problem(value) is None, (spec.name, name)
    assert kernel_lock.loads(LOCK, emit_warnings=False).slots["Attention"].kwargs["alibi"] is False


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**70])
def test_an_environment_integer_beyond_64_bits_is_refused(value):
    text = MINIMAL_LOCK.replace(
        "[environment]\n",
        f'[environment]\ndevice-count = {{ value = {value}, match = "ignore" }}\n',
    )
    exc = _refused(text)
    assert exc.key == "environment.device-count.value" and "beyond 64 bits" in exc.problem


@pytest.mark.parametrize("value", [2**63 - 1, -(2**63)])
def test_the_64_bit_bounds_themselves_read(value):
    text = MINIMAL_LOCK.replace(
        "[environment]\n",
        f'[environment]\ndevice-count = {{ value = {value}, match = "ignore" }}\n',
    )
    lock = kernel_lock.loads(text, emit_warnings=False)
    assert lock.environment.fields["device-count"].value == value


# ---- every writer reads back what it wrote ------------------------------------------------------
def test_a_lock_the_reader_refuses_is_never_written(tmp_path):
    path = tmp_path / "kernel-lock.toml"
    good = sealed_lock(LOCK)
    good.dump(path)
    before = path.read_bytes()
    slot = good.slots["Attention"]
    bad = replace(good, slots={**good.slots, "Attention": replace(slot, kwargs={"alibi": "no"})})
    with pytest.raises(LockFormatError) as info:
        bad.sealed().dump(path)
    assert info.value.key == "slots.Attention.kwargs.alibi"
    assert (
        "does not read back" in info.value.problem and "nothing was written" in info.value.problem
    )
    assert path.read_bytes() == before  # the old lock stays, and no temporary file is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernel-lock.toml"]


def test_a_lock_that_reads_back_as_another_is_never_written(tmp_path):
    """Text that reads as another lock than the one written (a writer's bug) is refused, naming the
    first key that differs."""
    good = sealed_lock(LOCK)
    # the twin too: a twin computing other than its target is refused before the comparison
    text = good.dumps().replace("dropout = 0.0", "dropout = 0.25")
    with pytest.raises(LockFormatError) as info:
        good.reads_back(tmp_path / "k.toml", text.encode())
    assert info.value.key == "slots.Attention.kwargs.dropout"


def test_not_a_number_in_evidence_reads_back(tmp_path):
    """Records may hold nan and inf (docs/lock-format.md): the read-back takes nan as itself."""
    text = LOCK.replace(
        "[slots.Attention.twin]",
        "[[slots.Attention.evidence]]\nworst-error-ratio = nan\nmedian-ms = inf\n\n"
        "[slots.Attention.twin]",
    )
    lock = sealed_lock(text)
    lock.dump(tmp_path / "k.toml")
    again = kernel_lock.load(tmp_path / "k.toml", emit_warnings=False)
    assert math.isnan(again.slots["Attention"].evidence[0]["worst-error-ratio"]) and again.intact


def test_the_safe_writer_hands_the_bytes_on_disk_to_its_check(tmp_path):
    seen = []
    write_file(tmp_path / "a", "text", check=seen.append)
    assert seen == [b"text"]

    def refuse(raw):
        raise ValueError("no")

    (tmp_path / "b").write_text("old")
    with pytest.raises(ValueError):
        write_file(tmp_path / "b", "new", check=refuse)
    assert (tmp_path / "b").read_text() == "old" and len(list(tmp_path.iterdir())) == 2


def test_bytes_read_back_that_differ_are_refused(tmp_path, monkeypatch):
    from kernel_lock import files

    monkeypatch.setattr(files.Path, "read_bytes", lambda self: b"torn")
    with pytest.raises(UnsafeWrite, match="differ from the 4 written; nothing was written"):
        write_file(tmp_path / "a", "text", check=lambda raw: None)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_holds_only_a_lock_that_reads_back():
    good = sealed_lock(LOCK)
    assert kernel_lock.loads(attach({}, good)["kernel_lock"]["text"]).slots == good.slots
    slot = good.slots["Attention"]
    bad = replace(good, slots={**good.slots, "Attention": replace(slot, kwargs={"dropout": 2.0})})
    with pytest.raises(LockFormatError, match="does not read back"):
        attach({}, bad.sealed())


def test_the_lock_format_doc_lists_every_declared_keyword():
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "lock-format.md").read_text()
    rows = text.split("| slot | keyword: type and range |")[1].split("\n\n")[0].splitlines()
    for spec in SPECS.values():
        row = next(ln for ln in rows if ln.startswith("| ") and spec.name in ln.split("|")[1])
        for name in spec.params:
            assert f"`{name}`" in row, (spec.name, name)
