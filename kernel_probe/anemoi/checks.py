"""Checks of a config as a whole, in the parent: components no block reaches, Hydra's merge
leftovers, the lock comparison, dropped anemoi wrappers, and the schema (in a child)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lock.anemoi import ANEMOI_DEFAULTS, ConventionError, Exported, entry_for, wrapper_of
from kernel_probe.anemoi.config import Block, Config, Finding, find_blocks, load_config, walk
from kernel_probe.anemoi.entries import NORM_KEYS
from kernel_probe.anemoi.reading import CHILDREN, COMPOSE_MEMORY, installed, packaged_dir
from kernel_probe.errors import InputFileError
from kernel_probe.isolation.child import run_function
from kernel_probe.isolation.protocol import SchemaReply, SchemaRequest

# anemoi-models 0.19's modules whose classes call load_layer_kernels(layer_kernels): a node of one
# of them without a layer_kernels key is built with torch.nn's defaults
COMPONENT_MODULES = (
    "anemoi.models.layers.processor",
    "anemoi.models.layers.mapper",
    "anemoi.models.layers.ensemble",
)
_MISSING = object()
MERGE_FIX = (
    "set the entry through an interpolation so that Hydra replaces it whole (what `kernel-probe "
    "export --config` prints), or delete the keys with `~` overrides"
)
LOCK_FIX = (
    "use the lock's entries (`kernel-probe export LOCK --config THIS_CONFIG` prints them for this "
    "config), or re-probe"
)


def components_without_blocks(config: Config, *, lock_given: bool) -> list[Finding]:
    """Every component built with a ``layer_kernels`` argument whose node has no block: anemoi's
    defaults, which a lock's kernels never reach (an error then, else a warning)."""
    tree = config.tree
    if not isinstance(tree, Mapping):
        return []
    model = tree if config.shape == "model-file" and not config.composed else tree.get("model")
    defaults = ", ".join(f"{k}: {v['_target_']}" for k, v in ANEMOI_DEFAULTS.items())
    out: list[Finding] = []
    for path, node in walk(model):
        target = node.get("_target_") if isinstance(node, Mapping) else None
        component = isinstance(target, str) and target.rpartition(".")[0] in COMPONENT_MODULES
        if not component or "layer_kernels" in node or path[-1:] == ("layer_kernels",):
            continue
        where = ".".join(("model", *path))
        name = str(node["_target_"]).rpartition(".")[2]
        problem = (
            f"{name} at {where} has no layer_kernels block: anemoi builds it with its defaults "
            f"({defaults})" + (", not the lock's kernels" if lock_given else "")
        )
        fix = f"add `layer_kernels: ${{model.layer_kernels}}` to {where}, as the other "
        fix += "components have"
        severity, kind = ("error", "lock") if lock_given else ("warning", "entry")
        out.append(Finding(severity, kind, f"{where}.layer_kernels", problem, fix))
    return out


def merge_leftovers(block: Block) -> list[Finding]:
    """Entries the user's overlay replaces (it sets ``_target_``) where Hydra kept the preset's
    other keys: merged key by key, the old class's kwargs land on the new class."""
    out = []
    for key, mine in (block.written or {}).items():
        if not isinstance(mine, Mapping) or "_target_" not in mine:
            continue  # an interpolation replaces the entry whole; a partial entry merges on purpose
        composed = (block.content or {}).get(key)
        left = [k for k in composed if k not in mine] if isinstance(composed, Mapping) else []
        if left:
            problem = (
                f"Hydra merged this entry into the preset's: {', '.join(map(str, left))} come from "
                f"the preset, not from this file, and are passed to {mine['_target_']}"
            )
            out.append(Finding("error", "merge", f"{block.where}.{key}", problem, MERGE_FIX))
    return out


def compare_with_lock(
    block: Block, expected: Mapping[str, Exported], facts: Mapping[str, Mapping[str, Any]]
) -> list[Finding]:
    """Where ``block`` builds other than what the lock exports (``expected``, by key) after anemoi's
    wrapper rule (``entry_for``); ``facts[key]``: the child's facts about the entry it uses."""
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
            problem = (
                f"{have['_target_']} is a different layer (not a kernel choice); the lock does "
                "not cover it, so it stays"
            )
            out.append(Finding("note", "lock", label, problem))
            continue
        if have["_target_"] != should.entry["_target_"]:
            problem = f"builds {have['_target_']}, the lock pins {should.entry['_target_']}"
            note = f" ({should.note})" if should.note else ""
            out.append(Finding("error", "lock", label, problem + note, LOCK_FIX))
            continue
        if should.entry["_target_"] != want.entry["_target_"]:
            out.append(Finding("note", "lock", label, should.note))
        defaults = facts.get(key, {}).get("defaults", {})
        for name, value in should.entry.items():
            got = have.get(name, defaults.get(name, _MISSING))
            if name == "_target_" or (got is not _MISSING and _same(got, value)):
                continue
            default = f" (default {got!r})" if name not in have and got is not _MISSING else ""
            shown = "not set" if name not in have else repr(got)
            problem = f"{name} is {shown}{default}, the lock pins {value!r}"
            fix = f"set `{name}: {json.dumps(value)}`"
            out.append(Finding("error", "lock", f"{label}.{name}", problem, fix))
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def _effective(blocks: Sequence[Block]) -> dict[str, Mapping[str, Any]]:
    """Block path -> the entries it uses (an inheriting block: its parent's)."""
    by_where = {b.where: b for b in blocks}
    out: dict[str, Mapping[str, Any]] = {}
    for b in blocks:
        seen, node = {b.where}, b
        while node.content is None and node.inherits and node.inherits not in seen:
            seen.add(node.inherits)
            node = by_where.get(node.inherits, Block(node.inherits, content={}))
        out[b.where] = node.content or {}
    return out


def preset_file(config: Config) -> tuple[str, Path] | None:
    """(name, path) of the model preset the config replaces entries of: the ``model`` choice (looked
    up as Hydra does), or the packaged preset a model file is named like."""
    packaged = packaged_dir()
    mine = Path(config.path).resolve()
    name = config.choices.get("model", "")
    if name:
        for d in (mine.parent, packaged) if packaged else (mine.parent,):
            if (p := d / "model" / f"{name}.yaml").is_file() and p != mine:
                return name, p
        return None
    if config.shape == "model-file" and packaged is not None:
        p = packaged / "model" / f"{Path(config.path).stem}.yaml"
        if p.is_file() and p.resolve() != mine:
            return p.stem, p
    return None


def lost_wrappers(config: Config) -> list[Finding]:
    """A warning where the preset's norm runs in an anemoi wrapper (AutocastLayerNorm's cast back)
    and this config replaces it with a class that does not keep that behaviour."""
    found = preset_file(config)
    if found is None:
        return []
    name, path = found
    try:
        preset = find_blocks(load_config(path), "model-file")
    except InputFileError:
        return []
    theirs, mine = _effective(preset.blocks), _effective(config.blocks)
    own = {b.where for b in config.blocks if b.content is not None}
    out = []
    for where, entries in mine.items():
        if where not in theirs or where not in own:
            continue  # an inheriting block is reported where its entries are set
        for key in NORM_KEYS:
            before = theirs[where].get(key, ANEMOI_DEFAULTS[key])
            after = entries.get(key, ANEMOI_DEFAULTS[key])
            old, new = (
                e.get("_target_") if isinstance(e, Mapping) else None for e in (before, after)
            )
            if not isinstance(old, str) or not isinstance(new, str) or old == new:
                continue
            wrapper = wrapper_of(old)
            if wrapper is None or wrapper.runs is None or wrapper_of(new) is not None:
                continue
            short = wrapper.target.rpartition(".")[2]
            problem = (
                f"the {name} preset uses anemoi's {short} here, which {wrapper.behaviour}; this "
                f"config replaces it with {new}, which does not: the cast-back is lost"
            )
            fix = (
                "keep the cast around your kernel: `kernel-probe export LOCK --config "
                f"{Path(config.path).name}` prints the adapter that does it "
                f"(kernel_lock.adapters.{wrapper.adapter_prefix}__...), or keep {short}"
            )
            out.append(Finding("warning", "wrapper", f"{where}.{key}", problem, fix))
    return out


# ---- anemoi-training's schema (its child: kernel_probe.anemoi.children.validate) -----------------
SCHEMA_TIMEOUT = 120.0
SCHEMA_FIX = (
    "install anemoi-training (`pip install --no-deps anemoi-training`, then its light "
    "dependencies as .ci/anemoi-install does) to check what `anemoi-training train` will say"
)


@dataclass(frozen=True)
class SchemaRun:
    """The schema's run for one reading of a config (``shipped``: anemoi-training's own file)."""

    request: SchemaRequest
    how: str
    preset: str
    shipped: bool


def schema_run(config: Config) -> SchemaRun | str:
    """The schema's request for ``config``, or the status saying why it is not run."""
    packaged = packaged_dir()
    if packaged is None or installed("anemoi-training") is None or installed("hydra-core") is None:
        return f"not run: anemoi-training is not installed here; {SCHEMA_FIX}"
    tree, model_file = config.tree, False
    if not isinstance(tree, Mapping):
        return "not run: the config could not be read as a whole"
    if config.shape == "overlay" and not config.composed:
        return "not run: the overlay was not composed, and alone it is not a training config"
    how = "the composed config" if config.composed else "the file as a whole"
    if config.shape == "model-file" and not config.composed:
        model_file, how = True, "this model node inside anemoi-training's packaged config"
    elif config.shape == "full" and set(tree) <= {"model", "defaults"}:
        tree = tree.get("model")
        if not isinstance(tree, Mapping) or not isinstance(tree.get("model"), Mapping):
            return (
                "not run: the file holds only part of a model node (no model class at "
                "model.model._target_); check the training config or overlay that uses it"
            )
        model_file, how = True, "this file's model node inside anemoi-training's packaged config"
    p = Path(config.path)
    name = config.choices.get("model", "")
    if name and (packaged / "model" / f"{name}.yaml").is_file():
        preset = name  # an error the preset has as shipped is the preset's own
    elif config.shape == "model-file" and (packaged / "model" / f"{p.stem}.yaml").is_file():
        preset = p.stem  # the preset itself, or a copy of it (named the same) edited by the user
    else:
        preset = ""
    try:
        p.resolve().relative_to(packaged.resolve())
        shipped = True
    except (ValueError, OSError):
        shipped = False
    request = SchemaRequest(tree=tree, model_file=model_file, preset=preset, memory=COMPOSE_MEMORY)
    return SchemaRun(request, how, preset, shipped)


def schema_findings(
    config: Config,
    timeout: float = SCHEMA_TIMEOUT,
    *,
    run: SchemaRun | str | None = None,
    reply: SchemaReply | None = None,
) -> tuple[str, list[Finding]]:
    """anemoi-training's ``BaseSchema`` on the config: (how it ran, or why not; its errors, the
    shipped preset's own marked so), in a child of its own unless ``reply`` is given."""
    run = schema_run(config) if run is None else run
    if isinstance(run, str):
        return run, []
    if reply is None:
        result = run_function(CHILDREN, "validate", run.request, timeout=timeout)
        if not result.ok:
            problem = f"anemoi-training's schema could not validate this config: {result.reason}"
            fix = "`anemoi-training train` resolves the config first and would fail the same way"
            kind = "preset" if run.shipped else "schema"
            return "run, and failed", [Finding("error", kind, "(config)", problem, fix)]
        reply = SchemaReply.from_json(result.value)
    training = f"anemoi-training {reply.version}"
    off = isinstance(config.tree, Mapping) and config.tree.get("config_validation") is False
    unset = (
        f"; {len(reply.unset)} mandatory value(s) left for the command line: "
        f"{', '.join(reply.unset)}"
        if reply.unset
        else ""
    )
    off_note = "; config_validation is False, so training itself would not run this check"
    status = f"checked with {training}'s BaseSchema ({run.how}){unset}{off_note if off else ''}"
    return status, _schema_errors(config, run, reply, training, "warning" if off else "error")


def _schema_errors(
    config: Config, run: SchemaRun, reply: SchemaReply, training: str, severity: str
) -> list[Finding]:
    out: list[Finding] = []
    own = {(e["where"], e["type"]) for e in reply.preset}
    for e in reply.errors:
        where, kind = e["where"], e["type"]
        member = next((m for w, m in reply.members.items() if where.startswith(w)), "")
        via = f" (as {member}, the closest of the schema's alternatives)" if member else ""
        if run.shipped or (where, kind) in own:
            mine = (where, kind) not in own
            name = (
                f"`{Path(config.path).name}` config"
                if mine or not run.preset
                else f"`{run.preset}` preset"
            )
            problem = (
                f"{e['message']} ({kind}){via}: {training}'s own {name} fails its schema here as "
                "shipped, whatever this config does; not a kernel-lock matter"
            )
            fix = (
                "set it in your config (anemoi-training train rejects the preset as it is), or "
                f"pin the anemoi-models version {training} was released with"
            )
            out.append(Finding(severity, "preset", where, problem, fix))
        else:
            problem = f"{training} rejects this: {e['message']} ({kind}){via}"
            out.append(Finding(severity, "schema", where, problem, _schema_fix(where, kind)))
    return out


def _schema_fix(where: str, kind: str) -> str:
    if kind == "extra_forbidden" and where.endswith("layer_kernels"):
        return (
            "layer_kernels belongs in the model node: under `model:` of a training config or an "
            "overlay, at the root of a model file (config/model/<name>.yaml); `kernel-probe "
            "export LOCK --config THIS_FILE` prints it in the right place"
        )
    return {
        "extra_forbidden": "remove the key, or check its spelling against anemoi-training's schema",
        "missing": "set it (anemoi-training's presets show the expected value)",
    }.get(kind, "see anemoi-training's schema for this field")
