"""Every GPU figure in one command, each part under its own time limit; and the report made from
them.

    python benchmarks/gpu_all.py --out DIR            # on the GPU node (docs/benchmarks.md)
    python benchmarks/gpu_all.py --out DIR --smoke    # anywhere: every part at CPU-sized shapes
    python benchmarks/gpu_all.py --report DIR [--doc docs/benchmarks.md] [--anchor ANCHOR.json]

The parts, in order, each a child process (its own session: at its limit the whole process group,
probe workers included, is killed, the part is recorded as timed out, and the next part runs):

  probe-cold   `kernel-probe --force` at the GPU shapes (bf16-mixed): job start with no lock
  probe-warm   the same command again: job start with a current lock (reused, no probing)
  choice       benchmarks/gpu_choice.py: the probe's choice against an independent timer
  anemoi       benchmarks/anemoi_step.py: one anemoi training step, torch.nn / the lock / liger
  tests        pytest -m gpu tests/test_gpu.py: the verdicts users rely on, on the real device
  attention    tests/gpu_suite.py's attention part: SDPA's backends forced one by one and
               flash-attn, checked and timed fwd+bwd in fp16/bf16 at anemoi's O96 geometry, peak
               memory each; first the GraphTransformer's attention (anemoi's Triton kernel and PyG)
               checked against float64 and timed at the O96-era processor graph; then its
               gated-MLP part in the same process:
               torch's and liger's gate for swiglu and geglu at anemoi's shape (1024 -> 2734), bf16,
               timed at 40320x1024
  model        benchmarks/model_check.py --kit: check-model on the GPU with the cold probe's lock
               (the README's model; anemoi's transformer, O96 data, O32 processor grid), then the
               step of anemoi's transformer processor at O96 beside the anchor (FA2 142 ms, FA3
               74 ms); last, on what the budget has left (the others' limits sum to the 480 s)

Everything lands in DIR: run.json (each part's status, seconds, limit and command), logs/PART.out
(stdout: the probes' --json summaries) and logs/PART.log (stderr), probe/kernel-lock.toml (the cold
probe's lock, used by the anemoi and model parts), choice/, anemoi/, tests/, attention/, model/.
The whole run is also held to ``--budget`` seconds: a part never gets more than what is left of
it, so the run ends within the budget whatever a part does (docs/benchmarks.md, "Sizing", shows
how the limits were sized).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(ROOT)]

from gpu_facts import GPU_SHAPES, SMOKE_SHAPES, write_json  # noqa: E402

from kernel_lock import launch  # noqa: E402  (this checkout's, found through ROOT)

O96_ATTENTION = (
    "16x128x40320:window=512"  # anemoi's O96 processor: 16 heads of 128 over 40,320 nodes
)
SMOKE_ATTENTION = "2x32x128:window=8"

GPU_BUDGET = 480.0  # the goal: the whole run within 8 minutes on an H200
SMOKE_BUDGET = (
    1500.0  # a 2-core CPU shared with other jobs; alone the smoke takes well under 6 minutes
)


@dataclass(frozen=True)
class Part:
    name: str
    argv: tuple[str, ...]
    limit_s: float
    env: Mapping[str, str] | None = None


def parts(out: Path, smoke: bool) -> list[Part]:
    """The run's parts with their commands and limits (GPU limits: docs/benchmarks.md, "Sizing")."""
    py = sys.executable
    shapes = SMOKE_SHAPES if smoke else GPU_SHAPES
    lock = out / "probe" / "kernel-lock.toml"
    probe = [py, "-m", "kernel_probe", "--out", str(lock), "--precision", "bf16-mixed", "--json"]
    probe += [arg for s in shapes for arg in ("--shape", s)]
    # the Attention slot at anemoi's O96 processor geometry (SDPA's backends, flash-attn where its
    # wheel is carried); the smoke at a CPU-sized one with a window, so the band is checked and
    # timed there too
    probe += ["--attention", SMOKE_ATTENTION if smoke else O96_ATTENTION]
    smoke_flag = ["--smoke"] if smoke else []
    # GPU: limits sum to 480 s, the budget (docs/benchmarks.md, "Sizing"; the attention part's 5 s
    # more are its gated-MLP part, issue 39); smoke: generous, for a 2-core CPU shared with other
    # jobs
    limits = (
        {
            "probe-cold": 100,
            "probe-warm": 5,
            "choice": 180,
            "anemoi": 40,
            "tests": 90,
            "attention": 65,
            "model": 70,
        }
        if not smoke
        else {
            "probe-cold": 240,
            "probe-warm": 60,
            "choice": 300,
            "anemoi": 180,
            "tests": 120,
            "attention": 120,
            "model": 600,
        }
    )
    return [
        Part("probe-cold", (*probe, "--force"), limits["probe-cold"]),
        Part("probe-warm", tuple(probe), limits["probe-warm"]),
        Part(
            "choice",
            (py, str(BENCH / "gpu_choice.py"), "--out", str(out / "choice"), *smoke_flag),
            limits["choice"],
        ),
        Part(
            "anemoi",
            (
                py,
                str(BENCH / "anemoi_step.py"),
                "--out",
                str(out / "anemoi"),
                "--lock",
                str(lock),
                *smoke_flag,
            ),
            limits["anemoi"],
        ),
        Part(
            "tests",
            (
                py,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "gpu",
                "-rs",
                str(ROOT / "tests" / "test_gpu.py"),
            ),
            limits["tests"],
            env={"KP_GPU_OUT": str(out / "tests")},
        ),
        Part(
            "attention",
            (py, "-m", "tests.gpu_suite", "--out", str(out / "attention"), *smoke_flag),
            limits["attention"],
        ),
        Part(
            "model",
            (py, str(BENCH / "model_check.py"), "--kit", "--out", str(out / "model"))
            + ("--lock", str(lock), *smoke_flag),
            limits["model"],
        ),
    ]


def run_part(part: Part, out: Path, limit: float) -> dict[str, Any]:
    """Run one part through the one launcher, in this checkout, its session killed at ``limit``
    seconds (SIGTERM, SIGKILL 5 s later) or when it ends; its stdout in ``out/logs/NAME.out`` (the
    probe's --json summary), its stderr in ``out/logs/NAME.log``."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(part.env or {})}
    # the checkout first, so the parts run this tree's kernel_probe (the GPU node has it as a plain
    # copy)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH", "")])])
    record: dict[str, Any] = {
        "name": part.name,
        "command": list(part.argv),
        "limit_s": round(limit, 1),
    }
    t0 = time.perf_counter()
    with (
        open(logs / f"{part.name}.out", "wb") as stdout,
        open(logs / f"{part.name}.log", "wb") as stderr,
    ):
        try:
            done = launch.run(
                part.argv,
                cwd=ROOT,
                env=env,
                stdout=stdout,
                stderr=stderr,
                timeout=max(limit, 0.1),
                grace=5,
            )
            record["returncode"] = done.returncode
            record["status"] = "ok" if done.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            record["status"] = "timed out"
            record["returncode"] = None
    record["seconds"] = round(time.perf_counter() - t0, 2)
    record["log"] = f"logs/{part.name}.log"
    return record


def run_parts(
    run: Sequence[Part], out: Path, budget: float, *, header: Mapping[str, Any]
) -> dict[str, Any]:
    """Each part in turn, within its limit and what is left of ``budget``; ``out/run.json`` after
    each."""
    result: dict[str, Any] = {**header, "budget_s": budget, "parts": []}
    start = time.perf_counter()
    for part in run:
        left = budget - (time.perf_counter() - start)
        if left <= 1:
            result["parts"].append(
                {"name": part.name, "status": "not run", "reason": "the run's budget is spent"}
            )
            continue
        record = run_part(part, out, min(part.limit_s, left))
        result["parts"].append(record)
        print(
            f"{part.name:11s} {record['status']:9s} {record['seconds']:7.1f} s (limit "
            f"{record['limit_s']:g} s)",
            flush=True,
        )
        result["seconds"] = round(time.perf_counter() - start, 2)
        write_json(out / "run.json", result)
    result["seconds"] = round(time.perf_counter() - start, 2)
    write_json(out / "run.json", result)
    return result


def _earlier(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def merge_rerun(earlier: Mapping[str, Any], rerun: Mapping[str, Any]) -> dict[str, Any]:
    """An ``--only`` rerun into a run's directory: its parts replace theirs, the others' records
    stay."""
    again = {p["name"]: p for p in rerun["parts"]}
    parts = [again.pop(p["name"], p) for p in earlier.get("parts", [])] + list(again.values())
    for p in parts:
        if p["name"] in {r["name"] for r in rerun["parts"]}:
            p["rerun"] = True
    seconds = round(sum(p.get("seconds", 0.0) for p in parts), 2)
    return {**earlier, "parts": parts, "seconds": seconds}


def _limits(text: Sequence[str], names: Sequence[str]) -> dict[str, float]:
    out = {}
    for item in text:
        name, _, value = item.partition("=")
        if name not in names or not value:
            raise SystemExit(
                f"--limit {item!r}: expected PART=SECONDS with PART one of {', '.join(names)}"
            )
        out[name] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, help="run every part, results into this directory")
    what.add_argument(
        "--report", type=Path, metavar="DIR", help="write the report from a run's directory"
    )
    ap.add_argument(
        "--smoke", action="store_true", help="CPU-sized shapes (figures labelled SMOKE)"
    )
    ap.add_argument("--only", action="append", help="run only these parts (repeatable)")
    ap.add_argument(
        "--limit", action="append", default=[], help="PART=SECONDS: override a part's limit"
    )
    ap.add_argument(
        "--budget",
        type=float,
        help=f"seconds for the whole run (default {GPU_BUDGET:g}; smoke {SMOKE_BUDGET:g})",
    )
    ap.add_argument(
        "--doc",
        type=Path,
        default=ROOT / "docs" / "benchmarks.md",
        help="with --report: the page to update",
    )
    ap.add_argument(
        "--anchor",
        type=Path,
        help="with --report: an anchor JSON (../shared/anchors) to compare with",
    )
    args = ap.parse_args(argv)
    if args.report is not None:
        from gpu_report import write_report

        page = write_report(args.report, args.doc, anchor=args.anchor)
        print(f"wrote {page}")
        return 0
    out: Path = args.out
    (out / "probe").mkdir(parents=True, exist_ok=True)
    if args.smoke:
        # gpu_facts.smoke_threads, for every part's processes
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    run = parts(out, args.smoke)
    names = [p.name for p in run]
    overrides = _limits(args.limit, names)
    for name in args.only or ():
        if name not in names:
            raise SystemExit(f"--only {name!r}: parts are {', '.join(names)}")
    run = [
        Part(p.name, p.argv, overrides.get(p.name, p.limit_s), p.env)
        for p in run
        if not args.only or p.name in args.only
    ]
    header = {"smoke": args.smoke, "shapes": list(SMOKE_SHAPES if args.smoke else GPU_SHAPES)}
    budget = args.budget or (SMOKE_BUDGET if args.smoke else GPU_BUDGET)
    earlier = _earlier(out / "run.json") if args.only else None
    result = run_parts(run, out, budget, header=header)
    if earlier is not None:
        result = merge_rerun(earlier, result)
        write_json(out / "run.json", result)
    print(json.dumps({p["name"]: p["status"] for p in result["parts"]}))
    print(
        f"whole run {result['seconds']:.1f} s; report: python benchmarks/gpu_all.py --report {out}"
    )
    return 0 if all(p["status"] == "ok" for p in result["parts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
