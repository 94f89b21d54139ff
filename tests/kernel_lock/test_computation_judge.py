"""One judge of what a target computes (issue 52): each slot's rule (``SlotSpec.computes`` and
``declares``), one caller (``kernel_lock.slots.computation_problem``) when a slot table is read and
when a class is imported. A lock whose target or twin computes other than its slot is refused by
every command that reads it; a twin must compute what its slot's target computes; an inference
lock's derived keys are computed from the twin's kwargs."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import kernel_lock
from kernel_lock.attention import Attention
from kernel_lock.checkpoint import lock_from_checkpoint
from kernel_lock.errors import ExitCode, TargetNotAllowed
from kernel_lock.slots import SPECS
from kernel_lock.slots.activation import TORCH_OTHERS
from kernel_lock.slots.gated_mlp import formula
from tests.conftest import MINIMAL_LOCK, run_cli, sealed_lock, small_probe

HEAD = MINIMAL_LOCK[: MINIMAL_LOCK.index("[slots.LayerNorm]")]
ERF_SLOT = """
[slots.Activation]
implementation = "hand"
target = "TARGET"
semantics = "activation"
function = "gelu-erf"
kwargs = KWARGS
"""
# an Activation slot for gelu-erf whose target computes another function (the cases)
OTHER_FUNCTIONS = {
    "silu": ("torch.nn.SiLU", "{}", "'silu'"),
    "tanh": ("torch.nn.Tanh", "{}", "'other:torch.nn.Tanh'"),
    "tanh-gelu": ("torch.nn.GELU", '{ approximate = "tanh" }', "'gelu-tanh'"),
}
APPROXIMATION = (
    "accepted-changes = [\"approximation: computes gelu-tanh, not the model's gelu-erf (accepted "
    'with --allow-approximation)"]\n'
)


def erf_slot(target: str, kwargs: str) -> str:
    return ERF_SLOT.replace("TARGET", target).replace("KWARGS", kwargs)


def unjudged(monkeypatch, text: str, **load) -> str:
    """``text`` sealed as a writer that does not judge would seal it (the lock a hand edit and the
    old rehash left)."""
    with monkeypatch.context() as m:
        m.setattr("kernel_lock.schema.computation_problem", lambda *a, **k: None)
        return sealed_lock(text, **load).dumps()


# ---- the lock's reader ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", OTHER_FUNCTIONS)
def test_a_target_computing_another_function_is_refused_at_load(case):
    target, kwargs, computes = OTHER_FUNCTIONS[case]
    with pytest.raises(TargetNotAllowed) as info:
        kernel_lock.loads(HEAD + erf_slot(target, kwargs), path="x.toml", emit_warnings=False)
    e = info.value
    assert e.exit_code == ExitCode.BAD_INPUT and e.key == "slots.Activation.target"
    assert f"slot Activation: {target} computes function {computes}" in e.problem
    assert "the slot declares function 'gelu-erf'" in e.problem and "kernel-probe --force" in e.fix


def test_an_approximation_the_lock_records_as_accepted_stays_valid():
    text = HEAD + erf_slot("torch.nn.GELU", '{ approximate = "tanh" }') + APPROXIMATION
    mod = kernel_lock.loads(text, emit_warnings=False).factory("Activation")()
    assert isinstance(mod, torch.nn.GELU) and mod.approximate == "tanh"
    # recorded for gelu-tanh only: another function is still refused
    with pytest.raises(TargetNotAllowed, match="computes function 'silu'"):
        kernel_lock.loads(HEAD + erf_slot("torch.nn.SiLU", "{}") + APPROXIMATION)


def test_torch_others_are_torchs_elementwise_activations():
    from torch.nn.modules import activation

    spec = SPECS["Activation"]
    known = {t.rsplit(".", 1)[1] for t in spec.known_targets if t.startswith("torch.nn.")}
    assert set(activation.__all__) - known - set(spec.not_computed_by) == TORCH_OTHERS


def test_an_imported_subclass_computes_the_function_whose_forward_it_inherits():
    text = HEAD.replace(
        'created-by = "hand"', 'created-by = "hand"\ntrusted-modules = ["kp_activation"]'
    ) + erf_slot("kp_activation.NamedGELU", "{}")
    lock = kernel_lock.loads(text, emit_warnings=False, trust=["kp_activation"])  # untold by name
    with pytest.raises(TargetNotAllowed, match="NamedGELU computes function 'silu'") as info:
        lock.factory("Activation")
    assert info.value.key == "slots.Activation.target"
    ok = text.replace("NamedGELU", "ExactGELU")  # its own forward: the probe's measurement's word
    assert kernel_lock.loads(ok, emit_warnings=False, trust=["kp_activation"]).factory("Activation")


def test_each_slots_rule_tells_what_its_classes_compute():
    attention, gated = SPECS["Attention"].computes, SPECS["GatedMLP"].computes
    assert attention("kernel_lock.attention.SDPAttention", {"window": 4}, None) == {
        "window": 4, "softcap": 0.0, "dropout": 0.0, "alibi": False, "causal": False
    }  # fmt: skip
    assert attention("my.Attention", {}, None) is None  # another library's: untold
    defaults = {k: p.default for k, p in inspect.signature(Attention).parameters.items()}
    assert attention("x.Y", {}, Attention) == defaults  # an imported subclass: its base's defaults
    got = gated("kernel_lock.gated_mlp.GatedMLP", {"mlp_implementation": "geglu"}, None)
    assert got == {"gate": formula("geglu")}
    assert "none" in gated("kernel_lock.gated_mlp.GatedMLP", {}, None)["gate"]
    assert [s for s in SPECS.values() if s.computes] == [
        SPECS["Attention"], SPECS["GatedMLP"], SPECS["Activation"]
    ]  # fmt: skip


# ---- every command that reads the lock -----------------------------------------------------------
@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> Path:
    """A real CPU probe's lock of the Activation slot (gelu-erf, torch.gelu)."""
    from kernel_probe.cli import main

    out = tmp_path_factory.mktemp("probed") / "kernel-lock.toml"
    assert main([*small_probe("Activation"), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("case", OTHER_FUNCTIONS)
def test_verify_check_factory_rehash_and_export_refuse_it(
    probed, tmp_path, monkeypatch, capsys, case
):
    target, kwargs, computes = OTHER_FUNCTIONS[case]
    text = probed.read_text()
    table = text[text.index("[slots.Activation]") :]
    edited = table.replace('target = "torch.nn.GELU"', f'target = "{target}"', 1)
    edited = re.sub(r"kwargs = \{[^}]*\}", f"kwargs = {kwargs}", edited, count=1)
    bad = tmp_path / "kernel-lock.toml"
    bad.write_text(unjudged(monkeypatch, text.replace(table, edited)))
    before = bad.read_bytes()
    runs = {
        "verify": ["verify", bad],
        "--check": [*small_probe("Activation"), "--out", bad, "--check"],
        "rehash": ["rehash", bad],
        "export": ["export", bad, "--format", "anemoi"],
    }
    for name, argv in runs.items():
        code, out, err = run_cli(argv, capsys)
        assert code == ExitCode.BAD_INPUT, (name, out, err)
        assert f"{target} computes function {computes}" in err and "fix:" in err, name
        assert target not in out, name  # export wrote nothing of it
    assert bad.read_bytes() == before  # rehash sealed nothing
    with pytest.raises(TargetNotAllowed):
        kernel_lock.load(bad).factory("Activation")


def test_the_probes_own_lock_still_verifies_and_checks_current(probed, capsys):
    assert run_cli(["verify", probed], capsys)[0] == 0
    assert run_cli([*small_probe("Activation"), "--out", probed, "--check"], capsys)[0] == 0


# ---- twins ---------------------------------------------------------------------------------------
# slots that cannot run on this CPU (devices = cuda), each with a twin: the wrong ones
TWINS = {
    "relu-for-tanh-gelu": (
        '[slots.Activation]\nimplementation = "te.gelu"\n'
        'target = "transformer_engine.pytorch.ops.GELU"\nsemantics = "activation"\n'
        'function = "gelu-tanh"\nkwargs = {}\ndevices = ["cuda"]\n'
        'twin = { target = "torch.nn.ReLU", kwargs = {}, state-dict = "interchangeable" }\n',
        "twin torch.nn.ReLU computes function 'relu', but its target "
        "transformer_engine.pytorch.ops.GELU computes function 'gelu-tanh'",
        (
            "torch.nn.ReLU",
            "torch.nn.GELU",
            "kwargs = {}, state",
            'kwargs = { approximate = "tanh" }, state',
        ),
    ),
    "global-for-window-4": (
        '[slots.Attention]\nimplementation = "flash_attn.v2"\n'
        'target = "kernel_lock.attention.FlashAttention2"\nsemantics = "attention"\n'
        "kwargs = { window = 4 }\n"
        'devices = ["cuda"]\ntwin = { target = "kernel_lock.attention.SDPAttention", kwargs = '
        '{ window = -1 }, state-dict = "interchangeable" }\n',
        "computes window -1, but its target kernel_lock.attention.FlashAttention2 computes "
        "window 4",
        ("window = -1", "window = 4", "", ""),
    ),
    "geglu-for-swiglu": (
        '[slots.GatedMLP]\nimplementation = "liger.gated_mlp"\n'
        'target = "kernel_lock.gated_mlp.LigerGatedMLP"\nsemantics = "gated_mlp"\n'
        'kwargs = { mlp_implementation = "swiglu", bias = true }\ndevices = ["cuda"]\n'
        'gate = "silu(gate_proj(x)) * value_proj(x)"\n'
        'twin = { target = "kernel_lock.gated_mlp.GatedMLP", kwargs = { mlp_implementation = '
        '"geglu", bias = true }, state-dict = "interchangeable" }\n',
        "computes gate 'gelu_erf(gate_proj(x)) * value_proj(x)', but its target "
        "kernel_lock.gated_mlp.LigerGatedMLP computes gate 'silu(gate_proj(x)) * value_proj(x)'",
        ('"geglu"', '"swiglu"', "", ""),
    ),
}


@pytest.mark.parametrize("case", TWINS)
def test_a_twin_computing_other_than_its_target_is_refused(tmp_path, monkeypatch, capsys, case):
    table, words, _ = TWINS[case]
    train = tmp_path / "train.toml"
    train.write_text(unjudged(monkeypatch, HEAD + table))
    out = tmp_path / "inference.toml"
    code, _, err = run_cli(["lock", "--for", "inference", train, out], capsys)
    assert code == ExitCode.BAD_INPUT and words in err and "twin.target" in err
    assert not out.exists()
    text = train.read_text()
    digest = re.search(r'^digest = "(.*)"', text, re.M).group(1)
    checkpoint = {"kernel_lock": {"text": text, "digest": digest}}
    with pytest.raises(TargetNotAllowed, match=re.escape(words)):
        lock_from_checkpoint(checkpoint, emit_warnings=False)


@pytest.mark.parametrize("case", TWINS)
def test_a_twin_computing_what_its_target_does_derives_a_lock_that_verifies(tmp_path, capsys, case):
    table, _, (old, new, old2, new2) = TWINS[case]
    table = table.replace(old, new).replace(old2, new2) if old2 else table.replace(old, new)
    train = tmp_path / "train.toml"
    sealed_lock(HEAD + table).dump(train)
    out = tmp_path / "inference.toml"
    assert run_cli(["lock", "--for", "inference", train, out], capsys)[0] == 0
    assert run_cli(["verify", out], capsys)[0] == 0
    lock = kernel_lock.load(out)
    slot = next(iter(lock.slots.values()))
    assert lock.factory(slot.name).substituted_from is None  # the twin is the inference lock's own
    for key in SPECS[slot.name].keys:  # derived keys are the twin's kwargs', computed
        if key.derive is not None:
            assert slot.extra[key.name] == key.derive(slot.kwargs)


@pytest.mark.parametrize("overrides", [{}, {"window": 4, "softcap": 30.0, "alibi": True}])
def test_every_registered_twin_computes_what_its_candidate_computes(overrides):
    from types import SimpleNamespace

    from kernel_lock.slots import computation_problem
    from kernel_lock.slots.gated_mlp import GATED
    from kernel_probe.candidates import builtin, canonical_for

    judged = 0
    for cand in (c for c in builtin() if c.twin_target):
        for slot in cand.slots:
            for gate in GATED if slot == "GatedMLP" else (None,):
                extra = {"mlp_implementation": gate} if gate else {}
                canonical = canonical_for(slot, hidden=8, overrides={**overrides, **extra})
                kwargs = cand.pinned_kwargs(canonical)
                entry = SimpleNamespace(name=slot, target=cand.target, kwargs=kwargs)
                twin = cand.pinned_twin_kwargs(canonical)
                assert computation_problem(entry, cand.twin_target, twin, twin=True) is None
                judged += SPECS[slot].computes is not None
    assert judged > 10
