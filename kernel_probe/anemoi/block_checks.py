"""Checks of a whole block: what Hydra's merge left behind, the lock comparison, and anemoi wrappers
a config drops.

These run in the parent on the blocks as read (``kernel_probe.anemoi.reading``) and on the facts the
child found about each entry (``kernel_probe.anemoi.entry_checks``); nothing here imports a target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernel_lock.anemoi import ANEMOI_DEFAULTS
from kernel_probe.anemoi.blocks import Block, Config, Finding, find_blocks
from kernel_probe.anemoi.config_file import load_config
from kernel_probe.anemoi.entry_checks import NORM_KEYS
from kernel_probe.anemoi.schema_check import packaged_dir
from kernel_probe.errors import InputFileError

# ---- components that no block reaches ------------------------------------------------------------
# the anemoi-models modules whose classes call load_layer_kernels(layer_kernels) in their
# constructor (anemoi-models 0.19.0: the processors, the mappers, the ensemble's noise injector): a
# node of one of them without a layer_kernels key is built with torch.nn's defaults
COMPONENT_MODULES = (
    "anemoi.models.layers.processor",
    "anemoi.models.layers.mapper",
    "anemoi.models.layers.ensemble",
)


def components_without_blocks(config: Config, *, lock_given: bool) -> list[Finding]:
    """Every component anemoi instantiates with a ``layer_kernels`` argument (a processor, each
    encoder and decoder mapper, the other mappers and the noise injector) whose node has no block:
    anemoi builds it with its defaults (torch.nn's Linear, LayerNorm, GELU), which a lock's kernels
    never reach (an error then, exit 3; a warning without a lock)."""
    tree = config.tree
    if not isinstance(tree, Mapping):
        return []
    model = tree if config.shape == "model-file" and not config.composed else tree.get("model")
    out: list[Finding] = []
    for where, node in _components(model, "model"):
        if "layer_kernels" in node:
            continue
        target = str(node["_target_"])
        defaults = ", ".join(f"{k}: {v['_target_']}" for k, v in ANEMOI_DEFAULTS.items())
        out.append(
            Finding(
                "error" if lock_given else "warning",
                "lock" if lock_given else "entry",
                f"{where}.layer_kernels",
                f"{target.rpartition('.')[2]} at {where} has no layer_kernels block: anemoi "
                "builds it with its "
                f"defaults ({defaults})" + (", not the lock's kernels" if lock_given else ""),
                f"add `layer_kernels: ${{model.layer_kernels}}` to {where}, as the other "
                "components have",
            )
        )
    return out


def _components(node: Any, where: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(path, node) of every node under ``node`` whose ``_target_`` is a class of
    ``COMPONENT_MODULES``."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    if isinstance(node, Mapping):
        target = node.get("_target_")
        if isinstance(target, str) and target.rpartition(".")[0] in COMPONENT_MODULES:
            found.append((where, node))
        for key, value in node.items():
            if key != "layer_kernels":
                found.extend(_components(value, f"{where}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_components(value, f"{where}.{i}"))
    return found


# ---- what Hydra's merge left behind --------------------------------------------------------------
def merge_leftovers(block: Block) -> list[Finding]:
    """Entries the user's overlay replaces (it sets ``_target_``) where Hydra kept the preset's
    other keys: Hydra merges mappings key by key, so the old class's kwargs land on the new
    class."""
    out = []
    for key, mine in (block.written or {}).items():
        if not isinstance(mine, Mapping) or "_target_" not in mine:
            continue  # an interpolation replaces the entry whole; a partial entry merges on purpose
        composed = (block.content or {}).get(key)
        if not isinstance(composed, Mapping):
            continue
        left = [k for k in composed if k not in mine]
        if left:
            out.append(
                Finding(
                    "error",
                    "merge",
                    f"{block.where}.{key}",
                    f"Hydra merged this entry into the preset's: {', '.join(map(str, left))} come "
                    f"from the preset, not from this file, and are passed to {mine['_target_']}",
                    "set the entry through an interpolation so that Hydra replaces it whole (what "
                    "`kernel-probe export --config` prints), or delete the keys with `~` overrides",
                )
            )
    return out


# ---- the lock comparison -------------------------------------------------------------------------
_MISSING = object()


def compare_with_lock(
    block: Block, expected: Mapping[str, Any], facts: Mapping[str, Mapping[str, Any]]
) -> list[Finding]:
    """Where ``block`` builds something other than what the lock pins, for each key the lock
    exports.

    ``expected[key]`` is the lock's ``Exported`` entry; what the block should hold follows anemoi's
    wrapper rule (``kernel_lock.anemoi.entry_for``): AutocastLayerNorm agrees with a torch.nn lock,
    ConditionalLayerNorm is a different layer. ``facts[key]`` are the child's facts about the entry
    the block uses for that key (its own, or anemoi's default).
    """
    from kernel_lock.anemoi import ConventionError, entry_for

    content = block.content or {}
    out = []
    for key, want in expected.items():
        have = content.get(key, ANEMOI_DEFAULTS[key])
        if not isinstance(have, Mapping) or not isinstance(have.get("_target_"), str):
            continue  # already an error of the entry itself
        label = f"{block.where}.{key}" + ("" if key in content else " (not set: anemoi's default)")
        try:
            should = entry_for(key, want, have, where=label)
        except ConventionError as exc:
            out.append(Finding("error", "lock", label, exc.problem, exc.fix or ""))
            continue
        if should is None:
            out.append(
                Finding(
                    "note",
                    "lock",
                    label,
                    f"{have['_target_']} is a different layer (not a kernel choice); "
                    "the lock does not cover it, so it stays",
                )
            )
            continue
        if have["_target_"] != should.entry["_target_"]:
            out.append(
                Finding(
                    "error",
                    "lock",
                    label,
                    f"builds {have['_target_']}, the lock pins {should.entry['_target_']}"
                    + (f" ({should.note})" if should.note else ""),
                    "use the lock's entries (`kernel-probe export LOCK --config THIS_CONFIG` "
                    "prints them for this config), or re-probe",
                )
            )
            continue
        if should.entry["_target_"] != want.entry["_target_"]:
            out.append(Finding("note", "lock", label, should.note))
        defaults = facts.get(key, {}).get("defaults", {})
        for name, value in should.entry.items():
            if name == "_target_":
                continue
            got = have.get(name, defaults.get(name, _MISSING))
            if got is _MISSING or not _same(got, value):
                shown = "not set" if name not in have else repr(got)
                out.append(
                    Finding(
                        "error",
                        "lock",
                        f"{label}.{name}",
                        f"{name} is {shown}"
                        + (
                            f" (default {got!r})"
                            if name not in have and got is not _MISSING
                            else ""
                        )
                        + f", the lock pins {value!r}",
                        f"set `{name}: {_yaml_scalar(value)}`",
                    )
                )
    return out


def _yaml_scalar(value: Any) -> str:
    import json

    return json.dumps(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


# ---- anemoi wrappers a config drops --------------------------------------------------------------
def _effective(blocks: Sequence[Block]) -> dict[str, Mapping[str, Any]]:
    """Block path -> the entries it uses (an inheriting block: its parent's)."""
    own = {b.where: b.content for b in blocks if b.content is not None}
    out: dict[str, Mapping[str, Any]] = {}
    for b in blocks:
        seen, node = {b.where}, b
        while node.content is None and node.inherits and node.inherits not in seen:
            seen.add(node.inherits)
            node = next(
                (x for x in blocks if x.where == node.inherits), Block(node.inherits, content={})
            )
        out[b.where] = node.content if node.content is not None else own.get(b.where, {})
    return out


def preset_file(config: Config) -> tuple[str, Path] | None:
    """(name, path) of the model preset the config replaces entries of: the ``model`` choice (found
    as Hydra would, the config's own directory first, then anemoi-training's packaged presets), or
    for a model file named like a packaged preset, that preset."""
    packaged = packaged_dir()
    here = Path(config.path).resolve().parent
    name = config.choices.get("model", "")
    if name:
        for d in (here / "model", packaged / "model" if packaged else None):
            if (
                d is not None
                and (d / f"{name}.yaml").is_file()
                and (d / f"{name}.yaml") != Path(config.path).resolve()
            ):
                return name, d / f"{name}.yaml"
        return None
    if config.shape == "model-file" and packaged is not None:
        p = packaged / "model" / f"{Path(config.path).stem}.yaml"
        if p.is_file() and p.resolve() != Path(config.path).resolve():
            return p.stem, p
    return None


def lost_wrappers(config: Config) -> list[Finding]:
    """A warning where the preset runs a norm inside one of anemoi's same-kernel wrappers
    (AutocastLayerNorm: the output cast back to the input dtype) and this config replaces it with a
    class that does not keep that behaviour (a plain LayerNorm)."""
    from kernel_lock.anemoi import wrapper_of

    found = preset_file(config)
    if found is None:
        return []
    name, path = found
    try:
        preset = find_blocks(load_config(path), "model-file")
    except InputFileError:
        return []
    theirs = _effective(preset.blocks)
    mine = _effective(config.blocks)
    own = {b.where for b in config.blocks if b.content is not None}
    out = []
    for where, entries in mine.items():
        if where not in theirs or where not in own:
            continue  # an inheriting block is reported where its entries are set
        for key in NORM_KEYS:
            before = theirs[where].get(key, ANEMOI_DEFAULTS[key])
            after = entries.get(key, ANEMOI_DEFAULTS[key])
            old = before.get("_target_") if isinstance(before, Mapping) else None
            new = after.get("_target_") if isinstance(after, Mapping) else None
            if not isinstance(old, str) or not isinstance(new, str) or old == new:
                continue
            wrapper = wrapper_of(old)
            if wrapper is None or wrapper.runs is None or wrapper_of(new) is not None:
                continue
            short = wrapper.target.rpartition(".")[2]
            out.append(
                Finding(
                    "warning",
                    "wrapper",
                    f"{where}.{key}",
                    f"the {name} preset uses anemoi's {short} here, which {wrapper.behaviour}; "
                    f"this config replaces it with {new}, which does not: the cast-back is lost",
                    "keep the cast around your kernel: `kernel-probe export LOCK --config "
                    f"{Path(config.path).name}` prints the adapter that does it "
                    f"(kernel_lock.adapters.{wrapper.adapter_prefix}__...), or keep {short}",
                )
            )
    return out
