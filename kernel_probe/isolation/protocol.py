"""Every message between the probe and its child processes, typed: the worker's JSON lines
(``{"op": ...}`` requests, progress lines, replies), and the one-file messages of import checks and
anemoi config children. A missing or unknown key is a ``ProtocolError`` naming message and key."""

import os
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Literal, TypedDict, TypeVar

# What an interpreted run is, said the same way wherever one appears (replies, verdicts, timing)
INTERPRETED = (
    "interpreted: its Triton kernels ran in Triton's interpreter (TRITON_INTERPRET=1), not "
    "compiled for this device; what it computes is checked, but an interpreted run is never timed "
    "and never written to a lock"
)


def interpreter_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``env`` (default: ours) switches Triton's interpreter on (1, true, on, yes)."""
    value = (os.environ if env is None else env).get("TRITON_INTERPRET", "")
    return value.strip().lower() in ("1", "true", "on", "yes")


class ProtocolError(ValueError):
    """A message that is not what its type declares (a missing or unknown key, not an object)."""


M = TypeVar("M", bound="Message")


@dataclass(frozen=True)
class Message:
    """A message with a fixed set of keys: a frozen dataclass, tuples as JSON lists."""

    def to_json(self) -> dict[str, Any]:
        """The message as a JSON object."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls: type[M], data: Any) -> M:
        """Read a message back; :class:`ProtocolError` names message and key when it is not one (a
        missing or unknown key, not an object; a request's ``op`` is its class's)."""
        name, known = cls.__name__, {f.name: f for f in fields(cls)}
        if not isinstance(data, Mapping):
            raise ProtocolError(f"{name}: expected a JSON object, got {type(data).__name__}")
        if unknown := ", ".join(repr(str(k)) for k in sorted(data) if k not in known and k != "op"):
            raise ProtocolError(
                f"{name}: unknown key(s) {unknown} (known: {', '.join(known) or 'none'})"
            )
        required = [k for k, f in known.items() if f.default is MISSING is f.default_factory]
        if missing := [k for k in required if k not in data]:
            raise ProtocolError(f"{name}: missing key(s) {', '.join(map(repr, missing))}")
        kwargs = {}
        for key, value in ((k, v) for k, v in data.items() if k in known):  # not "op"
            try:
                kwargs[key] = _decode(known[key].type, value)
            except ProtocolError as exc:
                raise ProtocolError(f"{name}.{key}: {exc}") from None
            except (TypeError, ValueError, KeyError) as exc:
                raise ProtocolError(f"{name}.{key}: {type(exc).__name__}: {exc}") from None
        return cls(**kwargs)


def _plain(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_json()
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def _decode(kind: Any, value: Any) -> Any:
    """``value`` as a field of type ``kind``: nested messages read, lists made tuples."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if isinstance(kind, type) and issubclass(kind, Message):
        return kind.from_json(value)
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and value is not None:
        return _decode(args[0], value) if len(args) == 1 else value
    if kind == list[MeasurementRow]:
        return _rows(value)
    if typing.get_origin(kind) is not tuple:
        return value
    if not isinstance(value, list):
        raise ProtocolError(f"expected a list, got {type(value).__name__}")
    out = []
    for i, item in enumerate(value):
        try:
            out.append(_decode(args[0], item))
        except ProtocolError as exc:
            raise ProtocolError(f"[{i}]: {exc}") from None
    return tuple(out)


# ---- the rows a check and a timing measure -------------------------------------------------------
ImportKind = Literal["", "import", "exception"]  # an import that raised: ImportError, or else
# the flags a row may raise (measure writes, judge reads)
FLAG_INPUT_MODIFIED = "input-modified"
FLAG_GRAD_OUTPUT_MODIFIED = "grad-output-modified"
FLAG_OUTPUT_DTYPE = "output-dtype"
FLAG_NOT_ELEMENTWISE = "not-elementwise"  # Activation: the output's shape is not the input's
ALT_PREFIX = "y-as-"


def alt_key(semantics: str) -> str:
    """The error key of the output judged against ``semantics``' reference (``y-as-rms_norm``)."""
    return ALT_PREFIX + semantics


class _Stats(TypedDict):
    """One compared output's statistics besides the max error: normwise, the worst group's."""

    rms: list[float]  # [candidate, torch.nn], as bias and sd
    bias: list[float]  # the mean signed error
    sd: list[float]
    n: int  # elements per group (a row, or the whole tensor)
    ref_rms: float  # the reference's RMS over the tensor


class ErrorStats(_Stats, total=False):
    """``_Stats``, and where a slot says so the float32 roundings summed into each element (its
    reductions' length: ``tolerance.limits`` widens the RMS floor by them)."""

    terms: int


class MeasurementRow(TypedDict, total=False):
    """One (dtype, regime) of a check: ``measure.check`` writes it, ``judge.judge_row`` reads it."""

    dtype: str
    regime: str
    cases: dict[str, dict[str, list[float]]]  # case -> tensor -> [candidate, torch.nn]
    stats: dict[str, dict[str, ErrorStats]]  # case -> tensor -> RMS and bias (not alt_key's)
    flags: dict[str, str]  # FLAG_* -> the case (or the dtypes) it was seen on
    skipped: str
    exception: str
    traceback: str
    out_dtype: str
    nondeterministic: str | None
    blocks: dict[str, dict[str, Any]]
    seconds: float
    twin: dict[str, Any]
    # Activation: the errors against the function it computes where that is not the declared one
    approx_cases: dict[str, dict[str, list[float]]]
    approx_stats: dict[str, dict[str, ErrorStats]]


MEASUREMENT_KEYS = frozenset(MeasurementRow.__annotations__)


def _rows(value: Any) -> list[MeasurementRow]:
    if not isinstance(value, list):
        raise ProtocolError(f"expected a list of rows, got {type(value).__name__}")
    for i, row in enumerate(value):
        if not isinstance(row, Mapping):
            raise ProtocolError(f"rows[{i}]: expected a JSON object")
        if unknown := sorted(set(row) - MEASUREMENT_KEYS):
            raise ProtocolError(f"rows[{i}]: unknown key(s) {', '.join(map(repr, unknown))}")
        if "dtype" not in row or "regime" not in row:
            raise ProtocolError(f"rows[{i}]: missing 'dtype' or 'regime'")
    return value


class ShapeCheck(TypedDict, total=False):
    """The check at one timed shape (``atshape``; judged by ``tolerance.judge_shape``)."""

    rows: int
    sampled: int
    boundaries: list[str]
    errors: dict[str, list[float]]  # tensor -> [candidate, torch.nn] vs float64, sampled rows
    stats: dict[str, ErrorStats]
    first_bad_row: int  # bisected from first_bad_sampled down to last_good_row
    first_bad_statistic: str  # what was over its tolerance there ("y bias")
    first_bad_sampled: int
    last_good_row: int
    seconds: float
    error: str  # the check itself raised


class TimingRow(TypedDict, total=False):
    """One shape of a timing (``timing.time_candidate``); ``error`` instead of the figures."""

    implementation: str
    shape: str
    dtype: str
    regime: str
    compile_s: float
    median_ms: float
    spread: float
    reps: int
    gbps: float
    tflops: float
    copy_gbps: float
    copy_percent: float
    error: str
    check: ShapeCheck  # at that shape (atshape), unless timed without it
    blas: str  # the BLAS library a Linear ran under on a GPU
    peak_bytes: int  # Attention on a GPU: peak memory allocated by one fwd+bwd
    timed: str  # how the number of repetitions was decided (probe.repetitions)
    samples: list[float]  # the timed calls (s)
    # the probe's, after the reply: the load seen meanwhile (max over the rounds), and per paired
    # round the default's block median and this candidate's, ms (repetitions.py)
    load_average: float
    busy_processes: int
    gpu_processes: int  # on a GPU, where NVML can say
    pairs: list[list[float]]


# ---- the worker: replies -------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Reply(Message):
    """What every worker reply carries besides its op's own fields."""

    tampered: tuple[str, ...] = ()  # torch functions replaced while it ran: refused
    interpreted: bool = False  # Triton ran in its interpreter: labelled, never timed or locked


@dataclass(frozen=True, kw_only=True)
class PingReply(Reply):
    """The worker is up (torch imported): its process id."""

    pid: int
    ok: bool = True


@dataclass(frozen=True, kw_only=True)
class FingerprintReply(Reply):
    """This machine's lock fingerprint as the worker's torch sees it."""

    fields: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ImportReply(Reply):
    """``kind``: "import" (an ImportError: the library is absent) or "exception" (it is broken)."""

    ok: bool
    seconds: float = 0.0
    kind: ImportKind = ""
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class TryReply(Reply):
    """One tiny forward on a device the candidate does not declare: ran, or what it raised."""

    ran: bool
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class CheckReply(Reply):
    """``measure.check``'s raw measurements, or where it stopped early (``phase``, ``error``)."""

    candidate: str
    device: str
    rows: list[MeasurementRow] = field(default_factory=list)
    phase: Literal["", "import", "baseline", "build", "blas"] = ""  # where it stopped before a row
    error: str = ""
    kind: ImportKind = ""  # for an import that failed
    traceback: str = ""
    import_s: float | None = None
    layout: dict[str, Any] | None = None  # Layout.to_json()
    init: list[str] = field(default_factory=list)
    blas: str = ""  # a Linear on a GPU: the BLAS library the rows were measured under
    blas_default: str = ""  # the library torch picks by itself in this process
    capabilities: dict[str, str] = field(default_factory=dict)  # Attention: options, measured
    computes: str = ""  # Activation: the function its float32 output matches, measured


@dataclass(frozen=True, kw_only=True)
class TimeReply(Reply):
    """A candidate's timing: one row per shape."""

    candidate: str
    device: str
    rows: list[TimingRow] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class TimingProgressMessage(Message):
    """Sent before a timing's reply: where it is, on one shape."""

    shape: str
    index: int  # of ``of`` shapes
    of: int
    phase: str  # first call, warm-up, rep
    done: int  # of ``total`` in this phase
    total: int
    seconds: float  # spent on this shape so far


# ---- the worker: requests, one per op, each naming its op and its reply's class ----------------
REQUESTS: "dict[str, type[Request]]" = {}  # op -> its request class (each registers itself)


@dataclass(frozen=True, kw_only=True)
class Request(Message):
    """A request to the worker: on the wire, its fields and ``"op"``."""

    op: ClassVar[str]
    reply: ClassVar[type[Reply]]

    def __init_subclass__(cls, op: str = "", reply: type[Reply] = Reply, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if op:  # one op's request (not a base such as CandidateRequest): registered
            cls.op, cls.reply, REQUESTS[op] = op, reply, cls

    def to_json(self) -> dict[str, Any]:
        """The request as a JSON object, its ``op`` first."""
        return {"op": self.op, **super().to_json()}


@dataclass(frozen=True, kw_only=True)
class PingRequest(Request, op="ping", reply=PingReply):
    """Start up: import torch and the measuring code, snapshot torch's functions."""


@dataclass(frozen=True, kw_only=True)
class FingerprintRequest(Request, op="fingerprint", reply=FingerprintReply):
    """The lock fingerprint, read by the worker's torch (the probe's process never imports it)."""


@dataclass(frozen=True, kw_only=True)
class ImportRequest(Request, op="import", reply=ImportReply):
    """Import the class ``target`` (under its own, short, time budget)."""

    target: str


@dataclass(frozen=True, kw_only=True)
class CandidateRequest(Request):
    """What a check, try or timing runs: ``candidate`` (``Candidate.to_json``) as ``slot``."""

    candidate: dict[str, Any]
    slot: str
    device: str


@dataclass(frozen=True, kw_only=True)
class TryRequest(CandidateRequest, op="try", reply=TryReply):
    """Build ``candidate`` on a device it does not declare; run it once."""


@dataclass(frozen=True, kw_only=True)
class CheckRequest(CandidateRequest, op="check", reply=CheckReply):
    """The correctness checks of ``candidate`` for ``slot`` at each (dtype, regime)."""

    dtypes: tuple[tuple[str, str], ...]
    canonical: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    hidden: int | None = None  # None: limits.CHECK_HIDDEN
    baseline: dict[str, Any] | None = None  # None: the slot's torch.nn default


@dataclass(frozen=True, kw_only=True)
class TimeRequest(CandidateRequest, op="time", reply=TimeReply):
    """Time forward+backward at ``shapes``; with ``progress``, progress messages come first."""

    shapes: tuple[str, ...]
    dtype: str
    regime: str
    options: dict[str, Any] = field(default_factory=dict)
    progress: bool = False
    canonical: dict[str, Any] = field(default_factory=dict)  # Attention: the model's options


@dataclass(frozen=True, kw_only=True)
class GraphAttentionRequest(Request, op="graph-attention", reply=CheckReply):
    """The GraphTransformer attention check of one backend, one row per dtype."""

    backend: str  # triton, pyg or module.function
    device: str
    dtypes: tuple[str, ...]
    seed: int = 0


# ---- import checks (``kernel-probe env``) --------------------------------------------------------
@dataclass(frozen=True)
class ImportCheckRequest(Message):
    """One module to import in a child, and a probe to run after it (``importcheck.PROBES``)."""

    module: str
    probe: str = ""


@dataclass(frozen=True, kw_only=True)
class ImportCheckReply(Message):
    """What the import-check child saw: imported (``ok``), or what it raised, and where."""

    ok: bool
    file: str | None = None  # the module's __file__ and __version__, when it imported
    version: str | None = None
    type: str = ""
    message: str = ""
    where: str = ""
    seconds: float = 0.0
    target: dict[str, Any] | None = None  # the "triton-target" probe: backend, arch, warp_size
    target_error: str = ""
    # [file, mtime_ns, size] of every module the import loaded: the cache keys on them
    loaded: tuple[tuple[str | int, ...], ...] = ()


@dataclass(frozen=True, kw_only=True)
class ImportCheckCached(Message):
    """An import check's answer kept on disk (``detect.importcheck``)."""

    format: str
    key: str
    asked: float  # seconds since the epoch
    seconds: float
    reply: dict[str, Any]


# ---- reading an anemoi config --------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ComposeRequest(Message):
    """Compose ``config_name`` from ``config_dir`` with ``overrides``, as anemoi-training would."""

    config_dir: str
    config_name: str
    overrides: tuple[str, ...] = ()
    trusted: tuple[str, ...] = ()  # what a pkg:// search path may name (else refused, unimported)
    memory: int = 0  # bytes Hydra may map beyond what the child has (children._address_space)


@dataclass(frozen=True, kw_only=True)
class ComposeReply(Message):
    """The composed tree (interpolations as written), and each ``layer_kernels`` block resolved."""

    tree: Any
    # per path, by OmegaConf: {"entries": {...}}, {"value": ...} (no mapping) or {"error": ...}
    blocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SchemaRequest(Message):
    """Validate ``tree`` (interpolations as written) with anemoi-training's ``BaseSchema``."""

    tree: Any
    model_file: bool = False  # tree is a model node, validated inside the packaged config
    preset: str = ""  # also validate anemoi-training's packaged model preset of that name
    memory: int = 0  # bytes it may map beyond torch and the rest (children._address_space)


@dataclass(frozen=True, kw_only=True)
class SchemaReply(Message):
    """The schema's errors at config paths, and what it leaves unset; ``version``: anemoi's."""

    errors: list[dict[str, str]] = field(default_factory=list)  # {"where", "type", "message"}
    unset: list[str] = field(default_factory=list)  # mandatory values (???) left to the CLI
    members: dict[str, str] = field(default_factory=dict)  # path -> union member its errors are for
    preset: list[dict[str, str]] = field(default_factory=list)  # the shipped preset's own errors
    version: str = ""


@dataclass(frozen=True, kw_only=True)
class EntryCheckRequest(Message):
    """One ``layer_kernels`` entry to import and judge (``anemoi.entries.check_entry``)."""

    key: str
    entry: Any
    where: str
    allow_semantics_change: bool = False


@dataclass(frozen=True, kw_only=True)
class EntryCheckReply(Message):
    """``findings``: ``Finding.to_json()`` each; ``facts``: what the entry builds."""

    findings: list[dict[str, Any]]
    facts: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ConfigCheckRequest(Message):
    """One reading of a config checked in one child (``anemoi.config_child``): schema, entries."""

    schema: SchemaRequest | None = None
    schema_memory: int = 0  # the schema's budget in this child (children._address_space)
    entries: tuple[EntryCheckRequest, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ConfigCheckReply(Message):
    """``schema``: its reply (None where not asked); ``entries``: one reply per entry, in order."""

    schema: SchemaReply | None = None
    entries: tuple[EntryCheckReply, ...] = ()
