"""kernel_probe.probe.onetensor's initialisation test: does a fresh candidate start where a fresh
torch.nn module starts?"""

from __future__ import annotations

import math

import pytest
import torch

from kernel_probe.probe import onetensor as initstats
from kernel_probe.probe.onetensor import ALPHA, Z, describe, same_distribution
from kernel_probe.probe.onetensor import init_difference as compare


def draws(seed: int, n: int, dist: str, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dist == "uniform":
        return (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * scale
    return torch.randn(n, generator=g, dtype=torch.float64) * scale


@pytest.mark.parametrize(
    "tensor,text",
    [
        (torch.zeros(4), "zeros"),
        (torch.ones(2, 3), "ones"),
        (torch.full((3,), 0.5), "the constant 0.5"),
        (torch.empty(0), "empty"),
        (torch.tensor([1.0, 3.0]), "values with mean 2, std 1.414 in [1, 3]"),
    ],
)
def test_describe(tensor, text):
    assert describe(tensor) == text


def test_alpha_and_its_normal_quantile_agree():
    # Z is the two-sided normal quantile at ALPHA: P(|N(0,1)| > Z) = ALPHA
    assert math.erfc(Z / math.sqrt(2)) == pytest.approx(ALPHA, rel=1e-3)


@pytest.mark.parametrize(
    "n,m,alpha,k",
    [
        (10, 10, 0.6, 0),  # P(count >= 1) = 1/2 < 0.6: none allowed
        (10, 10, 0.4, 1),  # P(count >= 2) = 10/20 * 9/19 = 0.237
        (1, 3, 0.3, 0),  # P(count >= 1) = 1/4
        (100, 100, 0.01, 6),  # about 2^-k: 2^-7 < 0.01 <= 2^-6
        (384_000, 384_000, 1e-6, 19),  # a Linear's weight in the checks: 2^-20 < 1e-6 <= 2^-19
        (
            5,
            5,
            1e-9,
            5,
        ),  # all of the candidate's beyond has probability 5!5!/10! = 0.004: never refused
    ],
)
def test_exceedance_quantile(n, m, alpha, k):
    assert initstats._exceedance_quantile(n, m, alpha) == k

    def tail(j):  # P(count >= j): the j largest of the pool are all the candidate's
        return math.prod((n - i) / (n + m - i) for i in range(j))

    assert (k == n or tail(k + 1) < alpha) and (k == 0 or tail(k) >= alpha)  # the smallest such k


def test_the_bounds_test_keeps_its_false_alarm_rate():
    """Simulated: how often a candidate drawn exactly as torch.nn draws has more values beyond
    torch.nn's largest than allowed. The count's tail is geometric (torch.nn's own maximum varies),
    so a Poisson quantile would allow too few: at n = m it refuses about 3% of correct draws where
    1% was meant."""
    g, n, alpha, trials = torch.Generator().manual_seed(7), 100, 0.01, 20_000
    c, r = torch.rand(trials, n, generator=g), torch.rand(trials, n, generator=g)
    beyond = (c > r.max(dim=1, keepdim=True).values).sum(dim=1)
    rate = float((beyond > initstats._exceedance_quantile(n, n, alpha)).double().mean())
    assert 0.005 < rate <= alpha  # exact law: 2^-7 = 0.0078 (sd of the estimate 0.0006)
    poisson_allowed = 4  # the 1 - 0.01 quantile of Poisson(n / (n + 1)): P(X > 4) = 0.0037
    assert float((beyond > poisson_allowed).double().mean()) > 2.5 * alpha  # 2^-5 = 0.031


@pytest.mark.parametrize(
    "a,b,d",
    [
        ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 0.0),
        ([1.0, 2.0], [3.0, 4.0], 1.0),
        ([1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 5.0, 6.0], 0.5),
    ],
)
def test_ks_statistic(a, b, d):
    assert (
        initstats._ks(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
        == d
    )


def test_the_same_distribution_passes_every_test():
    assert same_distribution(draws(1, 4000, "uniform"), draws(2, 4000, "uniform")) == []


@pytest.mark.parametrize(
    "candidate,failed",
    [
        (
            draws(3, 4000, "normal", 0.58),
            ["beyond torch.nn's bound", "Kolmogorov-Smirnov"],
        ),  # normal vs uniform
        (
            draws(3, 4000, "uniform") + 0.5,
            ["beyond torch.nn's bound", "mean differs", "Kolmogorov-Smirnov"],
        ),
        (draws(3, 4000, "uniform", 0.5), ["spread differs", "Kolmogorov-Smirnov"]),
    ],
    ids=["normal", "shifted", "narrower"],
)
def test_another_distribution_fails_named_tests(candidate, failed):
    got = same_distribution(candidate, draws(2, 4000, "uniform"))
    for name in failed:
        assert any(name in text for text in got), (name, got)
    assert len(got) == len(failed)


@pytest.mark.parametrize(
    "candidate,reference,expected",
    [
        (torch.ones(8), torch.ones(8), None),
        (torch.zeros(8), torch.ones(8), "starts as zeros; torch.nn starts as ones"),
        (torch.ones(8), torch.ones(4), "has shape (8,), torch.nn (4,)"),
        (torch.ones(2, 4), torch.ones(4, 2), "has shape (2, 4), torch.nn (4, 2)"),
        (
            torch.full((3,), 0.5),
            torch.zeros(3),
            "starts as the constant 0.5; torch.nn starts as zeros",
        ),
    ],
)
def test_compare_deterministic_inits(candidate, reference, expected):
    assert compare(candidate, reference) == expected


def test_compare_random_inits_by_distribution():
    torch.manual_seed(0)
    reference = torch.nn.Linear(64, 32).weight
    assert compare(torch.nn.Linear(64, 32).weight, reference) is None
    bad = compare(torch.zeros(32, 64), reference)  # zeros where torch.nn draws at random
    assert bad.startswith("starts as zeros; torch.nn draws values with mean ")
    assert "spread differs" not in bad  # a constant has no spread to compare
    assert bad.endswith(f"(each test at a false-alarm rate of {ALPHA:g})")


def test_torch_init_adapter_restores_linear_and_norm_init():
    from kp_zoo.norms import NormalInitLinear, RandnBiasLayerNorm

    import kernel_lock.adapters as adapters

    assert adapters.TORCH_INIT_ADAPTERS["TELinear"] == (
        "transformer_engine.pytorch.Linear",
        "linear",
    )
    Linear = adapters.torch_init_adapter(NormalInitLinear, "linear", "NormalInitLinearTorchInit")
    fresh, reference = Linear(64, 32), torch.nn.Linear(64, 32)
    assert isinstance(fresh, NormalInitLinear) and list(fresh.state_dict()) == ["weight", "bias"]
    assert (
        compare(fresh.weight, reference.weight) is None
        and compare(fresh.bias, reference.bias) is None
    )
    # without the adapter, the same class does not start like torch.nn
    assert "Kolmogorov-Smirnov" in compare(NormalInitLinear(64, 32).weight, reference.weight)
    Norm = adapters.torch_init_adapter(RandnBiasLayerNorm, "layer_norm", "X")
    assert torch.equal(Norm(64).bias, torch.zeros(64)) and torch.equal(
        Norm(64).weight, torch.ones(64)
    )
