"""check-model's figures (issue 54), in three modes; every check in a fresh interpreter started by
the one launcher (``kernel_lock.launch``) in a scratch folder, the locks written with the lock's own
types (tests/model_locks.py).

- default: the cost of a trace and a check of the README's model (tests/models/block.py) next to
  ``python -c "import torch"`` (goal: trace + check <= 5 x), against a lock pinning LayerNorm to a
  class computing what ``nn.LayerNorm`` does (tests/fakes/kp_same.py); the step-time line.
- ``--calibrate``: the check's figures (verdict, first diverging site, worst difference /
  tolerance, losses' agreement over the steps, the paired step-time ratio with its 95% interval)
  on three models (tests/models/variants.py's ``twice``, the README's block, anemoi's transformer
  at check-model's CPU grid: an O16 dataset and processor grid, 1,600 nodes each) with three
  locks: torch.nn, a correct two-pass LayerNorm, the stale-weight LayerNorm
  (tests/model_locks.py CALIBRATION).
- ``--kit --out DIR [--lock L] [--smoke]``: the GPU kit's model part (benchmarks/gpu_all.py): on
  the GPU (``--device cuda``), the README's model and anemoi's transformer (an O96 dataset, 40,320
  nodes; an O32 processor grid, as the float64 reference of a 40,320-node attention needs ~200 GB)
  checked with the lock L (the kit's cold probe; torch.nn where it has none), then the step of
  anemoi's transformer processor at O96 (benchmarks/anemoi_step.py's, torch.nn and the lock), beside
  the anchor (FA2 142 ms, FA3 74 ms per fwd+bwd). ``--smoke``: on this CPU, CPU-sized.

Prints the figures; asserts nothing.

    python benchmarks/model_check.py [--steps 3] [--calibrate]
    python benchmarks/model_check.py --kit --out DIR [--lock L] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(ROOT)]

from kernel_lock import launch  # noqa: E402  (this checkout's, found through ROOT)
from kernel_lock.launch import python_argv  # noqa: E402
from tests.anemoi_build import CPU_HEADS  # noqa: E402
from tests.model_locks import CALIBRATION, TORCH, pinned_lock  # noqa: E402

SPEC = f"{ROOT}/tests/models/block.py:build"
TWICE = f"{ROOT}/tests/models/variants.py:twice"
ENV = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'fakes'}")
CLI = "import sys; from kernel_probe.cli import main; sys.exit(main(sys.argv[1:]))"
ANCHOR = "anchor (H200, anemoi-core #959): FA2 142 ms, FA3 74 ms per fwd+bwd iteration"


def timed(code: str, args: list[str], cwd: str) -> tuple[float, str]:
    """Seconds and stdout of ``code`` with ``args`` in a fresh interpreter, in ``cwd``."""
    begun = time.perf_counter()
    done = launch.run(python_argv(code, args, roots=[str(ROOT)]), cwd=cwd, env=ENV)
    took = time.perf_counter() - begun
    if done.returncode not in (0, 3):
        raise SystemExit(
            f"{code[:40]!r} {args[:2]} exited {done.returncode}:\n{done.stderr[-2000:]}"
        )
    return took, done.stdout


def checked(spec: str, lock: Path, steps: int, cwd: str, *extra: str) -> tuple[float, dict]:
    """Seconds and the --json body of ``kernel-probe check-model spec --lock lock``."""
    args = ["check-model", spec, "--lock", str(lock), "--steps", str(steps), "--json"]
    took, out = timed(CLI, [*args, "--trust", "kp_zoo", "--trust", "kp_same", *extra], cwd)
    return took, json.loads(out)


def step_line(t: dict[str, Any] | None) -> str:
    if not t:
        return "not timed (see the notes)"
    low, high = t["interval"]
    return (
        f"{t['ratio']:.2f}x per step ({t['written'] * 1e3:.2f} -> {t['applied'] * 1e3:.2f} ms, "
        f"95% interval {low:.2f}-{high:.2f}x, {t['rounds']} rounds)"
    )


def figures(name: str, body: dict[str, Any]) -> str:
    """One check's line: verdict, first diverging, worst ratio, losses, step time."""
    first = body["first"]
    where = f" {first['phase']}: {first['what']}" if first else ""
    ratio = body["worst-ratio"]
    worst = "-" if ratio is None else f"{float(ratio):.3g}"
    sites, step = len(body["sites"]), step_line(body["timing"])
    return (
        f"{name:34s} {body['verdict']}{where}; worst/tolerance {worst}; losses agree to "
        f"{body['losses-agree-to']:.1g}; {sites} sites; step {step}"
    )


def cost(steps: int) -> None:
    with tempfile.TemporaryDirectory(prefix="model-check-") as tmp:
        same = {"LayerNorm": "kp_same.SameLayerNorm"}
        lock = pinned_lock(Path(tmp) / "kernel-lock.toml", same, trusted=("kp_same",))
        torch_s, _ = timed("import torch", [], tmp)
        trace_s, _ = timed(CLI, ["model", SPEC, "--json"], tmp)
        check_s, body = checked(SPEC, lock, steps, tmp)
    print(f"machine: {os.cpu_count()} cores; one run each")
    print(f"import torch          {torch_s:6.2f} s")
    print(f"trace (model)         {trace_s:6.2f} s  {trace_s / torch_s:4.1f}x import torch")
    print(f"check-model           {check_s:6.2f} s  {check_s / torch_s:4.1f}x import torch")
    both = trace_s + check_s
    print(f"trace + check-model   {both:6.2f} s  {both / torch_s:4.1f}x import torch (goal <= 5x)")
    print(f"verdict: {body['verdict']}; losses agree to {body['losses-agree-to']:.1g} over {steps}")
    print(f"step time: {step_line(body['timing'])}")


def anemoi_config(folder: Path, data: str, hidden: str, heads: int | None = None) -> str | None:
    """``anemoi:`` spec of anemoi-training's transformer preset at the given grids and attention
    heads (None: the preset's 16), or None (with the reason printed) where anemoi-training is not
    installed."""
    from importlib.util import find_spec

    from tests.anemoi_build import write_sized

    if find_spec("anemoi") is None or find_spec("anemoi.training") is None:
        print(
            "anemoi's transformer: not run (anemoi-training is not installed: .ci/anemoi-install)"
        )
        return None
    return f"anemoi:{write_sized(folder / 'training.yaml', 'transformer', data, hidden, heads)}"


def calibrate(steps: int) -> None:
    with tempfile.TemporaryDirectory(prefix="model-check-") as tmp:
        models = {"variants.py:twice": TWICE, "README block": SPEC}
        anemoi = anemoi_config(Path(tmp), "o16", "o16")
        models |= {"anemoi transformer O16": anemoi} if anemoi else {}
        print(f"machine: {os.cpu_count()} cores; {steps} steps; one run each")
        for model, spec in models.items():
            for name, pins in CALIBRATION.items():
                lock = pinned_lock(Path(tmp) / f"{name.replace(' ', '-')}.toml", pins)
                took, body = checked(spec, lock, steps, tmp)
                print(figures(f"{model} / {name}", body) + f"; {took:.0f} s", flush=True)


def processor_steps(lock_path: Path | None, smoke: bool, device: str) -> dict[str, Any]:
    """benchmarks/anemoi_step.py's processor step (torch.nn and the lock's) at O96 (smoke: its CPU
    size): step medians in ms."""
    import anemoi_step
    import torch
    from gpu_facts import GPU_SHAPES, SMOKE_SHAPES

    import kernel_lock

    nodes, channels = (int(v) for v in (SMOKE_SHAPES if smoke else GPU_SHAPES)[0].split("x"))
    options = anemoi_step.SMOKE_PROCESSOR if smoke else anemoi_step.PROCESSOR
    lock = kernel_lock.load(lock_path) if lock_path and lock_path.exists() else None
    out: dict[str, Any] = {"shape": f"{nodes}x{channels}"}
    for name, block in anemoi_step.variants(lock).items():
        if name == "liger" or isinstance(block, str):
            continue
        torch.manual_seed(0)
        model = anemoi_step.build(block, channels, options, device)
        timed = anemoi_step.step_times(
            model, nodes, channels, device, warmup=1, steps=2 if smoke else 5
        )
        out[name] = round(timed["step_ms"], 2)
    return out


def kit(out: Path, lock_path: Path | None, smoke: bool) -> int:
    """The GPU kit's model part (see the module); ``out/model.json``."""
    from gpu_facts import smoke_threads, write_json

    smoke_threads(smoke)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not smoke:
        raise SystemExit("model_check.py --kit: no CUDA device here; --smoke runs it on the CPU")
    result: dict[str, Any] = {"smoke": smoke, "device": device, "checks": {}, "anchor": ANCHOR}
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="model-check-") as tmp:
        lock = lock_path if lock_path and lock_path.exists() else None
        lock = lock or pinned_lock(Path(tmp) / "torch.toml", TORCH)
        result["lock"] = str(lock)
        # smoke: tests/anemoi_build.py's CPU heads (its comment says why); the GPU: the preset's
        grids = ("o16", "o16", CPU_HEADS) if smoke else ("o96", "o32", None)
        anemoi = anemoi_config(Path(tmp), *grids)
        specs = {"README block": SPEC} | ({"anemoi transformer": anemoi} if anemoi else {})
        for name, spec in specs.items():
            _, body = checked(spec, lock, 2, tmp, "--device", device)
            result["checks"][name] = body
            print(figures(name, body), flush=True)
            write_json(out / "model.json", result)
    if anemoi:
        result["processor_ms"] = processor_steps(lock_path, smoke, device)
        steps = result["processor_ms"]
        print(
            f"anemoi transformer processor at {steps.pop('shape')}: {steps} ms per step; {ANCHOR}"
        )
    write_json(out / "model.json", result)
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--calibrate", action="store_true", help="three models x three locks")
    ap.add_argument("--kit", action="store_true", help="the GPU kit's model part (--out DIR)")
    ap.add_argument("--out", type=Path, help="with --kit: model.json goes there")
    ap.add_argument("--lock", type=Path, help="with --kit: the lock checked (default torch.nn)")
    ap.add_argument("--smoke", action="store_true", help="with --kit: CPU-sized, on the CPU")
    args = ap.parse_args()
    if args.kit:
        if args.out is None:
            ap.error("--kit needs --out DIR")
        sys.exit(kit(args.out, args.lock, args.smoke))
    if args.calibrate:
        calibrate(args.steps)
    else:
        cost(args.steps)


if __name__ == "__main__":
    main()
