"""kernel_lock.trust: the import allow-list, the trust a caller grants, and the refusals before any
import."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

import kernel_lock
from kernel_lock import LockWarning
from kernel_lock.errors import BadEnvironmentVariable, LockFormatError, TargetNotAllowed
from kernel_lock.trust import TRUST_ENV, check_target, granted_trust, module_name, private
from tests.conftest import MINIMAL_LOCK, edited_lock, run_cli, write_sealed


@pytest.mark.parametrize(
    "dotted,is_private",
    [
        ("torch.nn.LayerNorm", False),
        ("torch._C.X", True),
        ("torch.nn._reduction.X", True),
        ("a.__main__.X", True),
        ("_site.X", True),
        ("torch.nn.Layer_Norm", False),
    ],
)
def test_private(dotted, is_private):
    assert private(dotted) is is_private


@pytest.mark.parametrize(
    "name,ok",
    [
        ("mylib", True),
        ("site_kernels.norms", True),
        ("_private", False),
        ("a._b", False),
        ("a b", False),
        ("1lib", False),
        ("", False),
        ("a..b", False),
        ("a.", False),
        ("lïb", False),  # ASCII names only
        ("a-b", False),
    ],
)
def test_module_name(name, ok):
    assert module_name(name) is ok


@pytest.mark.parametrize(
    "trust,env,granted",
    [
        ((), None, ()),
        (("a",), None, ("a",)),
        ((), "a,b", ("a", "b")),
        ((), "a:b c", ("a", "b", "c")),
        ((), " , a,,", ("a",)),
        (("a", "b"), "b,c", ("a", "b", "c")),  # duplicates once, first order kept
        (("x.y",), "", ("x.y",)),
    ],
)
def test_granted_trust(monkeypatch, trust, env, granted):
    if env is None:
        monkeypatch.delenv(TRUST_ENV, raising=False)
    else:
        monkeypatch.setenv(TRUST_ENV, env)
    assert granted_trust(trust) == granted


@pytest.mark.parametrize(
    "trust,env,source,key",
    [
        (("a b",), "", "trust", None),
        (("_x",), "", "trust", None),
        ((), "ok,_hidden", f"${TRUST_ENV}", TRUST_ENV),
        ((), "bad-name", f"${TRUST_ENV}", TRUST_ENV),
    ],
)
def test_granted_trust_refuses_a_bad_name(monkeypatch, trust, env, source, key):
    monkeypatch.setenv(TRUST_ENV, env)
    with pytest.raises(BadEnvironmentVariable) as exc:
        granted_trust(trust)
    assert (
        exc.value.problem.startswith(f"{source}: ")
        and "is not a public module name" in exc.value.problem
    )
    assert (
        exc.value.key == key and exc.value.exit_code == 2 and "KERNEL_LOCK_TRUST=" in exc.value.fix
    )


@pytest.mark.parametrize(
    "target,trusted",
    [
        ("torch.nn.LayerNorm", ()),
        ("torch.nn.modules.normalization.RMSNorm", ()),
        ("kernel_lock.adapters.CompiledLinear", ()),
        (
            "liger_kernel.transformers.LigerLayerNorm",
            (),
        ),  # a built-in candidate's root, from the registry
        ("transformer_engine.pytorch.LayerNorm", ()),
        ("mylib.norms.Fast", ("mylib",)),
        ("mylib.norms.Fast", ("mylib.norms",)),
        ("kernel_lock.adapters.Autocast__mylib__norms__Fast", ("mylib",)),
        ("kernel_lock.adapters.Autocast__liger_kernel__transformers__LigerLayerNorm", ()),
    ],
)
def test_check_target_allows(target, trusted):
    assert check_target(target, trusted) is None


# (target, trusted, requested, error, words)
REFUSED = [
    ("LayerNorm", (), (), LockFormatError, "is not a dotted import path"),
    ("torch.nn.", (), (), LockFormatError, "is not a dotted import path"),
    ("torch nn.X", (), (), LockFormatError, "is not a dotted import path"),
    (3, (), (), LockFormatError, "is not a dotted import path"),
    ("torch._C._nn.Thing", (), (), TargetNotAllowed, "private or __main__ component"),
    (
        "torch.utils.model_dump.__main__.X",
        (),
        (),
        TargetNotAllowed,
        "private or __main__ component",
    ),
    ("os.system", (), (), TargetNotAllowed, "is not in the import allow-list"),
    (
        "torchvision.ops.Foo",
        (),
        (),
        TargetNotAllowed,
        "is not in the import allow-list",
    ),  # lookalike root
    (
        "kernel_lock.resolve.KernelFactory",
        (),
        (),
        TargetNotAllowed,
        "is not in the import allow-list",
    ),
    ("mylibx.Fast", ("mylib",), (), TargetNotAllowed, "is not in the import allow-list"),
    ("mylib.norms.Fast", (), ("mylib",), TargetNotAllowed, "which the lock asks to trust"),
    (
        "kernel_lock.adapters.Autocast__os__System",
        (),
        (),
        TargetNotAllowed,
        "(inside kernel_lock.adapters.",
    ),
    ("kernel_lock.adapters.Sized__mylib__Fast", (), ("mylib",), TargetNotAllowed, "asks to trust"),
]


@pytest.mark.parametrize("target,trusted,requested,error,words", REFUSED)
def test_check_target_refuses(target, trusted, requested, error, words):
    with pytest.raises(error) as exc:
        check_target(
            target, trusted, path="k.toml", key="slots.LayerNorm.target", requested=requested
        )
    assert type(exc.value) is error
    assert words in exc.value.problem
    assert (exc.value.path, exc.value.key, exc.value.exit_code) == (
        "k.toml",
        "slots.LayerNorm.target",
        5,
    )


def test_a_refusal_names_the_grant():
    with pytest.raises(TargetNotAllowed) as exc:
        check_target("mylib.norms.Fast", requested=("other", "mylib"), what="twin target")
    assert exc.value.problem.startswith("twin target 'mylib.norms.Fast' is in 'mylib'")
    assert (
        "--trust mylib" in exc.value.fix
        and f"{TRUST_ENV}=mylib" in exc.value.fix
        and "trust=['mylib']" in exc.value.fix
    )
    with pytest.raises(TargetNotAllowed) as exc:
        check_target("os.system")
    assert "liger_kernel" in exc.value.problem and "--trust MODULE" in exc.value.fix


def test_trusted_modules_extend_the_allow_list():
    text = edited_lock(
        **{
            'created-by = "hand"': 'created-by = "hand"\ntrusted-modules = ["mylib"]',
            'target = "torch.nn.LayerNorm"': 'target = "mylib.norms.FastLayerNorm"',
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        lock = kernel_lock.loads(text)
    assert lock.slots["LayerNorm"].target == "mylib.norms.FastLayerNorm"


@pytest.mark.parametrize(
    "target", ["torch.utils.model_dump.__main__.X", "torch._C._nn.Thing", "torch.nn._reduction.X"]
)
def test_main_and_private_paths_are_refused_before_import(tmp_path, capsys, target):
    path = tmp_path / "k.toml"
    # not sealed
    path.write_text(edited_lock(**{'target = "torch.nn.LayerNorm"': f'target = "{target}"'}))
    code, out, err = run_cli(["verify", path], capsys)
    assert (
        code == 5 and "private or __main__ component" in err and "usage" not in (out + err).lower()
    )
    assert "torch.utils.model_dump.__main__" not in sys.modules


def test_a_locks_trusted_modules_only_ask(tmp_path, capsys, no_trust):
    text = edited_lock(
        **{
            'created-by = "hand"': 'created-by = "hand"\ntrusted-modules = ["kp_zoo"]',
            'target = "torch.nn.LayerNorm"': 'target = "kp_zoo.norms.GoodLayerNorm"',
        }
    )
    path = write_sealed(tmp_path / "k.toml", text, check_targets=False)
    code, _, err = run_cli(["verify", path], capsys)
    assert (
        code == 5
        and "asks to trust (trusted-modules) but which was not granted" in err
        and "--trust kp_zoo" in err
    )
    assert run_cli(["verify", path, "--trust", "kp_zoo"], capsys)[0] == 0
    os.environ["KERNEL_LOCK_TRUST"] = "kp_zoo"
    try:
        assert run_cli(["verify", path], capsys)[0] == 0
        assert kernel_lock.load(path).granted == ("kp_zoo",)
    finally:
        del os.environ["KERNEL_LOCK_TRUST"]
    with pytest.raises(TargetNotAllowed, match="not granted"):
        kernel_lock.load(path)
    # printing a lock imports nothing: no trust needed
    assert run_cli(["show", path], capsys)[0] == 0


def test_the_lock_loader_grants_the_callers_trust(no_trust):
    assert kernel_lock.loads(MINIMAL_LOCK, emit_warnings=False, trust=["mylib"]).granted == (
        "mylib",
    )
    with pytest.raises(BadEnvironmentVariable):
        kernel_lock.loads(MINIMAL_LOCK, emit_warnings=False, trust=["no good"])
