"""A real anemoi-models GraphTransformer processor and a Transformer processor, built on CPU from
the config `export --config` writes for a lock (issue 39): anemoi-training's own presets (read from
the installed package), the lock's entries and graph_attention_backend merged in as the overlay
says, one forward and backward on a tiny graph, and every module a layer_kernels entry names being
the class the lock pinned (with its pinned keywords)."""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import kernel_lock
from kernel_lock.anemoi import ANEMOI_DEFAULTS, attention_export, locate
from kernel_probe.probe import graph_attention as ga
from tests.anemoi_build import deep_merge

pytest.importorskip(
    "hydra", reason="hydra-core is not installed; `bash .ci/anemoi-install` installs it"
)
pytest.importorskip(
    "anemoi.training", reason="anemoi-training is not installed; `bash .ci/anemoi-install`"
)
pytestmark = [pytest.mark.anemoi, pytest.mark.slow]

PRESETS = Path(str(importlib.resources.files("anemoi.training") / "config" / "model"))
# anemoi-models 0.19 builds MultiHeadSelfAttention's q/k/v projections as plain nn.Linear, whatever
# layer_kernels says (layers/attention.py: self.lin_q = nn.Linear(...)); only its output projection
# takes the Linear slot. Every other torch default class found in a processor is a call site that
# ignored the lock.
HARD_CODED = {"torch.nn.Linear": ("attention.lin_q", "attention.lin_k", "attention.lin_v")}
LOCK = """\
lock-version = "1.3"
created-by = "test"
trusted-modules = ["kp_zoo"]

[slots.LayerNorm]
implementation = "kp.layer_norm"
target = "kp_zoo.norms.GoodLayerNorm"
semantics = "layer_norm"
kwargs = { eps = 1e-5 }

[slots.Linear]
implementation = "kp.linear"
target = "kp_zoo.norms.GoodLinear"
semantics = "linear"
kwargs = { bias = true }

[slots.Attention]
implementation = "torch.sdpa"
target = "kernel_lock.attention.SDPAttention"
semantics = "attention"
kwargs = { window = 4, softcap = 0.0, dropout = 0.0, alibi = false }

[graph-attention]
backend = "pyg"
reason = "pyg: what anemoi runs here (there is no GPU)"
"""


@pytest.fixture(scope="module")
def lock(tmp_path_factory) -> kernel_lock.KernelLock:
    from tests.kernel_probe.anemoi.test_pipelines import write_sealed

    path = tmp_path_factory.mktemp("lock") / "kernel-lock.toml"
    write_sealed(path, LOCK)  # no [environment]: any machine
    return kernel_lock.load(path)


def exported_processor(
    lock: kernel_lock.KernelLock, preset: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the processor node anemoi instantiates, the lock's entries) for ``preset`` with the exported
    overlay merged in, small, interpolations resolved as anemoi-training resolves them."""
    from omegaconf import OmegaConf

    from kernel_probe.anemoi.pipelines import export_for_config

    path = PRESETS / f"{preset}.yaml"
    # a model file has no defaults list to compose
    result = export_for_config(lock, path, compose=False)
    merged = deep_merge(
        yaml.safe_load(path.read_text()), yaml.safe_load(yaml.safe_dump(result.overlay()))
    )
    small = {"num_channels": 32, "processor": {"num_layers": 2, "num_chunks": 1, "num_heads": 4}}
    merged = deep_merge(merged, small)
    # the Attention slot's keys (export prints them)
    if "attention_implementation" in merged["processor"]:
        options, _ = attention_export(lock) or ({}, "")
        merged["processor"].update(options)
    node = OmegaConf.to_container(OmegaConf.create({"model": merged}).model.processor, resolve=True)
    assert isinstance(node, dict)
    return node, result.entries


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def check_modules(proc: torch.nn.Module, entries: dict[str, Any], node: dict[str, Any]) -> None:
    """Every layer_kernels entry the exported config has: its class built (with its pinned
    keywords), and anemoi's default class for that key nowhere but at anemoi's hard-coded sites."""
    assert node["layer_kernels"], node
    by_class: dict[str, list[tuple[str, torch.nn.Module]]] = {}
    for name, module in proc.named_modules():
        by_class.setdefault(_class_name(type(module)), []).append((name, module))
    for key, entry in node["layer_kernels"].items():
        if key in ("QueryNorm", "KeyNorm") and not node.get("qk_norm"):
            continue  # built only with qk_norm
        pinned = _class_name(locate(entry["_target_"]))
        built = by_class.get(pinned, [])
        assert built, f"{key}: no {pinned} in the processor ({sorted(by_class)})"
        for name, module in built:
            for kw, value in entry.items():
                if kw != "_target_" and isinstance(getattr(module, kw, None), (int, float, str)):
                    assert getattr(module, kw) == value, (key, name, kw)
        default = ANEMOI_DEFAULTS[key]["_target_"]
        if default != entry["_target_"]:
            stray = [
                n
                for n, _ in by_class.get(_class_name(locate(default)), ())
                if not n.endswith(HARD_CODED.get(default, ()))
            ]
            assert stray == [], (
                f"{key}: {default} built at {stray}, not the lock's {entry['_target_']}"
            )
    for key in entries:  # the lock's own entries are what the component's layer_kernels holds
        assert node["layer_kernels"][key] == entries[key], key


def test_a_graph_transformer_processor_built_from_the_export_runs_the_locked_modules_and_backend(
    lock,
):
    from anemoi.models.distributed.shapes import GraphShardInfo
    from anemoi.models.layers.conv import GraphTransformerConv
    from hydra.utils import instantiate

    node, entries = exported_processor(lock, "graphtransformer")
    assert (
        node["_target_"].endswith("GraphTransformerProcessor")
        and node["graph_attention_backend"] == "pyg"
    )
    proc = instantiate(node, _recursive_=False, edge_dim=3)
    check_modules(proc, entries, node)
    blocks = [m for m in proc.modules() if hasattr(m, "graph_attention_backend")]
    assert blocks and all(
        b.graph_attention_backend == "pyg" and isinstance(b.conv, GraphTransformerConv)
        for b in blocks
    )
    # the O96-degree graph of the check
    edge_index = ga.check_graph(torch.Generator().manual_seed(0))
    x = torch.randn(ga.NODES, 32, requires_grad=True)
    edge_attr = torch.randn(edge_index.shape[1], 3, requires_grad=True)
    out = proc(x, 1, GraphShardInfo(), edge_attr, edge_index)
    out.square().mean().backward()
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert x.grad is not None and edge_attr.grad is not None and bool(x.grad.abs().sum() > 0)
    assert all(p.grad is not None for p in proc.parameters() if p.requires_grad)


def test_a_transformer_processor_built_from_the_export_runs_the_locked_modules_and_attention(lock):
    from anemoi.models.distributed.shapes import GraphShardInfo
    from anemoi.models.layers.attention import SDPAAttentionWrapper
    from hydra.utils import instantiate

    node, entries = exported_processor(lock, "transformer")
    assert node["_target_"].endswith(".TransformerProcessor")
    assert (
        node["attention_implementation"] == "scaled_dot_product_attention"
        and node["window_size"] == 4
    )
    proc = instantiate(node, _recursive_=False, edge_dim=3)
    check_modules(proc, entries, node)
    wrappers = [m for m in proc.modules() if isinstance(m, SDPAAttentionWrapper)]
    assert len(wrappers) == node["num_layers"]
    x = torch.randn(24, 32, requires_grad=True)
    out = proc(x, 1, GraphShardInfo())
    out.square().mean().backward()
    assert out.shape == x.shape and torch.isfinite(out).all() and x.grad is not None
    assert all(p.grad is not None for p in proc.parameters() if p.requires_grad)


def test_the_mappers_of_both_presets_get_the_locked_backend(lock):
    from kernel_probe.anemoi.pipelines import export_for_config

    for preset in ("graphtransformer", "transformer"):
        overlay = export_for_config(lock, PRESETS / f"{preset}.yaml", compose=False).overlay()
        for side in ("encoders", "decoders"):
            assert overlay[side]["0"]["mapper"]["graph_attention_backend"] == "pyg", (preset, side)
        assert ("graph_attention_backend" in overlay.get("processor", {})) == (
            preset == "graphtransformer"
        )
