"""The trace and kernel_lock.apply agree: every site the trace records in each model of
tests/models is the site apply swaps, with the same semantics and the same ``#n``; a lock pinning
classes that compute what the model's own do leaves every output and gradient unchanged. One home
for a site's semantics: ``SlotSpec.calls`` (the slots' files), read by both."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import pytest

import kernel_lock
from kernel_lock.lock import KernelLock
from kernel_lock.model import Model, Site
from kernel_lock.schema import EnvField, Environment, Slot
from kernel_lock.slots import SPECS
from kernel_probe.model import trace
from kernel_probe.model.child import trace_model
from tests.models import block, variants

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]
# classes computing exactly what torch's do, under another package's name (tests/fakes/kp_same.py)
TARGETS = {
    "LayerNorm": ("kp_same.SameLayerNorm", {}),
    "RMSNorm": ("kp_same.SameRMSNorm", {}),
    "Linear": ("kp_same.SameLinear", {}),
    "Attention": ("kp_same.SameAttention", {}),
    "gelu-erf": ("kp_same.SameGELU", {}),
    "gelu-tanh": ("kp_same.SameGELU", {"approximate": "tanh"}),
    "silu": ("kp_same.SameSiLU", {}),
}
BUILDERS = {"block.py:build": block.build} | {
    f"variants.py:{name}": fn
    for name, fn in vars(variants).items()
    if inspect.isfunction(fn) and fn.__module__ == variants.__name__ and not name.startswith("_")
}


def lock_for(traced: Model, path: Path) -> KernelLock:
    """A lock pinning the kp_same class of every slot the model uses, with the model's semantics
    (Activation: the first site's function), carrying its trace; written and read back."""
    slots = {}
    for slot, sites in traced.by_slot().items():
        function = sites[0].semantics.get("function") if slot == "Activation" else None
        target, kwargs = TARGETS[function or slot]
        slots[slot] = Slot(
            name=slot, implementation=f"same.{slot.lower()}", target=target,
            semantics=SPECS[slot].semantics, kwargs=kwargs,
            extra={"function": function} if function else {},
        )  # fmt: skip
    env = Environment(fields={"device-type": EnvField(value="cpu", match="exact")})
    lock = KernelLock(
        created_by="test", trusted_modules=("kp_same",), environment=env, slots=slots,
        model=traced,
    )  # fmt: skip
    lock.sealed().dump(path)
    return kernel_lock.load(path, trust=["kp_same"], emit_warnings=False)


def built(builder) -> tuple:
    value = builder()
    model, args, kwargs = (*value, {}) if len(value) == 2 else value
    return model, args, kwargs


def run(model, args, kwargs) -> tuple:
    """One forward and backward: the output, and each parameter's gradient by name."""
    model.zero_grad()
    out = model(*args, **kwargs)
    out.square().mean().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters()}


def other_function(traced: Model, site: Site) -> bool:
    """An activation site of another function than the lock's one (a lock pins one)."""
    first = traced.by_slot()["Activation"][0] if site.slot == "Activation" else site
    return site.semantics != first.semantics


@pytest.mark.slow  # a traced child per model: ~3 s each
@pytest.mark.parametrize("spec", list(BUILDERS))
def test_every_traced_site_is_applied_and_the_model_computes_as_written(spec, tmp_path):
    traced = trace(f"{ROOT}/tests/models/{spec}")
    lock = lock_for(traced, tmp_path / "kernel-lock.toml")
    model, args, kwargs = built(BUILDERS[spec])
    written = copy.deepcopy(model)
    report = kernel_lock.apply(model, lock)

    others = {s.where for s in traced.sites if other_function(traced, s)}
    swapped = {s.where for s in report.sites if s.swapped}
    assert swapped == {s.where for s in traced.sites} - others, str(report)
    left = {s.where: s.reason for s in report.left}
    assert left == {u.where: u.reason for u in traced.unreached} | {w: left[w] for w in others}, (
        str(report)
    )
    assert all("function" in left[w] for w in others)
    kinds = {s.where: s.kind for s in report.sites}
    assert all(kinds[s.where] == s.kind for s in traced.sites)
    assert all(
        kinds[u.where] == ("function" if ":" in u.where else "module") for u in traced.unreached
    )
    assert model.state_dict().keys() == written.state_dict().keys()

    out, grads = run(model, args, kwargs)
    want, want_grads = run(written, args, kwargs)
    assert torch.equal(out, want)
    assert grads.keys() == want_grads.keys()
    assert all(torch.equal(grads[n], want_grads[n]) for n in grads)
    # every functional call went to the lock's class at run time, none left for its semantics
    functions = {s.where: s.calls for s in traced.sites if s.kind == "function"}
    routed = {w: n for w, n in functions.items() if w not in others}
    assert report.calls() == {w: (n, 0) for w, n in routed.items()}


@pytest.mark.slow
def test_a_model_whose_eps_is_not_the_traced_one_is_left_and_named(tmp_path):
    lock = lock_for(trace(f"{ROOT}/tests/models/block.py:build"), tmp_path / "k.toml")
    model, (x,), _ = built(block.build)
    model.norm2.eps = 1e-3
    written = copy.deepcopy(model)
    report = kernel_lock.apply(model, lock)
    (left,) = report.left
    assert left.where == "norm2" and left.reason == "eps 0.001, the lock checked 1e-05"
    assert type(model.norm2) is torch.nn.LayerNorm and type(model.norm1).__name__ == "SameLayerNorm"
    assert torch.equal(model(x), written(x))


def test_the_nth_call_is_the_same_site_to_the_trace_and_to_apply(tmp_path):
    value = trace_model({
        "spec": {"kind": "module", "source": "tests.models.variants", "call": "repeated",
                 "text": "tests.models.variants:repeated"},
        "precision": "32-true", "trust": [],
    })  # fmt: skip
    sites = tuple(Site(**{**s, "shapes": tuple(s["shapes"])}) for s in value["sites"])
    wheres = [s.where for s in sites]
    assert wheres == [":layer_norm", "act:gelu", "act:gelu#2", ":layer_norm#2"]
    assert sites[0].semantics == sites[3].semantics and sites[1].semantics == sites[2].semantics
    lock = lock_for(Model.of("variants.py:repeated", sites), tmp_path / "k.toml")
    model, (x,), _ = built(variants.repeated)
    written = copy.deepcopy(model)
    report = kernel_lock.apply(model, lock)
    assert not report.left, str(report)
    assert torch.equal(model(x), written(x))
    # each call went to its own site: the n-th call to "#n", though all are alike
    assert report.calls() == dict.fromkeys(wheres, (1, 0))
