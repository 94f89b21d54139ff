"""The default's rematch: a candidate that beat the default's first run replaces it only if it also
beats a second run of the default made after it (kernel_probe.probe.check._rematch). The real slot
timing loop, with workers that answer from a script."""

from __future__ import annotations

import contextlib

from kernel_probe.candidates import builtin, for_slot
from kernel_probe.isolation.protocol import TimeReply, TimeRequest
from kernel_probe.probe.check import Checked, Checks, Timing, _time_slot
from kernel_probe.probe.choose import choose
from kernel_probe.probe.report import Report

SHAPE = "4x32x256"


class _Worker:
    def __init__(self, medians: dict[str, list[float]]) -> None:
        self.medians, self.calls = medians, []

    def call(self, request: TimeRequest, timeout, on_progress=None) -> TimeReply:
        cid = request["candidate"]["id"]
        self.calls.append((cid, dict(request["options"])))
        ms = self.medians[cid].pop(0)
        row = {
            "implementation": cid,
            "shape": SHAPE,
            "dtype": request["dtype"],
            "regime": request["regime"],
            "median_ms": ms,
            "spread": 0.01,
            "reps": 5,
            "timed": "baseline" if request["options"].get("against") is None else "decided",
            "samples": [ms / 1e3] * 5,
        }
        return TimeReply(candidate=cid, device="cpu", rows=[row])


class _Pool:
    def __init__(self, worker: _Worker) -> None:
        self.worker = worker

    @contextlib.contextmanager
    def worker_for(self, cand):
        yield self.worker


def _slot(medians: dict[str, list[float]], fixed: bool = False):
    by_id = {c.id: c for c in for_slot(builtin(), "Attention")}
    done = [
        (
            by_id[cid],
            Checked(
                "Attention",
                Report(
                    id=cid,
                    target=by_id[cid].target,
                    slot="Attention",
                    semantics=by_id[cid].semantics,
                    device="cpu",
                    status="accepted",
                    candidate=by_id[cid],
                ),
            ),
        )
        for cid in medians
    ]
    worker = _Worker({k: list(v) for k, v in medians.items()})
    timing = Timing(
        shapes=(),
        dtype="bfloat16",
        regime="mixed",
        reps=5,
        timed_at={"Attention": (SHAPE,)},
        fixed=fixed,
    )
    _time_slot("Attention", done, Checks("cpu", [("bfloat16", "mixed")]), _Pool(worker), timing)
    reports = [d.report for _, d in done]
    timings = {d.report.id: d.timings for _, d in done}
    picked = choose("Attention", reports, timings, [SHAPE], "bfloat16", "torch.sdpa")
    return picked, worker.calls, timings


def test_a_win_against_a_slow_first_run_of_the_default_does_not_survive_its_rematch():
    # the default timed first at 3.0 ms, then 2.2 ms once warm: the challenger's 2.2 is no win
    picked, calls, timings = _slot({"torch.sdpa": [3.0, 2.2], "torch.sdpa.flash": [2.2]})
    assert [c for c, _ in calls] == ["torch.sdpa", "torch.sdpa.flash", "torch.sdpa"]
    assert calls[2][1] == calls[0][1]  # the rematch runs with the first run's options
    assert timings["torch.sdpa"][0]["median_ms"] == 2.2
    assert timings["torch.sdpa"][0]["timed"] == "rematch"
    assert picked.report.id == "torch.sdpa"


def test_a_real_win_survives_the_rematch_and_the_faster_run_is_kept():
    picked, calls, timings = _slot({"torch.sdpa": [2.9, 3.1], "torch.sdpa.flash": [1.5]})
    assert len(calls) == 3
    assert timings["torch.sdpa"][0]["median_ms"] == 2.9  # the default's faster run
    assert picked.report.id == "torch.sdpa.flash"
    assert "1.93x faster than torch.sdpa" in picked.reason


def test_no_rematch_when_the_default_stands_or_the_count_is_fixed():
    _, calls, timings = _slot({"torch.sdpa": [2.0], "torch.sdpa.flash": [2.0]})
    assert [c for c, _ in calls] == ["torch.sdpa", "torch.sdpa.flash"]
    assert timings["torch.sdpa"][0]["timed"] == "baseline"
    _, calls, _ = _slot({"torch.sdpa": [3.0], "torch.sdpa.flash": [1.0]}, fixed=True)
    assert len(calls) == 2  # --reps N: every candidate N calls, as asked
