"""kernel-probe at job start: cold probe time, warm reuse cost, and decision stability.

Prints, measured in this one run (ratios, so machine noise hits both sides alike):
  - warm reuse wall time / `python -c "import torch"`   (goal: at most 1.3)
  - cold probe wall time on this machine                   (goal on 2 CPU cores: at most 15 s; GPU: 45 s)
  - the choices of 5 cold probes                           (goal: the same 5 of 5)

    python benchmarks/probe_time.py [--cold 5] [--warm 7] [-- extra kernel-probe args]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def wall(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", type=int, default=5)
    ap.add_argument("--warm", type=int, default=7)
    ap.add_argument("extra", nargs="*", help="extra kernel-probe arguments (after --)")
    args = ap.parse_args()
    import kernel_lock

    probe = [sys.executable, "-m", "kernel_probe"]
    with tempfile.TemporaryDirectory() as d:
        cold_times, choices = [], []
        for i in range(args.cold):
            out = Path(d) / f"cold{i}.toml"
            cold_times.append(wall([*probe, "--out", str(out), *args.extra]))
            lock = kernel_lock.load(out)
            choices.append(tuple(sorted((s, e.implementation) for s, e in lock.slots.items())))
        warm_out = Path(d) / "cold0.toml"
        torch_times, warm_times = [], []
        wall([sys.executable, "-c", "import torch"])
        for _ in range(args.warm):  # interleaved, so drift hits both
            torch_times.append(wall([sys.executable, "-c", "import torch"]))
            warm_times.append(wall([*probe, "--out", str(warm_out), *args.extra]))
    t_torch, t_warm = statistics.median(torch_times), statistics.median(warm_times)
    print(f"import torch (median of {args.warm}):          {t_torch:6.2f} s")
    print(
        f"warm reuse   (median of {args.warm}):          {t_warm:6.2f} s   ratio {t_warm / t_torch:.2f} (goal <= 1.3)"
    )
    print(
        f"cold probe   (median of {args.cold}, min {min(cold_times):.2f}, max {max(cold_times):.2f}): "
        f"{statistics.median(cold_times):6.2f} s   (goal <= 15 s on 2 CPU cores, <= 45 s on a GPU node)"
    )
    same = sum(c == choices[0] for c in choices)
    print(f"decision stability: {same} of {len(choices)} cold probes chose {dict(choices[0])}")


if __name__ == "__main__":
    main()
