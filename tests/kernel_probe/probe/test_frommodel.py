"""A probe for a model (``--model``): each slot reads its own traced sites (``Slot.use``) into the
semantics checked, the shapes timed at and their calls; planning, the choice and the reuse decision
follow the trace. The trace itself is the tracer's (``kernel_probe.model``): here a hand-built
``Model`` stands in for it (``frommodel.trace`` patched), so nothing runs a user's code."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kernel_lock.model import Model, Site, Unreached
from kernel_probe.errors import ProbeError, StaleLock, UsageError
from kernel_probe.jobstart import run
from kernel_probe.probe import frommodel, planning
from kernel_probe.probe.pipeline import reusable
from kernel_probe.probe.planning import ProbeRequest, plan
from kernel_probe.slots import attention, slot
from tests.conftest import write_sealed

SPEC = "block.py:build"
CALLS = {
    "Activation": "torch.nn.GELU",
    "Attention": "torch.nn.functional.scaled_dot_product_attention",
}
LN = {"normalized_shape": [32], "eps": 1e-5, "elementwise_affine": True, "bias": True}


def site(slot_name: str, where: str, semantics: dict, *shapes: str, calls: int = 1) -> Site:
    kind = "function" if ":" in where else "module"
    return Site(
        slot=slot_name,
        where=where,
        kind=kind,
        call=CALLS.get(slot_name, f"torch.nn.{slot_name}"),
        calls=calls,
        dtype="float32",
        shapes=shapes,
        semantics=semantics,
    )


def attention_site(where: str = "attn:scaled_dot_product_attention", **semantics) -> Site:
    s = {"heads": 2, "kv_heads": 2, "head_dim": 16, "seq_q": 8, "seq_k": 8, "is_causal": False}
    s |= {"mask": "none", "scale": "none", "dropout": 0.0, "enable_gqa": False}
    return site("Attention", where, s | semantics, "3x2x8x16", "3x2x8x16", "3x2x8x16")


def block(eps2: float = 1e-5, out: int = 64) -> Model:
    """A small block: two LayerNorms (the second's eps ``eps2``), two Linears, a GELU, SDPA."""
    sites = (
        site("LayerNorm", "norm1", LN, "3x8x32", calls=2),
        site("LayerNorm", "norm2", {**LN, "eps": eps2}, "3x8x32"),
        site("Linear", "fc1", {"in_features": 32, "out_features": out, "bias": True}, "3x8x32"),
        site("Linear", "fc2", {"in_features": out, "out_features": 32, "bias": True}, f"3x8x{out}"),
        site("Activation", "act", {"function": "gelu-tanh"}, f"3x8x{out}"),
        attention_site(),
    )
    mha = Unreached(where="mha", call="torch.nn.MultiheadAttention", reason="no slot swaps it")
    return Model.of(SPEC, sites, (mha,), traced="meta")


# ---- each slot reads its own sites --------------------------------------------------------------
def test_the_most_called_semantics_are_checked_and_the_others_named():
    use = slot("LayerNorm").use(block(eps2=1e-6).by_slot()["LayerNorm"])
    assert use.canonical == {"eps": 1e-5, "elementwise_affine": True, "bias": True}
    assert use.weights == {"24x32": 2} and use.covered == ("norm1",)
    ((where, why),) = use.uncovered
    assert where == "norm2" and "eps=1e-06 (the lock's 1e-05)" in why and "2 of 3 calls" in why


def test_a_norms_rows_are_its_leading_dimensions_and_a_linears_shape_has_its_out():
    model = block()
    assert slot("LayerNorm").use(model.by_slot()["LayerNorm"]).weights == {"24x32": 3}
    linear = slot("Linear").use(model.by_slot()["Linear"])
    assert linear.weights == {"24x32x64": 1, "24x64x32": 1} and linear.canonical == {"bias": True}
    two_d = site("LayerNorm", "n", {**LN, "normalized_shape": [4, 8]}, "3x5x4x8")
    assert slot("LayerNorm").use([two_d]).weights == {"15x32": 1}


def test_the_activation_declares_the_models_function():
    use = slot("Activation").use(block().by_slot()["Activation"])
    assert use.canonical == {"function": "gelu-tanh"} and use.declared == "gelu-tanh"
    unknown = site("Activation", "a", {"function": "swish-ish"}, "4x4")
    assert "function:" in slot("Activation").use([unknown]).uncovered[0][1]


def test_attention_is_timed_at_its_geometry_once_per_batch_row():
    use = slot("Attention").use([attention_site(), attention_site("b:sdpa", window=4)])
    # the batch of 3 is three calls at batch 1; the two sites differ in their window
    assert use.weights == {"2x16x8": 3} and use.declared == "2x16x8"
    assert "window=4 (the lock's none)" in use.uncovered[0][1]
    windowed = slot("Attention").use([attention_site(window=4, calls=1)] * 2)
    assert windowed.canonical == {"window": 4} and windowed.declared == "2x16x8:window=4"


@pytest.mark.parametrize(
    "semantics,option",
    [({"is_causal": True}, "causal"), ({"mask": "bool"}, "mask"), ({"kv_heads": 1}, "kv_heads")],
)
def test_an_attention_option_the_geometry_cannot_say_is_never_dropped(semantics, option):
    use = slot("Attention").use([attention_site(**semantics)])
    if option in attention.OPTIONS:  # the slot checks it: pinned, and in the geometry
        assert option in use.canonical and f"{option}=" in use.declared
    else:  # not checked: the site is not covered, never probed as if the option were unset
        assert not use.weights and f"cannot say {option}" in use.uncovered[0][1]


def test_an_rms_norm_eps_of_none_is_pinned_only_where_the_slot_can_say_it():
    none_eps = site("RMSNorm", "rms", {"normalized_shape": [32], "eps": "none"}, "4x32")
    use = slot("RMSNorm").use([none_eps])
    if slot("RMSNorm").spec.params["eps"].problem(None) is None:
        assert use.canonical["eps"] is None and use.weights == {"4x32": 1}
    else:
        assert not use.weights and "eps=none: the RMSNorm slot cannot pin it" in use.uncovered[0][1]


# ---- the trace, read for planning --------------------------------------------------------------
def test_slots_the_model_does_not_call_are_not_probed_and_the_rest_said():
    notes: list[str] = []
    traced = frommodel.traced(block(eps2=1e-6), (), notes.append)
    assert traced.slots == ("LayerNorm", "Linear", "Attention", "Activation")
    said = "\n".join(notes)
    assert "makes no call of RMSNorm, GatedMLP: not probed" in said
    assert "LayerNorm norm2: eps=1e-06" in said and "out of reach: mha" in said
    assert traced.plan_fields()["weights"]["LayerNorm"] == {"24x32": 2}


def test_a_slot_named_that_the_model_does_not_call_is_a_usage_error():
    with pytest.raises(UsageError, match="makes no RMSNorm call"):
        frommodel.traced(block(), ("RMSNorm",))
    assert frommodel.traced(block(), ("Linear",)).slots == ("Linear",)


def test_a_model_with_nothing_to_probe_is_an_error():
    nothing = Model.of(SPEC, (site("RMSNorm", "r", {"normalized_shape": [4], "eps": -1.0}, "4"),))
    with pytest.raises(ProbeError, match="no call of the model is one a slot can check"):
        frommodel.traced(nothing, ())


@pytest.fixture
def traced_cpu(monkeypatch, no_workers):
    """A CPU, and ``frommodel.trace`` answering with the model ``traced_cpu.model``."""
    monkeypatch.setattr(planning, "detect_device", lambda: {"type": "cpu", "arch": ""})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    state = type("State", (), {"model": block()})()
    monkeypatch.setattr(frommodel, "trace", lambda spec, precision: state.model)
    return state


def test_the_plan_times_each_slot_at_the_models_shapes_with_its_semantics(traced_cpu):
    p = plan(ProbeRequest(model=SPEC, precision="32-true"))
    assert p.slots == ("LayerNorm", "Linear", "Attention", "Activation") and p.model == block()
    assert p.timed_at["Attention"] == ("2x16x8",) and p.weights["Attention"] == {"2x16x8": 3}
    assert p.timed_at["Linear"] == ("24x32x64", "24x64x32") and p.weights["LayerNorm"] == {
        "24x32": 3
    }
    assert p.canonical["Activation"] == {"function": "gelu-tanh"}
    assert p.inputs["model"] == block().digest and p.shapes_from == f"model {SPEC}"
    assert p.shapes == ("24x32", "24x32x64", "24x64x32", "24x64")  # Attention's are its own
    # another size of the same model is another plan: a lock of one is not reused for the other
    traced_cpu.model = block(out=128)
    assert plan(ProbeRequest(model=SPEC, precision="32-true")).digest != p.digest


@pytest.mark.parametrize(
    "change,said",
    [
        ({"shapes": ("64x32",)}, "--shape with --model"),
        ({"declared": {"Activation": "silu"}}, "--activation with --model"),
    ],
)
def test_what_the_model_says_cannot_also_be_given(traced_cpu, change, said):
    with pytest.raises(UsageError, match=said):
        plan(ProbeRequest(model=SPEC, **change))


# ---- reuse and --check against the trace -------------------------------------------------------
def _lock_for(p, path, model):
    """A lock at ``path`` as a probe of plan ``p`` would leave it, for ``model``'s trace."""
    import kernel_lock
    from tests.conftest import MINIMAL_LOCK

    head = 'created-by = "hand"\n'
    text = MINIMAL_LOCK.replace(head, f'{head}provenance = {{ inputs = "{p.digest}" }}\n', 1)
    lock = kernel_lock.loads(text, emit_warnings=False)
    write_sealed(path, text) if model is None else replace(lock, model=model).sealed().dump(path)
    return path


def test_a_lock_for_another_model_is_stale_naming_the_difference(traced_cpu, tmp_path):
    p = plan(ProbeRequest(model=SPEC, precision="32-true"))
    same = _lock_for(p, tmp_path / "same.toml", block())
    assert reusable(same, p.digest, model=p.model)[1] == ""
    other = _lock_for(p, tmp_path / "other.toml", block(eps2=1e-6))
    lock, why = reusable(other, p.digest, model=p.model)
    assert lock is None and why.startswith("it was probed for another model or other sizes: ")
    assert "norm2: semantics" in why
    bare = _lock_for(p, tmp_path / "bare.toml", None)
    assert "not probed for a model" in reusable(bare, p.digest, model=p.model)[1]


def test_check_with_a_model_exits_3_on_a_lock_for_another(traced_cpu, tmp_path):
    request = ProbeRequest(
        model=SPEC, precision="32-true", out=tmp_path / "l.toml", check_only=True
    )
    _lock_for(plan(request), request.out, block(out=128))
    with pytest.raises(StaleLock) as info:
        run(request)
    assert info.value.exit_code == 3 and "fc1: semantics" in info.value.problem
    _lock_for(plan(request), request.out, block())
    assert run(request).reused


def test_on_a_gpu_nothing_a_default_invents_is_pinned_for_a_model(traced_cpu, monkeypatch):
    # the GPU's default attention geometry and the RMSNorm's canonical eps never reach a model's
    # slots: its global attention is timed without a window, its RMSNorm pinned with its own eps
    gpu = {"type": "cuda", "arch": "sm_90", "name": "H100"}
    monkeypatch.setattr(planning, "detect_device", lambda: dict(gpu))
    rms = site(
        "RMSNorm", "rms", {"normalized_shape": [32], "eps": 1e-5, "elementwise_affine": True}
    )
    traced_cpu.model = Model.of(SPEC, (*block().sites, replace(rms, shapes=("3x8x32",))))
    p = plan(ProbeRequest(model=SPEC, precision="bf16-mixed"))
    assert "Attention" not in p.canonical and p.timed_at["Attention"] == ("2x16x8",)
    assert p.inputs["attention"] == "2x16x8" and p.slot_provenance["attention"] == "2x16x8"
    assert p.canonical["RMSNorm"] == {"eps": 1e-5, "elementwise_affine": True}
    assert p.canonical["LayerNorm"] == {"eps": 1e-5, "elementwise_affine": True, "bias": True}


def test_a_candidate_declared_with_another_value_of_the_models_semantics_is_skipped():
    from kernel_probe.candidates import default_for

    layer_norm, cand = slot("LayerNorm"), default_for("LayerNorm")  # elementwise_affine = true
    problem = layer_norm.static_problem(cand, {"eps": 1e-5, "elementwise_affine": False})
    assert problem is not None and problem.status == "skipped"
    assert "declared with elementwise_affine=true; the model's is false" in problem.reason
    # the model's own value, or a value the candidate takes from the model ($eps): checked as usual
    assert layer_norm.static_problem(cand, {"eps": 1e-6, "elementwise_affine": True}) is None
    assert layer_norm.static_problem(cand, {}) is None


def test_a_site_the_checks_reference_cannot_compute_is_not_covered():
    no_affine = {**LN, "elementwise_affine": False, "bias": False}
    model = Model.of(SPEC, (*block().sites, site("LayerNorm", "n", no_affine, "4x32", calls=9)))
    traced = frommodel.traced(model, ())
    # the most-called LayerNorm cannot be checked: the others are, with their own semantics
    assert traced.uses["LayerNorm"].covered == ("norm1", "norm2")
    assert traced.uses["LayerNorm"].canonical["elementwise_affine"] is True
    (line,) = [line for line in traced.not_covered if line.startswith("LayerNorm n:")]
    reference = "the check's reference cannot compute it: torch.nn.LayerNorm is declared with "
    assert line == f"LayerNorm n: {reference}elementwise_affine=true; the model's is false"
    only = Model.of(SPEC, (site("LayerNorm", "n", no_affine, "4x32"), *block().sites[2:]))
    assert "LayerNorm" not in frommodel.traced(only, ()).slots


def test_a_gated_mlp_declares_its_implementation():
    gated = site("GatedMLP", "mlp", {"mlp_implementation": "geglu", "bias": True}, "2x10x64")
    use = slot("GatedMLP").use([gated])
    assert use.declared == "geglu" and use.weights == {"20x64": 1}
    assert use.canonical == {"mlp_implementation": "geglu", "bias": True}
