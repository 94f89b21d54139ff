"""check-model's child (imports torch): the model as written against a deep copy with the lock
applied (``kernel_lock.apply``), and a float64 copy of the written one that sets the tolerance.
All three run the same phases from the same seed and inputs: a forward and backward, N SGD steps,
an eval-mode and a no-grad forward, a state-dict save and load both ways. Per phase, the loss, the
outputs, the gradients and each applied site's output (forward hooks) are judged; then the
training step is timed, written and applied alternating (:func:`check_model`)."""

from __future__ import annotations

import copy
import io
import random
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import torch
from torch import nn

import kernel_lock
from kernel_lock.errors import LockError
from kernel_probe.model import child
from kernel_probe.model.check import NOT_TIMED
from kernel_probe.model.child import ModelCodeError, _cast, _floats

__all__ = ["FLOOR", "K", "check_model"]

K = 10.0  # a difference up to K x the written model's own float32-vs-float64 error agrees ...
FLOOR = 1e-6  # ... plus FLOOR x max(1, the largest magnitude of the float64 value)
SEED = 0
LR = 1e-2
TIMING_BUDGET = 20.0  # seconds of paired rounds at most
ROUNDS = (3, 15)  # at least, at most (after one warm-up round)

Values = dict[str, list[torch.Tensor]]  # what one phase yields: name -> tensors


class _Sites:
    """Hooks on the applied sites: each site's outputs, in the order they complete (a functional
    site: the output of the module whose forward makes the call), and a module site's input
    gradients, in the order the backward reaches them (a backward wrong in one site shows there
    first, before any output differs)."""

    def __init__(self, model: nn.Module, sites: list[str]):
        self.outputs: dict[str, list[torch.Tensor]] = {}
        self.inputs: dict[str, list[torch.Tensor]] = {}
        for where in sites:
            module = model.get_submodule(where.split(":")[0])
            module.register_forward_hook(self._hook(self.outputs, where, 2))
            if ":" not in where:
                module.register_full_backward_hook(self._hook(self.inputs, where, 1))

    @staticmethod
    def _hook(into: dict[str, list[torch.Tensor]], where: str, arg: int) -> Callable[..., None]:
        """A closure (a deep copy of the model keeps it, recording here): ``arg`` 2 a forward
        hook's output, 1 a backward hook's input gradients."""

        def hook(module: nn.Module, *args: Any) -> None:
            found = [t.detach().clone() for t in _floats(args[arg - 1 if arg == 1 else 1])]
            if found:
                into.setdefault(where, []).extend(found)

        return hook


class _Run:
    """One model (written, applied or float64: ``role``) through the phases."""

    blame = ""  # who fails if the call running now raises: "lock", or the written model's role

    def __init__(self, model: nn.Module, args: tuple, kwargs: dict, sites: list[str], role: str):
        self.model, self.args, self.kwargs, self.role = model, args, kwargs, role
        self.sites = _Sites(model, sites)
        self.device = next(model.parameters(), torch.empty(0)).device

    def forward(self, model: nn.Module | None = None, raw: bool = False) -> Values:
        _Run.blame = "lock" if model is not None or self.role == "applied" else self.role
        model = model or self.model
        self.sites.outputs.clear()
        self.sites.inputs.clear()
        torch.manual_seed(SEED)
        outs = _floats(model(*self.args, **self.kwargs))
        found: Values = {f"site {w}": t for w, t in self.sites.outputs.items()}
        return (
            found | {"output": [o.detach().clone() for o in outs]} | ({"_raw": outs} if raw else {})
        )

    def train(self) -> Values:
        """A forward and backward: the loss, outputs, site outputs and gradients."""
        self.model.zero_grad(set_to_none=True)
        values = self.forward(raw=True)
        loss = torch.stack([o.double().square().mean() for o in values.pop("_raw")]).sum()
        with warnings.catch_warnings():  # a site none of whose inputs needs a gradient: fine
            warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
            loss.backward()
        grads = {f"site {w} (input gradient)": t for w, t in self.sites.inputs.items()} | {
            f"gradient {n}": [p.grad.detach().clone()]
            for n, p in self.model.named_parameters()
            if p.grad is not None
        }
        return values | grads | {"loss": [loss.detach()]}

    def step(self) -> None:
        _Run.blame = "lock" if self.role == "applied" else self.role
        with torch.no_grad():  # plain SGD, in place (torch.optim imports torch._dynamo: ~3 s)
            for p in self.model.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-LR)

    def plain(self, mode: str) -> Values:
        self.model.train(mode != "eval")
        with torch.no_grad() if mode == "no-grad" else torch.enable_grad():
            values = self.forward()
        self.model.train()
        return values

    def loaded(self, state: bytes) -> Values:
        """A deep copy of this run's model (its hooks record here) loading ``state``."""
        _Run.blame = "lock"
        model = copy.deepcopy(self.model)
        model.load_state_dict(torch.load(io.BytesIO(state), weights_only=True))
        with torch.no_grad():
            return self.forward(model)


def _saved(model: nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getvalue()


def _phases(runs: list[_Run], steps: int) -> Iterator[tuple[str, Callable[[], list[Values]]]]:
    """Each phase's name, and what gives its values in each run (written, applied, float64)."""
    written, applied, ref = runs

    def stepped() -> list[Values]:
        for r in runs:
            r.step()
        return [r.train() for r in runs]

    def loaded(state: bytes, into: _Run) -> list[Values]:
        return [written.plain("no-grad"), into.loaded(state), ref.plain("no-grad")]

    yield "in the first forward and backward", lambda: [r.train() for r in runs]
    for i in range(1, steps + 1):
        yield f"after optimizer step {i}", stepped
    yield "in eval mode", lambda: [r.plain("eval") for r in runs]
    yield "in a no-grad forward", lambda: [r.plain("no-grad") for r in runs]
    yield (
        "after load_state_dict (written -> applied)",
        partial(loaded, _saved(written.model), applied),
    )
    yield (
        "after load_state_dict (applied -> written)",
        partial(loaded, _saved(applied.model), written),
    )


def _gap(x: torch.Tensor, y: torch.Tensor) -> float:
    """The largest absolute difference; a NaN in one only: inf (NaN in both at a place: equal)."""
    if not x.numel():
        return 0.0
    x, y = x.double(), y.double()
    d = torch.where(x.isnan() & y.isnan(), 0.0, (x - y).abs())
    return float(d.nan_to_num(nan=float("inf")).max())


def _worst(w: list[torch.Tensor], a: list[torch.Tensor], r: list[torch.Tensor]) -> tuple:
    """(difference, tolerance) of the worst tensor of one quantity; inf where shapes differ."""
    if len(w) != len(a) or any(x.shape != y.shape for x, y in zip(w, a, strict=True)):
        return (float("inf"), 0.0)
    pairs = []
    for x, y, z in zip(w, a, r if len(r) == len(w) else w, strict=True):
        big = float(z.double().abs().nan_to_num(0.0).max()) if z.numel() else 0.0
        tol = K * _gap(x, z.to(x.dtype) if z.shape != x.shape else z) + FLOOR * max(1.0, big)
        pairs.append((_gap(x, y), tol if tol == tol else float("inf")))
    return max(pairs or [(0.0, 0.0)], key=lambda p: p[0] - p[1])


def _judge(phase: str, values: list[Values]) -> dict[str, Any]:
    """The phase's worst quantity, and its first diverging site (call order) or quantity."""
    w, a, r = values
    out: dict[str, Any] = {"phase": phase, "diverging": [], "worst": None}
    for name in w.keys() | a.keys():
        diff, tol = _worst(w.get(name, []), a.get(name, []), r.get(name, []))
        if name not in w or name not in a:
            diff, tol = float("inf"), 0.0
        entry = {"what": name, "difference": diff, "tolerance": tol}
        if (
            out["worst"] is None
            or diff - tol > out["worst"]["difference"] - out["worst"]["tolerance"]
        ):
            out["worst"] = entry
        if diff > tol:
            out["diverging"].append(entry)
    order = list(w)  # sites in the order they completed, then outputs, gradients, loss
    out["diverging"].sort(key=lambda e: order.index(e["what"]) if e["what"] in order else 1 << 30)
    if "loss" in w and "loss" in a:
        out["loss"] = [float(w["loss"][0]), float(a["loss"][0])]
    return out


def _step_time(run: _Run) -> float:
    sync = torch.cuda.synchronize if run.device.type == "cuda" else (lambda: None)
    sync()  # a GPU's queued work is the step's own, not the previous one's
    begun = time.perf_counter()
    run.train()
    run.step()
    sync()
    return time.perf_counter() - begun


def _timing(written: _Run, applied: _Run) -> dict[str, Any]:
    """The training step, written and applied alternating (order swapped each round)."""
    pair = [written, applied]
    for r in pair:
        _step_time(r)  # warm-up
    times: list[list[float]] = [[], []]
    begun = time.perf_counter()
    while len(times[0]) < ROUNDS[1] and (
        len(times[0]) < ROUNDS[0] or time.perf_counter() - begun < TIMING_BUDGET
    ):
        first = len(times[0]) % 2
        for i in (first, 1 - first):
            times[i].append(_step_time(pair[i]))
    pairs, rng, med = list(zip(*times, strict=True)), random.Random(SEED), statistics.median

    def ratio(rounds: list[tuple[float, float]]) -> float:  # written's median / applied's
        return med(w for w, _ in rounds) / med(a for _, a in rounds)

    boot = sorted(ratio(rng.choices(pairs, k=len(pairs))) for _ in range(1000))  # paired rounds
    return {
        "rounds": len(pairs),
        "written": statistics.median(times[0]),
        "applied": statistics.median(times[1]),
        "ratio": ratio(pairs),
        "interval": [boot[25], boot[974]],
    }


def check_model(request: Mapping[str, Any]) -> dict[str, Any]:
    """The child's body (JSON in and out); see the module's docstring."""
    spec, trust = request["spec"], [str(t) for t in request.get("trust", [])]
    child._trusted_slots(trust)
    device = str(request.get("device", "cpu"))
    if device == "cuda" and not torch.cuda.is_available():
        why = f"torch {torch.__version__} sees no GPU here (torch.cuda.is_available() is False)"
        return {"verdict": "device-absent", "why": why}
    with warnings.catch_warnings(record=True) as said:  # the builder's notes: the output's
        warnings.simplefilter("always")
        model, args, kwargs = child._build(*child._callable(spec), device)
    built = list(dict.fromkeys(str(w.message) for w in said if w.category is UserWarning))
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        why = "its parameters are on the meta device (no real sizes on the CPU)"
        return {"verdict": "not-run", "why": why, "phases": [], "sites": [], "timing": None}
    applied = copy.deepcopy(model)
    ref = copy.deepcopy(model).double()
    try:
        report = kernel_lock.apply(applied, kernel_lock.load(request["lock"], trust=trust))
    except LockError as exc:  # the parent raises it again: a lock unusable here (exit 3)
        keys = ("problem", "path", "key", "fix", "exit_code")
        return {"verdict": "lock-error", "error": {k: getattr(exc, k) for k in keys}}
    timing_asked = bool(request.get("timing", True))
    timed = [copy.deepcopy(model), copy.deepcopy(applied)] if timing_asked else []  # before hooks
    sites = [s.where for s in report.sites if s.swapped]
    runs = [
        _Run(model, args, kwargs, sites, "as written"),
        _Run(applied, args, kwargs, sites, "applied"),
        _Run(ref, _cast(args, torch.float64), _cast(kwargs, torch.float64), sites, "in float64"),
    ]
    phases = []
    for name, values in _phases(runs, int(request.get("steps", 3))):
        try:
            phases.append(_judge(name, values()))
        except BaseException as exc:
            if _Run.blame != "lock":
                raise ModelCodeError(f"{name}, the model {_Run.blame} raised {exc!r}") from None
            problem = {"what": f"raised {exc!r}", "difference": None, "tolerance": None}
            phases.append({"phase": name, "diverging": [problem], "worst": None})
        if phases[-1]["diverging"]:
            break
    verdict = "diverging" if phases[-1]["diverging"] else "agree"
    notes = built + [f"{s.where or '<model>'}: left as written ({s.reason})" for s in report.left]
    if not timing_asked:
        notes.insert(0, NOT_TIMED)
        return {
            "verdict": verdict,
            "phases": phases,
            "sites": sites,
            "timing": None,
            "notes": notes,
        }
    try:
        timing = _timing(
            *[_Run(m, args, kwargs, [], r) for m, r in zip(timed, ("", ""), strict=True)]
        )
    except Exception as exc:  # the applied model raising in its step (its phase said so): untimed
        if verdict == "agree":
            raise
        timing = None
        notes.insert(0, f"not timed: the training step raised {type(exc).__name__}")
    return {"verdict": verdict, "phases": phases, "sites": sites, "timing": timing, "notes": notes}
