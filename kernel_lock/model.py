"""The lock's ``[model]`` table: the model a lock was probed for, as its trace found it.

A trace (``kernel-probe model SPEC``) records every call site of every slot in one forward and
backward of the model: where it is (a module's path, or the module a functional call ran in), what
the model calls there, the semantics it calls it with, the shapes and dtype of its inputs and how
often one forward calls it; and the sites it found but cannot swap (``unreached``), each with the
reason. The probe checks each slot with these semantics and times it at these shapes; the lock
records the table and its digest, so a lock made for another model (or other sizes) is told apart,
and ``kernel_lock.apply`` knows the sites it covers. Plain data here: no torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .schema import DIGEST, record
from .slots.base import NONE_VALUE
from .tables import (
    EMPTY,
    INT64,
    Raw,
    ReadError,
    Table,
    from_dict,
    get,
    get_int,
    identifier,
    identifiers,
    refuse_controls,
    value_problem,
)
from .tables import toml_key as key

__all__ = [
    "KINDS",
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


def function_site(owner: str, function: str, n: int) -> str:
    """The ``where`` of the ``n``-th call (from 1) of ``function`` in ``owner``'s forward: the
    trace writes it, ``kernel_lock.apply`` routes by it (``blocks.0:layer_norm#2``)."""
    return f"{owner}:{function}" + (f"#{n}" if n > 1 else "")


def _kind(ctx: Any, d: Raw, k: str, _: Raw) -> str:
    value = get(d, k, str, default="module")
    if value not in KINDS:
        raise ReadError(f"{value!r} is not one of {', '.join(KINDS)}", k)
    return value


def _calls(ctx: Any, d: Raw, k: str, _: Raw) -> int:
    return get_int(d, k, 1, INT64, default=1) or 1


def _semantics(ctx: Any, d: Raw, k: str, _: Raw) -> Raw:
    """A flat table of finite numbers, booleans and names (and lists of them)."""
    values = ctx.object(d, k, record) or {}
    for name, value in values.items():
        for v in value if isinstance(value, list) else [value]:
            where = f"{k}.{name}"
            problem = value_problem(v, finite=True)
            if problem:
                raise ReadError(problem, where, fix="re-run `kernel-probe --model SPEC --force`")
            if isinstance(v, str):
                refuse_controls(v, where)
    return values


def _digest(ctx: Any, d: Raw, k: str, _: Raw) -> str:
    value = get(d, k, str, default="")
    if not DIGEST.fullmatch(value):
        raise ReadError(f"{value!r} is not 'sha256:<64 hex digits>'", k)
    return str(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class Site(Table):
    """One call site of a slot: ``where`` is the module's path (``blocks.0.norm1``; the model
    itself ``""``), or for a functional call the path of the module it ran in, a colon and the
    function (``blocks.0.attn:scaled_dot_product_attention``)."""

    slot: str = field(metadata=key("slot", identifier(required=True)))
    where: str = field(metadata=key("where", identifier(required=True)))
    kind: str = field(default="module", metadata=key("kind", _kind))
    call: str = field(metadata=key("call", identifier(required=True)))  # the class or function
    calls: int = field(default=1, metadata=key("calls", _calls))  # per forward
    dtype: str = field(default="", metadata=key("dtype", identifier(), omit=EMPTY))
    shapes: tuple[str, ...] = field(default=(), metadata=key("shapes", identifiers, omit=EMPTY))
    semantics: Raw = field(default_factory=dict, metadata=key("semantics", _semantics, omit=EMPTY))


@dataclass(frozen=True, kw_only=True, slots=True)
class Unreached(Table):
    """A site the trace found but no slot can swap (``nn.MultiheadAttention``), and why."""

    where: str = field(metadata=key("where", identifier(required=True)))
    call: str = field(metadata=key("call", identifier(required=True)))
    reason: str = field(metadata=key("reason", identifier(required=True)))


def _sites(cls: type) -> Any:
    return lambda ctx, d, k, _: ctx.objects(d, k, lambda t: from_dict(cls, ctx, t))


@dataclass(frozen=True, kw_only=True, slots=True)
class Model(Table):
    """``[model]``: the spec the probe traced, how, its call sites and their digest."""

    spec: str = field(metadata=key("spec", identifier(required=True)))
    traced: str = field(default="", metadata=key("traced", identifier(), omit=EMPTY))
    digest: str = field(metadata=key("digest", _digest))
    sites: tuple[Site, ...] = field(default=(), metadata=key("sites", _sites(Site), omit=EMPTY))
    unreached: tuple[Unreached, ...] = field(
        default=(), metadata=key("unreached", _sites(Unreached), omit=EMPTY)
    )

    @staticmethod
    def digest_of(sites: tuple[Site, ...], unreached: tuple[Unreached, ...] = ()) -> str:
        """sha256 of the call sites (not the spec: the same model named another way is the same
        model, and not how it was traced)."""
        blob = json.dumps(
            {"sites": [s.to_dict() for s in sites], "unreached": [u.to_dict() for u in unreached]},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=True,
        )
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
