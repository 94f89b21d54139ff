"""The Attention slot in the probe: the model declares its geometry and options
(``--attention HEADSxHEAD_DIMxSEQ[:OPTIONS]``, ``kernel_probe.probe.attention_geometry``); the
options are pinned and checked, the geometry is what it is timed at; its measurements are
``kernel_probe.probe.attention``'s, its verdict ``attention_verdict``'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kernel_lock.slots import attention
from kernel_probe.errors import UsageError
from kernel_probe.probe import attention_geometry as geometry

from .base import Option, Slot

if TYPE_CHECKING:
    from kernel_probe.candidates import Candidate
    from kernel_probe.isolation.protocol import CheckReply, TimeReply, TimingProgressMessage
    from kernel_probe.probe.judge import Policy
    from kernel_probe.probe.report import Report, ReportBase

__all__ = ["ATTENTION"]


class Attention(Slot):
    """torch's scaled_dot_product_attention's slot (no parameters; q, k, v)."""

    option = Option(
        "--attention",
        "the model's attention: the geometry the Attention slot is timed at, and after "
        "the colon the options the model fixes (window=W band half-width, softcap=C, dropout=P, "
        "alibi=true), pinned in the lock and checked: a candidate that ignores one is rejected "
        f"(default {geometry.DEFAULT_GEOMETRY['gpu']} on GPU, {geometry.DEFAULT_GEOMETRY['cpu']} "
        f"on CPU, global; anemoi's O96: {geometry.O96_GEOMETRY})",
        metavar="HEADSxHEAD_DIMxSEQ[:OPTIONS]",
    )
    summary_key = "attention"
    footnote = (
        "Attention: tolerance = 4 x torch's own error (math path or fused ordering, the "
        "larger) + 8 eps, "
        "per output (out, dq, dk, dv); `--json` has every ratio and the measured capabilities"
    )

    def refuse(self, declared: str) -> None:
        """A geometry that does not parse."""
        try:
            geometry.parse_geometry(declared)
        except ValueError as exc:
            raise UsageError(
                f"--attention {exc}",
                fix=f"write it {geometry.FORM}, e.g. 16x128x40320:window=512",
            ) from None

    def resolved(self, declared: str, kind: str) -> str:
        """The declared geometry, else the device's default."""
        return declared or geometry.DEFAULT_GEOMETRY[kind]

    def canonical(self, declared: str, kind: str | None) -> dict[str, Any]:
        """The options the geometry names (in a probe: the default geometry's where none is
        declared)."""
        value = declared if kind is None else self.resolved(declared, kind)
        return dict(geometry.parse_geometry(value).options) if value else {}

    def inputs(self, declared: str, kind: str) -> dict[str, Any]:
        """The geometry."""
        return {"attention": self.resolved(declared, kind)}

    def shapes(self, declared: str, kind: str, shapes: Sequence[str]) -> tuple[str, ...]:
        """Its own geometry, not the probe's shapes."""
        return (self.resolved(declared, kind),)

    def provenance(self, declared: str, kind: str) -> dict[str, Any]:
        """The geometry it was timed at."""
        return {"attention": self.resolved(declared, kind)}

    def work(self, shape: str) -> float:
        """Heads x queries x keys seen (the band's, with a window) x head_dim."""
        g = geometry.parse_geometry(shape)
        keys = g.seq if g.window is None or g.window < 0 else min(g.seq, 2 * g.window + 1)
        return float(g.heads * g.seq * keys * g.head_dim)

    def judge(
        self,
        raw: CheckReply,
        cand: Candidate,
        device: str,
        base: ReportBase,
        canonical: Mapping[str, Any],
        policy: Policy,
    ) -> Report:
        """Per output against its own tolerance, and each option the model fixes."""
        from kernel_probe.probe import attention_verdict

        return attention_verdict.judge(raw, cand, device, base, geometry.canonical(canonical))

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
        """torch's side of each case computed once per slot and row (``shared``)."""
        from kernel_probe.probe import attention as measuring  # torch: in the worker only

        return measuring.check(
            cand, device, dtypes, canonical_overrides=canonical, seed=seed, shared=shared
        )

    def try_once(self, cand: Candidate, device: str) -> dict[str, Any]:
        """One tiny call on a device the candidate does not declare."""
        from kernel_probe.probe import attention as measuring  # torch: in the worker only

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
        """fwd+bwd at each geometry."""
        from kernel_probe.probe import attention as measuring  # torch: in the worker only

        return measuring.time_candidate(
            cand, device, shapes, dtype, options, canonical, progress=progress
        )


ATTENTION = Attention(attention.ATTENTION)
