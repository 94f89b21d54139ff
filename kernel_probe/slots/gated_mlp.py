"""The GatedMLP slot in the probe: anemoi's GatedMLPLayer, checked only for a model whose
``mlp_implementation`` is gated (``--mlp-implementation``); its measurements are
``kernel_probe.probe.gated_mlp``'s, its verdict ``gated_mlp_verdict``'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kernel_lock.slots import gated_mlp
from kernel_probe.errors import UsageError

from .base import Option, Slot

if TYPE_CHECKING:
    from kernel_probe.candidates import Candidate
    from kernel_probe.isolation.protocol import CheckReply, TimeReply, TimingProgressMessage
    from kernel_probe.probe.judge import Policy
    from kernel_probe.probe.report import Report, ReportBase

__all__ = ["GATED_MLP"]


class GatedMLP(Slot):
    """anemoi's gated MLP layer: two Linears and the gate its mlp_implementation hard-codes."""

    option = Option(
        "--mlp-implementation",
        "the model's gated mlp_implementation, whose gate the GatedMLP slot is checked "
        "against (default swiglu; anemoi's geglu is exact-erf GELU)",
        choices=gated_mlp.GATED,
    )

    def refuse(self, declared: str) -> None:
        """An mlp_implementation that is not gated."""
        try:
            gated_mlp.gate_for(declared)
        except ValueError as exc:
            raise UsageError(f"--mlp-implementation: {exc}") from None

    def canonical(self, declared: str, kind: str | None) -> dict[str, Any]:
        """The model's gate, pinned in the slot's kwargs."""
        return {"mlp_implementation": declared} if declared else {}

    def inputs(self, declared: str, kind: str) -> dict[str, Any]:
        """The mlp_implementation checked against."""
        return {
            "mlp_implementation": declared or gated_mlp.GATED_MLP.canonical["mlp_implementation"]
        }

    def judge(
        self,
        raw: CheckReply,
        cand: Candidate,
        device: str,
        base: ReportBase,
        canonical: Mapping[str, Any],
        policy: Policy,
    ) -> Report:
        """Per output against the formula's float64 reference."""
        from kernel_probe.probe import gated_mlp_verdict

        return gated_mlp_verdict.judge(raw, cand, device, base)

    def lock_keys(
        self, values: Mapping[str, Any], kwargs: Mapping[str, Any], report: Report
    ) -> dict[str, Any]:
        """The formula of the mlp_implementation it pins."""
        return {"gate": gated_mlp.formula(str(kwargs.get("mlp_implementation", "")))}

    def check(
        self,
        cand: Candidate,
        device: str,
        dtypes: list[tuple[str, str]],
        *,
        canonical: Mapping[str, Any],
        seed: int,
        hidden: int | None,
        baseline: Candidate | None,
        shared: Any,
    ) -> CheckReply:
        """Against the formula at anemoi's hidden size."""
        from kernel_probe.probe import gated_mlp as measuring  # torch: in the worker only

        return measuring.check(cand, device, dtypes, canonical_overrides=canonical, hidden=hidden)

    def try_once(self, cand: Candidate, device: str) -> dict[str, Any]:
        """One tiny call on a device the candidate does not declare."""
        from kernel_probe.probe import gated_mlp as measuring  # torch: in the worker only

        return measuring.try_once(cand, device)

    def time(
        self,
        cand: Candidate,
        device: str,
        shapes: list[str],
        dtype: str,
        regime: str,
        options: Mapping[str, Any],
        canonical: Mapping[str, Any],
        progress: Callable[[TimingProgressMessage], None] | None,
    ) -> TimeReply:
        """fwd+bwd at each shape, fixed repetitions (no progress)."""
        from kernel_probe.probe import gated_mlp as measuring  # torch: in the worker only

        return measuring.time_candidate(cand, device, shapes, dtype, regime, options, canonical)


GATED_MLP = GatedMLP(gated_mlp.GATED_MLP)
