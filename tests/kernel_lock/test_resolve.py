"""kernel_lock's resolver: the real classes, pinned kwargs, and loud failures."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings

import pytest
import torch

import kernel_lock
from kernel_lock import (
    KernelUnavailable,
    LockFormatError,
    LockMismatch,
    LockWarning,
    TargetNotAllowed,
    fingerprint,
)
from kernel_probe import candidates as cands
from kernel_probe.probe.check import check_all
from tests.conftest import MINIMAL_LOCK, edited_lock


def _lock(text: str = MINIMAL_LOCK):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        return kernel_lock.loads(text, path="test.toml")


def test_hand_written_lock_resolves_to_torch_nn_with_pinned_kwargs():
    lock = _lock()
    ln = lock.factory("LayerNorm")(64)
    rms = lock.factory("RMSNorm")(64)
    lin = lock.factory("Linear")(64, 32)
    assert type(ln) is torch.nn.LayerNorm and ln.eps == 1e-6
    assert type(rms) is torch.nn.RMSNorm and rms.eps == 1e-6
    assert type(lin) is torch.nn.Linear and lin.bias is None


def test_call_site_kwargs_win_like_hydra_partials():
    lock = _lock()
    assert lock.factory("LayerNorm")(64, eps=1e-3).eps == 1e-3
    assert lock.factory("LayerNorm")(normalized_shape=8).normalized_shape == (8,)


def test_factory_records_how_it_resolved():
    f = _lock().factory("LayerNorm")
    assert (f.slot, f.implementation, f.target, f.mode, f.substituted_from) == (
        "LayerNorm",
        "torch.layer_norm",
        "torch.nn.LayerNorm",
        "training",
        None,
    )


def test_slot_absent_from_lock_resolves_to_torch_nn():
    text = MINIMAL_LOCK.split("[slots.RMSNorm]")[0]
    lock = _lock(text)
    assert "RMSNorm" not in lock.slots
    f = lock.factory("RMSNorm")
    assert type(f(16)) is torch.nn.RMSNorm and "default" in f.implementation
    assert type(kernel_lock.factory(None, "Linear")(2, 3)) is torch.nn.Linear


@pytest.mark.parametrize("bad", ["Layernorm", "layernorm", "GroupNorm", ""])
def test_unknown_slot_is_refused(bad):
    with pytest.raises(LockFormatError, match="unknown slot"):
        _lock().factory(bad)


def test_typo_gets_a_suggestion():
    with pytest.raises(LockFormatError, match="did you mean 'LayerNorm'"):
        _lock().factory("Layernorm")


def test_kwargs_the_target_does_not_accept():
    lock = _lock(
        MINIMAL_LOCK.replace(
            "kwargs = { eps = 1e-6 }", "kwargs = { eps = 1e-6, hidden_size = 4 }", 1
        )
    )
    with pytest.raises(LockFormatError) as exc:
        lock.factory("LayerNorm")
    assert exc.value.key == "slots.LayerNorm.kwargs.hidden_size"
    assert "normalized_shape" in str(exc.value)  # lists what is accepted
    assert exc.value.exit_code == 5


def test_target_that_is_not_a_module_is_refused():
    lock = _lock(
        MINIMAL_LOCK.replace(
            'target = "torch.nn.LayerNorm"', 'target = "torch.nn.functional.layer_norm"', 1
        )
    )
    with pytest.raises(TargetNotAllowed, match="not a torch.nn.Module subclass"):
        lock.factory("LayerNorm")
    text = MINIMAL_LOCK.replace(
        'created-by = "hand"', 'created-by = "hand"\ntrusted-modules = ["kp_notmodule"]'
    )
    text = text.replace('target = "torch.nn.LayerNorm"', 'target = "kp_notmodule.NotAModule"', 1)
    with pytest.raises(TargetNotAllowed, match="not a torch.nn.Module"):
        _lock(text).factory("LayerNorm")


def test_untrusted_target_is_refused_before_import():
    os.environ.pop("KP_EVIL_IMPORTED", None)
    sys.modules.pop("kp_evil", None)
    text = MINIMAL_LOCK.replace('target = "torch.nn.LayerNorm"', 'target = "kp_evil.Evil"', 1)
    with pytest.raises(TargetNotAllowed):
        _lock(text)
    assert "kp_evil" not in sys.modules and "KP_EVIL_IMPORTED" not in os.environ


def test_missing_library_raises_kernel_unavailable_naming_the_ways_out():
    text = MINIMAL_LOCK.replace(
        'created-by = "hand"', 'created-by = "hand"\ntrusted-modules = ["kp_not_installed"]'
    )
    text = text.replace(
        'target = "torch.nn.LayerNorm"\nsemantics = "layer_norm"\nkwargs = { eps = 1e-6 }',
        'target = "kp_not_installed.norms.FastLayerNorm"\nsemantics = "layer_norm"\nkwargs = { '
        "eps = 1e-6 }\n"
        'requires = [{ name = "kp-not-installed", specifier = ">=1.0", module = '
        '"kp_not_installed" }]',
        1,
    )
    lock = _lock(text)
    with pytest.raises(KernelUnavailable) as exc:
        lock.factory("LayerNorm", verify_environment=False)
    msg = str(exc.value)
    assert (
        "LayerNorm" in msg
        and "kp_not_installed.norms.FastLayerNorm" in msg
        and "not installed" in msg
    )
    assert "re-run `kernel-probe`" in msg and "inference" in msg and "install" in msg
    # verify reports it as an environment mismatch too
    with pytest.raises(LockMismatch, match="kp-not-installed"):
        lock.verify()


def test_broken_import_is_kernel_unavailable_not_a_traceback(tmp_path, monkeypatch):
    pkg = tmp_path / "kp_broken"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('0 active drivers')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KERNEL_LOCK_TRUST", "kp_broken")
    text = MINIMAL_LOCK.replace(
        'created-by = "hand"', 'created-by = "hand"\ntrusted-modules = ["kp_broken"]'
    )
    text = text.replace('target = "torch.nn.LayerNorm"', 'target = "kp_broken.Norm"', 1)
    with pytest.raises(KernelUnavailable, match="RuntimeError: 0 active drivers"):
        _lock(text).factory("LayerNorm")


def test_environment_mismatch_lists_every_field():
    text = MINIMAL_LOCK.replace(
        'device-type = { value = "cpu", match = "exact" }',
        'device-type = { value = "cuda", match = "exact" }\ndevice-arch = { value = "sm_90", '
        'match = "exact" }\ntorch = { value = "2.11.0", match = "compatible" }\ndevice-count = { '
        'value = 8, match = "ignore" }\n[environment.libraries]\nliger-kernel = { value = '
        '"0.1.0", match = "compatible" }',
    )
    lock = _lock(text)
    with pytest.raises(LockMismatch) as exc:
        lock.verify()
    fields = {d.field for d in exc.value.differences}
    assert fields == {"device-type", "device-arch", "torch", "libraries.liger-kernel"}
    msg = str(exc.value)
    assert "'cuda'" in msg and "'cpu'" in msg and "kernel-probe --force" in msg
    assert exc.value.exit_code == 3
    with pytest.raises(LockMismatch):
        lock.factory("LayerNorm")  # resolution verifies first


@pytest.mark.parametrize(
    "kind,rule,expected,found,ok",
    [
        ("version", "compatible", "2.11.0", "2.11.3", True),
        ("version", "compatible", "2.11.0", "2.12.0", False),
        ("version", "compatible", "580.159.04", "580.159.05", True),
        ("version", "compatible", "12.8", "13.0", False),
        ("version", "compatible", "", "12.8", False),
        ("version", "exact", "2.11.0", "2.11.1", False),
        ("text", "compatible", "sm_90", "sm_80", False),
        ("text", "ignore", "sm_90", "gfx90a", True),
        ("count", "exact", 8, 4, False),
        ("count", "ignore", 8, 4, True),
    ],
)
def test_match_rules(kind, rule, expected, found, ok):
    assert fingerprint.field_matches(kind, rule, expected, found) is ok


def test_inference_mode_substitutes_twin_and_says_so(caplog):
    text = MINIMAL_LOCK.replace(
        'created-by = "hand"', 'created-by = "hand"\ntrusted-modules = ["kp_not_installed"]'
    )
    text = text.replace(
        'target = "torch.nn.LayerNorm"\nsemantics = "layer_norm"\nkwargs = { eps = 1e-6 }',
        'target = "kp_not_installed.FastLayerNorm"\nsemantics = "layer_norm"\nkwargs = { eps = '
        "1e-6 }\n"
        'requires = [{ name = "kp-not-installed", specifier = ">=1.0", module = '
        '"kp_not_installed" }]\n'
        'twin = { target = "torch.nn.LayerNorm", kwargs = { eps = 1e-6 }, state-dict = '
        '"interchangeable", max-error = 0.002 }',
        1,
    )
    lock = _lock(text)
    with pytest.raises(KernelUnavailable):
        lock.factory("LayerNorm", verify_environment=False)  # training never substitutes
    with caplog.at_level(logging.WARNING, logger="kernel_lock"):
        f = lock.factory("LayerNorm", mode="inference")
    assert type(f(8)) is torch.nn.LayerNorm and f(8).eps == 1e-6
    assert f.substituted_from == "torch.layer_norm" and f.max_error == 0.002
    assert "substitutes torch.nn.LayerNorm" in caplog.text and "0.002" in caplog.text
    assert any("inference uses twin" in n for n in lock.verify("inference"))


def test_inference_mode_without_twin_raises():
    text = MINIMAL_LOCK.replace(
        'created-by = "hand"', 'created-by = "hand"\ntrusted-modules = ["kp_not_installed"]'
    )
    text = text.replace(
        'target = "torch.nn.LayerNorm"\nsemantics = "layer_norm"\nkwargs = { eps = 1e-6 }',
        'target = "kp_not_installed.FastLayerNorm"\nsemantics = "layer_norm"\nkwargs = { eps = '
        "1e-6 }\n"
        'requires = [{ name = "kp-not-installed", module = "kp_not_installed" }]\n'
        'twin = { target = "torch.nn.LayerNorm", state-dict = "incompatible" }',
        1,
    )
    lock = _lock(text)
    with pytest.raises(KernelUnavailable, match="does not interchange"):
        lock.factory("LayerNorm", mode="inference")
    with pytest.raises(LockMismatch, match="does not interchange"):
        lock.verify("inference")


def test_resolution_is_deterministic():
    lock = _lock()
    a = [(f.func, f.keywords) for f in (lock.factory(s) for s in kernel_lock.SLOTS)]
    b = [(f.func, f.keywords) for f in (lock.factory(s) for s in kernel_lock.SLOTS)]
    assert a == b


# ---- the install hint names the library the slot needs (issue 16, point 7) -----------------------
def test_install_hint_names_the_library_the_slot_needs(tmp_path):
    import kernel_lock

    text = MINIMAL_LOCK.replace(
        '''implementation = "torch.rms_norm"
target = "torch.nn.RMSNorm"''',
        """implementation = "fast.rms_norm"
target = "kp_not_installed.norms.RMSNorm"
requires = [{ name = "kp-not-installed", specifier = ">=1.2", module = "kp_not_installed" }]""",
    )
    with contextlib.redirect_stderr(io.StringIO()):
        lock = kernel_lock.loads(text, emit_warnings=False)
    with pytest.raises(kernel_lock.KernelUnavailable) as exc:
        lock.factory("RMSNorm", verify_environment=False)
    assert (
        "pip install 'kp-not-installed>=1.2'" in exc.value.fix
        and "kernel-probe[liger]" not in exc.value.fix
    )
    assert "--mode inference" in exc.value.fix


# ---- a library calling sys.exit on import (hostile input, issue 14) ------------------------------
@pytest.mark.slow
def test_a_library_calling_sys_exit_on_import_does_not_end_the_caller(tmp_path, monkeypatch):
    (tmp_path / "kp_exits.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lock = kernel_lock.loads(
        edited_lock(**{'target = "torch.nn.LayerNorm"': 'target = "kp_exits.Norm"'}),
        trust=["kp_exits"],
        emit_warnings=False,
    )
    with pytest.raises(KernelUnavailable, match=r"called sys.exit\(0\)"):
        lock.factory("LayerNorm", verify_environment=False)
    # in the probe's worker: a verdict, not a dead worker
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ['PYTHONPATH']}")
    reports = check_all(
        ["LayerNorm"],
        [cands.from_command_line("LayerNorm=kp_exits.Norm")],
        "cpu",
        [("float32", "true")],
    )
    [r] = [r for r in reports["LayerNorm"] if r.id == "custom:kp_exits.Norm"]
    assert r.status == "crashed" and "SystemExit" in r.reasons[0]
