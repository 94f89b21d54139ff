"""Which anemoi config file this is, and reading it safely.

Three shapes of file (``SHAPES``), told apart by their content (:func:`classify`):

- a **model file** (``config/model/<name>.yaml``): the file *is* the model node (anemoi-training
  puts it at ``model``); its own ``model:`` key is the model class. ``${model.x}`` means the file's
  ``x``; a reference outside the file (``${system...}``) cannot be judged here and is left unjudged;
- a **full config**: everything under ``model:``, no ``defaults:`` list; complete, so a reference
  that points at nothing is an error;
- an **overlay**: a ``defaults:`` list (``- model: gnn``) plus a few overrides. On its own it says
  almost nothing about the model: ``kernel_probe.anemoi.reading`` composes it with Hydra as
  ``anemoi-training train`` does.

:func:`load_config` reads the YAML as OmegaConf does (``1e-5`` is a float), refusing an unreadable,
oversized or alias-bomb file with an InputFileError (exit 5).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_probe.errors import InputFileError

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
    it exponentially often, and anything that walks the tree (Hydra, OmegaConf, this checker)
    pays."""
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
    """The YAML document at ``path``; an unreadable, malformed or hostile file is an InputFileError
    (exit 5)."""
    import yaml

    from kernel_lock.files import UnsafeFile, read_regular

    p = Path(path)
    try:
        text = read_regular(p, MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise InputFileError(
            "cannot read the config: no such file", path=str(p), fix="check the path"
        ) from None
    except UnsafeFile as exc:
        raise InputFileError(exc.problem, path=str(p), fix=exc.fix or None) from None
    except OSError as exc:
        raise InputFileError(
            f"cannot read the config: {exc.strerror or exc}", path=str(p)
        ) from None
    except UnicodeDecodeError as exc:
        raise InputFileError(f"not UTF-8 text: {exc.reason}", path=str(p)) from None
    try:
        data = yaml.load(text, Loader=_loader())  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputFileError(
            f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}", path=str(p)
        ) from None
    except RecursionError:
        raise InputFileError("nested too deeply to be a config", path=str(p)) from None
    try:
        too_big = expanded_size(data) > MAX_NODES
    except RecursionError:
        raise InputFileError("nested too deeply to be a config", path=str(p)) from None
    if too_big:
        raise InputFileError(
            f"expands to more than {MAX_NODES:,} values once its YAML aliases are followed (an "
            "alias bomb?); nothing was composed",
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
TRAINING_SECTIONS = (
    "data",
    "dataloader",
    "training",
    "system",
    "diagnostics",
    "graph",
    "hardware",
    "task",
)


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
            "its `model:` key is a class "
            f"({model.get('_target_') if isinstance(model, Mapping) else ''}), as a model file's "
            "is"
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


def mappings_where(
    tree: Any, wanted: Callable[[Mapping[str, Any]], bool], where: str = ""
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every mapping of ``tree`` for which ``wanted`` holds, with its dotted path (``a.b[0].c``):
    how the anemoi checks find the components they judge (a mapper, a processor).

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
