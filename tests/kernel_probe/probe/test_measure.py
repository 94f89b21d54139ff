"""kernel_probe.probe.measure's yardsticks, checked against float64 arithmetic done here by hand:
the error measure (``rel_err``), the slot's maths (``reference``) and the hard inputs (``cases``) --
each input must really be hard in the way its name says, or a kernel that fails it would pass.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernel_probe.probe.measure import rel_err
from kernel_probe.probe.onetensor import cases, reference

F64 = torch.float64


def t(*values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


# ---- rel_err: max |got - ref| / max |ref| --------------------------------------------------------
@pytest.mark.parametrize(
    "got, ref, expected",
    [
        (t(1.0, -2.0, 3.0), t(1.0, -2.0, 3.0), 0.0),
        (t(1.0, -2.0, 3.5), t(1.0, -2.0, 3.0), 0.5 / 3.0),
        (t(-4.0, 0.0), t(-2.0, 0.0), 2.0 / 2.0),  # the scale is the largest |ref|, sign ignored
        # normwise: a tiny reference entry does not blow the error up (elementwise it would be 1.0)
        (t(2e-8, 2.0), t(1e-8, 2.0), 1e-8 / 2.0),
        # an all-zero reference: the error is divided by 1e-30, not by zero
        (t(1e-3, 0.0), t(0.0, 0.0), 1e-3 / 1e-30),
        (t(0.0, 0.0), t(0.0, 0.0), 0.0),
        # got in a lower precision is widened before the difference: 1 + 2**-7 is exact in bfloat16
        (t(1.0 + 2**-7, 2.0, dtype=torch.bfloat16), t(1.0, 2.0), 2**-7 / 2.0),
    ],
    ids=[
        "equal",
        "one-entry",
        "negative-scale",
        "normwise",
        "zero-reference",
        "both-zero",
        "bfloat16-got",
    ],
)
def test_rel_err(got, ref, expected):
    assert rel_err(got, ref) == pytest.approx(expected, rel=1e-12, abs=0.0)


@pytest.mark.parametrize(
    "got, ref",
    [
        (None, t(1.0)),  # an output missing on one side only
        (t(1.0), None),
        (t(1.0, 2.0), t(1.0, 2.0, 3.0)),  # a shape that differs is never a small error
        (t(1.0, 2.0).reshape(2, 1), t(1.0, 2.0)),
        (t(1.0, math.nan), t(1.0, 2.0)),  # NaN, +-inf in the output
        (t(math.inf, 2.0), t(1.0, 2.0)),
        (t(1.0, -math.inf), t(1.0, 2.0)),
        (t(1.0, 65504.0, dtype=torch.float16) * 2, t(1.0, 2.0)),  # overflowed in float16
    ],
    ids=[
        "got-none",
        "ref-none",
        "shape",
        "broadcastable-shape",
        "nan",
        "inf",
        "minus-inf",
        "float16-overflow",
    ],
)
def test_rel_err_is_infinite_for_what_no_tolerance_may_accept(got, ref):
    assert rel_err(got, ref) == math.inf


def test_rel_err_of_two_missing_outputs_is_zero_and_a_gradient_does_not_matter():
    assert rel_err(None, None) == 0.0
    got = t(1.0, 3.0).requires_grad_(True)
    assert rel_err(got * 1, t(1.0, 2.0)) == pytest.approx(1.0 / 2.0)


# ---- reference: the slot's maths in float64 ------------------------------------------------------
def _by_hand(semantics, rows, weight, bias, eps):
    """The formulas, element by element in Python floats (float64), nothing shared with torch."""
    out = []
    for row in rows:
        if semantics == "linear":
            y = [sum(x * w for x, w in zip(row, w_row, strict=True)) for w_row in weight]
        else:
            n = len(row)
            mean = sum(row) / n if semantics == "layer_norm" else 0.0
            # the variance, or the mean square for RMSNorm
            second = sum((x - mean) ** 2 for x in row) / n
            y = [(x - mean) / math.sqrt(second + eps) for x in row]
            y = [v * w for v, w in zip(y, weight, strict=True)] if weight is not None else y
        out.append([v + b for v, b in zip(y, bias, strict=True)] if bias is not None else y)
    return out


ROWS = [[1.0, 2.0, 3.0, 4.0], [-3.0, 0.5, 7.0, 1e3], [1.0, 1.0, 1.0, 1.0 + 1e-6]]
W, B = [0.5, -1.0, 2.0, 1.5], [0.1, 0.0, -0.2, 3.0]
LIN_W, LIN_B = [[1.0, 0.0, -1.0, 2.0], [0.5, 0.25, 0.125, -3.0]], [1.0, -1.0]


@pytest.mark.parametrize(
    "semantics, weight, bias, eps",
    [
        ("layer_norm", W, B, 1e-5),
        ("layer_norm", None, None, 1e-6),
        ("layer_norm", W, None, 0.0),
        ("rms_norm", W, B, 1e-6),
        ("rms_norm", None, None, 1e-5),
        ("rms_norm", W, None, 1e-8),
        ("linear", LIN_W, LIN_B, 0.0),
        ("linear", LIN_W, None, 0.0),
    ],
)
def test_reference_is_the_formula(semantics, weight, bias, eps):
    as_t = lambda v: None if v is None else torch.tensor(v, dtype=F64)  # noqa: E731
    got = reference(semantics, as_t(ROWS), as_t(weight), as_t(bias), eps)
    assert got.dtype == F64
    expected = torch.tensor(_by_hand(semantics, ROWS, weight, bias, eps), dtype=F64)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_reference_values_worked_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=F64)
    # mean 2.5, variance 1.25: (x - 2.5) / sqrt(1.25)
    ln = reference("layer_norm", x, None, None, 0.0)
    torch.testing.assert_close(ln, (x - 2.5) / math.sqrt(1.25), rtol=1e-15, atol=0.0)
    # mean square (1 + 4 + 9 + 16) / 4 = 7.5
    rms = reference("rms_norm", x, None, None, 0.0)
    torch.testing.assert_close(rms, x / math.sqrt(7.5), rtol=1e-15, atol=0.0)


def test_reference_depends_on_eps_where_the_variance_is_below_it():
    x = 0.5 + 1e-4 * torch.tensor([[1.0, -1.0, 2.0, -2.0]], dtype=F64)  # variance 2.5e-8
    a, b = (reference("layer_norm", x, None, None, eps) for eps in (1e-5, 1e-6))
    assert rel_err(a, b) > 0.5  # a wrong default eps is a large error, not a rounding


def test_reference_refuses_an_unknown_semantics():
    with pytest.raises(ValueError, match="group_norm"):
        reference("group_norm", t(1.0), None, None, 1e-5)


# ---- cases: the inputs real kernels get wrong ----------------------------------------------------
NORM_CASES = [
    "random",
    "tiny-variance",
    "large-mean",
    "large-magnitude",
    "non-contiguous-3d",
    "sequence",
    "residual",
]
NAMES = {
    "layer_norm": NORM_CASES,
    # the same hard inputs: the mean is what RMSNorm's tiny-variance case lacks
    "rms_norm": NORM_CASES,
    "linear": ["random", "large-magnitude", "non-contiguous-3d", "sequence", "residual"],
}
HIDDEN = 40  # small for the test; the probe uses CHECK_HIDDEN


def _cases(semantics, dtype=torch.float32, seed=0, mixed=False, hidden=HIDDEN):
    return cases(semantics, hidden, dtype, "cpu", torch.Generator().manual_seed(seed), mixed=mixed)


@pytest.mark.parametrize("semantics", NAMES)
@pytest.mark.parametrize("mixed", [False, True])
def test_each_semantics_gets_its_cases(semantics, mixed):
    got = [c.name for c in _cases(semantics, mixed=mixed)]
    expected = NAMES[semantics][:1] + (["float32-input"] if mixed else []) + NAMES[semantics][1:]
    assert got == expected
    assert [c.name for c in _cases(semantics, mixed=mixed) if c.residual] == ["residual"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("semantics", NAMES)
def test_every_input_has_the_dtype_and_the_hidden_size_asked(semantics, dtype):
    for case in _cases(semantics, dtype, mixed=True, hidden=37):
        assert case.inputs, case.name
        for x in case.inputs:
            want = torch.float32 if case.name == "float32-input" else dtype
            assert x.dtype == want and x.shape[-1] == 37 and x.device.type == "cpu", (
                case.name,
                x.dtype,
                x.shape,
            )


def test_the_sequence_holds_three_different_inputs_and_the_3d_case_is_a_strided_view():
    by = {c.name: c for c in _cases("layer_norm")}
    seq = by["sequence"].inputs
    assert len(seq) == 3 and not torch.equal(seq[0], seq[1]) and not torch.equal(seq[1], seq[2])
    [x] = by["non-contiguous-3d"].inputs
    assert x.dim() == 3 and not x.is_contiguous()  # rows that are views with a larger stride
    assert x.stride(-1) == 1 and x.stride(-2) > HIDDEN  # each row sits inside a wider one


def test_cases_are_the_same_for_the_same_seed_and_differ_for_another():
    def flat(cs):
        return [x for c in cs for x in c.inputs]

    a, b, c = (
        flat(_cases("rms_norm", seed=3)),
        flat(_cases("rms_norm", seed=3)),
        flat(_cases("rms_norm", seed=4)),
    )
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def _row_stats(x):
    x = x.to(F64)
    return x.mean(-1), x.var(-1, unbiased=False)


def test_tiny_variance_is_below_eps_so_the_result_depends_on_it():
    for semantics, centred in (("layer_norm", False), ("rms_norm", True)):
        [x] = {c.name: c for c in _cases(semantics)}["tiny-variance"].inputs
        mean, var = _row_stats(x)
        second = (x.to(F64) ** 2).mean(-1) if semantics == "rms_norm" else var
        assert second.max() < 1e-5, semantics  # below the usual eps: eps decides the output
        # RMSNorm's has no mean to hide behind
        assert (mean.abs().max() < 0.01) == centred, semantics
        a, b = (reference(semantics, x.to(F64), None, None, eps) for eps in (1e-5, 1e-6))
        assert rel_err(a, b) > 0.3, semantics


def test_large_mean_breaks_a_one_pass_variance_in_float32():
    [x] = {c.name: c for c in _cases("layer_norm")}["large-mean"].inputs
    mean, var = _row_stats(x)
    assert mean.min() > 900 and var.max() < 3  # a large mean over a small spread
    # E[x^2] - E[x]^2 in float32: catastrophic cancellation
    one_pass = (x * x).mean(-1) - x.mean(-1) ** 2
    assert rel_err(one_pass, var) > 1e-3  # far beyond float32's rounding of a two-pass variance
    two_pass = ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1)
    assert rel_err(two_pass, var) < 1e-4


def test_large_magnitude_overflows_a_square_taken_in_float16():
    [x] = {c.name: c for c in _cases("rms_norm", torch.float16)}["large-magnitude"].inputs
    assert torch.isinf(x * x).any()  # x**2 beyond 65504: a kernel squaring in float16 overflows
    ref = reference("rms_norm", x.to(F64), None, None, 1e-6)
    assert torch.isfinite(ref).all() and torch.isfinite(x).all()
    # and the reference divides the magnitude out: normalised rows have mean square 1
    torch.testing.assert_close(
        (ref**2).mean(-1), torch.ones(x.shape[0], dtype=F64), rtol=1e-6, atol=0.0
    )


def test_a_kernel_that_is_only_right_on_easy_inputs_is_caught_by_some_case():
    """The point of ``cases``: a LayerNorm computing the variance in one pass in float32 passes the
    random input and fails the large-mean one, measured with ``rel_err`` against ``reference``."""

    def one_pass_layer_norm(x, eps=1e-5):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) / torch.sqrt(var.clamp_min(0) + eps)

    by = {c.name: c for c in _cases("layer_norm")}
    errors = {}
    for name in ("random", "large-mean"):
        [x] = by[name].inputs
        errors[name] = rel_err(
            one_pass_layer_norm(x), reference("layer_norm", x.to(F64), None, None, 1e-5)
        )
    assert errors["random"] < 1e-5 and errors["large-mean"] > 1e-2, errors


# ---- on_device: the default device inside, nothing left behind -----------------------------------
@pytest.mark.parametrize("raises", [False, True])
def test_on_device_leaves_no_mode_and_the_default_device_as_it_was(raises):
    """Before, leaving restored ``torch.set_default_device(torch.get_default_device())``: with no
    default set that is ``cpu``, which pushes a device mode for good, so every later torch call in
    the worker went through it (and a test of a mode left by a raising forward failed after it)."""
    from kernel_probe.probe.measure import on_device

    stack, default = torch._C._len_torch_function_stack(), torch.get_default_device()

    class Raised(Exception):
        pass

    try:
        with on_device("cpu"):
            assert torch._C._len_torch_function_stack() == stack + 1
            assert torch.empty(1).device.type == "cpu"
            if raises:
                raise Raised
    except Raised:
        pass
    assert torch._C._len_torch_function_stack() == stack
    assert torch.get_default_device() == default
