"""Semantics by what a class computes, adapters and twins included: judged by the one function (the
import's ``class_semantics``, the tables' ``static_problem``) wherever a target or twin is judged:
verify (with and without import), rehash, the runtime's factory and the checkpoint's twin (issue 34,
point 3 and the twin found by reading)."""

from __future__ import annotations

import pytest

import kernel_lock
from kernel_lock import TargetNotAllowed
from kernel_lock.slots import class_semantics
from tests.conftest import MINIMAL_LOCK, run_cli, sealed_lock

IDENTITY_ADAPTER = "kernel_lock.adapters.Autocast__torch__nn__Identity"
ADAPTED = MINIMAL_LOCK.replace('target = "torch.nn.LayerNorm"', f'target = "{IDENTITY_ADAPTER}"', 1)
TWIN_ALIAS = MINIMAL_LOCK.replace(
    "kwargs = { eps = 1e-6 }\n\n[slots.RMSNorm]",
    'kwargs = { eps = 1e-6 }\n\n[slots.LayerNorm.twin]\ntarget = "torch.nn.modules.RMSNorm"\n'
    'kwargs = { eps = 1e-6 }\nstate-dict = "interchangeable"\nmax-error = 0.0\n\n[slots.RMSNorm]',
    1,
)


def test_an_adapters_semantics_are_its_wrapped_classs():
    from kernel_lock import adapters

    assert class_semantics(adapters.Autocast__torch__nn__Identity) == "other: Identity"
    assert class_semantics(adapters.Autocast__torch__nn__LayerNorm) == "layer_norm"
    assert class_semantics(adapters.CompiledRMSNorm) == "rms_norm"


def test_an_adapter_smuggling_identity_into_layer_norm_is_refused_by_the_runtime():
    """``factory("LayerNorm")(8)(x) == x`` once: every LayerNorm silently the identity."""
    lock = sealed_lock(ADAPTED)
    for mode in ("training", "inference"):
        with pytest.raises(TargetNotAllowed, match="computes other: Identity, not layer_norm"):
            lock.factory("LayerNorm", mode=mode, verify_environment=False)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["verify"], ["rehash"]])
def test_an_adapter_smuggling_identity_is_refused_by_verify_and_rehash(tmp_path, capsys, argv):
    lock = tmp_path / "L.toml"
    lock.write_text(sealed_lock(ADAPTED).dumps())
    code, _, err = run_cli([*argv, lock], capsys)
    assert code == 5 and "Identity" in err, err


@pytest.mark.parametrize("extra", [[], ["--no-import"]])
def test_a_twin_of_other_semantics_through_an_alias_is_refused_by_verify_in_inference(
    tmp_path, capsys, extra
):
    lock = tmp_path / "L.toml"
    lock.write_text(sealed_lock(TWIN_ALIAS).dumps())
    code, _, err = run_cli(["verify", lock, "--mode", "inference", *extra], capsys)
    assert code == 5 and "'slots.LayerNorm.twin.target'" in err and "computes rms_norm" in err, err
    code, _, err = run_cli(["rehash", lock], capsys)
    assert code == 5 and "computes rms_norm" in err


def test_the_runtime_refuses_the_same_twin_in_inference():
    lock = kernel_lock.loads(sealed_lock(TWIN_ALIAS).dumps())
    with pytest.raises(TargetNotAllowed):
        lock.verify("inference")
