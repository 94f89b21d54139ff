"""The whole anemoi model, built as anemoi-training builds it, with a lock's classes inside — and
its inference checkpoint made portable, loaded where neither the training library nor kernel_lock
exists.

The training library is a fake (`tests/fakes/kp_fastlib`): a LayerNorm with liger's constructor
(`hidden_size`: anemoi needs an adapter) and transformer-engine's `_extra_state`, and a Linear. The
lock is written by `kernel-probe` on this machine, pinning both.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip(
    "anemoi.training.schemas.base_schema",
    reason="anemoi-training is not installed; `bash .ci/anemoi-install` installs it with --no-deps",
)
pytest.importorskip(
    "anemoi.models.interface", reason="anemoi-models is not installed (`bash .ci/anemoi-install`)"
)
pytest.importorskip(
    "torch_geometric", reason="torch-geometric is not installed (`bash .ci/anemoi-install`)"
)

import torch
from anemoi.models.layers.normalization import AutocastLayerNorm

import kernel_lock
import kernel_lock.adapters as adapters
from kernel_lock import registry
from kernel_lock.portability import Replacement, saved_modules
from kernel_probe.anemoi.pipelines import export_for_config
from kernel_probe.cli import main
from tests.anemoi_build import batch, build, compose_file, deep_merge, validated, write_overlay
from tests.conftest import ROOT, small_probe

# whole anemoi models: slow, and the fast lane does not import it (conftest.SLOW_MODULES)
pytestmark = [pytest.mark.anemoi, pytest.mark.slow]

# anemoi-models 0.19 builds these with torch.nn directly: no layer_kernels entry reaches them
HARD_CODED = (
    "*.node_data_extractor.*",
    "*.attention.lin_q",
    "*.attention.lin_k",
    "*.attention.lin_v",
)


@pytest.fixture(scope="module")
def fast_lock(tmp_path_factory) -> kernel_lock.KernelLock:
    path = tmp_path_factory.mktemp("fast") / "kernel-lock.toml"
    assert (
        main(
            [
                "--out",
                str(path),
                *small_probe("LayerNorm", "Linear", "Activation", shape="256x64"),
                # the Activation slot for a tanh-GELU model: the lock pins GELU(approximate="tanh")
                "--activation",
                "gelu-tanh",
                "--candidate",
                "LayerNorm=kp_fastlib.FastLayerNorm",
                "--pin",
                "LayerNorm=custom:kp_fastlib.FastLayerNorm",
                "--candidate",
                "Linear=kp_fastlib.FastLinear",
                "--pin",
                "Linear=custom:kp_fastlib.FastLinear",
            ]
        )
        == 0
    )
    lock = kernel_lock.load(path)
    assert lock.slots["LayerNorm"].twin.migration == ("drop:_extra_state",)  # measured by the probe
    assert (
        lock.slots["Activation"].implementation == "torch.gelu_tanh"
        and lock.slots["Activation"].extra["function"] == "gelu-tanh"
    )
    return lock


@pytest.fixture
def fast_adapters(monkeypatch):
    """kp_fastlib registered the way liger is: a size adapter, and the adapter keeping
    AutocastLayerNorm's cast."""
    monkeypatch.setitem(
        registry.SIZE_ADAPTERS,
        "FastLayerNormAnemoi",
        ("kp_fastlib.FastLayerNorm", "hidden_size"),
    )
    monkeypatch.setitem(
        registry.AUTOCAST_ADAPTERS,
        "AutocastFastLayerNormAnemoi",
        "kernel_lock.adapters.FastLayerNormAnemoi",
    )
    yield
    for name in ("FastLayerNormAnemoi", "AutocastFastLayerNormAnemoi"):
        adapters.__dict__.pop(name, None)


def build_with_lock(tmp_path: Path, preset: str, lock: kernel_lock.KernelLock):
    """A user's overlay, the lock's export merged into it as docs/anemoi.md says, composed,
    validated, built."""
    path = write_overlay(tmp_path / "mine.yaml", preset)
    overlay = export_for_config(lock, path).overlay()
    path.write_text(
        yaml.safe_dump(deep_merge(yaml.safe_load(path.read_text()), overlay), sort_keys=False)
    )
    config = validated(compose_file(path))
    return build(config)


def kernels(model) -> tuple[dict[str, type], dict[str, type]]:
    """(norm modules, linear modules) built through layer_kernels, by path."""
    from kp_fastlib import FastLayerNorm

    norms, linears = {}, {}
    for path, m in model.model.named_modules():
        if any(fnmatch.fnmatch(path, p) for p in HARD_CODED):
            continue
        if isinstance(m, (torch.nn.LayerNorm, FastLayerNorm)):
            norms[path] = type(m)
        elif isinstance(m, torch.nn.Linear):
            linears[path] = type(m)
    return norms, linears


@pytest.mark.parametrize("preset", ["gnn", "graphtransformer", "transformer"])
@pytest.mark.slow
def test_full_model_builds_with_the_exported_block(tmp_path, preset, fast_lock, fast_adapters):
    from kp_fastlib import FastLinear

    model, index = build_with_lock(tmp_path, preset, fast_lock)
    x = batch(model, index)
    y = model(x)["data"]
    assert y.shape[:4] == (2, model.n_step_output, 1, 40) and torch.isfinite(y).all()
    y.pow(2).mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    norms, linears = kernels(model)
    assert norms and linears
    expected_norm = (
        {adapters.AutocastFastLayerNormAnemoi}
        if preset == "gnn"
        else {adapters.FastLayerNormAnemoi}
    )
    # gnn: AutocastLayerNorm's cast kept around the lock's kernel
    assert set(norms.values()) == expected_norm, norms
    assert set(linears.values()) == {FastLinear}, linears
    # every layer_kernels.Activation built is the lock's: GELU in its tanh form (anemoi's default is
    # erf)
    gelus = [m for m in model.model.modules() if isinstance(m, torch.nn.GELU)]
    assert gelus and all(m.approximate == "tanh" for m in gelus), [m.approximate for m in gelus]


BLOCKED_LOAD = r"""
import importlib.abc, sys
BLOCKED = ("kernel_lock", "kp_fastlib")
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
import torch
checkpoint, inputs, out = sys.argv[1:4]
try:
    model = torch.load(checkpoint, weights_only=False)
except ModuleNotFoundError as exc:
    print("cannot load:", exc)
    sys.exit(3)
assert not any(name.split(".")[0] in BLOCKED for name in sys.modules)
model.eval()
with torch.no_grad():
    y = model(torch.load(inputs))["data"]
torch.save(y, out)
"""


@pytest.mark.parametrize("preset", ["gnn", "graphtransformer"])
@pytest.mark.slow
def test_portable_checkpoint_loads_without_the_training_library_or_kernel_lock(
    tmp_path, preset, fast_lock, fast_adapters
):
    model, index = build_with_lock(tmp_path, preset, fast_lock)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(3):  # trained a little with the fast library
        optimizer.zero_grad()
        model(batch(model, index, seed=step))["data"].pow(2).mean().backward()
        # as anemoi-training clips (gradient_clip)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    x = batch(model, index, seed=99)
    with torch.no_grad():
        expected = model(x)["data"]
    torch.save(x, tmp_path / "x.pt")
    # the inference checkpoint as anemoi-training writes it: the whole model, pickled
    torch.save(model, tmp_path / "inference.ckpt")
    names = saved_modules(tmp_path / "inference.ckpt")
    assert "kp_fastlib" in names and "kernel_lock.adapters" in names  # it needs both to load
    report: list[Replacement] = []
    portable = kernel_lock.portable(model, fast_lock, report=report)
    torch.save(portable, tmp_path / "inference.portable.ckpt")
    roots = {n.split(".")[0] for n in saved_modules(tmp_path / "inference.portable.ckpt")}
    assert "kp_fastlib" not in roots and "kernel_lock" not in roots, roots
    # every replaced module was compared with its original here, and agreed
    assert report and all(r.error is not None and r.error < 1e-5 for r in report), report
    assert {r.twin for r in report if r.slot == "LayerNorm"} == (
        {"anemoi.models.layers.normalization.AutocastLayerNorm"}
        if preset == "gnn"
        else {"torch.nn.modules.normalization.LayerNorm"}
    )
    factories = portable.model.processor.layer_factory  # anemoi's stored partials, now of the twins
    assert factories["Linear"].func is torch.nn.Linear
    assert factories["LayerNorm"].func in (torch.nn.LayerNorm, AutocastLayerNorm)
    assert torch.isfinite(expected).all()
    # the original is untouched
    assert any(type(m).__module__ == "kp_fastlib" for m in model.modules())

    def load(name: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
        # reachable, yet blocked: the import is refused
        env["PYTHONPATH"] = str(ROOT / "tests" / "fakes")
        return subprocess.run(
            [
                sys.executable,
                "-c",
                BLOCKED_LOAD,
                str(tmp_path / name),
                str(tmp_path / "x.pt"),
                str(tmp_path / "y.pt"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )

    plain = load("inference.ckpt")
    assert plain.returncode == 3 and re.search(r"kp_fastlib|kernel_lock", plain.stdout), (
        plain.stdout + plain.stderr
    )
    done = load("inference.portable.ckpt")
    assert done.returncode == 0, done.stdout + done.stderr
    got = torch.load(tmp_path / "y.pt")
    twin_error = max(s.twin.max_error or 0.0 for s in fast_lock.slots.values())
    error = float((got - expected).abs().max() / expected.abs().max())
    assert error <= max(10 * twin_error, 1e-5), (error, twin_error)


@pytest.mark.slow
def test_docs_recipe_converts_an_anemoi_inference_checkpoint(
    tmp_path, fast_lock, fast_adapters, monkeypatch
):
    """docs/anemoi.md's conversion snippet, as written, on a checkpoint saved the way
    anemoi-training saves it."""
    import shutil

    from anemoi.utils.checkpoints import load_metadata, save_metadata

    section = (
        (ROOT / "docs" / "anemoi.md")
        .read_text()
        .split("## Inference checkpoints that load without", 1)[1]
    )
    [snippet] = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.DOTALL)
    model, _ = build_with_lock(tmp_path, "graphtransformer", fast_lock)
    model.config = model.metadata = model.supporting_arrays = (
        None  # as anemoi-training's callback does
    )
    torch.save(model, tmp_path / "inference-last.ckpt")
    save_metadata(
        str(tmp_path / "inference-last.ckpt"),
        {"dataset": {"variables": ["2t"]}},
        supporting_arrays={"data/latitudes": __import__("numpy").zeros(3)},
    )
    shutil.copy(fast_lock.path, tmp_path / "kernel-lock.toml")
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "docs/anemoi.md", "exec"), {})
    roots = {n.split(".")[0] for n in saved_modules(tmp_path / "inference-last.portable.ckpt")}
    assert "kp_fastlib" not in roots and "kernel_lock" not in roots
    metadata, arrays = load_metadata(
        str(tmp_path / "inference-last.portable.ckpt"), supporting_arrays=True
    )
    assert metadata["dataset"]["variables"] == ["2t"] and "data/latitudes" in arrays
