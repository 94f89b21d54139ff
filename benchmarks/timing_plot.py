"""Per-shape timing plot per slot, from a probe run: every timed candidate's median forward +
backward.

    python benchmarks/timing_plot.py --run --data DATA.json --out PLOT.svg   # probe, then plot
    python benchmarks/timing_plot.py --data DATA.json --out PLOT.svg         # replot
    (the docs' own: DATA docs/data/cpu-timing.json, PLOT docs/img/cpu-timing.svg)

``--run`` probes this machine (``kernel-probe --json --force`` into a temporary lock, at
``--shape``s and ``--precision``) and keeps the probe's JSON, with the machine it ran on, as
``--data``; the plot is drawn from that file alone, so a committed plot can be redrawn from
committed data. Needs the ``plots`` extra (matplotlib). Prints each slot's figures, with the ratio
of each candidate to the chosen one.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_lock import launch  # noqa: E402
from kernel_lock.files import write_file  # noqa: E402  (this checkout's, found through ROOT)
from kernel_lock.launch import python_argv  # noqa: E402

_PROBE = "import runpy; runpy.run_module('kernel_probe', run_name='__main__', alter_sys=True)"

DEFAULT_SHAPES = ("512x1024", "1024x1024", "2048x1024", "4096x1024")


def run_probe(shapes: list[str], precision: str) -> dict[str, Any]:
    """A fresh probe of this machine (nothing reused), its JSON and the machine's description."""
    with tempfile.TemporaryDirectory() as d:
        args = ["--out", str(Path(d) / "k.toml"), "--force", "--json"]
        args += ["--precision", precision, *(a for s in shapes for a in ("--shape", s))]
        # through the one launcher, in the temporary folder: this checkout's kernel_probe,
        # nothing of the working directory
        done = launch.run(python_argv(_PROBE, args, roots=[str(ROOT)]), cwd=d)
        if done.returncode:
            sys.exit(f"the probe failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        result = json.loads(done.stdout)
    import torch

    result["machine"] = {
        "cpu": platform.processor() or platform.machine(),
        "cores": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(["kernel-probe", *args[2:]]),  # without the temporary --out
    }
    return result


def series(result: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """slot -> candidate -> shape -> median ms (timed candidates only)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for slot, s in result["slots"].items():
        for cand in s["candidates"]:
            for t in cand.get("timings") or ():
                if isinstance(t.get("median_ms"), (int, float)):
                    out.setdefault(slot, {}).setdefault(cand["id"], {})[t["shape"]] = float(
                        t["median_ms"]
                    )
    return out


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(result)
    shapes = list(result["shapes"])
    fig, axes = plt.subplots(1, len(data), figsize=(4.2 * len(data), 3.6), squeeze=False)
    for ax, (slot, cands) in zip(axes[0], data.items(), strict=True):
        width = 0.8 / max(1, len(cands))
        for i, (cid, by_shape) in enumerate(sorted(cands.items())):
            xs = [j + i * width for j, s in enumerate(shapes) if s in by_shape]
            ys = [by_shape[s] for s in shapes if s in by_shape]
            chosen = result["slots"][slot]["chosen"] == cid
            ax.bar(xs, ys, width, label=cid + (" (chosen)" if chosen else ""))
        ax.set_xticks(
            [j + 0.4 - width / 2 for j in range(len(shapes))], shapes, rotation=20, fontsize=8
        )
        ax.set_ylim(bottom=0)  # bars from zero: their heights compare
        ax.set_title(slot)
        ax.set_ylabel("median ms, forward + backward")
        ax.legend(fontsize=7)
    machine = result.get("machine", {})
    fig.suptitle(
        f"{result['device']['type']} ({machine.get('cpu', '?')}, {machine.get('cores', '?')} "
        f"cores), precision {result['precision']}, torch {machine.get('torch', '?')}",
        fontsize=9,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    # metadata without a date: the same data draws the same file; written by the one safe writer
    buffer = io.BytesIO()
    fig.savefig(
        buffer,
        format=out.suffix.lstrip(".") or "svg",
        metadata={"Date": None} if out.suffix == ".svg" else None,
    )
    write_file(out, buffer.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument(
        "--run", action="store_true", help="probe this machine first (else plot --data as it is)"
    )
    ap.add_argument(
        "--data", type=Path, required=True, help="the probe's JSON (written with --run)"
    )
    ap.add_argument("--out", type=Path, required=True, help="the plot (.svg or .png)")
    ap.add_argument(
        "--shape",
        action="append",
        default=[],
        help=f"with --run (default {', '.join(DEFAULT_SHAPES)})",
    )
    ap.add_argument("--precision", default="32-true", help="with --run (default 32-true)")
    args = ap.parse_args()
    if args.run:
        result = run_probe(args.shape or list(DEFAULT_SHAPES), args.precision)
        args.data.parent.mkdir(parents=True, exist_ok=True)
        write_file(args.data, json.dumps(result, indent=1, sort_keys=True) + "\n")
    result = json.loads(args.data.read_text())
    for slot, cands in series(result).items():
        chosen_id = result["slots"][slot]["chosen"]
        chosen = cands.get(chosen_id, {})
        for cid, by_shape in sorted(cands.items()):
            figures = ", ".join(
                f"{s} {ms:.3g} ms"
                + (f" ({ms / chosen[s]:.2f}x chosen)" if s in chosen and cid != chosen_id else "")
                for s, ms in by_shape.items()
            )
            print(f"{slot:<10} {cid:<28} {figures}")
    plot(result, args.out)
    print(f"wrote {args.out} (data: {args.data}; {result.get('machine', {}).get('command', '')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
