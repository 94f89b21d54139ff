"""The LayerScale slot as the probe knows it: its cases against a float64 reference, its timing,
and its candidates. It builds on kernel-probe's public pieces (``measure.compare``, the timing
clock, the judge's one rule through the protocol's default verdict), as any outside slot would."""

from kernel_probe.candidates import Candidate, canonical_for
from kernel_probe.slots import Slot

from .spec import SPEC

ROWS, HIDDEN = 64, 96
CASES = {"random": 1.0, "large": 1e3, "tiny": 1e-3}  # the input's scale


def _pass(module, x, gy, autocast):
    """y, dx and dgamma of ``module`` at ``x`` with grad_output ``gy``."""
    import contextlib

    import torch

    leaf = x.detach().clone().requires_grad_(True)
    with torch.autocast(x.device.type, dtype=autocast) if autocast else contextlib.nullcontext():
        y = module(leaf)
    dx, dgamma = torch.autograd.grad(y, (leaf, module.gamma), gy.to(y.dtype))
    return {"y": y.detach(), "dx": dx, "dweight": dgamma}


def _row(cand, device, dtype_name, regime, canonical, seed):
    import torch

    from kernel_probe.probe.measure import build, compare, first_line, torch_dtype

    row = {"dtype": dtype_name, "regime": regime, "flags": {}, "nondeterministic": None}
    dtype = torch_dtype(dtype_name)
    params = torch.float32 if regime == "mixed" else dtype
    gen = torch.Generator().manual_seed(seed)
    gamma = 1.0 + 0.5 * torch.randn(HIDDEN, generator=gen, dtype=torch.float64)
    values = canonical_for(SPEC.name, hidden=HIDDEN, overrides=canonical)
    baseline = Candidate("reference", (SPEC.name,), SPEC.semantics, SPEC.default_target)
    try:
        mods = [build(c, values, device, params) for c in (cand, baseline)]
        for m in mods:
            with torch.no_grad():
                m.gamma.copy_(gamma.to(params))
        cases, stats = {}, {}
        for name, scale in CASES.items():
            x64 = torch.randn(ROWS, HIDDEN, generator=gen, dtype=torch.float64) * scale
            gy64 = torch.randn(ROWS, HIDDEN, generator=gen, dtype=torch.float64)
            x, gy = x64.to(device=device, dtype=dtype), gy64.to(device=device, dtype=dtype)
            got, base = (_pass(m, x, gy, dtype if regime == "mixed" else None) for m in mods)
            ref = {"y": x64 * gamma, "dx": gy64 * gamma, "dweight": (gy64 * x64).sum(0)}
            cases[name], stats[name] = {}, {}
            for out, r in ref.items():
                errors, st = compare(
                    got[out].double().cpu(), base[out].double().cpu(), r, rows=out != "dweight"
                )
                cases[name][out], stats[name][out] = errors, st
    except Exception as exc:
        return {"dtype": dtype_name, "regime": regime, "exception": first_line(exc, 400)}
    row.update(cases=cases, stats=stats)
    return row


class LayerScaleSlot(Slot):
    """``y = x * gamma``: the protocol's verdict (the one rule per output), its own measurements."""

    def check(self, cand, device, dtypes, *, canonical, seed, hidden, baseline, shared):
        """Forward and backward against float64, per (dtype, regime)."""
        from kernel_probe.isolation.protocol import CheckReply
        from kernel_probe.probe.measure import import_stop

        import_s, stopped = import_stop(cand, device)
        if stopped is not None:
            return stopped
        rows = [_row(cand, device, d, r, canonical, seed) for d, r in dtypes]
        return CheckReply(candidate=cand.id, device=device, rows=rows, import_s=import_s)

    def try_once(self, cand, device):
        """One tiny call."""
        try:
            _row(cand, device, "float32", "true", {}, 0)
        except Exception as exc:
            return {"ran": False, "error": str(exc)}
        return {"ran": True}

    def time(self, cand, device, shapes, dtype, regime, options, canonical, progress):
        """fwd+bwd at each ROWSxHIDDEN shape."""
        import torch

        from kernel_probe.probe.measure import build, torch_dtype
        from kernel_probe.probe.timing import step_rows
        from kernel_probe.shapes import parse_shape

        def measure(text, timed):
            rows, hidden, _ = parse_shape(text)
            values = canonical_for(SPEC.name, hidden=hidden, overrides=canonical)
            mod = build(cand, values, device, torch_dtype(dtype))
            x = torch.randn(rows, hidden, device=device, dtype=torch_dtype(dtype))
            x.requires_grad_(True)
            gy = torch.randn_like(x)

            def step():
                torch.autograd.grad(mod(x), (x, mod.gamma), gy)

            row = timed(step)
            row["gbps"] = 3 * x.numel() * x.element_size() / (row["median_ms"] / 1e3) / 1e9

        return step_rows(cand.id, device, shapes, dtype, options, progress, measure)


SLOT = LayerScaleSlot(SPEC)


def candidates():
    """The slot's candidates (entry point ``kernel_probe.probe.candidates``)."""

    def offer(cid, cls):
        return Candidate(
            cid,
            (SPEC.name,),
            SPEC.semantics,
            f"kp_layerscale.layers.{cls}",
            args=SPEC.call_args,
            kwargs=dict(SPEC.call_kwargs),
            module="kp_layerscale",
            twin_target=SPEC.default_target,
            twin_kwargs=dict(SPEC.call_kwargs),
        )

    return [
        offer("layerscale.torch", "LayerScale"),
        offer("layerscale.fused", "FusedLayerScale"),
        offer("layerscale.halfgrad", "HalfGradLayerScale"),
    ]
