"""kernel_probe/anemoi/reading.py: reading a config as anemoi-training does. Hydra's composition
runs in a child (kernel_probe.anemoi.children); here that child is stood in for by its answer, so
every branch of reading is exercised without starting one (test_pipelines.py and
test_schema_check.py run the real one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kernel_probe.anemoi import reading
from kernel_probe.anemoi.reading import (
    SEARCH_ROOTS,
    Trust,
    _defaults_text,
    installed,
    override_through_interpolation,
    read_config,
)
from kernel_probe.errors import UsageError
from kernel_probe.isolation.child import ChildResult
from kernel_probe.isolation.protocol import ComposeReply, ComposeRequest

LN = {"_target_": "torch.nn.LayerNorm"}
OVERLAY = {
    "defaults": [{"data": "zarr"}, {"model": "gnn"}, "_self_"],
    "model": {"num_channels": 32},
}


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Child:
    """Stands in for run_function: records each request and answers with ``result``."""

    def __init__(self, result: ChildResult | None = None):
        self.result = result
        self.requests: list[ComposeRequest] = []

    def __call__(self, module, function, payload, *, timeout):
        assert (module, function) == ("kernel_probe.anemoi.children", "compose")
        if self.result is None:
            raise AssertionError("no child should have been started")
        self.requests.append(payload)
        return self.result


@pytest.fixture
def child(monkeypatch):
    def install(result: ChildResult | None = None) -> Child:
        fake = Child(result)
        monkeypatch.setattr(reading, "run_function", fake)
        real = reading.installed
        monkeypatch.setattr(
            reading, "installed", lambda d: "1.3.2" if d == "hydra-core" else real(d)
        )
        return fake

    return install


def answered(reply: ComposeReply) -> ChildResult:
    return ChildResult("ok", value=reply.to_json())


def failed(kind: str, reason: str) -> ChildResult:
    return ChildResult("error", reason=reason, raised={"raised": kind})


# ---- small helpers -------------------------------------------------------------------------------
def test_installed():
    assert installed("pytest") == pytest.__version__
    assert installed("kp-no-such-distribution") is None


@pytest.mark.parametrize(
    "root,text",
    [
        (OVERLAY, "data: zarr, model: gnn"),
        ({"defaults": ["transformer", "_self_"]}, "transformer"),
        ({"defaults": ["_self_"]}, "none"),
        ({"defaults": None}, "none"),
        ({}, "none"),
    ],
)
def test_defaults_text(root, text):
    assert _defaults_text(root) == text


ROOT = {
    "model": {
        "layer_kernels": {"LayerNorm": "${model.kernel_lock.LayerNorm}"},
        "kernel_lock": {"LayerNorm": LN},
    }
}


@pytest.mark.parametrize(
    "why,working",
    [
        (
            "Could not override 'model.layer_kernels.LayerNorm._target_'. ... Key: "
            "model.layer_kernels.LayerNorm._target_=torch.nn.RMSNorm",
            "model.kernel_lock.LayerNorm._target_=torch.nn.RMSNorm",
        ),
        (
            "Could not override 'model.layer_kernels.LayerNorm.eps'.",
            "model.kernel_lock.LayerNorm.eps=VALUE",
        ),
        (
            "Could not override 'model.layer_kernels.LayerNorm'. x=1",
            None,
        ),  # the interpolation itself: Hydra can
        ("Could not override 'model.processor.x'.", None),  # no such key in the file
        (
            "Could not override 'model.kernel_lock.LayerNorm.eps'.",
            None,
        ),  # no interpolation on the path
        ("MissingConfigException: no model/nope", None),
    ],
)
def test_override_through_interpolation(why, working):
    got = override_through_interpolation(why, ROOT)
    if working is None:
        assert got is None
    else:
        assert got is not None and got[0] == working
        assert (
            "model.layer_kernels.LayerNorm is the interpolation ${model.kernel_lock.LayerNorm}"
            in got[1]
        )


# ---- compose: the child's answer, or why not -----------------------------------------------------
def test_compose_without_hydra_starts_no_child(monkeypatch, tmp_path):
    monkeypatch.setattr(reading, "run_function", Child())
    monkeypatch.setattr(reading, "installed", lambda d: None)
    assert reading.compose(tmp_path, "config", []) == (
        None,
        "hydra-core is not installed here",
        "missing",
    )


@pytest.mark.parametrize(
    "result,want",
    [
        (answered(ComposeReply(tree={"model": {}})), (ComposeReply(tree={"model": {}}), "", "")),
        (
            failed("MissingConfigException", "no model/x"),
            (None, "no model/x", "MissingConfigException"),
        ),
        (ChildResult("timeout", reason="took over 60 s"), (None, "took over 60 s", "timeout")),
        (ChildResult("crashed", reason="SIGKILL"), (None, "SIGKILL", "crashed")),
    ],
    ids=["ok", "raised", "timeout", "crashed"],
)
def test_compose(child, tmp_path, result, want):
    fake = child(result)
    assert reading.compose(tmp_path, "mine", ["model=gnn"], trust=Trust(("kp_zoo",))) == want
    [request] = fake.requests
    assert request == ComposeRequest(
        config_dir=str(tmp_path.resolve()),
        config_name="mine",
        overrides=("model=gnn",),
        trusted=(*SEARCH_ROOTS, "kp_zoo"),
        memory=reading.COMPOSE_MEMORY,
    )


def test_a_malformed_answer_is_a_protocol_failure(child, tmp_path):
    child(ChildResult("ok", value={"blocks": {}}))  # no tree
    answer, why, kind = reading.compose(tmp_path, "mine", [])
    assert answer is None and kind == "protocol" and "tree" in why


# ---- read_config: what is composed, and how ------------------------------------------------------
def test_a_full_config_is_read_alone(child, tmp_path):
    child()  # no child: a full config without overrides is what it says
    p = write(tmp_path / "c.yaml", {"model": {"layer_kernels": {"LayerNorm": LN}}, "training": {}})
    config = read_config(p)
    assert (config.shape, config.composed, config.path, config.overrides) == (
        "full",
        False,
        str(p),
        [],
    )
    assert [b.where for b in config.blocks] == ["model.layer_kernels"] and config.findings == []
    assert (
        config.why == "training sections (training); a `model:` node" and config.alternative is None
    )


def test_an_overlay_with_no_compose_is_judged_alone_and_says_so(child, tmp_path):
    child()
    p = write(tmp_path / "mine.yaml", OVERLAY)
    config = read_config(p, compose_overlays=False)
    assert config.shape == "overlay" and not config.composed
    [f] = [f for f in config.findings if f.kind == "defaults"]
    assert (
        f.severity == "warning"
        and "the defaults list (data: zarr, model: gnn) was not followed" in f.problem
    )
    assert (
        "composition was switched off (--no-compose)" in f.problem and "drop --no-compose" in f.fix
    )


@pytest.mark.parametrize(
    "result,kind,words,fix",
    [
        (
            None,
            "defaults",
            "hydra-core is not installed here",
            "install hydra-core and anemoi-training",
        ),
        (
            failed("UntrustedSearchPath", "UntrustedSearchPath: search path pkg://kp_evil"),
            "trust",
            "refused to compose: search path pkg://kp_evil",
            "--trust PACKAGE",
        ),
        (
            failed("ConfigCompositionException", "Could not load 'model/nope'"),
            "compose",
            "Hydra cannot compose this config as anemoi-training would: Could not load",
            "fix the defaults list",
        ),
    ],
    ids=["no-hydra", "untrusted", "broken"],
)
def test_an_overlay_that_cannot_be_composed(child, monkeypatch, tmp_path, result, kind, words, fix):
    if result is None:
        monkeypatch.setattr(reading, "run_function", Child())
        monkeypatch.setattr(reading, "installed", lambda d: None)
    else:
        child(result)
    p = write(tmp_path / "mine.yaml", OVERLAY)
    config = read_config(p)
    assert not config.composed and config.shape == "overlay"
    f = next(f for f in config.findings if f.kind == kind)
    assert words in f.problem and fix in f.fix, f
    assert f.severity == ("warning" if kind == "defaults" else "error")


def test_missing_presets_without_anemoi_training_say_what_to_install(child, monkeypatch, tmp_path):
    child(failed("MissingConfigException", "Could not find 'model/gnn'"))
    monkeypatch.setattr(reading, "installed", lambda d: "1.3.2" if d == "hydra-core" else None)
    config = read_config(write(tmp_path / "mine.yaml", OVERLAY))
    [f] = [f for f in config.findings if f.kind == "defaults"]
    assert (
        "anemoi-training is not installed here, so its presets cannot be found (Could not find"
        in f.problem
    )
    assert "pip install --no-deps anemoi-training" in f.fix


def test_an_override_under_an_interpolation_names_the_one_that_works(child, tmp_path):
    override = "model.layer_kernels.LayerNorm._target_=torch.nn.RMSNorm"
    child(
        failed(
            "ConfigCompositionException",
            f"Could not override '{override.split('=')[0]}'. Key: {override}",
        )
    )
    p = write(tmp_path / "mine.yaml", {"defaults": [{"model": "gnn"}, "_self_"], **ROOT})
    config = read_config(p, [override])
    [f] = [f for f in config.findings if f.kind == "compose"]
    assert "Hydra cannot override a key under an interpolation" in f.problem
    assert f.fix.startswith(
        "override `model.kernel_lock.LayerNorm._target_=torch.nn.RMSNorm` instead"
    )
    assert config.overrides == [override]


def test_a_composed_overlay_takes_hydras_blocks(child, tmp_path):
    tree = {
        "data": {},
        "model": {
            "layer_kernels": {"LayerNorm": LN, "Linear": "${x}"},
            "processor": {"layer_kernels": "${model.layer_kernels}"},
            "encoder": {"layer_kernels": "${model.nowhere}"},
            "decoder": {"layer_kernels": ["not", "a", "mapping"]},
        },
    }
    blocks = {
        "model.layer_kernels": {
            "entries": {"LayerNorm": LN, "Linear": {"__error__": "InterpolationKeyError: x"}}
        },
        "model.processor.layer_kernels": {"entries": {"LayerNorm": LN}},
        "model.encoder.layer_kernels": {"error": "InterpolationKeyError: nowhere"},
        "model.decoder.layer_kernels": {"value": ["not", "a", "mapping"]},
    }
    reply = ComposeReply(
        tree=tree, blocks=blocks, choices={"model": "gnn"}, sources=["main: file:///x"]
    )
    fake = child(answered(reply))
    root = {**OVERLAY, "model": {"layer_kernels": {"LayerNorm": {**LN, "eps": 1e-3}}}}
    p = write(tmp_path / "mine.yaml", root)
    config = read_config(p, ["training.max_epochs=1"])
    assert [r.config_name for r in fake.requests] == ["mine"] and fake.requests[
        0
    ].config_dir == str(tmp_path)
    assert config.composed and config.tree == tree and config.choices == {"model": "gnn"}
    assert config.sources == ["main: file:///x"] and config.overrides == ["training.max_epochs=1"]
    by_where = {b.where: b for b in config.blocks}
    assert set(by_where) == {"model.layer_kernels", "model.processor.layer_kernels"}
    # Hydra's resolution, not the file's
    assert by_where["model.layer_kernels"].content == {"LayerNorm": LN}
    # what the overlay sets
    assert by_where["model.layer_kernels"].written == {"LayerNorm": {**LN, "eps": 1e-3}}
    assert by_where["model.processor.layer_kernels"].inherits == "model.layer_kernels"
    assert {(f.severity, f.kind, f.where) for f in config.findings} == {
        ("error", "interpolation", "model.layer_kernels.Linear"),
        ("error", "interpolation", "model.encoder.layer_kernels"),
        ("error", "entry", "model.decoder.layer_kernels"),
    }


def test_a_composed_config_without_blocks_uses_anemois_defaults(child, tmp_path):
    child(answered(ComposeReply(tree={"model": {"num_channels": 8}})))
    config = read_config(write(tmp_path / "mine.yaml", OVERLAY))
    assert [b.where for b in config.blocks] == ["(anemoi defaults)"]
    [f] = config.findings
    assert f.problem == "the composed config has no layer_kernels block: anemoi uses its defaults"


def test_a_preset_extending_another_is_composed_as_the_model_choice(child, tmp_path):
    fake = child(
        answered(
            ComposeReply(
                tree={"model": {"layer_kernels": {}}},
                blocks={"model.layer_kernels": {"entries": {}}},
            )
        )
    )
    write(tmp_path / "conf" / "model" / "base.yaml", {"num_channels": 8})
    p = write(
        tmp_path / "conf" / "model" / "mine.yaml",
        {"defaults": ["base", "_self_"], "num_channels": 16},
    )
    config = read_config(p, ["model.num_channels=4"])
    [request] = fake.requests
    assert (
        request.config_dir == str((tmp_path / "conf").resolve()) and request.config_name == "config"
    )
    assert request.overrides == ("model=mine", "model.num_channels=4")
    assert config.shape == "model-file" and config.composed


def test_overrides_on_a_model_file_elsewhere_are_a_usage_error(child, tmp_path):
    child()
    p = write(tmp_path / "mine.yaml", {"num_channels": 8, "layer_kernels": {"LayerNorm": LN}})
    with pytest.raises(UsageError) as exc:
        read_config(p, ["model.num_channels=4"])
    assert "overrides (model.num_channels=4) apply to a primary config" in exc.value.problem
    assert exc.value.exit_code == 2
    assert read_config(p).shape == "model-file"  # without overrides: read alone


def test_a_shape_asked_for_is_used_and_what_it_looked_like_is_said(child, tmp_path):
    child()
    p = write(
        tmp_path / "mine.yaml",
        {"model": {"_target_": "anemoi.models.X", "layer_kernels": {"LayerNorm": LN}}},
    )
    as_file = read_config(p)
    assert as_file.shape == "model-file" and as_file.alternative == "full"
    assert [b.where for b in as_file.blocks] == ["model.model.layer_kernels"]
    as_full = read_config(p, shape="full")
    assert as_full.shape == "full" and [b.where for b in as_full.blocks] == ["model.layer_kernels"]
    assert as_full.why.startswith(
        "asked to read it as one (it looks like a model config file: its `model:` key"
    )
    assert as_full.alternative is None
