"""A verdict's records (per row a ``Verdict``, per candidate a ``Report``), and what rules a
candidate out before any import (``static_problem``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, TypedDict

from kernel_lock.slots import SPECS, Status
from kernel_probe.candidates import Candidate


@dataclass(frozen=True)
class Verdict:
    """One (candidate, device, dtype, regime): status, reasons, the numbers behind them."""

    candidate: str
    device: str
    dtype: str
    regime: str
    status: Status
    reasons: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    worst_ratio: float | None = None
    statistics: Mapping[str, float] = field(default_factory=dict)  # per statistic: worst ratio
    out_dtype: str = ""
    twin: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    errors: Mapping[str, Mapping[str, Sequence[float]]] = field(default_factory=dict)
    deterministic: bool | None = None  # two runs bitwise equal (None: not measured)
    changes: tuple[str, ...] = ()  # accepted, but the model changes besides numbers (recorded)
    # case -> output -> error / tolerance, where a slot has its own max tolerance
    ratios: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The verdict as the lock's evidence and ``--json`` show it."""
        out = asdict(self)
        for name in ("reasons", "failed", "notes", "changes"):
            out[name] = list(out[name])
        return out


def deterministic(verdicts: Sequence[Verdict]) -> bool | None:
    """Whether every row that measured it was bitwise repeatable (None: no row measured it)."""
    measured = [v.deterministic for v in verdicts if v.deterministic is not None]
    return all(measured) if measured else None


class ReportBase(TypedDict):
    """What every ``Report`` on one candidate for one slot shares, whatever the verdict."""

    id: str
    target: str
    slot: str
    semantics: str
    device: str
    source: str
    candidate: Candidate


def report_base(cand: Candidate, slot: str, device: str) -> ReportBase:
    """The facts every report on ``cand`` for ``slot`` on ``device`` starts from."""
    return ReportBase(
        id=cand.id,
        target=cand.target,
        slot=slot,
        semantics=cand.semantics,
        device=device,
        source=cand.source,
        candidate=cand,
    )


@dataclass
class Report:
    """Everything the probe knows about one candidate for one slot on one device."""

    id: str
    target: str
    slot: str
    semantics: str
    device: str
    status: Status
    reasons: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    source: str = "builtin"
    candidate: Candidate | None = None
    seconds: float | None = None  # wall time of this candidate's import and checks
    migration: tuple[str, ...] = ()  # its state dict onto torch.nn's (the layout's rules)
    changes: list[str] = field(default_factory=list)  # accepted changes, recorded in the lock
    interpreted: bool = False  # its Triton kernels ran interpreted: never timed, never locked
    blas: str = ""  # a Linear on a GPU: the BLAS library it was checked under
    blas_default: str = ""  # the library torch picked by itself in the probe's worker
    capabilities: dict[str, str] = field(default_factory=dict)  # what each option really does

    @property
    def deterministic(self) -> bool | None:
        """True when every measured row was bitwise repeatable; None when nothing was measured."""
        return deterministic(self.verdicts)

    @property
    def twin(self) -> dict[str, Any]:
        """The twin check of the first accepted row (they agree across rows in practice)."""
        return next((dict(v.twin) for v in self.verdicts if v.status == "accepted" and v.twin), {})

    def worst_ratio(self) -> float | None:
        """The largest error / tolerance over every measured row (None: nothing measured)."""
        ratios = [v.worst_ratio for v in self.verdicts if v.worst_ratio is not None]
        return max(ratios) if ratios else None

    def to_json(self) -> dict[str, Any]:
        """The report as ``--json`` and the lock's evidence show it."""
        return {
            "id": self.id,
            "target": self.target,
            "device": self.device,
            "status": self.status,
            "reasons": self.reasons,
            "source": self.source,
            "worst_error_ratio": self.worst_ratio(),
            "deterministic": self.deterministic,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "migration": list(self.migration),
            "changes": list(self.changes),
            "interpreted": self.interpreted,
            "blas": self.blas,
            "twin": self.twin,
            **({"capabilities": dict(self.capabilities)} if self.capabilities else {}),
            "evidence": [v.to_json() for v in self.verdicts],
        }


@dataclass(frozen=True)
class Problem:
    """Why a candidate gets ``status`` unchecked; ``try_it``: installed for other devices."""

    status: Status
    reason: str
    try_it: bool = False


def installed(cand: Candidate, device: str = "") -> str | None:
    """None if the candidate's library is present (unimported); else why not, and how to install."""
    top = cand.module.split(".")[0]
    if cand.distribution:
        try:
            metadata.version(cand.distribution)
            return None
        except metadata.PackageNotFoundError:
            if cand.module and importlib.util.find_spec(top) is not None:
                return None
        what = cand.distribution
    elif cand.module and importlib.util.find_spec(top) is None:
        what = f"no module {top!r}"
    else:
        return None
    if cand.source == "command-line":  # the user's own class: no registry says how to install it
        return (
            f"not importable: {what} on this Python's path (offered as "
            f"{cand.slots[0]}={cand.target}; "
            "install its package or put its directory on PYTHONPATH, and check the dotted path)"
        )
    hint = cand.install_hint(device)
    hint = f" ({hint})" if hint else f" (no build for {device})" if device else ""
    return f"not installed: {what}{hint}"


def static_problem(
    cand: Candidate,
    slot: str,
    device: str,
    arch: str = "",
    *,
    with_compile: bool = False,
    detail: bool = False,
) -> Problem | None:
    """Why ``cand`` certainly cannot be checked for ``slot`` here, known unimported (None: none)."""
    expected = SPECS[slot].semantics
    if cand.semantics != expected:
        return Problem("rejected", f"semantics: {cand.semantics} != {expected}")

    def absent() -> str:
        return " (and it is not installed)" if detail and installed(cand) is not None else ""

    # what the hardware rules out comes first: no advice to install what cannot run here
    if cand.devices and device not in cand.devices:
        why = f"runs on {', '.join(cand.devices)}; this device is {device}"
        if detail and cand.blas:  # a BLAS library belongs to its platform: nothing to try
            blas = f"{cand.blas} is a {cand.devices[0]} BLAS library"
            return Problem("unavailable", f"{why} ({blas})")
        note = absent()
        return Problem("unavailable", why + note, try_it=detail and not note)
    if wrong_arch := cand.arch_problem(device, arch):
        return Problem("unavailable", wrong_arch + absent())
    if missing := installed(cand, device):
        return Problem("unavailable", missing)
    if cand.compiled and device == "cpu" and not with_compile:
        return Problem(
            "skipped",
            "torch.compile candidates are not probed on CPU by default (each shape and dtype costs "
            "seconds of C++ compilation); pass --with-compile to include them",
        )
    return None
