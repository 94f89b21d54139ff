"""One anemoi config file as read (no composition): its shape (``SHAPES``, :func:`classify`), its
``layer_kernels`` blocks (one that is ``${...}`` of another inherits it), and :class:`Finding`,
what every check of a config reports."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock.anemoi import ANEMOI_DEFAULTS
from kernel_lock.files import UnsafeFile, read_regular
from kernel_probe.errors import InputFileError

KEYS = tuple(ANEMOI_DEFAULTS)  # the keys anemoi reads from a block
INTERPOLATION = re.compile(r"^\$\{\s*([A-Za-z_][\w-]*(?:\.[\w-]+)*)\s*\}$")
SHAPES = {
    "model-file": "a model config file (the file is the model node, as config/model/<name>.yaml)",
    "full": "a complete config (the model under `model:`, no defaults list)",
    "overlay": "a Hydra overlay (a `defaults:` list over anemoi-training's presets)",
}
# keys only a model node has (a model file's own `model:` key is the model *class*), and the
# top-level sections of a training config (anemoi-training's config groups)
MODEL_NODE_KEYS = (
    *("layer_kernels", "processor", "encoders", "decoders", "encoder", "decoder"),
    *("num_channels", "noise_injector", "upscale_mapper", "downscale_mapper"),
)
TRAINING_SECTIONS = (
    *("data", "dataloader", "training", "system", "diagnostics", "graph", "hardware", "task"),
)
FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
MAX_BYTES = 8 << 20  # anemoi's configs are a few kB
MAX_NODES = 1_000_000  # values once YAML aliases are expanded: beyond this, a bomb, not a config


@dataclass(frozen=True)
class Finding:
    """One verdict about a config: where (its dotted path), what, why, and the fix."""

    severity: str  # error | warning | note
    kind: str  # key | entry | import | signature | semantics | lock | interpolation | ...
    where: str
    problem: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        """The finding as a JSON object (its fields by name)."""
        return asdict(self)


@dataclass
class Block:
    """One ``layer_kernels`` block as a component sees it."""

    where: str  # e.g. "model.processor.layer_kernels"
    content: Mapping[str, Any] | None = None  # interpolations resolved; None when it only inherits
    inherits: str | None = None  # e.g. "model.layer_kernels" for `${model.layer_kernels}`
    source: str = ""  # the interpolation it came through, if any
    written: Mapping[str, Any] | None = None  # what the user's own overlay writes here


@dataclass
class Config:
    """The blocks of one config, and what was found while reading it."""

    path: str = ""
    shape: str = "full"
    composed: bool = False
    choices: dict[str, str] = field(default_factory=dict)  # Hydra's, e.g. {"model": "gnn"}
    sources: list[str] = field(default_factory=list)  # Hydra's search path
    overrides: list[str] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    why: str = ""  # what decided the shape
    alternative: str | None = None  # the other shape the file could be (checked too)
    tree: Any = None  # what the schema is run on: the composed config, or the file as read

    def model_choice(self) -> str:
        """``model: NAME`` for Hydra's choice of the model preset, or that none was selected."""
        model = self.choices.get("model")
        return f"model: {model}" if model else "no model preset selected"


# ---- reading the file ----------------------------------------------------------------------------
def expanded_size(data: Any, limit: int = MAX_NODES) -> int:
    """How many values ``data`` has, aliased parts counted at every use, stopping past ``limit``."""
    memo: dict[int, int] = {}

    def size(node: Any, depth: int) -> int:
        if depth > 200:
            raise RecursionError
        if id(node) in memo:
            return memo[id(node)]
        if not isinstance(node, (Mapping, list)):
            return 1
        n = 1 + sum(
            size(v, depth + 1) for v in (node.values() if isinstance(node, Mapping) else node)
        )
        memo[id(node)] = n = min(n, limit + 1)
        return n

    return size(data, 0)


def load_config(path: str | Path) -> Any:
    """The YAML mapping at ``path``, read as OmegaConf reads it (else an InputFileError, exit 5)."""
    import yaml  # reason: yaml is imported only where a config is read

    class Loader(yaml.SafeLoader):
        pass

    # YAML 1.1 reads `1e-5` as a string; OmegaConf (and so anemoi) reads it as a float
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT, list("-+0123456789"))
    p = Path(path)

    def bad(problem: str, fix: str | None = None) -> InputFileError:
        return InputFileError(problem, path=str(p), fix=fix)

    try:
        text = read_regular(p, MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise bad("cannot read the config: no such file", "check the path") from None
    except UnsafeFile as exc:
        raise bad(exc.problem, exc.fix or None) from None
    except OSError as exc:
        raise bad(f"cannot read the config: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise bad(f"not UTF-8 text: {exc.reason}") from None
    try:
        data = yaml.load(text, Loader=Loader)  # a SafeLoader subclass
        too_big = expanded_size(data) > MAX_NODES
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise bad(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise bad("nested too deeply to be a config") from None
    if too_big:
        raise bad(
            f"expands to more than {MAX_NODES:,} values once its YAML aliases are followed (an "
            "alias bomb?); nothing was composed",
            "anemoi configs are small: check where this file came from",
        )
    if not isinstance(data, Mapping):
        raise bad(
            f"expected a YAML mapping (an anemoi config), got {type(data).__name__}",
            "pass the training config, or the model config (config/model/<name>.yaml)",
        )
    return data


# ---- its shape -----------------------------------------------------------------------------------
def group_member(root: Mapping[str, Any], path: Path | None) -> bool:
    """Is this file in anemoi's ``model`` group: in ``model/``, or extending sibling files?"""
    if path is None:
        return False
    if path.resolve().parent.name == "model":
        return True
    siblings = [d for d in root.get("defaults") or [] if isinstance(d, str) and d != "_self_"]
    return bool(siblings) and all((path.parent / f"{d}.yaml").is_file() for d in siblings)


@dataclass(frozen=True)
class Kind:
    """Which shape a file is, why (the signals that decided it), and the other shape it could be."""

    shape: str
    why: str
    alternative: str | None = None  # set when the signals disagree: the file is checked both ways


def classify(root: Mapping[str, Any], path: Path | None = None) -> Kind:
    """The file's shape from its place (config/model/<name>.yaml) and its content."""
    if isinstance(root.get("defaults"), list):
        if group_member(root, path):
            return Kind("model-file", "a defaults list naming presets of its own model/ directory")
        return Kind("overlay", "a defaults list")
    in_model_dir = path is not None and path.resolve().parent.name == "model"
    model = root.get("model")
    model_class = isinstance(model, Mapping) and isinstance(model.get("_target_"), str)
    node_at_root = [k for k in MODEL_NODE_KEYS if k in root]
    sections = [k for k in TRAINING_SECTIONS if k in root]
    file_signals = ["it sits in a model/ directory"] if in_model_dir else []
    if model_class:
        file_signals.append(
            f"its `model:` key is a class ({root['model']['_target_']}), as a model file's is"
        )
    if node_at_root:
        file_signals.append(f"model-node keys at its root ({', '.join(node_at_root)})")
    full_signals = [f"training sections ({', '.join(sections)})"] if sections else []
    if isinstance(model, Mapping) and isinstance(model.get("model"), Mapping):
        full_signals.append("the model class at model.model._target_")
    if isinstance(model, Mapping) and not model_class and not file_signals:
        full_signals.append("a `model:` node")
    files, fulls = "; ".join(file_signals), "; ".join(full_signals)
    if file_signals and full_signals:
        return Kind("model-file", f"{files}, but also {fulls}", alternative="full")
    if file_signals:
        lone_class = model_class and not node_at_root and not in_model_dir
        return Kind("model-file", files, alternative="full" if lone_class else None)
    if full_signals:
        return Kind("full", fulls)
    return Kind("model-file", "no `model:` node: the file is read as the model node itself")


# ---- walking the tree ----------------------------------------------------------------------------
def mappings_where(
    tree: Any, wanted: Callable[[Mapping[str, Any]], bool], where: str = ""
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every mapping of ``tree`` for which ``wanted`` holds, with its dotted path (``a.b[0].c``).

    >>> [w for w, _ in mappings_where({"a": {"k": 1}, "b": [{"k": 2}]}, lambda m: "k" in m)]
    ['a', 'b[0]']
    """
    if isinstance(tree, Mapping):
        if wanted(tree):
            yield where, tree
        for key, value in tree.items():
            yield from mappings_where(value, wanted, f"{where}.{key}" if where else str(key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from mappings_where(value, wanted, f"{where}[{i}]")


def walk(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, value) of ``node`` and of every value under it, depth first; a ``layer_kernels``
    block is yielded but not entered."""
    yield path, node
    if path[-1:] == ("layer_kernels",) or not isinstance(node, (Mapping, list)):
        return
    for key, value in node.items() if isinstance(node, Mapping) else enumerate(node):
        yield from walk(value, (*path, str(key)))


def layer_kernels_paths(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every path to a ``layer_kernels`` key under ``node``, depth first."""
    return (p for p, _ in walk(node, path) if p[len(path) :][-1:] == ("layer_kernels",))


def value_at(node: Any, path: Sequence[str]) -> Any:
    """The value at ``path`` under ``node`` (mapping keys, list indices), or None."""
    for part in path:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif part.isdigit() and (
            isinstance(node, Mapping)
            and int(part) in node
            or isinstance(node, list)
            and int(part) < len(node)
        ):
            node = node[int(part)]
        else:
            return None
    return node


def inherited(value: Any, paths: set[str], where: str) -> str | None:
    """The block (one of ``paths``) that the block at ``where`` is ``${...}`` of, or None."""
    m = INTERPOLATION.match(value) if isinstance(value, str) else None
    return m.group(1) if m and m.group(1) in paths and m.group(1) != where else None


def block_values(model: Any) -> list[tuple[str, Any]]:
    """(full path, raw value) of every layer_kernels block under the model node."""
    paths = layer_kernels_paths(model)
    return [("model." + ".".join(path), value_at(model, path)) for path in paths]


def add_block(
    config: Config, where: str, content: Any, *, source: str = "", written: Any = None
) -> None:
    """Add the block at ``where`` to ``config``, or a finding where it is not a mapping of names."""
    if content is None:
        empty = "empty: anemoi uses its defaults for every key"
        config.findings.append(Finding("note", "entry", where, empty))
        content = {}
    if not isinstance(content, Mapping):
        problem = f"expected a mapping of {', '.join(KEYS)}, got {type(content).__name__} "
        config.findings.append(Finding("error", "entry", where, f"{problem}{content!r:.60}"))
        return
    for k in (k for k in content if not isinstance(k, str)):
        problem = f"key {k!r} is a {type(k).__name__}, not a name: anemoi silently ignores it"
        fix = f"use one of {', '.join(KEYS)}"
        config.findings.append(Finding("error", "key", f"{where}.{k!r}", problem, fix))
    content = {k: v for k, v in content.items() if isinstance(k, str)}
    written = written if isinstance(written, Mapping) else None
    config.blocks.append(Block(where, content=content, source=source, written=written))


def add_blocks(
    config: Config, model: Any, add: Callable[[str, Any], None], none_found: str
) -> None:
    """Every block under ``model`` into ``config``: an inheriting one as such, any other through
    ``add(where, raw value)``."""
    raw = block_values(model) if isinstance(model, Mapping) else []
    paths = {where for where, _ in raw}
    for where, value in raw:
        parent = inherited(value, paths, where)
        if parent is not None:
            config.blocks.append(Block(where, inherits=parent, source=value))
        else:
            add(where, value)
    if not raw:
        config.findings.append(Finding("warning", "entry", "model", none_found))
        config.blocks.append(Block("(anemoi defaults)", content={}))


class _Resolver:
    """Whole-value ``${a.b.c}`` references, followed within one file. ``model_is_root``: a model
    file (``${model.x}`` is its own ``x``); ``complete``: a reference to nothing is an error."""

    BUDGET = 100_000  # values produced while following references: a ${...} fan-out stops here

    def __init__(self, root: Mapping[str, Any], *, model_is_root: bool, complete: bool):
        self.root, self.model_is_root, self.complete = root, model_is_root, complete
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
                f"{where}: following its ${{...}} references produces more than {self.BUDGET:,} "
                "values (a reference fan-out?); stopped",
                fix="anemoi's blocks are a few entries each",
            )
        if isinstance(value, Mapping):
            return {k: self.resolve(v, f"{where}.{k}", problems, depth) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, f"{where}[{i}]", problems, depth) for i, v in enumerate(value)]
        m = INTERPOLATION.match(value) if isinstance(value, str) else None
        if m is None:
            if isinstance(value, str) and "${" in value:
                problem = (
                    f"cannot follow {value!r} (only whole-value ${{a.b.c}} references are "
                    "followed here; compose the config to have Hydra resolve it)"
                )
                problems.append(Finding("warning", "interpolation", where, problem))
            return value
        if depth > 20:
            loop = f"{value!r}: interpolation loop"
            problems.append(Finding("error", "interpolation", where, loop))
            return value
        try:
            target = self.lookup(m.group(1))
        except LookupError as exc:  # KeyError: not in this file, which is complete or not
            nothing = self.complete and isinstance(exc, KeyError)
            text = "points at nothing in this config" if nothing else "points outside this file"
            severity, text = ("error", text) if nothing else ("note", f"{text}: left unjudged")
            problems.append(Finding(severity, "interpolation", where, f"{value!r} {text}"))
            return value
        return self.resolve(target, where, problems, depth + 1)


def find_blocks(root: Mapping[str, Any], shape: str | None = None) -> Config:
    """Every layer_kernels block of a config read as one file (no composition)."""
    shape = shape or classify(root).shape
    config = Config(shape=shape, tree=root)
    model_is_root = shape == "model-file"
    model = root if model_is_root else root.get("model")
    r = _Resolver(root, model_is_root=model_is_root, complete=shape == "full")

    def add(where: str, value: Any) -> None:
        source = value if isinstance(value, str) else ""
        add_block(config, where, r.resolve(value, where, config.findings), source=source)

    none = "no layer_kernels block found anywhere under the model node: anemoi uses its defaults"
    add_blocks(config, {} if model is None else model, add, none)
    return config
