"""What the check at the model's shapes (kernel_probe.probe.atshape) adds to timing, on this
machine.

For torch.nn's candidate of each slot, ``timing.time_candidate`` runs with the options the probe
uses on this device type (CPU: 5 repetitions, 3 warm-up calls, no minimum time), once with the check
after timing and once without, interleaved so that drift hits both alike. Printed per configuration
and overall (in one run, as ratios):

  - wall time with the check / without it - 1, from the fastest of the rounds of each (the least
    disturbed run: on a shared machine other processes only ever add time) and from the medians
    (goal: at most 15 %)
  - the same in CPU time of this process

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
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shape", default="2048x1024")
    args = ap.parse_args()
    from kernel_probe.candidates import builtin
    from kernel_probe.probe import timing
    from kernel_probe.probe.planning import DEFAULT_REPS

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
        f"{'candidate':18} {'shape':14} {'dtype/regime':15} {'without':>8} {'with':>8} "
        f"{'extra(min)':>10} {'extra(median)':>13} {'cpu extra(min)':>14}"
    )
    sums = {"off": 0.0, "on": 0.0, "moff": 0.0, "mon": 0.0, "coff": 0.0, "con": 0.0}
    for cid, slot, shape, dtype, regime in configs:
        cand = next(c for c in builtin() if c.id == cid)
        # warm the allocator and kernels
        timing.time_candidate(cand, slot, "cpu", [shape], dtype, regime, opts)
        wall: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for check in (False, True):
                t, c = time.perf_counter(), time.process_time()
                timing.time_candidate(
                    cand, slot, "cpu", [shape], dtype, regime, {**opts, "check": check}
                )
                wall[check].append(time.perf_counter() - t)
                cpu[check].append(time.process_time() - c)
        off, on = min(wall[False]), min(wall[True])
        moff, mon = statistics.median(wall[False]), statistics.median(wall[True])
        coff, con = min(cpu[False]), min(cpu[True])
        for key, value in zip(sums, (off, on, moff, mon, coff, con), strict=True):
            sums[key] += value
        print(
            f"{cid:18} {shape:14} {dtype + '/' + regime:15} {off:7.3f}s {on:7.3f}s "
            f"{100 * (on / off - 1):9.1f}% "
            f"{100 * (mon / moff - 1):12.1f}% {100 * (con / coff - 1):13.1f}%"
        )
    print(
        "overall (sums over the configurations): the check adds "
        f"{100 * (sums['on'] / sums['off'] - 1):.1f} % to timing (fastest rounds), "
        f"{100 * (sums['mon'] / sums['moff'] - 1):.1f} % (medians), "
        f"{100 * (sums['con'] / sums['coff'] - 1):.1f} % in CPU time; goal: at most 15 %"
    )


if __name__ == "__main__":
    main()
