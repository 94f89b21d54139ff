"""What every slot's worker measures with (torch): importing and building the candidate, normwise
errors against float64 (``compare``), the set-up a slot's candidates share (``SetupCache``).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch

from kernel_lock.slots import torch_device
from kernel_probe.candidates import Candidate, fill
from kernel_probe.isolation.protocol import CheckReply, ErrorStats, ImportKind, MeasurementRow

T = TypeVar("T")
Side = tuple[float, float, float, float]  # one implementation's (max, RMS, bias, sd) errors, worst


# ---- importing and building ---------------------------------------------------------------------
def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a name of ``kernel_lock.slots.DTYPES`` (``bfloat16``)."""
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).replace("torch.", "")


def first_line(exc: BaseException, limit: int) -> str:
    """``Type: the first line of its message``, cut at ``limit`` characters."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:limit]


def import_class(target: str) -> Any:
    """The class a dotted path names (importing its module)."""
    module_name, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def import_stop(
    cand: Candidate, device: str, *, needed: bool = True, whole: bool = False
) -> tuple[float, CheckReply | None]:
    """Import the candidate's class: (seconds, None), or (0, the reply stopping the check)."""
    start = time.perf_counter()
    if needed:
        try:
            import_class(cand.target)
        except Exception as exc:
            kind: ImportKind = "import" if isinstance(exc, ImportError) else "exception"
            error = f"{type(exc).__name__}: {exc}" if whole else first_line(exc, 400)
            return 0.0, CheckReply(
                candidate=cand.id, device=device, phase="import", kind=kind, error=error
            )
    return time.perf_counter() - start, None


def build(cand: Candidate, canonical: Mapping[str, Any], device: str, param_dtype: Any) -> Any:
    """The candidate built as it is declared, with ``canonical``'s values, on the torch device."""
    cls = import_class(cand.target)
    args = [fill(a, canonical) for a in cand.args]
    kwargs = cand.pinned_kwargs(canonical)
    kwargs.update({k: fill(v, canonical) for k, v in cand.build_kwargs.items()})
    return cls(*args, **kwargs).to(device=device, dtype=param_dtype)


def twin_candidate(cand: Candidate, slot: str, args: tuple[Any, ...] = ()) -> Candidate | None:
    """The candidate's declared twin as a candidate of its own (None: it declares none)."""
    if not cand.twin_target:
        return None
    return Candidate(
        "twin", (slot,), cand.semantics, cand.twin_target, args=args, kwargs=cand.twin_kwargs
    )


def incompatible(reason: str = "no twin declared") -> dict[str, Any]:
    """A twin check's record where the twin cannot stand in for the candidate: why."""
    return {"state_dict": "incompatible", "reason": reason}


# ---- the set-up a slot's candidates share ------------------------------------------------------
class SetupCache:
    """What a check computes alike for a slot's candidates, per key (LRU of ``size`` entries)."""

    def __init__(self, size: int = 8):
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._size = size
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        """The entry for ``key``, made by ``make()`` the first time."""
        if key in self._entries:
            self._entries.move_to_end(key)
            self.hits += 1
            value: T = self._entries[key]
            return value
        self.misses += 1
        value = make()
        self._entries[key] = value
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return value


SHARED = SetupCache()  # the worker process's (kernel_probe.probe.handlers passes it to each check)


# ---- the errors --------------------------------------------------------------------------------
def rel_err(got: Any, ref: Any) -> float:
    """max |got - ref| / max |ref|: normwise, so tiny reference entries cannot blow it up."""
    if got is None or ref is None:
        return math.inf if (got is None) != (ref is None) else 0.0
    if got.shape != ref.shape:
        return math.inf
    worst = (got.detach().to(torch.float64) - ref).abs().max().item()  # NaN and inf propagate
    if not math.isfinite(worst):
        return math.inf
    return worst / max(ref.abs().max().item(), 1e-30)


def rel(got: Any, ref: Any, denom: float | None = None) -> float:
    """max|got - ref| / max|ref| (or / ``denom``); inf where got is not finite and ref is."""
    got64, ref64 = got.detach().double(), ref.detach().double()
    if got64.shape != ref64.shape:
        return math.inf
    if not torch.isfinite(got64).all() and torch.isfinite(ref64).all():
        return math.inf
    scale = denom if denom is not None else float(ref64.abs().max())
    err = float((got64 - ref64).abs().max())
    return err / scale if scale > 0 else (0.0 if err == 0 else math.inf)


def group_errors(got: Any, ref: Any, scale: float, *, rows: bool) -> tuple[Any, ...]:
    """Per group of ``got - ref`` (a row when ``rows``, else all): max |error|, RMS, |mean| and the
    spread about it, over ``scale``; inf where not finite."""
    e = got.detach().to(torch.float64) - ref
    e = e.reshape(-1, e.shape[-1]) if rows and e.dim() > 0 else e.reshape(1, -1)
    s = max(scale, 1e-30)
    mean = e.mean(-1)
    rms = torch.linalg.vector_norm(e, 2, dim=-1) / math.sqrt(max(e.shape[-1], 1))
    worst = torch.linalg.vector_norm(e, math.inf, dim=-1)
    sd = (rms * rms - mean * mean).clamp_min(0.0).sqrt()
    per = (worst / s, rms / s, mean.abs() / s, sd / s)
    return tuple(torch.nan_to_num(v, nan=math.inf, posinf=math.inf) for v in per)


def compare(
    got: Any, base: Any, ref: Any, *, rows: bool, base_side: Side | None = None
) -> tuple[list[float], ErrorStats]:
    """([max error, torch's], worst groups' statistics); ``base_side``: torch's, if computed."""
    n, scale, ref_rms = _scale(ref, rows)
    sides = (_side(got, ref, scale, rows), base_side or _side(base, ref, scale, rows))
    maxima, rms, bias, sd = ([s[k] for s in sides] for k in range(4))
    return maxima, {"rms": rms, "bias": bias, "sd": sd, "n": n, "ref_rms": ref_rms}


def side(t: Any, ref: Any, *, rows: bool) -> Side:
    """One implementation's errors against ``ref`` as ``compare`` computes them."""
    return _side(t, ref, _scale(ref, rows)[1], rows)


def _scale(ref: Any, rows: bool) -> tuple[int, float, float]:
    """(the group size, max |ref|, the reference's RMS over max |ref|)."""
    n = int(ref.shape[-1]) if rows and ref.dim() > 0 else int(ref.numel())
    scale = torch.linalg.vector_norm(ref, math.inf).item() if ref.numel() else 0.0
    spread = (
        torch.linalg.vector_norm(ref).item() / math.sqrt(ref.numel()) / scale if scale > 0 else 1.0
    )
    return max(n, 1), scale, spread


def _side(t: Any, ref: Any, scale: float, rows: bool) -> Side:
    if t is None or t.shape != ref.shape:
        return (math.inf, math.inf, math.inf, math.inf)
    worst, rms, bias, sd = group_errors(t, ref, scale, rows=rows)
    return (float(worst.max().item()), *(float(v.max().item()) for v in (rms, bias, sd)))  # type: ignore[return-value]


def worst_errors(errs: dict[str, list[float]], name: str, got: float, base: float) -> None:
    """Keep the worst [candidate, torch's] error of ``name`` over several inputs of one case."""
    e = errs.setdefault(name, [0.0, 0.0])
    e[0] = max(e[0], got)
    e[1] = max(e[1], base)


def worst_stats(into: dict[str, ErrorStats], name: str, stats: ErrorStats) -> None:
    """Keep, per statistic and implementation, the worst over several inputs of one case."""
    have = into.get(name)
    if have is None:
        into[name] = stats
        return
    for key in ("rms", "bias", "sd"):
        have[key] = [max(a, b) for a, b in zip(have[key], stats[key], strict=True)]
    have["n"] = min(have["n"], stats["n"])
    have["ref_rms"] = min(have["ref_rms"], stats["ref_rms"])


def nondeterminism(a: Mapping[str, Any], b: Mapping[str, Any], names: Sequence[str]) -> str | None:
    """None when two identical runs gave bitwise equal ``names``; else by how much they differ."""
    if all(torch.equal(a[n], b[n]) for n in names):
        return None
    spread = max(float((a[n].double() - b[n].double()).abs().max()) for n in names)
    return f"two identical fwd+bwd differ by up to {spread:.3g}"


class Refused(Exception):
    """The candidate refused these inputs: the message is all of the reason (a row's exception)."""


@contextlib.contextmanager
def measuring(
    row: MeasurementRow, failed: Callable[[MeasurementRow, Exception], None] | None = None
) -> Iterator[None]:
    """A row's measurements, then its ``seconds``; what they raise ends them as ``failed`` records
    it, by default as the row's ``exception`` (a refusal's reason, else the first line)."""
    start = time.perf_counter()
    try:
        yield
    except Exception as exc:
        if failed is not None:
            failed(row, exc)
        else:
            row["exception"] = str(exc) if isinstance(exc, Refused) else first_line(exc, 400)
        return
    row["seconds"] = time.perf_counter() - start


# ---- where and how a check runs ----------------------------------------------------------------
@contextlib.contextmanager
def one_cpu_thread(device: str = "cpu") -> Iterator[None]:
    """One CPU thread for a check's small tensors (a CPU device only)."""
    # with one per core, tiny passes wait on OpenMP hand-offs (2 cores: 0.31 s vs 3.5 s loaded)
    before = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def on_device(device: str) -> Iterator[None]:
    """Tensors created inside land on ``device`` (torch.device as a context), one CPU thread; on
    leaving, the process's default device is what it was, with no mode left behind."""
    with torch.device(torch_device(device)), one_cpu_thread():
        yield


def autocasting(autocast: tuple[str, Any] | None) -> Any:
    """torch.autocast for (device type, dtype); a context that does nothing for None."""
    if autocast:
        return torch.autocast(device_type=autocast[0], dtype=autocast[1])
    return contextlib.nullcontext()
