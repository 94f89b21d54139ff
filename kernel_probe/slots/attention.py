"""The Attention slot in the probe: ``--attention HEADSxHEAD_DIMxSEQ[:OPTIONS]`` (the geometry it
is timed at, the options pinned and checked) and the verdict (docs/checks.md "Attention")."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernel_lock.model import Site
from kernel_lock.slots import DTYPES, attention
from kernel_lock.slots.base import Param
from kernel_probe.errors import UsageError
from kernel_probe.probe import lifecycle
from kernel_probe.probe.limits import TIMING_TIMEOUT

from .base import Option, Slot, dims

if TYPE_CHECKING:
    from kernel_probe.candidates import Candidate
    from kernel_probe.isolation.protocol import CheckReply, MeasurementRow
    from kernel_probe.probe.report import Report, ReportBase, Verdict

__all__ = ["ATTENTION"]

# ---- the geometry, as the command line writes it (batch 1) -------------------------------------
# a default gives sizes only, never an option: only the model sets one (issue 53). O96: anemoi's
# processor, 16 heads of 128 over 40,320 nodes, window 512 (anemoi-core PR #959)
DEFAULT_GEOMETRY = {"cpu": "4x32x256", "gpu": "16x128x8192"}
O96_GEOMETRY = "16x128x40320:window=512"
# on a CPU, a longer sequence is refused up front (``Attention.too_large``); a shorter one is
# estimated first (``too_long``)
CPU_MAX_SEQ = 16_384
FORM = (
    "HEADSxHEAD_DIMxSEQ[:window=W][,softcap=C][,dropout=P][,alibi=true][,causal=true]"
    "[,mask=bool|float][,kv_heads=K]"
)
# after the colon: the options a model fixes (pinned), and what its calls pass (checked with)
OPTIONS = ("window", "softcap", "dropout", "alibi", "causal", "mask", "kv_heads")
_CALLS = {"mask": Param(str, choices=attention.MASKS), "kv_heads": Param(int, 1, 1024)}
CALL_DEFAULTS = {"mask": "none", "kv_heads": 0}  # no attn_mask; as many key/value heads (0)
_GEOMETRY = re.compile(r"^(\d+)x(\d+)x(\d+)(?::(.+))?$")


@dataclass(frozen=True)
class Geometry:
    """One attention geometry: heads, head_dim, sequence length, and the ``OPTIONS`` it names
    (absent: the slot's canonical value; no mask; as many key/value heads as heads)."""

    heads: int
    head_dim: int
    seq: int
    options: tuple[tuple[str, object], ...] = ()

    @property
    def window(self) -> int | None:
        """The sliding window of this geometry (None: full attention)."""
        return dict(self.options).get("window")  # type: ignore[return-value]

    @property
    def kv_heads(self) -> int:
        """The key/value heads (fewer than ``heads``: grouped-query attention)."""
        return int(dict(self.options).get("kv_heads", self.heads))  # type: ignore[call-overload]

    def __str__(self) -> str:
        said = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.options]
        return f"{self.heads}x{self.head_dim}x{self.seq}" + (":" + ",".join(said) if said else "")


def _option(text: str, name: str, value: str) -> tuple[str, object]:
    """One option as the slot declares it (``SlotSpec.params``: type and range)."""
    param = {**attention.ATTENTION.params, **_CALLS}[name]
    flag = {"true": True, "1": True, "false": False, "0": False}
    try:
        x = flag.get(value.lower()) if param.type is bool else param.type(value)
        if x is not None and param.problem(x) is None:
            return name, x
    except ValueError:
        pass
    raise ValueError(f"{text!r}: {name} must be {param.what}, got {value!r}")


def parse_geometry(text: str) -> Geometry:
    """``16x128x40320:window=512`` -> Geometry; ValueError naming the form otherwise."""
    m = _GEOMETRY.match(text.strip())
    if not m:
        raise ValueError(
            f"{text!r} is not {FORM}, e.g. {DEFAULT_GEOMETRY['cpu']} or {O96_GEOMETRY}"
        )
    heads, dim, seq = (int(m.group(i)) for i in (1, 2, 3))
    if not (1 <= heads <= 1024 and 1 <= dim <= 512 and 1 <= seq <= 10_000_000):
        raise ValueError(f"{text!r}: heads 1..1024, head_dim 1..512, seq 1..10,000,000")
    options: dict[str, object] = {}
    for part in (m.group(4) or "").split(",") if m.group(4) else []:
        name, sep, value = part.partition("=")
        name = name.strip()
        if name not in OPTIONS or not sep:
            raise ValueError(
                f"{text!r}: {part!r} is not one of {', '.join(o + '=...' for o in OPTIONS)}"
            )
        if name in options:
            raise ValueError(f"{text!r}: {name} is given twice")
        options.update([_option(text, name, value.strip())])
    kv = options.get("kv_heads", heads)
    if heads % kv:  # type: ignore[operator]
        raise ValueError(f"{text!r}: kv_heads={kv} does not divide the {heads} query heads")
    if kv == heads:
        options.pop("kv_heads", None)  # as many: no grouping
    return Geometry(heads, dim, seq, tuple(options.items()))


# a traced call's semantics -> (the geometry's option, the value that sets nothing)
_TRACED = {
    "window": ("window", -1),
    "dropout": ("dropout", 0.0),
    "is_causal": ("causal", False),
    "mask": ("mask", "none"),
    "kv_heads": ("kv_heads", None),  # None: the heads (no grouped-query attention)
    "scale": ("scale", "none"),  # "none": 1/sqrt(head_dim)
}


def traced_options(semantics: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the options a traced call sets, what it sets that no geometry option says)."""
    options: dict[str, Any] = {}
    why = []
    for key, (option, unset) in _TRACED.items():
        unset = semantics.get("heads") if key == "kv_heads" else unset
        value = semantics.get(key, unset)
        default_scale = (
            key == "scale" and isinstance(value, (int, float)) and semantics.get("head_dim")
        )
        if value == unset or (default_scale and math.isclose(value, semantics["head_dim"] ** -0.5)):
            continue
        if option in OPTIONS:
            options[option] = value
        else:
            why.append(f"{key}={value!r}: the Attention slot's geometry cannot say {option} yet")
    if semantics.get("seq_k", semantics.get("seq_q")) != semantics.get("seq_q"):
        why.append(
            f"seq_k {semantics['seq_k']} != seq_q {semantics['seq_q']}: timed as "
            "self-attention only"
        )
    return {k: options[k] for k in OPTIONS if k in options}, why


def too_long(seq: int, measured_seq: int, seconds: float, calls: int) -> str:
    """Why a CPU does not time ``calls`` calls at ``seq`` keys, one having taken ``seconds`` at
    ``measured_seq`` ("" where they fit the timing limit): the time grows with seq**2.

    >>> too_long(40320, 1024, 0.6, 2)[:60]
    'not timed here: one forward and backward at 40,320 keys woul'
    >>> too_long(2048, 1024, 0.6, 6)
    ''
    """
    estimate = seconds * (seq / measured_seq) ** 2
    if estimate * calls <= TIMING_TIMEOUT:
        return ""
    return (
        f"not timed here: one forward and backward at {seq:,} keys would take ~{estimate:,.0f} s "
        f"on this CPU ({seconds:.2f} s at {measured_seq:,}; every score is computed, so x seq**2): "
        f"{calls} calls outlast the {TIMING_TIMEOUT:.0f} s timing limit. Time it on the machine "
        "that trains the model (a GPU), or declare a sequence this CPU can time"
    )


# the model's options, and what its calls pass: the value that means "the model sets none"
UNSET: dict[str, Any] = {**attention.ATTENTION.canonical, **CALL_DEFAULTS}


def canonical_options(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """``UNSET`` with the model's ``overrides``."""
    return UNSET | {k: v for k, v in (overrides or {}).items() if k in UNSET}


# ---- the verdict -------------------------------------------------------------------------------
SMALL_WINDOW = 1  # the band's edge: three keys per query
HINTS = {
    "random": "plain random input",
    "large-logits": "large logits: overflow of unscaled scores in low precision",
    "sharp-equal-values": "sharp softmax over equal values: dq and dk must vanish (anemoi-core "
    "#1027)",
    "non-contiguous": "non-contiguous (transposed) views",
    "head-dim-64": "head_dim 64",
    "head-dim-128": "head_dim 128",
    "window": "the model's window",
    "small-window": f"the band's edge (window {SMALL_WINDOW})",
    "second-length": "a second sequence length through the same instance (a cached mask)",
    # as training and inference use it (issue 55); no parameters: no update, no state dict
    **{k: v for k, v in lifecycle.HINTS.items() if k != lifecycle.LOADED},
    lifecycle.AFTER_UPDATE: "a second call of the same instance on fresh inputs",
    lifecycle.TRANSPOSED: "q, k, v and grad_output with heads and sequence transposed",
    lifecycle.STRIDED: "q, k, v every other row of a sequence twice as long (a strided sequence)",
}
FACTOR = 4.0
FLOOR_EPS = 8.0
# the outputs a case makes vanish by construction (out = v, dq = dk = 0: anemoi-core #1027)
VANISHING = {"sharp-equal-values": ("dq", "dk")}
_REFUSED = re.compile(
    r"No available kernel|No viable backend|not supported|not implemented|NotImplemented"
    r"|unexpected keyword argument",
    re.I,
)


def capability(option: str, value: Any) -> str:
    """The capability measured for the model's ``option`` = ``value`` (``attention_kernels``)."""
    return {"mask": f"mask-{value}", "kv_heads": "gqa"}.get(option, option)


def tolerance(output: str, base: float, dtype: str, case: str = "") -> float:
    """The attention tolerance for ``output`` of ``case`` given torch's error ``base`` in
    ``dtype``; an output that vanishes by construction (``VANISHING``) has float32's floor
    (docs/checks.md "Attention").

    >>> tolerance("dq", 0.0, "bfloat16", "sharp-equal-values") == 8 * 2**-23
    True
    """
    floor = "float32" if output in VANISHING.get(case, ()) else dtype
    return FACTOR * base + FLOOR_EPS * DTYPES.get(floor, DTYPES["float32"]).eps


def judge_row(cand: Candidate, device: str, row: MeasurementRow) -> Verdict:
    """One dtype's verdict: every case's outputs under the tolerance rule, then the flags."""
    from kernel_probe.probe import judge as rules  # reason: ~70 ms the light commands skip

    v = rules.unmeasured(cand.id, device, row, _REFUSED, say_unavailable=True)
    if v is not None:
        return v
    # the max error by the attention tolerance; the RMS error and the bias by the norms' rule
    found = rules.judge_cases(row, HINTS, max_tolerance=tolerance, baseline="torch's")
    flags = row.get("flags", {})
    failed = [f for f in ("band-leak", "input-modified") if f in flags]
    reasons = [
        f"modifies its input (seen on {flags[f]})" if f == "input-modified" else flags[f]
        for f in reversed(failed)
    ]
    return rules.row_verdict(cand.id, device, row, found, failed=failed, reasons=reasons)


def judge(
    raw: CheckReply, cand: Candidate, device: str, base: ReportBase, canonical: dict[str, object]
) -> Report:
    """The Attention verdict from the worker's measurements."""
    from kernel_probe.probe import judge as rules  # reason: ~70 ms the light commands skip

    if raw.phase == "import":
        return rules.stopped(rules.failed_import(cand.target, raw.kind, raw.error), base)
    report = rules.report_of([judge_row(cand, device, row) for row in raw.rows], base)
    report.capabilities = dict(raw.capabilities)
    # the options the model sets that the candidate ignores or gets wrong, and those it refuses
    rejected, refused = [], []
    for option, unset in UNSET.items():
        got = report.capabilities.get(capability(option, canonical.get(option)), "not measured")
        if canonical.get(option, unset) == unset or got == "honoured":
            continue
        line = f"the model sets {option}={canonical[option]!r}, and this candidate"
        if got.startswith("raises"):
            refused.append(f"{line} refuses it ({got[len('raises: ') :]})")
        else:
            does = "silently ignored it" if got == "ignored" else f"computes it {got}"
            rejected.append(f"{line} {does}")
    runs = any(got == "honoured" for got in report.capabilities.values())
    if report.status != "accepted" and not (runs and report.status in ("unavailable", "crashed")):
        refused = []  # its rows say why already (it runs with no option at all: not the option)
    if refused:  # raising on an option the model sets: it cannot run the model
        report.status = "unavailable"
    if rejected and report.status in ("accepted", "unavailable"):
        report.status = "rejected"
    report.reasons = rejected + refused + report.reasons
    return report


def keys_seen(g: Geometry) -> float:
    """The keys a query sees on average: the band's with a window, about half where causal."""
    w = g.window
    keys = float(g.seq if w is None or w < 0 else min(g.seq, 2 * w + 1))
    return keys / 2 if dict(g.options).get("causal") else keys


class Attention(Slot):
    """torch's scaled_dot_product_attention's slot (no parameters; q, k, v)."""

    option = Option(
        "--attention",
        "the model's attention: the geometry the Attention slot is timed at, and after "
        "the colon the options the model fixes (window=W band half-width, softcap=C, dropout=P, "
        "alibi=true, causal=true), pinned in the lock and checked: a candidate that ignores one "
        "is rejected, one that refuses one is unavailable; and what its calls pass, checked: "
        "mask=bool|float (an attn_mask), kv_heads=K (grouped-query attention) (default "
        f"{DEFAULT_GEOMETRY['gpu']} on GPU, {DEFAULT_GEOMETRY['cpu']} on CPU: sizes only, "
        f"global, no option; anemoi's O96: {O96_GEOMETRY})",
        metavar="HEADSxHEAD_DIMxSEQ[:OPTIONS]",
    )
    summary_key = "attention"
    shape_form = ""  # timed at its --attention geometry
    kernels = "kernel_probe.slots.attention_kernels"
    footnote = (
        "Attention: tolerance = 4 x torch's own error (math path or fused ordering, the larger) "
        "+ 8 eps, per output (out, dq, dk, dv); `--json` has every ratio and the measured "
        "capabilities"
    )

    def refuse(self, declared: str) -> None:
        """A geometry that does not parse."""
        try:
            parse_geometry(declared)
        except ValueError as exc:
            fix = f"write it {FORM}, e.g. 16x128x40320:window=512"
            raise UsageError(f"--attention {exc}", fix=fix) from None

    def resolved(self, declared: str, kind: str) -> str:
        """The declared geometry, else the device's default."""
        return declared or DEFAULT_GEOMETRY[kind]

    def canonical(self, declared: str, kind: str | None) -> dict[str, Any]:
        """The options the geometry names (in a probe: the default geometry's, if none)."""
        value = declared if kind is None else self.resolved(declared, kind)
        return dict(parse_geometry(value).options) if value else {}

    def inputs(self, declared: str, kind: str) -> dict[str, Any]:
        """The geometry."""
        return {"attention": self.resolved(declared, kind)}

    def shapes(self, declared: str, kind: str, shapes: Sequence[str]) -> tuple[str, ...]:
        """Its own geometry, not the probe's shapes."""
        return (self.resolved(declared, kind),)

    provenance = inputs  # the lock's provenance records the geometry it was timed at

    def too_large(self, shape: str, kind: str) -> str:
        """On a CPU, a sequence over ``CPU_MAX_SEQ`` keys (O96's 40,320): minutes a call."""
        g = parse_geometry(shape)
        if kind != "cpu" or g.seq <= CPU_MAX_SEQ:
            return ""
        return (
            "on a CPU every score is computed (a window is a mask, not less work): one forward "
            f"and backward at {g.seq:,} keys costs {(g.seq / 1024) ** 2:,.0f}x one at 1,024 keys "
            f"(minutes per call), and a CPU times at most {CPU_MAX_SEQ:,} keys"
        )

    def work(self, shape: str) -> float:
        """Heads x queries x keys seen (the band's, with a window; half, causal) x head_dim."""
        g = parse_geometry(shape)
        return float(g.heads * g.seq * keys_seen(g) * g.head_dim)

    def traced(self, site: Site) -> tuple[dict[str, Any], str]:
        """The options the site's call sets, as the geometry names them (``traced_options``)."""
        options, why = traced_options(site.semantics)
        return options, "; ".join(why)

    def site_shape(self, site: Site) -> tuple[str, int]:
        """Its geometry (HEADSxHEAD_DIMxSEQ:OPTIONS), timed at batch 1: one call per batch row."""
        s, (options, _) = site.semantics, traced_options(site.semantics)
        heads, head_dim, seq = (int(s[k]) for k in ("heads", "head_dim", "seq_q"))
        query = dims(site.shapes[0]) if site.shapes else ()
        batch = math.prod(query[:-3]) if len(query) > 3 else 1  # (B, H, S, D): B
        return str(Geometry(heads, head_dim, seq, tuple(options.items()))), batch

    def declaration(self, canonical: Mapping[str, Any], shapes: Sequence[str]) -> str:
        """The most-called geometry, as --attention says it."""
        return shapes[0] if shapes else ""

    def judge(self, raw, cand, device, base, canonical, policy) -> Report:
        """Per output against its own tolerance, and each option the model fixes."""
        return judge(raw, cand, device, base, canonical_options(canonical))

    def lock_keys(self, values, kwargs, report) -> dict[str, Any]:
        """``causal``, ``mask`` and ``gqa`` where the model has them (else none: as before)."""
        v = {**CALL_DEFAULTS, **values}
        keys = {"causal": bool(v["causal"]), "mask": v["mask"], "gqa": bool(v["kv_heads"])}
        return {k: x for k, x in keys.items() if x not in (False, "none")}


ATTENTION = Attention(attention.ATTENTION)
