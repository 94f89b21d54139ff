"""Job start at scale (issue 28): how hard N ranks starting at once hit the shared lock directory.

Simulates a job of NODES x RANKS processes on this machine, each with the launcher variables a rank
has (Slurm's by default: SLURM_JOB_ID, SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS) and
a node-local $TMPDIR shared by the ranks of one simulated node, all running ``kernel-probe --out
SHARED/kernel-lock.toml`` at once, under ``strace -f -y`` (file-name system calls, flock and fcntl).
It counts the calls that name the shared directory (a path argument, or a file descriptor ``-y``
shows to be in it): in total, by system call, lock calls (flock, fcntl F_SETLK*), and the peak per
wall-clock second; and how many ranks probed (``"reused": false`` in their --json) and failed.

    python benchmarks/jobstart_scale.py [--nodes 8] [--ranks 8] [--start cold|warm|both]
        [--no-flock] [--no-rank-variables] [--tree PATH] [-- extra kernel-probe args]

--no-flock simulates a file system that refuses file locks: a sitecustomize (first on PYTHONPATH)
makes ``fcntl.flock`` and ``fcntl.lockf`` raise ENOLCK without calling the kernel, so the refused
calls themselves are not counted (on a real file system each is one call more). --tree runs another
checkout's code (e.g. the main branch, for a before/after), through PYTHONPATH. Cold: no lock
before the job starts; warm: the lock a cold start wrote, and a new job id. Prints figures; asserts
nothing. Needs strace (apt-get install strace).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kernel_lock import launch
from kernel_lock.files import write_file
from kernel_lock.launch import python_argv

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROBE = ["--slot", "LayerNorm", "--shape", "64x32", "--reps", "1"]

NO_FLOCK = """\
import errno, fcntl


def _refuse(*args, **kwargs):
    raise OSError(errno.ENOLCK, "No locks available (simulated)")


fcntl.flock = _refuse
fcntl.lockf = _refuse
"""

# Starts every rank at once (through the one launcher, in the folder each job names), waits for
# all, writes their exit codes and --json replies.
LAUNCHER = """\
import json, subprocess, sys
from kernel_lock import launch
jobs = json.load(open(sys.argv[1]))
procs = [launch.start(j["argv"], env=j["env"], cwd=j["cwd"], stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE)
         for j in jobs]
out = []
for p in procs:
    o, e = (s.decode("utf-8", "replace") for s in p.communicate())
    launch.kill_group(p.pid)
    out.append({"code": p.returncode, "stdout": o, "stderr": e})
from kernel_lock.files import write_file  # the one safe writer
write_file(sys.argv[2], json.dumps(out))
"""

LINE = re.compile(r"^(\d+)\s+(\d\d):(\d\d):(\d\d\.\d+)\s+(\w+)\(")


def rank_env(
    base: dict[str, str], job: str, node: int, local: int, ranks: int, total: int, tmp: Path
) -> dict:
    env = {
        k: v
        for k, v in base.items()
        if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PALS_", "TORCHELASTIC_"))
    }
    env.update(
        SLURM_JOB_ID=job,
        SLURM_PROCID=str(node * ranks + local),
        SLURM_LOCALID=str(local),
        SLURM_NODEID=str(node),
        SLURM_NTASKS=str(total),
        TMPDIR=str(tmp),
    )
    return env


def run_job(args, shared: Path, nodes_dir: Path, job: str, site: Path | None, trace: Path) -> dict:
    lock = shared / "kernel-lock.toml"
    total = args.nodes * args.ranks
    base = dict(os.environ)
    paths = [str(p) for p in (site, args.tree) if p] + [base.get("PYTHONPATH", "")]
    base["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    jobs = []
    for node in range(args.nodes):
        tmp = nodes_dir / f"node{node}"
        tmp.mkdir(exist_ok=True)
        for local in range(args.ranks):
            env = (
                {**base, "TMPDIR": str(tmp)}
                if args.no_rank_variables
                else rank_env(base, job, node, local, args.ranks, total, tmp)
            )
            argv = [sys.executable, "-m", "kernel_probe", "--out", str(lock), "--json", *args.extra]
            # not a checkout: --tree decides
            jobs.append({"argv": argv, "env": env, "cwd": str(nodes_dir)})
    results, spec = trace.with_suffix(".json"), trace.with_suffix(".jobs")
    write_file(spec, json.dumps(jobs))
    strace = ["strace", "-f", "-y", "-qq", "-tt", "-o", str(trace), "-e", "trace=%file,flock,fcntl"]
    if args.seccomp:
        strace.insert(1, "--seccomp-bpf")
    began = time.perf_counter()
    # the launcher of the ranks is a Python child: started by the one launcher
    # (kernel_lock.launch), under strace, in the job's folder
    done = launch.run(
        [*strace, *python_argv(LAUNCHER, [str(spec), str(results)], roots=[str(ROOT)])],
        cwd=nodes_dir,
    )
    if done.returncode:
        raise SystemExit(
            f"strace or the launcher of the ranks exited {done.returncode}: {done.stderr[-2000:]}"
        )
    wall = time.perf_counter() - began
    replies = json.loads(results.read_text())
    return {"wall": wall, "replies": replies, **count(trace, str(shared))}


def count(trace: Path, shared: str) -> dict:
    total, locks, per_call = 0, 0, collections.Counter()
    per_second: collections.Counter[int] = collections.Counter()
    first = None
    with trace.open(errors="replace") as fh:
        for line in fh:
            if shared not in line or "resumed>" in line:
                continue
            m = LINE.match(line)
            if not m:
                continue
            call = m.group(5)
            t = int(m.group(2)) * 3600 + int(m.group(3)) * 60 + float(m.group(4))
            first = t if first is None else first
            total += 1
            per_call[call] += 1
            per_second[int(t - first)] += 1
            if call == "flock" or (call == "fcntl" and "SETLK" in line):
                locks += 1
    peak = max(per_second.values(), default=0)
    return {"calls": total, "locks": locks, "by_call": dict(per_call.most_common()), "peak": peak}


def report(name: str, r: dict) -> None:
    replies = r["replies"]
    probed = failed = 0
    for rep in replies:
        if rep["code"] != 0:
            failed += 1
            continue
        try:
            probed += json.loads(rep["stdout"])["reused"] is False
        except (ValueError, KeyError):
            failed += 1
    print(
        f"{name}: {len(replies)} ranks, {probed} probed, {failed} failed, wall {r['wall']:.1f} s; "
        f"shared-directory calls {r['calls']} (lock calls {r['locks']}), peak {r['peak']}/s"
    )
    print("    by call: " + ", ".join(f"{k} {v}" for k, v in r["by_call"].items()))
    for rep in replies:
        if rep["code"] != 0:
            tail = rep["stderr"].strip().splitlines()[-1:] or [""]
            print(f"    exit {rep['code']}: {tail[0][:300]}")
            break


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=8, help="ranks per node")
    ap.add_argument("--start", choices=("cold", "warm", "both"), default="both")
    ap.add_argument(
        "--no-flock", action="store_true", help="simulate a file system without file locks"
    )
    ap.add_argument(
        "--no-rank-variables",
        action="store_true",
        help="start the ranks without launcher variables",
    )
    ap.add_argument(
        "--tree",
        type=Path,
        default=None,
        help="run this checkout's code (default: the installed one)",
    )
    ap.add_argument(
        "--seccomp",
        action="store_true",
        help="strace --seccomp-bpf (faster where the kernel allows)",
    )
    ap.add_argument("--keep", type=Path, default=None, help="keep the traces in this directory")
    ap.add_argument(
        "extra",
        nargs="*",
        help="kernel-probe arguments (after --); default: " + " ".join(DEFAULT_PROBE),
    )
    args = ap.parse_args()
    args.extra = args.extra or DEFAULT_PROBE
    if not shutil.which("strace"):
        sys.exit("strace is not installed (apt-get install strace)")
    with tempfile.TemporaryDirectory(prefix="jobstart-scale-") as d:
        work = Path(d)
        shared, nodes_dir = work / "shared", work / "nodes"
        shared.mkdir()
        nodes_dir.mkdir()
        site = None
        if args.no_flock:
            site = work / "site"
            site.mkdir()
            write_file(site / "sitecustomize.py", NO_FLOCK)
        keep = args.keep or work
        keep.mkdir(parents=True, exist_ok=True)
        print(
            f"{args.nodes} nodes x {args.ranks} ranks, "
            f"{'no ' if args.no_rank_variables else ''}launcher variables, file locks "
            f"{'refused (simulated)' if args.no_flock else 'working'}, code from "
            f"{args.tree or ROOT}, {os.cpu_count()} CPUs; kernel-probe --out "
            f"{shared}/kernel-lock.toml {' '.join(args.extra)}",
            flush=True,
        )
        stamp = str(int(time.time()))
        if args.start in ("cold", "both"):
            report("cold", run_job(args, shared, nodes_dir, f"{stamp}1", site, keep / "cold.trace"))
        if args.start in ("warm", "both"):
            if not (shared / "kernel-lock.toml").exists():
                print("warm: no lock was written by the cold start; skipped")
                return
            report("warm", run_job(args, shared, nodes_dir, f"{stamp}2", site, keep / "warm.trace"))


if __name__ == "__main__":
    main()
