"""The norms' and Linear's check, in the worker: raw measurements of one candidate on one device
(docs/checks.md). Its layout and initialisation once; per (dtype, regime), beside torch.nn with
the same parameters: errors against float64, flags, repeatability, blocks, the cases as training
and inference use it (``inuse``), the twin. What the slot's candidates share is made once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kernel_lock.slots import confusable, torch_device
from kernel_probe.candidates import Candidate, canonical_for, default_for
from kernel_probe.isolation import protocol
from kernel_probe.isolation.protocol import CheckReply, ErrorStats, MeasurementRow
from kernel_probe.probe import inuse, measure, onetensor
from kernel_probe.probe.layout import Layout, discover, shapes
from kernel_probe.probe.limits import CHECK_HIDDEN

ALT_CASES = ("random", "tiny-variance")  # a norm's output also measured against the other norm's
PARAMETER_GRADIENTS = frozenset(("dweight", "dbias"))  # sums over every row: judged per tensor


# ---- the check ---------------------------------------------------------------------------------
class _Stopped(Exception):
    """A step that ends the check early: the reply's fields that say where and why."""

    def __init__(self, **fields: Any):
        super().__init__(fields.get("error", ""))
        self.fields = fields


@dataclass(frozen=True)
class Bench:
    """One candidate's check on one device: what every step builds with."""

    cand: Candidate
    slot: str
    device: str  # the device type (cpu, cuda, rocm)
    hidden: int
    overrides: Mapping[str, Any] | None
    seed: int
    baseline: Candidate  # the torch.nn class it is judged against
    shared: measure.SetupCache | None = None  # the set-up shared with the slot's other candidates

    @property
    def torch_device(self) -> str:
        """The torch device type the tensors live on."""
        return torch_device(self.device)

    @property
    def out_features(self) -> int | None:
        """A Linear's output width in the checks (None for a norm)."""
        return 384 if self.cand.semantics == "linear" else None

    def canonical(self, param_dtype: str) -> dict[str, Any]:
        """The slot's canonical configuration at the checks' size, parameters in ``param_dtype``."""
        return canonical_for(
            self.slot,
            hidden=self.hidden,
            out_features=self.out_features,
            device=self.torch_device,
            param_dtype=param_dtype,
            overrides=self.overrides,
        )

    def key(self, *more: Any) -> tuple[Any, ...]:
        """What determines the set-up a slot's candidates share, and ``more``."""
        overrides = json.dumps(dict(self.overrides or {}), sort_keys=True, default=str)
        baseline = json.dumps(self.baseline.to_json(), sort_keys=True, default=str)
        fixed = (self.slot, self.cand.semantics, self.device, self.hidden, overrides, self.seed)
        return (*fixed, baseline, *more)

    def shared_or_made(self, key: tuple[Any, ...], make: Any) -> Any:
        """``make()``, or what the slot's earlier candidate made under ``key``."""
        return make() if self.shared is None else self.shared.get(key, make)


def check(
    cand: Candidate,
    slot: str,
    device: str,
    dtypes: list[tuple[str, str]],
    *,
    hidden: int = CHECK_HIDDEN,
    canonical_overrides: Mapping[str, Any] | None = None,
    seed: int = 0,
    baseline: Candidate | None = None,
    shared: measure.SetupCache | None = None,
) -> CheckReply:
    """One candidate's raw measurements (stopped early: ``phase`` where, ``error`` why)."""
    rows: list[MeasurementRow] = []
    # the reply so far: each step binds what it learnt, and an early stop returns it with the reason
    reply = functools.partial(CheckReply, candidate=cand.id, device=device, rows=rows)
    baseline = baseline or default_for(slot)
    bench = Bench(cand, slot, device, hidden, canonical_overrides, seed, baseline, shared)
    import_s, stopped = measure.import_stop(cand, device, whole=True)
    if stopped is not None:
        return stopped
    reply = functools.partial(reply, import_s=import_s)
    try:
        fresh, fresh_base = _fresh(bench)
    except _Stopped as stop:
        return reply(**stop.fields)
    base_shapes = shapes(fresh_base.state_dict())
    layout = discover(shapes(fresh.state_dict()), base_shapes)
    base_layout = discover(base_shapes, base_shapes)
    reply = functools.partial(reply, layout=layout.to_json())
    if not layout.ok:  # no numerics without a mapping: the verdict says what is missing
        return reply()
    reply = functools.partial(reply, init=onetensor.fresh_differences(fresh, fresh_base, layout))
    with contextlib.ExitStack() as stack:
        stack.enter_context(measure.one_cpu_thread(device))  # the check's tensors are small
        try:
            library, default = stack.enter_context(onetensor.blas_library(cand, device))
        except onetensor.BlasNotOffered as exc:
            return reply(phase="blas", error=str(exc))
        rows.extend(_measure_row(bench, d, regime, layout, base_layout) for d, regime in dtypes)
    return reply(blas=library, blas_default=default)


def _fresh(bench: Bench) -> tuple[Any, Any]:
    """The candidate and torch.nn's module freshly built in float32 (torch.nn's shared), each right
    after seeding torch's global generators (seed for torch.nn, seed + 1 for the candidate): the
    initialisation verdict is the same on every rank and in every run."""
    canonical32 = bench.canonical("float32")

    def baseline() -> Any:  # or the stop that says why not
        try:
            torch.manual_seed(bench.seed)
            return measure.build(bench.baseline, canonical32, bench.torch_device, torch.float32)
        except Exception as exc:
            why = f"torch.nn itself cannot be built on {bench.device}: {type(exc).__name__}: {exc}"
            return _Stopped(phase="baseline", error=why)

    fresh_base = bench.shared_or_made(bench.key("fresh"), baseline)
    if isinstance(fresh_base, _Stopped):
        raise fresh_base
    try:
        torch.manual_seed(bench.seed + 1)
        fresh = measure.build(bench.cand, canonical32, bench.torch_device, torch.float32)
    except Exception as exc:
        raise _Stopped(
            phase="build",
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(limit=6)[-2000:],
        ) from None
    return fresh, fresh_base


@dataclass(frozen=True)
class Row:
    """What one (dtype, regime) is measured with (parameters also in float64, for the reference)."""

    dtype: torch.dtype
    mixed: bool
    param_dtype: torch.dtype
    canonical: dict[str, Any]
    params: dict[str, Any]
    params64: dict[str, Any]
    autocast: tuple[str, torch.dtype] | None
    width: int
    eps: float | None  # None: torch.nn.RMSNorm's rule (onetensor.eps_for)
    gen: torch.Generator

    @classmethod
    def of(cls, bench: Bench, name: str, regime: str) -> Row:
        """The row's set-up; its generator has drawn the parameters."""
        dtype = measure.torch_dtype(name)
        mixed = regime == "mixed"
        param_dtype = torch.float32 if mixed else dtype
        canonical = bench.canonical(measure.dtype_name(param_dtype))
        gen = torch.Generator().manual_seed(bench.seed)
        semantics = bench.cand.semantics
        params, params64 = onetensor.parameters_for(semantics, canonical, gen)
        width = canonical["out_features"] if semantics == "linear" else bench.hidden
        autocast = (bench.torch_device, dtype) if mixed else None
        eps = canonical.get("eps", 0.0)
        return cls(
            dtype, mixed, param_dtype, canonical, params, params64, autocast, width, eps, gen
        )


@dataclass(frozen=True)
class Prepared:
    """One input of a case as every candidate gets it: x, grad_output, skip (drawn so), the
    reference's and torch.nn's passes and errors; ``error``: what those raised, raised again."""

    x: Any
    gy: Any
    skip: Any
    ref: dict[str, Any] | None = None
    base: dict[str, Any] | None = None
    base_sides: dict[str, Any] = dataclasses.field(default_factory=dict)
    base_alt: float = 0.0
    error: tuple[str, BaseException, Any] | None = None  # (where, the exception, its traceback)


@dataclass(frozen=True)
class Shared:
    """A row's set-up shared by the slot's candidates (``skipped``: torch.nn itself fails here);
    ``gen_state``: where the cases left the generator, for each candidate's to go on from."""

    setup: Row
    base_mod: Any = None
    cases: tuple[tuple[onetensor.Case, tuple[Prepared, ...]], ...] = ()
    gen_state: Any = None
    skipped: str = ""
    later: inuse.Later | Exception | None = None  # the cases after the first life (issue 55)

    def row(self) -> Row:
        """The row's set-up with a generator of the candidate's own, where the cases left it."""
        gen = torch.Generator()
        gen.set_state(self.gen_state)
        return dataclasses.replace(self.setup, gen=gen)


def _measure_row(
    bench: Bench, name: str, regime: str, layout: Layout, base_layout: Layout
) -> MeasurementRow:
    """One (dtype, regime): the errors, flags, determinism, blocks and twin check (or why not)."""
    shared = bench.shared_or_made(
        bench.key("row", name, regime, onetensor.baseline_blas(bench.cand, bench.device)),
        functools.partial(_prepare, bench, name, regime, base_layout),
    )
    row: MeasurementRow = {"dtype": name, "regime": regime, "cases": {}, "flags": {}}
    if shared.skipped:
        row["skipped"] = shared.skipped
        return row
    try:
        _measure(bench, shared, row, layout, base_layout)
    except Exception as exc:
        row["exception"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc(limit=6)[-2000:]
    return row


def _prepare(bench: Bench, name: str, regime: str, base_layout: Layout) -> Shared:
    """What every candidate of the slot is measured against in this row, computed once."""
    setup = Row.of(bench, name, regime)
    try:
        base_mod = _baseline(bench, setup, base_layout)
    except Exception as exc:
        why = f"torch.nn itself fails for {name} {regime} on {bench.device}: "
        return Shared(setup, skipped=why + f"{type(exc).__name__}: {exc}")
    semantics, device, gen = bench.cand.semantics, bench.torch_device, setup.gen
    prepared = []
    for case in onetensor.cases(
        semantics, bench.hidden, setup.dtype, device, gen, mixed=setup.mixed
    ):
        inputs = []
        for x in case.inputs:
            out_shape = (*x.shape[:-1], setup.width)
            gy = (torch.randn(*out_shape, generator=gen) * 0.7 + 0.1).to(device, x.dtype)
            skip = (
                torch.randn(*out_shape, generator=gen).to(device, x.dtype)
                if case.residual
                else None
            )
            inputs.append(_prepared(bench, setup, case, (base_mod, base_layout), x, gy, skip))
        prepared.append((case, tuple(inputs)))
    try:
        later: inuse.Later | Exception = inuse.prepare(bench, setup, (base_mod, base_layout))
    except Exception as exc:  # raised again where each candidate measures, as _prepared's are
        later = exc
    return Shared(setup, base_mod, tuple(prepared), gen.get_state(), later=later)


def _prepared(bench: Bench, setup: Row, case: Any, baseline: tuple, x, gy, skip) -> Prepared:
    """One input's reference and torch.nn's pass, and torch.nn's errors (or what raised)."""
    semantics = bench.cand.semantics
    try:
        ref = onetensor.reference_pass(semantics, x, gy, setup.params64, setup.eps, skip)
    except Exception as exc:
        return Prepared(x, gy, skip, error=("reference", exc, exc.__traceback__))
    try:
        with onetensor.blas_selected(onetensor.baseline_blas(bench.cand, bench.device)):
            base = onetensor.run_pass(baseline[0], x, gy, skip, setup.autocast, baseline[1])
    except Exception as exc:
        return Prepared(x, gy, skip, ref, error=("baseline", exc, exc.__traceback__))
    sides = {
        name: measure.side(b, r, rows=name not in PARAMETER_GRADIENTS)
        for name, (_, b, r) in _compared(base, base, ref, case.residual).items()
        if r is not None
    }
    alt = confusable(semantics) and case.name in ALT_CASES
    return Prepared(
        x, gy, skip, ref, base, sides, measure.rel_err(base["y"], ref["y"]) if alt else 0.0
    )


def _baseline(bench: Bench, setup: Row, base_layout: Layout) -> Any:
    """torch.nn's module in the row's dtype and parameters, after one small pass."""
    # a dtype or regime torch.nn itself cannot run is skipped, not held against the candidate
    device = bench.torch_device
    base_mod = measure.build(bench.baseline, setup.canonical, device, setup.param_dtype)
    onetensor.load_parameters(base_mod, setup.params, base_layout)
    x_probe = torch.randn(2, bench.hidden, generator=setup.gen).to(device, setup.dtype)
    gy = torch.ones(2, setup.width, device=device, dtype=setup.dtype)
    with onetensor.blas_selected(onetensor.baseline_blas(bench.cand, bench.device)):
        onetensor.run_pass(base_mod, x_probe, gy, None, setup.autocast, base_layout)
    return base_mod


def _measure(
    bench: Bench, shared: Shared, row: MeasurementRow, layout: Layout, base_layout: Layout
) -> None:
    """The candidate with the row's parameters on every case, then the per-row checks, then the
    cases as training and inference use it (``inuse``: the module is updated in place), into row."""
    # unshared, the row's own generator draws on where the cases left it, as it always did
    setup = shared.setup if bench.shared is None else shared.row()
    t_build = time.perf_counter()
    mod = measure.build(bench.cand, setup.canonical, bench.torch_device, setup.param_dtype)
    onetensor.load_parameters(mod, setup.params, layout)
    out_dtype = ""
    row["stats"] = {}
    for case, inputs in shared.cases:
        row["cases"][case.name], row["stats"][case.name], out_dtype = _measure_case(
            bench, setup, case, inputs, (mod, layout), row["flags"]
        )
    row["out_dtype"] = out_dtype
    row["nondeterministic"] = onetensor.repeatability(bench, setup, layout)
    if protocol.FLAG_OUTPUT_DTYPE in row["flags"] and confusable(bench.cand.semantics):  # a norm
        row["blocks"] = onetensor.blocks(
            bench, setup, (mod, layout), (shared.base_mod, base_layout)
        )
    if isinstance(shared.later, Exception):
        raise shared.later
    assert shared.later is not None  # made with the cases
    inuse.measure_later(bench, setup, shared.later, (mod, layout), row)
    row["seconds"] = time.perf_counter() - t_build
    row["twin"] = onetensor.twin_check(bench, setup, mod, layout)


def _measure_case(
    bench: Bench, setup: Row, case: Any, inputs: tuple[Prepared, ...], candidate: tuple, flags: dict
) -> tuple[dict[str, list[float]], dict[str, ErrorStats], str]:
    """One case's errors and statistics (the worst over its inputs), flags and output dtype."""
    errs: dict[str, list[float]] = {}
    stats: dict[str, ErrorStats] = {}
    out_dtype = ""
    for p in inputs:
        if p.error is not None and p.error[0] == "reference":
            raise p.error[1].with_traceback(p.error[2])
        got = onetensor.run_pass(candidate[0], p.x, p.gy, p.skip, setup.autocast, candidate[1])
        if p.error is not None:
            raise p.error[1].with_traceback(p.error[2])
        assert p.base is not None and p.ref is not None
        for name, (g, b, r) in _compared(got, p.base, p.ref, case.residual).items():
            if r is None:
                measure.worst_errors(errs, name, measure.rel_err(g, r), measure.rel_err(b, r))
                continue
            # per row for an output and its input gradients, per tensor for a parameter's
            maxima, row_stats = measure.compare(
                g, b, r, rows=name not in PARAMETER_GRADIENTS, base_side=p.base_sides[name]
            )
            measure.worst_errors(errs, name, *maxima)
            measure.worst_stats(stats, name, row_stats)
        alt = confusable(bench.cand.semantics)
        if alt and case.name in ALT_CASES:  # the tolerance basis: torch.nn on its own maths
            measure.worst_errors(
                errs, protocol.alt_key(alt), _alt_error(alt, p.x, got["y"], setup), p.base_alt
            )
        _flag(flags, case.name, got, p.base, p.x)
        out_dtype = measure.dtype_name(got["y"].dtype)
    return errs, stats, out_dtype


def _compared(
    got: dict[str, Any], base: dict[str, Any], ref: dict[str, Any], residual: bool
) -> dict[str, tuple]:
    """Per tensor: (the candidate's, torch.nn's, the float64 reference's)."""
    pairs = {
        "y": (got["y"], base["y"], ref["y"]),
        "dx": (got["dx"], base["dx"], ref["dx"]),
        "dweight": (got["grads"].get("weight"), base["grads"].get("weight"), ref["weight"]),
    }
    if ref["bias"] is not None:
        pairs["dbias"] = (got["grads"].get("bias"), base["grads"].get("bias"), ref["bias"])
    if residual:
        pairs["dskip"] = (got["skip_grad"], base["skip_grad"], ref["skip"])
    return pairs


def _alt_error(alt: str, x: Any, y: Any, setup: Row) -> float:
    """The output's error against the other norm's reference, with or without bias (the closer)."""
    x64, eps = x.detach().to(torch.float64), onetensor.eps_for(setup.eps, x.dtype)
    return min(
        measure.rel_err(y, onetensor.reference(alt, x64, setup.params64["weight"], b, eps))
        for b in (setup.params64["bias"], None)
    )


def _flag(
    flags: dict[str, str], case: str, got: dict[str, Any], base: dict[str, Any], x: Any
) -> None:
    """The first case that showed each flag."""
    if not got["grad_output_intact"]:
        flags.setdefault(protocol.FLAG_GRAD_OUTPUT_MODIFIED, case)
    if not got["input_intact"]:
        flags.setdefault(protocol.FLAG_INPUT_MODIFIED, case)
    name = measure.dtype_name
    if got["y"].dtype != base["y"].dtype:
        flags.setdefault(
            protocol.FLAG_OUTPUT_DTYPE,
            f"{name(got['y'].dtype)} (torch.nn: {name(base['y'].dtype)}) for {name(x.dtype)} input",
        )


def tiny_call(cand: Candidate, slot: str, device: str) -> None:
    """One tiny forward and backward (``Slot.try_once``: what it raises says why it cannot run)."""
    tdev = torch_device(device)
    canonical = canonical_for(slot, hidden=64, out_features=64, device=tdev)
    mod = measure.build(cand, canonical, tdev, torch.float32)
    mod(torch.randn(4, 64, device=tdev)).sum().backward()
