"""check-model: the model as written against the model with a lock applied, over training steps,
eval, no-grad and a state-dict round trip; the first diverging site named (issue 54)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kernel_lock
from kernel_lock.lock import KernelLock
from kernel_lock.schema import EnvField, Environment
from kernel_probe.commands.model import render_check
from kernel_probe.model.check import NOT_TIMED, Check
from kernel_probe.model.tracing import parse_spec
from tests.conftest import run_cli
from tests.model_locks import pinned_lock

torch = pytest.importorskip("torch")

from kernel_probe.model.check_child import check_model  # noqa: E402  (torch: after the skip)
from kernel_probe.model.child import ModelCodeError  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
BLOCK = f"{ROOT}/tests/models/block.py:build"


def layer_norm_lock(target: str, path: Path, linear: str = "") -> Path:
    """A hand-made lock pinning the LayerNorm slot to ``target`` (and the Linear slot to
    ``linear``, where given; trusted kp_zoo)."""
    return pinned_lock(path, {"LayerNorm": target} | ({"Linear": linear} if linear else {}))


def check(target: str, tmp_path: Path, steps: int = 2) -> dict:
    lock = layer_norm_lock(target, tmp_path / "kernel-lock.toml")
    request = {"spec": parse_spec(BLOCK).to_json(), "lock": str(lock), "trust": ["kp_zoo"]}
    return check_model(request | {"steps": steps})


@pytest.mark.slow  # the phases and ~15 timed rounds: ~4 s
def test_a_correct_layer_norm_agrees_in_every_phase(tmp_path):
    result = check("kp_zoo.norms.GoodLayerNorm", tmp_path)
    assert result["verdict"] == "agree", result["phases"]
    assert result["sites"] == ["norm1", "norm2"]
    names = [p["phase"] for p in result["phases"]]
    assert names == [
        "in the first forward and backward", "after optimizer step 1", "after optimizer step 2",
        "in eval mode", "in a no-grad forward", "after load_state_dict (written -> applied)",
        "after load_state_dict (applied -> written)",
    ]  # fmt: skip
    timing = result["timing"]
    assert timing["rounds"] >= 3 and timing["written"] > 0 and timing["applied"] > 0
    assert timing["interval"][0] <= timing["ratio"] <= timing["interval"][1]


@pytest.mark.slow  # ~4 s
def test_a_weight_copied_at_the_first_forward_diverges_after_the_first_step(tmp_path):
    result = check("kp_zoo.norms.StaleWeightLayerNorm", tmp_path)
    assert result["verdict"] == "diverging"
    last = result["phases"][-1]
    assert last["phase"] == "after optimizer step 1"
    assert last["diverging"][0]["what"] == "site norm1"
    assert not result["phases"][0]["diverging"]  # the first forward and backward agree


def test_statistics_cached_at_the_first_forward_diverge_in_the_first_backward(tmp_path):
    """kp_zoo's CachingLayerNorm detaches its statistics: no site's output differs in the first
    forward, its backward does: norm2's input gradient (the first the backward reaches)."""
    result = check("kp_zoo.norms.CachingLayerNorm", tmp_path, steps=1)
    first = result["phases"][-1]
    assert (result["verdict"], first["phase"]) == ("diverging", "in the first forward and backward")
    assert first["diverging"][0]["what"] == "site norm2 (input gradient)"
    assert not any(d["what"] in ("site norm1", "site norm2") for d in first["diverging"])


@pytest.mark.slow  # two children: ~6 s
def test_check_model_exit_codes_and_json(tmp_path, capsys):
    stale = layer_norm_lock("kp_zoo.norms.StaleWeightLayerNorm", tmp_path / "stale.toml")
    args = ["check-model", BLOCK, "--trust", "kp_zoo", "--steps", "2"]
    code, out, _ = run_cli([*args, "--lock", stale, "--json", "--no-timing"], capsys)
    body = json.loads(out)  # strict: no NaN or Infinity
    assert code == 3 and body["verdict"] == "diverging"
    assert body["timing"] is None and body["notes"][0] == NOT_TIMED  # the verdict only
    assert body["first"]["phase"] == "after optimizer step 1"
    assert body["first"]["what"] == "site norm1"
    good = layer_norm_lock("kp_zoo.norms.GoodLayerNorm", tmp_path / "good.toml")
    code, out, _ = run_cli([*args, "--lock", good], capsys)
    assert code == 0, out
    assert "agree in every phase (7)" in out and "x per step (" in out


def test_bad_steps_and_a_bad_lock_fail_before_any_child(tmp_path, capsys):
    code, _, err = run_cli(["check-model", BLOCK, "--lock", tmp_path / "none.toml"], capsys)
    assert code == 5 and "no such file" in err
    lock = layer_norm_lock("kp_zoo.norms.GoodLayerNorm", tmp_path / "good.toml")
    code, _, err = run_cli(["check-model", BLOCK, "--lock", lock, "--steps", "0"], capsys)
    assert code == 2 and "--steps 0" in err
    code, _, err = run_cli(["check-model", "nowhere.py:build", "--lock", lock], capsys)
    assert code == 2 and "does not exist" in err


@pytest.mark.slow  # a child: ~3 s
def test_a_class_the_child_cannot_import_is_the_locks_error(tmp_path, capsys):
    lock = layer_norm_lock("kp_zoo.norms.NoSuchLayerNorm", tmp_path / "bad.toml")
    code, _, err = run_cli(["check-model", BLOCK, "--lock", lock, "--trust", "kp_zoo"], capsys)
    assert code == 3 and "NoSuchLayerNorm" in err


def test_a_model_on_the_meta_device_is_neither_checked_nor_timed(tmp_path):
    (tmp_path / "meta.py").write_text(
        "import torch\n"
        "def build():\n"
        "    with torch.device('meta'):\n"
        "        return torch.nn.LayerNorm(8), (torch.randn(2, 8),)\n"
    )
    lock = layer_norm_lock("kp_zoo.norms.GoodLayerNorm", tmp_path / "good.toml")
    spec = parse_spec(f"{tmp_path}/meta.py:build").to_json()
    result = check_model({"spec": spec, "lock": str(lock), "trust": ["kp_zoo"], "steps": 1})
    assert (result["verdict"], result["timing"]) == ("not-run", None)
    assert "meta device" in result["why"]


def test_the_written_model_raising_is_the_models_error_not_a_divergence(tmp_path):
    lock = layer_norm_lock("kp_zoo.norms.GoodLayerNorm", tmp_path / "good.toml")
    spec = parse_spec(f"{ROOT}/tests/models/broken.py:forward_raises").to_json()
    with pytest.raises(ModelCodeError, match="in the first forward and backward, the model as "):
        check_model({"spec": spec, "lock": str(lock), "trust": ["kp_zoo"], "steps": 1})


def test_the_device_is_the_one_the_lock_was_probed_on_unless_chosen(tmp_path):
    from kernel_probe.model.check import device_for

    cpu = kernel_lock.load(layer_norm_lock("kp_zoo.norms.GoodLayerNorm", tmp_path / "c.toml"))
    assert device_for(cpu, "") == ("cpu", "the lock was probed on cpu")
    assert device_for(cpu, "cuda") == ("cuda", "--device")
    for probed, device in (("cuda", "cuda"), ("rocm", "cuda"), ("mps", "cpu")):
        env = Environment(fields={"device-type": EnvField(value=probed, match="exact")})
        gpu = KernelLock(created_by="test", environment=env, slots={})
        assert device_for(gpu, "")[0] == device
    assert "pass --device cuda" in device_for(gpu, "")[1]  # mps: not a device the check runs on


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the cuda path runs")
def test_a_device_not_here_is_refused_before_the_model_is_built(tmp_path, capsys):
    lock = layer_norm_lock("kp_zoo.norms.GoodLayerNorm", tmp_path / "good.toml")
    request = {"spec": parse_spec(BLOCK).to_json(), "lock": str(lock), "trust": ["kp_zoo"]}
    answer = check_model(request | {"device": "cuda"})
    assert answer["verdict"] == "device-absent" and "no GPU" in answer["why"]
    args = ["check-model", BLOCK, "--lock", lock, "--trust", "kp_zoo", "--device", "cuda"]
    code, _, err = run_cli(args, capsys)
    assert code == 3 and "check-model on cuda (--device)" in err and "--device cpu" in err


def test_a_lock_whose_step_raises_diverges_and_is_not_timed(tmp_path, monkeypatch):
    """A LayerNorm whose backward raises (as anemoi's checkpointing does on a stale copy): the
    phase diverges naming the error, and the timed step, which raises too, is skipped, said so."""
    (tmp_path / "kp_raising.py").write_text(
        "import torch\n"
        "class _Raise(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        return x.clone()\n"
        "    @staticmethod\n"
        "    def backward(ctx, g):\n"
        "        raise RuntimeError('no backward here')\n"
        "class RaisingLayerNorm(torch.nn.LayerNorm):\n"
        "    def forward(self, x):\n"
        "        return _Raise.apply(super().forward(x))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    pins = {"LayerNorm": "kp_raising.RaisingLayerNorm"}
    lock = pinned_lock(tmp_path / "raising.toml", pins, trusted=("kp_raising",))
    request = {"spec": parse_spec(BLOCK).to_json(), "lock": str(lock), "trust": ["kp_raising"]}
    result = check_model(request | {"steps": 1})
    assert result["verdict"] == "diverging" and result["timing"] is None
    assert result["phases"][-1]["diverging"][0]["what"].startswith("raised RuntimeError")
    assert result["notes"][0] == "not timed: the training step raised RuntimeError"


def test_no_timing_is_said_on_the_step_time_line(capsys):
    result = Check(
        spec=BLOCK, lock="l.toml", steps=1, verdict="agree", phases=(), sites=("norm1",),
        timing=None, notes=(NOT_TIMED,),
    )  # fmt: skip
    render_check(result)
    out = capsys.readouterr().out
    assert "step time: not timed: --no-timing\n" in out and f"note: {NOT_TIMED}" in out
