"""kernel_probe.probe.layout: how a candidate's state-dict keys and shapes map onto torch.nn's."""

from __future__ import annotations

import pytest
import torch

from kernel_probe.probe.layout import Layout, describe, discover, shapes

W, B = (384, 1000), (384,)
LINEAR = {"weight": W, "bias": B}
NORM = {"weight": (8,), "bias": (8,)}


@pytest.mark.parametrize(
    "candidate,reference,rules,pairs",
    [
        (LINEAR, LINEAR, (), {"weight": ("weight", False), "bias": ("bias", False)}),
        (
            {"gamma": (8,), "beta": (8,)},
            NORM,
            ("rename:gamma->weight", "rename:beta->bias"),
            {"weight": ("gamma", False), "bias": ("beta", False)},
        ),
        (
            {"weight": (1000, 384), "bias": B},
            LINEAR,
            ("transpose:weight",),
            {"weight": ("weight", True), "bias": ("bias", False)},
        ),
        (
            {"w": (1000, 384), "b": B},
            LINEAR,
            ("rename:w->weight", "transpose:weight", "rename:b->bias"),
            {"weight": ("w", True), "bias": ("b", False)},
        ),
        (
            {"weight": (8,), "_extra_state": ()},
            {"weight": (8,)},
            ("drop:_extra_state",),
            {"weight": ("weight", False)},
        ),
        (  # a nested module's extra state too
            {"norm._extra_state": (), "weight": (8,)},
            {"weight": (8,)},
            ("drop:norm._extra_state",),
            {"weight": ("weight", False)},
        ),
        (  # the same key in another order keeps torch.nn's declaration order
            {"bias": B, "weight": W},
            LINEAR,
            (),
            {"weight": ("weight", False), "bias": ("bias", False)},
        ),
        (  # one key kept, the other renamed
            {"weight": (8,), "shift": (8,)},
            NORM,
            ("rename:shift->bias",),
            {"weight": ("weight", False), "bias": ("shift", False)},
        ),
        (  # a square weight: the same shape, never read as transposed
            {"weight": (8, 8)},
            {"weight": (8, 8)},
            (),
            {"weight": ("weight", False)},
        ),
    ],
    ids=[
        "identity",
        "renamed",
        "transposed",
        "renamed-transposed",
        "extra-state",
        "nested-extra-state",
        "order",
        "one-renamed",
        "square",
    ],
)
def test_discover_finds_the_mapping(candidate, reference, rules, pairs):
    layout = discover(candidate, reference)
    assert layout.ok and layout.rules == rules and dict(layout.pairs) == pairs
    assert list(layout.pairs) == list(reference)
    assert layout.identity is (rules == ())
    assert layout.missing == () and layout.unexpected == ()


@pytest.mark.parametrize(
    "candidate,reference,missing,unexpected",
    [
        (
            {"gamma": (7,), "scale": (8,)},
            NORM,
            ("weight (8,)", "bias (8,)"),
            ("gamma (7,)", "scale (8,)"),
        ),
        ({"weight": (8,)}, NORM, ("bias (8,)",), ()),
        ({"weight": (8,), "bias": (8,), "scale": (8,)}, NORM, (), ("scale (8,)",)),
        (
            {"weight": (4, 2, 1)},
            {"weight": (1, 2, 4)},
            ("weight (1, 2, 4)",),
            ("weight (4, 2, 1)",),
        ),  # only 2-D turns
        ({}, {"weight": (8,)}, ("weight (8,)",), ()),
    ],
    ids=["wrong-shapes", "missing", "unexpected", "3-d-reversed", "empty"],
)
def test_discover_says_what_has_no_mapping(candidate, reference, missing, unexpected):
    layout = discover(candidate, reference)
    assert not layout.ok and not layout.identity
    assert layout.missing == missing and layout.unexpected == unexpected
    assert layout.rules == () and dict(layout.pairs) == {}


def test_the_problem_names_what_is_missing_and_unexpected():
    text = discover({"gamma": (7,)}, {"weight": (8,)}).problem()
    assert text.startswith("its state dict does not take torch.nn's keys, and no mapping was found")
    assert text.endswith(": missing weight (8,); unexpected gamma (7,)")
    assert discover({}, {"weight": (8,)}).problem().endswith(": missing weight (8,)")


@pytest.mark.parametrize(
    "layout",
    [
        discover({"w": (1000, 384), "b": B, "_extra_state": ()}, LINEAR),
        discover({"gamma": (7,)}, NORM),
        Layout(True),
    ],
)
def test_json_round_trip(layout):
    d = layout.to_json()
    assert set(d) == {"ok", "rules", "missing", "unexpected", "pairs"}
    assert Layout.from_json(d) == layout


def test_from_json_reads_a_reply_with_absent_lists():
    assert Layout.from_json({"ok": False}) == Layout(False)
    assert Layout.from_json({"ok": True, "pairs": {"weight": ["w", 1]}}).pairs == {
        "weight": ("w", True)
    }


def test_shapes_of_a_state_dict():
    state = torch.nn.Linear(3, 2).state_dict()
    assert shapes(state) == {"weight": (2, 3), "bias": (2,)}
    assert shapes({"_extra_state": b"x", "n": 3}) == {"_extra_state": (), "n": ()}


@pytest.mark.parametrize(
    "rules,text",
    [
        ((), "identity"),
        (["transpose:weight"], "transpose:weight"),
        (["drop:a", "rename:b->c"], "drop:a, rename:b->c"),
    ],
)
def test_describe(rules, text):
    assert describe(rules) == text
