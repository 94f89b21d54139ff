"""kernel-probe explain: a text bar chart of the candidates' times, per shape, within 80 columns
(issue 37)."""

from __future__ import annotations

from kernel_probe.commands.locks import bar_chart

ROWS = [
    {
        "implementation": "torch.layer_norm",
        "shape": "2048x1024",
        "dtype": "float32",
        "regime": "true",
        "median-ms": 2.0,
    },
    {
        "implementation": "liger.layer_norm",
        "shape": "2048x1024",
        "dtype": "float32",
        "regime": "true",
        "median-ms": 1.0,
    },
    {
        "implementation": "torch.layer_norm",
        "shape": "8x8",
        "dtype": "float32",
        "regime": "true",
        "median-ms": 0.01,
    },
    {
        "implementation": "te.layer_norm",
        "shape": "8x8",
        "dtype": "float32",
        "regime": "true",
        "error": "OOM",
    },
]


def test_bars_are_scaled_to_the_slowest_at_each_shape_and_mark_the_chosen():
    lines = bar_chart(ROWS, chosen="liger.layer_norm")
    assert all(len(line) <= 80 for line in lines)
    group = lines[lines.index("  2048x1024 fp32 true") + 1 :][:2]
    fast, slow = group  # fastest first
    assert fast.lstrip().startswith("* liger.layer_norm") and slow.lstrip().startswith(
        "torch.layer_norm"
    )
    assert fast.count("#") * 2 == slow.count("#") or abs(fast.count("#") * 2 - slow.count("#")) <= 1
    assert fast.endswith(" 1") and slow.endswith(" 2")
    assert not any("te.layer_norm" in line for line in lines)  # a row without a time draws no bar


def test_no_timings_no_chart():
    assert bar_chart([], chosen="x") == [] and bar_chart([ROWS[3]]) == []
