"""kernel_probe/anemoi/config.py: reading an anemoi config safely, and telling its shape."""

from __future__ import annotations

import textwrap
import time

import pytest

from kernel_lock.errors import ExitCode
from kernel_probe.anemoi import config as config_file
from kernel_probe.anemoi.config import (
    Kind,
    classify,
    expanded_size,
    group_member,
    load_config,
)
from kernel_probe.errors import InputFileError


# ---- load_config ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,want",
    [
        (
            "model: {eps: 1e-5}\n",
            {"model": {"eps": 1e-5}},
        ),  # a float, as OmegaConf reads it (YAML 1.1: a string)
        ("eps: -2E+3\n", {"eps": -2000.0}),
        ("eps: 1.5e-6\n", {"eps": 1.5e-6}),
        ("v: 1_000e2\n", {"v": 100000.0}),
        ("name: e5\n", {"name": "e5"}),  # not a number
        ("n: 12\n", {"n": 12}),
    ],
)
def test_load_config_reads_numbers_as_omegaconf_does(tmp_path, text, want):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    got = load_config(p)
    assert got == want and type(next(iter(got.values()))) is type(next(iter(want.values())))


@pytest.mark.parametrize(
    "content,words",
    [
        ("model: [1, 2\n", "not valid YAML at line"),
        ("- just\n- a list\n", "expected a YAML mapping (an anemoi config), got list"),
        ("just a string\n", "got str"),
        ("", "got NoneType"),
        (b"model: \xff\xfe\n", "not UTF-8 text"),
        ("!!python/object:os.system {}\n", "not valid YAML"),  # a SafeLoader: no Python objects
        ("[" * 250 + "]" * 250 + "\n", "nested too deeply"),
        (None, "cannot read the config: no such file"),
    ],
    ids=["malformed", "list", "scalar", "empty", "not-utf8", "python-tag", "deep", "missing"],
)
def test_unreadable_configs_are_input_file_errors(tmp_path, content, words):
    p = tmp_path / "c.yaml"
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif content is not None:
        p.write_text(content)
    with pytest.raises(InputFileError) as exc:
        load_config(p)
    assert words in exc.value.problem and exc.value.exit_code == ExitCode.BAD_INPUT == 5
    assert exc.value.path == str(p)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(InputFileError) as exc:
        load_config(tmp_path)
    assert exc.value.exit_code == 5 and exc.value.path == str(tmp_path)


def test_an_oversized_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(config_file, "MAX_BYTES", 64)
    p = tmp_path / "big.yaml"
    p.write_text("model: {}\n" + "# padding\n" * 20)
    with pytest.raises(InputFileError):
        load_config(p)


BOMB = textwrap.dedent("""\
    a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
    model: {layer_kernels: {LayerNorm: {_target_: torch.nn.LayerNorm, junk: *g}}}
""")


def test_a_yaml_alias_bomb_is_refused_fast(tmp_path):
    p = tmp_path / "bomb.yaml"
    p.write_text(BOMB)
    assert len(BOMB) < 700
    start = time.perf_counter()
    with pytest.raises(InputFileError) as exc:
        load_config(p)
    assert (
        "alias bomb" in exc.value.problem
        and exc.value.exit_code == 5
        and time.perf_counter() - start < 5
    )


# ---- expanded_size -------------------------------------------------------------------------------
SHARED = ["x"] * 10


@pytest.mark.parametrize(
    "data,size",
    [
        ("x", 1),
        ({}, 1),
        ({"a": 1, "b": [1, 2]}, 1 + 1 + 3),
        ({"a": SHARED, "b": SHARED}, 1 + 11 + 11),  # an alias counts every time it is used
        ([[SHARED] * 10] * 10, 1 + 10 * (1 + 10 * 11)),
    ],
)
def test_expanded_size_counts_shared_parts_each_time(data, size):
    assert expanded_size(data) == size


def test_expanded_size_stops_past_the_limit_and_refuses_deep_nesting():
    level = ["x"] * 10
    for _ in range(8):
        level = [level] * 10  # 10**9 values once expanded
    assert expanded_size(level, limit=1000) == 1001
    deep: list = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(RecursionError):
        expanded_size(deep)


# ---- classify and group_member -------------------------------------------------------------------
MODEL_CLASS = {"_target_": "anemoi.models.models.AnemoiModelEncProcDec"}


@pytest.mark.parametrize(
    "root,where,shape,why,alternative",
    [
        ({"defaults": [{"model": "gnn"}, "_self_"]}, None, "overlay", "a defaults list", None),
        (
            {"model": {"layer_kernels": {}}, "training": {}},
            None,
            "full",
            "training sections (training)",
            None,
        ),
        (
            {"model": {"model": MODEL_CLASS}},
            None,
            "full",
            "the model class at model.model._target_",
            None,
        ),
        ({"model": {"num_channels": 8}}, None, "full", "a `model:` node", None),
        (
            {"num_channels": 8, "layer_kernels": {}},
            None,
            "model-file",
            "model-node keys at its root",
            None,
        ),
        ({"num_channels": 8}, "model", "model-file", "it sits in a model/ directory", None),
        ({"dropout": 0.1}, None, "model-file", "no `model:` node", None),
        # the model class under its own `model:` key, nothing else: a model file, or a full config
        ({"model": MODEL_CLASS}, None, "model-file", "its `model:` key is a class", "full"),
        (
            {"model": MODEL_CLASS, "processor": {}},
            None,
            "model-file",
            "model-node keys at its root (processor)",
            None,
        ),
        ({"model": MODEL_CLASS}, "model", "model-file", "it sits in a model/ directory", None),
        # signals of both shapes: a model file, checked as a full config too
        (
            {"layer_kernels": {}, "training": {}},
            None,
            "model-file",
            "but also training sections",
            "full",
        ),
    ],
)
def test_classify(tmp_path, root, where, shape, why, alternative):
    path = None
    if where is not None:
        (tmp_path / where).mkdir()
        path = tmp_path / where / "mine.yaml"
    kind = classify(root, path)
    assert (kind.shape, kind.alternative) == (shape, alternative) and why in kind.why, kind
    assert classify(root, path).shape == shape and kind.shape in config_file.SHAPES


def test_a_defaults_list_of_sibling_presets_is_a_model_file(tmp_path):
    (tmp_path / "transformer.yaml").write_text("num_channels: 8\n")
    root = {"defaults": ["transformer", "_self_"], "num_channels": 16}
    mine = tmp_path / "mine.yaml"
    assert classify(root, mine) == Kind(
        "model-file", "a defaults list naming presets of its own model/ directory"
    )
    assert classify({"defaults": ["gnn"]}, mine).shape == "overlay"  # no gnn.yaml beside it
    assert classify(root).shape == "overlay"  # no path: nothing to look beside


@pytest.mark.parametrize(
    "root,dirname,siblings,member",
    [
        ({}, "model", (), True),  # config/model/<name>.yaml
        ({}, "configs", (), False),
        ({"defaults": ["base"]}, "configs", ("base",), True),
        ({"defaults": ["base", "_self_"]}, "configs", ("base",), True),
        (
            {"defaults": ["base", "other"]},
            "configs",
            ("base",),
            False,
        ),  # every one must be a sibling
        (
            {"defaults": [{"model": "gnn"}]},
            "configs",
            ("gnn",),
            False,
        ),  # a group choice, not a sibling
        ({"defaults": ["_self_"]}, "configs", (), False),
    ],
)
def test_group_member(tmp_path, root, dirname, siblings, member):
    d = tmp_path / dirname
    d.mkdir()
    for name in siblings:
        (d / f"{name}.yaml").write_text("{}\n")
    assert group_member(root, d / "mine.yaml") is member
    assert group_member(root, None) is False
