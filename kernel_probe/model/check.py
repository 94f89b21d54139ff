"""``check(spec, lock)``: does the model with the lock applied compute what the model as written
computes, over training steps, in eval and no-grad, across a state-dict save and load; and what
does the lock do to its training step's time. The work runs in a child (the model's code is
foreign: kernel_probe.model.check_child); here the request, the lock read first, the answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import kernel_lock
from kernel_lock.errors import LockError
from kernel_probe.errors import UsageError
from kernel_probe.isolation.child import child_environment, run_function
from kernel_probe.model.spec import parse_spec
from kernel_probe.model.tracing import DEFAULT_TIMEOUT, failure

__all__ = ["DEFAULT_STEPS", "MAX_STEPS", "Check", "check"]

DEFAULT_STEPS = 3
MAX_STEPS = 1000
CHILD = "kernel_probe.model.check_child"


@dataclass(frozen=True)
class Check:
    """The child's answer: ``verdict`` agree, diverging or not-run (``why``); ``phases`` in the
    order run (each: phase, loss, worst, diverging), up to the first diverging one; ``sites`` the
    applied sites; ``timing`` (rounds, written and applied medians in s, ratio, interval)."""

    spec: str
    lock: str
    steps: int
    verdict: str
    phases: tuple[dict[str, Any], ...]
    sites: tuple[str, ...]
    timing: dict[str, Any] | None
    notes: tuple[str, ...] = ()
    why: str = ""

    @property
    def first(self) -> dict[str, Any] | None:
        """The first diverging quantity (a site first, in call order), with its phase."""
        for phase in self.phases:
            if phase["diverging"]:
                return {"phase": phase["phase"], **phase["diverging"][0]}
        return None

    @property
    def losses_agree_to(self) -> float:
        """The largest loss difference over the training phases."""
        return max(
            (abs(p["loss"][0] - p["loss"][1]) for p in self.phases if "loss" in p), default=0
        )

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON's content."""
        body = {k: getattr(self, k) for k in ("spec", "lock", "steps", "verdict", "why")}
        body |= {"sites": list(self.sites), "first": self.first, "phases": list(self.phases)}
        return (
            body
            | {"losses-agree-to": self.losses_agree_to, "timing": self.timing}
            | {"notes": list(self.notes)}
        )


def check(
    spec: str,
    lock: str,
    *,
    steps: int = DEFAULT_STEPS,
    trust: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT,
) -> Check:
    """The model ``spec`` names, as written and with the lock at ``lock`` applied, through a
    forward and backward, ``steps`` SGD steps, eval, no-grad and a state-dict round trip, in a
    child. :class:`UsageError` (exit 2) for a bad spec or step count; the lock's own error (exit
    5 malformed, 3 unusable here) before any child; :class:`InputFileError` (exit 5) where the
    model's code fails; :class:`ProbeError` (exit 1) where the child hangs or dies."""
    parsed = parse_spec(spec)
    if not 1 <= steps <= MAX_STEPS:
        fix = f"pass --steps between 1 and {MAX_STEPS}"
        raise UsageError(f"--steps {steps}: not a number of optimizer steps", key="steps", fix=fix)
    kernel_lock.load(lock, trust=trust, emit_warnings=False)  # a bad lock: its error, no child
    request = {"spec": parsed.to_json(), "lock": str(lock), "trust": list(trust), "steps": steps}
    result = run_function(CHILD, "check_model", request, timeout=timeout, env=child_environment())
    if not result.ok:
        raise failure(parsed, result, timeout, ("check", "checking"))
    v = result.value
    if v["verdict"] == "lock-error":  # the lock read, not usable here (a class not installed)
        e = v["error"]
        error = LockError(e["problem"], path=e["path"], key=e["key"], fix=e["fix"])
        error.exit_code = int(e["exit_code"])
        raise error
    return Check(
        spec=parsed.text, lock=str(lock), steps=steps, verdict=str(v["verdict"]),
        phases=tuple(v["phases"]), sites=tuple(v["sites"]), timing=v.get("timing"),
        notes=tuple(v.get("notes", ())), why=str(v.get("why", "")),
    )  # fmt: skip
