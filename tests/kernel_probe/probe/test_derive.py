"""kernel_probe.probe.derive: an inference lock from a training lock, for the machine it will run
on."""

from __future__ import annotations

import pytest

import kernel_lock
from kernel_lock.errors import KernelUnavailable
from kernel_lock.fingerprint import FIELDS
from kernel_probe.probe.derive import Substitution, derive_inference
from tests.conftest import MINIMAL_LOCK, edited_lock, sealed_lock

HEAD = 'created-by = "hand"\n'
TORCH_LAYER_NORM = (
    'implementation = "torch.layer_norm"\ntarget = '
    '"torch.nn.LayerNorm"\nsemantics = '
    '"layer_norm"\nkwargs = { eps = 1e-6 '
    "}\n"
)
TWIN = (
    'twin = { target = "torch.nn.LayerNorm", kwargs = { eps = 1e-6 }, state-dict = '
    '"interchangeable"%s }\n'
)


def not_installed_layer_norm(twin: str | None = TWIN % ", max-error = 0.002", **more: str) -> str:
    """MINIMAL_LOCK whose LayerNorm comes from a library not installed here, with ``twin`` (None:
    none)."""
    slot = (
        'implementation = "fast.layer_norm"\ntarget = '
        '"kp_not_installed.FastLayerNorm"\nsemantics '
        '= "layer_norm"\n'
        'kwargs = { eps = 1e-6 }\nrequires = [{ name = "kp-not-installed", specifier = '
        '">=1.0", module = "kp_not_installed" '
        "}]\n"
        'reason = "fastest at 40320x1024"\n' + (twin or "")
    )
    return edited_lock(
        **{TORCH_LAYER_NORM: slot, HEAD: HEAD + 'trusted-modules = ["kp_not_installed"]\n', **more}
    )


def here() -> dict:
    current = {name: f"v-{name}" for name in FIELDS}
    current.update({"device-type": "cpu", "device-count": 1})
    return current


def test_slots_that_run_here_are_kept_as_they_are():
    source = sealed_lock(MINIMAL_LOCK)
    derived, subs = derive_inference(source, here(), source="train.toml")
    assert subs == []
    assert derived.mode == "inference" and derived.digest == derived.compute_digest()
    assert derived.slots == source.slots
    assert derived.environment.fields["torch"].value == "v-torch"  # this machine's environment
    assert dict(derived.provenance) == {
        "derived-for": "inference",
        "source": "train.toml",
        "source-digest": source.digest,
        "source-created-by": "hand",
        "substitutions": [],
    }


def test_a_slot_that_cannot_run_here_takes_its_twin():
    source = sealed_lock(not_installed_layer_norm())
    derived, (sub,) = derive_inference(source, here(), source="train.toml")
    assert sub == Substitution(
        "LayerNorm",
        "fast.layer_norm",
        "kp_not_installed.FastLayerNorm",
        "torch.nn.LayerNorm",
        "kp-not-installed not installed (needs >=1.0)",
        0.002,
    )
    ln = derived.slots["LayerNorm"]
    assert (ln.implementation, ln.target, dict(ln.kwargs)) == (
        "twin:fast.layer_norm",
        "torch.nn.LayerNorm",
        {"eps": 1e-6},
    )
    assert ln.requires == () and ln.devices == ()
    # how a training state dict migrates stays recorded
    assert ln.twin == source.slots["LayerNorm"].twin
    assert ln.reason == (
        "inference twin of fast.layer_norm (kp_not_installed.FastLayerNorm), which cannot run "
        "here: kp-not-installed not installed (needs >=1.0); chosen for training because: fastest "
        "at 40320x1024"
    )
    assert derived.slots["RMSNorm"] == source.slots["RMSNorm"]
    assert dict(derived.provenance)["substitutions"] == [
        "LayerNorm: fast.layer_norm -> torch.nn.LayerNorm (max error 0.002)"
    ]
    assert (
        derived.trusted_modules == source.trusted_modules and derived.precision == source.precision
    )
    # what is written reads back as a sealed inference lock
    assert kernel_lock.loads(derived.dumps(), emit_warnings=False).digest == derived.digest


def test_the_source_created_at_and_profile_are_recorded():
    extra = '\ncreated-at = "2026-01-02T03:04:05Z"\n\n[profile]\nname = "lumi"\n'
    source = sealed_lock(edited_lock(**{HEAD: HEAD + extra}))
    provenance = dict(derive_inference(source, here(), source="t.toml")[0].provenance)
    assert (
        provenance["source-created-at"] == "2026-01-02T03:04:05Z"
        and provenance["source-profile"] == "lumi"
    )


def test_a_slot_with_no_usable_twin_stops_the_derivation():
    with pytest.raises(KernelUnavailable) as info:
        derive_inference(
            sealed_lock(not_installed_layer_norm(twin=None)), here(), source="train.toml"
        )
    problem = info.value.problem
    assert problem.startswith(
        "cannot derive an inference lock from train.toml: 1 slot(s) have no usable twin:\n  - "
    )
    assert "LayerNorm" in problem
    assert info.value.fix.endswith("(nothing was written)")


@pytest.mark.parametrize(
    "max_error,text",
    [
        (0.002, "LayerNorm: a.b -> torch.nn.LayerNorm (max error 0.002)"),
        (None, "LayerNorm: a.b -> torch.nn.LayerNorm (max error not recorded)"),
        (1.23456e-5, "LayerNorm: a.b -> torch.nn.LayerNorm (max error 1.23e-05)"),
    ],
)
def test_a_substitution_says_itself(max_error, text):
    assert (
        str(Substitution("LayerNorm", "a.b", "x.A", "torch.nn.LayerNorm", "why", max_error)) == text
    )


def test_a_twin_without_a_recorded_error():
    derived, (sub,) = derive_inference(
        sealed_lock(not_installed_layer_norm(TWIN % "")), here(), source="s"
    )
    assert (
        sub.max_error is None
        and "(max error not recorded)" in dict(derived.provenance)["substitutions"][0]
    )
