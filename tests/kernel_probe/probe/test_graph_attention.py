"""The GraphAttention check (issue 39): anemoi's GraphTransformer attention backends against float64
on a graph of O96-era processor degrees, the #1027 sharp softmax, determinism, and the lock's
choice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kernel_lock
from kernel_lock.graph_attention import GraphAttention
from kernel_probe.errors import ForcedUnusable, UsageError
from kernel_probe.probe import graph_attention as ga
from kernel_probe.probe.graph_attention import HINTS, GraphAttentionReport, judge
from tests.conftest import needs_anemoi

FAKES = Path(__file__).resolve().parents[2] / "fakes"
GPU = {"device-type": "cuda"}
CPU = {"device-type": "cpu"}


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKES))


@pytest.fixture(scope="module")
def formula_rows():
    """A correct user kernel's rows in fp32 and bf16 (measured once for the module)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(FAKES))
        return ga.check("kp_graph_attention.float32_formula", "cpu", ["float32", "bfloat16"])


def report(backend: str, dtypes=("float32",)) -> GraphAttentionReport:
    return judge(backend, "cpu", ga.check(backend, "cpu", list(dtypes)))


def test_the_check_graph_has_every_o96_processor_degree_in_proportion():
    degrees = ga.check_degrees()
    assert len(degrees) == ga.NODES and set(degrees) == {d for d, _ in ga.O96_DEGREES}
    assert degrees.count(6) / len(degrees) > 0.65  # 7680 of 10,242 nodes (75 %) have 6 neighbours
    assert (
        sum(n for _, n in ga.O96_DEGREES) == 10242
        and sum(d * n for d, n in ga.O96_DEGREES) == 81900
    )
    edge_index = ga.check_graph(torch.Generator().manual_seed(0))
    src, dst = edge_index
    assert torch.equal(torch.bincount(dst), torch.tensor(degrees))
    assert bool((dst[1:] >= dst[:-1]).all())  # sorted by destination, as anemoi sorts it
    pairs = {(int(s), int(d)) for s, d in zip(src, dst, strict=True)}
    assert len(pairs) == edge_index.shape[1]  # no duplicate edge


@pytest.mark.slow  # imports anemoi-models and PyG (seconds)
@needs_anemoi
def test_the_float64_formula_is_anemois_pyg_conv():
    gen = torch.Generator().manual_seed(1)
    edge_index = ga.check_graph(gen)
    case = ga.cases(gen, ga.NODES, edge_index.shape[1])[0]
    size = (ga.NODES, ga.NODES)
    ours = ga.reference(case.q, case.k, case.v, case.e, edge_index, size)
    theirs = ga.backend("pyg", "cpu")(case.q, case.k, case.v, case.e, edge_index, size)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # imports anemoi-models and PyG (seconds)
@needs_anemoi
def test_the_pyg_path_is_accepted_in_fp32_and_bf16_with_its_ratios_and_determinism():
    rep = report("pyg", ("float32", "bfloat16"))
    assert rep.status == "accepted", rep.reasons
    for v in rep.verdicts:
        assert set(v.ratios) == set(HINTS) and set(v.ratios["random"]) == set(ga.OUTPUTS)
        assert v.worst_ratio is not None and v.worst_ratio <= 1.0
        assert set(v.statistics) == {"max", "rms", "bias"}
        assert v.deterministic is True  # on a CPU the scatter adds in order
    sharp = rep.verdicts[0].errors["sharp-equal-messages"]["dq"]
    assert sharp[0] < 1e-5  # |dq| / max|dv| where dq must vanish


def test_a_low_precision_backward_is_rejected_on_the_sharp_softmax(fakes):
    rep = report("kp_graph_attention.low_precision_backward", ("float32", "bfloat16"))
    fp32, bf16 = rep.verdicts
    assert fp32.status == "accepted"  # right in float32: only the low-precision backward is wrong
    assert bf16.status == "rejected" and rep.status == "rejected"
    assert "sharp-equal-messages:dq" in bf16.failed and "sharp-equal-messages:dk" in bf16.failed
    assert bf16.ratios["sharp-equal-messages"]["dq"] > 2
    assert any("sharp softmax over equal messages" in r and "dq error" in r for r in rep.reasons)


def test_a_correct_user_kernel_is_accepted_and_may_beat_the_baseline(formula_rows):
    rep = judge("kp_graph_attention.float32_formula", "cpu", formula_rows)
    assert rep.status == "accepted" and rep.deterministic is True
    assert rep.verdicts[1].worst_ratio < 0.25  # float32 accumulation beats the bf16 baseline


def test_triton_on_a_cpu_without_the_interpreter_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rep = report("triton")
    assert (
        rep.status == "skipped"
        and "TRITON_INTERPRET=1" in rep.reasons[0]
        and "GPU" in rep.reasons[0]
    )
    assert ga.backends_to_check("cpu", interpreted=False) == ["pyg"]
    assert ga.backends_to_check("cuda", interpreted=False) == ["pyg", "triton"]


def test_an_unknown_backend_is_skipped_naming_the_choices():
    rep = report("tritonn")
    assert rep.status == "skipped" and "triton, pyg or module.function" in rep.reasons[0]


def test_a_backend_that_is_not_repeatable_is_recorded_and_refused_under_deterministic(formula_rows):
    row = dict(formula_rows[0])
    assert row["nondeterministic"] is None  # measured: bitwise equal on a CPU
    row["nondeterministic"] = (
        "two identical fwd+bwd differ by up to 1e-07"  # as PyG's atomics on a GPU
    )
    rep = judge("pyg", "cuda", [row])
    assert rep.status == "accepted" and rep.deterministic is False
    assert any("not deterministic" in n for n in rep.verdicts[0].notes)
    with pytest.raises(ForcedUnusable, match="determinism"):
        ga.choose("pyg", [rep], GPU, deterministic=True)


# ---- the choice ----------------------------------------------------------------------------------
def _accepted(backend: str) -> GraphAttentionReport:
    return GraphAttentionReport(backend, "cuda", "accepted")


def _rejected(backend: str) -> GraphAttentionReport:
    return GraphAttentionReport(
        backend, "cuda", "rejected", ["bfloat16: sharp-equal-messages: dq error 1.47"]
    )


@pytest.mark.parametrize(
    ("wanted", "reports", "current", "triton", "backend", "allow"),
    [
        ("auto", [_accepted("pyg"), _accepted("triton")], GPU, True, "triton", False),
        ("auto", [_accepted("pyg")], CPU, True, "pyg", False),
        (
            "auto",
            [_accepted("pyg"), _accepted("triton")],
            GPU,
            False,
            "pyg",
            False,
        ),  # no triton: anemoi runs pyg
        ("auto", [_accepted("pyg"), _rejected("triton")], GPU, True, "pyg", False),
        ("triton", [_accepted("pyg")], CPU, True, "triton", True),
        ("pyg", [_accepted("pyg"), _accepted("triton")], GPU, True, "pyg", False),
    ],
)
def test_the_choice(wanted, reports, current, triton, backend, allow):
    chosen = ga.choose(wanted, reports, current, allow_fallback=allow, triton=triton)
    assert (
        isinstance(chosen, GraphAttention)
        and chosen.backend == backend
        and chosen.allow_fallback == allow
    )
    assert chosen.reason


@pytest.mark.parametrize(
    ("wanted", "reports", "current", "triton", "allow", "match"),
    [
        ("triton", [_accepted("pyg")], CPU, True, False, "there is no GPU"),
        ("triton", [_accepted("pyg")], GPU, False, False, "triton is not installed"),
        ("triton", [_accepted("pyg"), _rejected("triton")], GPU, True, False, "dq error 1.47"),
        ("triton", [_rejected("pyg")], CPU, True, True, "falls back to cannot be used"),
        (
            "auto",
            [_rejected("pyg")],
            CPU,
            True,
            False,
            "pyg graph attention backend cannot be locked",
        ),
    ],
)
def test_a_choice_that_cannot_be_locked_says_why(wanted, reports, current, triton, allow, match):
    with pytest.raises(ForcedUnusable, match=match):
        ga.choose(wanted, reports, current, allow_fallback=allow, triton=triton)


def test_bad_choices_are_usage_errors():
    with pytest.raises(UsageError, match="goes with a triton backend"):
        ga.choose("pyg", [], CPU, allow_fallback=True)
    with pytest.raises(UsageError, match="not one of"):
        ga.choose("flash", [], CPU)


# ---- the probe and the lock ----------------------------------------------------------------------
@pytest.mark.slow  # a probe, and anemoi's PyG path in the worker
@needs_anemoi
def test_a_cpu_probe_with_graph_attention_locks_pyg_and_export_writes_it(tmp_path, capsys):
    import json

    from tests.conftest import run_cli, small_probe

    out = tmp_path / "l.toml"
    code, _, err = run_cli(
        [*small_probe("LayerNorm"), "--graph-attention", "auto", "--out", out], capsys
    )
    assert code == 0, err
    lock = kernel_lock.load(out, strict=True)
    graph = lock.graph_attention
    assert graph is not None and graph.backend == "pyg" and not graph.allow_fallback
    assert "there is no GPU" in graph.reason
    rows = {(e["backend"], e["dtype"]): e for e in graph.evidence}
    assert (
        rows[("pyg", "float32")]["status"] == "accepted"
        and rows[("pyg", "float32")]["sharp-dq"] < 1e-5
    )
    assert lock.provenance["options"]["graph_attention"] == "auto"
    code, text, err = run_cli(["export", out, "--json"], capsys)
    assert code == 0, err
    assert json.loads(text)["graph_attention"]["graph_attention_backend"] == "pyg"
    code, text, err = run_cli(["export", out], capsys)
    assert code == 0 and "graph_attention_backend: pyg" in text, err
    assert run_cli(["verify", out, "--no-import"], capsys)[0] == 0


@pytest.mark.slow  # two probes
@needs_anemoi
def test_a_cpu_probe_refuses_to_lock_triton_unless_the_fallback_is_allowed(tmp_path, capsys):
    from tests.conftest import run_cli, small_probe

    out = tmp_path / "l.toml"
    code, _, err = run_cli(
        [*small_probe("LayerNorm"), "--graph-attention", "triton", "--out", out], capsys
    )
    assert (
        code == kernel_lock.ExitCode.MISMATCH
        and "there is no GPU" in err
        and "--allow-graph-attention-fallback" in err
    )
    assert not out.exists()  # nothing half-written
    argv = [
        *small_probe("LayerNorm"),
        "--graph-attention",
        "triton",
        "--allow-graph-attention-fallback",
    ]
    code, _, err = run_cli([*argv, "--out", out], capsys)
    assert code == 0, err
    lock = kernel_lock.load(out, strict=True)
    assert lock.graph_attention is not None and lock.graph_attention.allow_fallback
    code, text, err = run_cli(["verify", out], capsys)
    assert code == 0 and "anemoi runs pyg here" in text + err, (text, err)


@pytest.mark.slow  # Triton's interpreter: tens of seconds on this CPU
@needs_anemoi
def test_anemois_triton_kernel_in_the_interpreter_is_accepted_and_its_sharp_dq_vanishes(
    monkeypatch,
):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # in the worker, as the probe runs it
    rep = ga.check_backend("triton", "cpu", ["float32", "bfloat16"])
    assert rep.status == "accepted" and rep.interpreted, rep.reasons
    bf16 = rep.verdicts[1]
    got, base = bf16.errors["sharp-equal-messages"]["dq"]
    # the fixed (#1172) kernel keeps float32 statistics: far below torch's bf16 formula
    assert got < 1e-4 < base
    assert rep.deterministic is True  # gather-style, no atomics
    # never locked on an interpreted verdict
    with pytest.raises(ForcedUnusable, match="interpreter"):
        ga.choose("triton", [_accepted("pyg"), rep], GPU, triton=True)


@pytest.mark.slow  # a check in a worker (import torch)
def test_check_json_reports_a_users_graph_attention_function(capsys, monkeypatch):
    import json

    from tests.conftest import run_cli

    monkeypatch.setenv("PYTHONPATH", str(FAKES))  # the worker's path, as a user's
    code, text, err = run_cli(
        [
            "check",
            "--graph-attention",
            "kp_graph_attention.low_precision_backward",
            "--dtype",
            "bf16",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    (report,) = json.loads(text)["graph_attention"]
    assert (
        report["status"] == "rejected"
        and report["backend"] == "kp_graph_attention.low_precision_backward"
    )
    assert "sharp-equal-messages:dq" in report["evidence"][0]["failed"]
