"""What the check at the model's shapes (kernel_probe.atshape) adds to timing, on this machine.

For torch.nn's candidate of each slot, ``timing.time_candidate`` runs with the options the probe uses on
this device type (CPU: 5 repetitions, 3 warm-up calls, no minimum time), once with the check after
timing and once without, interleaved so that drift hits both alike. Printed per configuration and
overall (in one run, as ratios):

  - wall time with the check / without it - 1   (goal: at most 15 %)
  - the same in CPU time of this process (less sensitive to other processes on a shared machine)
  - the check's own time (its ``seconds``, which include the warm-up call it is) / the wall time without it

    python benchmarks/atshape_cost.py [--rounds 7] [--shape 2048x1024]

The CPU default shape of the probe is 2048x1024 and its default precision bf16-mixed; the Linear is
measured in float32 here, because this CPU has no bf16 matrix unit (a bf16 Linear step takes tens of
seconds, and the ratio is the same: one more forward and backward).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shape", default="2048x1024")
    args = ap.parse_args()
    from kernel_probe import timing
    from kernel_probe.candidates import BUILTIN
    from kernel_probe.pipeline import DEFAULT_REPS

    reps = DEFAULT_REPS["cpu"]
    opts = {"reps": reps, "warmup": min(3, reps), "min_seconds": 0.0}
    rows, hidden = args.shape.split("x")[:2]
    configs = [
        ("torch.layer_norm", "LayerNorm", args.shape, "bfloat16", "mixed"),
        ("torch.layer_norm", "LayerNorm", args.shape, "float32", "true"),
        ("torch.rms_norm", "RMSNorm", args.shape, "bfloat16", "mixed"),
        ("torch.rms_norm", "RMSNorm", args.shape, "float32", "true"),
        ("torch.linear", "Linear", f"{rows}x{hidden}x{hidden}", "float32", "true"),
    ]
    print(f"options {opts}; {args.rounds} interleaved rounds; medians")
    print(
        f"{'candidate':18} {'shape':16} {'dtype/regime':16} {'without':>9} {'with':>9} {'extra':>7} "
        f"{'cpu extra':>9} {'check':>7}"
    )
    total_off = total_on = total_check = cpu_off = cpu_on = 0.0
    for cid, slot, shape, dtype, regime in configs:
        cand = next(c for c in BUILTIN if c.id == cid)
        timing.time_candidate(cand, slot, "cpu", [shape], dtype, regime, opts)  # warm the allocator and kernels
        off, on, own, c_off, c_on = [], [], [], [], []
        for _ in range(args.rounds):
            for check in (False, True):
                t, c = time.perf_counter(), time.process_time()
                reply = timing.time_candidate(cand, slot, "cpu", [shape], dtype, regime, {**opts, "check": check})
                (on if check else off).append(time.perf_counter() - t)
                (c_on if check else c_off).append(time.process_time() - c)
                if check:
                    own.append(reply.rows[0]["check"]["seconds"])
        m_off, m_on, m_own = statistics.median(off), statistics.median(on), statistics.median(own)
        mc_off, mc_on = statistics.median(c_off), statistics.median(c_on)
        total_off, total_on, total_check = total_off + m_off, total_on + m_on, total_check + m_own
        cpu_off, cpu_on = cpu_off + mc_off, cpu_on + mc_on
        print(
            f"{cid:18} {shape:16} {dtype + '/' + regime:16} {m_off:8.3f}s {m_on:8.3f}s "
            f"{100 * (m_on / m_off - 1):6.1f}% {100 * (mc_on / mc_off - 1):8.1f}% {100 * m_own / m_off:6.1f}%"
        )
    print(
        f"overall: the check adds {100 * (total_on / total_off - 1):.1f} % to timing in wall time, "
        f"{100 * (cpu_on / cpu_off - 1):.1f} % in CPU time (goal: at most 15 %)"
    )


if __name__ == "__main__":
    main()
