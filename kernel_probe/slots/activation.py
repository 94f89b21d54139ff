"""The Activation slot in the probe: the model declares its function (``--activation``), every
candidate is checked against it and the lock records it; one known to compute another function is
skipped before anything is imported. Its measurements are ``kernel_probe.probe.activation``'s, its
verdict ``activation_verdict``'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kernel_lock.slots import activation
from kernel_probe.errors import UsageError

from .base import Option, Slot

if TYPE_CHECKING:
    from kernel_probe.candidates import Candidate
    from kernel_probe.isolation.protocol import CheckReply, TimeReply, TimingProgressMessage
    from kernel_probe.probe.judge import Policy, Problem
    from kernel_probe.probe.report import Report, ReportBase

__all__ = ["ACTIVATION"]


class Activation(Slot):
    """An elementwise function of one tensor, no parameters."""

    option = Option(
        "--activation",
        "the model's activation function, the Activation slot's reference: gelu-erf "
        "(torch.nn.GELU, the default), gelu-tanh, silu, relu, sigmoid, or other:module.Class for "
        "another (e.g. other:anemoi.models.layers.activations.Sine; its class is the reference); "
        "the lock records it",
        metavar="FUNCTION",
    )

    def refuse(self, declared: str) -> None:
        """A function the slot does not know."""
        problem = activation.function_problem(declared)
        if problem:
            raise UsageError(
                f"--activation {problem}",
                fix="name the model's activation function, e.g. --activation gelu-erf",
            )

    def canonical(self, declared: str, kind: str | None) -> dict[str, Any]:
        """The model's function: the reference every candidate is checked against."""
        return {"function": declared} if declared else {}

    def inputs(self, declared: str, kind: str) -> dict[str, Any]:
        """The function checked against."""
        return {"activation": declared or activation.ACTIVATION.canonical["function"]}

    def static_problem(self, cand: Candidate, canonical: Mapping[str, Any]) -> Problem | None:
        """A registered class known to compute another function."""
        from kernel_probe.probe import activation_verdict

        return activation_verdict.static_problem(cand, activation.declared_function(canonical))

    def judge(
        self,
        raw: CheckReply,
        cand: Candidate,
        device: str,
        base: ReportBase,
        canonical: Mapping[str, Any],
        policy: Policy,
    ) -> Report:
        """The rows by the one rule, then the function it computes."""
        from kernel_probe.probe import activation_verdict

        function = activation.declared_function(canonical)
        return activation_verdict.judge(raw, cand, device, base, function, policy)

    def lock_keys(
        self, values: Mapping[str, Any], kwargs: Mapping[str, Any], report: Report
    ) -> dict[str, Any]:
        """The model's function the candidates were checked against."""
        return {"function": str(values["function"])}

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
        """Against the declared function's float64 reference."""
        from kernel_probe.probe import activation as measuring  # torch: in the worker only

        return measuring.check(cand, device, dtypes, canonical_overrides=canonical, seed=seed)

    def try_once(self, cand: Candidate, device: str) -> dict[str, Any]:
        """One tiny call on a device the candidate does not declare."""
        from kernel_probe.probe import activation as measuring  # torch: in the worker only

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
        """fwd+bwd at each shape."""
        from kernel_probe.probe import activation as measuring  # torch: in the worker only

        return measuring.time_candidate(cand, device, shapes, dtype, options, progress)


ACTIVATION = Activation(activation.ACTIVATION)
