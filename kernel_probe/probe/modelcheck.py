"""A ``--model`` probe's last stage: the model checked with the lock it chose
(``kernel_probe.model.check.check``), recorded in the lock's ``[model.check]``. A diverging check
writes no lock (exit 3, naming the site and the phase)."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path

from kernel_lock.errors import ExitCode, LockError
from kernel_lock.lock import KernelLock
from kernel_lock.model import Checked
from kernel_probe.errors import ProbeError

__all__ = ["FLAG", "ModelDiverges", "checked", "recorded"]

FLAG = "--no-model-check"
MAX_WHY = 1000  # characters of the reason a check did not run


class ModelDiverges(ProbeError):
    """The model with the chosen lock does not compute what the model as written computes."""

    exit_code = ExitCode.MISMATCH


def recorded(result: object) -> Checked:
    """A :class:`kernel_probe.model.check.Check` as the lock's ``[model.check]``."""
    from kernel_probe.model.check import Check  # reason: the check's module loads only with --model

    assert isinstance(result, Check)
    first, timing = result.first or {}, result.timing or {}
    interval = tuple(round(float(v), 4) for v in timing.get("interval", ()))
    rounded = {k: round(float(timing[k]), 6) for k in ("written", "applied") if k in timing}
    return Checked(
        verdict=result.verdict,
        steps=result.steps if result.verdict != "not-run" else 0,
        phases=len(result.phases),
        first=str(first.get("what", ""))[:300],
        phase=str(first.get("phase", "")),
        losses_agree_to=float(f"{result.losses_agree_to:.3g}") if result.phases else None,
        step_ratio=round(float(timing["ratio"]), 4) if "ratio" in timing else None,
        step_interval=interval,
        step_written=rounded.get("written"),
        step_applied=rounded.get("applied"),
        why=result.why,
    )


def _g(x: object) -> str:
    return f"{x:.3g}" if isinstance(x, float) else "-"


def checked(
    lock: KernelLock,
    spec: str,
    trust: tuple[str, ...],
    note: Callable[[str], None],
    warn: Callable[[str], None],
) -> KernelLock:
    """``lock`` (chosen for the model ``spec``) with its ``[model.check]``, sealed again;
    :class:`ModelDiverges` (exit 3) where the check finds the model changed. A check that cannot
    run (the model as written fails in it, its child dies) is recorded ``not-run``, said why."""
    from kernel_probe.model.check import check  # reason: the check's module loads only with --model

    assert lock.model is not None
    note(f"model {spec}: checking the model with the chosen lock against the model as written")
    with tempfile.TemporaryDirectory(prefix="kernel-probe-check-") as folder:
        path = Path(folder) / "kernel-lock.toml"
        lock.dump(path)
        try:
            result = check(spec, str(path), trust=trust)
        except LockError as exc:  # it could not run (the model as written fails, the child died)
            result = None
            outcome = Checked(verdict="not-run", why=f"the check failed: {exc}"[:MAX_WHY])
            warn(f"model {spec}: {outcome.line()}")
    if result is not None:
        outcome = recorded(result)
        if outcome.verdict == "diverging":
            first = result.first or {}
            gap = f"{_g(first.get('difference'))}, tolerance {_g(first.get('tolerance'))}"
            raise ModelDiverges(
                f"--model {spec}: the chosen lock changes what the model computes: {outcome.first} "
                f"diverges (phase {outcome.phase!r}: differs by {gap}); no lock written",
                fix="drop the --pin/--prefer or --candidate that chose it (`kernel-probe "
                f"check-model SPEC --lock L` shows the check), or pass {FLAG} to write the lock "
                "unchecked",
            )
        note(outcome.line())
    model = dataclasses.replace(lock.model, check=outcome)
    return dataclasses.replace(lock, model=model).sealed()
