"""The set-up a slot's candidates share in the worker (``measure.SetupCache``, issue 38): sharing
the inputs, the float64 reference and torch.nn's pass changes no figure and no verdict, and a
candidate that writes into its input or its grad_output cannot change what the next one is judged
against."""

from __future__ import annotations

from typing import Any

import pytest

from kernel_probe import candidates as cands
from kernel_probe.probe import correctness
from kernel_probe.probe.judge import Policy, judge_candidate
from kernel_probe.probe.measure import SetupCache
from kernel_probe.probe.report import report_base

HIDDEN = 24
ROWS = [("float32", "true"), ("bfloat16", "mixed"), ("float16", "true")]
TIMES = {"seconds", "import_s"}  # wall clock: the only figures that may differ


def candidate(spec: str):
    if "=" in spec:
        return cands.from_command_line(spec)
    return next(c for c in cands.builtin() if c.id == spec)


def figures(value: Any) -> Any:
    """A reply's JSON without its wall-clock times."""
    if isinstance(value, dict):
        return {k: figures(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [figures(v) for v in value]
    return value


def measured(slot: str, specs: list[str], shared: SetupCache | None) -> list[tuple[Any, Any]]:
    """Each candidate's reply (its figures) and verdict (status, reasons, per row), in order."""
    out = []
    for spec in specs:
        cand = candidate(spec)
        reply = correctness.check(cand, slot, "cpu", ROWS, hidden=HIDDEN, shared=shared)
        report = judge_candidate(reply, cand, slot, "cpu", Policy(), report_base(cand, slot, "cpu"))
        verdicts = [(v.dtype, v.regime, v.status, v.failed, v.reasons) for v in report.verdicts]
        out.append((figures(reply.to_json()), (report.status, report.reasons, verdicts)))
    return out


SLOTS = {
    "LayerNorm": [
        "torch.layer_norm",
        "LayerNorm=kp_zoo.norms.MutatesInputLayerNorm",
        "LayerNorm=kp_zoo.norms.InPlaceBackwardLayerNorm",
        "LayerNorm=kp_zoo.norms.GoodLayerNorm",
        # its blocks draw from the generator after the cases
        "LayerNorm=kp_zoo.norms.UpcastingLayerNorm",
        "LayerNorm=kp_zoo.norms.WrongBackwardLayerNorm",
        "LayerNorm=kp_zoo.norms.NaNLayerNorm",
    ],
    "Linear": ["torch.linear", "Linear=kp_zoo.norms.WrongLinear", "Linear=kp_zoo.norms.GoodLinear"],
}


@pytest.mark.parametrize("slot", sorted(SLOTS))
def test_sharing_the_set_up_changes_no_figure_and_no_verdict(slot):
    shared = SetupCache()
    alone = measured(slot, SLOTS[slot], None)
    together = measured(slot, SLOTS[slot], shared)
    # each row's set-up and torch.nn's fresh module, made once
    assert shared.misses == len(ROWS) + 1
    assert shared.hits == (len(SLOTS[slot]) - 1) * (len(ROWS) + 1)
    for spec, a, b in zip(SLOTS[slot], alone, together, strict=True):
        assert a == b, spec
    statuses = {spec: verdict[0] for spec, (_, verdict) in zip(SLOTS[slot], together, strict=True)}
    assert statuses[SLOTS[slot][0]] == "accepted" and "rejected" in statuses.values(), statuses


@pytest.mark.parametrize(
    "mutating",
    [
        "LayerNorm=kp_zoo.norms.MutatesInputLayerNorm",
        "LayerNorm=kp_zoo.norms.InPlaceBackwardLayerNorm",
    ],
)
def test_a_candidate_writing_into_its_inputs_does_not_change_the_next_ones_verdict(mutating):
    good = "LayerNorm=kp_zoo.norms.GoodLayerNorm"
    shared = SetupCache()
    (first, after) = measured("LayerNorm", [mutating, good], shared)
    assert first[1][0] == "rejected"  # it is flagged for the write itself
    assert shared.hits > 0  # the good one was judged against the set-up the mutating one ran on
    (own,) = measured("LayerNorm", [good], SetupCache())
    assert after == own and own[1][0] == "accepted"


def test_the_cache_is_bounded_and_keyed_by_the_seed():
    shared = SetupCache(size=2)
    calls = []
    for key in ("a", "b", "a", "c", "b"):
        shared.get(key, lambda key=key: calls.append(key) or key)
    assert calls == ["a", "b", "c", "b"] and (shared.hits, shared.misses) == (1, 4)
    bench = correctness.Bench(candidate("torch.layer_norm"), "LayerNorm", "cpu", HIDDEN, None, 0,
                              cands.default_for("LayerNorm"))  # fmt: skip
    assert bench.key("row") != correctness.Bench(
        *[*bench.__dict__.values()][:5], 1, bench.baseline
    ).key("row")


# ---- Attention: torch's two paths and the float64 reference, shared by call number in a row
ATTENTION = [
    "torch.sdpa",
    "kp_attention.mutates_input",
    "torch.sdpa.math",
    "kp_attention.ignores_mask",
    "kp_attention.sdpa",
    "kp_attention.biased_output",
]
WINDOWED = {"window": 6}


def attention_measured(shared: SetupCache | None, options=WINDOWED) -> list[tuple[Any, Any]]:
    from kernel_probe.slots import attention, attention_kernels

    out = []
    for spec in ATTENTION:
        cand = candidate(spec if spec.startswith("torch.") else f"Attention={spec}")
        raw = attention_kernels.check(
            cand, "cpu", ROWS[:2], canonical_overrides=options, shared=shared
        )
        report = attention.judge(
            raw,
            cand,
            "cpu",
            report_base(cand, "Attention", "cpu"),
            attention.canonical_options(options),
        )
        out.append((figures(raw.to_json()), (report.status, report.reasons)))
    return out


def test_sharing_torchs_side_of_attention_changes_no_figure_and_no_verdict():
    shared = SetupCache()  # the worker's size: a row is one entry (its cases by call number)
    alone, together = attention_measured(None), attention_measured(shared)
    assert (shared.misses, shared.hits) == (2, 2 * (len(ATTENTION) - 1))  # two rows
    for spec, a, b in zip(ATTENTION, alone, together, strict=True):
        assert a == b, spec
    statuses = [verdict[0] for _, verdict in together]
    assert statuses[0] == "accepted" and statuses[1] == "rejected", statuses
