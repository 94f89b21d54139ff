"""Cost of a model's trace and check-model (issue 54), next to ``python -c "import torch"``.

One run each, in a fresh interpreter started by the one launcher (``kernel_lock.launch``) in a
scratch folder: ``import torch``; ``kernel-probe model tests/models/block.py:build`` (README's
model); ``kernel-probe check-model`` of it against a lock pinning the LayerNorm slot to a class that
computes what ``nn.LayerNorm`` does (tests/fakes/kp_same.py), written with the lock's own types.
Goal: trace + check <= 5 x ``import torch``. Prints the figures and the step-time line; asserts
nothing.

    python benchmarks/model_check.py [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_lock import launch  # noqa: E402  (this checkout's, found through ROOT)
from kernel_lock.launch import python_argv  # noqa: E402
from kernel_lock.lock import KernelLock  # noqa: E402
from kernel_lock.schema import EnvField, Environment, Slot  # noqa: E402
from kernel_lock.slots import SPECS  # noqa: E402

SPEC = f"{ROOT}/tests/models/block.py:build"
ENV = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'fakes'}")
CLI = "import sys; from kernel_probe.cli import main; sys.exit(main(sys.argv[1:]))"


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


def write_lock(path: Path) -> None:
    slot = Slot(
        name="LayerNorm", implementation="same.layernorm", target="kp_same.SameLayerNorm",
        semantics=SPECS["LayerNorm"].semantics,
    )  # fmt: skip
    env = Environment(fields={"device-type": EnvField(value="cpu", match="exact")})
    lock = KernelLock(
        created_by="benchmarks/model_check.py", trusted_modules=("kp_same",), environment=env,
        slots={"LayerNorm": slot},
    )  # fmt: skip
    lock.sealed().dump(path)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--steps", type=int, default=3)
    steps = str(ap.parse_args().steps)
    with tempfile.TemporaryDirectory(prefix="model-check-") as tmp:
        write_lock(Path(tmp) / "kernel-lock.toml")
        torch_s, _ = timed("import torch", [], tmp)
        trace_s, _ = timed(CLI, ["model", SPEC, "--json"], tmp)
        check = ["check-model", SPEC, "--lock", "kernel-lock.toml", "--trust", "kp_same"]
        check_s, out = timed(CLI, [*check, "--steps", steps, "--json"], tmp)
    body = json.loads(out)
    t = body["timing"]
    print(f"machine: {os.cpu_count()} cores; one run each")
    print(f"import torch          {torch_s:6.2f} s")
    print(f"trace (model)         {trace_s:6.2f} s  {trace_s / torch_s:4.1f}x import torch")
    print(f"check-model           {check_s:6.2f} s  {check_s / torch_s:4.1f}x import torch")
    both = trace_s + check_s
    print(f"trace + check-model   {both:6.2f} s  {both / torch_s:4.1f}x import torch (goal <= 5x)")
    print(f"verdict: {body['verdict']}; losses agree to {body['losses-agree-to']:.1g} over {steps}")
    low, high = t["interval"]
    print(
        f"step time: {t['ratio']:.2f}x per step ({t['written'] * 1e3:.2f} -> "
        f"{t['applied'] * 1e3:.2f} ms, 95% interval {low:.2f}-{high:.2f}x, {t['rounds']} rounds)"
    )


if __name__ == "__main__":
    main()
