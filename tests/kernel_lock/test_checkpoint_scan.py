"""An honest checkpoint scan (issue 24, point 7): ``saved_modules`` / ``globals_in`` model the
pickle's stack, marks and memo, so every global loading would import is reported, decoys or not; a
global the scan cannot name raises rather than being left out."""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from kernel_lock.errors import ExitCode, LockFormatError
from kernel_lock.portability import UnreadablePickle, globals_in, saved_modules


def _s(text: str) -> bytes:
    raw = text.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw


# the pickle: push "builtins" and "print", push and pop the decoys "torch" and "nn",
# STACK_GLOBAL; loading it calls print("pwned")
DECOY = (
    b"\x80\x04"
    + _s("builtins")
    + _s("print")
    + _s("torch")
    + _s("nn")
    + pickle.POP
    + pickle.POP
    + pickle.STACK_GLOBAL
    + _s("pwned")
    + pickle.TUPLE1
    + pickle.REDUCE
    + pickle.STOP
)
# the same through the memo: the real names are memoised, decoys pushed last, the real ones fetched
# back
MEMO = (
    b"\x80\x04"
    + _s("os")
    + pickle.MEMOIZE
    + _s("getcwd")
    + pickle.MEMOIZE
    + pickle.POP
    + pickle.POP
    + _s("torch")
    + _s("nn")
    + pickle.POP
    + pickle.POP
    + pickle.BINGET
    + b"\x00"
    + pickle.BINGET
    + b"\x01"
    + pickle.STACK_GLOBAL
    + pickle.EMPTY_TUPLE
    + pickle.REDUCE
    + pickle.STOP
)
# decoys inside a marked tuple that POP_MARK discards
MARKED = (
    b"\x80\x04"
    + _s("builtins")
    + _s("print")
    + pickle.MARK
    + _s("torch")
    + _s("nn")
    + pickle.POP_MARK
    + pickle.STACK_GLOBAL
    + _s("x")
    + pickle.TUPLE1
    + pickle.REDUCE
    + pickle.STOP
)
# the old text opcode GLOBAL, and INST
TEXT = b"cbuiltins\nprint\n(S'x'\ntR0(S'y'\nibuiltins\nprint\n."


@pytest.mark.parametrize(
    "data, expected",
    [
        (DECOY, {"builtins.print"}),
        (MEMO, {"os.getcwd"}),
        (MARKED, {"builtins.print"}),
        (TEXT, {"builtins.print"}),
    ],
    ids=["decoy-strings", "memo", "mark", "GLOBAL-and-INST"],
)
def test_every_global_loading_imports_is_reported(data, expected, capsys):
    assert globals_in(data) == expected
    pickle.loads(data)  # and loading it does import and call exactly that
    # print printed; getcwd prints nothing
    assert bool(capsys.readouterr().out) == ("builtins.print" in expected)


def _checkpoint(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "model.ckpt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", data)
        archive.writestr("archive/version", "3\n")
    return path


def test_saved_modules_reports_the_decoy_pickles_global(tmp_path):
    assert saved_modules(_checkpoint(tmp_path, DECOY)) == {"builtins"}  # was {'torch'}


def test_every_pickle_member_is_read(tmp_path):
    path = tmp_path / "two.ckpt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(1, protocol=2))
        archive.writestr("archive/extra.pkl", DECOY)
    assert "builtins" in saved_modules(path)


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x04"
        + pickle.EMPTY_TUPLE
        + _s("print")
        + pickle.STACK_GLOBAL
        + pickle.STOP,  # module not a string
        b"\x80\x02" + pickle.EXT1 + b"\x01" + pickle.STOP,  # copyreg extension code
        b"\x80\x04" + pickle.BINGET + b"\x05" + pickle.STOP,  # memo never stored
        b"\x80\x04" + _s("x") + pickle.STACK_GLOBAL + pickle.STOP,  # stack underflow
        b"\x80\x04" + _s("builtins"),  # truncated
    ],
    ids=["non-string-operand", "ext1", "unknown-memo", "underflow", "truncated"],
)
def test_what_cannot_be_named_raises(data):
    with pytest.raises(UnreadablePickle):
        globals_in(data)


def test_a_real_torch_save_is_read(tmp_path):
    path = tmp_path / "m.pt"
    torch.save(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)), path)
    modules = saved_modules(path)
    assert {
        "torch.nn.modules.linear",
        "torch.nn.modules.normalization",
        "torch.nn.modules.container",
    } <= modules


# ---- archives read entry by entry; a duplicate name refused (issue 52, mechanism 6) ------------
def _archive(path: Path, *members: tuple[str, bytes]) -> Path:
    with warnings.catch_warnings():  # zipfile warns of a duplicate name, then writes it
        warnings.simplefilter("ignore", UserWarning)
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in members:
                archive.writestr(name, data)
    return path


@pytest.mark.parametrize(
    "second", ["archive/data.pkl", "archive/DATA.pkl"], ids=["same-name", "other-case"]
)
def test_an_archive_with_two_entries_of_one_name_is_refused(tmp_path, second):
    # the first data.pkl is what torch's loader reads; read(name) gave the harmless last one twice
    path = _archive(
        tmp_path / "two.ckpt",
        ("archive/data.pkl", DECOY),
        (second, pickle.dumps({"a": 1}, protocol=2)),
        ("archive/version", b"3\n"),
    )
    with pytest.raises(LockFormatError) as err:
        saved_modules(path)
    assert err.value.path == str(path) and err.value.exit_code == ExitCode.BAD_INPUT
    assert f"two entries named 'archive/data.pkl' and {second!r}" in err.value.problem
    assert "re-save the checkpoint" in (err.value.fix or "")


def test_every_pickle_entry_is_scanned_whatever_its_letter_case(tmp_path):
    path = _archive(
        tmp_path / "case.ckpt",
        ("archive/data.pkl", pickle.dumps(1, protocol=2)),
        ("archive/constants.PKL", MEMO),
    )
    assert saved_modules(path) == {"os"}
