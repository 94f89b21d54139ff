"""The choice rule on synthetic verdicts and timings: margin, ties, pins, prefers."""

from __future__ import annotations

import pytest

from kernel_probe.errors import ProbeError
from kernel_probe.probe.choose import choose
from kernel_probe.probe.report import Report

SHAPES = ["40320x1024", "542080x1024"]


def rep(cid, status="accepted"):
    return Report(
        id=cid,
        target=f"x.{cid}",
        slot="RMSNorm",
        semantics="rms_norm",
        device="cuda",
        status=status,
        reasons=[] if status == "accepted" else ["because"],
    )


def t(ms_a, ms_b):
    return [{"shape": SHAPES[0], "median_ms": ms_a}, {"shape": SHAPES[1], "median_ms": ms_b}]


QUIET = (1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.0)  # each round's factor on a candidate's median


def paired(timings, noise=QUIET, default="torch.rms_norm"):
    """The timings with paired rounds: each other candidate's rows get, per round, the default's
    median and its own times the round's factor (what check._rounds records)."""
    base = {r["shape"]: r["median_ms"] for r in timings.get(default, ())}
    for cid, rows in timings.items():
        for r in rows if cid != default else ():
            if "error" not in r and r["shape"] in base:
                r["pairs"] = [[base[r["shape"]], r["median_ms"] * k] for k in noise]
    return timings


def decide(timings, reports=None, noise=QUIET, **kw):
    reports = reports or [rep(k) for k in timings]
    paired(timings, noise)
    return choose("RMSNorm", reports, timings, SHAPES, "bfloat16", "torch.rms_norm", **kw)


def test_default_kept_when_others_are_slower():
    c = decide({"torch.rms_norm": t(0.273, 2.345), "liger.rms_norm": t(0.501, 3.893)})
    assert c.report.id == "torch.rms_norm" and c.how == "default"
    assert "liger.rms_norm slower over 2 shapes bfloat16 (geometric mean): time ratio 1.75" in (
        c.reason
    )
    assert c.ratios["liger.rms_norm"].verdict == "slower"


def test_faster_candidate_beyond_margin_wins():
    c = decide({"torch.rms_norm": t(0.273, 2.345), "torch.compile.rms_norm": t(0.20, 1.40)})
    assert c.report.id == "torch.compile.rms_norm" and c.how == "fastest"
    assert "faster than torch.rms_norm over 2 shapes" in c.reason
    assert "(98 % interval 0.6" in c.reason and "7 paired rounds)" in c.reason


def test_the_same_speed_keeps_the_default_and_says_so():
    c = decide({"torch.rms_norm": t(1.0, 1.0), "liger.rms_norm": t(0.99, 0.99)})
    assert c.report.id == "torch.rms_norm"
    assert "liger.rms_norm the same speed within 5 %" in c.reason


def test_noisy_rounds_leave_it_undecided_and_the_default_stays():
    quiet = decide({"torch.rms_norm": t(1.0, 1.0), "liger.rms_norm": t(0.9, 0.9)})
    noise = (0.5, 1.3, 0.6, 1.4, 0.7, 1.2, 0.6)
    noisy = decide({"torch.rms_norm": t(1.0, 1.0), "liger.rms_norm": t(0.9, 0.9)}, noise=noise)
    assert quiet.report.id == "liger.rms_norm" and noisy.report.id == "torch.rms_norm"
    assert "undecided (keeping the default): liger.rms_norm" in noisy.reason
    assert "straddles the 5 % margin" in noisy.reason and "faster" not in noisy.reason


def test_too_few_rounds_decide_nothing():
    c = decide({"torch.rms_norm": t(1.0, 1.0), "liger.rms_norm": t(0.5, 0.5)}, noise=(1.0,) * 3)
    assert c.report.id == "torch.rms_norm" and c.ratios["liger.rms_norm"].interval is None
    assert "undecided" in c.reason and "too few for an interval" in c.reason


def test_rejected_and_untimed_are_never_chosen():
    reports = [rep("torch.rms_norm"), rep("liger.rms_norm", "rejected"), rep("quack.rms_norm")]
    c = decide(
        {
            "torch.rms_norm": t(1, 1),
            "liger.rms_norm": t(0.1, 0.1),
            "quack.rms_norm": [{"shape": SHAPES[0], "error": "OOM"}],
        },
        reports,
    )
    assert c.report.id == "torch.rms_norm"


def test_deterministic_tie_break():
    timings = {"torch.rms_norm": t(1, 1), "b.rms": t(0.5, 0.5), "a.rms": t(0.5, 0.5)}
    # declared first wins an exact tie
    assert {decide(timings).report.id for _ in range(5)} == {"b.rms"}


def test_pin_and_prefer():
    timings = {"torch.rms_norm": t(0.273, 2.345), "liger.rms_norm": t(0.501, 3.893)}
    assert decide(timings, pin="liger.rms_norm").how == "pinned"
    # far slower: preference loses
    assert decide(timings, prefer="liger.rms_norm").report.id == "torch.rms_norm"
    close = {"torch.rms_norm": t(1.0, 1.0), "liger.rms_norm": t(1.02, 1.02)}
    assert decide(close, prefer="liger.rms_norm").how == "preferred"
    noisy = (0.5, 1.3, 0.6, 1.4, 0.7, 1.2, 0.6)  # undecided: a preference settles it
    close = {"torch.rms_norm": t(1.0, 1.0), "liger.rms_norm": t(1.02, 1.02)}
    assert decide(close, prefer="liger.rms_norm", noise=noisy).how == "preferred"


@pytest.mark.parametrize(
    "kw, said, code",
    [
        ({"pin": "liger.rms_norm"}, "never silently", 3),
        ({"prefer": "liger.rms_norm"}, "never silently", 3),
        ({"pin": "nope"}, "no such candidate", 2),
    ],
)
def test_pinning_what_cannot_be_used_is_an_error(kw, said, code):
    reports = [rep("torch.rms_norm"), rep("liger.rms_norm", "unavailable")]
    with pytest.raises(ProbeError) as exc:
        decide({"torch.rms_norm": t(1, 1)}, reports, **kw)
    assert said in str(exc.value) and exc.value.exit_code == code


def test_nothing_accepted_is_an_error():
    with pytest.raises(ProbeError, match="kernel-probe check --slot RMSNorm"):
        decide({}, [rep("torch.rms_norm", "crashed")])


# ---- errors name the flag (issue 16, point 2) ----------------------------------------------------
def test_choice_errors_name_the_flag_and_spell_it_right():
    from kernel_probe.errors import ForcedUnusable
    from kernel_probe.probe.check import Report
    from kernel_probe.probe.choose import choose

    reports = [
        Report("torch.rms_norm", "torch.nn.RMSNorm", "RMSNorm", "rms_norm", "cpu", "accepted"),
        Report("liger.rms_norm", "x.Y", "RMSNorm", "rms_norm", "cpu", "rejected", ["too wrong"]),
    ]
    for kw, flag, word in (
        ({"pin": "liger.rms_norm"}, "--pin", "pinned"),
        ({"prefer": "liger.rms_norm"}, "--prefer", "preferred"),
    ):
        with pytest.raises(ForcedUnusable) as exc:
            choose("RMSNorm", reports, {}, ["8x8"], "float32", "torch.rms_norm", **kw)
        text = str(exc.value)
        assert (
            f"{flag} RMSNorm=liger.rms_norm" in text
            and f"a {word} kernel" in text
            and exc.value.exit_code == 3
        )
        assert "pinn " not in text and "preferr " not in text
    with pytest.raises(ForcedUnusable, match="profile lumi-g pin RMSNorm=liger.rms_norm"):
        choose(
            "RMSNorm",
            reports,
            {},
            ["8x8"],
            "float32",
            "torch.rms_norm",
            pin="liger.rms_norm",
            origin="profile lumi-g",
        )


def test_a_models_calls_weigh_its_shapes():
    # faster at the first shape, slower at the second: the geometric mean says faster; the model's
    # time in the slot (calls x median) says whichever shape it calls more
    timings = {"torch.rms_norm": t(1.0, 1.0), "liger.rms_norm": t(0.5, 1.2)}
    unweighted = decide(timings)
    assert unweighted.report.id == "liger.rms_norm" and not unweighted.weighted
    mostly_second = decide(timings, weights={SHAPES[0]: 1, SHAPES[1]: 10})
    assert mostly_second.report.id == "torch.rms_norm" and mostly_second.how == "default"
    assert mostly_second.scores["liger.rms_norm"] == pytest.approx((0.5 + 12) / 11)
    mostly_first = decide(timings, weights={SHAPES[0]: 10, SHAPES[1]: 1})
    assert mostly_first.report.id == "liger.rms_norm" and mostly_first.weighted
    assert mostly_first.scores["liger.rms_norm"] == pytest.approx((5 + 1.2) / 11)
    assert "in the model's time in the slot (11 calls at 2 shapes, bfloat16)" in mostly_first.reason


def test_a_lone_candidate_where_the_default_failed_is_no_decision():
    reports = [rep("torch.rms_norm", "rejected"), rep("liger.rms_norm")]
    c = decide({"liger.rms_norm": t(1.0, 1.0)}, reports)
    assert c.report.id == "liger.rms_norm" and "fastest" not in c.reason
    assert (
        "the only candidate accepted and timed" in c.reason and "nothing was compared" in c.reason
    )
