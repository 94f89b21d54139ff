"""Is the probe's choice the fastest? An independent timer checks it, in the same run.

For each precision (bf16 under autocast as anemoi trains, and float32; plain bf16 on request) this
runs the probe as a library (``kernel_probe.jobstart.run``: checks, timing, choice, lock) at
the three GPU shapes, then times every candidate the probe accepted with a harness written apart
from ``kernel_probe/probe/timing.py``: ``triton.testing.do_bench`` (median; it flushes the L2 cache
before each repetition) where CUDA and triton are there, CUDA events around each call with an L2
flush between calls where only CUDA is, and ``time.perf_counter`` on a CPU (smoke runs only). Its
copy ceiling is its own too: a device-to-device copy of a buffer far larger than any cache, read +
write counted.

Per (slot, shape, precision) it prints and writes (``OUT/choice.json``):
  - the probe's choice at that shape (what ``kernel-probe --shape S`` chooses from these very
    measurements) and the lock's choice over all three shapes, each with its harness time and the
    probe's own measured time;
  - the fastest accepted candidate by the harness, and its time;
  - ratio = chosen / fastest (goal: at most 1.03) and % of copy bandwidth (norms: 5 N D bytes for
    forward + backward; Linear: also TFLOP/s).

    python benchmarks/gpu_choice.py --out DIR              # on a GPU: the GPU shapes
    python benchmarks/gpu_choice.py --out DIR --smoke      # anywhere: CPU-sized, labelled SMOKE
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_facts import (  # noqa: E402
    GPU_SHAPES,
    PRECISIONS,
    SMOKE_SHAPES,
    environment,
    smoke_threads,
    write_json,
)

ATTENTION = "Attention"
from kernel_lock.slots import PRECISIONS as ALL_PRECISIONS  # noqa: E402

GOAL = 1.03  # the chosen candidate within 3 % of the fastest accepted one
L2_FLUSH_BYTES = 256 * 2**20  # larger than any GPU's L2 (H200: 60 MB)


# ---- the harness's own timer ---------------------------------------------------------------------
class Timer:
    """Median milliseconds of ``fn()``, by the best clock this machine has."""

    def __init__(self, device: str, *, quick: bool = False):
        import torch

        self.device = device
        self.quick = quick
        self.kind = "cpu perf_counter"
        if device == "cuda":
            try:
                from triton.testing import do_bench

                self._do_bench: Callable[..., float] | None = do_bench
                self.kind = "triton.testing.do_bench (median)"
            except ImportError:
                self._do_bench = None
                self.kind = "CUDA events (median, L2 flushed between calls)"
                self._flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def __call__(self, fn: Callable[[], Any]) -> float:
        import torch

        if self.device == "cuda" and self._do_bench is not None:
            return float(self._do_bench(fn, warmup=25, rep=100, return_mode="median"))
        if self.device == "cuda":
            for _ in range(5):
                fn()
            samples = []
            for _ in range(30):
                self._flush.zero_()
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            return statistics.median(samples)
        for _ in range(1 if self.quick else 3):
            fn()
        samples = []
        deadline = time.perf_counter() + (0.05 if self.quick else 0.5)
        while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 50):
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1000)
        return statistics.median(samples)


def copy_gbps(timer: Timer, smoke: bool) -> float:
    """GB/s of a device-to-device copy (read + write), the practical ceiling of a memory-bound
    norm."""
    import torch

    n = (64 if smoke else 2048) * 2**20 // 2  # bf16 elements: 64 MiB on a CPU, 2 GiB on a GPU
    a = torch.randn(n, dtype=torch.bfloat16, device=timer.device)
    b = torch.empty_like(a)
    ms = timer(lambda: b.copy_(a))
    return 2 * n * 2 / (ms * 1e-3) / 1e9


# ---- one candidate at one shape ------------------------------------------------------------------
def bytes_and_flops(
    semantics: str, rows: int, hidden: int, out: int, itemsize: int
) -> tuple[int, int]:
    """Minimum bytes forward + backward must move, and the FLOPs (Linear only)."""
    if semantics == "linear":
        return itemsize * (
            2 * rows * hidden + 2 * rows * out + 3 * hidden * out
        ), 6 * rows * hidden * out
    return 5 * rows * hidden * itemsize, 0  # read x, write y; read x and dy, write dx


def time_one(
    cand, slot: str, shape: str, dtype_name: str, regime: str, timer: Timer, copy: float
) -> dict[str, Any]:
    """Forward + backward of one accepted candidate, built as the probe builds it, timed by the
    harness."""
    import torch

    from kernel_probe.candidates import canonical_for
    from kernel_probe.probe.measure import build, torch_dtype
    from kernel_probe.shapes import parse_shape

    rows, hidden, out = parse_shape(shape)
    out = out or hidden
    dtype = torch_dtype(dtype_name)
    mixed = regime == "mixed"
    param_dtype = torch.float32 if mixed else dtype
    device = timer.device
    canonical = canonical_for(
        slot,
        hidden=hidden,
        out_features=out,
        device=device,
        param_dtype=str(param_dtype).replace("torch.", ""),
    )
    try:
        module = build(cand, canonical, device, param_dtype)
        x = torch.randn(rows, hidden, device=device, dtype=dtype, requires_grad=True)
        width = out if cand.semantics == "linear" else hidden
        gy = torch.randn(rows, width, device=device, dtype=dtype)

        def step() -> None:
            x.grad = None
            with torch.autocast(device_type=device, dtype=dtype, enabled=mixed):
                y = module(x)
            y.backward(gy)

        ms = timer(step)
    except Exception as exc:  # a kernel that refuses the size, OOM: reported, the others still run
        return {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
    nbytes, fl = bytes_and_flops(cand.semantics, rows, hidden, out, dtype.itemsize)
    row: dict[str, Any] = {"ms": ms, "gbps": nbytes / (ms * 1e-3) / 1e9}
    row["copy_percent"] = 100.0 * row["gbps"] / copy
    if fl:
        row["tflops"] = fl / (ms * 1e-3) / 1e12
    return row


# ---- the probe, and the comparison ---------------------------------------------------------------
def probe_at(out: Path, precision: str, shapes: tuple[str, ...], reps: int | None, smoke: bool):
    """The probe as a library (checks, timing, choice, lock written), as `kernel-probe` runs it. A
    smoke run on a shared CPU gives each candidate's checks more time than a job start would."""
    from kernel_probe import jobstart
    from kernel_probe.probe import planning

    request = planning.ProbeRequest(
        out=out / f"lock-{precision}.toml",
        shapes=shapes,
        precision=precision,
        force=True,
        reps=reps,
        command=f"benchmarks/gpu_choice.py ({precision})",
        **({"timeout": 120.0} if smoke else {}),
    )
    return jobstart.run(request)


def choices_at(result, shape: str) -> dict[str, str]:
    """What the probe chooses per slot from these measurements when asked for ``shape`` alone."""
    from kernel_probe.probe import pipeline

    alone = dataclasses.replace(result.plan, shapes=(shape,))
    return {
        slot: c.report.id
        for slot, c in pipeline.choose_all(alone, result.reports, result.timings).items()
    }


def probe_ms(result, slot: str, cid: str, shape: str) -> float | None:
    for row in result.timings[slot].get(cid, []):
        if row.get("shape") == shape and "median_ms" in row:
            return float(row["median_ms"])
    return None


def compare(result, precision: str, timer: Timer, copy: float) -> list[dict[str, Any]]:
    """One row per (slot, shape): chosen vs fastest accepted, by the harness."""
    dtype, regime = ALL_PRECISIONS[precision]
    rows = []
    per_shape = {shape: choices_at(result, shape) for shape in result.plan.shapes}
    for slot in result.plan.slots:
        # its geometries are no ROWSxHIDDEN shape: gpu_all.py's attention part times it
        if slot == ATTENTION:
            continue
        accepted = [r for r in result.reports[slot] if r.status == "accepted"]
        lock_choice = result.choices[slot].report.id
        for shape in result.plan.shapes:
            cands = {}
            for r in accepted:
                assert r.candidate is not None
                t = time_one(r.candidate, slot, shape, dtype, regime, timer, copy)
                t["probe_ms"] = probe_ms(result, slot, r.id, shape)
                cands[r.id] = t
            timed = {cid: t for cid, t in cands.items() if "ms" in t}
            chosen = per_shape[shape][slot]
            row: dict[str, Any] = {
                "slot": slot,
                "shape": shape,
                "precision": precision,
                "chosen": chosen,
                "lock_choice": lock_choice,
                "candidates": cands,
                "rejected": {
                    r.id: r.status for r in result.reports[slot] if r.status != "accepted"
                },
            }
            if timed:
                fastest = min(timed, key=lambda cid: timed[cid]["ms"])
                row["fastest"] = fastest
                for key, cid in (("chosen", chosen), ("lock_choice", lock_choice)):
                    if cid in timed:
                        row[f"{key}_ratio"] = timed[cid]["ms"] / timed[fastest]["ms"]
                row["within_goal"] = row.get("chosen_ratio", math.inf) <= GOAL
            rows.append(row)
    return rows


def _fmt(t: dict[str, Any] | None) -> str:
    if not t or "ms" not in t:
        return (t or {}).get("error", "-")[:40]
    probe = f", probe {t['probe_ms']:.3f}" if t.get("probe_ms") is not None else ""
    return f"{t['ms']:.3f} ms ({t['copy_percent']:.0f} %{probe})"


def print_table(rows: list[dict[str, Any]], file=sys.stdout) -> None:
    print(
        "| slot | shape | precision | chosen here | time | fastest accepted | time | ratio | "
        "lock (all shapes) |",
        file=file,
    )
    print("|---|---|---|---|---|---|---|---|---|", file=file)
    for r in rows:
        c = r["candidates"]
        print(
            f"| {r['slot']} | {r['shape']} | {r['precision']} | {r['chosen']} | "
            f"{_fmt(c.get(r['chosen']))} | {r.get('fastest', '-')} | "
            f"{_fmt(c.get(r.get('fastest', '')))} | {r.get('chosen_ratio', math.nan):.3f} | "
            f"{r['lock_choice']} ({r.get('lock_choice_ratio', math.nan):.3f}) |",
            file=file,
        )


def run(
    out: Path,
    *,
    smoke: bool,
    precisions: tuple[str, ...],
    shapes: tuple[str, ...],
    reps: int | None,
) -> dict:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not smoke:
        raise SystemExit(
            "gpu_choice.py: no CUDA device here; run with --smoke for CPU-sized shapes"
        )
    timer = Timer(device, quick=smoke)
    result: dict[str, Any] = {
        "env": environment(smoke),
        "timer": timer.kind,
        "goal": GOAL,
        "rows": [],
        "probes": {},
    }
    result["copy_gbps"] = copy_gbps(timer, smoke)
    print(f"copy bandwidth {result['copy_gbps']:.0f} GB/s ({timer.kind})", flush=True)
    from kernel_lock.errors import LockError

    for precision in precisions:
        t0 = time.perf_counter()
        try:
            probed = probe_at(out, precision, shapes, reps, smoke)
        # e.g. no candidate of a slot accepted: recorded, the next precision runs
        except LockError as exc:
            result["probes"][precision] = {
                "seconds": round(time.perf_counter() - t0, 2),
                "error": str(exc),
            }
            print(f"probe {precision}: {exc}", file=sys.stderr, flush=True)
            write_json(out / "choice.json", result)
            continue
        result["probes"][precision] = {
            "seconds": round(time.perf_counter() - t0, 2),
            "lock": str(probed.lock_path),
            "statuses": {s: {r.id: r.status for r in rs} for s, rs in probed.reports.items()},
            "reasons": {
                s: {r.id: r.reasons[:2] for r in rs if r.status != "accepted"}
                for s, rs in probed.reports.items()
            },
        }
        print(f"probe {precision}: {result['probes'][precision]['seconds']} s", flush=True)
        result["rows"] += compare(probed, precision, timer, result["copy_gbps"])
        # after each precision: a part stopped at its limit keeps what it did
        write_json(out / "choice.json", result)
    print_table(result["rows"])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--out", type=Path, required=True, help="directory for choice.json and the probe's locks"
    )
    ap.add_argument(
        "--smoke", action="store_true", help="CPU-sized shapes (labelled SMOKE, never GPU results)"
    )
    ap.add_argument(
        "--precision",
        action="append",
        choices=list(ALL_PRECISIONS),
        help=f"default: {', '.join(PRECISIONS)}",
    )
    ap.add_argument(
        "--shape", action="append", help="default: the GPU shapes (or the smoke shapes)"
    )
    ap.add_argument(
        "--reps", type=int, help="the probe's timing repetitions (default: the probe's)"
    )
    args = ap.parse_args(argv)
    smoke_threads(args.smoke)
    shapes = tuple(args.shape or (SMOKE_SHAPES if args.smoke else GPU_SHAPES))
    precisions = tuple(args.precision or PRECISIONS)
    args.out.mkdir(parents=True, exist_ok=True)
    run(
        args.out,
        smoke=args.smoke,
        precisions=precisions,
        shapes=shapes,
        reps=args.reps or (2 if args.smoke else None),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
