"""kernel_lock.portable: a copy of a model whose pickle needs neither the training library nor
kernel_lock.

Plain torch models here; tests/kernel_lock/test_anemoi_model.py does the same with the whole anemoi
model.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import torch

import kernel_lock
from kernel_lock import KernelUnavailable
from kernel_lock.portability import NotPortable, Replacement, pickled_modules, saved_modules
from tests.conftest import FAKES, sealed_lock

LOCK = """\
lock-version = "1.0"
created-by = "test"
trusted-modules = ["kp_zoo", "kp_fastlib"]

[slots.LayerNorm]
implementation = "fast.layer_norm"
target = "kp_fastlib.FastLayerNorm"
semantics = "layer_norm"
kwargs = { eps = 1e-5 }
twin = { target = "torch.nn.LayerNorm", kwargs = { eps = 1e-5, elementwise_affine = true, bias = true }, state-dict = "migrate", migration = ["drop:_extra_state"], max-error = 1e-7 }

[slots.Linear]
implementation = "fast.linear"
target = "kp_fastlib.FastLinear"
semantics = "linear"
kwargs = { bias = true }
twin = { target = "torch.nn.Linear", kwargs = { bias = true }, state-dict = "interchangeable", max-error = 0.0 }
"""  # noqa: E501 (TOML inline tables are one line)


def load(text: str = LOCK) -> kernel_lock.KernelLock:
    return sealed_lock(text, path="test.toml")


def Model(lock):
    from kp_models import FactoryModel

    return FactoryModel(
        lock.factory("LayerNorm", verify_environment=False),
        lock.factory("Linear", verify_environment=False),
    )


def test_every_lock_class_becomes_its_twin():
    lock = load()
    model = Model(lock)
    before = pickled_modules(model)
    # the classes and KernelFactory
    assert "kp_fastlib" in before and "kernel_lock.resolve" in before
    report: list[Replacement] = []
    copy = kernel_lock.portable(model, lock, report=report)
    after = {m.split(".")[0] for m in pickled_modules(copy)}
    assert "kp_fastlib" not in after and "kernel_lock" not in after, after
    assert [type(m) for m in copy.body] == [
        torch.nn.Linear,
        torch.nn.LayerNorm,
        torch.nn.GELU,
        torch.nn.Linear,
    ]
    # the module's own eps (set at its call site), not the lock's default
    assert copy.body[1].eps == 1e-3
    assert (
        copy.body[3].bias is None
        and copy.shared is copy.body[1]
        and copy.norm_class is torch.nn.LayerNorm
    )
    assert (
        copy.layer_factory["LayerNorm"].func is torch.nn.LayerNorm
        and type(copy.layer_factory["Linear"]) is functools.partial
    )
    assert copy.layer_factory["Activation"] is not None
    assert sorted(r.slot for r in report) == [
        "LayerNorm",
        "Linear",
        "Linear",
    ]  # the shared norm is replaced once
    assert all(r.error is not None and r.error < 1e-6 for r in report)
    x = torch.randn(5, 8)
    torch.testing.assert_close(copy(x), model(x), rtol=1e-5, atol=1e-6)
    assert type(model.body[1]).__module__ == "kp_fastlib"  # the original is untouched


def test_a_slot_without_usable_twin_is_refused_naming_it():
    lock = load(
        LOCK.replace(
            ', state-dict = "migrate", migration = ["drop:_extra_state"], max-error = 1e-7',
            ', state-dict = "incompatible"',
        )
    )
    with pytest.raises(
        KernelUnavailable, match="slot LayerNorm: the model holds kp_fastlib.FastLayerNorm"
    ):
        kernel_lock.portable(Model(lock), lock)


def test_a_twin_that_disagrees_is_refused():
    lock = load(
        LOCK.replace(
            'twin = { target = "torch.nn.LayerNorm", kwargs = { eps = 1e-5, elementwise_affine '
            "= true, bias = true }",
            'twin = { target = "torch.nn.RMSNorm", kwargs = { eps = 1e-5, elementwise_affine = '
            "true }",
        )
    )
    # an RMSNorm twin for a LayerNorm slot is refused before anything runs (it computes something
    # else)
    with pytest.raises(KernelUnavailable, match="computes rms_norm, not layer_norm"):
        kernel_lock.portable(Model(lock), lock)


def test_a_lock_class_hidden_outside_the_module_tree_is_refused():
    lock = load()
    sneaky = Model(lock)
    # a lock class as an argument of another partial
    sneaky.hidden = functools.partial(print, type(sneaky.body[1]))
    with pytest.raises(NotPortable, match="kp_fastlib"):
        kernel_lock.portable(sneaky, lock)


@pytest.mark.slow
def test_saved_file_loads_where_the_library_and_kernel_lock_cannot_be_imported(tmp_path):
    lock = load()
    model = Model(lock)
    x = torch.randn(3, 8)
    torch.save(x, tmp_path / "x.pt")
    torch.save(model, tmp_path / "plain.pt")
    torch.save(kernel_lock.portable(model, lock), tmp_path / "portable.pt")
    assert "kp_fastlib" in saved_modules(tmp_path / "plain.pt")
    assert not {m.split(".")[0] for m in saved_modules(tmp_path / "portable.pt")} & {
        "kp_fastlib",
        "kernel_lock",
    }
    code = (
        "import importlib.abc, sys, torch\nclass B(importlib.abc.MetaPathFinder):\n    def "
        "find_spec(self, name, path=None, target=None):\n        if name.split('.')[0] in "
        "('kernel_lock', 'kp_fastlib'): raise ModuleNotFoundError(name, "
        "name=name)\nsys.meta_path.insert(0, B())\nm = torch.load(sys.argv[1], "
        "weights_only=False)\ntorch.save(m(torch.load(sys.argv[2])).detach(), sys.argv[3])\n"
    )
    env = {"PYTHONPATH": str(FAKES), "PATH": "/usr/bin:/bin"}
    plain = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(tmp_path / "plain.pt"),
            str(tmp_path / "x.pt"),
            str(tmp_path / "y.pt"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert plain.returncode != 0 and "ModuleNotFoundError" in plain.stderr
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(tmp_path / "portable.pt"),
            str(tmp_path / "x.pt"),
            str(tmp_path / "y.pt"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(
        torch.load(tmp_path / "y.pt"), model(x).detach(), rtol=1e-5, atol=1e-6
    )


def test_a_library_that_calls_sys_exit_on_import_does_not_end_the_caller(monkeypatch):
    """``portable(model, lock)`` once ended the script with the library's sys.exit(3); factory
    raises KernelUnavailable for the same library, and so does portable now (issue 34)."""
    sys.modules.pop("kp_exits", None)
    monkeypatch.setenv("KERNEL_LOCK_TRUST", "kp_zoo,kp_fastlib,kp_exits")
    lock = sealed_lock(
        LOCK.replace('target = "kp_fastlib.FastLayerNorm"', 'target = "kp_exits.Norm"'),
        path="t.toml",
    )
    with pytest.raises(KernelUnavailable, match=r"sys.exit\(3\)"):
        kernel_lock.portable(torch.nn.Sequential(torch.nn.Linear(2, 2)), lock)
    with pytest.raises(KernelUnavailable, match=r"sys.exit\(3\)"):
        lock.factory("LayerNorm", verify_environment=False)
