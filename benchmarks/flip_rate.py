"""The probe's choice under load: how often the winner of a slot flips between cold probes while a
CPU hog keeps one core busy, before and after, in one run (issue 56).

Prints, per tree ("before": a git revision exported with ``git archive`` and run with its own
``python -m kernel_probe``, PYTHONPATH set to it; "after": this tree), per slot:
  - the winners of the N cold probes, and the flip rate: the probes whose winner is not the most
    common one, of N (goal: 0 where the candidates differ by less than their interval, at most 1
    in 10 anywhere);
  - per challenger, its ratio to the default (default's time / its time, summed over the slot's
    shapes, so > 1 is faster): the median over the N probes and the range they span, and the
    noise the lock itself records for it (its spread, or the ratio's interval where rows carry one).
The two trees' probes alternate (before, after; then after, before), so load and drift hit both.
The hog is one child busy on one core (started through kernel_lock.launch, killed at the end).

    python benchmarks/flip_rate.py [--runs 10] [--before 71842b5] [--slots LayerNorm,Attention]
                                   [--shape 4096x256] [--attention 4x32x256] [--no-hog]
                                   [-- extra kernel-probe arguments]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_lock import launch  # noqa: E402  (this checkout's, found through ROOT)

BEFORE = "71842b5"  # the merge-base with main when issue 56's work started
# what a timing row records of its noise: the spread (before), a ratio and its interval (after)
RECORDED = ("ratio", "interval")
# one core kept busy: pinned to the last CPU this process may use, where it can be pinned
HOG = (
    "import os\n"
    "if hasattr(os, 'sched_setaffinity'):\n"
    "    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})\n"
    "while True:\n"
    "    pass\n"
)


def export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (``git archive``), unpacked in ``into``; SystemExit names a failure."""
    into.mkdir()
    tar = into / "before.tar"
    for argv, cwd in (
        (["git", "archive", "--format=tar", "-o", str(tar), rev], ROOT),
        (["tar", "-xf", str(tar)], into),
    ):
        done = launch.run(argv, cwd=cwd)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr}")
    return into


def probe(tree: Path, out: Path, argv: Sequence[str]) -> float:
    """One cold probe with ``tree``'s kernel_probe, writing ``out``: its wall seconds. A failure
    is printed with the end of its output and stops the benchmark."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "kernel_probe", "--out", str(out), *argv]
    t0 = time.perf_counter()
    # from outside the tree: the workers (python -I) drop a PYTHONPATH entry that is the working
    # directory, and would import this checkout's code through its install (as probe_time.py)
    done = launch.run(command, cwd=out.parent, env=env)
    if done.returncode != 0:
        tail = "\n  ".join(done.stderr.splitlines()[-6:])
        raise SystemExit(f"FAILED (exit {done.returncode}): {' '.join(command)}\n  {tail}")
    return time.perf_counter() - t0


def outcome(path: Path) -> dict[str, dict[str, Any]]:
    """Per slot of the lock: the winner, each challenger's ratio to the default (summed times),
    and what its timing rows record of their noise (``spread``, a ratio, an interval)."""
    import kernel_lock
    from kernel_probe.candidates import default_for

    lock = kernel_lock.load(path, emit_warnings=False)
    found = {}
    for name, slot in lock.slots.items():
        totals: dict[str, float] = collections.defaultdict(float)
        recorded: dict[str, dict[str, Any]] = {}
        for row in slot.timing:
            ms = row.get("median-ms")
            if isinstance(ms, (int, float)) and ms > 0:
                totals[str(row.get("implementation"))] += float(ms)
            said = {k: v for k, v in row.items() if k == "spread" or k.startswith(RECORDED)}
            if said:
                recorded[str(row.get("implementation"))] = said
        default = default_for(name).id
        base = totals.get(default, 0.0)
        ratios = {c: base / t for c, t in totals.items() if c != default and base and t}
        found[name] = {"winner": slot.implementation, "ratios": ratios, "recorded": recorded}
    return found


def flip_rate(winners: Sequence[str]) -> tuple[int, str]:
    """(the probes whose winner is not the most common one, that winner)."""
    if not winners:
        return 0, ""
    common, count = collections.Counter(winners).most_common(1)[0]
    return len(winners) - count, common


def summary(runs: Sequence[Mapping[str, dict[str, Any]]]) -> list[str]:
    """The lines for one tree's probes: per slot the winners, flips and ratios."""
    lines = []
    for name in sorted({n for r in runs for n in r}):
        winners = [r[name]["winner"] for r in runs if name in r]
        flips, common = flip_rate(winners)
        tally = ", ".join(f"{w} x{n}" for w, n in collections.Counter(winners).most_common())
        lines.append(f"  {name}: flip rate {flips}/{len(winners)} (most often {common}; {tally})")
        for cand in sorted({c for r in runs if name in r for c in r[name]["ratios"]}):
            got = [
                r[name]["ratios"][cand] for r in runs if cand in r.get(name, {}).get("ratios", {})
            ]
            line = (
                f"    {cand}: default / it {statistics.median(got):.3f} "
                f"(range {min(got):.3f}-{max(got):.3f} over {len(got)} probes)"
            )
            said = [r[name]["recorded"][cand] for r in runs if cand in r[name]["recorded"]]
            if said:
                line += f"; recorded: {said[len(said) // 2]} (the middle probe's)"
            lines.append(line)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--runs", type=int, default=10, help="cold probes per tree (default 10)")
    ap.add_argument("--before", default=BEFORE, help=f"the git revision before (default {BEFORE})")
    ap.add_argument("--slots", default="LayerNorm,Attention", help="the slots probed")
    ap.add_argument("--shape", default="4096x256", help="the one-tensor slots' shape")
    ap.add_argument("--attention", default="4x32x256", help="the Attention slot's geometry")
    ap.add_argument("--no-hog", action="store_true", help="no CPU hog (an idle machine)")
    ap.add_argument("extra", nargs="*", help="extra kernel-probe arguments (after --)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    slots = [s for s in args.slots.split(",") if s]
    flags = [a for s in slots for a in ("--slot", s)] + ["--shape", args.shape]
    flags += ["--attention", args.attention] if "Attention" in slots else []
    flags += list(args.extra)
    with tempfile.TemporaryDirectory() as d:
        trees = {"before": export(args.before, Path(d, "before")), "after": ROOT}
        hog = None if args.no_hog else launch.start([sys.executable, "-c", HOG], cwd=d)
        try:
            print(f"kernel-probe {' '.join(flags)}; {args.runs} cold probes per tree")
            hogging = "none" if hog is None else "one core busy"
            print(
                f"load at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; hog: {hogging}"
            )
            results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            seconds: dict[str, list[float]] = {"before": [], "after": []}
            for i in range(args.runs):
                for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    out = Path(d, f"{side}-{i}.toml")
                    seconds[side].append(probe(trees[side], out, flags))
                    results[side].append(outcome(out))
        finally:
            if hog is not None:
                launch.kill_group(hog.pid)
                hog.wait()
    for side in ("before", "after"):
        what = f"{args.before} (git archive)" if side == "before" else "this tree"
        print(f"{side}: {what}, median {statistics.median(seconds[side]):.1f} s a probe")
        print(*summary(results[side]), sep="\n")
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
