"""kernel-probe at job start: cold probe time before and after issue 38, warm reuse cost, decision
stability.

Prints, measured in this one run, before and after interleaved (so machine noise hits both alike):
  - cold probe wall time with the default options, and with --precision 32-true: before, after,
    ratio (goals on this 2-core CPU: at most 15 s with the defaults, 10 s with 32-true)
  - whether before and after chose the same implementation in every slot, with the same verdicts
  - warm reuse wall time / `python -c "import torch"`      (goal: at most 1.3)
  - the choices of the cold probes                          (goal: all the same)

"Before" is today's behaviour before issue 38 (every accepted candidate timed with the device's
default repetitions: ``--reps 5`` on a CPU, which keeps the fixed count), or, with ``--before-tree
DIR``, the code of another checkout (a worktree of the previous commit) run with ``PYTHONPATH=DIR``.
``--emulate-avx2`` runs both with ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN then has no bf16 path, as on
an AVX2-only CPU (the one issue 38 was measured on), and bf16 matmul is emulated.

    python benchmarks/probe_time.py [--cold 3] [--warm 5] [--before-tree DIR] [--emulate-avx2]
                                    [--precisions default,32-true] [-- extra kernel-probe args]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_lock import launch  # noqa: E402  (this checkout's, found through ROOT)


def wall(argv: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> float:
    """Seconds the command took (started by the one launcher, in ``cwd``); a failure is printed
    with the end of its output and raises."""
    t = time.perf_counter()
    done = launch.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = [
            line
            for line in done.stderr.splitlines()
            if not line.startswith(("checking ", "timing "))
        ][-6:]
        print(
            f"FAILED (exit {done.returncode}): {' '.join(argv)}", *tail, sep="\n  ", file=sys.stderr
        )
        raise SystemExit(1)
    return time.perf_counter() - t


def outcome(path: Path) -> tuple[dict[str, str], dict[str, dict[str, str]], int]:
    """(per slot the implementation chosen, per slot every candidate's status, the timed calls in
    all)."""
    import kernel_lock

    lock = kernel_lock.load(path)
    chosen = {name: slot.implementation for name, slot in lock.slots.items()}
    statuses = {
        name: {slot.implementation: "chosen", **{r.implementation: r.status for r in slot.rejected}}
        for name, slot in lock.slots.items()
    }
    calls = sum(int(t.get("reps", 0)) for slot in lock.slots.values() for t in slot.timing)
    return chosen, statuses, calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", type=int, default=3, help="cold probes per side and precision")
    ap.add_argument("--warm", type=int, default=5, help="warm reuses (0: skip)")
    ap.add_argument(
        "--before-tree", type=Path, help="a checkout of the code before (PYTHONPATH=DIR)"
    )
    ap.add_argument(
        "--before-reps", type=int, default=5, help="without --before-tree: today's fixed count"
    )
    ap.add_argument(
        "--emulate-avx2", action="store_true", help="ONEDNN_MAX_CPU_ISA=AVX2 for both sides"
    )
    ap.add_argument("--precisions", default="default,32-true")
    ap.add_argument("extra", nargs="*", help="extra kernel-probe arguments (after --)")
    args = ap.parse_args()

    env = dict(os.environ)
    if args.emulate_avx2:
        env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    probe = [sys.executable, "-m", "kernel_probe"]
    sides: dict[str, tuple[list[str], dict[str, str], Path]] = {"after": ([], env, ROOT)}
    if args.before_tree is not None:
        tree = args.before_tree.resolve()
        # run from outside the tree: the probe's workers (python -I) never take the working
        # directory from PYTHONPATH, and would import this checkout's code through its install
        sides["before"] = ([], {**env, "PYTHONPATH": str(tree)}, Path(tempfile.gettempdir()))
        said = f"the code in {tree}"
    else:
        sides["before"] = (["--reps", str(args.before_reps)], env, ROOT)
        said = (
            f"--reps {args.before_reps} (every accepted candidate timed {args.before_reps} "
            "times, as before)"
        )
    from kernel_probe.detect import host

    bf16 = host.matmul(env=env)["bfloat16"]
    print(f"before: {said}; after: this tree's defaults")
    print(
        f"bf16 matmul here: {host.describe(bf16)}; load at start: {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory() as d:
        for precision in args.precisions.split(","):
            flags = [] if precision == "default" else ["--precision", precision]
            times: dict[str, list[float]] = {"before": [], "after": []}
            seen: dict[str, list[Any]] = {"before": [], "after": []}
            for i in range(args.cold):
                # interleaved, alternating
                for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    extra, side_env, cwd = sides[side]
                    out = Path(d) / f"{side}-{precision}-{i}.toml"
                    times[side].append(
                        wall(
                            [*probe, "--out", str(out), *flags, *extra, *args.extra], side_env, cwd
                        )
                    )
                    seen[side].append(outcome(out))
            b, a = statistics.median(times["before"]), statistics.median(times["after"])
            print(
                f"cold probe, {precision} precision (median of {args.cold} each, load now "
                f"{os.getloadavg()[0]:.1f}):"
            )
            print(
                f"  before {b:6.2f} s (min {min(times['before']):.2f}, max "
                f"{max(times['before']):.2f})"
            )
            print(
                f"  after  {a:6.2f} s (min {min(times['after']):.2f}, max "
                f"{max(times['after']):.2f})"
            )
            goal = 15 if precision == "default" else 10
            print(f"  ratio after / before {a / b:.3f}   (goal on 2 CPU cores: after <= {goal} s)")
            calls = {side: statistics.median(o[2] for o in seen[side]) for side in seen}
            print(
                f"  timed calls recorded in the lock: before {calls['before']:.0f}, after "
                f"{calls['after']:.0f}"
            )
            # compared on the slots both sides pin (a slot added since "before" has no before)
            common = set(seen["before"][0][0]) & set(seen["after"][0][0])

            def on(d: dict[str, Any], common: set[str] = common) -> dict[str, Any]:
                return {k: v for k, v in d.items() if k in common}

            ref = seen["before"][0]
            same_choice = all(on(o[0]) == on(ref[0]) for side in seen for o in seen[side])
            same_verdicts = all(on(o[1]) == on(ref[1]) for side in seen for o in seen[side])
            print(
                f"  same implementation in every slot, before and after: {same_choice} "
                f"{on(seen['after'][0][0])}"
            )
            print(f"  same verdict for every candidate, before and after: {same_verdicts}")
            added = {k: v for k, v in seen["after"][0][0].items() if k not in common}
            if added:
                print(f"  slots the after side pins that the before side does not have: {added}")
        if args.warm:
            warm_out = next(Path(d).glob("after-default-0.toml"), None) or next(
                Path(d).glob("after-*.toml")
            )
            # the name is after-PRECISION-I.toml, and a precision has a dash of its own (32-true)
            precision = warm_out.stem[len("after-") :].rpartition("-")[0]
            flags = [] if precision == "default" else ["--precision", precision]
            torch_times, warm_times = [], []
            wall([sys.executable, "-c", "import torch"], env)
            for _ in range(args.warm):  # interleaved, so drift hits both
                torch_times.append(wall([sys.executable, "-c", "import torch"], env))
                warm_times.append(wall([*probe, "--out", str(warm_out), *flags, *args.extra], env))
            t_torch, t_warm = statistics.median(torch_times), statistics.median(warm_times)
            print(f"import torch (median of {args.warm}):          {t_torch:6.2f} s")
            print(
                f"warm reuse   (median of {args.warm}):          {t_warm:6.2f} s   ratio "
                f"{t_warm / t_torch:.2f} (goal <= 1.3)"
            )
    print(f"load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
