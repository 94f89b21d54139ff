"""Checkpoints that carry their lock, and a state dict that moves from the training library to its
twin.

The worked example: train with a fake "fast" library the lock chose, save a checkpoint with its
lock, remove the library, rebuild in inference mode, load strictly, get the same outputs.
"""

from __future__ import annotations

import importlib
import logging
import sys
import warnings
from importlib import metadata
from pathlib import Path

import pytest
import torch

import kernel_lock
from kernel_lock import KernelUnavailable, LockFormatError, LockWarning
from kernel_lock.checkpoint import CHECKPOINT_KEY, attach, lock_from_checkpoint, migrate_state_dict
from tests.conftest import FAKES, ROOT, sealed_lock

TRAINING_LOCK = """\
lock-version = "1.0"
created-by = "test"
mode = "training"
trusted-modules = ["kp_fastnorm"]

[environment]
device-type = { value = "cpu", match = "exact" }

[environment.libraries]
kp-fastnorm = { value = "1.0", match = "compatible" }

[slots.LayerNorm]
implementation = "fastnorm.layer_norm"
target = "kp_fastnorm.FastLayerNorm"
semantics = "layer_norm"
kwargs = { eps = 1e-05 }
requires = [{ name = "kp-fastnorm", specifier = ">=1.0,<2", module = "kp_fastnorm" }]
reason = "fastnorm.layer_norm 1.4x faster than torch.layer_norm"
twin = { target = "torch.nn.LayerNorm", kwargs = { eps = 1e-05 }, state-dict = "migrate", migration = ["drop:_extra_state"], max-error = 1e-05 }
"""  # noqa: E501 (TOML inline tables are one line)


def sealed(text: str = TRAINING_LOCK) -> kernel_lock.KernelLock:
    return sealed_lock(text, path="train.toml")


@pytest.fixture
def fast_library(tmp_path, monkeypatch):
    """An installed distribution `kp-fastnorm` 1.0 whose LayerNorm adds `_extra_state` (like
    transformer-engine). Returns a function that uninstalls it from this process."""
    site = tmp_path / "site"
    (site / "kp_fastnorm").mkdir(parents=True)
    (site / "kp_fastnorm" / "__init__.py").write_text(
        "from kp_zoo.norms import ExtraStateLayerNorm as FastLayerNorm\n"
    )
    (site / "kp_fastnorm-1.0.dist-info").mkdir()
    (site / "kp_fastnorm-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: kp-fastnorm\nVersion: 1.0\n"
    )
    monkeypatch.syspath_prepend(str(site))

    def uninstall():
        sys.path.remove(str(site))
        sys.modules.pop("kp_fastnorm", None)
        importlib.invalidate_caches()
        with pytest.raises(metadata.PackageNotFoundError):
            metadata.version("kp-fastnorm")

    assert metadata.version("kp-fastnorm") == "1.0"
    yield uninstall
    sys.modules.pop("kp_fastnorm", None)


def build(lock: kernel_lock.KernelLock, mode: str) -> torch.nn.Sequential:
    Linear, LayerNorm = lock.factory("Linear", mode=mode), lock.factory("LayerNorm", mode=mode)
    return torch.nn.Sequential(Linear(8, 32), LayerNorm(32), torch.nn.GELU(), Linear(32, 4))


@pytest.mark.slow  # trains, saves and infers in fresh interpreters
def test_train_save_remove_library_infer(tmp_path, fast_library, caplog):
    lock = sealed()
    torch.manual_seed(0)
    model = build(lock, "training")
    assert type(model[1]).__name__ == "ExtraStateLayerNorm"
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = torch.randn(64, 8), torch.randn(64, 4)
    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    # the norm's affine parameters were trained
    assert not torch.equal(model[1].weight, torch.ones(32))
    state = model.state_dict()
    assert "1._extra_state" in state
    with torch.no_grad():
        expected = model(x)
    torch.save(attach({"model": state, "step": 10}, lock), tmp_path / "ckpt.pt")

    fast_library()  # this is now a machine without the training library

    ckpt = torch.load(tmp_path / "ckpt.pt")  # weights_only: the lock is stored as plain strings
    restored = lock_from_checkpoint(ckpt)
    assert restored == lock and restored.digest == lock.digest and restored.intact
    with pytest.raises(KernelUnavailable) as exc:
        build(restored, "training")
    msg = str(exc.value)
    assert (
        "slot LayerNorm" in msg
        and "kp-fastnorm" in msg
        and "not installed" in msg
        and 'mode="inference"' in msg
    )
    with caplog.at_level(logging.WARNING, logger="kernel_lock"):
        model = build(restored, "inference")
    assert type(model[1]) is torch.nn.LayerNorm and model[1].eps == 1e-05
    assert "substitutes torch.nn.LayerNorm for slot LayerNorm" in caplog.text
    max_error = restored.factory("LayerNorm", mode="inference").max_error
    assert max_error == 1e-05
    with torch.no_grad():
        # untrained: the load below matters
        assert not torch.allclose(model(x), expected, atol=1e-3)
    with pytest.raises(RuntimeError, match="_extra_state"):
        # the raw state dict does not fit the twin
        model.load_state_dict(ckpt["model"], strict=True)
    migrated = migrate_state_dict(ckpt["model"], restored, model)
    assert set(ckpt["model"]) - set(migrated) == {"1._extra_state"}
    model.load_state_dict(migrated, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=max_error, atol=max_error)


def test_attach_and_read_back_through_torch_save(tmp_path):
    lock = sealed()
    ckpt = attach({"model": {"w": torch.ones(2)}}, lock)
    assert ckpt[CHECKPOINT_KEY] == {"text": lock.dumps(), "digest": lock.digest}
    torch.save(ckpt, tmp_path / "c.pt")
    back = lock_from_checkpoint(torch.load(tmp_path / "c.pt", weights_only=True))
    assert back == lock and back.dumps() == lock.dumps()
    assert back.path == "<checkpoint>['kernel_lock']"


def test_checkpoint_without_lock():
    with pytest.raises(LockFormatError, match="carries no kernel lock") as exc:
        lock_from_checkpoint({"model": {}}, where="ckpt.pt")
    assert exc.value.path == "ckpt.pt" and "attach" in str(exc.value)


@pytest.mark.parametrize(
    "entry,words",
    [
        ("text", "expected a dict"),
        ({"digest": "sha256:00"}, "expected the lock's TOML text"),
        ({"text": "x = 1", "digest": 3}, "expected 'sha256:<hex>'"),
        ({"text": "not = = toml", "digest": "sha256:00"}, "not valid TOML"),
    ],
)
def test_malformed_entry(entry, words):
    with pytest.raises(LockFormatError, match=words):
        lock_from_checkpoint({CHECKPOINT_KEY: entry})


def test_altered_lock_in_checkpoint_is_refused():
    ckpt = attach({}, sealed())
    entry = ckpt[CHECKPOINT_KEY]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        with pytest.raises(LockFormatError, match="does not match its digest") as exc:
            lock_from_checkpoint(
                {CHECKPOINT_KEY: {**entry, "text": entry["text"].replace("1e-05", "1e-06", 1)}}
            )
        assert exc.value.key == "kernel_lock.digest"
        with pytest.raises(LockFormatError, match="does not match its digest"):
            lock_from_checkpoint({CHECKPOINT_KEY: {**entry, "digest": "sha256:" + "0" * 64}})


def test_hand_edited_lock_is_stored_faithfully_and_reported_as_such():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        edited = kernel_lock.loads(sealed().dumps().replace("1.4x", "1.5x"))
    assert not edited.intact
    ckpt = attach({}, edited)
    with pytest.warns(LockWarning, match="edited by hand"):
        back = lock_from_checkpoint(ckpt)
    assert back == edited and not back.intact
    with pytest.raises(LockFormatError, match="edited by hand"):
        lock_from_checkpoint(ckpt, strict=True)


# ---- migrate_state_dict ------------------------------------------------------------------------
def _state(with_extra: bool = True) -> dict[str, torch.Tensor]:
    sd = {
        "0.weight": torch.ones(4, 2),
        "1.weight": torch.ones(4),
        "1.bias": torch.zeros(4),
        "2.weight": torch.ones(1, 4),
    }
    if with_extra:
        sd["1._extra_state"] = torch.empty(0)
    return sd


def test_migration_keeps_keys_the_model_expects():
    # the library runs here, so the model rebuilt in inference mode still has `_extra_state`
    from kp_zoo.norms import ExtraStateLayerNorm

    model = torch.nn.Sequential(
        torch.nn.Linear(2, 4, bias=False), ExtraStateLayerNorm(4), torch.nn.Linear(4, 1, bias=False)
    )
    sd = _state()
    migrated = migrate_state_dict(sd, sealed(), model)
    assert migrated == sd and migrated is not sd
    model.load_state_dict(migrated, strict=True)


def test_migration_accepts_the_expected_keys_and_leaves_the_input_alone(caplog):
    sd = _state()
    with caplog.at_level(logging.INFO, logger="kernel_lock"):
        migrated = migrate_state_dict(sd, sealed(), {"0.weight", "1.weight", "1.bias", "2.weight"})
    assert (
        list(migrated) == ["0.weight", "1.weight", "1.bias", "2.weight"] and "1._extra_state" in sd
    )
    assert "1._extra_state: dropped (LayerNorm twin: drop:_extra_state)" in caplog.text


def test_only_recorded_migrations_are_applied():
    wanted = {"0.weight", "1.weight", "1.bias", "2.weight"}
    interchangeable = sealed(
        TRAINING_LOCK.replace(
            'state-dict = "migrate", migration = ["drop:_extra_state"]',
            'state-dict = "interchangeable"',
        )
    )
    # strict load will say so
    assert "1._extra_state" in migrate_state_dict(_state(), interchangeable, wanted)
    sd = {
        **_state(),
        "1.running_mean": torch.zeros(4),
    }  # not named by any rule: kept, strict load fails
    assert set(migrate_state_dict(sd, sealed(), wanted)) == wanted | {"1.running_mean"}


@pytest.mark.parametrize(
    "rule",
    [
        "rename:_extra_state",
        "rename:a->a",
        "drop:",
        "drop:a..b",
        "transpose:",
        "_extra_state",
        "reshape:weight",
    ],
)
def test_unknown_migration_rule_is_an_error(rule):
    lock = sealed(
        TRAINING_LOCK.replace('migration = ["drop:_extra_state"]', f'migration = ["{rule}"]')
    )
    with pytest.raises(LockFormatError, match="unknown state-dict migration") as exc:
        migrate_state_dict(_state(), lock, set())
    assert exc.value.key == "slots.LayerNorm.twin.migration[0]" and "'rename:<old>-><new>'" in str(
        exc.value
    )


def test_modules_are_not_imported_by_kernel_lock():
    import subprocess

    code = (
        "import sys, kernel_lock; print(sorted(m for m in sys.modules if "
        "m.startswith('kernel_lock')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    assert (
        "kernel_lock.checkpoint" not in out
        and "kernel_lock.distributed" not in out
        and "kernel_lock.lock" in out
    )


@pytest.mark.slow
def test_readme_worked_example_runs(tmp_path):
    import os
    import re
    import subprocess

    root = Path(__file__).resolve().parents[2]
    # the README's worked example moved there (issue 37)
    readme = (root / "docs" / "inference.md").read_text()
    section = readme.split("## The round trip, runnable", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    (tmp_path / "example.py").write_text(code)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "slot LayerNorm: fastnorm.layer_norm (fastnorm.FastLayerNorm) needs fastnorm >=1.0 "
        "(found: not installed)" in proc.stdout
    )
    assert "same outputs" in proc.stdout
    assert "inference substitutes torch.nn.LayerNorm for slot LayerNorm" in proc.stderr


# ---- documented torch.load calls pass weights_only (issue 14) ------------------------------------
def test_documented_torch_load_calls_pass_weights_only():
    import re

    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for call in re.findall(r"torch\.load\([^)]*\)", doc.read_text()):
            assert "weights_only=" in call, (doc.name, call)
    assert FAKES.is_dir()


def test_a_checkpoint_lock_goes_through_the_file_readers_limit():
    """A text over the 8 MiB cap was refused as a file and accepted inside a checkpoint (an 18 MB
    text took 31 s to reject) (issue 34)."""
    import time

    from kernel_lock.lock import MAX_BYTES

    text = sealed().dumps() + "# " + "x" * MAX_BYTES + "\n"
    start = time.perf_counter()
    with pytest.raises(LockFormatError, match="more than the") as err:
        lock_from_checkpoint({CHECKPOINT_KEY: {"text": text, "digest": "sha256:" + "0" * 64}})
    assert time.perf_counter() - start < 1.0 and err.value.exit_code == 5
