"""What a kernel changes besides its numbers: initialisation, parameter layout, determinism, the
output dtype judged by its consequence, and the time one hanging library may cost."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import replace

import pytest
import torch

import kernel_lock
from kernel_lock import LockWarning
from kernel_lock.checkpoint import migrate_state_dict
from kernel_probe import candidates as cands
from kernel_probe.errors import ProbeError
from kernel_probe.isolation.worker import PING, Worker
from kernel_probe.probe import onetensor
from kernel_probe.probe.check import check_all, check_candidate
from kernel_probe.probe.choose import choose
from kernel_probe.probe.judge import Policy
from kernel_probe.probe.limits import IMPORT_TIMEOUT
from tests.conftest import run_cli, small_probe

PLAN = [("float32", "true"), ("bfloat16", "mixed")]


@pytest.fixture(scope="module")
def worker():
    with Worker() as w:
        w.call(PING)
        yield w


def check(worker, spec: str, policy: Policy = Policy(), baseline=None, plan=PLAN, **kw):
    cand = cands.from_command_line(spec)
    return check_candidate(
        cand, cand.slots[0], "cpu", plan, worker, policy=policy, baseline=baseline, **kw
    )


# ---- initialisation ------------------------------------------------------------------------------
@pytest.mark.slow
def test_random_init_bias_is_rejected_naming_the_parameter(worker):
    r = check(worker, "LayerNorm=kp_zoo.norms.RandnBiasLayerNorm")
    # right to rounding
    assert r.status == "rejected" and all(v.status == "accepted" for v in r.verdicts)
    assert r.reasons[0].startswith("initialisation differs from torch.nn's")
    assert (
        "bias starts as values with mean" in r.reasons[0]
        and "torch.nn starts as zeros" in r.reasons[0]
    )
    assert (
        "--allow-init-change" in r.reasons[0]
        and "weight" not in r.reasons[0].split(":", 1)[1].split(";")[0][:8]
    )


def test_init_change_accepted_on_request_and_recorded(worker):
    r = check(worker, "LayerNorm=kp_zoo.norms.RandnBiasLayerNorm", Policy(allow_init_change=True))
    assert r.status == "accepted"
    assert len(r.changes) == 1 and r.changes[0].startswith("initialisation: bias starts as values")
    assert "accepted with --allow-init-change" in r.changes[0]


def test_an_adapter_restoring_torch_init_passes(worker):
    r = check(worker, "LayerNorm=kp_zoo.adapted.RandnBiasLayerNormTorchInit")
    assert r.status == "accepted" and r.changes == [] and r.migration == ()


@pytest.mark.slow
def test_random_init_compared_by_distribution(worker):
    # torch.nn.Linear draws U(-1/sqrt(in), 1/sqrt(in)); transformer-engine's N(0, 0.023) and a zero
    # bias
    r = check(worker, "Linear=kp_zoo.norms.NormalInitLinear")
    assert r.status == "rejected"
    text = r.reasons[0]
    assert (
        "weight starts as values" in text
        and "beyond torch.nn's bound" in text
        and "Kolmogorov-Smirnov" in text
    )
    assert (
        "bias starts as zeros; torch.nn draws values" in text
        and "false-alarm rate of 1e-06" in text
    )
    # a correct init, drawn independently, passes the same tests
    assert check(worker, "Linear=kp_zoo.norms.GoodLinear").status == "accepted"


# ---- parameter layout ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec,rules",
    [
        (
            "LayerNorm=kp_zoo.norms.GammaBetaLayerNorm",
            ["rename:gamma->weight", "rename:beta->bias"],
        ),
        ("Linear=kp_zoo.norms.TransposedLinear", ["transpose:weight"]),
    ],
)
@pytest.mark.slow
def test_renamed_and_transposed_parameters_are_accepted_with_a_migration(worker, spec, rules):
    r = check(worker, spec)
    assert r.status == "accepted", r.reasons
    assert (
        list(r.migration) == rules
        and r.twin["state_dict"] == "migrate"
        and r.twin["migration"] == rules
    )
    assert r.twin["max_error"] < 1e-6


def test_no_mapping_is_said_as_such_not_as_a_numeric_error(worker):
    r = check(worker, "LayerNorm=kp_zoo.norms.OddLayoutLayerNorm")
    assert r.status == "rejected" and len(r.reasons) == 1
    assert r.reasons[0].startswith("layout: its state dict does not take torch.nn's keys")
    assert (
        "missing weight (1000,), bias (1000,)" in r.reasons[0]
        and "unexpected scale (1001,)" in r.reasons[0]
    )
    assert "error" not in r.reasons[0] and r.verdicts == []


@pytest.mark.slow
def test_the_inference_twin_loads_a_state_dict_through_the_migration(tmp_path, capsys):
    lock_path = tmp_path / "lock.toml"
    code, _, err = run_cli(
        [
            "--out",
            lock_path,
            *small_probe("LayerNorm", "Linear"),
            "--candidate",
            "LayerNorm=kp_zoo.norms.GammaBetaLayerNorm",
            "--pin",
            "LayerNorm=custom:kp_zoo.norms.GammaBetaLayerNorm",
            "--candidate",
            "Linear=kp_zoo.norms.TransposedLinear",
            "--pin",
            "Linear=custom:kp_zoo.norms.TransposedLinear",
        ],
        capsys,
    )
    assert code == 0, err
    lock = kernel_lock.load(lock_path)
    assert lock.slots["LayerNorm"].twin.migration == ("rename:gamma->weight", "rename:beta->bias")
    assert lock.slots["Linear"].twin.migration == ("transpose:weight",)
    # trained with the library...
    torch.manual_seed(0)
    train = torch.nn.Sequential(
        lock.factory("Linear")(32, 16), lock.factory("LayerNorm")(16), lock.factory("Linear")(16, 4)
    )
    with torch.no_grad():
        for p in train.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(5, 32)
    expected = train(x)
    # ... run where the library is missing: inference substitutes the twins, and the state dict
    # migrates
    gone = lock.slots["LayerNorm"].requires + (
        kernel_lock.schema.Requirement(name="kp-no-such-distribution"),
    )
    absent = replace(
        lock, slots={name: replace(s, requires=gone) for name, s in lock.slots.items()}
    ).sealed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        infer = torch.nn.Sequential(
            absent.factory("Linear", mode="inference")(32, 16),
            absent.factory("LayerNorm", mode="inference")(16),
            absent.factory("Linear", mode="inference")(16, 4),
        )
    assert [type(m) for m in infer] == [torch.nn.Linear, torch.nn.LayerNorm, torch.nn.Linear]
    state = migrate_state_dict(train.state_dict(), absent, infer)
    assert set(state) == {"0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"}
    infer.load_state_dict(state, strict=True)
    torch.testing.assert_close(infer(x), expected, rtol=1e-5, atol=1e-6)


# ---- determinism ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_varying_reduction_order_is_recorded_as_not_deterministic(worker):
    r = check(worker, "LayerNorm=kp_zoo.norms.UnorderedSumLayerNorm")
    assert r.status == "accepted" and r.deterministic is False
    assert all(v.deterministic is False for v in r.verdicts)
    assert any(
        "differ between two runs on the same input" in n for v in r.verdicts for n in v.notes
    )
    assert check(worker, "LayerNorm=kp_zoo.norms.GoodLayerNorm").deterministic is True


def test_the_repeat_runs_at_the_checks_rows_under_triton_interpret(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert onetensor.determinism_rows() == onetensor.DETERMINISM_ROWS == 512
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert onetensor.determinism_rows() == onetensor.CHECK_ROWS < 512


@pytest.mark.slow
def test_under_triton_interpret_the_smaller_repeat_still_catches_a_varying_kernel():
    # one worker whose environment asks for Triton's interpreter: the repeat's 37 rows are enough
    # to see a reduction whose order changes from call to call
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    with Worker(env) as interpreted:
        plan = [("float32", "true")]
        r = check(interpreted, "LayerNorm=kp_zoo.norms.UnorderedSumLayerNorm", plan=plan)
        assert r.deterministic is False, r.verdicts
        assert check(interpreted, "LayerNorm=kp_zoo.norms.GoodLayerNorm", plan=plan).deterministic


@pytest.mark.slow
def test_deterministic_excludes_it_and_refuses_a_pin(tmp_path, capsys):
    common = [
        *small_probe("LayerNorm"),
        "--candidate",
        "LayerNorm=kp_zoo.norms.UnorderedSumLayerNorm",
    ]
    code, _, err = run_cli(
        [
            "--out",
            tmp_path / "a.toml",
            *common,
            "--deterministic",
            "--pin",
            "LayerNorm=custom:kp_zoo.norms.UnorderedSumLayerNorm",
        ],
        capsys,
    )
    assert code != 0 and "--deterministic, but the candidate is not bitwise repeatable" in err
    assert not (tmp_path / "a.toml").exists()
    code, _, err = run_cli(
        [
            "--out",
            tmp_path / "b.toml",
            *common,
            "--pin",
            "LayerNorm=custom:kp_zoo.norms.UnorderedSumLayerNorm",
        ],
        capsys,
    )
    assert code == 0, err
    evidence = kernel_lock.load(tmp_path / "b.toml").slots["LayerNorm"].evidence
    assert evidence and all(e["deterministic"] is False for e in evidence)  # recorded in the lock


def test_choice_keeps_only_deterministic_candidates():
    from kernel_probe.probe.report import Report, Verdict

    def report(cid, det):
        v = Verdict(cid, "cpu", "float32", "true", "accepted", deterministic=det)
        return Report(cid, cid, "LayerNorm", "layer_norm", "cpu", "accepted", verdicts=[v])

    reports = [report("torch.layer_norm", True), report("fast", False)]
    timings = {
        "torch.layer_norm": [{"shape": "8x8", "median_ms": 1.0}],
        "fast": [{"shape": "8x8", "median_ms": 0.2, "pairs": [[1.0, 0.2]] * 7}],
    }
    assert (
        choose("LayerNorm", reports, timings, ["8x8"], "float32", "torch.layer_norm").report.id
        == "fast"
    )
    assert (
        choose(
            "LayerNorm",
            reports,
            timings,
            ["8x8"],
            "float32",
            "torch.layer_norm",
            deterministic=True,
        ).report.id
        == "torch.layer_norm"
    )
    with pytest.raises(
        ProbeError, match="no candidate for LayerNorm was accepted, deterministic and timed"
    ):
        choose(
            "LayerNorm",
            reports[1:],
            timings,
            ["8x8"],
            "float32",
            "torch.layer_norm",
            deterministic=True,
        )


# ---- output dtype by consequence -----------------------------------------------------------------
CUDA_POLICY = replace(cands.default_for("LayerNorm"), target="kp_zoo.norms.CudaPolicyLayerNorm")


def test_bf16_output_under_cuda_autocast_policy_is_accepted_by_consequence(worker):
    # torch.nn.LayerNorm under CUDA autocast returns float32; this kernel returns the input dtype
    r = check(worker, "LayerNorm=kp_zoo.norms.GoodLayerNorm", baseline=CUDA_POLICY)
    mixed = next(v for v in r.verdicts if v.regime == "mixed")
    assert r.status == "accepted" and mixed.status == "accepted"
    [change] = [c for c in r.changes if "output dtype" in c]
    assert change.startswith(
        "bfloat16/mixed: output dtype bfloat16 (torch.nn: float32) for bfloat16 input under "
        "autocast"
    )
    assert (
        "accepted by consequence (pre-norm block error ratio" in change
        and "post-norm block error ratio" in change
    )


def test_strict_dtype_keeps_the_old_rule(worker):
    r = check(
        worker,
        "LayerNorm=kp_zoo.norms.GoodLayerNorm",
        Policy(strict_dtype=True),
        baseline=CUDA_POLICY,
    )
    assert r.status == "rejected"
    assert (
        "output dtype bfloat16 (torch.nn: float32) for bfloat16 input under autocast "
        "(--strict-dtype)" in r.reasons[0]
    )


def test_a_dtype_change_that_hurts_is_rejected_with_the_block_figures(worker):
    r = check(worker, "LayerNorm=kp_zoo.norms.CoarseOutputLayerNorm", baseline=CUDA_POLICY)
    mixed = next(v for v in r.verdicts if v.regime == "mixed")
    assert r.status == "rejected" and "output-dtype" in mixed.failed
    text = " ".join(mixed.reasons)
    assert (
        "changes the blocks a norm sits in" in text
        and "post-norm block y error" in text
        and "tolerance" in text
    )


@pytest.mark.slow
def test_the_accepted_change_reaches_the_lock(tmp_path, capsys):
    code, _, err = run_cli(
        [
            "--out",
            tmp_path / "l.toml",
            *small_probe("LayerNorm"),
            "--allow-init-change",
            "--candidate",
            "LayerNorm=kp_zoo.norms.RandnBiasLayerNorm",
            "--pin",
            "LayerNorm=custom:kp_zoo.norms.RandnBiasLayerNorm",
        ],
        capsys,
    )
    assert code == 0, err
    slot = kernel_lock.load(tmp_path / "l.toml").slots["LayerNorm"]
    assert len(slot.changes) == 1 and slot.changes[0].startswith(
        "initialisation: bias starts as values"
    )
    assert kernel_lock.load(tmp_path / "l.toml").lock_version == kernel_lock.LOCK_VERSION


# ---- time budget ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_hanging_import_costs_the_import_budget_not_minutes():
    """The default budget is under half a minute; the check waits out the budget it is given (3 s
    here, so the suite does not sit through the default's 20 s) and no more."""
    assert IMPORT_TIMEOUT <= 30
    budget = 3.0
    start = time.perf_counter()
    with Worker() as w:
        w.call(PING)
        r = check(w, "LayerNorm=kp_zoo.hang_on_import.X", import_timeout=budget)
    elapsed = time.perf_counter() - start
    assert r.status == "timeout" and f"import budget {budget:g} s" in r.reasons[0]
    assert r.seconds is not None and budget <= r.seconds < budget + 10
    assert elapsed < 60  # well under a minute of job start, the worker's restart included


@pytest.mark.slow
def test_each_candidate_reports_its_time(worker):
    r = check(worker, "LayerNorm=kp_zoo.norms.GoodLayerNorm")
    assert (
        r.seconds is not None
        and 0 < r.seconds < 30
        and r.to_json()["seconds"] == round(r.seconds, 3)
    )


# ---- one candidate poisoning the next one's verdict (hostile input, issue 14) --------------------
@pytest.mark.slow  # a worker per library: seconds
def test_a_library_leaving_a_mode_on_torchs_stack_is_refused():
    """torch.set_default_device at import leaves a TorchFunctionMode on the stack, which every later
    call of its worker goes through: refused as tampering, as a replaced torch function is; torch's
    own candidate, in a worker of its own, is judged as ever."""
    offered = [cands.from_command_line("LayerNorm=kp_default_device.DefaultDeviceLayerNorm")]
    candidates, _ = cands.registry(offered, entry_points=False)
    reports = {
        r.id: r
        for r in check_all(["LayerNorm"], candidates, "cpu", [("float32", "true")])["LayerNorm"]
    }
    left = reports["custom:kp_default_device.DefaultDeviceLayerNorm"]
    assert left.status == "rejected", left.reasons
    assert left.reasons[0].startswith(
        "importing kp_default_device.DefaultDeviceLayerNorm replaced torch's own TorchFunctionMode "
        "stack"
    ), left.reasons
    assert reports["torch.layer_norm"].status == "accepted"


@pytest.mark.slow
def test_a_library_patching_torch_is_refused_and_cannot_poison_another(tmp_path, capsys):
    offered = [
        cands.from_command_line("LayerNorm=kp_poison.PoisonLayerNorm"),
        cands.from_command_line("LayerNorm=kp_affine.AffineIdentity"),
    ]
    candidates, _ = cands.registry(offered, entry_points=False)
    reports = {
        r.id: r
        for r in check_all(["LayerNorm"], candidates, "cpu", [("float32", "true")])["LayerNorm"]
    }
    poison = reports["custom:kp_poison.PoisonLayerNorm"]
    assert (
        poison.status == "rejected"
        and "replaced torch's own torch.nn.functional.layer_norm" in poison.reasons[0]
    )
    affine = reports["custom:kp_affine.AffineIdentity"]
    # judged against the real reference
    assert affine.status == "rejected" and "y error" in " ".join(affine.reasons)
    assert reports["torch.layer_norm"].status == "accepted"
    # and --prefer cannot write it into a lock
    code, _, err = run_cli(
        [
            "--out",
            tmp_path / "k.toml",
            *small_probe("LayerNorm"),
            "--candidate",
            "LayerNorm=kp_poison.PoisonLayerNorm",
            "--candidate",
            "LayerNorm=kp_affine.AffineIdentity",
            "--prefer",
            "LayerNorm=custom:kp_affine.AffineIdentity",
        ],
        capsys,
    )
    assert code != 0 and "rejected" in err and not (tmp_path / "k.toml").exists()
