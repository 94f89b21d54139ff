"""Reading an anemoi config the way anemoi-training does: which file it is, what Hydra composes from
it, where every ``layer_kernels`` block is, and what each block holds.

Three shapes of file (``SHAPES``), told apart by their content:

- a **model file** (``config/model/<name>.yaml``): the file *is* the model node (anemoi-training puts
  it at ``model``); its own ``model:`` key is the model class. ``${model.x}`` means the file's ``x``;
  a reference outside the file (``${system...}``) cannot be judged here and is left unjudged;
- a **full config**: everything under ``model:``, no ``defaults:`` list; complete, so a reference
  that points at nothing is an error;
- an **overlay**: a ``defaults:`` list (``- model: gnn``) plus a few overrides. On its own it says
  almost nothing about the model: it is composed with Hydra exactly as ``anemoi-training train``
  composes it (``kernel_probe.anemoi.compose``, in a child process), overrides given after ``--``
  included, and the composed model is what is checked. Where Hydra or anemoi-training's presets are
  not installed, the file is judged alone and a finding says the defaults were not followed.

Every ``layer_kernels`` key under the model node is a block, wherever it sits (processor, encoders,
decoders, hierarchical up/down-scale mappers, the noise injector, components yet to come), reported
by its full path. A block that is ``${...}`` of another block *inherits* it and is judged once.
Parsing lives here; verdicts are kernel_lock.anemoi's; presentation is commands/anemoicmds.py's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from kernel_lock.anemoi import ANEMOI_DEFAULTS, KEYS, Finding
from kernel_probe.anemoi.compose import UNTRUSTED_SEARCH_PATH, layer_kernels_paths
from kernel_probe.errors import InputFileError, UsageError
from kernel_probe.isolation.child import run_function
from kernel_probe.isolation.protocol import (
    ComposeReply,
    ComposeRequest,
    EntryCheckReply,
    EntryCheckRequest,
    ProtocolError,
)

SHAPES = {
    "model-file": "a model config file (the file is the model node, as config/model/<name>.yaml)",
    "full": "a complete config (the model under `model:`, no defaults list)",
    "overlay": "a Hydra overlay (a `defaults:` list over anemoi-training's presets)",
}
# keys that only a model node has (a model file's own `model:` key is the model *class*)
MODEL_NODE_KEYS = (
    "layer_kernels",
    "processor",
    "encoders",
    "decoders",
    "encoder",
    "decoder",
    "num_channels",
    "noise_injector",
    "upscale_mapper",
    "downscale_mapper",
)

_INTERPOLATION = re.compile(r"^\$\{\s*([A-Za-z_][\w-]*(?:\.[\w-]+)*)\s*\}$")
DEFAULT_TIMEOUT = 120.0
COMPOSE_TIMEOUT = 60.0
COMPOSE_MEMORY = 4 << 30  # a YAML alias bomb ends as a MemoryError in the child, not an exhausted node


def _loader():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    # YAML 1.1 reads `1e-5` as a string; OmegaConf (and so anemoi) reads it as a float. Do the same.
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return Loader


MAX_BYTES = 8 << 20  # anemoi's configs are a few kB
MAX_NODES = 1_000_000  # values once YAML aliases are expanded: beyond this, a bomb, not a config


def expanded_size(data: Any, limit: int = MAX_NODES) -> int:
    """How many values ``data`` has once its shared (aliased) parts are counted every time they are
    used, stopping past ``limit``: YAML aliases share one object, a billion-laughs document shares
    it exponentially often, and anything that walks the tree (Hydra, OmegaConf, this checker) pays."""
    memo: dict[int, int] = {}

    def size(node: Any, depth: int) -> int:
        if depth > 200:
            raise RecursionError
        key = id(node)
        if key in memo:
            return memo[key]
        if isinstance(node, Mapping):
            n = 1 + sum(size(v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            n = 1 + sum(size(v, depth + 1) for v in node)
        else:
            return 1
        memo[key] = n = min(n, limit + 1)
        return n

    return size(data, 0)


def load_config(path: str | Path) -> Any:
    """The YAML document at ``path``; an unreadable, malformed or hostile file is an InputFileError (exit 5)."""
    import yaml

    from kernel_lock._files import UnsafeFile, read_regular

    p = Path(path)
    try:
        text = read_regular(p, MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise InputFileError("cannot read the config: no such file", path=str(p), fix="check the path") from None
    except UnsafeFile as exc:
        raise InputFileError(exc.problem, path=str(p), fix=exc.fix or None) from None
    except OSError as exc:
        raise InputFileError(f"cannot read the config: {exc.strerror or exc}", path=str(p)) from None
    except UnicodeDecodeError as exc:
        raise InputFileError(f"not UTF-8 text: {exc.reason}", path=str(p)) from None
    try:
        data = yaml.load(text, Loader=_loader())  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputFileError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}", path=str(p)) from None
    except RecursionError:
        raise InputFileError("nested too deeply to be a config", path=str(p)) from None
    try:
        too_big = expanded_size(data) > MAX_NODES
    except RecursionError:
        raise InputFileError("nested too deeply to be a config", path=str(p)) from None
    if too_big:
        raise InputFileError(
            f"expands to more than {MAX_NODES:,} values once its YAML aliases are followed (an alias "
            "bomb?); nothing was composed",
            path=str(p),
            fix="anemoi configs are small: check where this file came from",
        )
    if not isinstance(data, Mapping):
        raise InputFileError(
            f"expected a YAML mapping (an anemoi config), got {type(data).__name__}",
            path=str(p),
            fix="pass the training config, or the model config (config/model/<name>.yaml)",
        )
    return data


def group_member(root: Mapping[str, Any], path: Path | None) -> bool:
    """Is this file an option of anemoi's ``model`` config group (``config/model/<name>.yaml``)?

    Such a file may extend another preset of its group (``defaults: [transformer_transport]``):
    it lives in a ``model/`` directory, or its defaults name a sibling file.
    """
    if path is None:
        return False
    if path.resolve().parent.name == "model":
        return True
    siblings = [d for d in root.get("defaults") or [] if isinstance(d, str) and d != "_self_"]
    return bool(siblings) and all((path.parent / f"{d}.yaml").is_file() for d in siblings)


# top-level sections of a training config (anemoi-training's config groups); a model file has none
TRAINING_SECTIONS = ("data", "dataloader", "training", "system", "diagnostics", "graph", "hardware", "task")


@dataclass(frozen=True)
class Kind:
    """Which shape a file is, why (the signals that decided it), and the other shape it could be."""

    shape: str
    why: str
    alternative: str | None = None  # set when the signals disagree: the file is checked both ways


def classify(root: Mapping[str, Any], path: Path | None = None) -> Kind:
    """The file's shape from its place (config/model/<name>.yaml) and content (a ``defaults:`` list,
    the model class's ``_target_`` under its own ``model:`` key, model-node keys at its root,
    training sections)."""
    if isinstance(root.get("defaults"), list):
        if group_member(root, path):
            return Kind("model-file", "a defaults list naming presets of its own model/ directory")
        return Kind("overlay", "a defaults list")
    in_model_dir = path is not None and path.resolve().parent.name == "model"
    model = root.get("model")
    model_class = isinstance(model, Mapping) and isinstance(model.get("_target_"), str)
    node_at_root = [k for k in MODEL_NODE_KEYS if k in root]
    sections = [k for k in TRAINING_SECTIONS if k in root]
    nested_class = isinstance(model, Mapping) and isinstance(model.get("model"), Mapping)
    file_signals = []
    if in_model_dir:
        file_signals.append("it sits in a model/ directory")
    if model_class:
        file_signals.append(
            f"its `model:` key is a class ({model.get('_target_') if isinstance(model, Mapping) else ''}), as a model file's is"
        )
    if node_at_root:
        file_signals.append(f"model-node keys at its root ({', '.join(node_at_root)})")
    full_signals = []
    if sections:
        full_signals.append(f"training sections ({', '.join(sections)})")
    if nested_class:
        full_signals.append("the model class at model.model._target_")
    if isinstance(model, Mapping) and not model_class and not file_signals:
        full_signals.append("a `model:` node")
    if file_signals and full_signals:
        return Kind(
            "model-file",
            "; ".join(file_signals) + ", but also " + "; ".join(full_signals),
            alternative="full",
        )
    if file_signals:
        if model_class and not node_at_root and not in_model_dir:
            return Kind("model-file", "; ".join(file_signals), alternative="full")
        return Kind("model-file", "; ".join(file_signals))
    if full_signals:
        return Kind("full", "; ".join(full_signals))
    return Kind("model-file", "no `model:` node: the file is read as the model node itself")


def detect_shape(root: Mapping[str, Any], path: Path | None = None) -> str:
    """``overlay``, ``full`` or ``model-file`` (see ``SHAPES`` and :func:`classify`)."""
    return classify(root, path).shape


@dataclass
class Block:
    """One ``layer_kernels`` block as a component sees it."""

    where: str  # e.g. "model.processor.layer_kernels"
    content: Mapping[str, Any] | None = None  # interpolations resolved; None when it only inherits
    inherits: str | None = None  # e.g. "model.layer_kernels" for `${model.layer_kernels}`
    source: str = ""  # the interpolation it came through, if any
    written: Mapping[str, Any] | None = None  # what the user's own overlay writes here (composed overlays)


@dataclass
class Config:
    """The blocks of one config, and what was found while reading it."""

    path: str = ""
    shape: str = "full"
    composed: bool = False
    choices: dict[str, str] = field(default_factory=dict)  # Hydra's group choices, e.g. {"model": "gnn"}
    sources: list[str] = field(default_factory=list)  # Hydra's search path
    overrides: list[str] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    why: str = ""  # what decided the shape
    alternative: str | None = None  # the other shape the file could be (checked too, see check_config)
    tree: Any = None  # what anemoi-training's schema is run on: the composed config, or the file as read


class _Resolver:
    """Whole-value ``${a.b.c}`` references, followed within one file.

    ``model_is_root``: a model file, whose ``${model.x}`` means its own ``x``. ``complete``: the file
    is the whole config, so a reference that points at nothing is an error; otherwise it is outside
    this file and left unjudged (a note), never a false error.
    """

    BUDGET = 100_000  # values produced while following references: a ${...} fan-out stops here

    def __init__(self, root: Mapping[str, Any], *, model_is_root: bool, complete: bool):
        self.root = root
        self.model_is_root = model_is_root
        self.complete = complete
        self.produced = 0

    def lookup(self, dotted: str) -> Any:
        parts = dotted.split(".")
        node: Any = self.root
        if self.model_is_root:
            if parts[0] != "model":
                raise LookupError(dotted)  # another config group: not in this file
            parts = parts[1:]
        for part in parts:
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise KeyError(dotted)
        return node

    def resolve(self, value: Any, where: str, problems: list[Finding], depth: int = 0) -> Any:
        """``value`` with every whole-string ``${a.b.c}`` replaced by what it points at."""
        self.produced += 1
        if self.produced > self.BUDGET:
            raise InputFileError(
                f"{where}: following its ${{...}} references produces more than {self.BUDGET:,} values "
                "(a reference fan-out?); stopped",
                fix="anemoi's blocks are a few entries each",
            )
        if isinstance(value, str):
            m = _INTERPOLATION.match(value)
            if m is None:
                if "${" in value:
                    problems.append(
                        Finding(
                            "warning",
                            "interpolation",
                            where,
                            f"cannot follow {value!r} (only whole-value ${{a.b.c}} references are "
                            "followed here; compose the config to have Hydra resolve it)",
                        )
                    )
                return value
            if depth > 20:
                problems.append(Finding("error", "interpolation", where, f"{value!r}: interpolation loop"))
                return value
            try:
                target = self.lookup(m.group(1))
            except KeyError:
                if self.complete:
                    problems.append(
                        Finding("error", "interpolation", where, f"{value!r} points at nothing in this config")
                    )
                else:
                    problems.append(
                        Finding("note", "interpolation", where, f"{value!r} points outside this file: left unjudged")
                    )
                return value
            except LookupError:
                problems.append(
                    Finding("note", "interpolation", where, f"{value!r} points outside this file: left unjudged")
                )
                return value
            return self.resolve(target, where, problems, depth + 1)
        if isinstance(value, Mapping):
            return {k: self.resolve(v, f"{where}.{k}", problems, depth) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, f"{where}[{i}]", problems, depth) for i, v in enumerate(value)]
        return value


def _at(node: Any, path: Sequence[str]) -> Any:
    for part in path:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif (
            isinstance(node, Mapping)
            and part.isdigit()
            and int(part) in node
            or isinstance(node, list)
            and part.isdigit()
            and int(part) < len(node)
        ):
            node = node[int(part)]
        else:
            return None
    return node


def _inherits(value: Any, paths: set[str], where: str) -> str | None:
    m = _INTERPOLATION.match(value) if isinstance(value, str) else None
    if m and m.group(1) in paths and m.group(1) != where:
        return m.group(1)
    return None


def _walk(model: Any) -> list[tuple[str, Any]]:
    """(full path, raw value) of every layer_kernels block under the model node."""
    return [("model." + ".".join(path), _at(model, path)) for path in layer_kernels_paths(model)]


def _add_block(config: Config, where: str, content: Any, *, source: str = "", written: Any = None) -> None:
    if content is None:
        config.findings.append(Finding("note", "entry", where, "empty: anemoi uses its defaults for every key"))
        content = {}
    if not isinstance(content, Mapping):
        config.findings.append(
            Finding(
                "error",
                "entry",
                where,
                f"expected a mapping of {', '.join(KEYS)}, got {type(content).__name__} {content!r:.60}",
            )
        )
        return
    odd = [k for k in content if not isinstance(k, str)]
    for k in odd:
        config.findings.append(
            Finding(
                "error",
                "key",
                f"{where}.{k!r}",
                f"key {k!r} is a {type(k).__name__}, not a name: anemoi silently ignores it",
                f"use one of {', '.join(KEYS)}",
            )
        )
    if odd:
        content = {k: v for k, v in content.items() if isinstance(k, str)}
    config.blocks.append(
        Block(where, content=content, source=source, written=written if isinstance(written, Mapping) else None)
    )


def find_blocks(root: Mapping[str, Any], shape: str | None = None) -> Config:
    """Every layer_kernels block of a config read as one file (no composition)."""
    shape = shape or detect_shape(root)
    config = Config(shape=shape, tree=root)
    model_is_root = shape == "model-file"
    model = root if model_is_root else root.get("model")
    if model is None:
        model = {}
    r = _Resolver(root, model_is_root=model_is_root, complete=shape == "full")
    raw = _walk(model) if isinstance(model, Mapping) else []
    paths = {where for where, _ in raw}
    for where, value in raw:
        parent = _inherits(value, paths, where)
        if parent is not None:
            config.blocks.append(Block(where, inherits=parent, source=value))
            continue
        _add_block(
            config, where, r.resolve(value, where, config.findings), source=value if isinstance(value, str) else ""
        )
    if not raw:
        config.findings.append(
            Finding(
                "warning",
                "entry",
                "model",
                "no layer_kernels block found anywhere under the model node: anemoi uses its defaults",
            )
        )
        config.blocks.append(Block("(anemoi defaults)", content={}))
    return config


# ---- what a config may make this checker import ------------------------------------------------------
# A config names modules: its entries' ``_target_`` (imported to check a signature) and ``pkg://`` search
# paths (imported by Hydra while composing). The rules are the lock's (kernel_lock.trust.check_target): a
# private or ``__main__`` module is never imported (importing a ``__main__`` runs it), and a module outside
# the allow-list and the caller's trust is not imported. The allow-list for config entries adds
# anemoi-models (the library the config is for: AutocastLayerNorm is anemoi's own default).
CONFIG_ROOTS = ("anemoi.models",)
# pkg:// search paths composition may import: Hydra's own, and anemoi-training's packaged presets
SEARCH_ROOTS = ("hydra.conf", "anemoi.training")
OWN_TARGETS_FLAG = "--import-config-targets"


@dataclass(frozen=True)
class Trust:
    """What the caller trusts this checker to import for a config: ``modules`` (``--trust``,
    ``$KERNEL_LOCK_TRUST``) and, with ``own_targets`` (``--import-config-targets``), every public
    module the config's own entries name."""

    modules: tuple[str, ...] = ()
    own_targets: bool = False

    @classmethod
    def granted(cls, trust: Sequence[str] = (), *, own_targets: bool = False) -> Trust:
        from kernel_lock.trust import granted_trust

        return cls(granted_trust(trust), own_targets)

    def refusal(self, target: str) -> tuple[str, str, str] | None:
        """None if ``target`` (and any kernel a generic adapter wraps) may be imported, else
        (severity, problem, fix): ``__main__`` and private modules never; others not without trust."""
        from kernel_lock import registry
        from kernel_lock.anemoi import generic_kernel

        names = [target]
        inner = generic_kernel(target)
        if inner is not None:
            names.append(inner)
        for name in names:
            if any(part.startswith("_") for part in name.split(".")):
                return (
                    "error",
                    f"{name!r} has a private or __main__ component: it is never imported (importing a module's "
                    "__main__ runs it), and anemoi would import it when it builds the model",
                    "name a public class, e.g. torch.nn.LayerNorm",
                )
        if self.own_targets:
            return None
        roots = (*registry.allowed_roots(), *CONFIG_ROOTS, *self.modules)
        for name in names:
            if not any(name == r or name.startswith(r + ".") for r in roots):
                top = name.split(".")[0]
                return (
                    "warning",
                    f"not checked: module not trusted ({name!r} is outside the import allow-list and the modules "
                    "you trust; nothing was imported, so its import, signature and semantics are unknown)",
                    f"if you trust it, `--trust {top}` (or $KERNEL_LOCK_TRUST={top}), or {OWN_TARGETS_FLAG} to let "
                    "check-config import every module this config's entries name",
                )
        return None

    def search_roots(self) -> tuple[str, ...]:
        return (*SEARCH_ROOTS, *self.modules)


NO_TRUST = Trust()  # the allow-list alone


# ---- composition -----------------------------------------------------------------------------------
def _installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _defaults_text(root: Mapping[str, Any]) -> str:
    items: list[str] = []
    for d in root.get("defaults") or []:
        if isinstance(d, Mapping):
            items.extend(f"{k}: {v}" for k, v in d.items())
        elif d != "_self_":
            items.append(str(d))
    return ", ".join(items) or "none"


def _not_composed(config: Config, root: Mapping[str, Any], why: str, fix: str) -> None:
    config.findings.append(
        Finding(
            "warning",
            "defaults",
            "defaults",
            f"the defaults list ({_defaults_text(root)}) was not followed: {why}. Only what this file itself sets is "
            "checked; the presets' layer_kernels (anemoi's model for this run) are not seen here",
            fix,
        )
    )


def _composed(config: Config, root: Mapping[str, Any], answer: ComposeReply) -> None:
    """Fill ``config`` from the child's composition (blocks resolved by OmegaConf itself)."""
    tree = answer.tree
    model = tree.get("model") if isinstance(tree, Mapping) else None
    config.composed = True
    config.tree = tree
    config.choices = dict(answer.choices)
    config.sources = list(answer.sources)
    resolved = answer.blocks
    raw = _walk(model) if isinstance(model, Mapping) else []
    paths = {where for where, _ in raw}
    written_model = root.get("model") if isinstance(root.get("model"), Mapping) else {}
    for where, value in raw:
        parent = _inherits(value, paths, where)
        if parent is not None:
            config.blocks.append(Block(where, inherits=parent, source=value))
            continue
        block = resolved.get(where, {})
        if "error" in block:
            config.findings.append(
                Finding("error", "interpolation", where, f"Hydra cannot resolve this block: {block['error']}")
            )
            continue
        if "value" in block:
            _add_block(config, where, block["value"])
            continue
        content: dict[str, Any] = {}
        for key, entry in block.get("entries", {}).items():
            if isinstance(entry, Mapping) and "__error__" in entry:
                config.findings.append(
                    Finding(
                        "error",
                        "interpolation",
                        f"{where}.{key}",
                        f"Hydra cannot resolve this entry: {entry['__error__']}",
                    )
                )
                continue
            content[key] = entry
        written = _at(written_model, where.split(".")[1:])
        _add_block(config, where, content, source=value if isinstance(value, str) else "", written=written)
    if not raw:
        config.findings.append(
            Finding(
                "warning", "entry", "model", "the composed config has no layer_kernels block: anemoi uses its defaults"
            )
        )
        config.blocks.append(Block("(anemoi defaults)", content={}))


def compose(
    config_dir: Path,
    config_name: str,
    overrides: Sequence[str],
    timeout: float = COMPOSE_TIMEOUT,
    trust: Trust = NO_TRUST,
) -> tuple[ComposeReply | None, str, str]:
    """Hydra's composition of ``config_name`` from ``config_dir`` (then the working directory and
    anemoi-training's packaged presets, as its search-path plugin adds them), in a child:
    (answer, why not, exception type)."""
    if _installed("hydra-core") is None:
        return None, "hydra-core is not installed here", "missing"
    request = ComposeRequest(
        config_dir=str(config_dir.resolve()),
        config_name=config_name,
        overrides=tuple(overrides),
        trusted=trust.search_roots(),
    )
    result = run_function(
        "kernel_probe.anemoi.compose", "compose", request, timeout=timeout, memory_limit=COMPOSE_MEMORY
    )
    if result.ok:
        try:
            return ComposeReply.from_json(result.value), "", ""
        except ProtocolError as exc:
            return None, str(exc), "protocol"
    kind = result.raised.get("raised", result.status) if result.raised else result.status
    return None, result.reason, kind


_NOT_OVERRIDDEN = re.compile(r"Could not override '([^']+)'")


def override_through_interpolation(why: str, root: Mapping[str, Any]) -> tuple[str, str] | None:
    """Where Hydra refused an override because a key on its path is an interpolation (the overlay
    ``kernel-probe export --config`` writes: ``LayerNorm: ${model.kernel_lock.LayerNorm}``), the override
    that works (on the key the interpolation points at) and why; else None."""
    m = _NOT_OVERRIDDEN.search(why)
    if m is None:
        return None
    parts = m.group(1).split(".")
    node: Any = root
    for i, part in enumerate(parts):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
        ref = _INTERPOLATION.match(node) if isinstance(node, str) else None
        if ref is not None and i + 1 < len(parts):
            where = ".".join(parts[: i + 1])
            value = why.split("=", 1)[1].strip() if "=" in why else "VALUE"
            target = ".".join([ref.group(1), *parts[i + 1 :]])
            return (
                f"{target}={value}",
                f"{where} is the interpolation {node}, and Hydra cannot override a key under an interpolation",
            )
    return None


def read_config(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    compose_overlays: bool = True,
    timeout: float = COMPOSE_TIMEOUT,
    trust: Trust = NO_TRUST,
    shape: str | None = None,
) -> Config:
    """The blocks of the config at ``path``, composed as anemoi-training would where that is what
    decides the model (an overlay, a model preset extending another, or ``overrides``) and Hydra can
    run here.

    An overlay is the primary config: composed from its own directory under its own name. A model
    file is an option of the ``model`` group: composed as ``config`` with ``model=<its name>`` from
    the directory above its ``model/`` directory, as ``anemoi-training train --config-path DIR
    model=NAME`` would.
    """
    p = Path(path)
    root = load_config(p)
    decided = classify(root, p)
    shape = shape or decided.shape
    member = shape == "model-file" and group_member(root, p)
    if overrides and shape == "model-file" and not member:
        raise UsageError(
            f"{p}: overrides ({' '.join(overrides)}) apply to a primary config or to a preset in a "
            "config/model/ directory, not to a model file elsewhere",
            fix="pass the training config that selects this model (`- model: NAME`), or drop the overrides",
        )
    wants_composition = shape == "overlay" or bool(overrides) or (member and isinstance(root.get("defaults"), list))
    if not (wants_composition and compose_overlays):
        config = find_blocks(root, shape)
        if wants_composition:
            _not_composed(
                config,
                root,
                "composition was switched off (--no-compose)",
                "drop --no-compose to check the model anemoi-training will build",
            )
    else:
        if member:
            answer, why, kind = compose(
                p.resolve().parent.parent, "config", [f"model={p.stem}", *overrides], timeout, trust
            )
        else:
            answer, why, kind = compose(p.parent, p.stem, overrides, timeout, trust)
        if answer is not None:
            config = Config(shape=shape)
            _composed(config, {"model": root} if shape == "model-file" else root, answer)
        else:
            training = _installed("anemoi-training")
            config = find_blocks(root, shape)
            if kind == "missing":
                _not_composed(
                    config,
                    root,
                    why,
                    "install hydra-core and anemoi-training (`pip install --no-deps "
                    "anemoi-training`, as .ci/anemoi-install does) to compose it as training does",
                )
            elif kind == "MissingConfigException" and training is None:
                _not_composed(
                    config,
                    root,
                    f"anemoi-training is not installed here, so its presets cannot be found ({why})",
                    "install anemoi-training (`pip install --no-deps anemoi-training`) to compose it as training does",
                )
            elif kind == UNTRUSTED_SEARCH_PATH:
                config.findings.insert(
                    0,
                    Finding(
                        "error",
                        "trust",
                        str(p),
                        f"refused to compose: {why.partition(': ')[2] or why}",
                        "remove the search path; if it names a public package you trust, `--trust PACKAGE` (or "
                        "$KERNEL_LOCK_TRUST); a __main__ or private module is never imported",
                    ),
                )
            else:
                working = override_through_interpolation(why, {"model": root} if shape == "model-file" else root)
                config.findings.insert(
                    0,
                    Finding(
                        "error",
                        "compose",
                        str(p),
                        f"Hydra cannot compose this config as anemoi-training would: {why}"
                        + (f" ({working[1]})" if working else ""),
                        f"override `{working[0]}` instead" + " (it sets the entry every block pointing there uses)"
                        if working
                        else "fix the defaults list or the overrides; `anemoi-training train` would fail the same way",
                    ),
                )
    config.path = str(p)
    config.overrides = list(overrides)
    if shape == decided.shape:
        config.why, config.alternative = decided.why, decided.alternative
    else:
        config.why = f"asked to read it as one (it looks like {SHAPES[decided.shape].split(' (')[0]}: {decided.why})"
    return config


# ---- judging the entries, in a child process -------------------------------------------------------
def judge_entries(requests: Sequence[EntryCheckRequest], timeout: float = DEFAULT_TIMEOUT) -> list[EntryCheckReply]:
    """kernel_lock.anemoi.check_entries in a child; if that child dies, one child per entry says which."""
    if not requests:
        return []
    result = run_function("kernel_lock.anemoi", "check_entries", [r.to_json() for r in requests], timeout=timeout)
    if result.ok:
        return [EntryCheckReply.from_json(v) for v in result.value]
    out: list[EntryCheckReply] = []
    for r in requests:
        one = run_function("kernel_lock.anemoi", "check_entries", [r.to_json()], timeout=timeout)
        if one.ok:
            out.extend(EntryCheckReply.from_json(v) for v in one.value)
            continue
        target = r.entry.get("_target_") if isinstance(r.entry, Mapping) else None
        out.append(
            EntryCheckReply(
                findings=[
                    Finding(
                        "error",
                        "import",
                        r.where,
                        f"importing {target!r} failed: {one.reason}",
                        "run `kernel-probe env` to see which library is broken here",
                    ).to_json()
                ],
                facts={"target": target, "imported": False, "family": None, "defaults": {}},
            )
        )
    return out


# ---- what Hydra's merge left behind -----------------------------------------------------------------
def merge_leftovers(block: Block) -> list[Finding]:
    """Entries the user's overlay replaces (it sets ``_target_``) where Hydra kept the preset's other
    keys: Hydra merges mappings key by key, so the old class's kwargs land on the new class."""
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
                    f"Hydra merged this entry into the preset's: {', '.join(map(str, left))} come from the preset, "
                    f"not from this file, and are passed to {mine['_target_']}",
                    "set the entry through an interpolation so that Hydra replaces it whole (what `kernel-probe export "
                    "--config` prints), or delete the keys with `~` overrides",
                )
            )
    return out


# ---- the lock comparison ----------------------------------------------------------------------------
_MISSING = object()


def compare_with_lock(
    block: Block, expected: Mapping[str, Any], facts: Mapping[str, Mapping[str, Any]]
) -> list[Finding]:
    """Where ``block`` builds something other than what the lock pins, for each key the lock exports.

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
                    "use the lock's entries (`kernel-probe export LOCK --config THIS_CONFIG` prints them for this "
                    "config), or re-probe",
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
                        + (f" (default {got!r})" if name not in have and got is not _MISSING else "")
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


# ---- anemoi-training's own schema -------------------------------------------------------------------
SCHEMA_TIMEOUT = 120.0
SCHEMA_FIX = (
    "install anemoi-training (`pip install --no-deps anemoi-training`, then its light dependencies as "
    ".ci/anemoi-install does) to check what `anemoi-training train` will say"
)


def _packaged_dir() -> Path | None:
    """anemoi-training's packaged config directory, found without importing it."""
    from importlib.util import find_spec

    try:
        spec = find_spec("anemoi.training")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / "config" / "config.yaml").is_file():
            return Path(location) / "config"
    return None


def schema_input(config: Config) -> tuple[Any, bool, str] | str:
    """(tree, is a model node, how it is validated), or why the schema cannot judge this config."""
    tree = config.tree
    if not isinstance(tree, Mapping):
        return "the config could not be read as a whole"
    if config.shape == "overlay" and not config.composed:
        return "the overlay was not composed, and alone it is not a training config"
    if config.shape == "model-file" and not config.composed:
        return tree, True, "this model node inside anemoi-training's packaged config"
    if config.shape == "full" and set(tree) <= {"model", "defaults"}:
        model = tree.get("model")
        if not isinstance(model, Mapping) or not isinstance(model.get("model"), Mapping):
            return (
                "the file holds only part of a model node (no model class at model.model._target_); check the "
                "training config or overlay that uses it"
            )
        return model, True, "this file's model node inside anemoi-training's packaged config"
    return tree, False, "the composed config" if config.composed else "the file as a whole"


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
    except (ValueError, OSError):
        return False
    return True


def _preset_of(config: Config, packaged: Path) -> str:
    """The packaged model preset the config builds on ('' if none): an error the preset has as shipped is
    the preset's own."""
    name = config.choices.get("model", "")
    if name and (packaged / "model" / f"{name}.yaml").is_file():
        return name
    p = Path(config.path)
    if config.shape == "model-file" and (packaged / "model" / f"{p.stem}.yaml").is_file():
        return p.stem  # the preset itself, or a copy of it (named the same) edited by the user
    return ""


def schema_findings(config: Config, timeout: float = SCHEMA_TIMEOUT) -> tuple[str, list[Finding]]:
    """anemoi-training's ``BaseSchema`` on the config, as ``anemoi-training train`` runs it (in a child):
    (one line saying how it was run, or why not and how to get it; its errors at their config paths, an
    error the shipped preset has too marked as the preset's own)."""
    from kernel_probe.isolation.protocol import SchemaReply, SchemaRequest

    packaged = _packaged_dir()
    if packaged is None or _installed("anemoi-training") is None or _installed("hydra-core") is None:
        return f"not run: anemoi-training is not installed here; {SCHEMA_FIX}", []
    what = schema_input(config)
    if isinstance(what, str):
        return f"not run: {what}", []
    tree, model_file, how = what
    preset = _preset_of(config, packaged)
    shipped = _inside(Path(config.path), packaged)  # one of anemoi-training's own configs, as shipped
    request = SchemaRequest(tree=tree, model_file=model_file, preset=preset)
    result = run_function(
        "kernel_probe.anemoi.schema", "validate", request, timeout=timeout, memory_limit=COMPOSE_MEMORY
    )
    if not result.ok:
        return "run, and failed", [
            Finding(
                "error",
                "preset" if shipped else "schema",
                "(config)",
                f"anemoi-training's schema could not validate this config: {result.reason}",
                "`anemoi-training train` resolves the config first and would fail the same way",
            )
        ]
    reply = SchemaReply.from_json(result.value)
    training = f"anemoi-training {reply.version}"
    off = isinstance(config.tree, Mapping) and config.tree.get("config_validation") is False
    severity = "warning" if off else "error"
    status = (
        f"checked with {training}'s BaseSchema ({how})"
        + (
            f"; {len(reply.unset)} mandatory value(s) left for the command line: {', '.join(reply.unset)}"
            if reply.unset
            else ""
        )
        + ("; config_validation is False, so training itself would not run this check" if off else "")
    )
    out: list[Finding] = []
    own = {(e["where"], e["type"]) for e in reply.preset}
    for e in reply.errors:
        shown = e["where"]
        where = shown
        member = next((m for w, m in reply.members.items() if where.startswith(w)), "")
        via = f" (as {member}, the closest of the schema's alternatives)" if member else ""
        if shipped or (where, e["type"]) in own:
            mine = (where, e["type"]) not in own
            name = f"`{Path(config.path).name}` config" if mine or not preset else f"`{preset}` preset"
            out.append(
                Finding(
                    severity,
                    "preset",
                    shown,
                    f"{e['message']} ({e['type']}){via}: {training}'s own {name} fails its schema here "
                    "as shipped, whatever this config does; not a kernel-lock matter",
                    f"set it in your config (anemoi-training train rejects the preset as it is), or pin the "
                    f"anemoi-models version {training} was released with",
                )
            )
            continue
        out.append(
            Finding(
                severity,
                "schema",
                shown,
                f"{training} rejects this: {e['message']} ({e['type']}){via}",
                _schema_fix(shown, e["type"]),
            )
        )
    return status, out


def _schema_fix(where: str, kind: str) -> str:
    if kind == "extra_forbidden" and where.endswith("layer_kernels"):
        return (
            "layer_kernels belongs in the model node: under `model:` of a training config or an overlay, at the "
            "root of a model file (config/model/<name>.yaml); `kernel-probe export LOCK --config THIS_FILE` prints "
            "it in the right place"
        )
    if kind == "extra_forbidden":
        return "remove the key, or check its spelling against anemoi-training's schema"
    if kind == "missing":
        return "set it (anemoi-training's presets show the expected value)"
    return "see anemoi-training's schema for this field"


# ---- anemoi wrappers a config drops ------------------------------------------------------------------
def _effective(blocks: Sequence[Block]) -> dict[str, Mapping[str, Any]]:
    """Block path -> the entries it uses (an inheriting block: its parent's)."""
    own = {b.where: b.content for b in blocks if b.content is not None}
    out: dict[str, Mapping[str, Any]] = {}
    for b in blocks:
        seen, node = {b.where}, b
        while node.content is None and node.inherits and node.inherits not in seen:
            seen.add(node.inherits)
            node = next((x for x in blocks if x.where == node.inherits), Block(node.inherits, content={}))
        out[b.where] = node.content if node.content is not None else own.get(b.where, {})
    return out


def preset_file(config: Config) -> tuple[str, Path] | None:
    """(name, path) of the model preset the config replaces entries of: the ``model`` choice (found as
    Hydra would, the config's own directory first, then anemoi-training's packaged presets), or for a
    model file named like a packaged preset, that preset."""
    packaged = _packaged_dir()
    here = Path(config.path).resolve().parent
    name = config.choices.get("model", "")
    if name:
        for d in (here / "model", packaged / "model" if packaged else None):
            if d is not None and (d / f"{name}.yaml").is_file() and (d / f"{name}.yaml") != Path(config.path).resolve():
                return name, d / f"{name}.yaml"
        return None
    if config.shape == "model-file" and packaged is not None:
        p = packaged / "model" / f"{Path(config.path).stem}.yaml"
        if p.is_file() and p.resolve() != Path(config.path).resolve():
            return p.stem, p
    return None


def lost_wrappers(config: Config) -> list[Finding]:
    """A warning where the preset runs a norm inside one of anemoi's same-kernel wrappers
    (AutocastLayerNorm: the output cast back to the input dtype) and this config replaces it with a class
    that does not keep that behaviour (a plain LayerNorm)."""
    from kernel_lock.anemoi import NORM_KEYS, wrapper_of

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
                    f"the {name} preset uses anemoi's {short} here, which {wrapper.behaviour}; this config "
                    f"replaces it with {new}, which does not: the cast-back is lost",
                    f"keep the cast around your kernel: `kernel-probe export LOCK --config {Path(config.path).name}` "
                    f"prints the adapter that does it (kernel_lock.adapters.{wrapper.adapter_prefix}__...), or "
                    f"keep {short}",
                )
            )
    return out
