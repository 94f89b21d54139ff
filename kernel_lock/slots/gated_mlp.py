"""The GatedMLP slot: anemoi's ``GatedMLPLayer`` and the gate each
``mlp_implementation`` hard-codes; the lock records both. Probed only when asked."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from ..tables import ReadError, get
from .base import Param, SlotKey, SlotSpec, TargetFacts

__all__ = [
    "CONFIG_KEY",
    "GATED",
    "GATED_MLP",
    "GATES",
    "MLP_IMPLEMENTATIONS",
    "formula",
    "gate_for",
]

# anemoi's MLPImplementation literal (schemas/common_components.py), "mlp" first: not gated
MLP_IMPLEMENTATIONS = ("mlp", "glu", "swiglu", "geglu", "reglu")
CONFIG_KEY = "mlp_implementation"  # the key in anemoi's processor, encoder and decoder configs


class Gate(NamedTuple):
    """One gated variant: the gate function's name and the torch.nn module anemoi builds."""

    function: str
    anemoi_module: str

    @property
    def formula(self) -> str:
        """The layer's formula, ``silu(gate_proj(x)) * value_proj(x)``."""
        return f"{self.function}(gate_proj(x)) * value_proj(x)"


# mlp_implementation -> its gate. geglu's is torch.nn.GELU(): erf, not liger's and TE's tanh
GATES: Mapping[str, Gate] = MappingProxyType(
    {
        "glu": Gate("sigmoid", "torch.nn.Sigmoid"),
        "swiglu": Gate("silu", "torch.nn.SiLU"),
        "geglu": Gate("gelu_erf", "torch.nn.GELU"),
        "reglu": Gate("relu", "torch.nn.ReLU"),
    }
)
GATED = tuple(GATES)


def gate_for(mlp_implementation: str) -> Gate:
    """The gate of a gated ``mlp_implementation``; ValueError naming the choices for any other."""
    if mlp_implementation not in GATES:
        raise ValueError(
            f"mlp_implementation {mlp_implementation!r} is not a gated MLP: use one of "
            f"{', '.join(GATED)}"
            + (
                " ('mlp' has no gate: its Linear and Activation are their own slots)"
                if mlp_implementation == "mlp"
                else ""
            )
        )
    return GATES[mlp_implementation]


def formula(mlp_implementation: str) -> str:
    """``swiglu`` -> ``silu(gate_proj(x)) * value_proj(x)``."""
    return gate_for(mlp_implementation).formula


def _read_gate(ctx: Any, d: Mapping[str, Any], key: str) -> str:
    """The pinned ``mlp_implementation``'s formula: both required, and agreeing."""
    gate = get(d, key, str, default="")
    kwargs = d.get("kwargs")
    implementation = kwargs.get("mlp_implementation") if isinstance(kwargs, Mapping) else None
    if implementation not in GATED:
        raise ReadError(
            f"mlp_implementation {implementation!r} is not a gated MLP",
            "kwargs.mlp_implementation",
            fix=f"pin one of {', '.join(GATED)} (anemoi's 'mlp' has no GatedMLP layer)",
        )
    want = formula(implementation)
    if gate != want:
        raise ReadError(
            f"{gate!r} is not what mlp_implementation {implementation!r} computes ({want!r})"
            if gate
            else "missing",
            key,
            fix=f'write gate = "{want}", or pin the mlp_implementation whose formula this is',
        )
    return str(gate)


def _derive_gate(kwargs: Mapping[str, Any]) -> str:
    """The gate the pinned kwargs compute: recomputed wherever kwargs change (a twin's)."""
    return formula(str(kwargs.get(CONFIG_KEY)))


def _computes(target: str, kwargs: Mapping[str, Any], cls: type | None) -> dict[str, str] | None:
    """The gate a kernel_lock.gated_mlp class computes; None for another class."""
    known = target in GATED_MLP.known_targets or any(
        f"{c.__module__}.{c.__qualname__}" == _BASE for c in getattr(cls, "__mro__", ())
    )
    if not known:
        return None
    implementation = kwargs.get(CONFIG_KEY)
    if implementation in GATES:
        return {"gate": formula(str(implementation))}
    return {"gate": f"none ({CONFIG_KEY} {implementation!r} is no gated MLP)"}


def _declares(slot: Any) -> dict[str, tuple[str, ...]]:
    return {"gate": (str(slot.extra.get("gate", "")),)}


def _refuse_gate(slot: str, d: Mapping[str, Any]) -> None:
    if get(d, "gate", str, default=""):
        raise ReadError(
            f"only the GatedMLP slot records a gate formula, not {slot}", "gate", fix="remove it"
        )


_BASE = "kernel_lock.gated_mlp.GatedMLP"
_PARAMS = frozenset(
    ("in_features", "out_features", "mlp_implementation", "bias", "device", "dtype")
)

GATED_MLP = SlotSpec(
    name="GatedMLP",
    semantics="gated_mlp",
    # anemoi's GatedMLPLayer with torch.nn.Linear: torch's gate functions
    default_target="kernel_lock.gated_mlp.GatedMLP",
    canonical={"mlp_implementation": "swiglu", "bias": True},
    call_args=("$in_features", "$out_features"),
    call_kwargs={"mlp_implementation": "$mlp_implementation", "bias": "$bias"},
    known_targets={
        f"kernel_lock.gated_mlp.{name}": TargetFacts("gated_mlp", _PARAMS, True)
        for name in ("GatedMLP", "CompiledGatedMLP", "LigerGatedMLP")
    },
    computed_by=(_BASE,),
    by_default=False,  # a model has it only with a gated mlp_implementation
    keys=(SlotKey("gate", _read_gate, _refuse_gate, after="devices", derive=_derive_gate),),
    params={"mlp_implementation": Param(str, choices=MLP_IMPLEMENTATIONS), "bias": Param(bool)},
    computes=_computes,
    declares=_declares,
)
