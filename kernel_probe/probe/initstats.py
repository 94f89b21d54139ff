"""Initialisation: does a freshly built candidate start where a freshly built torch.nn module
starts?

Runs in the worker (it imports torch). Deterministic initialisations (ones, zeros, any constant)
must be equal. Random ones (torch.nn.Linear's kaiming-uniform weight and uniform bias) must come
from the same distribution, judged on one fresh draw of each with four tests, each at a false-alarm
rate of ``ALPHA`` (so a correct candidate is flagged with probability below 4 x ALPHA per
parameter):

- **bounds**: how many candidate values lie beyond the largest magnitude torch.nn drew. From the
  same distribution the n + m magnitudes are exchangeable, so at least k of the candidate's lie
  beyond all of torch.nn's exactly when the k largest of the pool are all the candidate's: ``P(count
  >= k) = prod_{i<k} (n - i) / (n + m - i)``, about ``(n / (n + m))^k`` (a geometric tail, heavier
  than a Poisson's: torch.nn's own maximum varies from draw to draw). More than the count whose tail
  is below ``ALPHA`` fails (a normal init where torch.nn is uniform has thousands);
- **mean**: a two-sample z-test on the means;
- **spread**: the log ratio of the variances against its large-sample normal law (2/n + 2/m);
- **shape of the distribution**: the two-sample Kolmogorov-Smirnov statistic against its critical
  value ``sqrt(-ln(ALPHA / 2) * (n + m) / (2 n m))``.
"""

from __future__ import annotations

import math

import torch

ALPHA = 1e-6  # false-alarm rate of each test
Z = 4.8916  # two-sided normal quantile at ALPHA


def describe(t: torch.Tensor) -> str:
    """A tensor's values in words: zeros, ones, a constant, or mean, std and range."""
    t = t.detach().double().flatten()
    if t.numel() == 0:
        return "empty"
    lo, hi = t.min().item(), t.max().item()
    if lo == hi:
        return {0.0: "zeros", 1.0: "ones"}.get(lo, f"the constant {lo:.6g}")
    return (
        f"values with mean {t.mean().item():.4g}, std {t.std().item():.4g} in [{lo:.4g}, {hi:.4g}]"
    )


def _exceedance_quantile(n: int, m: int, alpha: float) -> int:
    """The smallest k with P(count > k) < alpha, where count is how many of n draws exceed the
    maximum of m more draws from the same continuous distribution: P(count >= j) = prod_{i<j}
    (n-i)/(n+m-i)."""
    k, tail = 0, 1.0  # tail = P(count >= k + 1) once multiplied by the next factor
    while k < n:
        tail *= (n - k) / (n + m - k)
        if tail < alpha:
            return k
        k += 1
    return n


def _ks(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic (sup |F_a - F_b|)."""
    a, b = a.sort().values, b.sort().values
    points = torch.cat([a, b])
    fa = torch.searchsorted(a, points, right=True).double() / a.numel()
    fb = torch.searchsorted(b, points, right=True).double() / b.numel()
    return float((fa - fb).abs().max())


def same_distribution(candidate: torch.Tensor, reference: torch.Tensor) -> list[str]:
    """The tests ``candidate`` fails as a draw from ``reference``'s distribution (empty: none)."""
    c, r = candidate.detach().double().flatten(), reference.detach().double().flatten()
    n, m = c.numel(), r.numel()
    failed = []
    bound = r.abs().max().item()
    beyond = int((c.abs() > bound).sum())
    allowed = _exceedance_quantile(n, m, ALPHA)
    if beyond > allowed:
        failed.append(
            f"{beyond} values beyond torch.nn's bound {bound:.4g} (at most {allowed} expected)"
        )
    var_c, var_r = c.var().item(), r.var().item()
    z = (c.mean().item() - r.mean().item()) / math.sqrt(max(var_c / n + var_r / m, 1e-300))
    if abs(z) > Z:
        failed.append(f"mean differs (z = {z:.1f})")
    if var_c > 0 and var_r > 0:
        zl = math.log(var_c / var_r) / math.sqrt(2.0 / n + 2.0 / m)
        if abs(zl) > Z:
            failed.append(f"spread differs (std {math.sqrt(var_c):.4g} vs {math.sqrt(var_r):.4g})")
    d = _ks(c, r)
    critical = math.sqrt(-math.log(ALPHA / 2) * (n + m) / (2.0 * n * m))
    if d > critical:
        failed.append(f"distribution differs (Kolmogorov-Smirnov D = {d:.4f} > {critical:.4f})")
    return failed


def compare(candidate: torch.Tensor, reference: torch.Tensor) -> str | None:
    """Why ``candidate`` (a fresh parameter) does not start like ``reference``; None when it
    does."""
    c, r = candidate.detach().float().cpu(), reference.detach().float().cpu()
    if c.shape != r.shape:
        return f"has shape {tuple(c.shape)}, torch.nn {tuple(r.shape)}"
    if not r.numel():
        return None  # two empty parameters start alike
    if r.numel() and r.min() == r.max():  # deterministic: ones, zeros, a constant
        if torch.equal(c, r):
            return None
        return f"starts as {describe(c)}; torch.nn starts as {describe(r)}"
    failed = same_distribution(c, r)
    if not failed:
        return None
    return (
        f"starts as {describe(c)}; torch.nn draws {describe(r)}: {'; '.join(failed)} "
        f"(each test at a false-alarm rate of {ALPHA:g})"
    )
