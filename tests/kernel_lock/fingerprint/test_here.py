"""kernel_lock.torchless.for_check: torch's fingerprint where torch is imported, else the torch-free
read."""

from __future__ import annotations

import sys

import pytest

from kernel_lock import fingerprint, torchless


@pytest.fixture
def readers(monkeypatch):
    """Each reader replaced by one that records its call and says who answered."""
    calls = []

    def reader(name, result):
        def read(*args):
            calls.append((name, args))
            return result

        return read

    monkeypatch.setattr(fingerprint, "current", reader("with_torch.current", {"by": "torch"}))
    monkeypatch.setattr(torchless, "current", reader("torchless.current", {"by": "files"}))
    monkeypatch.setattr(fingerprint, "import_torch", reader("import_torch", "torch-module"))
    monkeypatch.setattr(fingerprint, "device_facts", reader("device_facts", {"type": "torch"}))
    return calls


@pytest.mark.parametrize(
    "use_torch,torch_imported,by",
    [
        (True, True, "torch"),
        (True, False, "files"),
        (False, True, "files"),
        (False, False, "files"),
    ],
)
def test_for_check(monkeypatch, readers, use_torch, torch_imported, by):
    monkeypatch.setattr(torchless, "USE_IMPORTED_TORCH", use_torch)
    if not torch_imported:
        monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert torchless.for_check(["driver"]) == {"by": by}
    if by == "files":
        assert readers == [("torchless.current", (["driver"],))]
    else:
        assert readers == [("with_torch.current", ())]


@pytest.mark.parametrize(
    "use_torch,torch_imported,torchless_facts,facts",
    [
        (
            True,
            True,
            {"type": "cpu"},
            {"type": "torch"},
        ),  # torch imported: asked, the files are not read
        (True, False, {"type": "cpu"}, {"type": "cpu"}),
        (False, True, {"type": "cpu"}, {"type": "cpu"}),
        (
            True,
            False,
            None,
            {"type": "torch"},
        ),  # a fact the files cannot give: torch is imported for it
    ],
)
def test_device_here(monkeypatch, readers, use_torch, torch_imported, torchless_facts, facts):
    monkeypatch.setattr(torchless, "USE_IMPORTED_TORCH", use_torch)
    if not torch_imported:
        monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(torchless, "device", lambda: torchless_facts)
    assert torchless.device_here() == facts
    assert (("import_torch", ()) in readers) is (facts == {"type": "torch"})
