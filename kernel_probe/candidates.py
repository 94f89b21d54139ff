"""Where a candidate is declared. The registry is data: adding a kernel library is adding entries.

A candidate says which slot(s) it can fill, what it computes (its semantics), what to import, which
distribution it needs, which device types it supports, how the canonical constructor arguments map
onto its own, and its portable torch.nn twin. Everything here is plain data that crosses the process
boundary to the worker as JSON; nothing is imported until a worker builds the candidate.

Constructor arguments are templates: a string ``"$name"`` is replaced by the canonical value
``name`` (``normalized_shape``, ``hidden``, ``eps``, ``bias``, ``in_features``, ``out_features``,
``device``, ``param_dtype``); anything else is passed as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kernel_lock.lock import SEMANTICS, SLOTS

from .errors import UsageError

SLOT_SEMANTICS = {"LayerNorm": "layer_norm", "RMSNorm": "rms_norm", "Linear": "linear"}

# Canonical configuration per slot: what the lock pins unless a profile or the user says otherwise.
# RMSNorm's eps is pinned because torch.nn.RMSNorm's default (eps=None) means finfo(dtype).eps,
# which differs between fp32 and bf16, and liger defaults to 1e-6.
CANONICAL: dict[str, dict[str, Any]] = {
    "LayerNorm": {"eps": 1e-5, "bias": True},
    "RMSNorm": {"eps": 1e-6},
    "Linear": {"bias": True},
}

GPU = ("cuda", "rocm")


@dataclass(frozen=True)
class Candidate:
    id: str
    slots: tuple[str, ...]
    semantics: str
    target: str
    args: tuple[Any, ...] = ("$normalized_shape",)  # positional constructor arguments (dimensions)
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # pinned in the lock
    build_kwargs: Mapping[str, Any] = field(default_factory=dict)  # only while probing (device placement)
    distribution: str = ""  # "" = ships with torch
    specifier: str = ""
    module: str = ""
    devices: tuple[str, ...] = ()  # () = any device torch runs on
    # device type -> the GPU archs it runs on there ("gfx90a"; "sm_80+" = sm_80 or newer); a device
    # type not named here has no arch requirement
    archs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # device type -> how to install it there ("" = no build for that platform); default: pip install <distribution>
    install: Mapping[str, str] = field(default_factory=dict)
    compiled: bool = False  # torch.compile inside: expensive on CPU, JIT time reported apart
    twin_target: str = ""
    twin_kwargs: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""
    source: str = "builtin"  # builtin | entry-point:<name> | command-line | profile:<name>

    def pinned_kwargs(self, canonical: Mapping[str, Any]) -> dict[str, Any]:
        return {k: fill(v, canonical) for k, v in self.kwargs.items()}

    def pinned_twin_kwargs(self, canonical: Mapping[str, Any]) -> dict[str, Any]:
        return {k: fill(v, canonical) for k, v in self.twin_kwargs.items()}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Candidate:
        d = dict(d)
        for key in ("slots", "args", "devices"):
            d[key] = tuple(d.get(key, ()))
        d["archs"] = {k: tuple(v) for k, v in dict(d.get("archs") or {}).items()}
        return cls(**d)

    def arch_problem(self, device: str, arch: str) -> str | None:
        """Why this candidate cannot run on a ``device`` GPU of ``arch``; None when it can (or arch is unknown)."""
        wanted = tuple(self.archs.get(device, ()))
        if not wanted or not arch or any(arch_satisfies(arch, w) for w in wanted):
            return None
        return f"needs a GPU arch {' or '.join(wanted)} on {device}; this one is {arch}"

    def install_hint(self, device: str) -> str:
        """How to install the candidate's library for ``device``; '' when there is no build for it."""
        if device in self.install:
            return self.install[device]
        if self.distribution:
            return f"pip install {self.distribution}"
        return ""


def arch_satisfies(arch: str, wanted: str) -> bool:
    """``'sm_90'`` satisfies ``'sm_80+'`` and ``'sm_90'``; gfx archs match exactly (features stripped)."""
    arch = arch.split(":", 1)[0]
    if wanted.endswith("+"):
        base = wanted[:-1]
        prefix = base.rstrip("0123456789")
        tail = arch[len(prefix):].rstrip("af")  # sm_90a: arch-specific build of sm_90
        return arch.startswith(prefix) and tail.isdigit() and int(tail) >= int(base[len(prefix):])
    return arch == wanted


def fill(value: Any, canonical: Mapping[str, Any]) -> Any:
    if isinstance(value, str) and value.startswith("$"):
        return canonical[value[1:]]
    if isinstance(value, (list, tuple)):
        return type(value)(fill(v, canonical) for v in value)
    return value


_TORCH_LN = {"eps": "$eps", "elementwise_affine": True, "bias": "$bias"}
_TORCH_RMS = {"eps": "$eps", "elementwise_affine": True}
_LINEAR_ARGS = ("$in_features", "$out_features")
_LIGER = dict(distribution="liger-kernel", specifier=">=0.5", module="liger_kernel", devices=("cuda", "rocm", "xpu"))
# Transformer Engine: NVIDIA's README lists Ampere, Ada, Hopper and Blackwell (sm_80 and newer);
# the ROCm fork (github.com/ROCm/TransformerEngine, same import name) documents LayerNorm/RMSNorm on
# gfx942 and gfx950 (its README) and gfx90a (MI200, supported since its 2024 releases).
_TE = dict(distribution="transformer-engine", specifier=">=1.13", module="transformer_engine", devices=GPU,
           build_kwargs={"device": "$device"},
           archs={"cuda": ("sm_80+",), "rocm": ("gfx90a", "gfx942", "gfx950")},
           install={"cuda": "pip install --no-build-isolation transformer_engine[pytorch]",
                    "rocm": "install AMD's ROCm fork (github.com/ROCm/TransformerEngine; wheels on repo.radeon.com, "
                            "or build it): PyPI's transformer-engine is NVIDIA's, CUDA only"})  # fmt: skip
# apex is not on PyPI (PyPI's `apex` is an unrelated 2013 Pyramid toolkit): built from source
_APEX = dict(distribution="", module="apex.normalization", devices=GPU,
             note="on CPU (or while tracing) apex silently falls back to torch's layer_norm",
             install={"cuda": "build NVIDIA apex from github.com/NVIDIA/apex with its CUDA extensions "
                              "(PyPI's `apex` is an unrelated package)",
                      "rocm": "build AMD's fork from github.com/ROCm/apex (PyPI's `apex` is an unrelated package)"})  # fmt: skip

BUILTIN: tuple[Candidate, ...] = (
    # torch.nn, the defaults every other candidate must beat
    Candidate("torch.layer_norm", ("LayerNorm",), "layer_norm", "torch.nn.LayerNorm", kwargs=_TORCH_LN,
              twin_target="torch.nn.LayerNorm", twin_kwargs=_TORCH_LN),
    Candidate("torch.rms_norm", ("RMSNorm",), "rms_norm", "torch.nn.RMSNorm", kwargs=_TORCH_RMS,
              twin_target="torch.nn.RMSNorm", twin_kwargs=_TORCH_RMS),
    Candidate("torch.linear", ("Linear",), "linear", "torch.nn.Linear", args=_LINEAR_ARGS, kwargs={"bias": "$bias"},
              twin_target="torch.nn.Linear", twin_kwargs={"bias": "$bias"}),
    # torch.compile of each: kernel_lock.adapters subclasses, same parameters and state dict
    Candidate("torch.compile.layer_norm", ("LayerNorm",), "layer_norm", "kernel_lock.adapters.CompiledLayerNorm",
              kwargs=_TORCH_LN, compiled=True, twin_target="torch.nn.LayerNorm", twin_kwargs=_TORCH_LN),
    Candidate("torch.compile.rms_norm", ("RMSNorm",), "rms_norm", "kernel_lock.adapters.CompiledRMSNorm",
              kwargs=_TORCH_RMS, compiled=True, twin_target="torch.nn.RMSNorm", twin_kwargs=_TORCH_RMS),
    Candidate("torch.compile.linear", ("Linear",), "linear", "kernel_lock.adapters.CompiledLinear", args=_LINEAR_ARGS,
              kwargs={"bias": "$bias"}, compiled=True, twin_target="torch.nn.Linear", twin_kwargs={"bias": "$bias"}),
    # liger-kernel (Triton). LigerLayerNorm always has a trainable bias and defaults to eps=1e-6;
    # LigerRMSNorm's default in_place=True backward overwrites grad_output, so we pin in_place=False.
    Candidate("liger.layer_norm", ("LayerNorm",), "layer_norm", "liger_kernel.transformers.LigerLayerNorm",
              args=("$hidden",), kwargs={"eps": "$eps"}, twin_target="torch.nn.LayerNorm",
              twin_kwargs={"eps": "$eps", "elementwise_affine": True, "bias": True}, **_LIGER),
    Candidate("liger.rms_norm", ("RMSNorm",), "rms_norm", "liger_kernel.transformers.LigerRMSNorm",
              args=("$hidden",), kwargs={"eps": "$eps", "in_place": False}, twin_target="torch.nn.RMSNorm",
              twin_kwargs=_TORCH_RMS, **_LIGER),
    # NVIDIA transformer-engine: extra `_extra_state` in the state dict (dropped for the twin)
    Candidate("te.layer_norm", ("LayerNorm",), "layer_norm", "transformer_engine.pytorch.LayerNorm",
              kwargs={"eps": "$eps"}, twin_target="torch.nn.LayerNorm",
              twin_kwargs={"eps": "$eps", "elementwise_affine": True, "bias": True}, **_TE),
    Candidate("te.rms_norm", ("RMSNorm",), "rms_norm", "transformer_engine.pytorch.RMSNorm",
              kwargs={"eps": "$eps"}, twin_target="torch.nn.RMSNorm", twin_kwargs=_TORCH_RMS, **_TE),
    # TE's Linear draws its weight from N(0, 0.023) and zeroes its bias: kernel_lock.adapters.TELinear
    # is that class initialised as torch.nn.Linear is (same state dict), so a model starts the same
    Candidate("te.linear", ("Linear",), "linear", "kernel_lock.adapters.TELinear", args=_LINEAR_ARGS,
              kwargs={"bias": "$bias"}, twin_target="torch.nn.Linear", twin_kwargs={"bias": "$bias"}, **_TE),
    # NVIDIA apex (recognised by its module, not the distribution name: PyPI's `apex` is unrelated)
    Candidate("apex.layer_norm", ("LayerNorm",), "layer_norm", "apex.normalization.FusedLayerNorm",
              kwargs={"eps": "$eps", "elementwise_affine": True}, twin_target="torch.nn.LayerNorm",
              twin_kwargs={"eps": "$eps", "elementwise_affine": True, "bias": True}, **_APEX),
    Candidate("apex.rms_norm", ("RMSNorm",), "rms_norm", "apex.normalization.FusedRMSNorm",
              kwargs={"eps": "$eps", "elementwise_affine": True}, twin_target="torch.nn.RMSNorm",
              twin_kwargs=_TORCH_RMS, **_APEX),
    # flash-attn's Triton RMSNorm module (there is no LayerNorm module, only functions)
    Candidate("flash_attn.rms_norm", ("RMSNorm",), "rms_norm", "flash_attn.ops.triton.layer_norm.RMSNorm",
              args=("$hidden",), kwargs={"eps": "$eps"}, build_kwargs={"device": "$device"},
              distribution="flash-attn", specifier=">=2.5", module="flash_attn", devices=GPU,
              install={"cuda": "pip install flash-attn --no-build-isolation",
                       "rocm": "build AMD's fork from github.com/ROCm/flash-attention (PyPI's flash-attn builds "
                               "for CUDA)"},
              twin_target="torch.nn.RMSNorm", twin_kwargs=_TORCH_RMS),
    # QuACK (CuTe DSL): QuackRMSNorm subclasses torch.nn.RMSNorm; Hopper and newer (its README:
    # H100, B200/B300), NVIDIA only
    Candidate("quack.rms_norm", ("RMSNorm",), "rms_norm", "quack.rmsnorm.QuackRMSNorm",
              args=("$hidden",), kwargs={"eps": "$eps"}, build_kwargs={"device": "$device"},
              distribution="quack-kernels", specifier=">=0.1", module="quack", devices=("cuda",),
              archs={"cuda": ("sm_90+",)},
              twin_target="torch.nn.RMSNorm", twin_kwargs=_TORCH_RMS),
)  # fmt: skip


def default_for(slot: str) -> Candidate:
    return next(c for c in BUILTIN if c.slots == (slot,) and c.target.startswith("torch.nn."))


_SPEC = re.compile(r"^(?P<slot>[A-Za-z]+)=(?P<target>[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+)$")


def from_command_line(text: str) -> Candidate:
    """``SLOT=dotted.path.Class``: a third-party class offered for a slot, judged like any other.

    Its semantics are assumed to be the slot's (that is what it is offered as); the correctness
    checks then tell whether it really computes that. Its module becomes trusted in the lock.
    """
    m = _SPEC.match(text.strip())
    if not m:
        raise UsageError(f"--candidate {text!r}: expected SLOT=dotted.path.Class, e.g. LayerNorm=mylib.FastLayerNorm")
    slot, target = m.group("slot"), m.group("target")
    if slot not in SLOTS:
        close = [s for s in SLOTS if s.lower() == slot.lower()]
        raise UsageError(f"--candidate {text!r}: unknown slot {slot!r}" + (f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(SLOTS)}"))
    semantics = SLOT_SEMANTICS[slot]
    default = default_for(slot)
    if slot == "Linear":
        args, kwargs = _LINEAR_ARGS, {"bias": "$bias"}
    else:
        args, kwargs = ("$normalized_shape",), {"eps": "$eps"}
    return Candidate(
        id=f"custom:{target}",
        slots=(slot,),
        semantics=semantics,
        target=target,
        args=args,
        kwargs=kwargs,
        module=target.split(".")[0],
        twin_target=default.twin_target,
        twin_kwargs=default.twin_kwargs,
        source="command-line",
    )


def from_entry_points() -> tuple[list[Candidate], list[str]]:
    """Third-party candidates from the ``kernel_probe.candidates`` entry-point group.

    An entry point loads to a Candidate, a list of them, or a callable returning either. A broken
    plug-in is reported (second return value), never allowed to stop the probe.
    """
    from importlib.metadata import entry_points

    found: list[Candidate] = []
    problems: list[str] = []
    for ep in entry_points(group="kernel_probe.candidates"):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, Candidate):
                obj = obj()
            items = [obj] if isinstance(obj, Candidate) else list(obj)
            for item in items:
                if not isinstance(item, Candidate):
                    raise TypeError(f"expected kernel_probe.candidates.Candidate, got {type(item).__name__}")
                found.append(replace(item, source=f"entry-point:{ep.name}"))
        except Exception as exc:  # a plug-in's bug must not stop the probe; it is reported
            problems.append(f"entry point {ep.name!r} ({ep.value}): {type(exc).__name__}: {exc}")
    return found, problems


def registry(extra: Iterable[Candidate] = (), *, entry_points: bool = True) -> tuple[list[Candidate], list[str]]:
    """All candidates: built-in, plug-ins, then extras (command line, profile). Ids are unique."""
    plugins, problems = from_entry_points() if entry_points else ([], [])
    out: dict[str, Candidate] = {}
    for cand in (*BUILTIN, *plugins, *extra):
        if cand.semantics not in SEMANTICS:
            problems.append(f"candidate {cand.id}: unknown semantics {cand.semantics!r}")
            continue
        out[cand.id] = cand  # later sources override earlier ones with the same id
    return list(out.values()), problems


def for_slot(candidates: Iterable[Candidate], slot: str) -> list[Candidate]:
    return [c for c in candidates if slot in c.slots]


def canonical_for(slot: str, *, hidden: int, rows: int | None = None, out_features: int | None = None,
                  device: str = "cpu", param_dtype: str = "float32", overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every value a template may name, for one slot at one size."""
    c = dict(CANONICAL[slot])
    c.update(overrides or {})
    c.update(normalized_shape=hidden, hidden=hidden, in_features=hidden, out_features=out_features or hidden,
             device=device, param_dtype=param_dtype)  # fmt: skip
    return c
