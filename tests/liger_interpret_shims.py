"""liger-kernel's real classes, made runnable by Triton's interpreter (``TRITON_INTERPRET=1``) on a
CPU.

Test-only: a probe worker started with ``TRITON_INTERPRET=1`` imports a candidate whose target is
``tests.liger_interpret_shims.<Name>``; the first lookup applies the shims and returns the real
class object (``LigerLayerNorm`` *is* ``liger_kernel.transformers.LigerLayerNorm``;
``LigerLayerNormAnemoi`` *is* ``kernel_lock.adapters.LigerLayerNormAnemoi``). Nothing of this is in
the product.

The shims, measured with triton 3.9.0 and liger-kernel 0.8.5 (and only applied for exactly those:
any other version fails loudly, since the interpreter bugs may be fixed, or others added):

1. The interpreter does not convert Python float arguments into Triton scalars (the compiler makes
   them fp32), so liger's ``eps.to(tl.float32)`` raises ``AttributeError: 'float' object has no
   attribute 'to'``. Shim: convert a float as the compiler does, to an fp32 scalar.
2. ``triton.language.extra.libdevice.rsqrt`` is a stub the compiler replaces with the backend's; the
   interpreter calls the stub, which returns None (triton-lang/triton#8825). liger binds it at
   import as ``rsqrt`` in its LayerNorm and RMSNorm modules. Shim: those two names call
   ``tl.math.rsqrt``, which the interpreter implements.
3. The same holds for libdevice's ``tanh``, which liger's GEGLU binds at import (the interpreter's
   stub returns None: ``1 + None`` raises). Shim: ``2 * sigmoid(2x) - 1``, in float32 as liger
   computes it.

Also measured, and not shimmed: the interpreter computes bf16 wrongly (it multiplies the bit
patterns as integers, and its casts truncate instead of rounding; triton PRs #10945 and #11585 were
closed unmerged), so only fp32 and fp16 rows are checked.
"""

from __future__ import annotations

import os
from importlib import import_module, metadata
from typing import Any

SHIMMED_FOR = {"triton": "3.9.0", "liger-kernel": "0.8.5"}

# name -> "module.attribute" of the real class: liger's own, and kernel_lock's adapters over them
CLASSES = {
    **{name: f"liger_kernel.transformers.{name}" for name in ("LigerLayerNorm", "LigerRMSNorm")},
    **{
        name: f"kernel_lock.adapters.{name}"
        for name in ("LigerLayerNormAnemoi", "LigerRMSNormAnemoi", "AutocastLigerLayerNormAnemoi")
    },
    "LigerGatedMLP": "kernel_lock.gated_mlp.LigerGatedMLP",
}
LIGER_RSQRT_MODULES = ("liger_kernel.ops.layer_norm", "liger_kernel.ops.rms_norm")
LIGER_TANH_MODULES = ("liger_kernel.ops.geglu",)

_applied = False


class ShimMismatch(RuntimeError):
    """The shims were written for other versions, or the environment is not the interpreter's."""


def versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in SHIMMED_FOR}


def version_problem() -> str | None:
    """None when the installed triton and liger-kernel are the ones the shims were written for."""
    found = versions()
    if found == SHIMMED_FOR:
        return None
    return (
        f"the interpreter shims in {__file__} were written for "
        f"{', '.join(f'{k} {v}' for k, v in SHIMMED_FOR.items())}; found "
        f"{', '.join(f'{k} {v}' for k, v in found.items())}: re-measure what the interpreter "
        "needs with these versions (docs/checks.md, 'The real liger code, interpreted') and "
        "update the shims and SHIMMED_FOR"
    )


def apply() -> None:
    """Apply both shims (once); ShimMismatch unless this is Triton's interpreter at the pinned
    versions."""
    global _applied
    if _applied:
        return
    problem = version_problem()
    if problem:
        raise ShimMismatch(problem)
    import numpy as np
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    if not triton.knobs.runtime.interpret:
        raise ShimMismatch(
            "the shims are for Triton's interpreter: set TRITON_INTERPRET=1 before triton is "
            "imported"
        )

    # 1. a Python float argument becomes an fp32 scalar, as the compiler makes it
    convert = interpreter._implicit_cvt
    # the bug this shim is for is gone: re-measure rather than stack a shim on a fix
    if not isinstance(convert(0.5), float):
        raise ShimMismatch("triton's interpreter now converts float arguments itself: drop shim 1")

    def implicit_cvt(arg: Any) -> Any:
        if isinstance(arg, float):
            return tl.tensor(
                interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32
            )
        return convert(arg)

    interpreter._implicit_cvt = implicit_cvt

    # 2. liger's libdevice rsqrt (a compiler stub returning None here) -> the interpreter's
    #    tl.math.rsqrt
    def rsqrt(x: Any) -> Any:
        return tl.math.rsqrt(x)

    for name in LIGER_RSQRT_MODULES:
        module = import_module(name)
        stub = module.rsqrt
        if getattr(stub, "__module__", "") != "triton.language.extra.libdevice":
            raise ShimMismatch(
                f"{name}.rsqrt is {stub!r}, not the libdevice stub shim 2 replaces: re-measure"
            )
        module.rsqrt = rsqrt

    # 3. liger's libdevice tanh (the same kind of stub) -> tanh from the interpreter's sigmoid
    def tanh(x: Any) -> Any:
        return 2.0 * tl.sigmoid(2.0 * x) - 1.0

    for name in LIGER_TANH_MODULES:
        module = import_module(name)
        stub = module.tanh
        if getattr(stub, "__module__", "") != "triton.language.extra.libdevice":
            raise ShimMismatch(
                f"{name}.tanh is {stub!r}, not the libdevice stub shim 3 replaces: re-measure"
            )
        module.tanh = tanh
    _applied = True


def __getattr__(name: str) -> Any:
    if name not in CLASSES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if os.environ.get("TRITON_INTERPRET") is None:
        raise ShimMismatch(f"{__name__}.{name} is for a process started with TRITON_INTERPRET=1")
    apply()
    module_name, _, attr = CLASSES[name].rpartition(".")
    return getattr(import_module(module_name), attr)
