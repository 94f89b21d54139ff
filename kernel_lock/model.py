"""The lock's ``[model]`` table: the call sites a trace (``kernel-probe model SPEC``) found in one
forward and backward, with what each calls, its semantics, shapes, dtype and calls per forward, and
the sites no slot can swap (``unreached``). Its digest tells a lock made for another model apart;
``kernel_lock.apply`` knows the sites it covers. Plain data: no torch."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .schema import plain_values, record, sha256, table, tables
from .slots.base import NONE_VALUE
from .tables import (
    EMPTY,
    INT64,
    NONE,
    Raw,
    ReadError,
    Table,
    canonical,
    get,
    get_int,
    identifier,
    identifiers,
    non_negative,
    one_of,
    text,
    toml_field,
)

__all__ = [
    "KINDS",
    "VERDICTS",
    "Checked",
    "NONE_VALUE",
    "TABLE",
    "Model",
    "Site",
    "Unreached",
    "function_site",
    "site_differences",
]

TABLE = "model"
KINDS = ("module", "function")  # a module the model holds, or a functional call it makes
# of the model-level check (``kernel-probe check-model``)
VERDICTS = ("agree", "diverging", "not-run")


def function_site(owner: str, function: str, n: int) -> str:
    """The ``where`` of the ``n``-th call (from 1) of ``function`` in ``owner``'s forward: the
    trace writes it, ``kernel_lock.apply`` routes by it (``blocks.0:layer_norm#2``)."""
    return f"{owner}:{function}" + (f"#{n}" if n > 1 else "")


def _count(lo: int) -> Any:
    """An integer of at least ``lo`` (``lo`` when absent)."""
    return lambda ctx, d, k, _: get_int(d, k, lo, INT64, default=lo)


def _semantics(ctx: Any, d: Raw, k: str, _: Raw) -> Raw:
    """A flat table of finite numbers, booleans and names (and lists of them)."""
    values = ctx.object(d, k, record) or {}
    return plain_values(values, k, "re-run `kernel-probe --model SPEC --force`")


@dataclass(frozen=True, kw_only=True, slots=True)
class Site(Table):
    """One call site of a slot: ``where`` is the module's path (``blocks.0.norm1``; the model
    itself ``""``), or for a functional call the path of the module it ran in, a colon and the
    function (``blocks.0.attn:scaled_dot_product_attention``)."""

    slot: str = toml_field("slot", identifier(required=True))
    where: str = toml_field("where", identifier(required=True))
    kind: str = toml_field("kind", one_of(KINDS, default="module"), "module")
    call: str = toml_field("call", identifier(required=True))  # the class or function
    calls: int = toml_field("calls", _count(1), 1)  # per forward
    dtype: str = toml_field("dtype", identifier(), "", omit=EMPTY)
    shapes: tuple[str, ...] = toml_field("shapes", identifiers, (), omit=EMPTY)
    semantics: Raw = toml_field("semantics", _semantics, factory=dict, omit=EMPTY)


@dataclass(frozen=True, kw_only=True, slots=True)
class Unreached(Table):
    """A site the trace found but no slot can swap (``nn.MultiheadAttention``), and why."""

    where: str = toml_field("where", identifier(required=True))
    call: str = toml_field("call", identifier(required=True))
    reason: str = toml_field("reason", identifier(required=True))


def _verdict(ctx: Any, d: Raw, k: str, _: Raw) -> str:
    value = get(d, k, str, default="")
    if value not in VERDICTS:
        raise ReadError(f"{value!r} is not one of {', '.join(VERDICTS)}", k)
    return value


def _interval(ctx: Any, d: Raw, k: str, _: Raw) -> tuple[float, ...]:
    values = get(d, k, list, default=[])
    finite = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if values and (len(values) != 2 or not finite or not all(0 <= v < math.inf for v in values)):
        raise ReadError("must be two non-negative finite numbers, [low, high]", k)
    return tuple(float(v) for v in values)


@dataclass(frozen=True, kw_only=True, slots=True)
class Checked(Table):
    """``[model.check]``: the model-level check the probe ran against the lock it chose (the
    model as written vs with the lock applied): its verdict, the first diverging site and phase,
    how close the losses stayed, and the training step's time with and without the lock."""

    verdict: str = toml_field("verdict", _verdict)
    steps: int = toml_field("steps", _count(0), 0, omit=EMPTY)
    phases: int = toml_field("phases", _count(0), 0, omit=EMPTY)
    first: str = toml_field("first", identifier(), "", omit=EMPTY)
    phase: str = toml_field("phase", identifier(), "", omit=EMPTY)
    losses_agree_to: float | None = toml_field("losses-agree-to", non_negative, None, omit=NONE)
    step_ratio: float | None = toml_field("step-ratio", non_negative, None, omit=NONE)
    step_interval: tuple[float, ...] = toml_field("step-interval", _interval, (), omit=EMPTY)
    step_written: float | None = toml_field("step-written", non_negative, None, omit=NONE)
    step_applied: float | None = toml_field("step-applied", non_negative, None, omit=NONE)
    why: str = toml_field("why", text(), "", omit=EMPTY)

    def line(self) -> str:
        """One line: ``agree over 3 steps (7 phases), losses agree to 3e-07; step 1.02x ...``."""
        if self.verdict == "not-run":
            return f"model check: not run: {self.why}"
        if self.verdict == "diverging":
            said = f"model check: DIVERGING, first {self.first} (phase {self.phase!r})"
        else:
            said = f"model check: agree over {self.steps} steps ({self.phases} phases)"
        if self.losses_agree_to is not None:
            said += f", losses agree to {self.losses_agree_to:.1g}"
        if self.step_ratio is not None and len(self.step_interval) == 2:
            low, high = self.step_interval
            said += (
                f"; step {self.step_ratio:.2f}x ({self.step_written:.3g} -> "
                f"{self.step_applied:.3g} s, 95% interval {low:.2f}-{high:.2f}x)"
            )
        return said


@dataclass(frozen=True, kw_only=True, slots=True)
class Model(Table):
    """``[model]``: the spec the probe traced, how, its call sites and their digest."""

    spec: str = toml_field("spec", identifier(required=True))
    traced: str = toml_field("traced", identifier(), "", omit=EMPTY)
    digest: str = toml_field("digest", sha256(required=True))
    sites: tuple[Site, ...] = toml_field("sites", tables(Site), (), omit=EMPTY)
    unreached: tuple[Unreached, ...] = toml_field("unreached", tables(Unreached), (), omit=EMPTY)
    check: Checked | None = toml_field("check", table(Checked), None, omit=NONE)

    @staticmethod
    def digest_of(sites: tuple[Site, ...], unreached: tuple[Unreached, ...] = ()) -> str:
        """sha256 of the call sites (not the spec: the same model named another way is the same
        model, and not how it was traced)."""
        blob = canonical({"sites": sites, "unreached": unreached})
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()

    @classmethod
    def of(
        cls,
        spec: str,
        sites: tuple[Site, ...],
        unreached: tuple[Unreached, ...] = (),
        traced: str = "",
    ) -> Model:
        """The table for a trace, its digest computed."""
        digest = cls.digest_of(sites, unreached)
        return cls(spec=spec, traced=traced, digest=digest, sites=sites, unreached=unreached)

    @property
    def intact(self) -> bool:
        """Whether the digest is the sites' own (a hand edit of a site breaks it)."""
        return self.digest == self.digest_of(self.sites, self.unreached)

    def by_slot(self) -> dict[str, tuple[Site, ...]]:
        """The sites of each slot, in the trace's order."""
        out: dict[str, list[Site]] = {}
        for s in self.sites:
            out.setdefault(s.slot, []).append(s)
        return {slot: tuple(sites) for slot, sites in out.items()}


def site_differences(locked: Model, traced: Model, limit: int = 5) -> list[str]:
    """What differs between the sites a lock was made for and a model's trace, in words: a site
    only one has, or a site whose call, semantics, shapes, dtype or call count differ."""
    if locked.digest == traced.digest:
        return []
    mine: Mapping[str, Site] = {s.where: s for s in locked.sites}
    theirs: Mapping[str, Site] = {s.where: s for s in traced.sites}
    out = [f"{w or '<model>'}: not in the model" for w in mine if w not in theirs]
    out += [f"{w or '<model>'}: not in the lock" for w in theirs if w not in mine]
    for w in (w for w in mine if w in theirs):
        a, b = mine[w].to_dict(), theirs[w].to_dict()
        for k in (k for k in {**a, **b} if a.get(k) != b.get(k)):
            out.append(f"{w or '<model>'}: {k} {a.get(k)!r} in the lock, {b.get(k)!r} in the model")
    if not out:
        out.append("the sites the model cannot swap differ")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])
