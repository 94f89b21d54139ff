"""Hand-made locks for check-model (tests and benchmarks/model_check.py): each pins some slots to
classes named by their dotted paths, written with the lock's own types and read back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import kernel_lock
from kernel_lock.lock import KernelLock
from kernel_lock.schema import EnvField, Environment, Slot
from kernel_lock.slots import SPECS

# torch.nn on every slot a model of tests/models or anemoi's transformer calls, bar the activation
# (its lock key names one function: a model's own)
TORCH = {
    "LayerNorm": "torch.nn.LayerNorm",
    "RMSNorm": "torch.nn.RMSNorm",
    "Linear": "torch.nn.Linear",
    "Attention": "kernel_lock.attention.SDPAttention",
}
# the calibration's locks: torch.nn itself, a correct float32 kernel that rounds differently
# (two-pass), and issue 54's bug class (a weight copy cached at the first forward)
CALIBRATION = {
    "torch.nn": TORCH,
    "two-pass LayerNorm": {"LayerNorm": "kp_zoo.norms.GoodLayerNorm"},
    "stale-weight LayerNorm": {"LayerNorm": "kp_zoo.norms.StaleWeightLayerNorm"},
}


def pinned_lock(
    path: Path, pins: Mapping[str, str], trusted: tuple[str, ...] = ("kp_zoo",)
) -> Path:
    """A lock at ``path`` pinning each slot of ``pins`` to its class (``trusted``: the modules the
    lock names besides torch and kernel_lock), on this CPU."""
    slots = {
        name: Slot(
            name=name,
            implementation=f"pinned.{name.lower()}",
            target=target,
            semantics=SPECS[name].semantics,
        )  # fmt: skip
        for name, target in pins.items()
    }
    env = Environment(fields={"device-type": EnvField(value="cpu", match="exact")})
    lock = KernelLock(created_by="test", trusted_modules=trusted, environment=env, slots=slots)
    lock.sealed().dump(path)
    kernel_lock.load(path, trust=list(trusted), emit_warnings=False)  # it reads back
    return path
