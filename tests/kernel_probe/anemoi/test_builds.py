"""check-config builds what anemoi builds (issue 35): the six cases that exited 0 and then failed,
or silently fell back, in anemoi-models 0.19.0 / anemoi-training 0.17.1. Each mutates
anemoi-training's own gnn preset, read from the installed package, as a user would edit a copy of
it.

Install (what .ci/run does through .ci/anemoi-install): anemoi-training, anemoi-models and
anemoi-graphs with --no-deps on the CPU torch, plus hydra-core.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernel_probe.anemoi.pipelines import check_config
from tests.kernel_probe.anemoi.test_pipelines import make_lock

pytest.importorskip(
    "hydra", reason="hydra-core is not installed; `bash .ci/anemoi-install` installs it"
)
pytest.importorskip(
    "anemoi.training",
    reason="anemoi-training is not installed; `bash .ci/anemoi-install` installs "
    "anemoi-training==0.17.1 with --no-deps",
)
pytest.importorskip(
    "anemoi.models",
    reason="anemoi-models is not installed; `bash .ci/anemoi-install` installs "
    "anemoi-models==0.19.0 with --no-deps",
)

pytestmark = [pytest.mark.anemoi, pytest.mark.slow]

GNN = Path(str(importlib.resources.files("anemoi.training") / "config")) / "model" / "gnn.yaml"


def mutated(tmp_path: Path, edit) -> Path:
    """anemoi-training's gnn preset with ``edit`` applied, written where its own ``model/`` group
    is."""
    data: dict[str, Any] = yaml.safe_load(GNN.read_text())
    edit(data)
    path = tmp_path / "model" / "gnn.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def entry(key: str, **values: Any):
    def edit(data: dict[str, Any]) -> None:
        data["layer_kernels"][key] = {**data["layer_kernels"].get(key, {}), **values}

    return edit


def errors(result) -> list[tuple[str, str, str]]:
    return [(f.kind, f.where, f.problem) for f in result.findings if f.severity == "error"]


def test_the_preset_itself_builds_with_no_finding_from_building(tmp_path):
    result = check_config(mutated(tmp_path, lambda data: None))
    assert not [f for f in result.findings if f.kind in ("build", "value")], result.findings
    assert not [f for f in result.findings if "has no layer_kernels block" in f.problem]


def test_a_decoder_without_a_block_falls_back_to_anemoi_defaults(tmp_path):
    path = mutated(tmp_path, lambda data: data["decoders"]["0"]["mapper"].pop("layer_kernels"))
    where = "model.decoders.0.mapper.layer_kernels"
    result = check_config(path)
    [f] = [f for f in result.findings if f.where == where]
    assert (
        f.severity == "warning"
        and "GNNBackwardMapper" in f.problem
        and "torch.nn.LayerNorm" in f.problem
    )
    assert result.exit_code == 0
    locked = check_config(path, lock=make_lock(tmp_path / "lock.toml"))
    assert ("lock", where) in [(k, w) for k, w, _ in errors(locked)] and locked.exit_code == 3
    assert "not the lock's kernels" in next(p for k, w, p in errors(locked) if w == where)


# (the edit, the key, the finding's kind, words of what anemoi would raise)
CASES = [
    (
        entry("LayerNorm", elementwise_afine=True),
        "LayerNorm",
        "build",
        "unexpected keyword argument 'elementwise_afine'",
    ),
    (
        entry("Linear", dtype="bfloat16"),
        "Linear",
        "value",
        "argument 'dtype' must be torch.dtype, not str",
    ),
    (
        entry("LayerNorm", eps="${oc.env:KP_UNSET_EPS,1e-5}"),
        "LayerNorm",
        "value",
        "eps must be float, not str",
    ),
    (
        lambda data: data["layer_kernels"].update(Linear={"_target_": "torch.nn.Identity"}),
        "Linear",
        "semantics",
        "returns (3, 64) for a (3, 64) input, where Linear returns (3, 128)",
    ),
    (entry("Linear", device="cuda"), "Linear", "value", "this machine has no cuda device"),
]


@pytest.mark.parametrize(
    "edit, key, kind, words",
    CASES,
    ids=["afine-typo", "dtype-string", "eps-string", "identity", "cuda"],
)
def test_what_anemoi_would_raise_is_an_error_naming_the_key(
    tmp_path, monkeypatch, edit, key, kind, words
):
    monkeypatch.delenv("KP_UNSET_EPS", raising=False)
    result = check_config(mutated(tmp_path, edit))
    where = f"model.layer_kernels.{key}"
    hits = [p for k, w, p in errors(result) if (k, w) == (kind, where)]
    assert hits and words in hits[0], errors(result)
    assert result.exit_code == 5


def test_lazy_linear_under_linear_is_judged_by_what_it_computes(tmp_path):
    edit = entry("Linear", _target_="torch.nn.LazyLinear")
    result = check_config(mutated(tmp_path, edit))
    found = [(k, p) for k, w, p in errors(result) if w == "model.layer_kernels.Linear"]
    assert found and found[0][0] in ("signature", "semantics"), errors(result)
