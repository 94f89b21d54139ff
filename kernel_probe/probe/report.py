"""The records of a verdict: per (dtype, regime) a ``Verdict``, per candidate a ``Report``. The
verdict module (``judge``) writes them; the checker, the chooser, the lock writer and the command
line read them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from kernel_lock.slots import Status
from kernel_probe.candidates import Candidate


@dataclass(frozen=True)
class Verdict:
    """One (candidate, device, dtype, regime): status, reasons, and the numbers behind them. Built
    once, by a rule of ``judge`` (``judge.row_verdict``), from a row that was measured: there is no
    default status, so nothing is accepted that no rule judged."""

    candidate: str
    device: str
    dtype: str
    regime: str
    status: Status
    reasons: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    worst_ratio: float | None = None
    # per statistic (max, rms, bias): the worst ratio
    statistics: Mapping[str, float] = field(default_factory=dict)
    out_dtype: str = ""
    twin: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    errors: Mapping[str, Mapping[str, Sequence[float]]] = field(default_factory=dict)
    deterministic: bool | None = None  # two runs bitwise equal (None: not measured)
    changes: tuple[str, ...] = ()  # accepted, but the model changes besides numbers (recorded)
    # Attention: case -> output -> err / tolerance
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
    # accepted changes besides numbers, recorded in the lock
    changes: list[str] = field(default_factory=list)
    interpreted: bool = (
        False  # its Triton kernels ran in Triton's interpreter: never timed, never locked
    )
    blas: str = (
        ""  # a Linear on a GPU: the BLAS library it was checked under (kernel_lock.slots.linear)
    )
    blas_default: str = ""  # the library torch picked by itself in the probe's worker
    # Attention: what each option (window, softcap, dropout, alibi, scale) really does, measured
    capabilities: dict[str, str] = field(default_factory=dict)

    @property
    def deterministic(self) -> bool | None:
        """True when every measured row was bitwise repeatable; None when nothing was measured."""
        return deterministic(self.verdicts)

    @property
    def twin(self) -> dict[str, Any]:
        """The twin check of the first accepted row (they agree across rows in practice)."""
        for v in self.verdicts:
            if v.status == "accepted" and v.twin:
                return dict(v.twin)
        return {}

    def worst_ratio(self) -> float | None:
        """The largest error / tolerance over every measured row (None when nothing was
        measured)."""
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
