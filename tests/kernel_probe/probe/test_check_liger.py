"""liger-kernel's real LayerNorm and RMSNorm through the probe's own checks, on this CPU, in
Triton's interpreter (issue 26, point 2).

On a CPU the registry's liger candidates are gated (``devices = cuda, rocm, xpu``: tried once, "0
active drivers", unavailable), and that gate is not touched. Here the same candidates, with ``cpu``
added to their devices and their target pointing at ``tests.liger_interpret_shims`` (which applies
two version-pinned interpreter shims and hands back the *real* class), go through
``check_candidate``, the function ``kernel-probe`` and ``kernel-probe check`` use, in a probe worker
started with ``TRITON_INTERPRET=1``: the same hard inputs, float64 reference, torch.nn baseline,
tolerance model, flags, layout, initialisation and twin checks. bf16 is left out: the interpreter
computes it wrongly.

Every such run is labelled interpreted (report, verdicts), a worker under the interpreter refuses to
time, and the chooser never takes an interpreted candidate: the fast tests at the end check those
rules without liger.

Cost: one worker, ~3 s of CPU per checked (dtype, regime) row on an idle machine (the repeat runs
on the check's 37 rows under the interpreter, not 512: ~9 s before), 12 rows in all; the slow lane
only.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from kernel_probe.candidates import Candidate, builtin
from kernel_probe.isolation.protocol import (
    FLAG_GRAD_OUTPUT_MODIFIED,
    INTERPRETED,
    TimeReply,
    TimeRequest,
    interpreter_requested,
)
from kernel_probe.isolation.worker import Worker, interpreting
from kernel_probe.probe.check import check_candidate
from kernel_probe.probe.report import Report

HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None
needs_liger = pytest.mark.skipif(
    not HAS_LIGER,
    reason="liger-kernel is not installed (pip install -e '.[liger]'; CI installs it)",
)

SHIMS = "tests.liger_interpret_shims"
# fp32, and fp16 plain and under autocast: the interpreter's bf16 is wrong (see the shims'
# docstring)
PLAN = (("float32", "true"), ("float16", "true"), ("float16", "mixed"))
FP32 = (("float32", "true"),)
CHECK_BUDGET = 1200.0  # a safety net against a hang: a row takes ~3 s of CPU, more on a shared CPU
BY_ID = {c.id: c for c in builtin()}


EPS = {"eps": 1e-6}  # an RMSNorm's eps the model sets (liger's default)


@dataclass(frozen=True)
class Case:
    """One candidate checked in the interpreter: the registry's, made runnable on this CPU."""

    name: str
    slot: str
    builtin: str  # the registry candidate it is
    shim: str  # the class name in tests.liger_interpret_shims (the real class)
    plan: tuple[tuple[str, str], ...] = PLAN
    kwargs: Mapping[str, Any] | None = None  # None: the registry's pinned kwargs
    args: tuple[str, ...] | None = None
    canonical: Mapping[str, Any] = field(default_factory=dict)

    def candidate(self) -> Candidate:
        base = BY_ID[self.builtin]
        return dataclasses.replace(
            base,
            id=self.name,
            target=f"{SHIMS}.{self.shim}",
            devices=(*base.devices, "cpu"),
            kwargs=dict(base.kwargs if self.kwargs is None else self.kwargs),
            args=base.args if self.args is None else self.args,
        )


CASES = (
    # the registry's candidates with their pinned kwargs (LigerRMSNorm: in_place = false)
    Case("liger.layer_norm", "LayerNorm", "liger.layer_norm", "LigerLayerNorm"),
    # (for a model whose RMSNorm sets an eps: liger's kernel takes no eps=None, torch's default)
    Case("liger.rms_norm", "RMSNorm", "liger.rms_norm", "LigerRMSNorm", canonical=EPS),
    # liger's own default, in_place=True: its backward writes into grad_output
    Case(
        "liger.rms_norm[in_place=True]",
        "RMSNorm",
        "liger.rms_norm",
        "LigerRMSNorm",
        FP32,
        {"eps": "$eps"},
        canonical=EPS,
    ),
    # a model whose RMSNorm has torch's eps=None: liger is judged on it (issue 53)
    Case("liger.rms_norm[torch eps=None]", "RMSNorm", "liger.rms_norm", "LigerRMSNorm", FP32),
    # LigerLayerNorm(bias=True) draws its fresh bias from randn
    Case(
        "liger.layer_norm[bias=True]",
        "LayerNorm",
        "liger.layer_norm",
        "LigerLayerNorm",
        FP32,
        {"eps": "$eps", "bias": True},
    ),
    # a model whose LayerNorm has no bias: LigerLayerNorm always has one (stops at the layout, no
    # rows run)
    Case(
        "liger.layer_norm[torch bias=False]",
        "LayerNorm",
        "liger.layer_norm",
        "LigerLayerNorm",
        FP32,
        canonical={"bias": False},
    ),
    # the adapters kernel_lock ships for anemoi's call convention, built as anemoi builds them
    Case(
        "adapter:LigerLayerNormAnemoi",
        "LayerNorm",
        "liger.layer_norm",
        "LigerLayerNormAnemoi",
        FP32,
        args=("$normalized_shape",),
    ),
    Case(
        "adapter:LigerRMSNormAnemoi",
        "RMSNorm",
        "liger.rms_norm",
        "LigerRMSNormAnemoi",
        FP32,
        args=("$normalized_shape",),
        canonical=EPS,
    ),
    Case(
        "adapter:AutocastLigerLayerNormAnemoi",
        "LayerNorm",
        "liger.layer_norm",
        "AutocastLigerLayerNormAnemoi",
        (("float16", "mixed"),),
        args=("$normalized_shape",),
    ),
)


@dataclass
class Run:
    reports: dict[str, Report]
    gate: dict[str, Report]
    timed: TimeReply
    seconds: float


@pytest.fixture(scope="module")
def run() -> Run:
    from tests.liger_interpret_shims import version_problem

    problem = version_problem()
    if problem:  # not a skip: CI installs these, and a new release must be re-measured, loudly
        pytest.fail(problem)
    start = time.perf_counter()
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    # one worker for the library, as WorkerPool gives liger's candidates
    # the shims are a module of the checkout, named as a --candidate from the working directory is
    with Worker(env, local=("tests",)) as worker:
        # first, before any shim is applied in this worker: the registry's candidates, gate and all
        gate = {
            cid: check_candidate(BY_ID[cid], slot, "cpu", list(PLAN), worker)
            for cid, slot in (("liger.layer_norm", "LayerNorm"), ("liger.rms_norm", "RMSNorm"))
        }
        reports = {
            case.name: check_candidate(
                case.candidate(),
                case.slot,
                "cpu",
                list(case.plan),
                worker,
                timeout=CHECK_BUDGET,
                import_timeout=120,
                canonical=case.canonical,
            )
            for case in CASES
        }
        request = TimeRequest(
            candidate=CASES[0].candidate().to_json(),
            slot="LayerNorm",
            device="cpu",
            shapes=("64x1000",),
            dtype="float32",
            regime="true",
        )
        timed = worker.call(request)
    return Run(reports, gate, timed, time.perf_counter() - start)


def errors_table(reports: Mapping[str, Report]) -> str:
    """Per candidate and (dtype, regime): the verdict, its worst error / tolerance, per tensor the
    largest error over the cases, the candidate's next to torch.nn's (both against float64), and
    what failed; under it, the candidate's status and first reason where it is not accepted."""
    tensors = ("y", "dx", "dweight", "dbias")
    head = f"{'candidate':<38} {'row':<14} {'verdict':<9} {'ratio':>7}  " + "".join(
        f"{t + ' (liger / torch.nn)':<27}" for t in tensors
    )
    lines = [head + "failed", "-" * (len(head) + 24)]
    for name, rep in reports.items():
        for v in rep.verdicts:
            cells = ""
            for t in tensors:
                pairs = [errs[t] for errs in v.errors.values() if t in errs]
                pair = (
                    f"{max(p[0] for p in pairs):.2e} / {max(p[1] for p in pairs):.2e}"
                    if pairs
                    else "-"
                )
                cells += f"{pair:<27}"
            ratio = "-" if v.worst_ratio is None else f"{v.worst_ratio:.3g}"
            ratio += (
                " (" + ", ".join(f"{k} {r:.2f}" for k, r in v.statistics.items()) + ")"
                if v.statistics
                else ""
            )
            lines.append(
                f"{name:<38} {v.dtype + '/' + v.regime:<14} {v.status:<9} {ratio:>7}  {cells}"
                + ", ".join(v.failed)
            )
        if not rep.verdicts:
            lines.append(f"{name:<38} {'-':<14} {'-':<9} {'-':>7}  (no rows run)")
        if rep.status != "accepted":
            lines.append(f"  -> {name} {rep.status}: {rep.reasons[0] if rep.reasons else ''}"[:220])
    lines.append("every row interpreted: TRITON_INTERPRET=1 on this CPU; never timed, never locked")
    return "\n".join(lines)


# ---- the product's gate is untouched -------------------------------------------------------------
@needs_liger
@pytest.mark.slow
@pytest.mark.parametrize("cid", ["liger.layer_norm", "liger.rms_norm"])
def test_the_device_gate_holds_under_the_interpreter(run, cid):
    """The registry's candidate on a CPU stays unavailable even with TRITON_INTERPRET=1: tried once
    (now in the interpreter, and labelled so), it fails on the first interpreter bug shim 1 is
    for."""
    r = run.gate[cid]
    assert r.status == "unavailable" and r.interpreted
    why = r.reasons[0]
    assert "this device is cpu" in why and "tried under Triton's interpreter" in why
    # measured: eps.to(...) on a Python float; RMSNorm's eps is torch's None since issue 53
    got = "'NoneType'" if cid == "liger.rms_norm" else "'float'"
    assert f"{got} object has no attribute 'to'" in why, why


# ---- the pinned kwargs: accepted in every interpreted row ----------------------------------------
@needs_liger
@pytest.mark.slow
@pytest.mark.parametrize("name", ["liger.layer_norm", "liger.rms_norm"])
def test_pinned_liger_is_accepted_in_every_row_and_labelled_interpreted(run, name):
    r = run.reports[name]
    assert r.status == "accepted", r.reasons
    assert [(v.dtype, v.regime, v.status) for v in r.verdicts] == [
        (d, g, "accepted") for d, g in PLAN
    ]
    assert r.interpreted and r.to_json()["interpreted"] is True
    for v in r.verdicts:
        assert v.notes[0] == INTERPRETED and v.to_json()["notes"][0] == INTERPRETED
        assert 0 < v.worst_ratio <= 1
        # liger's own kernel ran, not torch: its errors are not torch.nn's, case for case
        assert any(got != base for errs in v.errors.values() for got, base in errs.values())
        assert v.deterministic is True and v.out_dtype == v.dtype


@needs_liger
@pytest.mark.slow
def test_liger_default_in_place_backward_is_rejected_for_grad_output(run):
    """liger's LigerRMSNorm default (in_place=True) overwrites grad_output: why the registry pins
    in_place = false. Measured, not assumed: the flag, and the residual branch's corrupted
    gradient."""
    assert BY_ID["liger.rms_norm"].kwargs["in_place"] is False
    r = run.reports["liger.rms_norm[in_place=True]"]
    assert r.status == "rejected"
    (v,) = r.verdicts
    assert FLAG_GRAD_OUTPUT_MODIFIED in v.failed and "residual:dskip" in v.failed
    assert v.reasons[0].startswith("backward modifies grad_output in place")
    skip_err, torch_err = v.errors["residual"]["dskip"]
    assert skip_err > 0.1 and torch_err == 0.0
    # pinned: intact
    assert run.reports["liger.rms_norm"].verdicts[0].errors["residual"]["dskip"][0] == 0.0


# ---- bias and initialisation ---------------------------------------------------------------------
@needs_liger
@pytest.mark.slow
def test_bias_is_checked_and_initialised_as_torch_nn(run):
    """Built as pinned (no bias=True), LigerLayerNorm's bias starts at zeros and its weight at ones,
    as torch.nn.LayerNorm's do, and its bias gradient is checked in every case with a backward
    (not the forward-only inference and loaded cases) and row."""
    from kernel_probe.probe.lifecycle import INFERENCE, LOADED

    forward_only = (*INFERENCE, LOADED)

    r = run.reports["liger.layer_norm"]
    assert r.changes == [] and not any("initialisation" in x for x in r.reasons)
    for v in r.verdicts:
        backward = {case: errs for case, errs in v.errors.items() if case not in forward_only}
        assert all("dbias" in errs for errs in backward.values()), v.errors.keys()
        assert all(set(v.errors[case]) == {"y"} for case in forward_only), v.errors.keys()
    assert all(
        "dbias" not in errs
        for v in run.reports["liger.rms_norm"].verdicts
        for errs in v.errors.values()
    )


@needs_liger
@pytest.mark.slow
def test_liger_bias_true_is_rejected_for_its_random_initial_bias(run):
    r = run.reports["liger.layer_norm[bias=True]"]
    assert r.status == "rejected"
    assert r.reasons[0].startswith("initialisation differs from torch.nn's"), r.reasons
    assert (
        "bias starts as values with mean" in r.reasons[0]
        and "torch.nn starts as zeros" in r.reasons[0]
    )
    # its numbers are right: only the start differs
    assert [v.status for v in r.verdicts] == ["accepted"]


@needs_liger
@pytest.mark.slow
def test_a_bias_free_layer_norm_slot_is_refused_at_the_layout(run):
    r = run.reports["liger.layer_norm[torch bias=False]"]
    assert r.status == "rejected" and r.verdicts == []
    assert r.reasons[0].startswith("layout:") and "unexpected bias (1000,)" in r.reasons[0], (
        r.reasons
    )


@needs_liger
@pytest.mark.slow
def test_liger_is_judged_on_a_models_eps_none_and_never_accepted(run):
    """torch.nn.RMSNorm's eps=None (float32's machine epsilon, as torch adds it), the canonical eps:
    LigerRMSNorm is built with it, as the lock would pin it, and cannot run it (issue 53)."""
    r = run.reports["liger.rms_norm[torch eps=None]"]
    assert r.status in ("crashed", "unavailable"), r.reasons
    assert "NoneType" in r.reasons[0], r.reasons


# ---- state dict and layout -----------------------------------------------------------------------
@needs_liger
@pytest.mark.slow
@pytest.mark.parametrize("name", ["liger.layer_norm", "liger.rms_norm"])
def test_state_dict_interchanges_with_the_torch_nn_twin(run, name):
    r = run.reports[name]
    assert r.migration == ()  # keys and shapes are torch.nn's: weight (and bias) of (1000,)
    for v in r.verdicts:
        assert v.twin["state_dict"] == "interchangeable" and v.twin["migration"] == []
        # the twin loaded the candidate's state and computes the same to the row's rounding
        assert v.twin["max_error"] <= (1e-6 if v.dtype == "float32" else 2e-3), v.twin


# ---- the adapters --------------------------------------------------------------------------------
@needs_liger
@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "adapter:LigerLayerNormAnemoi",
        "adapter:LigerRMSNormAnemoi",
        "adapter:AutocastLigerLayerNormAnemoi",
    ],
)
def test_the_anemoi_adapters_run_the_real_kernels_and_pass(run, name):
    r = run.reports[name]
    assert r.status == "accepted", r.reasons
    assert r.interpreted and r.migration == () and r.changes == []
    for v in r.verdicts:
        assert v.twin["state_dict"] == "interchangeable"
        assert any(got != base for errs in v.errors.values() for got, base in errs.values())
        assert v.out_dtype == v.dtype  # AutocastLigerLayerNormAnemoi: cast back to the fp16 input


# ---- never timed ---------------------------------------------------------------------------------
@needs_liger
@pytest.mark.slow
def test_an_interpreted_worker_refuses_to_time(run):
    assert run.timed.interpreted
    assert [row["shape"] for row in run.timed.rows] == ["64x1000"]
    assert all(row["error"] == f"not timed: {INTERPRETED}" for row in run.timed.rows)
    assert not any("median_ms" in row for row in run.timed.rows)


@needs_liger
@pytest.mark.slow
def test_the_verdict_table(run, capsys):
    """The closing note's table: liger's verdicts per dtype row, errors next to torch.nn's."""
    text = errors_table(run.reports)
    for case in CASES:
        assert case.name in text
    assert (
        "-> liger.rms_norm[in_place=True] rejected: float32/true: backward modifies "
        "grad_output in place" in text
    )
    assert "-> liger.layer_norm[bias=True] rejected: initialisation differs" in text
    assert text.count(" accepted ") == 10 and text.endswith("never timed, never locked")
    with capsys.disabled():
        print(f"\n{text}\ninterpreted run: {run.seconds:.0f} s wall")


# ---- the label's rules, without liger (fast) -----------------------------------------------------
def _report(cid: str, *, interpreted: bool) -> Report:
    return Report(cid, "t", "RMSNorm", "rms_norm", "cpu", "accepted", interpreted=interpreted)


def _timings(ms: float) -> list[dict[str, Any]]:
    return [{"shape": "64x1000", "median_ms": ms, "spread": 0.0}]


def test_an_interpreted_report_is_never_chosen_nor_pinned():
    from kernel_probe.errors import ForcedUnusable
    from kernel_probe.probe.choose import choose

    reports = [
        _report("torch.rms_norm", interpreted=False),
        _report("liger.rms_norm", interpreted=True),
    ]
    # even timed, and far faster, it is not eligible
    timings = {"torch.rms_norm": _timings(1.0), "liger.rms_norm": _timings(0.1)}
    c = choose("RMSNorm", reports, timings, ["64x1000"], "float32", "torch.rms_norm")
    assert c.report.id == "torch.rms_norm" and c.how == "default"
    c = choose(
        "RMSNorm",
        reports,
        timings,
        ["64x1000"],
        "float32",
        "torch.rms_norm",
        prefer=["liger.rms_norm"],
        strict_prefer=False,
        origin="profile p",
    )
    assert c.report.id == "torch.rms_norm"
    for forced in ({"pin": "liger.rms_norm"}, {"prefer": "liger.rms_norm"}):
        with pytest.raises(ForcedUnusable) as exc:
            choose("RMSNorm", reports, timings, ["64x1000"], "float32", "torch.rms_norm", **forced)
        assert INTERPRETED in str(exc.value) and "TRITON_INTERPRET" in exc.value.fix
        assert exc.value.exit_code == 3


def test_the_probe_does_not_ask_to_time_an_interpreted_candidate(monkeypatch):
    import contextlib

    from kernel_probe.probe import check as checker

    class NoCalls:
        def call(self, *args, **kwargs):
            raise AssertionError(
                f"the probe asked an interpreted candidate's worker for {args[0]!r}"
            )

    class Pool:
        def prepare(self, ahead=None):
            pass  # nothing starts: the candidate's check is replaced above

        @contextlib.contextmanager
        def worker_for(self, cand):
            yield NoCalls()

    monkeypatch.setattr(
        checker, "check_candidate", lambda *a, **k: _report("liger.rms_norm", interpreted=True)
    )
    timing = checker.Timing(("64x1000",), "float32", "true", 1)
    (done,) = checker.check_and_time(
        {"RMSNorm": [BY_ID["liger.rms_norm"]]},
        checker.Checks("cpu", [("float32", "true")], timeout=1.0, import_timeout=1.0),
        Pool(),  # type: ignore[arg-type]
        timing=timing,
    )
    assert done.report.interpreted and done.report.status == "accepted" and done.timings is None


@pytest.mark.parametrize(
    ("value", "on"),
    [
        ("1", True),
        ("true", True),
        ("ON", True),
        ("yes", True),
        ("0", False),
        ("", False),
        ("2", False),
    ],
)
def test_interpreter_requested_reads_the_variable_as_triton_does(value, on):
    assert interpreter_requested({"TRITON_INTERPRET": value}) is on
    assert interpreter_requested({}) is False


def test_interpreting_asks_triton_and_only_once_it_is_imported(monkeypatch):
    import sys
    import types

    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert interpreting() is False  # no Triton kernel can have run
    for interpret in (True, False):
        fake = types.SimpleNamespace(
            knobs=types.SimpleNamespace(runtime=types.SimpleNamespace(interpret=interpret))
        )
        monkeypatch.setitem(sys.modules, "triton", fake)
        assert interpreting() is interpret  # triton's own answer, whatever the variable says


def test_the_check_table_labels_an_interpreted_report(capsys):
    from kernel_probe import output
    from kernel_probe.commands.check import render_verdicts
    from kernel_probe.probe.report import Verdict

    rep = _report("liger.rms_norm", interpreted=True)
    rep.verdicts = [
        Verdict("liger.rms_norm", "cpu", "float32", "true", "accepted", worst_ratio=0.3)
    ]
    output.reset()
    render_verdicts({"RMSNorm": [rep]}, [("float32", "true")], {"type": "cpu", "name": "cpu"})
    out = capsys.readouterr().out
    output.reset()
    assert "accepted (interpreted)" in out and "never timed and never written to a lock" in out


def test_a_probe_under_the_interpreter_warns_before_any_work(monkeypatch):
    from kernel_probe.probe import planning

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    p = planning.plan(planning.ProbeRequest(slots=("RMSNorm",)))
    assert any(
        "TRITON_INTERPRET is set" in problem and "never written to the lock" in problem
        for problem in p.problems
    )
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not any(
        "TRITON_INTERPRET" in problem for problem in planning.plan(planning.ProbeRequest()).problems
    )
