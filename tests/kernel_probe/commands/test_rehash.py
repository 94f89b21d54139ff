"""kernel_probe/commands/locks.py: ``kernel-probe rehash [LOCK]`` re-seals a deliberately
hand-edited lock, validating it fully first."""

from __future__ import annotations

import argparse

import pytest

import kernel_lock
from kernel_lock.errors import LockError
from kernel_probe.commands.locks import add_rehash_arguments, run_rehash
from tests.conftest import MINIMAL_LOCK, edited_lock, run_cli, write_sealed


def rehash_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_rehash_arguments(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize(
    "argv,lock,trust",
    [
        ([], None, []),
        (["k.toml"], "k.toml", []),
        (["k.toml", "--trust", "a", "--trust", "b"], "k.toml", ["a", "b"]),
    ],
)
def test_arguments(argv, lock, trust):
    args = rehash_args(*argv)
    assert (args.lock, args.trust) == (lock, trust)


@pytest.mark.parametrize(
    "written,said",
    [
        (
            lambda p: p.write_text(edited_lock(**{"eps = 1e-6": "eps = 1e-7"})),
            "updated",
        ),  # a hand edit
        (lambda p: p.write_text(MINIMAL_LOCK), "updated"),  # never sealed
        (lambda p: write_sealed(p), "unchanged"),
    ],
    ids=["hand-edit", "unsealed", "sealed"],
)
def test_rehash_seals_the_lock_as_it_now_is(tmp_path, capsys, written, said):
    p = tmp_path / "k.toml"
    written(p)
    before = kernel_lock.load(p, emit_warnings=False)
    assert run_rehash(rehash_args(str(p))) == 0
    after = kernel_lock.load(p, strict=True)  # sealed and canonical
    assert (
        after.intact and after.digest == before.compute_digest() and p.read_text() == after.dumps()
    )
    assert after.slots == before.slots  # the content is kept: only the seal changes
    err = capsys.readouterr().err
    assert f"{p}: digest {said} ({after.digest})" in " ".join(err.split())


def test_the_default_lock_is_kernel_lock_or_the_working_directorys(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KERNEL_LOCK", raising=False)
    (tmp_path / "kernel-lock.toml").write_text(MINIMAL_LOCK)
    args = rehash_args()
    assert run_rehash(args) == 0 and args.lock == "kernel-lock.toml"
    assert kernel_lock.load(tmp_path / "kernel-lock.toml", strict=True).intact
    other = tmp_path / "other.toml"
    other.write_text(MINIMAL_LOCK)
    monkeypatch.setenv("KERNEL_LOCK", str(other))
    assert run_rehash(rehash_args()) == 0 and kernel_lock.load(other, strict=True).intact


@pytest.mark.parametrize(
    "edit,words",
    [
        ({'semantics = "layer_norm"': 'semantics = "rms_norm"'}, "needs semantics 'layer_norm'"),
        ({"[slots.Linear]": "[slots.Linaer]"}, "unknown slot 'Linaer'"),
        ({'lock-version = "1.0"': 'lock-version = "9.0"'}, "9.0"),
        (
            {'target = "torch.nn.LayerNorm"': 'target = "kp_evil.Evil"'},
            "not in the import allow-list",
        ),
        # what verify and the runtime refuse is not sealed either
        # (kernel_lock.launch.before_sealing)
        (
            {'target = "torch.nn.LayerNorm"': 'target = "torch.nn.RMSNorm"'},
            "computes rms_norm, not layer_norm",
        ),
        (
            {"kwargs = { bias = false }": "kwargs = { bias = false, fancy = 1 }"},
            "keyword argument 'fancy'",
        ),
    ],
    ids=[
        "semantics",
        "unknown-slot",
        "version",
        "untrusted",
        "target-of-other-semantics",
        "unknown-kwarg",
    ],
)
def test_an_invalid_lock_is_not_sealed(tmp_path, edit, words):
    p = tmp_path / "k.toml"
    p.write_text(edited_lock(**edit))
    text = p.read_text()
    with pytest.raises(LockError) as exc:
        run_rehash(rehash_args(str(p)))
    assert words in str(exc.value) and p.read_text() == text  # nothing rewritten


@pytest.mark.slow  # imports the candidates in two children
def test_trust_reaches_the_validation(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KERNEL_LOCK_TRUST", raising=False)
    p = tmp_path / "k.toml"
    p.write_text(
        edited_lock(**{'target = "torch.nn.LayerNorm"': 'target = "kp_zoo.norms.GoodLayerNorm"'})
    )
    with pytest.raises(LockError, match="not in the import allow-list"):
        run_rehash(rehash_args(str(p)))
    # imported in a child, then sealed
    assert run_rehash(rehash_args(str(p), "--trust", "kp_zoo")) == 0
    assert (
        kernel_lock.load(p, strict=True, trust=["kp_zoo"]).slots["LayerNorm"].target
        == "kp_zoo.norms.GoodLayerNorm"
    )
    assert "note" not in capsys.readouterr().err  # judged: nothing left unsaid
    p.write_text(edited_lock(**{'target = "torch.nn.LayerNorm"': 'target = "kp_evil.Evil"'}))
    # trusted, and still wrong
    with pytest.raises(LockError, match="is a type, not a torch.nn.Module subclass"):
        run_rehash(rehash_args(str(p), "--trust", "kp_evil"))


def test_through_the_cli_a_refusal_is_an_exit_code(tmp_path, capsys):
    code, out, err = run_cli(["rehash", tmp_path / "missing.toml"], capsys)
    assert code == 5 and "no such file" in err and out == ""
