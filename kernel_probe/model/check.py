"""``check(spec, lock)``: does the model with the lock applied compute what the model as written
computes, over training steps, in eval and no-grad, across a state-dict save and load; and what
does the lock do to its training step's time. The work runs in a child (the model's code is
foreign: kernel_probe.model.check_child); here the request, the lock read first, the answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import kernel_lock
from kernel_lock.errors import ExitCode, LockError
from kernel_probe.errors import ProbeError, UsageError
from kernel_probe.isolation.child import child_environment, run_function
from kernel_probe.model.tracing import DEFAULT_TIMEOUT, failure, parse_spec

NOT_TIMED = "not timed: --no-timing (the verdict only)"  # the note check_model adds

__all__ = ["DEFAULT_STEPS", "DEVICES", "MAX_STEPS", "Check", "DeviceAbsent", "check", "device_for"]

DEFAULT_STEPS = 3
MAX_STEPS = 1000
CHILD = "kernel_probe.model.check_child"
# torch's device the check runs on, by the lock's device-type (ROCm's torch calls its GPUs cuda)
DEVICES = {"cpu": "cpu", "cuda": "cuda", "rocm": "cuda"}


class DeviceAbsent(ProbeError):
    """The device the check is to run on is not here (exit 3: the machine does not match)."""

    exit_code = ExitCode.MISMATCH


def device_for(lock: kernel_lock.KernelLock, device: str) -> tuple[str, str]:
    """(torch device, why) the check runs on: ``device`` where given (cpu, cuda), else the
    device the lock was probed on (its ``device-type``; a lock without one: the CPU)."""
    if device:
        if device not in ("cpu", "cuda"):
            raise UsageError(
                f"--device {device}: not cpu or cuda", key="device", fix="pass cpu or cuda"
            )
        return device, "--device"
    field = lock.environment.fields.get("device-type")
    probed = str(field.value) if field is not None else ""
    if probed not in DEVICES:
        why = f"the lock was probed on {probed}" if probed else "the lock names no device"
        return "cpu", f"{why}; pass --device cuda for a GPU"
    return DEVICES[probed], f"the lock was probed on {probed}"


def _ratio(difference: float, tolerance: float) -> float:
    if tolerance:
        return difference / tolerance
    return float("inf") if difference > 0 else 0.0


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
    device: str = "cpu"
    device_why: str = ""

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

    @property
    def worst_ratio(self) -> float | None:
        """The largest difference / tolerance of any phase's worst quantity (above 1: diverging;
        None where no phase was judged or one raised)."""
        worst = [p["worst"] for p in self.phases if p.get("worst")]
        if not worst or len(worst) < len(self.phases):
            return None
        return max(_ratio(w["difference"], w["tolerance"]) for w in worst)

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON's content."""
        keys = ("spec", "lock", "steps", "device", "device_why", "verdict", "why")
        body = {k.replace("_", "-"): getattr(self, k) for k in keys}
        body |= {"sites": list(self.sites), "first": self.first, "phases": list(self.phases)}
        body |= {"losses-agree-to": self.losses_agree_to, "worst-ratio": self.worst_ratio}
        return body | {"timing": self.timing, "notes": list(self.notes)}


def check(
    spec: str,
    lock: str,
    *,
    steps: int = DEFAULT_STEPS,
    trust: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT,
    device: str = "",
    timing: bool = True,
) -> Check:
    """The model ``spec`` names, as written and with the lock applied, through the phases (the
    module's docstring), in a child on ``device`` (:func:`device_for`); the training step timed,
    written against applied, unless ``timing`` is False (the verdict only). Exit 2: a bad spec or
    step count; the lock's own error before any child; 5: the model's code fails; 1: the child
    hangs or dies; 3 (:class:`DeviceAbsent`): the device is not here."""
    parsed = parse_spec(spec)
    if not 1 <= steps <= MAX_STEPS:
        fix = f"pass --steps between 1 and {MAX_STEPS}"
        raise UsageError(f"--steps {steps}: not a number of optimizer steps", key="steps", fix=fix)
    read = kernel_lock.load(lock, trust=trust, emit_warnings=False)  # a bad lock: no child
    on, why = device_for(read, device)
    request = {"spec": parsed.to_json(), "lock": str(lock), "trust": list(trust), "steps": steps}
    request["device"], request["timing"] = on, timing
    result = run_function(CHILD, "check_model", request, timeout=timeout, env=child_environment())
    if not result.ok:
        raise failure(parsed, result, timeout, ("check", "checking"))
    v = result.value
    if v["verdict"] == "device-absent":
        fix = "run it where the device is, or pass --device cpu (the check on this CPU)"
        raise DeviceAbsent(f"check-model on {on} ({why}): {v['why']}", key="device", fix=fix)
    if v["verdict"] == "lock-error":  # the lock read, not usable here (a class not installed)
        e = v["error"]
        error = LockError(e["problem"], path=e["path"], key=e["key"], fix=e["fix"])
        error.exit_code = int(e["exit_code"])
        raise error
    return Check(
        spec=parsed.text, lock=str(lock), steps=steps, verdict=str(v["verdict"]),
        phases=tuple(v["phases"]), sites=tuple(v["sites"]), timing=v.get("timing"),
        notes=tuple(v.get("notes", ())), why=str(v.get("why", "")), device=on, device_why=why,
    )  # fmt: skip
