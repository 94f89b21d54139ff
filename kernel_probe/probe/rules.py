"""What the command line and a site profile together say of one slot: the one answer the probe
reads.

A profile's ``[policy.<slot>]`` (``allowed``, ``preferred``, ``pin``) and the command line's
``--pin`` / ``--prefer`` are merged here, once per plan, into a :class:`SlotRule` per slot. The
probe then asks only the rule: which candidates are refused before they are checked
(:meth:`SlotRule.refuses`, which a forced id must pass too: ``planning.check_forced``) and what the
choice is told (:meth:`SlotRule.choice_options`). The command line wins over the profile for a
slot it names; the profile's ``allowed`` holds either way.

    >>> rule = SlotRule(allowed=("torch.layer_norm",), allowed_by="profile lumi-g")
    >>> rule.refuses("liger.layer_norm")
    'not allowed by profile lumi-g'
    >>> rule.refuses("torch.layer_norm") is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SlotRule", "slot_rules"]


@dataclass(frozen=True, kw_only=True)
class SlotRule:
    """One slot's rule. ``pin`` / ``prefer`` and where they come from (``origin``: "" for the
    command line, "profile NAME"); ``strict_prefer``: a preferred candidate that is not accepted is
    an error (the command line's ``--prefer``) rather than skipped (a profile's ordered list);
    ``allowed``: the only candidates that may be checked (None: any), and who says so
    (``allowed_by``)."""

    pin: str | None = None
    prefer: tuple[str, ...] = ()
    origin: str = ""
    strict_prefer: bool = True
    allowed: tuple[str, ...] | None = None
    allowed_by: str = ""

    def refuses(self, cid: str) -> str | None:
        """Why the candidate ``cid`` is skipped without being checked, or None."""
        if self.allowed is not None and cid not in self.allowed:
            return f"not allowed by {self.allowed_by}"
        return None

    def choice_options(self) -> dict[str, Any]:
        """The keyword arguments ``choose.choose`` takes from this rule."""
        if self.origin:
            return {
                "pin": self.pin,
                "prefer": list(self.prefer),
                "origin": self.origin,
                "strict_prefer": False,
            }
        return {"pin": self.pin, "prefer": self.prefer[0] if self.prefer else None}


def slot_rules(
    slots: Sequence[str],
    pins: Mapping[str, str],
    prefers: Mapping[str, str],
    profile: Any = None,
) -> dict[str, SlotRule]:
    """Per slot of ``slots``: the command line's ``--pin``/``--prefer`` where it names the slot,
    else the profile's policy (``kernel_probe.profiles.Profile``: its ``slots`` and
    ``name``), and the profile's ``allowed`` in both cases.

    >>> slot_rules(["LayerNorm"], {"LayerNorm": "liger.layer_norm"}, {})["LayerNorm"].pin
    'liger.layer_norm'
    """
    rules = {}
    for slot in slots:
        policy = profile.slots.get(slot) if profile is not None else None
        allowed = None if policy is None or policy.allowed is None else tuple(policy.allowed)
        allowed_by = f"profile {profile.name}" if policy is not None else ""
        if slot in pins or slot in prefers or policy is None:
            prefer = prefers.get(slot)
            rules[slot] = SlotRule(
                pin=pins.get(slot),
                prefer=(prefer,) if prefer else (),
                allowed=allowed,
                allowed_by=allowed_by,
            )
        else:
            rules[slot] = SlotRule(
                pin=policy.pin,
                prefer=tuple(policy.preferred),
                origin=allowed_by,
                strict_prefer=False,
                allowed=allowed,
                allowed_by=allowed_by,
            )
    return rules
