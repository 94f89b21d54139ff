"""kernel_probe/anemoi/config.py: the layer_kernels blocks of one config as read (no
composition)."""

from __future__ import annotations

import pytest
import yaml

from kernel_probe.anemoi.config import (
    Block,
    Config,
    Finding,
    _Resolver,
    add_block,
    block_values,
    find_blocks,
    inherited,
    load_config,
    value_at,
)
from kernel_probe.errors import InputFileError
from tests.kernel_probe.commands.test_check_config import TRAINING  # the training layout


def test_blocks_of_a_training_config():
    config = find_blocks(yaml.safe_load(TRAINING))
    assert config.shape == "full"
    assert [(b.where, b.inherits) for b in config.blocks] == [
        ("model.layer_kernels", None),
        ("model.processor.layer_kernels", "model.layer_kernels"),
        ("model.encoders.0.mapper.layer_kernels", "model.layer_kernels"),
        ("model.decoders.0.mapper.layer_kernels", "model.layer_kernels"),
    ]
    assert config.blocks[1].source == "${model.layer_kernels}" and config.blocks[1].content is None
    assert config.findings == []


def test_blocks_of_a_model_config_file_and_older_layouts(tmp_path):
    # config/model/<name>.yaml: the file *is* the model node, yet references say ${model....}
    p = tmp_path / "config.yaml"
    p.write_text(
        """\
num_channels: 64
layer_kernels:
  LayerNorm: {_target_: torch.nn.LayerNorm, eps: 1e-5}
encoder: {layer_kernels: "${model.layer_kernels}"}
decoder: {layer_kernels: null}
processor:
  layer_kernels:
    LayerNorm: "${model.layer_kernels.LayerNorm}"
    Linear: {_target_: torch.nn.Linear, in_features: "${model.num_channels}"}
noise_injector: {layer_kernels: {Activation: {_target_: torch.nn.SiLU}}}
"""
    )
    config = find_blocks(load_config(p))
    assert config.shape == "model-file"
    blocks = {b.where: b for b in config.blocks}
    assert blocks["model.encoder.layer_kernels"].inherits == "model.layer_kernels"
    assert blocks["model.decoder.layer_kernels"].content == {}
    proc = blocks["model.processor.layer_kernels"].content
    # interpolations inside a block are followed; `1e-5` is a float, as OmegaConf reads it
    assert proc["LayerNorm"] == {"_target_": "torch.nn.LayerNorm", "eps": 1e-5}
    assert proc["Linear"]["in_features"] == 64
    assert blocks["model.noise_injector.layer_kernels"].content == {
        "Activation": {"_target_": "torch.nn.SiLU"}
    }
    assert [f.problem for f in config.findings] == ["empty: anemoi uses its defaults for every key"]


@pytest.mark.parametrize(
    "root,shape",
    [
        ({"model": {"num_channels": 64}}, "full"),
        ({"model": None}, "full"),
        ({"dropout": 0.1}, "model-file"),
    ],
)
def test_no_block_means_anemoi_defaults(root, shape):
    config = find_blocks(root, shape)
    assert [(b.where, b.content) for b in config.blocks] == [("(anemoi defaults)", {})]
    [f] = config.findings
    assert (f.severity, f.kind, f.where) == ("warning", "entry", "model")
    assert f.problem.startswith("no layer_kernels block found anywhere under the model node")
    assert config.tree is root and config.shape == shape


# ---- following ${...} references -----------------------------------------------------------------
LN = {"_target_": "torch.nn.LayerNorm"}


@pytest.mark.parametrize(
    "root,shape,severity,words",
    [
        # a complete config: a reference to nothing is an error
        (
            {"model": {"layer_kernels": "${model.kernels}"}},
            "full",
            "error",
            "points at nothing in this config",
        ),
        # an overlay is not the whole config: left unjudged
        (
            {"model": {"layer_kernels": "${model.kernels}"}},
            "overlay",
            "note",
            "points outside this file",
        ),
        # a model file's reference to another group cannot be judged here
        (
            {"layer_kernels": {"LayerNorm": "${system.ln}"}},
            "model-file",
            "note",
            "points outside this file",
        ),
        # only whole-value references are followed
        (
            {"model": {"layer_kernels": {"LayerNorm": {**LN, "eps": "${oc.env:EPS}x"}}}},
            "full",
            "warning",
            "only whole-value ${a.b.c} references are followed",
        ),
        (
            {"model": {"a": "${model.b}", "b": "${model.a}", "layer_kernels": "${model.a}"}},
            "full",
            "error",
            "loop",
        ),
    ],
    ids=["nothing-full", "outside-overlay", "outside-model-file", "partial", "loop"],
)
def test_interpolation_findings(root, shape, severity, words):
    config = find_blocks(root, shape)
    hits = [f for f in config.findings if f.kind == "interpolation"]
    assert hits and hits[0].severity == severity and words in hits[0].problem, config.findings


def test_a_list_index_reference_is_followed():
    root = {
        "model": {
            "norms": [LN, {"_target_": "torch.nn.RMSNorm"}],
            "layer_kernels": {"LayerNorm": "${model.norms.1}"},
        }
    }
    [block] = find_blocks(root, "full").blocks
    assert block.content == {"LayerNorm": {"_target_": "torch.nn.RMSNorm"}}


def test_an_interpolation_fan_out_is_bounded(monkeypatch):
    # 100,000 in use: the same bound, reached sooner
    monkeypatch.setattr(_Resolver, "BUDGET", 1_000)
    model: dict = {"a0": ["x"] * 10}
    for i in range(1, 4):
        model[f"a{i}"] = [f"${{model.a{i - 1}}}"] * 10  # 10**4 values once followed
    model["layer_kernels"] = {"LayerNorm": {**LN, "junk": "${model.a3}"}}
    with pytest.raises(InputFileError) as exc:
        find_blocks({"model": model}, "full")
    assert (
        "references produces more than 1,000 values" in exc.value.problem
        and exc.value.exit_code == 5
    )
    model["a3"] = model["a3"][:1]  # 10**3 values, within the bound
    monkeypatch.setattr(_Resolver, "BUDGET", 2_000)
    [block] = find_blocks({"model": model}, "full").blocks
    # every reference followed
    assert block.content["LayerNorm"]["junk"] == [[[["x"] * 10] * 10] * 10]


@pytest.mark.parametrize(
    "dotted,model_is_root,found",
    [
        ("model.x.y", False, 1),
        ("model.items.0", False, "a"),
        ("model.x.y", True, KeyError),  # a model file: ${model.x} is the file's own x
        ("model.items.1", True, "b"),
        ("system.x", True, LookupError),  # another config group: outside the file
        ("model.items.9", False, KeyError),
    ],
)
def test_resolver_lookup(dotted, model_is_root, found):
    root = (
        {"model": {"x": {"y": 1}, "items": ["a", "b"]}}
        if not model_is_root
        else {"items": ["a", "b"]}
    )
    r = _Resolver(root, model_is_root=model_is_root, complete=True)
    if isinstance(found, type):
        with pytest.raises(found) as exc:
            r.lookup(dotted)
        assert exc.type is found
    else:
        assert r.lookup(dotted) == found


# ---- helpers -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "node,path,value",
    [
        ({"a": {"b": 1}}, ["a", "b"], 1),
        ({"a": [10, 20]}, ["a", "1"], 20),
        ({0: "int key"}, ["0"], "int key"),  # YAML `0:` is an int key
        ({"a": [10]}, ["a", "3"], None),
        ({"a": 1}, ["a", "b"], None),
        ({"a": 1}, [], {"a": 1}),
    ],
)
def test_value_at(node, path, value):
    assert value_at(node, path) == value


@pytest.mark.parametrize(
    "value,where,parent",
    [
        ("${model.layer_kernels}", "model.processor.layer_kernels", "model.layer_kernels"),
        ("${ model.layer_kernels }", "model.processor.layer_kernels", "model.layer_kernels"),
        ("${model.layer_kernels}", "model.layer_kernels", None),  # itself
        ("${model.other}", "model.processor.layer_kernels", None),  # not a block
        ("${model.layer_kernels.LayerNorm}", "model.processor.layer_kernels", None),
        ({"LayerNorm": LN}, "model.processor.layer_kernels", None),
    ],
)
def test_inherited(value, where, parent):
    assert (
        inherited(value, {"model.layer_kernels", "model.processor.layer_kernels"}, where) == parent
    )


def test_block_values_finds_every_block_by_its_full_path():
    model = {
        "layer_kernels": {},
        "encoders": {"0": {"mapper": {"layer_kernels": "x"}}},
        "list": [{"layer_kernels": 1}],
    }
    assert block_values(model) == [
        ("model.layer_kernels", {}),
        ("model.encoders.0.mapper.layer_kernels", "x"),
        ("model.list.0.layer_kernels", 1),
    ]


@pytest.mark.parametrize(
    "content,blocks,findings",
    [
        ({"LayerNorm": LN}, [{"LayerNorm": LN}], []),
        (None, [{}], [("note", "entry", "w", "empty: anemoi uses its defaults for every key")]),
        (
            [LN],
            [],
            [
                (
                    "error",
                    "entry",
                    "w",
                    "expected a mapping of Linear, LayerNorm, Activation, QueryNorm, KeyNorm, "
                    "got list",
                )
            ],
        ),
        ("torch.nn.LayerNorm", [], [("error", "entry", "w", "expected a mapping")]),
        # keys that are not names: anemoi ignores them silently, so they are errors; the rest is
        # kept
        (
            {1: LN, None: LN, "Linear": LN},
            [{"Linear": LN}],
            [
                ("error", "key", "w.1", "key 1 is a int, not a name: anemoi silently ignores it"),
                ("error", "key", "w.None", "key None is a NoneType, not a name"),
            ],
        ),
    ],
    ids=["mapping", "empty", "list", "string", "odd-keys"],
)
def test_add_block(content, blocks, findings):
    config = Config()
    add_block(config, "w", content, source="${x}", written={"a": 1})
    assert [b.content for b in config.blocks] == blocks
    assert all(b.source == "${x}" and b.written == {"a": 1} for b in config.blocks)
    assert len(config.findings) == len(findings)
    for f, (severity, kind, where, words) in zip(config.findings, findings, strict=True):
        assert (f.severity, f.kind, f.where) == (severity, kind, where) and f.problem.startswith(
            words
        ), f


def test_add_block_keeps_only_a_mapping_as_written():
    config = Config()
    add_block(config, "w", {}, written="${model.layer_kernels}")
    assert config.blocks == [Block("w", content={}, written=None)]


def test_finding_to_json_and_model_choice():
    f = Finding("error", "key", "model.layer_kernels.X", "unknown key", "use LayerNorm")
    assert f.to_json() == {
        "severity": "error",
        "kind": "key",
        "where": "model.layer_kernels.X",
        "problem": "unknown key",
        "fix": "use LayerNorm",
    }
    assert Config(choices={"model": "gnn"}).model_choice() == "model: gnn"
    assert Config().model_choice() == "no model preset selected"
