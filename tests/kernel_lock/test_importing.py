"""kernel_lock.trust: the allow-list before the import, the class a target must be,
kwargs, and build's errors."""

from __future__ import annotations

import sys

import pytest
import torch

import kernel_lock
from kernel_lock.errors import KernelUnavailable, LockFormatError, TargetNotAllowed
from kernel_lock.trust import (
    IN_INFERENCE_MODE,
    build,
    check_kwargs,
    import_target,
    install_hint,
)
from tests.conftest import edited_lock


@pytest.mark.parametrize(
    "target,trusted,semantics,cls",
    [
        ("torch.nn.LayerNorm", (), None, torch.nn.LayerNorm),
        ("torch.nn.LayerNorm", (), "layer_norm", torch.nn.LayerNorm),
        ("torch.nn.modules.linear.Linear", (), "linear", torch.nn.Linear),
        (
            "kp_zoo.norms.GoodLayerNorm",
            ("kp_zoo",),
            "layer_norm",
            None,
        ),  # not judged by its name: accepted
        (
            "kp_zoo.norms.GoodRMSNorm",
            ("kp_zoo",),
            "layer_norm",
            None,
        ),  # nor by its hierarchy (an nn.Module)
    ],
)
def test_import_target(target, trusted, semantics, cls):
    got = import_target(target, trusted, semantics=semantics)
    assert got.__module__ + "." + got.__qualname__ == (
        target if cls is None else cls.__module__ + "." + cls.__qualname__
    )
    assert issubclass(got, torch.nn.Module)


# (target, trusted, semantics, error, words)
REFUSED = [
    ("os.system", (), None, TargetNotAllowed, "is not in the import allow-list"),
    ("torch.nn.RMSNorm", (), "layer_norm", TargetNotAllowed, "computes rms_norm, not layer_norm"),
    ("torch.nn.Identity", (), "linear", TargetNotAllowed, "computes other: Identity, not linear"),
    (
        "torch.nn.functional",
        (),
        None,
        TargetNotAllowed,
        "is a module, not a torch.nn.Module subclass",
    ),
    (
        "torch.nn.functional.layer_norm",
        (),
        None,
        TargetNotAllowed,
        "is a function, not a torch.nn.Module",
    ),
    (
        "kp_notmodule.NotAModule",
        ("kp_notmodule",),
        None,
        TargetNotAllowed,
        "is a type, not a torch.nn.Module",
    ),
    (
        "torch.nn.NoSuchNorm",
        (),
        None,
        ImportError,
        "module 'torch.nn' has no attribute 'NoSuchNorm'",
    ),
    ("kp_zoo.no_such_module.X", ("kp_zoo",), None, ImportError, "kp_zoo.no_such_module"),
]


@pytest.mark.parametrize("target,trusted,semantics,error,words", REFUSED)
def test_import_target_refuses(target, trusted, semantics, error, words):
    with pytest.raises(error) as exc:
        import_target(target, trusted, where="k.toml", key="slots.X.target", semantics=semantics)
    assert words in str(exc.value)
    if isinstance(exc.value, TargetNotAllowed):
        assert (exc.value.path, exc.value.key) == ("k.toml", "slots.X.target")


def test_the_allow_list_is_checked_before_the_import():
    assert "kp_exits" not in sys.modules
    with pytest.raises(TargetNotAllowed):
        import_target("kp_exits.Thing")  # not trusted: its SystemExit never runs
    assert "kp_exits" not in sys.modules


def _takes(a, b=1, *, c=2):
    pass


class _Pos:
    def __init__(self, a, /, b=1):
        pass


class _Var:
    def __init__(self, a, **kw):
        pass


@pytest.mark.parametrize(
    "cls,kwargs,bad",
    [
        (torch.nn.LayerNorm, {"eps": 1e-5, "bias": False}, None),
        (torch.nn.LayerNorm, {"epsilon": 1e-5}, "epsilon"),
        (torch.nn.Linear, {"bias": True, "in_features": 3}, None),
        (torch.nn.RMSNorm, {"bias": True}, "bias"),
        (_Pos, {"b": 2}, None),
        (_Pos, {"a": 2}, "a"),  # positional-only
        (_Var, {"anything": 1}, None),  # **kwargs takes all
        (int, {"nope": 1}, None),  # no signature to check: nothing refused here
    ],
)
def test_check_kwargs(cls, kwargs, bad):
    if bad is None:
        assert check_kwargs(cls, kwargs, where="k.toml", key="slots.X.kwargs") is None
        return
    with pytest.raises(LockFormatError) as exc:
        check_kwargs(cls, kwargs, where="k.toml", key="slots.X.kwargs")
    assert exc.value.key == f"slots.X.kwargs.{bad}" and exc.value.path == "k.toml"
    assert f"does not accept the keyword argument {bad!r}" in exc.value.problem
    assert exc.value.fix.startswith("remove it; accepted: ")


def test_check_kwargs_names_what_is_accepted():
    with pytest.raises(LockFormatError) as exc:
        check_kwargs(torch.nn.Linear, {"bais": True}, where=None, key="k")
    assert exc.value.fix == "remove it; accepted: in_features, out_features, bias, device, dtype"
    assert exc.value.problem.startswith("torch.nn.modules.linear.Linear does not accept")


@pytest.mark.parametrize(
    "requires,hint",
    [
        ("", "the library it needs"),
        ('requires = [{ name = "torch", specifier = ">=2.4" }]', "the library it needs"),
        (
            'requires = [{ name = "liger-kernel", specifier = ">=0.5" }]',
            "`pip install 'liger-kernel>=0.5'`",
        ),
        (
            'requires = [{ name = "torch" }, { name = "a-lib" }, { name = "b-lib", specifier = '
            '"==1.0" }]',
            "`pip install a-lib 'b-lib==1.0'`",
        ),
    ],
)
def test_install_hint(requires, hint):
    text = edited_lock(**{"kwargs = { eps = 1e-6 }": "kwargs = { eps = 1e-6 }\n" + requires})
    slot = kernel_lock.loads(text, emit_warnings=False).slots["LayerNorm"]
    assert install_hint(slot) == hint


def test_build_returns_the_checked_class():
    lock = kernel_lock.loads(edited_lock(), emit_warnings=False, path="k.toml")
    assert (
        build("LayerNorm", "torch.nn.LayerNorm", {"eps": 1e-6}, lock, "slots.LayerNorm")
        is torch.nn.LayerNorm
    )
    assert build("Linear", "torch.nn.Linear", {}, None, "slots.Linear") is torch.nn.Linear


# (target, the granted trust, error, words in the problem, words in the fix)
BUILD_ERRORS = [
    (
        "kp_zoo.missing_dependency.X",
        ("kp_zoo",),
        KernelUnavailable,
        "cannot import",
        "module 'kp_this_dependency",
    ),
    (
        "kp_zoo.raise_on_import.X",
        ("kp_zoo",),
        KernelUnavailable,
        "failed with RuntimeError: CUDA driver",
        "repair",
    ),
    ("kp_exits.X", ("kp_exits",), KernelUnavailable, "called sys.exit(3)", "is a program"),
    ("kp_zoo.nothing_here.X", ("kp_zoo",), KernelUnavailable, "cannot import", IN_INFERENCE_MODE),
    (
        "torch.nn.RMSNorm",
        (),
        TargetNotAllowed,
        "computes rms_norm, not layer_norm",
        "an RMSNorm is not a LayerNorm",
    ),
    ("os.path.Thing", (), TargetNotAllowed, "allow-list", "--trust"),
]


@pytest.mark.parametrize("target,granted,error,problem,fix", BUILD_ERRORS)
def test_build_turns_every_failure_into_a_lock_error(
    no_trust, target, granted, error, problem, fix
):
    lock = kernel_lock.loads(edited_lock(), emit_warnings=False, path="k.toml", trust=granted)
    with pytest.raises(error) as exc:
        build("LayerNorm", target, {}, lock, "slots.LayerNorm")
    assert type(exc.value) is error and exc.value.path == "k.toml"
    assert problem in exc.value.problem and fix in exc.value.fix
    assert exc.value.key == (
        "slots.LayerNorm.target" if error is TargetNotAllowed else "slots.LayerNorm"
    )


def test_build_checks_the_kwargs():
    with pytest.raises(LockFormatError) as exc:
        build("LayerNorm", "torch.nn.LayerNorm", {"epsilon": 1}, None, "slots.LayerNorm")
    assert exc.value.key == "slots.LayerNorm.kwargs.epsilon"
