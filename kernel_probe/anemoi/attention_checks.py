"""check-config's attention findings: each component with attention (a mapping with an
``attention_implementation`` key: the processor of a transformer model, a TransformerMapper's
encoder and decoder) judged against what anemoi-models 0.19 does with its options, and against the
lock's Attention slot.

anemoi's flash wrapper imports flash-attn v4, then v3, then v2 and passes each different arguments:
v4 gets no dropout_p, no softcap and no alibi slopes (silently), v3 no dropout_p (silently) and
raises on alibi; its SDPA path raises on softcap and alibi. A config whose options the backend it
will run drops is refused here, with anemoi's own wording where anemoi raises, before a job trains a
different model.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kernel_lock.lock import KernelLock
from kernel_lock.slots.attention import ANEMOI_ATTENTION
from kernel_lock.trust import FLASH_GENERATIONS, anemoi_flash_generation
from kernel_probe.anemoi.blocks import Finding
from kernel_probe.anemoi.config_file import mappings_where

# anemoi-models' own messages, where it raises (anemoi/models/layers/attention.py)
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


def components(tree: Any, where: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every mapping of ``tree`` with an ``attention_implementation`` key, with its dotted path."""
    return mappings_where(tree, lambda tree: "attention_implementation" in tree, where)


def _literal(value: Any) -> bool:
    return not (isinstance(value, str) and "${" in value)


def _set(component: Mapping[str, Any], key: str) -> Any:
    """The option's value where the config sets it to something that changes the maths, else
    None."""
    value = component.get(key)
    if value is None or not _literal(value):
        return None
    if key == "use_alibi_slopes":
        return True if value is True else None
    try:
        return value if float(value) > 0 else None
    except (TypeError, ValueError):
        return None


def findings(tree: Any, lock: KernelLock | None, mode: str | None = None) -> list[Finding]:
    """The attention findings of a config ``tree`` (as composed), against ``lock`` where given."""
    locked = None
    if lock is not None and "Attention" in lock.slots:
        from kernel_lock.resolve import resolve_slot

        try:
            r = resolve_slot(lock, "Attention", mode, import_classes=False)
            locked = (r.target, dict(r.kwargs))
        except Exception:  # the lock's own findings say why it cannot be resolved here
            locked = None
    out: list[Finding] = []
    for where, comp in components(tree):
        # an error against a lock that pins attention (the job would not start as locked), else a
        # warning
        out.extend(_component(where, comp, locked, lock is not None and "Attention" in lock.slots))
    return out


def _component(
    where: str, comp: Mapping[str, Any], locked: tuple[str, dict[str, Any]] | None, with_lock: bool
) -> list[Finding]:
    impl = comp.get("attention_implementation")
    if not _literal(impl):
        return []
    out: list[Finding] = []
    key = f"{where}.attention_implementation"
    softcap, alibi, dropout = (
        _set(comp, "softcap"),
        _set(comp, "use_alibi_slopes"),
        _set(comp, "dropout_p"),
    )
    if locked is not None:
        target, kwargs = locked
        want = ANEMOI_ATTENTION.get(target)
        if want is not None and impl != want:
            out.append(
                Finding(
                    "error",
                    "lock",
                    key,
                    f"the lock's Attention slot is {target} ({want}); the config runs {impl}",
                    f"set attention_implementation: {want} (`kernel-probe export` emits it)",
                )
            )
        window = comp.get("window_size")
        if _literal(window) and want is not None:
            locked_window = int(kwargs.get("window", -1))
            config_window = -1 if window is None else int(window)
            if config_window != locked_window:
                out.append(
                    Finding(
                        "error",
                        "lock",
                        f"{where}.window_size",
                        f"window_size {window!r} here, but the lock checked window {locked_window}",
                        "probe with --attention ...:window=W for the model's window, or set "
                        "the lock's",
                    )
                )
    if impl == "scaled_dot_product_attention":
        if softcap is not None:
            out.append(
                Finding(
                    "error",
                    "entry",
                    f"{where}.softcap",
                    f"anemoi raises: {SDPA_SOFTCAP}",
                    "remove softcap, or use flash_attention (v2 or v3)",
                )
            )
        if alibi is not None:
            out.append(
                Finding(
                    "error",
                    "entry",
                    f"{where}.use_alibi_slopes",
                    f"anemoi raises: {SDPA_ALIBI}",
                    "disable alibi slopes, or use flash-attn v2",
                )
            )
        return out
    if impl != "flash_attention":
        return out
    here = anemoi_flash_generation()
    if here is None:
        out.append(
            Finding(
                "error" if with_lock else "warning",
                "import",
                key,
                f"flash-attn is not importable here; anemoi would raise: {NOT_INSTALLED}",
                "install flash-attn (v2, v3 or v4), or use scaled_dot_product_attention here",
            )
        )
    # the lock's generation where it pins one (the job-start check holds the machine to it), else
    # what anemoi's import order picks here
    generation = next(
        (g for g, _, t in FLASH_GENERATIONS if locked is not None and t == locked[0]), here
    )
    if generation is None:
        return out
    dropped = {4: ("dropout_p", "softcap", "use_alibi_slopes"), 3: ("dropout_p",), 2: ()}[
        generation
    ]
    values = {"dropout_p": dropout, "softcap": softcap, "use_alibi_slopes": alibi}
    for option in dropped:
        if values[option] is not None:
            out.append(
                Finding(
                    "error",
                    "entry",
                    f"{where}.{option}",
                    f"{option}={values[option]!r} is silently dropped: anemoi passes it no "
                    f"{option} with flash-attn v{generation}",
                    "remove it, or run flash-attn v2 (the lock's generation decides; "
                    "`kernel-probe --attention ...` checks it)",
                )
            )
    if generation == 3 and alibi is not None:
        out.append(
            Finding(
                "error",
                "entry",
                f"{where}.use_alibi_slopes",
                f"anemoi raises with flash-attn v3: {V3_ALIBI}",
                "disable alibi slopes, or run flash-attn v2",
            )
        )
    return out
