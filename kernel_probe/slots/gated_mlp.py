"""The GatedMLP slot in the probe (``--mlp-implementation``); the verdict: every output by the one
rule, then a state dict not anemoi's, an input modified, or a known mistake (``MISTAKES``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_lock.slots import gated_mlp
from kernel_probe.errors import UsageError
from kernel_probe.probe import lifecycle

from .base import Option, Slot

if TYPE_CHECKING:
    from kernel_probe.candidates import Candidate
    from kernel_probe.isolation.protocol import CheckReply, MeasurementRow
    from kernel_probe.probe.report import Report, ReportBase, Verdict

__all__ = ["GATED_MLP"]

# the check's input cases (gated_mlp_kernels), and what each probes
HINTS = {
    "random": "plain random input: gate pre-activations of unit spread",
    "wide-gate": "gate pre-activations spread to +-9: saturation, and where tanh's GELU leaves "
    "erf's",
    **lifecycle.HINTS,  # as training and inference use it (issue 55); "loaded": at in = out
    "overflow": "gate -6..-2, value ~3e4 (fp16, bf16): gate(g) * v fits, (g * v) * sigma(g) "
    "overflows",
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
    from kernel_probe.probe import judge as rules  # reason: ~70 ms the light commands skip

    v = rules.unmeasured(cand.id, device, row, rules._DTYPE_PROBLEM)
    if v is not None:
        return v
    found = rules.judge_cases(row, HINTS)
    flags = row.get("flags", {})
    first, failed = [], []
    reasons: list[str] = []
    if FLAG_MISTAKE in flags:  # told in float32 (the check): it fails every row, however small here
        hidden = ""
        if not found.failed:
            hidden = f" (measured in float32; in {row['dtype']} it is within rounding)"
        first.append(flags[FLAG_MISTAKE])
        reasons.insert(0, MISTAKES[flags[FLAG_MISTAKE]] + hidden)
    if FLAG_INPUT_MODIFIED in flags:
        failed.append(FLAG_INPUT_MODIFIED)
        reasons.insert(0, f"modifies its input (seen on {flags[FLAG_INPUT_MODIFIED]})")
    if FLAG_STATE_DICT in flags:
        failed.append(FLAG_STATE_DICT)
        reasons.insert(0, flags[FLAG_STATE_DICT])
    return rules.row_verdict(
        cand.id, device, row, found, failed=failed, failed_first=first, reasons=reasons
    )


def judge(raw: CheckReply, cand: Candidate, device: str, base: ReportBase) -> Report:
    """The GatedMLP verdict from the worker's measurements."""
    from kernel_probe.probe import judge as rules  # reason: ~70 ms the light commands skip

    if raw.phase == "import":
        return rules.stopped(rules.failed_import(cand.target, raw.kind, raw.error), base)
    if raw.phase:
        return rules.stopped(rules.Problem("unavailable", raw.error), base)
    return rules.report_of([judge_row(cand, device, row) for row in raw.rows], base)


class GatedMLP(Slot):
    """anemoi's gated MLP layer: two Linears and the gate its mlp_implementation hard-codes."""

    option = Option(
        "--mlp-implementation",
        "the model's gated mlp_implementation, whose gate the GatedMLP slot is checked "
        "against (default swiglu; anemoi's geglu is exact-erf GELU)",
        choices=gated_mlp.GATED,
    )
    kernels = "kernel_probe.slots.gated_mlp_kernels"
    option_key = "mlp_implementation"  # the gate, pinned in the slot's kwargs (the lock's gate)

    def refuse(self, declared: str) -> None:
        """An mlp_implementation that is not gated."""
        try:
            gated_mlp.gate_for(declared)
        except ValueError as exc:
            raise UsageError(f"--mlp-implementation: {exc}") from None

    def judge(self, raw, cand, device, base, canonical, policy) -> Report:
        """Per output against the formula's float64 reference."""
        return judge(raw, cand, device, base)


GATED_MLP = GatedMLP(gated_mlp.GATED_MLP)
