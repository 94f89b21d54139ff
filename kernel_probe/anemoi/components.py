"""check-config's findings and export's settings for the slots a component sets beside its blocks,
judged as anemoi-models 0.19 does (in its words where it raises) and against the lock:
``attention_implementation`` (Attention), ``graph_attention_backend`` (the lock's
``[graph-attention]``; every GraphTransformer component) and ``mlp_implementation`` (GatedMLP)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kernel_lock.anemoi import attention_export
from kernel_lock.graph_attention import ANEMOI_KEY, BACKENDS, TABLE, fallback_cause
from kernel_lock.lock import KernelLock
from kernel_lock.resolve import resolve_slot
from kernel_lock.slots.attention import ANEMOI_ATTENTION
from kernel_lock.slots.gated_mlp import CONFIG_KEY, GATED, MLP_IMPLEMENTATIONS
from kernel_lock.trust import FLASH_GENERATIONS, anemoi_flash_generation
from kernel_probe.anemoi.config import Finding, mappings_where

# anemoi-models' own messages, where it raises (layers/attention.py, layers/mlp.py)
SDPA_SOFTCAP = (
    "Softcap not supported by Pytorchs SDPA. please switch to flash attention or disable softcap."
)
SDPA_ALIBI = (
    "Alibi slopes not supported by Pytorchs SDPA. please switch to flash attention v2 or disable "
    "alibi slopes."
)
V3_ALIBI = (
    "Alibi slopes is currently not supported by flash attention v3. please switch to flash "
    "attention v2 or disable alibi slopes."
)
NOT_INSTALLED = (
    "Flash attention is not installed. Please install flash attention v4, v3 or v2 to use this "
    "attention implementation."
)
SDPA_REFUSES = {  # option -> anemoi's refusal, and the fix
    "softcap": (SDPA_SOFTCAP, "remove softcap, or use flash_attention (v2 or v3)"),
    "use_alibi_slopes": (SDPA_ALIBI, "disable alibi slopes, or use flash-attn v2"),
}
ANEMOI_INVALID = "`mlp_implementation` must be one of {valid}, got '{got}'."
GT_TARGETS = (
    "anemoi.models.layers.processor.GraphTransformerProcessor",
    "anemoi.models.layers.mapper.GraphTransformerForwardMapper",
    "anemoi.models.layers.mapper.GraphTransformerBackwardMapper",
)
DEFAULT_BACKEND = "triton"  # anemoi-models' default, in code and in every YAML
FLASH_DROPS = {4: ("dropout_p", "softcap", "use_alibi_slopes"), 3: ("dropout_p",), 2: ()}


def _literal(value: Any) -> bool:
    return not (isinstance(value, str) and "${" in value)


# ---- Attention -----------------------------------------------------------------------------------
def _set(component: Mapping[str, Any], key: str) -> Any:
    """The option's value where the config sets it to something that changes the maths."""
    value = component.get(key)
    if value is None or not _literal(value):
        return None
    if key == "use_alibi_slopes":
        return True if value is True else None
    try:
        return value if float(value) > 0 else None
    except (TypeError, ValueError):
        return None


def attention_findings(
    tree: Any, lock: KernelLock | None, mode: str | None = None
) -> list[Finding]:
    """The attention findings of a config ``tree`` (as composed), against ``lock`` where given."""
    pinned = lock is not None and "Attention" in lock.slots
    locked = None
    if pinned:
        try:
            r = resolve_slot(lock, "Attention", mode, import_classes=False)
            locked = (r.target, dict(r.kwargs))
        except Exception:  # the lock's own findings say why it cannot be resolved here
            locked = None
    out: list[Finding] = []
    for where, comp in mappings_where(tree, lambda m: "attention_implementation" in m):
        if _literal(comp.get("attention_implementation")):
            out.extend(_attention(where, comp, locked, pinned))
    return out


def _attention(
    where: str, comp: Mapping[str, Any], locked: tuple[str, dict[str, Any]] | None, pinned: bool
) -> list[Finding]:
    impl = comp.get("attention_implementation")
    key = f"{where}.attention_implementation"
    out = []
    target, kwargs = locked if locked is not None else ("", {})
    want = ANEMOI_ATTENTION.get(target)
    if want is not None and impl != want:
        problem = f"the lock's Attention slot is {target} ({want}); the config runs {impl}"
        fix = f"set attention_implementation: {want} (`kernel-probe export` emits it)"
        out.append(Finding("error", "lock", key, problem, fix))
    window = comp.get("window_size")
    if _literal(window) and want is not None:
        locked_window = int(kwargs.get("window", -1))
        if (-1 if window is None else int(window)) != locked_window:
            problem = f"window_size {window!r} here, but the lock checked window {locked_window}"
            fix = "probe with --attention ...:window=W for the model's window, or set the lock's"
            out.append(Finding("error", "lock", f"{where}.window_size", problem, fix))
    values = {o: _set(comp, o) for o in ("dropout_p", "softcap", "use_alibi_slopes")}
    alibi = values["use_alibi_slopes"]
    if impl == "scaled_dot_product_attention":
        for option, (raises, fix) in SDPA_REFUSES.items():
            if values[option] is not None:
                problem = f"anemoi raises: {raises}"
                out.append(Finding("error", "entry", f"{where}.{option}", problem, fix))
        return out
    if impl != "flash_attention":
        return out
    here = anemoi_flash_generation()
    if here is None:
        problem = f"flash-attn is not importable here; anemoi would raise: {NOT_INSTALLED}"
        fix = "install flash-attn (v2, v3 or v4), or use scaled_dot_product_attention here"
        out.append(Finding("error" if pinned else "warning", "import", key, problem, fix))
    # the lock's generation where it pins one (the job-start check holds the machine to it), else
    # what anemoi's import order picks here
    generation = next(
        (g for g, _, t in FLASH_GENERATIONS if locked is not None and t == locked[0]), here
    )
    if generation is None:
        return out
    fix = (
        "remove it, or run flash-attn v2 (the lock's generation decides; `kernel-probe --attention "
        "...` checks it)"
    )
    for option in (o for o in FLASH_DROPS[generation] if values[o] is not None):
        problem = (
            f"{option}={values[option]!r} is silently dropped: anemoi passes it no {option} with "
            f"flash-attn v{generation}"
        )
        out.append(Finding("error", "entry", f"{where}.{option}", problem, fix))
    if generation == 3 and alibi is not None:
        problem = f"anemoi raises with flash-attn v3: {V3_ALIBI}"
        fix = "disable alibi slopes, or run flash-attn v2"
        out.append(Finding("error", "entry", f"{where}.use_alibi_slopes", problem, fix))
    return out


def attention_overlay(
    tree: Any, lock: KernelLock, mode: str | None = None
) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]:
    """``export --config``'s attention: per component path, the lock's ``attention_implementation``;
    notes. The model's own options (``window_size``, ...) are never written, only noted."""
    exported = attention_export(lock, mode)
    if exported is None:
        return {}, []
    options, note = exported
    out: dict[str, dict[str, Any]] = {}
    notes: list[tuple[str, str]] = []
    for where, comp in mappings_where(tree, lambda m: "attention_implementation" in m):
        if not options:
            notes.append((f"{where}.attention_implementation", note))
            continue
        out[where] = {"attention_implementation": options["attention_implementation"]}
        if note:
            notes.append((f"{where}.attention_implementation", note))
        window, checked = comp.get("window_size"), options.get("window_size", -1)
        if _literal(window) and (-1 if window is None else int(window)) != checked:
            said = f"left at {window!r}: the lock checked window {checked}; probe with the model's "
            notes.append((f"{where}.window_size", said + "window (--attention ...:window=W)"))
    return out, notes


# ---- graph attention -----------------------------------------------------------------------------
def graph_components(tree: Any, where: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every GraphTransformer component of ``tree`` (``GT_TARGETS``, or setting the key)."""
    return mappings_where(
        tree, lambda tree: tree.get("_target_") in GT_TARGETS or ANEMOI_KEY in tree, where
    )


def graph_findings(
    tree: Any, lock: KernelLock | None, current: Mapping[str, Any] | None = None
) -> list[Finding]:
    """Every component's ``graph_attention_backend``: a value anemoi rejects, or that contradicts
    the lock (errors); a ``triton`` run here as ``pyg`` (a warning: anemoi only logs it)."""
    graph = lock.graph_attention if lock is not None else None
    if current is None:
        from kernel_lock import torchless  # reason: reads this machine (may import torch)

        current = torchless.for_check(["device-type"])
    out: list[Finding] = []
    for where, comp in graph_components(tree):
        value = comp.get(ANEMOI_KEY, DEFAULT_BACKEND)
        if not _literal(value):
            continue
        value = str(value)
        key = f"{where}.{ANEMOI_KEY}"
        unset = "" if ANEMOI_KEY in comp else f" (not set: anemoi's default {DEFAULT_BACKEND})"
        if value not in BACKENDS:
            # anemoi's own assertion message (layers/block.py)
            problem = f"anemoi raises: Backend '{value}' not supported for GraphTransformerBlock, "
            problem += "valid options are 'triton' and 'pyg'"
            out.append(Finding("error", "entry", key, problem, "set triton or pyg"))
        elif graph is not None and value != graph.backend:
            problem = f"{value}{unset} here, but the lock's [{TABLE}] backend is {graph.backend}"
            fix = (
                f"set {ANEMOI_KEY}: {graph.backend} (`kernel-probe export --config` writes it), or "
                f"probe with --graph-attention {value}"
            )
            out.append(Finding("error", "lock", key, problem, fix))
        elif (
            value == "triton"
            and (cause := fallback_cause(current)) is not None
            and (graph is None or graph.allow_fallback)
        ):
            allowed = " (the lock allows it)" if graph is not None else ""
            problem = f"triton{unset}, but anemoi falls back to pyg here: {cause}{allowed}"
            fix = "run on a GPU node with triton installed, or set pyg to say what runs"
            out.append(Finding("warning" if graph is None else "note", "import", key, problem, fix))
    return out


def export_setting(lock: KernelLock) -> tuple[str, str] | None:
    """``(backend, note)`` export sets on each GraphTransformer component (None: anemoi's stays)."""
    graph = lock.graph_attention
    if graph is None:
        return None
    note = f"from the lock's [{TABLE}]" + (f": {graph.reason}" if graph.reason else "")
    if graph.allow_fallback:
        note += "; where there is no GPU or no triton anemoi runs pyg (the lock allows it)"
    return graph.backend, note


def overlay_settings(tree: Any, lock: KernelLock, *, model_file: bool) -> dict[str, str]:
    """Component path relative to the model node (``encoders.0.mapper``) -> the backend to set
    there; ``model_file``: ``tree`` is the model node, else the whole config."""
    setting = export_setting(lock)
    if setting is None:
        return {}
    out = {}
    for where, _ in graph_components(tree):
        if not model_file:
            where = where.removeprefix("model.") if where.startswith("model.") else ""
        if where and "[" not in where:
            out[where] = setting[0]
    return out


# ---- GatedMLP ------------------------------------------------------------------------------------
def gated_components(tree: Any, where: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every mapping of ``tree`` with an ``mlp_implementation`` key, with its dotted path."""
    return mappings_where(tree, lambda tree: CONFIG_KEY in tree, where)


def gated_findings(tree: Any, lock: KernelLock | None) -> list[Finding]:
    """The gated-MLP findings of a config ``tree`` (as composed), against ``lock`` where given."""
    locked = lock.slots.get("GatedMLP") if lock is not None else None
    want = locked.kwargs.get(CONFIG_KEY) if locked is not None else None
    out: list[Finding] = []
    for where, comp in gated_components(tree):
        value = comp.get(CONFIG_KEY)
        key = f"{where}.{CONFIG_KEY}" if where else CONFIG_KEY
        if not _literal(value):
            continue  # an interpolation: judged where it points
        if value not in MLP_IMPLEMENTATIONS:
            valid = "('" + "', '".join(GATED) + "')"
            problem = f"anemoi raises: {ANEMOI_INVALID.format(valid=valid, got=value)}"
            fix = f"use one of {', '.join(MLP_IMPLEMENTATIONS)}"
            out.append(Finding("error", "entry", key, problem, fix))
        elif locked is not None and value != want:
            mlp = value == "mlp"
            builds = "a Linear and the Activation slot (mlp), no gated layer" if mlp else value
            gate = locked.extra["gate"]
            problem = f"the lock's GatedMLP slot checked {want} ({gate}); this component "
            probe = "without --mlp-implementation" if mlp else f"with --mlp-implementation {value}"
            fix = f"set {CONFIG_KEY}: {want} (`kernel-probe export --config` writes it), or probe "
            out.append(Finding("error", "lock", key, f"{problem}builds {builds}", fix + probe))
        elif lock is not None and locked is None and value in GATED:
            problem = (
                f"{value} builds anemoi's GatedMLPLayer, and the lock pins no GatedMLP slot: "
                "nothing checked it"
            )
            fix = f"probe with --mlp-implementation {value}"
            out.append(Finding("warning", "lock", key, problem, fix))
    return out
