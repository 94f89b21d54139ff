"""A probe for a model (``--model SPEC``): its trace (``kernel_probe.model.trace``, run in a child)
read slot by slot (``Slot.use``) into what planning needs; a site a slot cannot cover is named. No
torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernel_lock.model import Model
from kernel_probe import slots as slot_behaviour
from kernel_probe.candidates import default_for
from kernel_probe.errors import ProbeError, UsageError
from kernel_probe.slots import Use

if TYPE_CHECKING:
    from kernel_probe.probe.planning import ProbeRequest

__all__ = ["FLAG", "Traced", "for_request", "refuse", "trace", "traced"]

FLAG = "--model"


def trace(spec: str, precision: str) -> Model:
    """The model's trace at ``precision`` (``kernel_probe.model.trace``)."""
    # reason: the tracer (its child launcher, its spec parser) is loaded only with --model
    tracer = importlib.import_module("kernel_probe.model")
    model: Model = tracer.trace(spec, precision=precision)
    return model


def for_request(
    request: ProbeRequest, precision: str, note: Callable[[str], None]
) -> Traced | None:
    """The trace of ``request.model`` at ``precision`` as the probe uses it (None: no --model)."""
    if not request.model:
        return None
    result = traced(trace(request.model, precision), request.slots, note)
    for flag, forced in (("--pin", request.pins), ("--prefer", request.prefers)):
        for name, cid in forced.items():
            if name not in result.slots:
                raise UsageError(
                    f"{flag} {name}={cid}: the model {request.model} makes no {name} call the "
                    "probe can check",
                    fix=f"drop {flag} {name}={cid} (`kernel-probe model SPEC` shows its calls)",
                )
    return result


def refuse(request: ProbeRequest) -> None:
    """With --model, what only the model says: its shapes and each slot's declaration (exit 2)."""
    if not request.model:
        if not request.model_check:
            raise UsageError(
                "--no-model-check without --model: only a probe for a model checks the model",
                fix="drop --no-model-check (or probe for a model with --model SPEC)",
            )
        return
    if request.shapes:
        raise UsageError(
            f"--shape with {FLAG}: each slot is timed at the model's own shapes",
            fix=f"drop --shape (or drop {FLAG} to time every slot at the --shape list)",
        )
    for name, declared in request.declared.items():
        option = slot_behaviour.slot(name).option
        if declared and option is not None:
            raise UsageError(
                f"{option.flag} with {FLAG}: the model's trace says its {name}",
                fix=f"drop {option.flag} (`kernel-probe model SPEC` shows what the trace found)",
            )


@dataclass(frozen=True)
class Traced:
    """A model's trace and, per slot it calls (in the slots' order), how the probe uses it."""

    model: Model
    uses: Mapping[str, Use]

    @property
    def slots(self) -> tuple[str, ...]:
        """The slots probed: those with a covered site."""
        return tuple(name for name, use in self.uses.items() if use.weights)

    @property
    def shapes(self) -> tuple[str, ...]:
        """Every shape timed at that a --shape says (ROWSxHIDDEN, ROWSxINxOUT), each once: those
        of the slots timed at the probe's shapes (not those with their own, ``Slot.shapes``)."""
        own = [n for n in self.slots if slot_behaviour.slot(n).shapes("", "cpu", ())]
        return tuple(
            dict.fromkeys(s for n in self.slots if n not in own for s in self.uses[n].shapes)
        )

    def plan_fields(self) -> dict[str, Any]:
        """The plan's fields from the trace: the model, per slot probed the semantics checked and
        pinned, its shapes and weights (shape -> calls per forward), and the sites not covered."""
        uses = {name: self.uses[name] for name in self.slots}
        return {
            "model": self.model,
            "canonical": {name: dict(u.canonical) for name, u in uses.items() if u.canonical},
            "timed_at": {name: u.shapes for name, u in uses.items()},
            "weights": {name: dict(u.weights) for name, u in uses.items()},
            "not_covered": self.not_covered,
        }

    @property
    def not_covered(self) -> tuple[str, ...]:
        """Each site left as the model has it: "SLOT WHERE: why" (``<model>``: the root)."""
        return tuple(
            f"{name} {where or '<model>'}: {why}"
            for name, use in self.uses.items()
            for where, why in use.uncovered
        )


def _reference(name: str) -> Callable[[Mapping[str, Any]], str]:
    """Why the check's reference (the slot's default class) cannot compute a site's semantics:
    its declaration pins another value of them; "" where it can."""
    default = default_for(name)
    said = "the check's reference cannot compute it: "

    def refuse(values: Mapping[str, Any]) -> str:
        why = slot_behaviour.slot(name).contradiction(default, values)
        return said + why if why else ""

    return refuse


def traced(
    model: Model, asked: Sequence[str], note: Callable[[str], None] = lambda _: None
) -> Traced:
    """How the probe uses ``model``'s trace: per slot it calls (``asked``: only these; one it does
    not call is an error, exit 2), and what it cannot probe, told to ``note``."""
    by_slot = model.by_slot()
    known = slot_behaviour.SLOTS
    for name in asked:
        if name not in by_slot:
            raise UsageError(
                f"--slot {name}: the model {model.spec} makes no {name} call",
                fix=f"drop --slot {name}; the model calls {', '.join(by_slot) or 'no slot'}",
            )
    uses: dict[str, Use] = {}
    for name in (n for n in known if n in by_slot and (not asked or n in asked)):
        try:
            uses[name] = known[name].use(by_slot[name], _reference(name))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProbeError(
                f"{FLAG} {model.spec}: the trace's {name} sites cannot be read: {exc!r}",
                fix="report it with the output of `kernel-probe model SPEC --json`",
            ) from None
    result = Traced(model, uses)
    spec = f"model {model.spec}"
    if unknown := [n for n in by_slot if n not in known]:
        note(f"{spec}: calls {', '.join(unknown)}, no slot of this kernel-probe: not probed")
    if idle := [n for n in known if n not in by_slot and not asked]:
        note(f"{spec}: makes no call of {', '.join(idle)}: not probed")
    for line in result.not_covered:
        note(f"{spec}: not covered (left as the model has it): {line}")
    for u in model.unreached:
        note(f"{spec}: out of reach: {u.where or '<model>'} ({u.call}): {u.reason}")
    if not result.slots:
        raise ProbeError(
            f"{FLAG} {model.spec}: no call of the model is one a slot can check and pin",
            fix="`kernel-probe model SPEC` shows each call site and why",
        )
    return result
