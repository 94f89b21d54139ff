"""The ``layer_kernels`` blocks of one anemoi config, found in the file as read (no composition).

Every ``layer_kernels`` key under the model node is a block, wherever it sits (processor, encoders,
decoders, hierarchical up/down-scale mappers, the noise injector, components yet to come), reported
by its full path. A block that is ``${...}`` of another block *inherits* it and is judged once.
Whole-value ``${a.b.c}`` references are followed within the file (:class:`_Resolver`). A
:class:`Finding` is what every check of a config reports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kernel_lock.anemoi import ANEMOI_DEFAULTS
from kernel_probe.anemoi.compose import layer_kernels_paths
from kernel_probe.anemoi.config_file import detect_shape
from kernel_probe.errors import InputFileError

KEYS = tuple(ANEMOI_DEFAULTS)  # the keys anemoi reads from a block
INTERPOLATION = re.compile(r"^\$\{\s*([A-Za-z_][\w-]*(?:\.[\w-]+)*)\s*\}$")


@dataclass(frozen=True)
class Finding:
    """One verdict about a ``layer_kernels`` block: where, what, why, and the fix."""

    severity: str  # error | warning | note
    kind: str  # key | entry | import | signature | semantics | lock | interpolation | dimension
    where: str  # dotted path in the config, e.g. "model.processor.layer_kernels.LayerNorm"
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
    written: Mapping[str, Any] | None = (
        None  # what the user's own overlay writes here (composed overlays)
    )


@dataclass
class Config:
    """The blocks of one config, and what was found while reading it."""

    path: str = ""
    shape: str = "full"
    composed: bool = False
    # Hydra's group choices, e.g. {"model": "gnn"}
    choices: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # Hydra's search path
    overrides: list[str] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    why: str = ""  # what decided the shape
    alternative: str | None = (
        None  # the other shape the file could be (checked too, see check_config)
    )
    tree: Any = (
        None  # what anemoi-training's schema is run on: the composed config, or the file as read
    )

    def model_choice(self) -> str:
        """``model: NAME`` for Hydra's choice of the model preset, or that none was selected."""
        model = self.choices.get("model")
        return f"model: {model}" if model else "no model preset selected"


class _Resolver:
    """Whole-value ``${a.b.c}`` references, followed within one file.

    ``model_is_root``: a model file, whose ``${model.x}`` means its own ``x``. ``complete``: the
    file is the whole config, so a reference that points at nothing is an error; otherwise it is
    outside this file and left unjudged (a note), never a false error.
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
                f"{where}: following its ${{...}} references produces more than {self.BUDGET:,} "
                "values (a reference fan-out?); stopped",
                fix="anemoi's blocks are a few entries each",
            )
        if isinstance(value, str):
            m = INTERPOLATION.match(value)
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
                problems.append(
                    Finding("error", "interpolation", where, f"{value!r}: interpolation loop")
                )
                return value
            try:
                target = self.lookup(m.group(1))
            except KeyError:
                if self.complete:
                    problems.append(
                        Finding(
                            "error",
                            "interpolation",
                            where,
                            f"{value!r} points at nothing in this config",
                        )
                    )
                else:
                    problems.append(
                        Finding(
                            "note",
                            "interpolation",
                            where,
                            f"{value!r} points outside this file: left unjudged",
                        )
                    )
                return value
            except LookupError:
                problems.append(
                    Finding(
                        "note",
                        "interpolation",
                        where,
                        f"{value!r} points outside this file: left unjudged",
                    )
                )
                return value
            return self.resolve(target, where, problems, depth + 1)
        if isinstance(value, Mapping):
            return {k: self.resolve(v, f"{where}.{k}", problems, depth) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, f"{where}[{i}]", problems, depth) for i, v in enumerate(value)]
        return value


def value_at(node: Any, path: Sequence[str]) -> Any:
    """The value at ``path`` under ``node`` (mapping keys, list indices), or None."""
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


def inherited(value: Any, paths: set[str], where: str) -> str | None:
    """The block (one of ``paths``) that the block at ``where`` inherits by being ``${...}`` of it,
    or None."""
    m = INTERPOLATION.match(value) if isinstance(value, str) else None
    if m and m.group(1) in paths and m.group(1) != where:
        return m.group(1)
    return None


def block_values(model: Any) -> list[tuple[str, Any]]:
    """(full path, raw value) of every layer_kernels block under the model node."""
    return [
        ("model." + ".".join(path), value_at(model, path)) for path in layer_kernels_paths(model)
    ]


def add_block(
    config: Config, where: str, content: Any, *, source: str = "", written: Any = None
) -> None:
    """Add the block at ``where`` to ``config``, or a finding where its content is not a mapping of
    names."""
    if content is None:
        config.findings.append(
            Finding("note", "entry", where, "empty: anemoi uses its defaults for every key")
        )
        content = {}
    if not isinstance(content, Mapping):
        config.findings.append(
            Finding(
                "error",
                "entry",
                where,
                f"expected a mapping of {', '.join(KEYS)}, got {type(content).__name__} "
                f"{content!r:.60}",
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
        Block(
            where,
            content=content,
            source=source,
            written=written if isinstance(written, Mapping) else None,
        )
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
    raw = block_values(model) if isinstance(model, Mapping) else []
    paths = {where for where, _ in raw}
    for where, value in raw:
        parent = inherited(value, paths, where)
        if parent is not None:
            config.blocks.append(Block(where, inherits=parent, source=value))
            continue
        add_block(
            config,
            where,
            r.resolve(value, where, config.findings),
            source=value if isinstance(value, str) else "",
        )
    if not raw:
        config.findings.append(
            Finding(
                "warning",
                "entry",
                "model",
                "no layer_kernels block found anywhere under the model node: anemoi uses its "
                "defaults",
            )
        )
        config.blocks.append(Block("(anemoi defaults)", content={}))
    return config
