"""check-config says what anemoi-training will say (issue 25) and runs nothing a config names
unasked (issue 24, point 5).

anemoi-training's configs are read from the installed package, never copied: the user's files here
are overlays over its presets (``tests/anemoi_build.write_overlay``) or edited copies of its model
presets.
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest
import yaml

import kernel_lock
from kernel_lock.anemoi import AUTOCAST_LAYER_NORM, layer_kernels
from kernel_probe.anemoi import checks as schema_check
from kernel_probe.anemoi.pipelines import check_config, export_for_config
from kernel_probe.anemoi.reading import Trust
from kernel_probe.commands.anemoi import render_yaml
from tests.anemoi_build import deep_merge, write_overlay
from tests.conftest import run_cli, write_sealed

pytest.importorskip(
    "hydra", reason="hydra-core is not installed; `bash .ci/anemoi-install` installs it"
)
pytest.importorskip(
    "anemoi.training.schemas.base_schema",
    reason="anemoi-training is not installed; `bash .ci/anemoi-install` installs "
    "anemoi-training==0.17.1 --no-deps",
)

pytestmark = [pytest.mark.anemoi, pytest.mark.slow]

CONFIG_DIR = Path(str(importlib.resources.files("anemoi.training") / "config"))

TORCH_LOCK = """\
lock-version = "1.0"
created-by = "test"

[slots.LayerNorm]
implementation = "torch.layer_norm"
target = "torch.nn.LayerNorm"
semantics = "layer_norm"
kwargs = { eps = 1e-05, elementwise_affine = true, bias = true }
twin = { target = "torch.nn.LayerNorm", kwargs = { eps = 1e-05, elementwise_affine = true, bias = true }, state-dict = "interchangeable", max-error = 0.0 }

[slots.Linear]
implementation = "torch.linear"
target = "torch.nn.Linear"
semantics = "linear"
kwargs = { bias = true }
twin = { target = "torch.nn.Linear", kwargs = { bias = true }, state-dict = "interchangeable", max-error = 0.0 }
"""  # noqa: E501 (TOML inline tables are one line)


@pytest.fixture
def torch_lock(tmp_path) -> kernel_lock.KernelLock:
    path = tmp_path / "kernel-lock.toml"
    write_sealed(path, TORCH_LOCK)  # no [environment]: it matches any machine
    return kernel_lock.load(path)


def errors(result) -> set[tuple[str, str]]:
    return {(f.kind, f.where) for f in result.findings if f.severity == "error"}


def kinds(result, severity: str) -> set[str]:
    return {f.kind for f in result.findings if f.severity == severity}


def overlay(tmp_path: Path, preset: str, extra: dict | None = None, *, fixed: bool = True) -> Path:
    """A user's overlay on `preset`; ``fixed``: with the keys anemoi-training 0.17.1's transformer
    lacks."""
    path = write_overlay(tmp_path / "mine.yaml", preset)
    body = yaml.safe_load(path.read_text())
    if not fixed and preset == "transformer":
        model = body["model"]
        del model["latent_aggregator"]
        del model["decoders"]["0"]["mapper"]["num_channels"]
    path.write_text(yaml.safe_dump(deep_merge(body, extra or {}), sort_keys=False))
    return path


def merge_export(path: Path, lock, overrides=()) -> Path:
    """docs/anemoi.md's way: the export for this config merged into its `model:` node."""
    body = yaml.safe_load(path.read_text())
    path.write_text(
        yaml.safe_dump(
            deep_merge(body, export_for_config(lock, path, overrides).overlay()), sort_keys=False
        )
    )
    return path


# ---- 1. anemoi-training's own schema -------------------------------------------------------------
def test_a_layer_kernels_block_at_the_config_root_fails(tmp_path):
    path = overlay(
        tmp_path, "gnn", {"layer_kernels": {"LayerNorm": {"_target_": "torch.nn.LayerNorm"}}}
    )
    result = check_config(path)
    assert result.exit_code == 5 and ("schema", "layer_kernels") in errors(result), result.findings
    [f] = [f for f in result.findings if f.kind == "schema"]
    assert "extra_forbidden" in f.problem and "under `model:`" in f.fix
    assert result.schema.startswith("checked with anemoi-training 0.17.1's BaseSchema")
    # before: the same file judged without the schema was ok (a false ok)
    assert check_config(path, schema=False).exit_code == 0


def test_a_block_at_model_model_layer_kernels_fails(tmp_path):
    path = overlay(
        tmp_path,
        "gnn",
        {"model": {"model": {"layer_kernels": {"LayerNorm": {"_target_": "torch.nn.LayerNorm"}}}}},
    )
    result = check_config(path)
    assert result.exit_code == 5 and ("schema", "model.model.layer_kernels") in errors(result), (
        result.findings
    )
    [f] = [f for f in result.findings if f.kind == "schema"]
    # the closest of the model schemas
    assert "extra_forbidden" in f.problem and "BaseModelSchema" in f.problem
    assert check_config(path, schema=False).exit_code == 0  # before: a false ok


@pytest.mark.parametrize("preset", ["gnn", "graphtransformer", "transformer"])
def test_a_valid_overlay_with_the_export_merged_passes(tmp_path, preset, torch_lock):
    path = merge_export(overlay(tmp_path, preset), torch_lock)
    result = check_config(path, lock=torch_lock)
    assert result.exit_code == 0, result.findings
    assert (
        result.schema.startswith("checked with anemoi-training")
        and "the composed config" in result.schema
    )


def test_the_stock_transformer_preset_fails_its_own_schema_apart_from_the_lock(
    tmp_path, torch_lock, shipped_check
):
    path = overlay(tmp_path, "transformer", fixed=False)
    result = check_config(path, lock=torch_lock)
    preset = {(f.kind, f.where) for f in result.findings if f.kind == "preset"}
    assert preset == {
        ("preset", "model.latent_aggregator"),
        ("preset", "model.decoders.0.mapper.num_channels"),
    }
    assert "schema" not in kinds(result, "error") and "lock" not in kinds(result, "error")
    assert all(
        "own `transformer` preset" in f.problem for f in result.findings if f.kind == "preset"
    )
    assert result.exit_code == 5  # anemoi-training train rejects it as shipped
    # the shipped model file itself, checked alone: the same two errors, the preset's own
    # check_config(CONFIG_DIR / "model" / "transformer.yaml")
    shipped = shipped_check("transformer")
    assert {(f.kind, f.where) for f in shipped.findings if f.severity == "error"} == preset
    # with the two keys set (tests/anemoi_build.PRESET_EXTRA), it passes
    assert (
        check_config(
            merge_export(overlay(tmp_path, "transformer"), torch_lock), lock=torch_lock
        ).exit_code
        == 0
    )


def test_without_anemoi_training_the_schema_is_not_run_and_says_how_to_get_it(
    tmp_path, monkeypatch, capsys
):
    path = overlay(tmp_path, "gnn")
    real = schema_check.installed
    monkeypatch.setattr(
        schema_check, "installed", lambda d: None if d == "anemoi-training" else real(d)
    )
    result = check_config(path)
    assert result.schema.startswith(
        "not run: anemoi-training is not installed here; install anemoi-training"
    )
    assert "\n" not in result.schema and "pip install --no-deps anemoi-training" in result.schema
    code, out, _ = run_cli(["check-config", path], capsys)
    assert (
        code == 0
        and "anemoi-training's schema: not run: anemoi-training is not installed here" in out
    )


# ---- 2. model files read right -------------------------------------------------------------------
def test_the_export_pasted_under_a_model_files_model_key_is_caught(tmp_path, torch_lock):
    data = yaml.safe_load((CONFIG_DIR / "model" / "gnn.yaml").read_text())
    # "under `model:`", the old header's advice
    data["model"]["layer_kernels"] = layer_kernels(torch_lock)
    data["layer_kernels"]["LayerNorm"] = {
        "_target_": AUTOCAST_LAYER_NORM,
        "eps": 1e-3,
    }  # its real root block
    path = tmp_path / "mymodel.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = check_config(path, lock=torch_lock)
    assert result.config.shape == "model-file", result.config.why
    assert (
        "its `model:` key is a class" in result.config.why
        and "model-node keys at its root" in result.config.why
    )
    found = errors(result)
    # the pasted block: rejected
    assert ("schema", "model.model.layer_kernels") in found, result.findings
    assert (
        "lock",
        "model.layer_kernels.LayerNorm.eps",
    ) in found  # the real block: eps 1e-3, the lock 1e-5
    assert result.exit_code == 5


@pytest.mark.parametrize("where", ["model", "elsewhere"])
def test_the_plain_export_pasted_where_its_header_says_passes_check_config_and_the_schema(
    tmp_path, torch_lock, where, capsys
):
    code, text, _ = run_cli(["export", torch_lock.path], capsys)
    assert code == 0
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert any("a model file" in line and "at the file's ROOT" in line for line in header), header
    assert any("NOT under its own `model:` key" in line for line in header), header
    assert any("model.model.layer_kernels" in line for line in header)
    block = yaml.safe_load(text)["layer_kernels"]
    data = yaml.safe_load((CONFIG_DIR / "model" / "graphtransformer.yaml").read_text())
    data["layer_kernels"] = block  # at the file's root, as the header says
    directory = tmp_path / "model" if where == "model" else tmp_path
    directory.mkdir(exist_ok=True)
    path = directory / "mine.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = check_config(path, lock=torch_lock)
    assert result.config.shape == "model-file" and result.config.alternative is None
    assert result.exit_code == 0, result.findings
    assert result.schema.startswith(
        "checked with anemoi-training 0.17.1's BaseSchema (this model node"
    )
    code, out, _ = run_cli(["check-config", path, "--lock", torch_lock.path], capsys)
    assert code == 0 and "read as a model config file" in out, out


def test_the_header_names_the_place_for_every_kind_of_file(torch_lock):
    text = render_yaml([], path="L", mode="training", digest="d")
    assert "a training config (the whole tree, no defaults list): under its `model:` node" in text
    assert "an overlay (a config with a `defaults:` list)" in text and "--config YOUR.yaml" in text


def test_an_ambiguous_file_is_checked_both_ways(tmp_path, capsys):
    path = tmp_path / "odd.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "_target_": "anemoi.models.models.AnemoiModelEncProcDec",
                    "layer_kernels": {"LayerNorm": {"_target_": "torch.nn.LayerNorm"}},
                }
            }
        )
    )
    result = check_config(path)
    assert result.config.shape == "model-file" and result.alternative is not None
    assert result.alternative.config.shape == "full"
    assert {b.where for b in result.config.blocks} == {"model.model.layer_kernels"}
    assert {b.where for b in result.alternative.config.blocks} == {"model.layer_kernels"}
    assert result.exit_code == max(result.own_exit_code, result.alternative.own_exit_code)
    code, out, _ = run_cli(["check-config", path], capsys)
    assert "the file's kind is ambiguous" in out and "also read as a complete config" in out
    assert code == result.exit_code


# ---- 3. the reverse case: a preset's AutocastLayerNorm replaced by a plain LayerNorm -------------
def test_the_plain_export_pasted_into_the_gnn_preset_warns_of_the_lost_cast_back(
    tmp_path, torch_lock
):
    data = yaml.safe_load((CONFIG_DIR / "model" / "gnn.yaml").read_text())
    # torch.nn.LayerNorm where gnn has AutocastLayerNorm
    data["layer_kernels"] = layer_kernels(torch_lock)
    (tmp_path / "model").mkdir()
    path = tmp_path / "model" / "gnn.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = check_config(path, lock=torch_lock)
    warned = [f for f in result.findings if f.kind == "wrapper"]
    assert [f.where for f in warned] == ["model.layer_kernels.LayerNorm"], result.findings
    assert "AutocastLayerNorm" in warned[0].problem and "the cast-back is lost" in warned[0].problem


def test_model_gnn_over_a_transformer_overlay_warns_of_the_lost_cast_back(tmp_path, torch_lock):
    path = merge_export(overlay(tmp_path, "transformer"), torch_lock)
    assert not [f for f in check_config(path, lock=torch_lock).findings if f.kind == "wrapper"]
    result = check_config(path, ["model=gnn"], lock=torch_lock, schema=False)
    warned = {f.where for f in result.findings if f.kind == "wrapper"}
    assert "model.layer_kernels.LayerNorm" in warned, result.findings


# ---- 4. overrides after the documented merge -----------------------------------------------------
def test_an_override_under_the_interpolation_names_the_override_that_works(tmp_path, torch_lock):
    path = merge_export(overlay(tmp_path, "gnn"), torch_lock)
    broken = check_config(
        path, ["model.layer_kernels.LayerNorm._target_=torch.nn.LayerNorm"], schema=False
    )
    [f] = [f for f in broken.findings if f.kind == "compose"]
    assert "Hydra cannot override a key under an interpolation" in f.problem
    working = "model.kernel_lock.LayerNorm_AutocastLayerNorm._target_=torch.nn.LayerNorm"
    assert f"override `{working}` instead" in f.fix
    result = check_config(path, [working], lock=torch_lock, schema=False)
    assert result.config.composed and "compose" not in kinds(result, "error")
    ln = next(b for b in result.config.blocks if b.where == "model.layer_kernels").content[
        "LayerNorm"
    ]
    assert ln["_target_"] == "torch.nn.LayerNorm"  # every block pointing there now builds it
    assert any(f.kind == "wrapper" for f in result.findings)  # and gnn's cast-back is gone: said


# ---- issue 24, point 5: what a config names is not run unasked -----------------------------------
def write(tmp_path: Path, body: dict) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.mark.parametrize("module", ["unittest.__main__", "kp_evil", "kp_zoo._private"])
def test_a_pkg_search_path_outside_trust_is_refused_before_it_is_imported(tmp_path, module, capsys):
    path = write(
        tmp_path,
        {"hydra": {"searchpath": [f"pkg://{module}"]}, "defaults": [{"model": "gnn"}, "_self_"]},
    )
    code, out, _ = run_cli(["check-config", path, "--no-schema"], capsys)
    assert code == 5, out
    assert f"pkg://{module}" in out and "nothing was imported" in out
    assert "SystemExit" not in out  # unittest's main() did not run


def test_a_trusted_pkg_search_path_composes(tmp_path, capsys):
    path = write(
        tmp_path,
        {"hydra": {"searchpath": ["pkg://kp_zoo"]}, "defaults": [{"model": "gnn"}, "_self_"]},
    )
    code, out, _ = run_cli(["check-config", path, "--no-schema", "--trust", "kp_zoo"], capsys)
    assert code == 0 and "composed by Hydra" in out, out


@pytest.mark.parametrize(
    "target", ["__main__.FastNorm", "kp_zoo._impl.FastNorm", "kp_zoo.norms.__main__"]
)
def test_main_and_private_targets_are_never_imported(tmp_path, target):
    path = write(tmp_path, {"model": {"layer_kernels": {"LayerNorm": {"_target_": target}}}})
    result = check_config(path, trust=Trust.granted(own_targets=True))
    [f] = [f for f in result.findings if f.kind == "trust"]
    assert f.severity == "error" and "never imported" in f.problem and result.exit_code == 5


def test_an_untrusted_target_is_not_checked_and_the_fix_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KERNEL_LOCK_TRUST", raising=False)
    path = write(
        tmp_path, {"model": {"layer_kernels": {"LayerNorm": {"_target_": "kp_evil.Evil"}}}}
    )
    code, out, _ = run_cli(["check-config", path], capsys)
    assert code == 0 and "not checked: module not trusted" in out, out
    assert "--trust kp_evil" in out and "--import-config-targets" in out
    # granted either way, it is imported and judged: not a torch.nn.Module
    for flags in (["--trust", "kp_evil"], ["--import-config-targets"]):
        code, out, _ = run_cli(["check-config", path, *flags], capsys)
        assert code == 5 and "is not a torch.nn.Module subclass" in out, out
    # a module that is not installed is said so without importing anything
    missing = write(
        tmp_path, {"model": {"layer_kernels": {"LayerNorm": {"_target_": "kp_absent_lib.Norm"}}}}
    )
    code, out, _ = run_cli(["check-config", missing], capsys)
    assert code == 5 and "No module named 'kp_absent_lib'" in out


def test_a_module_that_exits_on_import_is_reported_and_the_command_goes_on(tmp_path, capsys):
    path = write(
        tmp_path,
        {
            "model": {
                "layer_kernels": {"LayerNorm": {"_target_": "kp_exits.Norm"}},
                "processor": {"layer_kernels": {"LayerNorm": {"_target_": "torch.nn.RMSNorm"}}},
            }
        },
    )
    code, out, _ = run_cli(["check-config", path, "--trust", "kp_exits", "--no-schema"], capsys)
    assert code == 5, out
    assert "'kp_exits'" in out and "SystemExit" in out  # the module is named
    assert "semantics change" in out  # the other block was still judged
    assert out.rstrip().splitlines()[-1].startswith("errors:")


def test_the_generic_adapter_target_is_trusted_only_with_its_kernel(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KERNEL_LOCK_TRUST", raising=False)
    target = "kernel_lock.adapters.Autocast__kp_evil__Evil"
    path = write(tmp_path, {"model": {"layer_kernels": {"LayerNorm": {"_target_": target}}}})
    code, out, _ = run_cli(["check-config", path, "--no-schema"], capsys)
    assert code == 0 and "not checked: module not trusted" in out and "'kp_evil.Evil'" in out, out


def test_several_configs_in_one_command_each_judged_the_worst_exit(tmp_path, capsys):
    good = tmp_path / "good" / "cfg.yaml"
    bad = tmp_path / "bad" / "cfg.yaml"
    for path, key in ((good, "LayerNorm"), (bad, "Layernorm")):  # the second: an unknown key
        path.parent.mkdir()
        write(path.parent, {"model": {"layer_kernels": {key: {"_target_": "torch.nn.LayerNorm"}}}})
    argv = ["check-config", str(good), str(bad), "--no-schema", "--no-compose"]
    code, out, _ = run_cli(argv, capsys)
    assert code == 5, out
    assert out.index(str(good)) < out.index(str(bad)) and "exit 5: the worst of 2 configs" in out
    assert "Layernorm" in out.split(str(bad))[1] and "Layernorm" not in out.split(str(bad))[0]
    code, out, _ = run_cli([*argv, "--json"], capsys)
    data = json.loads(out)
    assert code == data["exit_code"] == 5 and data["ok"] is False
    assert [c["config"] for c in data["configs"]] == [str(good), str(bad)]
    assert [c["exit_code"] for c in data["configs"]] == [0, 5]
    assert data["error"]["file"] == str(bad) and data["error"]["key"].endswith("Layernorm")
    # one config: the JSON is that config's, as before
    code, out, _ = run_cli(argv[:2] + argv[3:] + ["--json"], capsys)
    assert code == 0 and json.loads(out)["config"] == str(good)
