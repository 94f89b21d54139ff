"""kernel_probe.probe.planning's SlotRule: one answer per slot from the command line and the
profile, read in one place."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from kernel_probe.probe.planning import SlotRule, slot_rules

PROBE = Path(__file__).resolve().parents[3] / "kernel_probe" / "probe"


def site(**slots):
    policy = {
        s: SimpleNamespace(
            allowed=p.get("allowed"), pin=p.get("pin"), preferred=tuple(p.get("prefer", ()))
        )
        for s, p in slots.items()
    }
    return SimpleNamespace(name="lumi-g", slots=policy)


def test_the_command_line_wins_for_a_slot_it_names_and_the_profile_allow_list_still_holds():
    prof = site(
        LayerNorm={"allowed": ["torch.layer_norm", "liger.layer_norm"], "pin": "torch.layer_norm"}
    )
    rules = slot_rules(["LayerNorm", "RMSNorm"], {"LayerNorm": "liger.layer_norm"}, {}, prof)
    ln = rules["LayerNorm"]
    assert (ln.pin, ln.origin, ln.strict_prefer) == ("liger.layer_norm", "", True)
    assert (
        ln.refuses("te.layer_norm") == "not allowed by profile lumi-g"
        and ln.refuses("liger.layer_norm") is None
    )
    assert rules["RMSNorm"] == SlotRule()  # no word on it: anything goes, the choice's own rule


def test_a_profile_policy_is_an_ordered_preference_that_moves_on():
    rules = slot_rules(
        ["RMSNorm"], {}, {}, site(RMSNorm={"prefer": ["liger.rms_norm", "quack.rms_norm"]})
    )
    assert rules["RMSNorm"].choice_options() == {
        "pin": None,
        "prefer": ["liger.rms_norm", "quack.rms_norm"],
        "origin": "profile lumi-g",
        "strict_prefer": False,
    }
    cli = slot_rules(["RMSNorm"], {}, {"RMSNorm": "liger.rms_norm"}, None)["RMSNorm"]
    assert cli.choice_options() == {"pin": None, "prefer": "liger.rms_norm"}


def test_an_empty_allow_list_allows_nothing():
    rule = slot_rules(["Linear"], {}, {}, site(Linear={"allowed": []}))["Linear"]
    assert rule.refuses("torch.linear") == "not allowed by profile lumi-g"


def test_no_other_probe_module_reads_a_profiles_policy():
    """The profile's per-slot policy (``profile.slots``, ``.allowed``, ``.preferred``) is read in
    planning.py alone: the probe consumes the SlotRule."""
    readers = sorted(
        f.name
        for f in PROBE.glob("*.py")
        if f.name != "planning.py"
        and re.search(r"profile\.slots|\bsp\.(allowed|pin|preferred)\b", f.read_text())
    )
    assert readers == []
