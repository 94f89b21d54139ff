"""Issue 53's first two Must shows, end to end with no hand-written swap: `kernel-probe --model
tests/models/block.py:build --out L` with a third-party LayerNorm pinned, then
`kernel_lock.apply(model, kernel_lock.load(L))`. Every LayerNorm becomes that class; outputs,
gradients and the parameters after 20 SGD steps agree with the model as written; the report names
every site the trace found."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import kernel_lock
from tests.conftest import ROOT, run_cli
from tests.models import block, variants

THIRD_PARTY = "kp_zoo.norms.GoodLayerNorm"  # its own forward (float32 mean/var), not torch's
SPEC = f"{ROOT / 'tests/models/block.py'}:build"
STEPS = 20
SMALL = ["--precision", "32-true", "--reps", "2"]


def _step(model, x, opt):
    opt.zero_grad()
    out = model(x)
    loss = out.square().mean()
    loss.backward()
    opt.step()
    return out.detach(), loss.detach()


@pytest.mark.slow
def test_the_block_probed_for_then_applied_trains_as_written(tmp_path, capsys):
    out = tmp_path / "kernel-lock.toml"
    args = ["--model", SPEC, "--out", out, *SMALL]
    pin = ["--candidate", f"LayerNorm={THIRD_PARTY}", "--pin", f"LayerNorm=custom:{THIRD_PARTY}"]
    code, stdout, err = run_cli([*args, *pin, "--json"], capsys)
    assert code == 0, err
    lock = kernel_lock.load(out, trust=["kp_zoo"], emit_warnings=False)
    assert lock.model is not None and lock.slots["LayerNorm"].target == THIRD_PARTY
    assert lock.model.check is not None and lock.model.check.verdict == "agree"
    assert json.loads(stdout)["model-check"] == lock.model.check.to_dict()

    written, (x,) = block.build()
    applied = copy.deepcopy(written)
    report = kernel_lock.apply(applied, lock)
    # the report names every site the trace found, and says what each runs now
    assert {s.where for s in report.sites} >= {s.where for s in lock.model.sites}
    # causal, as the model; routed unless the choice is plain SDPA, what the call runs already
    attention = next(s for s in report.sites if s.slot == "Attention")
    assert lock.slots["Attention"].kwargs["causal"] is True
    assert attention.swapped or "what the call runs already" in attention.reason, attention
    norms = [m for m in applied.modules() if type(m).__name__ == "GoodLayerNorm"]
    assert len(norms) == 2 and not any(isinstance(m, torch.nn.LayerNorm) for m in applied.modules())
    assert set(dict(applied.state_dict())) == set(dict(written.state_dict()))

    opt_w = torch.optim.SGD(written.parameters(), lr=0.05)
    opt_a = torch.optim.SGD(applied.parameters(), lr=0.05)
    torch.manual_seed(1)
    for step in range(STEPS):
        xs = x + 0.1 * torch.randn_like(x)
        (y_w, l_w), (y_a, l_a) = _step(written, xs, opt_w), _step(applied, xs, opt_a)
        torch.testing.assert_close(y_a, y_w, rtol=1e-5, atol=1e-5, msg=f"output, step {step}")
        torch.testing.assert_close(l_a, l_w, rtol=1e-5, atol=1e-6, msg=f"loss, step {step}")
        for (name, p_w), p_a in zip(written.named_parameters(), applied.parameters(), strict=True):
            torch.testing.assert_close(p_a.grad, p_w.grad, rtol=1e-4, atol=1e-5, msg=name)
    routed = {attention.where: (STEPS, 0)} if attention.swapped else {}
    assert report.calls() == routed  # every call routed, none left
    for (name, p_w), p_a in zip(written.named_parameters(), applied.parameters(), strict=True):
        torch.testing.assert_close(p_a, p_w, rtol=1e-4, atol=1e-5, msg=f"{name} after {STEPS}")


# the model's own semantics, as the lock must record them (slot, where in the slot's table, value)
UNUSUAL = {
    "norms": [
        ("RMSNorm", lambda s: s.kwargs["eps"], None),  # torch's eps=None, never liger's 1e-6
        ("LayerNorm", lambda s: s.kwargs["bias"], False),
        ("Linear", lambda s: s.kwargs["bias"], False),
        ("Activation", lambda s: s.extra["function"], "gelu-tanh"),
    ],
    "gqa": [
        ("Attention", lambda s: s.extra["mask"], "bool"),
        ("Attention", lambda s: s.extra["gqa"], True),
        ("Attention", lambda s: s.kwargs.get("causal", False), False),
        ("Attention", lambda s: s.kwargs["window"], -1),
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("builder", sorted(UNUSUAL))
def test_a_model_unlike_torchs_defaults_is_locked_as_it_is_and_applied_unchanged(
    builder, tmp_path, capsys
):
    """Issue 53's second Must show: a model whose layers are not torch's defaults is probed with
    its own semantics (recorded in the lock), and `apply` leaves every output, gradient and
    state-dict entry as the model as written has it."""
    out = tmp_path / "kernel-lock.toml"
    spec = f"{ROOT / 'tests/models/variants.py'}:{builder}"
    code, _, err = run_cli(["--model", spec, "--out", out, *SMALL], capsys)
    assert code == 0, err
    lock = kernel_lock.load(out, emit_warnings=False)
    for slot, value, want in UNUSUAL[builder]:
        assert value(lock.slots[slot]) == want, (slot, want)

    written, args, *rest = getattr(variants, builder)()
    kwargs = rest[0] if rest else {}
    applied = copy.deepcopy(written)
    report = kernel_lock.apply(applied, lock)
    assert {s.where for s in report.sites} >= {s.where for s in lock.model.sites}
    y_w, y_a = written(*args, **kwargs), applied(*copy.deepcopy(args), **kwargs)
    # the same computation: equal up to float32 rounding (the probe may choose another SDPA backend,
    # whose sums round in another order: gradients 2e-6 apart), never a changed eps, bias or mask
    torch.testing.assert_close(y_a, y_w, rtol=1e-5, atol=1e-5)
    y_w.square().sum().backward()
    y_a.square().sum().backward()
    pairs = zip(written.named_parameters(), applied.parameters(), strict=True)
    for (name, p_w), p_a in pairs:
        torch.testing.assert_close(p_a.grad, p_w.grad, rtol=1e-5, atol=1e-5, msg=name)
    mine, theirs = written.state_dict(), applied.state_dict()
    assert list(mine) == list(theirs)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.slow
def test_a_pinned_class_that_diverges_at_the_model_level_writes_no_lock(tmp_path, capsys):
    """Issue 54: LateStaleCopyLayerNorm passes every per-kernel check (there its weights change
    once: issue 55's second life) and computes with a stale weight from the second optimizer step;
    the probe's model check names the site and the phase, exits 3 and keeps no lock
    (docs/probe.md)."""
    stale = "kp_zoo.norms.LateStaleCopyLayerNorm"
    out = tmp_path / "kernel-lock.toml"
    pin = ["--candidate", f"LayerNorm={stale}", "--pin", f"LayerNorm=custom:{stale}"]
    code, _, err = run_cli(["--model", SPEC, "--out", out, *SMALL, *pin], capsys)
    assert code == 3, err
    assert "site norm1 diverges (phase 'after optimizer step 2'" in err, err
    assert "no lock written" in err and "--no-model-check" in err
    assert not out.exists()
    # the user's explicit choice: unchecked, written, nothing recorded
    code, _, err = run_cli(
        ["--model", SPEC, "--out", out, *SMALL, *pin, "--no-model-check"], capsys
    )
    assert code == 0, err
    lock = kernel_lock.load(out, trust=["kp_zoo"], emit_warnings=False)
    assert lock.slots["LayerNorm"].target == stale and lock.model.check is None
