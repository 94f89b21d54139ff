"""Wall time of ``kernel-probe env`` as a ratio to ``python -c "import torch"``.

    python benchmarks/env_time.py [--runs 5]

Goals (issue 37): ``env --json --no-import-checks`` at most 1.5x a bare torch import, and ``env
--json`` under 3 s on an idle 2-core machine, a first one (``--fresh``) included. ``env --json
--fresh`` imports every installed kernel library (and Triton) in child processes, as a first ``env``
on a node does; the difference to ``--no-import-checks`` is what those checks cost on this machine.
``env --json`` reuses the answers the ``--fresh`` runs kept (in a temporary cache folder, not the
user's). Every command is a fresh interpreter, timed end to end; the runs are interleaved so a slow
moment hits all three alike; the median is reported, with the CPU time of the command and its
children (what a busy machine does not inflate as much as the wall time) and the load average it ran
under. On a machine others are using, ``chrt -r 10 python benchmarks/env_time.py`` (root) runs every
timed process ahead of theirs, which stands in for an idle machine.

The floor of a first ``env``: each import check is a bare interpreter that imports the library and
tears down (so a crash at exit is seen); ``import <module> (bare child)`` times that for each
installed library of the registry, and a first ``env`` cannot end before the slowest of them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kernel_lock import launch  # noqa: E402  (this checkout's, found through ROOT)

COMMANDS = {
    "import torch": [sys.executable, "-c", "import torch"],
    "env --json --no-import-checks": [
        sys.executable,
        "-m",
        "kernel_probe",
        "env",
        "--json",
        "--no-import-checks",
    ],
    "env --json --fresh": [sys.executable, "-m", "kernel_probe", "env", "--json", "--fresh"],
    "env --json": [sys.executable, "-m", "kernel_probe", "env", "--json"],
}


def _bare_imports() -> dict[str, list[str]]:
    """``python -I -c "import <module>"`` for each installed library's import-check module."""
    from kernel_probe.detect import libraries, report

    requests = report.import_requests(libraries.locate_all())
    return {
        f"import {r.module} (bare child)": [sys.executable, "-I", "-c", f"import {r.module}"]
        for r in requests.values()
    }


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the command's and its children's), started
    by the one launcher in this checkout."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = launch.start(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            launch.kill_group(proc.pid)  # what it left running, or itself when interrupted
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(
                f"{' '.join(argv[1:])} failed ({proc.returncode}):\n{err.read().decode()}"
            )
    return seconds, usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (default 5)")
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="kp-env-time-")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
        KERNEL_PROBE_CACHE_DIR=cache,
    )

    bare = _bare_imports()
    COMMANDS.update(bare)
    for argv in COMMANDS.values():  # warm the file cache once; not counted
        _time(argv, env)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpu: dict[str, list[float]] = {name: [] for name in COMMANDS}
    loads = []
    for _ in range(args.runs):
        for name, argv in COMMANDS.items():
            wall, used = _time(argv, env)
            samples[name].append(wall)
            cpu[name].append(used)
            loads.append(os.getloadavg()[0])

    median = {name: statistics.median(values) for name, values in samples.items()}
    base = median["import torch"]
    print(
        f"{args.runs} runs each, median wall time, {os.cpu_count()} CPUs, python "
        f"{sys.version.split()[0]}, load average {min(loads):.1f}-{max(loads):.1f}"
    )
    for name, seconds in median.items():
        spread = f"{min(samples[name]):.2f}-{max(samples[name]):.2f}"
        used = statistics.median(cpu[name])
        print(
            f"  {name:<48} {seconds:6.2f} s  ({spread})  {seconds / base:5.2f}x import torch  "
            f"{used:5.2f} CPU-s"
        )
    cheap = median["env --json --no-import-checks"] / base
    added = median["env --json --fresh"] - median["env --json --no-import-checks"]
    kept = median["env --json"]
    verdict = "met" if cheap <= 1.5 else "NOT met"
    print(f"env without import checks: {cheap:.2f}x import torch (goal <= 1.5x: {verdict})")
    print(f"fresh import checks add {added:.2f} s ({added / base:.2f}x import torch)")
    fresh = median["env --json --fresh"]
    print(
        f"a first env (--fresh): {fresh:.2f} s (goal < 3 s idle: "
        f"{'met' if fresh < 3 else 'NOT met'})"
    )
    print(f"env with kept answers: {kept:.2f} s (goal < 3 s: {'met' if kept < 3 else 'NOT met'})")
    print(f"  {median['env --json --fresh'] / kept:.2f}x faster than a fresh one")
    if bare:
        slowest = max(bare, key=median.__getitem__)
        print(
            f"floor of a first env: {slowest} {median[slowest]:.2f} s "
            f"({fresh - median[slowest]:+.2f} s above it)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
