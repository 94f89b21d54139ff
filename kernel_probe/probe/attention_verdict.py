"""Where an Attention verdict is decided: the attention tolerance rule, the capability rule, the
flags.

The tolerance rule (derivation in docs/checks.md, "Attention"). Per output t in (out, dq, dk, dv),
per input case, against the float64 reference of the same masked attention:

    err(candidate, t) <= FACTOR * err(math, t) + FLOOR(dtype)    FACTOR = 4, FLOOR = 8 * eps(dtype)

where ``math`` is torch's own math path in the same dtype (SDPA's MATH backend; the explicit formula
for softcap and alibi). This is the form PyTorch's and flash-attn's own attention tests use (a fused
kernel may be a small multiple of the unfused path's error, never qualitatively worse). The floor is
four times the norms' (2 eps): attention's outputs are softmax-weighted sums whose reference is
itself rounded once per matmul, and a fused kernel that keeps its accumulator in float32 can be
*more* accurate than the math path in low precision, so the math path's error is not a lower bound
on a correct kernel's. The measured ratio (err / tolerance) of every output is recorded in the
evidence.

Besides the max error, every output that does not vanish is judged on its RMS error and its bias
(mean signed error) per row of its last dimension by the norms' rule (``judge.judge_output`` with
this max tolerance: one rule for every slot's outputs, docs/checks.md).

Besides errors: an input modified, a key outside the band that reaches the output or a gradient, and
an option the model sets that the candidate ignores (rejected, naming the option) or refuses
(unavailable, with its reason). Determinism is recorded; ``--deterministic`` rejects at choice time.
"""

from __future__ import annotations

import re

from kernel_lock.slots import DTYPES
from kernel_probe.candidates import Candidate
from kernel_probe.isolation.protocol import CheckReply, MeasurementRow
from kernel_probe.probe.report import Report, ReportBase, Verdict

FACTOR = 4.0
FLOOR_EPS = 8.0
# the options a model sets, and the canonical value that means "not set"
UNSET = {"window": -1, "softcap": 0.0, "dropout": 0.0, "alibi": False}
_REFUSED = re.compile(
    r"No available kernel|No viable backend|not supported|not implemented|NotImplemented", re.I
)


def tolerance(output: str, base: float, dtype: str) -> float:
    """The attention tolerance for ``output`` given torch's math path's error ``base`` in
    ``dtype``."""
    # one rule for out, dq, dk and dv (the vanishing gradients are scaled in the measurement)
    del output
    return FACTOR * base + FLOOR_EPS * DTYPES.get(dtype, DTYPES["float32"]).eps


def judge_row(cand: Candidate, device: str, row: MeasurementRow) -> Verdict:
    """One dtype's verdict: every case's outputs under the tolerance rule, then the flags."""
    from kernel_probe.probe.attention_geometry import HINTS
    from kernel_probe.probe.judge import judge_cases, row_verdict, unmeasured

    v = unmeasured(cand.id, device, row, _REFUSED, say_unavailable=True)
    if v is not None:
        return v
    # the max error by the attention tolerance; the RMS error and the bias by the norms' rule
    found = judge_cases(row, HINTS, max_tolerance=tolerance, baseline="torch's")
    flags = row.get("flags", {})
    failed: list[str] = []
    reasons: list[str] = []
    if "band-leak" in flags:
        failed.append("band-leak")
        reasons.insert(0, flags["band-leak"])
    if "input-modified" in flags:
        failed.append("input-modified")
        reasons.insert(0, f"modifies its input (seen on {flags['input-modified']})")
    return row_verdict(cand.id, device, row, found, failed=failed, reasons=reasons)


def option_problems(
    capabilities: dict[str, str], canonical: dict[str, object]
) -> tuple[list[str], list[str]]:
    """(rejections, refusals): options the model sets that the candidate ignores or gets wrong, and
    those it refuses (raises on)."""
    rejected, refused = [], []
    for option, unset in UNSET.items():
        if canonical.get(option, unset) == unset:
            continue
        got = capabilities.get(option, "not measured")
        if got == "honoured":
            continue
        line = f"the model sets {option}={canonical[option]!r}, and this candidate {got}"
        if got.startswith("raises"):
            refused.append(
                line.replace(f"candidate {got}", f"candidate refuses it ({got[len('raises: ') :]})")
            )
        else:
            rejected.append(
                line.replace(
                    f"candidate {got}",
                    f"candidate silently {got} it"
                    if got == "ignored"
                    else f"candidate computes it {got}",
                )
            )
    return rejected, refused


def judge(
    raw: CheckReply, cand: Candidate, device: str, base: ReportBase, canonical: dict[str, object]
) -> Report:
    """The Attention verdict from the worker's measurements."""
    from kernel_probe.probe.judge import failed_import, report_of, stopped

    if raw.phase == "import":
        return stopped(failed_import(cand.target, raw.kind, raw.error), base)
    report = report_of([judge_row(cand, device, row) for row in raw.rows], base)
    report.capabilities = dict(raw.capabilities)
    rejected, refused = option_problems(report.capabilities, canonical)
    if report.status != "accepted":
        refused = []  # its rows say why already
    if refused:
        report.status = "unavailable"
    if rejected and report.status in ("accepted", "unavailable"):
        report.status = "rejected"
    report.reasons = rejected + refused + report.reasons
    return report
