"""One anemoi training step with torch.nn, with the lock's choice, and with liger: does the op-level
choice predict the step time?

The model is anemoi-models' own ``TransformerProcessor`` at an O96-like size (40320 nodes x 1024
channels), configured as anemoi-training's ``model/transformer.yaml`` configures it (16 layers in 4
checkpointed chunks, 16 heads, MLP ratio 4, gradient checkpointing on), with two deviations the GPU
machine forces, both recorded in the output: ``scaled_dot_product_attention`` instead of
``flash_attention`` (flash-attn is not installed there) and global attention instead of a 512 window
(anemoi's SDPA path builds a dense 40320 x 40320 mask for a window and still computes every pair).
Its layers come from ``layer_kernels``, built the way anemoi builds them:
  - torch.nn: no ``layer_kernels`` (anemoi's defaults);
  - lock: ``kernel_lock.anemoi.layer_kernels(lock)``, what ``kernel-probe export --format anemoi``
    prints;
  - liger: LayerNorm -> ``kernel_lock.adapters.LigerLayerNormAnemoi`` (liger's LayerNorm with
    anemoi's constructor), the lock's eps; Linear stays torch.nn.

A step is forward, backward (``mean(y**2)``) and AdamW, under bf16 autocast with float32 parameters,
as anemoi trains. Each variant: one cold step (reported apart: Triton JIT, cuDNN plans), warm-up,
then the median of the timed steps, and the peak memory. The prediction: the number of LayerNorms
the processor builds from ``layer_kernels`` times the difference of the probe's forward+backward
medians (from the lock's timing rows at this shape) — compared with the measured difference of step
times.

    python benchmarks/anemoi_step.py --out DIR --lock kernel-lock.toml     # GPU: 40320 x 1024
    python benchmarks/anemoi_step.py --out DIR --lock L --smoke            # CPU: 640 x 64, 2 layers
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_facts import GPU_SHAPES, SMOKE_SHAPES, environment, smoke_threads, write_json  # noqa: E402

# anemoi-training 0.17.1 model/transformer.yaml, and what this benchmark changes (see the docstring)
PROCESSOR = dict(
    num_layers=16,
    num_chunks=4,
    num_heads=16,
    mlp_hidden_ratio=4,
    mlp_implementation="mlp",
    qk_norm=False,
    dropout_p=0.0,
    softcap=0.0,
    use_alibi_slopes=False,
    cpu_offload=False,
    gradient_checkpointing=True,
    attention_implementation="scaled_dot_product_attention",  # transformer.yaml: flash_attention
    window_size=None,  # transformer.yaml: 512
)
SMOKE_PROCESSOR = dict(PROCESSOR, num_layers=2, num_chunks=1, num_heads=4)
LIGER_LAYER_NORM = "kernel_lock.adapters.LigerLayerNormAnemoi"


def variants(lock, no_lock: str = "no --lock given") -> dict[str, Any]:
    """name -> the raw ``layer_kernels`` block anemoi reads (or the reason the variant cannot be
    built)."""
    from kernel_lock.anemoi import layer_kernels

    out: dict[str, Any] = {"torch.nn": {}}
    eps = 1e-5  # torch.nn.LayerNorm's, anemoi's default
    if lock is None:
        out["lock"] = no_lock
    else:
        out["lock"] = layer_kernels(lock)
        eps = float(out["lock"].get("LayerNorm", {}).get("eps", eps))
    out["liger"] = {"LayerNorm": {"_target_": LIGER_LAYER_NORM, "eps": eps}}
    return out


def build(block: dict[str, Any], channels: int, options: dict[str, Any], device: str):
    from anemoi.models.layers.processor import TransformerProcessor
    from anemoi.utils.config import DotDict

    return TransformerProcessor(num_channels=channels, layer_kernels=DotDict(block), **options).to(
        device
    )


def layer_norms(model) -> list[str]:
    """Names of the norms built from ``layer_kernels.LayerNorm`` (the q/k norms are other keys)."""
    return [
        name
        for name, _ in model.named_modules()
        if name.rsplit(".", 1)[-1].startswith("layer_norm")
    ]


def step_times(
    model, nodes: int, channels: int, device: str, *, warmup: int, steps: int
) -> dict[str, Any]:
    import torch
    from anemoi.models.distributed.shapes import GraphShardInfo

    cuda = device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(nodes, channels, device=device)
    shard = GraphShardInfo(nodes=[nodes])

    def step() -> float:
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            y = model(x, 1, shard)
        y.float().pow(2).mean().backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    cold = step()
    for _ in range(warmup):
        step()
    samples = [step() for _ in range(steps)]
    out = {
        "cold_s": cold,
        "step_ms": statistics.median(samples) * 1000,
        "samples_ms": [s * 1000 for s in samples],
    }
    if cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def probe_ms(lock, shape: str) -> dict[str, float]:
    """The lock's LayerNorm timing rows at ``shape``: implementation id -> forward+backward median
    ms."""
    slot = lock.slots.get("LayerNorm") if lock is not None else None
    rows = slot.timing if slot is not None else ()
    return {
        str(r["implementation"]): float(r["median-ms"]) for r in rows if r.get("shape") == shape
    }


def run(
    out: Path, *, lock_path: Path | None, smoke: bool, steps: int, warmup: int
) -> dict[str, Any]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not smoke:
        raise SystemExit(
            "anemoi_step.py: no CUDA device here; run with --smoke for a CPU-sized step"
        )
    shape = (SMOKE_SHAPES if smoke else GPU_SHAPES)[0]
    nodes, channels = (int(v) for v in shape.split("x"))
    options = SMOKE_PROCESSOR if smoke else PROCESSOR
    result: dict[str, Any] = {
        "env": environment(smoke),
        "shape": shape,
        "processor": dict(options),
        "lock": str(lock_path) if lock_path else None,
        "variants": {},
    }
    import kernel_lock

    # a cold probe stopped at its time limit writes no lock: the other variants still run
    lock = kernel_lock.load(lock_path) if lock_path and lock_path.exists() else None
    probe = probe_ms(lock, shape)
    ids = {"torch.nn": "torch.layer_norm", "liger": "liger.layer_norm"}
    blocks = variants(lock, f"no lock at {lock_path}" if lock_path else "no --lock given")
    if lock is not None:
        ids["lock"] = (
            lock.slots["LayerNorm"].implementation
            if "LayerNorm" in lock.slots
            else "torch.layer_norm"
        )
        result["lock_layer_norm"] = ids["lock"]
    for name, block in blocks.items():
        row: dict[str, Any] = {"layer_kernels": block}
        model = None
        if isinstance(block, str):
            row["error"] = block
            result["variants"][name] = row
            print(f"{name:9s} {block}", flush=True)
            continue
        try:
            torch.manual_seed(0)
            model = build(block, channels, options, device)
            row["layer_norms"] = len(layer_norms(model))
            row["layer_norm_class"] = type(model.proc[0].layer_norm_attention).__qualname__
            row.update(step_times(model, nodes, channels, device, warmup=warmup, steps=steps))
        # liger on a CPU, an OOM: recorded with the reason, the others still run
        except Exception as exc:
            row["error"] = (
                f"{type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
            )
        finally:
            model = None
            if device == "cuda":
                torch.cuda.empty_cache()
        if name in ids and ids[name] in probe:
            row["probe_layer_norm_ms"] = probe[ids[name]]
        result["variants"][name] = row
        print(
            f"{name:9s} " + (f"{row['step_ms']:.1f} ms/step" if "step_ms" in row else row["error"]),
            flush=True,
        )
        write_json(out / "anemoi_step.json", result)
    base = result["variants"]["torch.nn"]
    for name, row in result["variants"].items():
        if name == "torch.nn" or "step_ms" not in row or "step_ms" not in base:
            continue
        row["measured_delta_ms"] = row["step_ms"] - base["step_ms"]
        if "probe_layer_norm_ms" in row and "probe_layer_norm_ms" in base:
            row["predicted_delta_ms"] = row["layer_norms"] * (
                row["probe_layer_norm_ms"] - base["probe_layer_norm_ms"]
            )
    write_json(out / "anemoi_step.json", result)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--lock",
        type=Path,
        help="the lock whose choice the 'lock' variant uses (bf16-mixed, this shape)",
    )
    ap.add_argument("--smoke", action="store_true", help="a CPU-sized processor (labelled SMOKE)")
    ap.add_argument("--steps", type=int, help="timed steps (default 5; 2 with --smoke)")
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args(argv)
    smoke_threads(args.smoke)
    try:
        import anemoi.models.layers.processor  # noqa: F401
    except ImportError as exc:
        print(
            f"anemoi_step.py: anemoi-models is not importable ({exc}); see docs/benchmarks.md",
            file=sys.stderr,
        )
        return 3
    args.out.mkdir(parents=True, exist_ok=True)
    run(
        args.out,
        lock_path=args.lock,
        smoke=args.smoke,
        steps=args.steps or (2 if args.smoke else 5),
        warmup=args.warmup,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
