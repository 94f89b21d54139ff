"""Where a GraphAttention verdict is decided: the GraphTransformer attention backend's measured rows
(``graph_attention``) against the project's one rule for compared outputs.

Per output t in (out, dq, dk, dv, de), per case, against the float64 reference of the same graph
attention: the max error within the attention tolerance (``attention_verdict.tolerance``: FACTOR x
the baseline's own error + 8 eps, the baseline being the same formula run by torch in the checked
dtype), and the RMS error and the bias by the norms' rule (``judge.judge_output``). The sharp case's
dq and dk (which vanish) are judged by their max error against max|dv|: a kernel whose dq is 1.47
there (the pre-#1172 bf16 Triton kernel) is rejected naming the case. Determinism is recorded
(``judge.determinism``); PyG's scatter path is not bitwise repeatable on a GPU (atomics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernel_lock.slots import Status
from kernel_probe.isolation.protocol import MeasurementRow
from kernel_probe.probe.report import Verdict, deterministic

BASELINE = "torch's formula's"
# the check's cases (kernel_probe.probe.graph_attention), named in the reasons
HINTS = {
    "random": "plain random input",
    "large-logits": "large logits: overflow of unscaled scores in low precision",
    "sharp-equal-messages": "sharp softmax over equal messages: dq and dk must vanish "
    "(anemoi-core #1027)",
}


@dataclass
class GraphAttentionReport:
    """The verdict on one backend: its status (the worst of its dtypes'), reasons and per-dtype
    verdicts."""

    backend: str
    device: str
    status: Status
    reasons: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    interpreted: bool = (
        False  # the Triton kernel ran in Triton's interpreter (never locked on that alone)
    )

    @property
    def deterministic(self) -> bool | None:
        """Bitwise repeatable in every checked dtype (None: not measured)."""
        return deterministic(self.verdicts)

    def to_json(self) -> dict[str, Any]:
        """The report as ``--json`` and the lock's evidence show it."""
        return {
            "backend": self.backend,
            "device": self.device,
            "status": self.status,
            "reasons": list(self.reasons),
            "deterministic": self.deterministic,
            "interpreted": self.interpreted,
            "evidence": [v.to_json() for v in self.verdicts],
        }


def judge_row(backend: str, device: str, row: MeasurementRow) -> Verdict:
    """One dtype's verdict: every case's outputs under the rule of the module docstring."""
    from kernel_probe.probe.judge import judge_cases, row_verdict, unmeasured
    from kernel_probe.slots.attention import tolerance

    v = unmeasured(backend, device, row, None)  # an exception is a crash: no refusal to tell apart
    if v is not None:
        return v
    found = judge_cases(row, HINTS, max_tolerance=tolerance, baseline=BASELINE)
    return row_verdict(backend, device, row, found, twin=False)


def judge(
    backend: str, device: str, rows: list[MeasurementRow], *, interpreted: bool = False
) -> GraphAttentionReport:
    """The verdict on ``backend`` from its rows (one per dtype)."""
    from kernel_probe.probe.judge import row_reasons, worst_status

    verdicts = [judge_row(backend, device, row) for row in rows]
    return GraphAttentionReport(
        backend,
        device,
        worst_status([v.status for v in verdicts]),
        reasons=row_reasons(verdicts, regime=False),
        verdicts=verdicts,
        interpreted=interpreted,
    )
