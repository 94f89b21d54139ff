"""kernel_probe.probe.correctness: the worker's raw measurements, step by step (in-process, tiny CPU
tensors).

A full row (every hard case of ``onetensor.cases``) takes a second even on a tiny hidden size, so
the rows themselves are measured through the worker by the slow judge tests; here each step is run
on its own: the early stops (import, baseline, build, layout, blas), the set-up of a row, and the
bookkeeping helpers.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch

from kernel_probe import candidates as cands
from kernel_probe.isolation.protocol import (
    ALT_PREFIX,
    FLAG_GRAD_OUTPUT_MODIFIED,
    FLAG_INPUT_MODIFIED,
    FLAG_OUTPUT_DTYPE,
)
from kernel_probe.probe import correctness, measure, onetensor
from kernel_probe.probe.correctness import Bench, Row, check
from kernel_probe.probe.layout import discover
from kernel_probe.probe.onetensor import BlasNotOffered
from kernel_probe.slots import slot

HIDDEN = 16


def offered(spec: str):
    return cands.from_command_line(spec)


def bench(cid_or_spec: str = "torch.layer_norm", device: str = "cpu", seed: int = 0) -> Bench:
    cand = (
        offered(cid_or_spec)
        if "=" in cid_or_spec
        else next(c for c in cands.builtin() if c.id == cid_or_spec)
    )
    slot = cand.slots[0]
    return Bench(cand, slot, device, HIDDEN, None, seed, cands.default_for(slot))


# ---- check: the steps before any row -------------------------------------------------------------
@pytest.mark.parametrize(
    "spec,kind,error",
    [
        (
            "LayerNorm=kp_zoo.missing_dependency.FastLayerNorm",
            "import",
            "ModuleNotFoundError: No module named 'kp_this_dependency_does_not_exist'",
        ),
        (
            "LayerNorm=kp_zoo.raise_on_import.FastLayerNorm",
            "exception",
            "RuntimeError: CUDA driver initialization failed: this library is broken here",
        ),
        ("LayerNorm=kp_zoo.norms.NoSuchLayerNorm", "exception", "AttributeError: "),
    ],
    ids=["absent", "broken", "no-such-class"],
)
def test_an_import_that_fails_stops_at_import(spec, kind, error):
    reply = check(offered(spec), "LayerNorm", "cpu", [("float32", "true")], hidden=HIDDEN)
    assert (reply.phase, reply.kind) == ("import", kind) and reply.error.startswith(error)
    assert reply.rows == [] and reply.layout is None and reply.import_s is None
    assert reply.candidate == f"custom:{spec.split('=')[1]}" and reply.device == "cpu"


def test_a_baseline_that_cannot_be_built_stops_at_baseline():
    baseline = replace(cands.default_for("LayerNorm"), target="kp_zoo.norms.NoSuchBaseline")
    reply = check(
        cands.default_for("LayerNorm"), "LayerNorm", "cpu", [], hidden=HIDDEN, baseline=baseline
    )
    assert reply.phase == "baseline" and reply.kind == ""
    assert reply.error.startswith("torch.nn itself cannot be built on cpu: AttributeError: ")
    assert reply.import_s is not None and reply.import_s >= 0  # the candidate itself imported


def test_a_candidate_that_cannot_be_built_stops_at_build_with_its_traceback():
    # a Linear's class offered as a LayerNorm: its constructor does not take a LayerNorm's arguments
    reply = check(
        offered("LayerNorm=kp_zoo.norms.GoodLinear"), "LayerNorm", "cpu", [], hidden=HIDDEN
    )
    assert reply.phase == "build" and reply.error.startswith("TypeError: ")
    assert "Traceback" in reply.traceback and len(reply.traceback) <= 2000
    assert reply.layout is None


def test_no_layout_mapping_means_no_numerics():
    reply = check(
        offered("LayerNorm=kp_zoo.norms.OddLayoutLayerNorm"),
        "LayerNorm",
        "cpu",
        [("float32", "true")],
    )
    assert reply.phase == "" and reply.rows == [] and reply.init == []
    assert reply.layout["ok"] is False and reply.layout["unexpected"] == ["scale (1001,)"]
    assert reply.layout["missing"] == [
        "weight (1000,)",
        "bias (1000,)",
    ]  # at the checks' size (limits.CHECK_HIDDEN)


@pytest.mark.parametrize(
    "spec,rules,init",
    [
        ("LayerNorm=kp_zoo.norms.GoodLayerNorm", [], []),
        (
            "LayerNorm=kp_zoo.norms.GammaBetaLayerNorm",
            ["rename:gamma->weight", "rename:beta->bias"],
            [],
        ),
        ("LayerNorm=kp_zoo.norms.RandnBiasLayerNorm", [], ["bias starts as values with mean "]),
    ],
)
def test_layout_and_initialisation_are_measured_once_before_the_rows(spec, rules, init):
    reply = check(offered(spec), "LayerNorm", "cpu", [], hidden=HIDDEN)
    assert reply.phase == "" and reply.error == "" and reply.rows == []
    assert reply.layout["ok"] is True and reply.layout["rules"] == rules
    assert len(reply.init) == len(init) and all(
        t.startswith(s) for t, s in zip(reply.init, init, strict=True)
    )
    assert (reply.blas, reply.blas_default) == ("", "")  # no GPU BLAS library on a CPU


def test_a_blas_library_not_offered_stops_at_blas(monkeypatch):
    @contextlib.contextmanager
    def refuse(cand, device):
        raise BlasNotOffered("this torch build does not offer cublaslt: torch kept cublas")
        yield

    monkeypatch.setattr(onetensor, "blas_library", refuse)
    reply = check(
        cands.default_for("Linear"), "Linear", "cpu", [("float32", "true")], hidden=HIDDEN
    )
    assert (reply.phase, reply.error) == (
        "blas",
        "this torch build does not offer cublaslt: torch kept cublas",
    )
    assert reply.rows == [] and reply.layout["ok"] is True


@pytest.mark.parametrize(
    "failing,key,text",
    [
        (
            "_baseline",
            "skipped",
            "torch.nn itself fails for float32 true on cpu: RuntimeError: no kernel",
        ),
        ("_measure", "exception", "RuntimeError: no kernel"),
    ],
)
def test_a_row_that_fails_says_where(monkeypatch, failing, key, text):
    def fail(*_a, **_k):
        raise RuntimeError("no kernel")

    # torch.nn's own small pass (the first backward in a process imports much of torch) is not what
    # is tested
    monkeypatch.setattr(correctness, "_baseline", lambda *_a: object())
    monkeypatch.setattr(correctness, failing, fail)
    (row,) = check(
        cands.default_for("LayerNorm"), "LayerNorm", "cpu", [("float32", "true")], hidden=HIDDEN
    ).rows
    assert row[key] == text and (row["dtype"], row["regime"]) == ("float32", "true")
    assert ("traceback" in row) is (key == "exception")


# ---- the bench and a row's set-up ----------------------------------------------------------------
@pytest.mark.parametrize(
    "cid,device,torch_device,out_features",
    [
        ("torch.layer_norm", "cpu", "cpu", None),
        ("torch.rms_norm", "rocm", "cuda", None),  # ROCm is cuda to torch
        ("torch.linear", "cuda", "cuda", 384),
    ],
)
def test_bench(cid, device, torch_device, out_features):
    b = bench(cid, device)
    assert b.torch_device == torch_device and b.out_features == out_features
    canonical = b.canonical("float32")
    assert canonical["hidden"] == HIDDEN and canonical["out_features"] == (
        out_features or canonical["out_features"]
    )


@pytest.mark.parametrize(
    "cid,dtype,regime,param_dtype,autocast,width,bias",
    [
        (
            "torch.layer_norm",
            "bfloat16",
            "mixed",
            torch.float32,
            ("cpu", torch.bfloat16),
            HIDDEN,
            True,
        ),
        ("torch.layer_norm", "bfloat16", "true", torch.bfloat16, None, HIDDEN, True),
        (
            "torch.rms_norm",
            "float32",
            "true",
            torch.float32,
            None,
            HIDDEN,
            False,
        ),  # an RMSNorm has no bias
        ("torch.linear", "float16", "mixed", torch.float32, ("cpu", torch.float16), 384, True),
    ],
)
def test_row_set_up(cid, dtype, regime, param_dtype, autocast, width, bias):
    setup = Row.of(bench(cid), dtype, regime)
    assert setup.dtype == getattr(torch, dtype) and setup.mixed is (regime == "mixed")
    assert setup.param_dtype == param_dtype and setup.autocast == autocast and setup.width == width
    assert (setup.params["bias"] is not None) is bias
    assert setup.params64["weight"].dtype == torch.float64
    assert torch.equal(setup.params64["weight"], setup.params["weight"].double())
    # parameters that are neither ones nor zeros: a kernel ignoring them must fail
    assert not torch.equal(setup.params["weight"], torch.ones_like(setup.params["weight"]))


def test_a_row_is_seeded():
    a, b = Row.of(bench(seed=3), "float32", "true"), Row.of(bench(seed=3), "float32", "true")
    assert torch.equal(a.params["weight"], b.params["weight"])
    assert not torch.equal(
        a.params["weight"], Row.of(bench(seed=4), "float32", "true").params["weight"]
    )


def test_the_fresh_builds_are_seeded_whatever_ran_before():
    """The initialisation verdict must be the same on every rank and in every run: both fresh
    modules are drawn from seeded generators, independently of each other."""
    torch.manual_seed(123)
    cand, base = correctness._fresh(bench("torch.linear", seed=5))
    torch.randn(1000)  # the worker computed something else in between
    again, again_base = correctness._fresh(bench("torch.linear", seed=5))
    assert torch.equal(cand.weight, again.weight) and torch.equal(base.weight, again_base.weight)
    assert not torch.equal(cand.weight, base.weight)  # two draws, not one compared with itself
    other, _ = correctness._fresh(bench("torch.linear", seed=6))
    assert not torch.equal(other.weight, cand.weight)


# ---- the bookkeeping -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pairs,worst",
    [
        ([(1.0, 2.0)], [1.0, 2.0]),
        ([(1.0, 2.0), (3.0, 0.5)], [3.0, 2.0]),  # each side's worst on its own
        ([(0.0, 0.0), (0.0, 0.0)], [0.0, 0.0]),
    ],
)
def test_worst_keeps_each_sides_maximum(pairs, worst):
    errs: dict[str, list[float]] = {"other": [9.0, 9.0]}
    for got, base in pairs:
        measure.worst_errors(errs, "y", got, base)
    assert errs == {"other": [9.0, 9.0], "y": worst}


def passes(**grads):
    return {"y": "y", "dx": "dx", "grads": grads, "skip_grad": "skip"}


@pytest.mark.parametrize(
    "ref_bias,residual,keys",
    [
        (None, False, ["y", "dx", "dweight"]),
        ("b", False, ["y", "dx", "dweight", "dbias"]),
        ("b", True, ["y", "dx", "dweight", "dbias", "dskip"]),
    ],
)
def test_compared_pairs_each_tensor(ref_bias, residual, keys):
    ref = {"y": "Y", "dx": "DX", "weight": "W", "bias": ref_bias, "skip": "S"}
    pairs = correctness._compared(
        passes(weight="gw", bias="gb"), passes(weight="bw"), ref, residual
    )
    assert list(pairs) == keys
    assert pairs["y"] == ("y", "y", "Y") and pairs["dweight"] == ("gw", "bw", "W")
    if "dbias" in pairs:
        assert pairs["dbias"] == (
            "gb",
            None,
            "b",
        )  # a gradient torch.nn did not give is None, not a crash


X32 = torch.zeros(2, dtype=torch.float32)


@pytest.mark.parametrize(
    "got,flags",
    [
        ({}, {}),
        ({"grad_output_intact": False}, {FLAG_GRAD_OUTPUT_MODIFIED: "random"}),
        ({"input_intact": False}, {FLAG_INPUT_MODIFIED: "random"}),
        (
            {"y": torch.zeros(2, dtype=torch.bfloat16)},
            {FLAG_OUTPUT_DTYPE: "bfloat16 (torch.nn: float32) for float32 input"},
        ),
    ],
)
def test_flag(got, flags):
    found: dict[str, str] = {}
    correctness._flag(
        found,
        "random",
        {"grad_output_intact": True, "input_intact": True, "y": X32, **got},
        {"y": X32},
        X32,
    )
    assert found == flags


def test_a_flag_names_the_first_case_that_showed_it():
    found: dict[str, str] = {}
    bad = {"grad_output_intact": False, "input_intact": True, "y": X32}
    for case in ("random", "tiny-variance"):
        correctness._flag(found, case, bad, {"y": X32}, X32)
    assert found == {FLAG_GRAD_OUTPUT_MODIFIED: "random"}


def test_the_other_norms_error_takes_the_closer_of_with_and_without_bias():
    setup = Row.of(bench("torch.layer_norm"), "float32", "true")
    x = torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w, b = setup.params64["weight"], setup.params64["bias"]
    rms = x / (x.pow(2).mean(-1, keepdim=True) + setup.eps).sqrt() * w
    assert correctness._alt_error("rms_norm", x, rms, setup) == pytest.approx(0.0, abs=1e-12)
    assert correctness._alt_error("rms_norm", x, rms + b, setup) == pytest.approx(0.0, abs=1e-12)
    assert correctness._alt_error("rms_norm", x, -rms, setup) > 1.0


# ---- try_once ------------------------------------------------------------------------------------
def test_try_once_runs_a_tiny_forward_and_backward():
    assert slot("LayerNorm").try_once(cands.default_for("LayerNorm"), "cpu") == {"ran": True}


def test_try_once_says_why_it_cannot_run():
    result = slot("LayerNorm").try_once(offered("LayerNorm=kp_zoo.norms.GoodLinear"), "cpu")
    assert result["ran"] is False and result["error"].startswith("TypeError: ")
    assert "\n" not in result["error"] and len(result["error"]) <= 500


def test_discover_is_what_check_reports():
    # the reply's layout is layout.discover's, as JSON: the judge reads it back with
    # Layout.from_json
    reply = check(
        offered("LayerNorm=kp_zoo.norms.GammaBetaLayerNorm"), "LayerNorm", "cpu", [], hidden=HIDDEN
    )
    expected = discover(
        {"gamma": (HIDDEN,), "beta": (HIDDEN,)}, {"weight": (HIDDEN,), "bias": (HIDDEN,)}
    )
    assert reply.layout == expected.to_json()


# ---- one row, cut to the cases that show a rule (in-process, milliseconds) -----------------------
def only_cases(monkeypatch, *names: str) -> None:
    """Measure only the named cases of ``onetensor.cases`` (a full row takes a second; one case, ~10
    ms)."""
    every = onetensor.cases
    monkeypatch.setattr(
        onetensor, "cases", lambda *a, **k: [c for c in every(*a, **k) if c.name in names]
    )


def measured_row(spec: str):
    (row,) = check(offered(spec), "LayerNorm", "cpu", [("float32", "true")], hidden=HIDDEN).rows
    return row


def test_a_wrong_input_gradient_is_measured_as_the_candidates_own(monkeypatch):
    """The candidate's dx, not torch.nn's, is compared with float64: a backward that drops dx's mean
    term (forward right) is ~1e6 x torch.nn's error, and its verdict rejects dx and only dx."""
    from kernel_probe.probe.judge import judge_row

    only_cases(monkeypatch, "random")
    row = measured_row("LayerNorm=kp_zoo.norms.WrongBackwardLayerNorm")
    got, torch_nn = row["cases"]["random"]["dx"]
    assert got > 1e-2 and torch_nn < 1e-6, (got, torch_nn)
    assert row["cases"]["random"]["y"][0] < 1e-6  # the forward is right
    v = judge_row(row["dtype"], "cpu", "layer_norm", row)
    # the later cases (after an update, loaded, on views: kernel_probe.probe.inuse) have a dx too
    assert v.status == "rejected" and "random:dx" in v.failed
    assert {f.split(":")[1] for f in v.failed} == {"dx"}, v.failed
    # the same row of a right kernel passes
    right = measured_row("LayerNorm=kp_zoo.norms.GoodLayerNorm")
    assert right["cases"]["random"]["dx"][0] < 1e-6
    assert judge_row(right["dtype"], "cpu", "layer_norm", right).status == "accepted"


def test_a_backward_writing_into_grad_output_is_flagged_and_rejected_on_its_own(monkeypatch):
    """On a case without a residual every gradient of such a backward is right: the flag alone
    rejects."""
    from kernel_probe.probe.judge import judge_row

    only_cases(monkeypatch, "random")
    row = measured_row("LayerNorm=kp_zoo.norms.InPlaceBackwardLayerNorm")
    assert row["flags"] == {FLAG_GRAD_OUTPUT_MODIFIED: "random"}
    outputs = {t: e for t, e in row["cases"]["random"].items() if not t.startswith(ALT_PREFIX)}
    assert set(outputs) == {"y", "dx", "dweight", "dbias"}
    assert all(got <= 4 * base + 1e-6 for got, base in outputs.values()), outputs
    v = judge_row(row["dtype"], "cpu", "layer_norm", row)
    assert v.status == "rejected" and v.failed == (FLAG_GRAD_OUTPUT_MODIFIED,)
    assert v.reasons[0].startswith("backward modifies grad_output in place (seen on random)")


def test_a_residuals_gradient_shows_what_writing_into_grad_output_corrupts(monkeypatch):
    only_cases(monkeypatch, "residual")
    row = measured_row("LayerNorm=kp_zoo.norms.InPlaceBackwardLayerNorm")
    assert row["flags"] == {FLAG_GRAD_OUTPUT_MODIFIED: "residual"}
    got, torch_nn = row["cases"]["residual"]["dskip"]
    # skip's gradient is grad_output itself: exact for torch.nn
    assert got > 0.1 and torch_nn == 0.0


def test_a_kernel_touching_its_input_is_flagged(monkeypatch):
    from kernel_probe.probe.judge import judge_row

    only_cases(monkeypatch, "random")
    row = measured_row("LayerNorm=kp_zoo.norms.MutatesInputLayerNorm")
    assert row["flags"] == {FLAG_INPUT_MODIFIED: "random"}
    assert FLAG_INPUT_MODIFIED in judge_row(row["dtype"], "cpu", "layer_norm", row).failed
