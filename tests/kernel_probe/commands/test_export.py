"""The lock as anemoi's ``layer_kernels``: export, the adapters, and `check --hidden` for q/k norms.

No anemoi-models needed here (tests/kernel_lock/test_anemoi.py runs the real consumer).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import yaml

import kernel_lock
import kernel_lock.adapters as adapters
from kernel_lock import KernelUnavailable, LockMismatch, LockWarning, registry
from kernel_lock.anemoi import (
    AUTOCAST_LAYER_NORM,
    ConventionError,
    convention_problems,
    export,
    layer_kernels,
)
from tests.conftest import MINIMAL_LOCK, ROOT, write_sealed
from tests.conftest import run_cli as run
from tests.kernel_lock.test_import_light import _imported_modules

HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None


def load(text: str) -> kernel_lock.KernelLock:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        return kernel_lock.loads(text, path="test.toml")


def lock_text(
    ln_target: str = "torch.nn.LayerNorm",
    ln_kwargs: str = "{ eps = 1e-5, elementwise_affine = true, bias = true }",
    extra: str = "",
    device: str = "cpu",
) -> str:
    return f'''\
lock-version = "1.0"
created-by = "test"
trusted-modules = ["kp_zoo"]

[environment]
device-type = {{ value = "{device}", match = "exact" }}

[slots.LayerNorm]
implementation = "x.layer_norm"
target = "{ln_target}"
semantics = "layer_norm"
kwargs = {ln_kwargs}

[slots.Linear]
implementation = "torch.linear"
target = "torch.nn.Linear"
semantics = "linear"
kwargs = {{ bias = true }}
{extra}'''


@pytest.fixture
def fake_adapter(monkeypatch):
    """Register the liger-signature fake the way liger's own classes are registered: one row of
    data."""
    monkeypatch.setitem(
        registry.SIZE_ADAPTERS,
        "HiddenSizeLayerNormAnemoi",
        ("kp_zoo.norms.HiddenSizeLayerNorm", "hidden_size"),
    )
    yield "kernel_lock.adapters.HiddenSizeLayerNormAnemoi"
    adapters.__dict__.pop("HiddenSizeLayerNormAnemoi", None)


# ---- export --------------------------------------------------------------------------------------
def test_pinned_kwargs_no_dimensions_no_rmsnorm():
    assert layer_kernels(load(MINIMAL_LOCK)) == {
        "LayerNorm": {"_target_": "torch.nn.LayerNorm", "eps": 1e-6},
        "Linear": {"_target_": "torch.nn.Linear", "bias": False},
    }  # the RMSNorm slot is pinned too, but anemoi has no RMSNorm key: never exported
    # a dimension pinned in the lock (torch.nn.LayerNorm does accept it as a keyword) is dropped
    lock = load(lock_text(ln_kwargs="{ eps = 1e-5, normalized_shape = 1024 }"))
    assert layer_kernels(lock)["LayerNorm"] == {"_target_": "torch.nn.LayerNorm", "eps": 1e-5}


def test_only_pinned_slots_are_exported():
    only_rms = (
        MINIMAL_LOCK.split("[slots.LayerNorm]")[0]
        + "[slots.RMSNorm]"
        + MINIMAL_LOCK.split("[slots.RMSNorm]")[1].split("[slots.Linear]")[0]
    )
    assert "RMSNorm" in load(only_rms).slots
    assert layer_kernels(load(only_rms)) == {}


def test_a_fitting_third_party_class_is_emitted_as_it_is():
    lock = load(lock_text("kp_zoo.norms.GoodLayerNorm"))
    assert layer_kernels(lock)["LayerNorm"]["_target_"] == "kp_zoo.norms.GoodLayerNorm"


def test_hidden_size_signature_gets_the_adapter(fake_adapter):
    from kp_zoo.norms import HiddenSizeLayerNorm

    lock = load(lock_text("kp_zoo.norms.HiddenSizeLayerNorm", "{ eps = 1e-5 }"))
    assert convention_problems(HiddenSizeLayerNorm, "LayerNorm", {"eps": 1e-5}) == [
        "LayerNorm(normalized_shape=C) fails: missing a required argument: 'hidden_size'"
    ]
    [ln, _] = export(lock)
    assert ln.entry == {"_target_": fake_adapter, "eps": 1e-5}
    assert "hidden_size" in ln.note and "same state dict" in ln.note
    cls = adapters.HiddenSizeLayerNormAnemoi
    assert cls.__mro__[1] is HiddenSizeLayerNorm and cls.__module__ == "kernel_lock.adapters"
    assert list(inspect.signature(cls).parameters) == ["normalized_shape", "eps", "bias"]
    plain = HiddenSizeLayerNorm(48, eps=1e-5)
    for m in (
        cls(48, eps=1e-5),
        cls(normalized_shape=48, eps=1e-5),
        cls((48,), eps=1e-5),
        cls(hidden_size=48),
    ):
        assert type(m) is cls and m.hidden_size == 48
        assert list(m.state_dict()) == list(plain.state_dict()) == ["weight", "bias"]
    m = cls(normalized_shape=48)
    m.load_state_dict(plain.state_dict(), strict=True)  # checkpoints move both ways
    assert type(pickle.loads(pickle.dumps(m))) is cls
    with pytest.raises(ValueError, match="last dimension only"):
        cls((4, 48))
    with pytest.raises(TypeError, match="both normalized_shape and hidden_size"):
        cls(48, hidden_size=48)


def test_a_size_named_hidden_size_gets_the_generic_size_adapter():
    lock = load(lock_text("kp_zoo.norms.HiddenSizeLayerNorm", "{ eps = 1e-5 }"))
    target = layer_kernels(lock)["LayerNorm"]["_target_"]
    assert target == "kernel_lock.adapters.Sized__kp_zoo__norms__HiddenSizeLayerNorm"
    from kp_zoo.norms import HiddenSizeLayerNorm

    norm = getattr(adapters, target.rpartition(".")[2])(normalized_shape=48)
    assert isinstance(norm, HiddenSizeLayerNorm) and list(norm.state_dict()) == ["weight", "bias"]


def test_no_adapter_is_a_clear_error(capsys, tmp_path, monkeypatch):
    import kernel_lock.registry

    # a size parameter no adapter knows
    monkeypatch.setattr(kernel_lock.registry, "SIZE_NAMES", ())
    lock = load(lock_text("kp_zoo.norms.HiddenSizeLayerNorm", "{ eps = 1e-5 }"))
    with pytest.raises(ConventionError) as exc:
        layer_kernels(lock)
    assert (
        "LayerNorm(normalized_shape=C) fails" in str(exc.value) and "SIZE_ADAPTERS" in exc.value.fix
    )
    p = tmp_path / "lock.toml"
    lock.sealed().dump(p)
    code, out, err = run(["export", p], capsys)
    assert code == 5 and out == "" and "cannot be built the way anemoi calls LayerNorm" in err


LIGER_LN = """
[slots.LayerNorm]
implementation = "liger.layer_norm"
target = "liger_kernel.transformers.LigerLayerNorm"
semantics = "layer_norm"
kwargs = { eps = 1e-5 }
requires = [{ name = "liger-kernel", specifier = ">=0.5", module = "liger_kernel" }]
devices = ["cuda", "rocm", "xpu"]
twin = { target = "torch.nn.LayerNorm", kwargs = { eps = 1e-5, elementwise_affine = true, bias = true }, state-dict = "interchangeable", max-error = 0.004 }
"""  # noqa: E501 (TOML inline tables are one line)


def test_inference_mode_exports_the_verified_twin():
    lock = load(
        lock_text().split("[slots.LayerNorm]")[0]
        + LIGER_LN
        + "[slots.Linear]"
        + lock_text().split("[slots.Linear]")[1]
    )
    [ln, lin] = export(lock, "inference")
    assert ln.entry == {
        "_target_": "torch.nn.LayerNorm",
        "eps": 1e-5,
        "elementwise_affine": True,
        "bias": True,
    }
    assert "inference substitute for liger.layer_norm" in ln.note and "0.004" in ln.note
    assert lin.entry == {"_target_": "torch.nn.Linear", "bias": True}
    with pytest.raises((KernelUnavailable, LockMismatch)):  # training: liger cannot run on this CPU
        layer_kernels(lock, "training")


@pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel is not installed")
@pytest.mark.slow  # importing liger-kernel (and triton) takes seconds
def test_liger_lock_exports_the_liger_adapter_in_training_mode():
    lock = load(
        lock_text().split("[slots.LayerNorm]")[0]
        + LIGER_LN.replace('devices = ["cuda", "rocm", "xpu"]', "devices = []")
        + "[slots.Linear]"
        + lock_text().split("[slots.Linear]")[1]
    )
    assert layer_kernels(lock, verify_environment=False)["LayerNorm"] == {
        "_target_": "kernel_lock.adapters.LigerLayerNormAnemoi",
        "eps": 1e-5,
    }


def test_qk_norm(monkeypatch):
    # torch.nn.LayerNorm: anemoi's own AutocastLayerNorm (same kernel, output cast back), bias-free
    qk = layer_kernels(load(lock_text()), qk_norm=True)
    assert (
        qk["QueryNorm"]
        == qk["KeyNorm"]
        == {"_target_": AUTOCAST_LAYER_NORM, "eps": 1e-5, "elementwise_affine": True, "bias": False}
    )
    # another library: anemoi's q/k norm casts its output back (flash attention needs it), so the
    # lock's kernel goes in the adapter that keeps that cast, bias-free: the generic one, named
    # after the kernel, where no table row names one
    generic = layer_kernels(load(lock_text("kp_zoo.norms.GoodLayerNorm")), qk_norm=True)
    assert (
        generic["QueryNorm"]["_target_"]
        == "kernel_lock.adapters.Autocast__kp_zoo__norms__GoodLayerNorm"
    )
    monkeypatch.setitem(
        registry.AUTOCAST_ADAPTERS, "AutocastGoodLayerNorm", "kp_zoo.norms.GoodLayerNorm"
    )
    qk = layer_kernels(load(lock_text("kp_zoo.norms.GoodLayerNorm")), qk_norm=True)
    assert qk["QueryNorm"] == {
        "_target_": "kernel_lock.adapters.AutocastGoodLayerNorm",
        "eps": 1e-5,
        "elementwise_affine": True,
        "bias": False,
    }
    from kp_zoo.norms import GoodLayerNorm

    norm = adapters.AutocastGoodLayerNorm(16, bias=False)
    assert isinstance(norm, GoodLayerNorm) and list(norm.state_dict()) == ["weight"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(torch.randn(2, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert "QueryNorm" not in layer_kernels(load(lock_text("kp_zoo.norms.GoodLayerNorm")))
    # no bias switch pinned: it cannot be bias-free like anemoi's q/k norms
    with pytest.raises(ConventionError, match="bias-free"):
        layer_kernels(load(lock_text("kp_zoo.norms.GoodLayerNorm", "{ eps = 1e-5 }")), qk_norm=True)


# ---- the CLI -------------------------------------------------------------------------------------
def test_export_yaml_is_the_mapping(lock_file, capsys):
    code, out, err = run(["export", lock_file, "--format", "anemoi"], capsys)
    assert code == 0, err
    assert out.startswith("# anemoi-models layer_kernels") and "${model.layer_kernels}" in out
    assert yaml.safe_load(out) == {"layer_kernels": layer_kernels(load(MINIMAL_LOCK))}
    code, out, _ = run(["export", lock_file, "--json", "--qk-norm", "--mode", "inference"], capsys)
    data = json.loads(out)["layer_kernels"]
    assert code == 0 and list(data) == ["LayerNorm", "Linear", "QueryNorm", "KeyNorm"]


def test_export_on_another_machine(tmp_path, capsys):
    p = write_sealed(tmp_path / "gpu.toml", lock_text(device="cuda"))
    code, out, err = run(["export", p], capsys)
    assert code == 3 and "device-type" in err  # training mode: this is not the machine of the lock
    code, out, err = run(["export", p, "--mode", "inference"], capsys)
    assert code == 0 and "_target_: torch.nn.LayerNorm" in out


def test_export_usage_errors(lock_file, capsys):
    assert run(["export", lock_file, "--format", "hydra"], capsys)[0] == 2
    assert run(["export", lock_file.parent / "missing.toml"], capsys)[0] == 5


# ---- import cost and the lazy adapters -----------------------------------------------------------
@pytest.mark.slow
def test_anemoi_module_is_import_light():
    assert "kernel_lock.anemoi" not in _imported_modules("import kernel_lock")
    names = _imported_modules("import kernel_lock.anemoi")
    for heavy in ("torch", "yaml", "rich", "kernel_probe", "hydra"):
        assert not any(n == heavy or n.startswith(heavy + ".") for n in names), heavy


@pytest.mark.slow
def test_adapters_import_without_liger():
    code = (
        # any `import liger_kernel` now raises ImportError
        "import sys; sys.modules['liger_kernel'] = None\nimport kernel_lock.adapters as a\nassert "
        "a.CompiledLayerNorm and 'LigerLayerNormAnemoi' in dir(a)\ntry:\n    "
        "a.LigerLayerNormAnemoi\nexcept ImportError as e:\n    print('ImportError', e)\ntry:\n    "
        "a.NoSuchAdapter\nexcept AttributeError as e:\n    print('AttributeError', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    assert "ImportError" in out and "liger_kernel" in out and "AttributeError" in out


@pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel is not installed")
@pytest.mark.slow
def test_real_liger_adapters_construct_with_anemois_calls():
    # construction only: liger's forward needs a GPU
    from liger_kernel.transformers import LigerLayerNorm, LigerRMSNorm

    for name, base in (
        ("LigerLayerNormAnemoi", LigerLayerNorm),
        ("LigerRMSNormAnemoi", LigerRMSNorm),
    ):
        cls = getattr(adapters, name)
        assert issubclass(cls, base) and convention_problems(base, "LayerNorm", {}) != []
        assert convention_problems(cls, "LayerNorm", {"eps": 1e-5}) == []
        for m in (cls(64, eps=1e-5), cls(normalized_shape=64, eps=1e-5), cls((64,))):
            assert sorted(m.state_dict()) == sorted(base(64).state_dict())
            assert m.weight.shape == (64,)
    # a pickled model finds the adapter again in a fresh process (anemoi checkpoints are pickles)
    blob = pickle.dumps(adapters.LigerRMSNormAnemoi(normalized_shape=64, eps=1e-6, in_place=False))
    code = (
        "import pickle, sys; m = pickle.loads(sys.stdin.buffer.read()); "
        "print(type(m).__module__, type(m).__name__, type(m).__mro__[1].__name__, m.in_place)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=blob, capture_output=True, cwd=ROOT, check=True
    ).stdout.decode()
    assert out.split() == ["kernel_lock.adapters", "LigerRMSNormAnemoi", "LigerRMSNorm", "False"]


# ---- QueryNorm / KeyNorm: checking at head_dim ---------------------------------------------------
@pytest.mark.slow
def test_check_hidden_64_catches_a_narrow_row_bug(capsys):
    from kernel_probe import candidates as cands
    from kernel_probe.probe.check import check_all

    narrow = cands.from_command_line("LayerNorm=kp_zoo.norms.NarrowRowsLayerNorm")
    default = check_all(["LayerNorm"], [narrow], "cpu", [("float32", "true")], timeout=60)[
        "LayerNorm"
    ][0]
    assert default.status == "accepted"  # at the default width (1000) the bug does not show
    code, out, err = run(
        [
            "check",
            "--slot",
            "LayerNorm",
            "--dtype",
            "fp32",
            "--hidden",
            "64",
            "--json",
            "--candidate",
            "LayerNorm=kp_zoo.norms.NarrowRowsLayerNorm",
        ],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    reports = {r["id"]: r for r in data["slots"]["LayerNorm"]}
    assert data["hidden"] == 64 and reports["torch.layer_norm"]["status"] == "accepted"
    narrow64 = reports["custom:kp_zoo.norms.NarrowRowsLayerNorm"]
    assert narrow64["status"] == "rejected" and "y error" in narrow64["reasons"][0]
    assert run(["check", "--hidden", "0"], capsys)[0] == 2


# ---- the README's anemoi install (issue 16, point 7) ---------------------------------------------
def test_readme_says_what_the_anemoi_install_prints():
    # the README's anemoi section moved there (issue 37)
    readme = (ROOT / "docs" / "anemoi.md").read_text()
    assert "`pip check` will complain" not in readme and "resolver" in readme


# ---- the blocks set on each component, written by one function (issue 40) ------------------------
@pytest.mark.parametrize(
    "render, options, note, has",
    [
        (
            "render_attention",
            {"attention_implementation": "sdpa"},
            "why",
            ["# Attention (", "# why", "processor:"],
        ),
        ("render_attention", {}, "", ["# Attention ("]),  # nothing to set: the comments only
        (
            "render_gated_mlp",
            {"mlp_implementation": "fused"},
            "why",
            ["# GatedMLP (", "# why", "processor:"],
        ),
    ],
)
def test_component_blocks_are_commented_yaml_under_processor(render, options, note, has):
    import yaml

    from kernel_probe.commands import anemoi as export

    text = getattr(export, render)(options, note)
    assert text.startswith("\n#") and text.endswith("\n")
    assert [line for line in text.splitlines() if line and not line.startswith(("#", " "))] == has[
        -1:
    ] * bool(options)
    assert all(any(line.startswith(h) for line in text.splitlines()) for h in has)
    assert (yaml.safe_load(text) or {}) == ({"processor": options} if options else {})
