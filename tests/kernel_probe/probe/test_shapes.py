"""kernel_probe.shapes: model shapes as the command line and profiles write them."""

from __future__ import annotations

import pytest

from kernel_probe.shapes import normal_shape, normal_shapes, parse_shape


@pytest.mark.parametrize(
    "text,shape",
    [
        ("40320x1024", (40320, 1024, None)),
        ("8192x1024x4096", (8192, 1024, 4096)),
        ("64X32", (64, 32, None)),  # any case
        ("64*32", (64, 32, None)),  # a star for the x
        ("64*32x16", (64, 32, 16)),
        ("1x1", (1, 1, None)),
        ("007x8", (7, 8, None)),
    ],
)
def test_parse_shape(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize(
    "text",
    [
        "",
        "64",
        "64x",
        "x64",
        "0x8",
        "8x0",
        "64x32x16x8",
        "-1x8",
        "1.5x8",
        "64 x 32",
        "a x b",
        "６４x32",
        "8x1e3",
    ],
)
def test_parse_shape_refuses(text):
    with pytest.raises(ValueError) as info:
        parse_shape(text)
    assert str(info.value) == (
        f"--shape {text!r}: expected ROWSxHIDDEN (e.g. 40320x1024), ROWSxINxOUT for Linear, or "
        "SLOT=SHAPE for one slot's own shape, all positive integers"
    )


# ---- one spelling per shape (issue 37: `--shape 2048*1024` re-probed a current 2048x1024 lock) ---
@pytest.mark.parametrize(
    "text,normal",
    [
        ("2048*1024", "2048x1024"),
        ("2048X1024", "2048x1024"),
        ("007x8", "7x8"),
        (" 64*32x16 ", "64x32x16"),
    ],
)
def test_normal_shape(text, normal):
    assert normal_shape(text) == normal
    assert normal_shape(normal) == normal


def test_normal_shapes_keep_the_order_and_drop_repeats():
    assert normal_shapes(["8x8", "4*4", "8X8"]) == ("8x8", "4x4")
