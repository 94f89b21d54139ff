"""anemoi's own config files, as its users have them: every model preset anemoi-training ships, read
from the installed package (never copied here), Hydra overlays composed as `anemoi-training train`
composes them, and the export merged into them.

Install (what .ci/run does through .ci/anemoi-install): anemoi-training, anemoi-models and
anemoi-graphs with --no-deps on the CPU torch, plus hydra-core.
"""

from __future__ import annotations

import copy
import importlib.resources
from pathlib import Path
from typing import Any

import pytest
import yaml

import kernel_lock
from kernel_lock.anemoi import AUTOCAST_LAYER_NORM, CONDITIONAL_LAYER_NORM, layer_kernels
from kernel_probe.anemoi.config import layer_kernels_paths
from kernel_probe.anemoi.pipelines import check_config, check_configs, export_for_config
from kernel_probe.cli import main
from tests.conftest import write_sealed

pytest.importorskip(
    "hydra", reason="hydra-core is not installed; `bash .ci/anemoi-install` installs it"
)
training = pytest.importorskip(
    "anemoi.training",
    reason="anemoi-training is not installed; `bash .ci/anemoi-install` "
    "installs anemoi-training==0.17.1 with --no-deps",
)

pytestmark = pytest.mark.anemoi

CONFIG_DIR = Path(str(importlib.resources.files("anemoi.training") / "config"))
MODEL_FILES = sorted((CONFIG_DIR / "model").glob("*.yaml"))

# one mistake of each kind a user makes in a component block: (key, entry, the finding's kind)
MISTAKES = [
    ("Layernorm", {"_target_": "torch.nn.LayerNorm"}, "key"),
    ("LayerNorm", {"_target_": "torch.nn.RMSNorm", "eps": 1e-6}, "semantics"),
    ("Linear", {"_target_": "torch.nn.Linear", "bias_init": "zeros"}, "signature"),
    ("Activation", {"_target_": "kp_no_such_library.FastGELU"}, "import"),
]

TORCH_LOCK = """\
lock-version = "1.0"
created-by = "test"
trusted-modules = ["kp_zoo"]

[slots.LayerNorm]
implementation = "{ln_id}"
target = "{ln_target}"
semantics = "layer_norm"
kwargs = {{ eps = 1e-5, elementwise_affine = true, bias = true }}
twin = {{ target = "torch.nn.LayerNorm", kwargs = {{ eps = 1e-5, elementwise_affine = true, bias = true }}, state-dict = "interchangeable", max-error = 0.0 }}

[slots.Linear]
implementation = "torch.linear"
target = "torch.nn.Linear"
semantics = "linear"
kwargs = {{ bias = true }}
twin = {{ target = "torch.nn.Linear", kwargs = {{ bias = true }}, state-dict = "interchangeable", max-error = 0.0 }}
"""  # noqa: E501 (TOML inline tables are one line)


def make_lock(
    path: Path, ln_target: str = "torch.nn.LayerNorm", ln_id: str = "torch.layer_norm"
) -> kernel_lock.KernelLock:
    # no [environment]: any machine
    write_sealed(path, TORCH_LOCK.format(ln_target=ln_target, ln_id=ln_id))
    return kernel_lock.load(path)


def errors(result) -> list[tuple[str, str]]:
    return [(f.kind, f.where) for f in result.findings if f.severity == "error"]


def test_the_package_ships_the_model_presets():
    # anemoi-training 0.17.1: 25 files under config/model/
    assert len(MODEL_FILES) >= 25, MODEL_FILES


# ---- every shipped model preset: no false error, every injected mistake caught -------------------
def with_mistakes(path: Path, components: list[str], out: Path) -> list[tuple[str, str]]:
    """``path`` written to ``out`` with one of each MISTAKES in its component blocks (the
    component's block made where it has none): (kind, where) of each finding to expect."""
    data = yaml.safe_load(path.read_text())
    injected = []
    for i, (key, entry, kind) in enumerate(MISTAKES):
        where = components[i % len(components)]
        node = data
        for part in where.split(".")[1:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        block = node.get("layer_kernels")
        node["layer_kernels"] = block = dict(block) if isinstance(block, dict) else {}
        block[key] = copy.deepcopy(entry)
        injected.append((kind, f"{where}.{key}"))
    out.parent.mkdir(parents=True)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return injected


def components_of(result) -> list[str]:
    """The component blocks a check found (processor, mappers, noise injector, ...)."""
    blocks = [b.where for b in result.config.blocks if not b.where.startswith("(")]
    return [w for w in blocks if w != "model.layer_kernels"]


@pytest.fixture(scope="module")
def presets(shipped_check, tmp_path_factory) -> dict[str, tuple[Any, list, Any]]:
    """Per shipped preset: (its check as shipped, the mistakes injected into a copy, that copy's
    check). Each group of checks is one ``check_configs`` call: one child for all the presets'
    schemas and entries instead of two per preset (issue 51)."""
    shipped_check.prefill([p.stem for p in MODEL_FILES])
    untouched = {p.stem: shipped_check(p.stem) for p in MODEL_FILES}
    root = tmp_path_factory.mktemp("mistakes")
    mutated, injected = [], {}
    for path in MODEL_FILES:
        # written where its own `model/` group is
        out = root / path.stem / "model" / path.name
        injected[path.stem] = with_mistakes(path, components_of(untouched[path.stem]), out)
        mutated.append(out)
    # anemoi-training's schema ran on the untouched files; on a mutated one it could only add
    # errors of its own (exit 5 either way), so it is left out: the mistakes, and the exit code,
    # must be this tool's own findings (issue 38)
    results = check_configs(mutated, schema=False)
    return {
        p.stem: (untouched[p.stem], injected[p.stem], result)
        for p, result in zip(MODEL_FILES, results, strict=True)
    }


@pytest.mark.slow
@pytest.mark.parametrize("path", MODEL_FILES, ids=[p.stem for p in MODEL_FILES])
def test_shipped_model_config_has_no_false_error_and_mistakes_are_caught(path, presets):
    untouched, injected, result = presets[path.stem]
    assert Path(untouched.config.path) == path, untouched.config.path  # this preset, as shipped
    # anemoi-training's schema: a preset that fails it as shipped (transformer, point_wise against
    # anemoi-models 0.19.0) is reported as the preset's own problem, never as this file's
    own = [e for e in errors(untouched) if e[0] != "preset"]
    assert own == [] and untouched.exit_code == (5 if errors(untouched) else 0), errors(untouched)
    assert untouched.schema.startswith("checked with anemoi-training"), untouched.schema
    blocks = [b.where for b in untouched.config.blocks if not b.where.startswith("(")]
    assert "model.processor.layer_kernels" in blocks, blocks
    assert result.config.path.endswith(f"{path.stem}/model/{path.name}"), result.config.path
    assert result.schema == "not run: --no-schema", result.schema
    assert result.exit_code == 5
    found = set(errors(result))
    for kind, where in injected:
        assert (kind, where) in found, (kind, where, sorted(found))


@pytest.mark.slow
def test_several_configs_checked_together_get_what_each_gets_alone(presets):
    # one with a preset's own schema errors, one composed from another
    names = ["transformer", "transformer_transport_edm"]
    for name in names:
        alone = check_config(CONFIG_DIR / "model" / f"{name}.yaml")
        together = presets[name][0]
        assert alone.findings == together.findings, name
        assert (alone.schema, alone.exit_code) == (together.schema, together.exit_code), name
        assert alone.config.blocks == together.config.blocks, name


@pytest.mark.slow
def test_model_file_interpolations_resolve_against_the_file_itself(shipped_check):
    # transformer_transport.yaml pins ${model.num_channels}: the file's own num_channels, never a
    # false alarm
    result = shipped_check("transformer_transport")
    assert result.config.shape == "model-file", result.config.why
    # the schema's: the preset's own
    assert [e for e in errors(result) if e[0] != "preset"] == [], errors(result)
    ln = next(b for b in result.config.blocks if b.where == "model.layer_kernels").content[
        "LayerNorm"
    ]
    assert ln["_target_"] == CONDITIONAL_LAYER_NORM and ln["normalized_shape"] == 1024


@pytest.mark.slow
def test_a_preset_extending_another_is_composed_like_training(shipped_check):
    # transformer_transport_edm.yaml: `defaults: [transformer_transport]`, composed as model=<name>
    result = shipped_check("transformer_transport_edm")
    assert result.config.composed and result.config.choices["model"] == "transformer_transport_edm"
    assert {b.where for b in result.config.blocks} >= {
        "model.layer_kernels",
        "model.processor.layer_kernels",
    }


@pytest.mark.slow
def test_every_block_is_found_including_hierarchical_mappers():
    result = check_config(CONFIG_DIR / "hierarchical.yaml")
    wheres = {b.where for b in result.config.blocks}
    assert {"model.upscale_mapper.layer_kernels", "model.downscale_mapper.layer_kernels"} <= wheres
    assert result.exit_code == 0, errors(result)


# ---- overlays: composed as anemoi-training composes them -----------------------------------------
def overlay(tmp_path: Path, model: str, body: str = "", name: str = "mine.yaml") -> Path:
    p = tmp_path / name
    p.write_text(
        "defaults:\n- data: zarr\n- dataloader: native_grid\n- diagnostics: evaluation\n- "
        f"system: example\n- graph: multi_scale\n- model: {model}\n- task: forecaster\n- "
        f"training: single\n- _self_\n{body}"
    )
    return p


@pytest.mark.slow
def test_overlay_is_composed_and_overrides_after_dashdash(tmp_path, capsys):
    p = overlay(tmp_path, "gnn")
    result = check_config(p)
    assert result.config.composed and result.config.choices["model"] == "gnn"
    ln = next(b for b in result.config.blocks if b.where == "model.layer_kernels").content[
        "LayerNorm"
    ]
    # the preset's block, not "anemoi uses its defaults"
    assert ln["_target_"] == AUTOCAST_LAYER_NORM
    assert main(["check-config", str(p), "--json", "--", "model=transformer_ens"]) == 0
    out = capsys.readouterr().out
    assert '"model": "transformer_ens"' in out and "model.noise_injector.layer_kernels" in out
    # a typo in an override is Hydra's error, reported as anemoi-training would meet it
    assert main(["check-config", str(p), "--", "model=no_such_preset"]) == 5
    assert "Hydra cannot compose" in capsys.readouterr().out


def test_overlay_without_hydra_says_the_defaults_were_not_followed(tmp_path, monkeypatch):
    import kernel_probe.anemoi.reading as reading

    p = overlay(
        tmp_path, "gnn", "model:\n  layer_kernels:\n    Layernorm: {_target_: torch.nn.LayerNorm}\n"
    )
    real = reading.installed
    monkeypatch.setattr(
        reading, "installed", lambda name: None if name == "hydra-core" else real(name)
    )
    result = check_config(p)
    [note] = [f for f in result.findings if f.kind == "defaults"]
    assert not result.config.composed and note.severity == "warning"
    assert (
        "model: gnn" in note.problem
        and "not followed" in note.problem
        and "hydra-core is not installed" in note.problem
    )
    # what the file itself sets is still judged
    assert ("key", "model.layer_kernels.Layernorm") in errors(result)


@pytest.mark.slow
def test_naive_paste_leaves_preset_keys_and_is_caught(tmp_path, capsys):
    lock = make_lock(tmp_path / "lock.toml")
    block = layer_kernels(lock)
    # the exported block pasted at the processor of transformer_transport: Hydra merges it into the
    # preset's ConditionalLayerNorm entry, whose condition_shape & co. stay beside
    # torch.nn.LayerNorm
    p = overlay(
        tmp_path,
        "transformer_transport",
        yaml.safe_dump({"model": {"processor": {"layer_kernels": block}}}),
    )
    result = check_config(p, lock=lock)
    merged = [f for f in result.findings if f.kind == "merge"]
    assert (
        result.exit_code == 5
        and merged
        and merged[0].where == "model.processor.layer_kernels.LayerNorm"
    )
    assert "condition_shape" in merged[0].problem and "interpolation" in merged[0].fix


# ---- the export, merged into a user's overlay, composes to exactly the lock's entries ------------
def composed_blocks(path: Path) -> dict[str, dict[str, Any]]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(version_base=None, config_dir=str(path.parent)):
        cfg = compose(config_name=path.stem)
    tree = OmegaConf.to_container(cfg.model, resolve=True)
    out = {}
    for parts in layer_kernels_paths(tree):
        node: Any = tree
        for part in parts:
            node = node[part]
        out["model." + ".".join(parts)] = node
    return out


@pytest.mark.parametrize("model", ["transformer_transport", "transformer_ens", "gnn"])
@pytest.mark.parametrize("kernel", ["torch.nn.LayerNorm", "kernel_lock.adapters.CompiledLayerNorm"])
@pytest.mark.slow
def test_export_merged_into_an_overlay_composes_to_exactly_the_locks_entries(
    tmp_path, model, kernel
):
    lock = make_lock(tmp_path / "lock.toml", ln_target=kernel, ln_id="x.layer_norm")
    want = layer_kernels(lock)
    p = overlay(tmp_path, model, "model:\n  num_channels: 256\n")  # the user's own settings stay
    result = export_for_config(lock, p)
    from tests.anemoi_build import deep_merge

    merged = deep_merge(
        yaml.safe_load(p.read_text()), yaml.safe_load(yaml.safe_dump(result.overlay()))
    )
    p.write_text(yaml.safe_dump(merged, sort_keys=False))
    blocks = composed_blocks(p)
    assert blocks, "no layer_kernels block composed"
    for where, block in blocks.items():
        if isinstance(block, str):
            continue
        assert block["Linear"] == want["Linear"], where
        ln = block.get("LayerNorm", {"_target_": "torch.nn.LayerNorm"})
        if ln["_target_"] == CONDITIONAL_LAYER_NORM:  # a different layer: left alone, whole
            assert set(ln) == {
                "_target_",
                "normalized_shape",
                "condition_shape",
                "zero_init",
                "autocast",
            }, where
        # every gnn block inherits the preset's AutocastLayerNorm: its cast kept
        elif model == "gnn":
            expected = (
                AUTOCAST_LAYER_NORM
                if kernel == "torch.nn.LayerNorm"
                else "kernel_lock.adapters.AutocastCompiledLayerNorm"
            )
            assert ln == {**want["LayerNorm"], "_target_": expected}, where
        else:
            # exactly the lock's entry: no key left from the preset
            assert ln == want["LayerNorm"], where
    check = check_config(p, lock=lock)
    # transformer_transport fails anemoi-training's schema as shipped
    # (decoders.0.mapper.num_channels): the preset's own problem, reported apart; nothing else
    assert [e for e in errors(check) if e[0] != "preset"] == [], errors(check)


@pytest.mark.slow
def test_gnn_keeps_autocast_layer_norm_against_a_torch_lock(tmp_path, capsys):
    lock = make_lock(tmp_path / "lock.toml")
    code = main(["check-config", str(CONFIG_DIR / "model" / "gnn.yaml"), "--lock", str(lock.path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "keeps anemoi's AutocastLayerNorm: it runs the lock's torch.nn.LayerNorm kernel" in out
    # against a lock pinning another kernel, AutocastLayerNorm disagrees and the fix keeps its cast
    other = make_lock(
        tmp_path / "compiled.toml",
        ln_target="kernel_lock.adapters.CompiledLayerNorm",
        ln_id="x.layer_norm",
    )
    result = check_config(CONFIG_DIR / "model" / "gnn.yaml", lock=other)
    [f] = [f for f in result.findings if f.severity == "error"]
    assert result.exit_code == 3 and f.where == "model.layer_kernels.LayerNorm"
    assert "AutocastCompiledLayerNorm" in f.problem


def test_export_keeps_the_wrapper_around_any_kernel(tmp_path, capsys):
    # no adapter table names kp_zoo's class: the generic adapter keeps AutocastLayerNorm's cast
    # around it
    lock = make_lock(
        tmp_path / "good.toml", ln_target="kp_zoo.norms.GoodLayerNorm", ln_id="x.layer_norm"
    )
    code = main(["export", str(lock.path), "--config", str(CONFIG_DIR / "model" / "gnn.yaml")])
    out = capsys.readouterr().out
    assert code == 0 and "kernel_lock.adapters.Autocast__kp_zoo__norms__GoodLayerNorm" in out, out
