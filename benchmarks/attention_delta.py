"""Where softmax's gradient nearly vanishes, how far each of torch's attention backends is from it
(issue 55's last row: a backward that takes softmax's delta, rowsum(dO * O), from the output rounded
to bf16 — anemoi-core #1027's class).

Three inputs, each rounded to the dtype first so the float64 reference sees the same values:
``random``; ``sharp`` (q, k scaled by 4); ``self-sharp`` (each query is three times its own key:
one key dominates every row, so dq and dk nearly vanish and the delta's rounding is all that is
left). Rows: torch's SDPA as dispatched, each backend forced, and two references written here in
float32 — the delta from the output rounded to the dtype, and from the float32 output. Printed:
the normwise relative error of out, dq, dk, dv against float64.

    python benchmarks/attention_delta.py [--device cpu|cuda] [--dtypes bfloat16,float16]
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


class _Delta(torch.autograd.Function):
    """Attention in float32 whose backward takes the delta from the output it saved: rounded to
    the inputs' dtype (``rounded=True``, what a kernel storing only its output does) or not."""

    @staticmethod
    def forward(ctx, q, k, v, rounded):
        scale = 1.0 / math.sqrt(q.shape[-1])
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        lse = torch.logsumexp(s, -1, keepdim=True)
        out32 = torch.exp(s - lse) @ v.float()
        ctx.save_for_backward(q, k, v, lse, out32.to(q.dtype) if rounded else out32)
        return out32.to(q.dtype)

    @staticmethod
    def backward(ctx, go):
        q, k, v, lse, out = ctx.saved_tensors
        scale = 1.0 / math.sqrt(q.shape[-1])
        p = torch.exp((q.float() @ k.float().transpose(-1, -2)) * scale - lse)
        dp = go.float() @ v.float().transpose(-1, -2)
        ds = p * (dp - (go.float() * out.float()).sum(-1, keepdim=True))
        dq, dk = (ds @ k.float()) * scale, (ds.transpose(-1, -2) @ q.float()) * scale
        dv = p.transpose(-1, -2) @ go.float()
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def inputs(device: str) -> dict[str, tuple]:
    """The three inputs in float64 (batch 1, 2 heads, 64 rows, head_dim 64), seeded."""
    gen = torch.Generator().manual_seed(0)

    def randn() -> torch.Tensor:
        return torch.randn(1, 2, 64, 64, generator=gen, dtype=torch.float64)

    q, k, v, go = randn(), randn(), randn(), randn()
    cases = {
        "random": (q, k, v, go),
        "sharp": (4 * q, 4 * k, v, go),
        "self-sharp": (3 * k, k, v, go),
    }
    return {name: tuple(t.to(device) for t in case) for name, case in cases.items()}


def grads(fn, case: tuple, dtype: torch.dtype) -> list[torch.Tensor]:
    """out, dq, dk, dv of ``fn`` on ``case`` in ``dtype``, as float64."""
    q, k, v = (t.to(dtype).detach().requires_grad_() for t in case[:3])
    out = fn(q, k, v)
    out.backward(case[3].to(dtype))
    return [t.detach().double() for t in (out, q.grad, k.grad, v.grad)]


def rows(device: str) -> dict[str, object]:
    """Each path's attention function by its label (one that cannot run here raises when called)."""
    paths: dict[str, object] = {"sdpa": F.scaled_dot_product_attention}
    for name, backend in BACKENDS.items():

        def forced(q, k, v, backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)

        paths[f"sdpa.{name}"] = forced
    paths["delta from rounded out"] = lambda q, k, v: _Delta.apply(q, k, v, True)
    paths["delta from fp32 out"] = lambda q, k, v: _Delta.apply(q, k, v, False)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    args = parser.parse_args()
    print(f"torch {torch.__version__} on {args.device}")
    for name, case in inputs(args.device).items():
        rounded = {
            dt: tuple(t.to(getattr(torch, dt)).double() for t in case)
            for dt in ("bfloat16", "float16")
        }
        for dt in args.dtypes.split(","):
            exact = rounded.get(dt, case)
            ref = grads(F.scaled_dot_product_attention, exact, torch.float64)
            print(f"\n{name}, {dt}: relative error of out, dq, dk, dv")
            for label, fn in rows(args.device).items():
                try:
                    got = grads(fn, exact, getattr(torch, dt))
                except RuntimeError as exc:
                    print(f"  {label:24s} cannot run here: {str(exc).splitlines()[0][:80]}")
                    continue
                errs = [float((a - r).norm() / r.norm()) for a, r in zip(got, ref, strict=True)]
                print(f"  {label:24s} " + "  ".join(f"{e:.2e}" for e in errs))


if __name__ == "__main__":
    main()
