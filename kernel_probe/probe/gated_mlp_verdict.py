"""Where a GatedMLP verdict is decided: every output by the one rule, then what the formula names.

Per (dtype, regime) and input case, every compared output (``y``, ``dx``, and the gradient of
``gate_proj.weight``, ``gate_proj.bias``, ``value_proj.weight``, ``value_proj.bias``) goes through
``judge.judge_output``: its max error, RMS error and bias against float64, each within FACTOR x
torch's own gated layer's (anemoi's ``GatedMLPLayer`` with torch.nn.Linear) plus the dtype's floor.
Then the flags of ``gated_mlp`` fail the candidate outright, each for its reason: a state dict that
is not anemoi's (keys, strict load, round trip), an input modified, and an output that matches one
of the formula's known mistakes (tanh GELU for anemoi's erf geglu, gate and value swapped, biases
dropped).
"""

from __future__ import annotations

from kernel_probe.candidates import Candidate
from kernel_probe.isolation.protocol import CheckReply, MeasurementRow
from kernel_probe.probe.report import Report, ReportBase, Verdict

# the check's input cases (kernel_probe.probe.gated_mlp), and what each probes
HINTS = {
    "random": "plain random input: gate pre-activations of unit spread",
    "wide-gate": "gate pre-activations spread to +-9: saturation, and where tanh's GELU leaves "
    "erf's",
}
# what a kernel computes instead of the formula, and how the verdict names it
MISTAKES = {
    "gelu_tanh": "computes GELU's tanh approximation where anemoi's geglu gate is exact erf "
    "(torch.nn.GELU())",
    "swapped": "applies the gate to value_proj(x) instead of gate_proj(x) (gate and value swapped)",
    "no-bias": "drops the projections' biases (gate_proj.bias, value_proj.bias)",
}
FLAG_STATE_DICT = "state-dict"
FLAG_INPUT_MODIFIED = "input-modified"
FLAG_MISTAKE = "mistake"


def judge_row(cand: Candidate, device: str, row: MeasurementRow) -> Verdict:
    """One (dtype, regime)'s verdict: the outputs under the one rule, then the flags."""
    from kernel_probe.probe.judge import _DTYPE_PROBLEM, judge_cases, row_verdict, unmeasured

    v = unmeasured(cand.id, device, row, _DTYPE_PROBLEM)
    if v is not None:
        return v
    found = judge_cases(row, HINTS)
    flags = row.get("flags", {})
    first: list[str] = []
    failed: list[str] = []
    reasons: list[str] = []
    # told in float32 (gated_mlp.check): it fails every row, however small here
    if FLAG_MISTAKE in flags:
        hidden = (
            ""
            if found.failed
            else f" (measured in float32; in {row['dtype']} it is within rounding)"
        )
        first.append(flags[FLAG_MISTAKE])
        reasons.insert(0, MISTAKES[flags[FLAG_MISTAKE]] + hidden)
    if FLAG_INPUT_MODIFIED in flags:
        failed.append(FLAG_INPUT_MODIFIED)
        reasons.insert(0, f"modifies its input (seen on {flags[FLAG_INPUT_MODIFIED]})")
    if FLAG_STATE_DICT in flags:
        failed.append(FLAG_STATE_DICT)
        reasons.insert(0, flags[FLAG_STATE_DICT])
    return row_verdict(
        cand.id, device, row, found, failed=failed, failed_first=first, reasons=reasons
    )


def judge(raw: CheckReply, cand: Candidate, device: str, base: ReportBase) -> Report:
    """The GatedMLP verdict from the worker's measurements."""
    from kernel_probe.probe.judge import Problem, failed_import, report_of, stopped

    if raw.phase == "import":
        return stopped(failed_import(cand.target, raw.kind, raw.error), base)
    if raw.phase:
        return stopped(Problem("unavailable", raw.error), base)
    return report_of([judge_row(cand, device, row) for row in raw.rows], base)
