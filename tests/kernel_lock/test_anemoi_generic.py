"""Any LayerNorm a lock pins runs inside anemoi's AutocastLayerNorm cast-back, without editing
kernel_lock (issue 25, point 3), and anemoi's default GNN preset trains with it and ships a
checkpoint that loads where neither the kernel's library nor kernel_lock can be imported, through
anemoi-training's own checkpoint code and anemoi-inference's own loader where they are installed
(point 5).

The kernel library is the fake ``tests/fakes/kp_fastlib`` (trusted through $KERNEL_LOCK_TRUST, as a
site trusts its own library): ``FastLayerNorm`` takes its size as ``hidden_size`` (liger's
constructor) and keeps transformer-engine's ``_extra_state``. No adapter table names it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import kernel_lock
import kernel_lock.adapters as adapters
from kernel_lock.anemoi import ConventionError, generic_adapter, wrapper_of
from kernel_lock.errors import TargetNotAllowed
from kernel_lock.registry import AUTOCAST_ADAPTERS, SIZE_ADAPTERS, generic_kernel
from kernel_lock.trust import check_target
from tests.conftest import ROOT, small_probe

GENERIC = "kernel_lock.adapters.Autocast__kp_fastlib__FastLayerNorm"


# ---- the adapter itself (no anemoi needed) -------------------------------------------------------
def test_the_generic_adapter_is_the_kernel_with_the_cast_back_and_the_same_state_dict():
    from kp_fastlib import FastLayerNorm

    assert "FastLayerNorm" not in str(SIZE_ADAPTERS) + str(AUTOCAST_ADAPTERS)  # no table names it
    cls = adapters.Autocast__kp_fastlib__FastLayerNorm
    assert issubclass(cls, FastLayerNorm) and f"{cls.__module__}.{cls.__qualname__}" == GENERIC
    torch.manual_seed(0)
    plain, wrapped = (
        FastLayerNorm(16, eps=1e-5),
        cls(16, eps=1e-5),
    )  # positional: anemoi's LayerNorm(C)
    assert cls(normalized_shape=16).hidden_size == 16  # anemoi's LayerNorm(normalized_shape=C)
    with torch.no_grad():
        plain.weight.uniform_(0.5, 1.5)
        plain.bias.uniform_(-0.5, 0.5)
    loaded = wrapped.load_state_dict(plain.state_dict(), strict=False)
    assert loaded.missing_keys == loaded.unexpected_keys == []  # the same keys both ways
    assert (
        list(wrapped.state_dict()) == list(plain.state_dict()) == ["weight", "bias", "_extra_state"]
    )
    x = torch.randn(4, 16)
    assert torch.equal(wrapped(x), plain(x))  # fp32 in: the same forward
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert wrapped(x.bfloat16()).dtype == torch.bfloat16  # the cast back to the input dtype
    buffer = io.BytesIO()
    torch.save(wrapped, buffer)
    buffer.seek(0)
    # pickles by name: found again on lookup
    assert type(torch.load(buffer, weights_only=False)) is cls


def test_the_generic_name_is_data_and_refuses_what_it_cannot_carry():
    assert generic_adapter("Autocast", "kp_fastlib.FastLayerNorm") == GENERIC
    assert generic_kernel(GENERIC) == "kp_fastlib.FastLayerNorm"
    assert wrapper_of(GENERIC).target == "anemoi.models.layers.normalization.AutocastLayerNorm"
    assert generic_kernel("kernel_lock.adapters.LigerLayerNormAnemoi") is None
    for bad in ("kp_fastlib._private.Norm", "kp__lib.Norm", "Norm"):
        with pytest.raises(ConventionError):
            generic_adapter("Autocast", bad)


def test_a_lock_naming_a_generic_adapter_needs_trust_for_its_kernel(monkeypatch):
    monkeypatch.delenv("KERNEL_LOCK_TRUST", raising=False)
    with pytest.raises(TargetNotAllowed, match="kp_evil.Evil"):
        check_target("kernel_lock.adapters.Autocast__kp_evil__Evil")
    check_target("kernel_lock.adapters.Autocast__kp_evil__Evil", ("kp_evil",))  # granted: allowed
    check_target("kernel_lock.adapters.Autocast__liger_kernel__transformers__LigerLayerNorm")


# ---- the gnn preset with it, end to end ----------------------------------------------------------
anemoi = pytest.mark.anemoi


def _needs_anemoi():
    pytest.importorskip(
        "anemoi.training.schemas.base_schema",
        reason="anemoi-training is not installed; `bash .ci/anemoi-install` installs it with "
        "--no-deps",
    )
    pytest.importorskip(
        "anemoi.models.interface",
        reason="anemoi-models is not installed (`bash .ci/anemoi-install`)",
    )
    pytest.importorskip(
        "torch_geometric", reason="torch-geometric is not installed (`bash .ci/anemoi-install`)"
    )


@pytest.fixture(scope="module")
def fastlib_lock(tmp_path_factory) -> kernel_lock.KernelLock:
    """kernel-probe's own lock on this machine, pinning the fake library's LayerNorm (and torch's
    Linear)."""
    from kernel_probe.cli import main

    path = tmp_path_factory.mktemp("fastlib") / "kernel-lock.toml"
    argv = ["--out", str(path), *small_probe("LayerNorm", shape="256x64")]
    argv += [
        "--candidate",
        "LayerNorm=kp_fastlib.FastLayerNorm",
        "--pin",
        "LayerNorm=custom:kp_fastlib.FastLayerNorm",
    ]
    assert main(argv) == 0
    return kernel_lock.load(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, fastlib_lock):
    """The gnn preset exported with the fake library: composed, validated by the schema, built,
    trained 3 steps."""
    _needs_anemoi()
    from kernel_probe.anemoi.pipelines import check_config, export_for_config
    from tests.anemoi_build import batch, build, compose_file, deep_merge, validated, write_overlay

    tmp = tmp_path_factory.mktemp("gnn")
    path = write_overlay(tmp / "mine.yaml", "gnn")
    exported = export_for_config(fastlib_lock, path).overlay()
    path.write_text(
        yaml.safe_dump(deep_merge(yaml.safe_load(path.read_text()), exported), sort_keys=False)
    )
    checked = check_config(path, lock=fastlib_lock)
    config = validated(compose_file(path))  # anemoi-training's own BaseSchema, as `train` runs it
    model, index = build(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    for step in range(3):
        optimizer.zero_grad()
        loss = model(batch(model, index, seed=step))["data"].pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return {
        "path": path,
        "exported": exported,
        "checked": checked,
        "config": config,
        "model": model,
        "index": index,
        "losses": losses,
        "tmp": tmp,
    }


@anemoi
@pytest.mark.slow
def test_the_gnn_preset_with_a_non_torch_layer_norm_composes_validates_builds_and_trains(trained):
    from kp_fastlib import FastLayerNorm

    entries = trained["exported"]["model"]["kernel_lock"]
    # the generic adapter, chosen by the export
    assert {e["_target_"] for e in entries.values()} >= {GENERIC}
    checked = trained["checked"]
    assert checked.exit_code == 0, checked.findings
    assert checked.schema.startswith("checked with anemoi-training 0.17.1's BaseSchema")
    norms = {
        type(m)
        for name, m in trained["model"].model.named_modules()
        if isinstance(m, FastLayerNorm)
    }
    assert norms == {adapters.Autocast__kp_fastlib__FastLayerNorm}
    assert all(torch.isfinite(torch.tensor(trained["losses"])))


BLOCKED = r"""
import importlib.abc, sys
BLOCKED = ("kernel_lock", "kp_fastlib", "anemoi.training")
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
"""

# anemoi-inference 0.13.0's own loading code: Runner.model (torch.load(path, map_location=device,
# weights_only=False).to(device)) on a host carrying what that property reads, and Checkpoint's
# metadata
INFERENCE_LOAD = (
    BLOCKED
    + r"""
import types, torch
from anemoi.inference.checkpoint import Checkpoint
from anemoi.inference.runner import Runner
checkpoint, inputs, out = sys.argv[1:4]
host = types.SimpleNamespace(checkpoint=Checkpoint(checkpoint), device="cpu",
                             preload_checkpoint=False, preload_buffer_size=1 << 20)
model = Runner.model.func(host)
metadata, arrays = host.checkpoint._raw_metadata
assert not any(n.split(".")[0] in ("kernel_lock", "kp_fastlib") or n.startswith("anemoi.training")
               for n in sys.modules)
with torch.no_grad():
    y = model(torch.load(inputs))["data"]
import json
torch.save({"y": y, "config": json.dumps(metadata["config"])}, out)
"""
)


def _run(code: str, *args: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # reachable, yet blocked: the import is refused
    env["PYTHONPATH"] = str(ROOT / "tests" / "fakes")
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@anemoi
@pytest.mark.slow
def test_its_portable_checkpoint_saved_by_anemoi_training_loads_through_anemoi_inference(
    trained, fastlib_lock
):
    """anemoi-training's save_inference_checkpoint writes it (with metadata, the training config
    included); anemoi-inference's Runner.model loads it where kernel_lock, the library and
    anemoi-training cannot be imported; the outputs are the model's."""
    pytest.importorskip(
        "pytorch_lightning",
        reason="anemoi-training's checkpoint code imports pytorch-lightning; `bash "
        ".ci/anemoi-install` installs it",
    )
    save = pytest.importorskip(
        "anemoi.training.utils.checkpoint",
        reason="anemoi-training's checkpoint code needs anemoi-transform; `bash "
        ".ci/anemoi-install` installs it",
    ).save_inference_checkpoint
    pytest.importorskip(
        "anemoi.inference.runner",
        reason="anemoi-inference is not installed; `bash .ci/anemoi-install` installs it",
    )
    from omegaconf import OmegaConf

    from tests.anemoi_build import batch

    tmp: Path = trained["tmp"]
    model, index = trained["model"], trained["index"]
    x = batch(model, index, seed=99)
    with torch.no_grad():
        expected = model(x)["data"]
    torch.save(x, tmp / "x.pt")
    portable = kernel_lock.portable(model, fastlib_lock)
    portable.config = portable.metadata = portable.supporting_arrays = (
        None  # as anemoi-training's callback does
    )
    from anemoi.training.utils.jsonify import (
        map_config_to_primitives,
    )  # as AnemoiTrainer builds its metadata

    config = map_config_to_primitives(OmegaConf.to_container(trained["config"], resolve=True))
    metadata = {"config": config, "dataset": {"variables": ["2t"]}}
    written = save(portable, metadata, tmp / "last.ckpt")
    assert written == tmp / "inference-last.ckpt"
    done = _run(INFERENCE_LOAD, written, tmp / "x.pt", tmp / "y.pt")
    assert done.returncode == 0, done.stdout + done.stderr
    got = torch.load(tmp / "y.pt")
    twin_error = max(s.twin.max_error or 0.0 for s in fastlib_lock.slots.values())
    error = float((got["y"] - expected).abs().max() / expected.abs().max())
    assert error <= max(10 * twin_error, 1e-5), (error, twin_error)
    # the embedded training config still names the training class, as a string: loading does not
    # care
    assert GENERIC in got["config"]


@anemoi
@pytest.mark.slow
def test_its_portable_checkpoint_loads_with_anemoi_inferences_exact_calls(trained, fastlib_lock):
    """Where anemoi-inference is not installed: its loader's exact calls (torch.load(path,
    map_location=device, weights_only=False).to(device); anemoi.utils' load_metadata(path,
    supporting_arrays=True)), in the same blocked process."""
    from anemoi.utils.checkpoints import save_metadata

    from tests.anemoi_build import batch

    tmp: Path = trained["tmp"]
    model, index = trained["model"], trained["index"]
    x = batch(model, index, seed=7)
    with torch.no_grad():
        expected = model(x)["data"]
    torch.save(x, tmp / "x7.pt")
    portable = kernel_lock.portable(model, fastlib_lock)
    portable.config = portable.metadata = portable.supporting_arrays = None
    # what the callback's torch.save(model, ...) writes
    torch.save(portable, tmp / "plain-inference.ckpt")
    save_metadata(str(tmp / "plain-inference.ckpt"), {"dataset": {"variables": ["2t"]}})
    code = (
        BLOCKED
        + r"""
import torch
from anemoi.utils.checkpoints import load_metadata
checkpoint, inputs, out = sys.argv[1:4]
model = torch.load(checkpoint, map_location="cpu", weights_only=False).to("cpu")
metadata, arrays = load_metadata(checkpoint, supporting_arrays=True)
with torch.no_grad():
    torch.save(model(torch.load(inputs))["data"], out)
"""
    )
    done = _run(code, tmp / "plain-inference.ckpt", tmp / "x7.pt", tmp / "y7.pt")
    assert done.returncode == 0, done.stdout + done.stderr
    got = torch.load(tmp / "y7.pt")
    assert float((got - expected).abs().max() / expected.abs().max()) <= 1e-5
    # and the checkpoint as saved before portable() does not load there
    torch.save(model, tmp / "raw.ckpt")
    raw = _run(code, tmp / "raw.ckpt", tmp / "x7.pt", tmp / "y-raw.pt")
    assert raw.returncode != 0 and "blocked" in raw.stderr
