"""Every message between the probe and its child processes, typed, in one place.

    reply = worker.call(CheckRequest(candidate=cand, slot="LayerNorm", device="cpu", dtypes=plan))
    reply.rows[0]["cases"]                     # a CheckReply, not a dict someone may have misspelt

Three conversations cross a process boundary, all as JSON (one line, or one file):

- the probe's worker (``worker.Worker``): a request (``PingRequest``, ``FingerprintRequest``,
  ``ImportRequest``, ``CheckRequest``, ``TryRequest``, ``TimeRequest``; ``op`` on the wire names
  it), answered by its reply class (``request.REPLY``), after any number of
  ``TimingProgressMessage``s;
- the import checks of ``kernel-probe env`` (``detect.importcheck``): an ``ImportCheckRequest``,
  answered by an ``ImportCheckReply``;
- reading an anemoi config (``anemoi_config``): a ``ComposeRequest`` answered by a ``ComposeReply``
  (Hydra's composition, ``anemoi_compose``), and ``EntryCheckRequest`` answered by
  ``EntryCheckReply`` (``kernel_probe.anemoi.entry_checks.check_entries``).

``to_json()`` gives the JSON-ready dict; ``from_json()`` reads one back and raises ``ProtocolError``
naming the message and the key when a key is missing or unknown, so a key renamed on one side fails
on the first message, with its name, not as a ``KeyError`` three modules away. The measurement rows
inside a ``CheckReply`` (written by ``measure``, judged by ``judge``) are a ``TypedDict`` with their
flag names and the alternative-semantics key declared here once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypedDict, TypeVar

from kernel_lock.format.reading import ReadError, context, unknown_keys

if TYPE_CHECKING:
    from kernel_probe.candidates import Candidate


# What an interpreted run is, said the same way wherever one appears (replies, verdicts, reports,
# timing, choice); declared here, beside the reply that carries the flag, so the probe's plan can
# ask without importing the worker
INTERPRETED = (
    "interpreted: its Triton kernels ran in Triton's interpreter (TRITON_INTERPRET=1), not "
    "compiled for this device; what it computes is checked, but an interpreted run is never timed "
    "and never written to a lock"
)


def interpreter_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``env`` (default: this process's environment) switches Triton's interpreter on
    (triton reads 1, true, on, yes; any case)."""
    value = (os.environ if env is None else env).get("TRITON_INTERPRET", "")
    return value.strip().lower() in ("1", "true", "on", "yes")


class ProtocolError(ValueError):
    """A message that is not what its type declares (a missing or unknown key, not an object)."""


M = TypeVar("M", bound="Message")


def _candidate_field() -> Any:
    """A ``Candidate`` field: its own JSON on the wire (``Candidate.to_json`` / ``from_json``)."""

    def decode(value: Any) -> Candidate:
        from kernel_probe.candidates import Candidate

        return Candidate.from_json(value)

    return field(metadata={"json": (lambda c: c.to_json(), decode)})


def _optional_candidate_field() -> Any:
    def decode(value: Any) -> Candidate | None:
        from kernel_probe.candidates import Candidate

        return None if value is None else Candidate.from_json(value)

    return field(
        default=None, metadata={"json": (lambda c: None if c is None else c.to_json(), decode)}
    )


@dataclass(frozen=True)
class Message:
    """A message with a fixed set of keys; subclasses are frozen, keyword-only dataclasses."""

    def to_json(self) -> dict[str, Any]:
        """The message as a JSON object, each field through its encoder."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            encode: Callable[[Any], Any] | None = f.metadata.get("json", (None, None))[0]
            out[f.name] = encode(value) if encode else _plain(value)
        return out

    @classmethod
    def from_json(cls: type[M], data: Any) -> M:
        """Read a message back; :class:`ProtocolError` names the message and the key when it is not
        one."""
        try:
            return cls._read(data)
        except ReadError as exc:  # the key was added as the error left the field that raised it
            raise ProtocolError(
                f"{cls.__name__}{'.' + exc.key if exc.key else ''}: {exc.problem}"
            ) from None

    @classmethod
    def _read(cls: type[M], data: Any) -> M:
        if not isinstance(data, Mapping):
            raise ReadError(f"expected a JSON object, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(unknown_keys(data, (*known, *cls._envelope())))
        if unknown:
            raise ReadError(
                f"unknown key(s) {', '.join(map(repr, unknown))} (known: "
                f"{', '.join(known) or 'none'})"
            )
        missing = [
            k
            for k, f in known.items()
            if k not in data and f.default is MISSING and f.default_factory is MISSING
        ]
        if missing:
            raise ReadError(f"missing key(s) {', '.join(map(repr, missing))}")
        kwargs = {}
        for key, value in data.items():
            if key not in known:
                continue
            decode: Callable[[Any], Any] | None = known[key].metadata.get("json", (None, None))[1]
            with context(key):
                try:
                    kwargs[key] = decode(value) if decode else value
                except ProtocolError as exc:
                    raise ReadError(str(exc)) from None
                except (TypeError, ValueError, KeyError) as exc:
                    raise ReadError(f"{type(exc).__name__}: {exc}") from None
        return cls(**kwargs)

    @classmethod
    def _envelope(cls) -> tuple[str, ...]:
        """Keys on the wire that are not fields (a request's ``op``)."""
        return ()


def _plain(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_json()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


# ---- the worker: replies -------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Reply(Message):
    """What every worker reply may carry: the torch functions replaced while it ran (refused), and
    whether Triton kernels in the worker run in Triton's interpreter (``TRITON_INTERPRET``): such a
    run is labelled, never timed and never locked."""

    tampered: tuple[str, ...] = field(default=(), metadata={"json": (list, tuple)})
    interpreted: bool = False


@dataclass(frozen=True, kw_only=True)
class PingReply(Reply):
    """The worker is up (torch imported): its process id."""

    pid: int
    ok: bool = True


@dataclass(frozen=True, kw_only=True)
class FingerprintReply(Reply):
    """This machine's lock fingerprint as the worker's torch sees it
    (``kernel_lock.fingerprint.current``)."""

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
    """One tiny forward on a device the candidate does not declare: whether it ran, else what it
    raised."""

    ran: bool
    error: str = ""


# The names of the flags a measurement row may raise, and the key under which a norm's output is
# compared with the other norm's reference (an RMSNorm offered as a LayerNorm): measure writes them,
# judge reads them.
ImportKind = Literal[
    "", "import", "exception"
]  # an import that raised: an ImportError (absent) or anything else
Phase = Literal[
    "", "import", "baseline", "build", "blas"
]  # where a check stopped before any row ("": it did not)
FLAG_INPUT_MODIFIED = "input-modified"
FLAG_GRAD_OUTPUT_MODIFIED = "grad-output-modified"
FLAG_OUTPUT_DTYPE = "output-dtype"
FLAG_NOT_ELEMENTWISE = (
    "not-elementwise"  # Activation: the output's shape is not the input's (a GLU halves it)
)
ALT_PREFIX = "y-as-"


def alt_key(semantics: str) -> str:
    """The error key of the output judged against ``semantics``' reference (``y-as-rms_norm``)."""
    return ALT_PREFIX + semantics


class ErrorStats(TypedDict):
    """One compared output's statistics besides the max error (``measure.error_stats``; judged by
    ``judge.limits``): ``rms``, ``bias`` (the mean signed error) and ``sd`` (the errors' standard
    deviation about their mean) as [candidate, torch.nn], each the worst group's, normwise; ``n``:
    the elements per group (a row, or the whole tensor); ``ref_rms``: the reference's RMS over the
    tensor, normwise (its typical magnitude, in (0, 1])."""

    rms: list[float]
    bias: list[float]
    sd: list[float]
    n: int
    ref_rms: float


class MeasurementRow(TypedDict, total=False):
    """One (dtype, regime) of a check: ``measure.check`` writes it, ``judge.judge_row`` reads it."""

    dtype: str
    regime: str
    # case -> tensor (y, dx, ..., alt_key(...)) -> [candidate, torch.nn]
    cases: dict[str, dict[str, list[float]]]
    stats: dict[str, dict[str, ErrorStats]]  # case -> tensor -> RMS and bias (not for alt_key(...))
    flags: dict[str, str]  # FLAG_* -> the case (or the dtypes) it was seen on
    skipped: str
    exception: str
    traceback: str
    out_dtype: str
    nondeterministic: str | None
    blocks: dict[str, dict[str, Any]]
    seconds: float
    twin: dict[str, Any]
    # Activation: the errors against the function the candidate computes, where that is not the
    # declared one (an approximation, judged so only with --allow-approximation)
    approx_cases: dict[str, dict[str, list[float]]]
    approx_stats: dict[str, dict[str, ErrorStats]]


MEASUREMENT_KEYS = frozenset(MeasurementRow.__annotations__)


def _rows(value: Any) -> list[MeasurementRow]:
    if not isinstance(value, list):
        raise ProtocolError(f"expected a list of rows, got {type(value).__name__}")
    for i, row in enumerate(value):
        if not isinstance(row, Mapping):
            raise ProtocolError(f"rows[{i}]: expected a JSON object")
        unknown = sorted(set(row) - MEASUREMENT_KEYS)
        if unknown:
            raise ProtocolError(f"rows[{i}]: unknown key(s) {', '.join(map(repr, unknown))}")
        if "dtype" not in row or "regime" not in row:
            raise ProtocolError(f"rows[{i}]: missing 'dtype' or 'regime'")
    return value


@dataclass(frozen=True, kw_only=True)
class CheckReply(Reply):
    """``measure.check``'s raw measurements. ``phase`` names where it stopped early (import,
    baseline, build), with ``error`` (and ``kind`` for an import); ``layout`` is
    ``Layout.to_json()``."""

    candidate: str
    device: str
    rows: list[MeasurementRow] = field(default_factory=list, metadata={"json": (list, _rows)})
    phase: Phase = ""
    error: str = ""
    kind: ImportKind = ""
    traceback: str = ""
    import_s: float | None = None
    layout: dict[str, Any] | None = None
    init: list[str] = field(default_factory=list)
    # a Linear on a GPU: the BLAS library the rows were measured under (kernel_lock.format.blas
    # names)
    blas: str = ""
    blas_default: str = ""  # the library torch picks by itself in this process (before any was set)
    # Attention: what each option really does, measured (kernel_probe.probe.attention.capabilities)
    capabilities: dict[str, str] = field(default_factory=dict)
    # Activation: the function its float32 output matches, measured
    # (kernel_probe.probe.activation.identify)
    computes: str = ""


class ShapeCheck(TypedDict, total=False):
    """The check at one timed shape (``atshape.check_at_shape``; judged by ``judge.judge_shape``).

    ``errors``: tensor (y, dx, dweight, dbias) -> [candidate, torch.nn], each against float64 on the
    ``sampled`` rows, the max error; ``stats``: the same tensors' RMS and bias; ``first_bad_row``:
    the first wrong row (bisected down from ``first_bad_sampled``, the first sampled row over a
    tolerance, to ``last_good_row``), ``first_bad_statistic`` what was over there (``y bias``);
    ``error``: the check itself raised."""

    rows: int
    sampled: int
    boundaries: list[str]
    errors: dict[str, list[float]]
    stats: dict[str, ErrorStats]
    first_bad_row: int
    first_bad_statistic: str
    first_bad_sampled: int
    last_good_row: int
    seconds: float
    error: str


class TimingRow(TypedDict, total=False):
    """One shape of a timing (``timing.time_candidate``); ``error`` instead of the figures when it
    failed; ``check``: the candidate at that shape against float64 (``atshape``), unless the timing
    was asked without it; ``blas``: the BLAS library a Linear ran under on a GPU; ``timed``: how the
    number of repetitions was decided (``kernel_probe.probe.repetitions``), ``samples`` the timed
    calls (seconds), which the slot's other candidates are decided against (not recorded in the
    lock)."""

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
    check: ShapeCheck
    blas: str
    peak_bytes: int  # Attention on a GPU: peak memory allocated by one fwd+bwd
    timed: str
    samples: list[float]


@dataclass(frozen=True, kw_only=True)
class TimeReply(Reply):
    """A candidate's timing: one row per shape (``TimingRow``)."""

    candidate: str
    device: str
    rows: list[TimingRow] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class TimingProgressMessage(Message):
    """Sent by a timing worker before its reply: shape ``index`` of ``of``, ``phase`` (first call,
    warm-up, rep) ``done`` of ``total``, ``seconds`` spent on this shape so far."""

    shape: str
    index: int
    of: int
    phase: str
    done: int
    total: int
    seconds: float


# ---- the worker: requests ------------------------------------------------------------------------
R = TypeVar("R", bound=Reply)


@dataclass(frozen=True, kw_only=True)
class Request(Message, Generic[R]):
    """A worker request; ``OP`` is its name on the wire, ``REPLY`` the class of its answer
    (``R``)."""

    OP: ClassVar[str] = ""
    REPLY: ClassVar[type[Reply]] = Reply

    def __init_subclass__(
        cls, op: str = "", reply: type[Reply] | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if op:
            cls.OP = op
        if reply is not None:
            cls.REPLY = reply

    def to_json(self) -> dict[str, Any]:
        """The request as a JSON object, its ``op`` included."""
        return {"op": self.OP, **super().to_json()}

    @classmethod
    def _envelope(cls) -> tuple[str, ...]:
        return ("op",)


@dataclass(frozen=True, kw_only=True)
class PingRequest(Request[PingReply], op="ping", reply=PingReply):
    """Start up: import torch and the probe's own measuring code, snapshot torch's functions."""


@dataclass(frozen=True, kw_only=True)
class FingerprintRequest(Request[FingerprintReply], op="fingerprint", reply=FingerprintReply):
    """The lock fingerprint, read where torch is imported already (the probe's own process never
    imports torch: the shared worker answers, from the torch that ran the checks)."""


@dataclass(frozen=True, kw_only=True)
class ImportRequest(Request[ImportReply], op="import", reply=ImportReply):
    """Import the class ``target`` (under its own, short, time budget)."""

    target: str


@dataclass(frozen=True, kw_only=True)
class CandidateRequest(Request[R]):
    """A request about one candidate, for one slot, on one device type."""

    candidate: Candidate = _candidate_field()
    slot: str
    device: str


@dataclass(frozen=True, kw_only=True)
class CheckRequest(CandidateRequest[CheckReply], op="check", reply=CheckReply):
    """The correctness checks (``measure.check``) of one candidate for ``slot`` at each (dtype,
    regime)."""

    dtypes: tuple[tuple[str, str], ...] = field(
        metadata={"json": (lambda d: [list(p) for p in d], lambda d: tuple(tuple(p) for p in d))}
    )
    canonical: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    hidden: int | None = None  # None: limits.CHECK_HIDDEN
    baseline: Candidate | None = _optional_candidate_field()  # None: the slot's torch.nn default


@dataclass(frozen=True, kw_only=True)
class TryRequest(CandidateRequest[TryReply], op="try", reply=TryReply):
    """Build the candidate on a device it does not declare and run it once: why it cannot run
    here."""


@dataclass(frozen=True, kw_only=True)
class TimeRequest(CandidateRequest[TimeReply], op="time", reply=TimeReply):
    """Time forward+backward at ``shapes``; with ``progress``, ``TimingProgressMessage``s come
    first."""

    shapes: tuple[str, ...] = field(metadata={"json": (list, tuple)})
    dtype: str
    regime: str
    options: dict[str, Any] = field(default_factory=dict)
    progress: bool = False
    # Attention: the model's options (window, ...)
    canonical: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class GraphAttentionRequest(Request[CheckReply], op="graph-attention", reply=CheckReply):
    """The GraphTransformer attention check (``graph_attention.check``) of one ``backend``
    (``triton``, ``pyg`` or ``module.function``) on ``device``, one row per dtype."""

    backend: str
    device: str
    dtypes: tuple[str, ...] = field(metadata={"json": (list, tuple)})
    seed: int = 0


REQUESTS: dict[str, type[Request[Any]]] = {
    cls.OP: cls
    for cls in (
        PingRequest,
        FingerprintRequest,
        ImportRequest,
        CheckRequest,
        TryRequest,
        TimeRequest,
        GraphAttentionRequest,
    )
}


def request_from_json(data: Any) -> Request[Any]:
    """The worker's side: the request a JSON object is, by its ``op``."""
    if not isinstance(data, Mapping):
        raise ProtocolError(f"request: expected a JSON object, got {type(data).__name__}")
    op = data.get("op")
    if op not in REQUESTS:
        raise ProtocolError(f"request: unknown op {op!r} (known: {', '.join(REQUESTS)})")
    return REQUESTS[op].from_json(data)


# ---- import checks (``kernel-probe env``) --------------------------------------------------------
@dataclass(frozen=True)
class ImportCheckRequest(Message):
    """One module to import in a child, and an optional probe to run after it
    (``importcheck.PROBES``)."""

    module: str
    probe: str = ""


@dataclass(frozen=True, kw_only=True)
class ImportCheckReply(Message):
    """What the import-check child saw: imported (``ok``) or what it raised (``type``, ``message``,
    ``where``)."""

    ok: bool
    file: str | None = None  # the module's __file__ and __version__, when it imported
    version: str | None = None
    type: str = ""  # what the import raised, and where
    message: str = ""
    where: str = ""
    seconds: float = 0.0
    target: dict[str, Any] | None = None  # the "triton-target" probe: backend, arch, warp_size
    target_error: str = ""


@dataclass(frozen=True, kw_only=True)
class ImportCheckCached(Message):
    """An import check's answer kept on disk (``detect.importcache``): the reply, the child's
    seconds, when it was asked (``asked``, seconds since the epoch) and under which key."""

    format: str
    key: str
    asked: float
    seconds: float
    reply: dict[str, Any]


# ---- reading an anemoi config --------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ComposeRequest(Message):
    """Compose ``config_name`` from ``config_dir`` with ``overrides``, as anemoi-training would."""

    config_dir: str
    config_name: str
    overrides: tuple[str, ...] = field(default=(), metadata={"json": (list, tuple)})
    # packages a ``pkg://`` search path may name (anything else is refused before it is imported)
    trusted: tuple[str, ...] = field(default=(), metadata={"json": (list, tuple)})


@dataclass(frozen=True, kw_only=True)
class ComposeReply(Message):
    """The composed tree (interpolations as written); per ``layer_kernels`` path, its block resolved
    by OmegaConf: ``{"entries": {...}}``, ``{"value": ...}`` (not a mapping) or ``{"error":
    ...}``."""

    tree: Any
    blocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SchemaRequest(Message):
    """Validate a composed config (``tree``, interpolations as written) with anemoi-training's
    ``BaseSchema``; ``model_file``: ``tree`` is a model node, validated inside anemoi-training's
    packaged ``config``."""

    tree: Any
    model_file: bool = False
    preset: str = (
        ""  # also validate anemoi-training's packaged model preset of that name, as shipped
    )


@dataclass(frozen=True, kw_only=True)
class SchemaReply(Message):
    """``errors``: ``{"where", "type", "message"}`` each, at config paths; ``unset``: mandatory
    values (``???``) the config leaves for the command line; ``members``: per config path, the union
    member the errors there are reported for (the closest of several, e.g. anemoi's model schemas);
    ``version``: anemoi-training's."""

    errors: list[dict[str, str]] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)
    members: dict[str, str] = field(default_factory=dict)
    preset: list[dict[str, str]] = field(default_factory=list)  # the shipped preset's own errors
    version: str = ""


@dataclass(frozen=True, kw_only=True)
class EntryCheckRequest(Message):
    """One ``layer_kernels`` entry to import and judge
    (``kernel_probe.anemoi.entry_checks.check_entry``)."""

    key: str
    entry: Any
    where: str
    allow_semantics_change: bool = False


@dataclass(frozen=True, kw_only=True)
class EntryCheckReply(Message):
    """``findings``: ``Finding.to_json()`` each; ``facts``: what the entry builds (target, family,
    defaults)."""

    findings: list[dict[str, Any]]
    facts: dict[str, Any]


def _messages(kind: type[M]) -> Any:
    """A field holding a tuple of ``kind`` messages: on the wire, a list of their JSON objects."""

    def decode(value: Any) -> tuple[M, ...]:
        if not isinstance(value, list):
            raise ProtocolError(f"expected a list, got {type(value).__name__}")
        out = []
        for i, v in enumerate(value):
            try:
                out.append(kind.from_json(v))
            except ProtocolError as exc:
                raise ProtocolError(f"[{i}]: {exc}") from None
        return tuple(out)

    return field(default=(), metadata={"json": (lambda vs: [v.to_json() for v in vs], decode)})


def _optional_message(kind: type[M]) -> Any:
    """A field holding one ``kind`` message or None (JSON null)."""
    return field(
        default=None,
        metadata={
            "json": (
                lambda v: None if v is None else v.to_json(),
                lambda v: None if v is None else kind.from_json(v),
            )
        },
    )


@dataclass(frozen=True, kw_only=True)
class ConfigCheckRequest(Message):
    """One reading of a config checked in one child (``kernel_probe.anemoi.config_child``):
    anemoi-training's schema on it (``schema``, where it is run; its address space capped at
    ``schema_memory`` bytes while it runs), then its ``entries``."""

    schema: SchemaRequest | None = _optional_message(SchemaRequest)
    schema_memory: int = 0
    entries: tuple[EntryCheckRequest, ...] = _messages(EntryCheckRequest)


@dataclass(frozen=True, kw_only=True)
class ConfigCheckReply(Message):
    """``schema``: the schema's reply (None where it was not asked); ``entries``: one reply per
    entry, in the request's order."""

    schema: SchemaReply | None = _optional_message(SchemaReply)
    entries: tuple[EntryCheckReply, ...] = _messages(EntryCheckReply)
