"""Job start at scale (issue 18): what every rank's warm check costs next to `import torch`.

Measured in this one run, so machine noise hits every side alike:
  - wall time of warm `kernel-probe --out L`, `kernel-probe --out L --check`, `kernel-probe verify L
    --no-import` (the job-start check) and `kernel-probe verify L` (which imports every class, so
    torch) with a current lock, and of `python -c "import torch"`: medians of interleaved fresh
    starts, and each as a ratio to `import torch` (goal: warm run and --check at most 0.35)
  - the files each one opens and the modules it imports, counted by an audit hook ("open" events)
    installed from a sitecustomize in a temporary folder put first on PYTHONPATH
  - for reference, the floors: `python -c "pass"` and the torch-free fingerprint alone
    (kernel_lock.torchless), which is what the warm path can cost once it uses it
  - N concurrent warm `kernel-probe --out L` on one lock (default 64): the slowest one's wall time,
    the whole batch's, and how many failed (goal: none)

    python benchmarks/jobstart.py [--runs 7] [--concurrent 64] [--lock PATH] [-- kernel-probe args]

Without --lock, one cold probe writes the lock first (not timed here; benchmarks/probe_time.py
does). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernel_lock import launch
from kernel_lock.files import write_file

ROOT = Path(__file__).resolve().parent.parent

# Counts what a process opens and imports, written at exit as JSON to $JOBSTART_COUNTS/<pid>.json.
# Installed as sitecustomize (imported by site at start-up, before the command's own code).
SITECUSTOMIZE = """\
import atexit, json, os, sys

_out = os.environ.get("JOBSTART_COUNTS")
_opened = []


def _hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


def _write():
    # counted before the write's import
    record = {"argv": sys.argv, "opened": len(_opened), "distinct": len(set(_opened)),
              "modules": len(sys.modules), "torch": "torch" in sys.modules}
    from kernel_lock.files import write_file  # the one safe writer

    write_file(os.path.join(_out, f"{os.getpid()}.json"), json.dumps(record))


if _out:
    sys.addaudithook(_hook)
    atexit.register(_write)
"""


def quiet(argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run ``argv`` through the one launcher, in this checkout, its output dropped; raise if it
    fails."""
    done = launch.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done.check_returncode()


def wall(argv: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    quiet(argv, env)
    return time.perf_counter() - t


def counts(argv: list[str], site: Path) -> dict:
    """Files opened and modules imported by one run of ``argv`` (its own process only)."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(
            os.environ,
            JOBSTART_COUNTS=out,
            PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")])),
        )
        quiet(argv, env)
        reports = [json.loads(p.read_text()) for p in Path(out).glob("*.json")]
    if not reports:
        return {"opened": -1, "distinct": -1, "modules": -1, "torch": None, "processes": 0}
    # the command itself, not a worker it started
    first = min(reports, key=lambda r: len(r["argv"]))
    return {**first, "processes": len(reports)}


def concurrent(argv: list[str], n: int) -> tuple[float, float, list[str]]:
    """Start ``n`` copies at once (the one launcher, in this checkout); (slowest single wall time,
    whole batch, failures)."""
    start = time.perf_counter()
    procs: list[tuple[float, subprocess.Popen[bytes]]] = []
    slowest, failures = 0.0, []
    try:
        for _ in range(n):
            began = time.perf_counter()
            procs.append(
                (
                    began,
                    launch.start(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE),
                )
            )
        for began, proc in procs:
            err = proc.communicate()[1].decode("utf-8", "replace").strip()
            slowest = max(slowest, time.perf_counter() - began)
            if proc.returncode != 0:
                failures.append(f"exit {proc.returncode}: {err.splitlines()[-1] if err else ''}")
    finally:
        for _, proc in procs:
            launch.kill_group(proc.pid)  # what each left running, or each when interrupted
    return slowest, time.perf_counter() - start, failures


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument(
        "--runs", type=int, default=7, help="interleaved fresh starts per command (default 7)"
    )
    ap.add_argument(
        "--concurrent", type=int, default=64, help="concurrent warm runs on one lock (default 64)"
    )
    ap.add_argument(
        "--lock",
        type=Path,
        default=None,
        help="an existing lock to reuse (default: probe one first)",
    )
    ap.add_argument(
        "extra",
        nargs="*",
        help="extra kernel-probe arguments (after --), as the lock was probed with",
    )
    args = ap.parse_args()

    probe = [sys.executable, "-m", "kernel_probe"]
    with tempfile.TemporaryDirectory() as d:
        lock = args.lock or Path(d) / "kernel-lock.toml"
        if args.lock is None:
            print(f"probing once to write {lock} ...", flush=True)
            wall([*probe, "--out", str(lock), *args.extra])
        site = Path(d) / "site"
        site.mkdir()
        write_file(site / "sitecustomize.py", SITECUSTOMIZE)

        commands = {
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "kernel-probe --out L": [*probe, "--out", str(lock), *args.extra],
            "kernel-probe --out L --check": [*probe, "--out", str(lock), "--check", *args.extra],
            "kernel-probe verify L --no-import": [*probe, "verify", str(lock), "--no-import"],
            "kernel-probe verify L": [
                *probe,
                "verify",
                str(lock),
            ],  # imports every class: torch too
            # floors, for reference: the interpreter alone, and the torch-free fingerprint alone
            'python -c "pass"': [sys.executable, "-c", "pass"],
            "torchless.fingerprint()": [
                sys.executable,
                "-c",
                "import kernel_lock.torchless as t; t.fingerprint()",
            ],
        }
        for argv in commands.values():  # warm the page cache and fail early on a stale lock
            wall(argv)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):  # interleaved, so drift hits every command alike
            for name, argv in commands.items():
                times[name].append(wall(argv))
        opened = {name: counts(argv, site) for name, argv in commands.items()}
        slowest, batch, failures = concurrent(commands["kernel-probe --out L"], args.concurrent)

    base = statistics.median(times['python -c "import torch"'])
    print(
        f"\nwall time, median of {args.runs} interleaved fresh starts (min-max), ratio to import "
        "torch; files opened (distinct) and modules imported by the command's own process"
    )
    for name in commands:
        med = statistics.median(times[name])
        c = opened[name]
        goal = (
            "  (goal <= 0.35)"
            if name in ("kernel-probe --out L", "kernel-probe --out L --check")
            else ""
        )
        print(
            f"  {name:<34} {med:6.3f} s ({min(times[name]):.3f}-{max(times[name]):.3f})  ratio "
            f"{med / base:5.2f}{goal:<16}  opens {c['opened']:5d} ({c['distinct']:5d})  modules "
            f"{c['modules']:5d}  torch imported: {c['torch']}"
        )
    print(
        f"\n{args.concurrent} concurrent warm `kernel-probe --out L` on one lock "
        f"({os.cpu_count()} CPUs): slowest "
        f"{slowest:.2f} s, batch {batch:.2f} s, failures {len(failures)}"
    )
    for failure in sorted(set(failures)):
        print(f"  {failures.count(failure)} x {failure}")


if __name__ == "__main__":
    main()
