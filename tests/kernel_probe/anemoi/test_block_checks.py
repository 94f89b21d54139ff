"""kernel_probe/anemoi/checks.py: a whole block against what Hydra's merge left, the lock, and
the preset's anemoi wrappers. Pure functions over blocks as read: nothing here imports a target."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kernel_lock.anemoi import AUTOCAST_LAYER_NORM, CONDITIONAL_LAYER_NORM, Exported
from kernel_probe.anemoi.checks import (
    _effective,
    _same,
    compare_with_lock,
    lost_wrappers,
    merge_leftovers,
    preset_file,
)
from kernel_probe.anemoi.config import Block, Config
from kernel_probe.anemoi.reading import packaged_dir

LN = {"_target_": "torch.nn.LayerNorm"}
PACKAGED = packaged_dir()
needs_presets = pytest.mark.skipif(
    PACKAGED is None,
    reason="anemoi-training (its packaged presets) is not installed; `bash .ci/anemoi-install` "
    "installs it",
)


# ---- merge_leftovers -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "written,content,left",
    [
        # the user's entry replaces the class; Hydra kept the preset's other keys
        (
            {"LayerNorm": LN},
            {"LayerNorm": {**LN, "condition_shape": 16, "zero_init": True}},
            "condition_shape, zero_init come from the preset",
        ),
        (
            {"LayerNorm": {**LN, "eps": 1e-5}},
            {"LayerNorm": {**LN, "eps": 1e-5}},
            None,
        ),  # all its own
        (
            {"LayerNorm": {"eps": 1e-5}},
            {"LayerNorm": {**LN, "eps": 1e-5, "bias": False}},
            None,
        ),  # partial: on purpose
        (
            {"LayerNorm": "${model.kernel_lock.LayerNorm}"},
            {"LayerNorm": {**LN, "x": 1}},
            None,
        ),  # replaced whole
        ({"LayerNorm": LN}, {"LayerNorm": "torch.nn.LayerNorm"}, None),
        (None, {"LayerNorm": {**LN, "x": 1}}, None),  # not an overlay's block
    ],
    ids=["leftovers", "own", "partial", "interpolation", "not-a-mapping", "not-written"],
)
def test_merge_leftovers(written, content, left):
    found = merge_leftovers(
        Block("model.processor.layer_kernels", content=content, written=written)
    )
    if left is None:
        assert found == []
        return
    [f] = found
    assert (f.severity, f.kind, f.where) == (
        "error",
        "merge",
        "model.processor.layer_kernels.LayerNorm",
    )
    assert (
        left in f.problem
        and "are passed to torch.nn.LayerNorm" in f.problem
        and "interpolation" in f.fix
    )


# ---- compare_with_lock ---------------------------------------------------------------------------
@pytest.fixture
def expected() -> dict[str, Exported]:
    """What MINIMAL_LOCK exports (kernel_lock.anemoi.export, tested in test_export.py)."""
    return {
        "LayerNorm": Exported("LayerNorm", {"_target_": "torch.nn.LayerNorm", "eps": 1e-6}),
        "Linear": Exported("Linear", {"_target_": "torch.nn.Linear", "bias": False}),
    }


FACTS = {
    "LayerNorm": {"defaults": {"eps": 1e-5, "bias": True}},
    "Linear": {"defaults": {"bias": True}},
}
W = "model.layer_kernels"


@pytest.mark.parametrize(
    "content,found",
    [
        (
            {
                "LayerNorm": {**LN, "eps": 1e-6},
                "Linear": {"_target_": "torch.nn.Linear", "bias": False},
            },
            [],
        ),
        (
            {
                "LayerNorm": {**LN, "eps": 1},
                "Linear": {"_target_": "torch.nn.Linear", "bias": False},
            },
            [("error", f"{W}.LayerNorm.eps", "eps is 1, the lock pins 1e-06")],
        ),
        (
            {"LayerNorm": {"_target_": "kp_zoo.norms.GoodLayerNorm", "eps": 1e-6}},
            [
                (
                    "error",
                    f"{W}.LayerNorm",
                    "builds kp_zoo.norms.GoodLayerNorm, the lock pins torch.nn.LayerNorm",
                ),
                (
                    "error",
                    f"{W}.Linear (not set: anemoi's default).bias",
                    "bias is not set (default True), the lock pins False",
                ),
            ],
        ),
        (
            {"LayerNorm": LN, "Linear": {"_target_": "torch.nn.Linear", "bias": 0}},
            [
                (
                    "error",
                    f"{W}.LayerNorm.eps",
                    "eps is not set (default 1e-05), the lock pins 1e-06",
                ),
                ("error", f"{W}.Linear.bias", "bias is 0, the lock pins False"),  # 0 is not False
            ],
        ),
        # anemoi's AutocastLayerNorm runs torch.nn.LayerNorm: kept, with the lock's kwargs
        (
            {
                "LayerNorm": {"_target_": AUTOCAST_LAYER_NORM, "eps": 1e-6},
                "Linear": {"_target_": "torch.nn.Linear", "bias": False},
            },
            [
                (
                    "note",
                    f"{W}.LayerNorm",
                    "keeps anemoi's AutocastLayerNorm: it runs the lock's torch.nn.LayerNorm "
                    "kernel",
                )
            ],
        ),
        (
            {
                "LayerNorm": {"_target_": CONDITIONAL_LAYER_NORM},
                "Linear": {"_target_": "torch.nn.Linear", "bias": False},
            },
            [("note", f"{W}.LayerNorm", "is a different layer (not a kernel choice)")],
        ),
        # an entry that is already wrong on its own is not compared again
        ({"LayerNorm": {"eps": 1e-6}, "Linear": "torch.nn.Linear"}, []),
    ],
    ids=[
        "agrees",
        "wrong-value",
        "other-class-and-default",
        "unset-and-int",
        "autocast",
        "conditional",
        "broken",
    ],
)
def test_compare_with_lock(expected, content, found):
    got = compare_with_lock(Block(W, content=content), expected, FACTS)
    assert [(f.severity, f.kind, f.where) for f in got] == [
        (severity, "lock", where) for severity, where, _ in found
    ]
    for f, (_, _, words) in zip(got, found, strict=True):
        assert words in f.problem, (f.problem, words)


def test_a_fix_says_the_value_to_set(expected):
    [f] = compare_with_lock(
        Block(W, content={"LayerNorm": LN}), {"LayerNorm": expected["LayerNorm"]}, FACTS
    )
    assert f.fix == "set `eps: 1e-06`"
    [f] = compare_with_lock(
        Block(W, content={"LayerNorm": LN}), {"LayerNorm": expected["LayerNorm"]}, {}
    )
    assert f.problem == "eps is not set, the lock pins 1e-06"  # no default known: nothing invented


def test_a_wrapper_the_lock_cannot_keep_is_an_error():
    want = Exported("LayerNorm", {"_target_": "kp__odd.Norm"})  # no generic adapter can name it
    [f] = compare_with_lock(
        Block(W, content={"LayerNorm": {"_target_": AUTOCAST_LAYER_NORM}}), {"LayerNorm": want}, {}
    )
    assert (f.severity, f.kind, f.where) == (
        "error",
        "lock",
        f"{W}.LayerNorm",
    ) and "cannot be named" in f.problem


@pytest.mark.parametrize(
    "a,b,same",
    [
        (1, 1.0, True),
        (1e-6, 1e-6, True),
        (True, 1, False),
        (False, 0, False),
        (True, True, True),
        ("x", "x", True),
        (None, False, False),
    ],
)
def test_same(a, b, same):
    assert _same(a, b) is same and _same(b, a) is same


# ---- lost wrappers -------------------------------------------------------------------------------
def test_effective_follows_inheritance():
    blocks = [
        Block("a", content={"LayerNorm": LN}),
        Block("b", inherits="a"),
        Block("c", inherits="b"),
        Block("d", inherits="e"),  # a parent that is not a block
        Block("x", inherits="y"),
        Block("y", inherits="x"),  # a loop
    ]
    assert _effective(blocks) == {
        "a": {"LayerNorm": LN},
        "b": {"LayerNorm": LN},
        "c": {"LayerNorm": LN},
        "d": {},
        "x": {},
        "y": {},
    }


def preset(directory: Path, name: str, layer_norm: dict) -> Path:
    path = directory / "model" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "layer_kernels": {"LayerNorm": layer_norm},
                "processor": {"layer_kernels": "${model.layer_kernels}"},
            }
        )
    )
    return path


def test_preset_file_is_found_as_hydra_would(tmp_path):
    mine = tmp_path / "mine.yaml"
    local = preset(tmp_path, "base", {"_target_": AUTOCAST_LAYER_NORM})
    assert preset_file(Config(path=str(mine), shape="overlay", choices={"model": "base"})) == (
        "base",
        local,
    )
    assert preset_file(Config(path=str(mine), shape="overlay", choices={"model": "nope"})) is None
    assert preset_file(Config(path=str(mine), shape="overlay")) is None
    # the chosen preset is this file itself: nothing to compare with
    assert (
        preset_file(Config(path=str(local), shape="model-file", choices={"model": "base"})) is None
    )


@needs_presets
def test_preset_file_falls_back_to_the_packaged_presets(tmp_path):
    mine = tmp_path / "mine.yaml"
    assert preset_file(Config(path=str(mine), shape="overlay", choices={"model": "gnn"})) == (
        "gnn",
        PACKAGED / "model" / "gnn.yaml",
    )
    # a model file named like a packaged preset is an edited copy of it
    assert preset_file(Config(path=str(tmp_path / "gnn.yaml"), shape="model-file")) == (
        "gnn",
        PACKAGED / "model" / "gnn.yaml",
    )
    assert preset_file(Config(path=str(tmp_path / "mymodel.yaml"), shape="model-file")) is None


@pytest.mark.parametrize(
    "theirs,mine,warned",
    [
        (AUTOCAST_LAYER_NORM, "torch.nn.LayerNorm", True),  # the cast-back is lost
        (
            AUTOCAST_LAYER_NORM,
            "kernel_lock.adapters.AutocastCompiledLayerNorm",
            False,
        ),  # an adapter keeps it
        (AUTOCAST_LAYER_NORM, AUTOCAST_LAYER_NORM, False),
        (
            CONDITIONAL_LAYER_NORM,
            "torch.nn.LayerNorm",
            False,
        ),  # a different layer, not a same-kernel wrapper
        ("torch.nn.LayerNorm", "kp_zoo.norms.GoodLayerNorm", False),
    ],
)
def test_lost_wrappers(tmp_path, theirs, mine, warned):
    preset(tmp_path, "base", {"_target_": theirs})
    config = Config(
        path=str(tmp_path / "mine.yaml"),
        shape="overlay",
        choices={"model": "base"},
        blocks=[
            Block("model.layer_kernels", content={"LayerNorm": {"_target_": mine}}),
            Block("model.processor.layer_kernels", inherits="model.layer_kernels"),
        ],
    )
    found = lost_wrappers(config)
    if not warned:
        assert found == []
        return
    [f] = found  # at the block that sets it, not at the one inheriting it
    assert (f.severity, f.kind, f.where) == ("warning", "wrapper", "model.layer_kernels.LayerNorm")
    assert (
        "the base preset uses anemoi's AutocastLayerNorm here" in f.problem
        and "the cast-back is lost" in f.problem
    )
    assert (
        "kernel-probe export LOCK --config mine.yaml" in f.fix
        and "kernel_lock.adapters.Autocast__" in f.fix
    )


def test_lost_wrappers_without_a_readable_preset_says_nothing(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "base.yaml").write_text("- not a mapping\n")
    config = Config(
        path=str(tmp_path / "mine.yaml"),
        choices={"model": "base"},
        blocks=[Block("model.layer_kernels", content={"LayerNorm": LN})],
    )
    assert lost_wrappers(config) == []
