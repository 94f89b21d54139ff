"""kernel_probe.probe.report: the records of a verdict (Verdict per row, Report per candidate)."""

from __future__ import annotations

import pytest

from kernel_probe import candidates as cands
from kernel_probe.probe.report import Report, Verdict, report_base


def verdict(
    status="accepted", ratio=None, deterministic=None, twin=None, dtype="float32"
) -> Verdict:
    return Verdict(
        "liger.rms_norm",
        "cpu",
        dtype,
        "true",
        status,
        worst_ratio=ratio,
        deterministic=deterministic,
        twin=twin or {},
    )


def report(*verdicts: Verdict, **more) -> Report:
    cand = next(c for c in cands.builtin() if c.id == "liger.rms_norm")
    return Report(
        **report_base(cand, "RMSNorm", "cpu"),
        status=more.pop("status", "accepted"),
        verdicts=list(verdicts),
        **more,
    )


def test_report_base_takes_the_candidates_facts():
    cand = cands.from_command_line("LayerNorm=mylib.FastLayerNorm")
    assert report_base(cand, "LayerNorm", "cuda") == {
        "id": "custom:mylib.FastLayerNorm",
        "target": "mylib.FastLayerNorm",
        "slot": "LayerNorm",
        "semantics": "layer_norm",
        "device": "cuda",
        "source": "command-line",
        "candidate": cand,
    }


def test_a_verdict_has_no_default_status_and_is_frozen():
    with pytest.raises(TypeError, match="status"):
        Verdict("c", "cpu", "float32", "true")  # type: ignore[call-arg]  # nothing is accepted by default
    v = Verdict("c", "cpu", "float32", "true", "accepted")
    assert v.reasons == () and v.failed == () and v.worst_ratio is None and v.deterministic is None
    with pytest.raises(AttributeError):
        v.status = "rejected"  # type: ignore[misc]
    d = v.to_json()
    assert (
        d["candidate"] == "c"
        and d["status"] == "accepted"
        and d["errors"] == {}
        and d["changes"] == []
    )
    assert d["reasons"] == [] and d["failed"] == [] and d["notes"] == []  # JSON arrays, as before
    assert set(d) == {
        "candidate", "device", "dtype", "regime", "status", "reasons", "failed", "worst_ratio",
        "statistics", "out_dtype", "twin", "notes", "errors", "deterministic", "changes", "ratios",
    }  # fmt: skip


@pytest.mark.parametrize(
    "ratios,worst",
    [((), None), ((None,), None), ((0.5, None, 0.25), 0.5), ((0.1, 2.0), 2.0)],
)
def test_worst_ratio_over_the_measured_rows(ratios, worst):
    assert report(*(verdict(ratio=r) for r in ratios)).worst_ratio() == worst


@pytest.mark.parametrize(
    "measured,deterministic",
    [
        ((), None),
        ((None, None), None),
        ((True, None), True),
        ((True, False), False),
        ((False,), False),
    ],
)
def test_deterministic_only_when_every_measured_row_is(measured, deterministic):
    assert report(*(verdict(deterministic=d) for d in measured)).deterministic is deterministic


@pytest.mark.parametrize(
    "rows,twin",
    [
        ((), {}),
        ((("rejected", {"max_error": 1.0}),), {}),  # a rejected row's twin is not the twin
        (
            (("accepted", {}), ("accepted", {"max_error": 0.1})),
            {"max_error": 0.1},
        ),  # the first with a twin
        ((("rejected", {"max_error": 9.0}), ("accepted", {"max_error": 0.2})), {"max_error": 0.2}),
    ],
)
def test_the_twin_is_the_first_accepted_rows(rows, twin):
    assert report(*(verdict(status, twin=t) for status, t in rows)).twin == twin


def test_to_json():
    r = report(
        verdict(ratio=0.5, deterministic=True, twin={"max_error": 0.1}),
        verdict(ratio=0.75, dtype="bfloat16"),
        reasons=["note"],
        seconds=1.23456,
        migration=("transpose:weight",),
        changes=["init"],
    )
    d = r.to_json()
    assert {k: v for k, v in d.items() if k != "evidence"} == {
        "id": "liger.rms_norm",
        "target": "liger_kernel.transformers.LigerRMSNorm",
        "device": "cpu",
        "status": "accepted",
        "reasons": ["note"],
        "source": "builtin",
        "worst_error_ratio": 0.75,
        "deterministic": True,
        "seconds": 1.235,
        "migration": ["transpose:weight"],
        "changes": ["init"],
        "interpreted": False,
        "blas": "",
        "twin": {"max_error": 0.1},
    }
    assert [e["dtype"] for e in d["evidence"]] == ["float32", "bfloat16"]
    assert report(seconds=None).to_json()["seconds"] is None
