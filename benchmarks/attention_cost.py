"""What the Attention slot's check costs on this machine, and what it adds to a cold CPU probe.

1. The check of one candidate (kernel_probe.slots.attention_kernels.check: every case, the band's
   edge, the second length, determinism, the twin, the capability matrix), in-process, for torch's
   SDPA, at the probe's own check geometry (2 heads x head_dim 32 x 48 positions) and at a larger
   one (4 x 64 x 256), per dtype of the CPU probe's plan (float32 and bfloat16), fastest of
   ``--rounds``.
2. A cold CPU probe (``kernel-probe --out ... --force`` in a fresh process: workers, checks, timing)
   with the three other slots only, and with the Attention slot added (the default), interleaved
   rounds; the difference of the fastest of each is the slot's cost (goal: at most 3 s).

    python benchmarks/attention_cost.py [--rounds 3] [--no-probe]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_lock import launch  # noqa: E402  (this checkout's, found through ROOT)


def check_cost(rounds: int) -> None:
    from kernel_probe.candidates import builtin
    from kernel_probe.slots import attention_kernels as attention

    cand = next(c for c in builtin() if c.id == "torch.sdpa")
    # torch's first calls (lazy initialisation) apart
    attention.check(cand, "cpu", [("float32", "true")])
    for heads, dim, seq in (
        (attention.CHECK_HEADS, attention.CHECK_DIM, attention.CHECK_SEQ),
        (4, 64, 256),
    ):
        saved = attention.CHECK_HEADS, attention.CHECK_DIM, attention.CHECK_SEQ
        attention.CHECK_HEADS, attention.CHECK_DIM, attention.CHECK_SEQ = heads, dim, seq
        try:
            for dtype in ("float32", "bfloat16"):
                best = min(
                    _timed(lambda d=dtype: attention.check(cand, "cpu", [(d, "true")]))
                    for _ in range(rounds)
                )
                print(f"check of torch.sdpa at {heads}x{dim}x{seq} {dtype}: {best:.2f} s")
        finally:
            attention.CHECK_HEADS, attention.CHECK_DIM, attention.CHECK_SEQ = saved


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def probe_cost(rounds: int) -> None:
    without = ["--slot", "LayerNorm", "--slot", "RMSNorm", "--slot", "Linear"]
    times: dict[str, list[float]] = {"without Attention": [], "with Attention": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for name, extra in (("without Attention", without), ("with Attention", [])):
                argv = [
                    sys.executable,
                    "-m",
                    "kernel_probe",
                    "--out",
                    f"{tmp}/l.toml",
                    "--force",
                    *extra,
                ]
                t = time.perf_counter()
                launch.run(argv, cwd=tmp).check_returncode()  # the one launcher, in tmp
                times[name].append(time.perf_counter() - t)
    for name, values in times.items():
        print(
            f"cold CPU probe {name}: fastest {min(values):.1f} s "
            f"({', '.join(f'{v:.1f}' for v in values)})"
        )
    print(
        "the Attention slot adds "
        f"{min(times['with Attention']) - min(times['without Attention']):.1f} s (goal <= 3 s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-probe", action="store_true", help="only the check's cost")
    args = ap.parse_args()
    check_cost(args.rounds)
    if not args.no_probe:
        probe_cost(args.rounds)


if __name__ == "__main__":
    main()
