"""A kernel as training and inference use it (issue 55): the cases' names and hints, the seeded
in-place update, the inference contexts, the views, a copy keeping an input's layout, state dicts
between torch.nn's names and a module's; each slot runs its own passes with them (docs/checks.md,
"Training and inference"). The probe's process reads the hints without torch: the helpers import
it when called (tests/kernel_probe/probe/test_parent_torch_free.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

AFTER_UPDATE = "after-update"
EVAL = "eval"
NO_GRAD = "no-grad"
INFERENCE_MODE = "inference-mode"
TRANSPOSED = "transposed"
STRIDED = "strided"
LOADED = "loaded"

HINTS = {
    AFTER_UPDATE: "after an in-place parameter update",
    EVAL: "in eval mode",
    NO_GRAD: "under torch.no_grad()",
    INFERENCE_MODE: "under torch.inference_mode()",
    TRANSPOSED: "on a transposed view",
    STRIDED: "on a strided last dimension",
    LOADED: "after load_state_dict",
}
INFERENCE = (EVAL, NO_GRAD, INFERENCE_MODE)  # forward only
VIEWS = (TRANSPOSED, STRIDED)  # forward and backward

STEP = 0.5  # an update's size, relative to the parameter's RMS: large enough to show a stale copy

Pairs = Mapping[str, tuple[str, bool]]  # torch.nn's name -> (the module's key, held transposed)


# ---- the second life: an in-place update, as an optimizer step makes it --------------------------
def steps(params: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """One seeded update per torch.nn-named parameter (None: none), in float64 on its device:
    normal, scaled by :data:`STEP` times its RMS; the same for every module given ``params``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(k for k, v in params.items() if v is not None):
        p = params[name].detach().to(torch.float64)
        rms = float(p.pow(2).mean().sqrt()) if p.numel() else 0.0
        delta = torch.randn(tuple(p.shape), generator=gen, dtype=torch.float64)
        out[name] = (delta * STEP * max(rms, 1e-3)).to(p.device)
    return out


def update_in_place(module: Any, deltas: Mapping[str, Any], pairs: Pairs | None = None) -> None:
    """Add each update to the module's parameter in place under no_grad, as ``optimizer.step()``
    does (the same tensor objects, new values); ``pairs``: where the module holds torch.nn's names
    (None: under them, as they are)."""
    import torch

    own = dict(module.state_dict(keep_vars=True))
    with torch.no_grad():
        for name, delta in deltas.items():
            key, turned = pairs[name] if pairs is not None else (name, False)
            target = own[key]
            d = delta.t() if turned else delta
            target.add_(d.to(device=target.device, dtype=target.dtype))


# ---- eval, no_grad, inference_mode: the forward as inference runs it -----------------------------
@contextlib.contextmanager
def inference(case: str, *modules: Any) -> Iterator[None]:
    """Run inside ``case`` of :data:`INFERENCE`: ``modules`` in eval mode (gradients on, so only
    the mode differs), or under ``torch.no_grad()`` or ``torch.inference_mode()``; each module's
    training flag is restored after."""
    import torch

    contexts = {
        EVAL: contextlib.nullcontext,
        NO_GRAD: torch.no_grad,
        INFERENCE_MODE: torch.inference_mode,
    }
    if case not in contexts:
        raise ValueError(f"not an inference case: {case!r}")
    modes = [m.training for m in modules]
    try:
        for m in modules if case == EVAL else ():
            m.eval()
        with contexts[case]():
            yield
    finally:
        for m, mode in zip(modules, modes, strict=True):
            m.train(mode)


# ---- layouts: the views a model hands a layer ---------------------------------------------------
def view(case: str, x: Any) -> Any:
    """``x`` (2-D or more) as the view of :data:`VIEWS` named ``case``, with the same values:
    ``transposed``, a 2-D ``.t()`` view (x flattened to rows first); ``strided``, ``[..., ::2]``
    of a twice wider buffer whose gaps hold NaN (a kernel reading them says so)."""
    import torch

    x = x.detach()
    if case == TRANSPOSED:
        rows = x.reshape(-1, x.shape[-1])
        return rows.t().contiguous().t()
    if case == STRIDED:
        buf = torch.full(
            (*x.shape[:-1], 2 * x.shape[-1]), float("nan"), dtype=x.dtype, device=x.device
        )
        buf[..., ::2] = x
        return buf[..., ::2]
    raise ValueError(f"not a view case: {case!r}")


def fresh_like(x: Any) -> Any:
    """A detached copy of ``x`` with its strides: a view stays a view of a buffer of its own, whose
    gaps hold NaN where its dtype has one (a kernel reading them says so)."""
    import torch

    x = x.detach()
    if x.is_contiguous():
        return x.clone()
    span = (
        1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride(), strict=True)) if x.numel() else 0
    )
    fill = float("nan") if x.dtype.is_floating_point else 0
    buf = torch.full((span,), fill, dtype=x.dtype, device=x.device)
    return buf.as_strided(x.shape, x.stride()).copy_(x)


# ---- state dicts between torch.nn's names and a module's ----------------------------------------
def to_module(state: Mapping[str, Any], pairs: Pairs) -> dict[str, Any]:
    """A torch.nn-named state dict under the module's keys and layout (``pairs``)."""
    moved = ((pairs.get(name, (name, False)), value) for name, value in state.items())
    return {key: value.t().contiguous() if turned else value for (key, turned), value in moved}


def to_torch(state: Mapping[str, Any], pairs: Pairs) -> dict[str, Any]:
    """A module's state dict under torch.nn's names and layout (keys ``pairs`` does not map are
    left out: an ``_extra_state``)."""
    return {
        name: state[key].t().contiguous() if turned else state[key]
        for name, (key, turned) in pairs.items()
        if key in state
    }
