"""Reading an anemoi config the way anemoi-training does: composed by Hydra where that decides the
model.

An overlay (a ``defaults:`` list), a model preset extending another, or a config given Hydra
overrides after ``--`` says little on its own: it is composed with Hydra exactly as
``anemoi-training train`` composes it (``kernel_probe.anemoi.compose``, in a child process), and the
composed model's blocks are what is checked. Where Hydra or anemoi-training's presets are not
installed, the file is judged alone (``kernel_probe.anemoi.blocks``) and a finding says the defaults
were not followed.

Reading lives here and in config_file/blocks; verdicts are entry_checks/block_checks/schema_check's;
presentation is the commands' (commands/anemoi.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from kernel_probe.anemoi.blocks import (
    INTERPOLATION,
    Block,
    Config,
    Finding,
    add_block,
    block_values,
    find_blocks,
    inherited,
    value_at,
)
from kernel_probe.anemoi.compose import UNTRUSTED_SEARCH_PATH
from kernel_probe.anemoi.config_file import SHAPES, classify, group_member, load_config
from kernel_probe.anemoi.trust import NO_TRUST, Trust
from kernel_probe.errors import UsageError
from kernel_probe.isolation.child import run_function
from kernel_probe.isolation.protocol import ComposeReply, ComposeRequest, ProtocolError

COMPOSE_TIMEOUT = 60.0
COMPOSE_MEMORY = (
    4 << 30
)  # a YAML alias bomb ends as a MemoryError in the child, not an exhausted node


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None."""
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
            f"the defaults list ({_defaults_text(root)}) was not followed: {why}. Only what "
            "this file itself sets is "
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
    raw = block_values(model) if isinstance(model, Mapping) else []
    paths = {where for where, _ in raw}
    written_model = root.get("model") if isinstance(root.get("model"), Mapping) else {}
    for where, value in raw:
        parent = inherited(value, paths, where)
        if parent is not None:
            config.blocks.append(Block(where, inherits=parent, source=value))
            continue
        block = resolved.get(where, {})
        if "error" in block:
            config.findings.append(
                Finding(
                    "error",
                    "interpolation",
                    where,
                    f"Hydra cannot resolve this block: {block['error']}",
                )
            )
            continue
        if "value" in block:
            add_block(config, where, block["value"])
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
        written = value_at(written_model, where.split(".")[1:])
        add_block(
            config, where, content, source=value if isinstance(value, str) else "", written=written
        )
    if not raw:
        config.findings.append(
            Finding(
                "warning",
                "entry",
                "model",
                "the composed config has no layer_kernels block: anemoi uses its defaults",
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
    if installed("hydra-core") is None:
        return None, "hydra-core is not installed here", "missing"
    request = ComposeRequest(
        config_dir=str(config_dir.resolve()),
        config_name=config_name,
        overrides=tuple(overrides),
        trusted=trust.search_roots(),
    )
    result = run_function(
        "kernel_probe.anemoi.compose",
        "compose",
        request,
        timeout=timeout,
        memory_limit=COMPOSE_MEMORY,
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
    ``kernel-probe export --config`` writes: ``LayerNorm: ${model.kernel_lock.LayerNorm}``), the
    override that works (on the key the interpolation points at) and why; else None."""
    m = _NOT_OVERRIDDEN.search(why)
    if m is None:
        return None
    parts = m.group(1).split(".")
    node: Any = root
    for i, part in enumerate(parts):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
        ref = INTERPOLATION.match(node) if isinstance(node, str) else None
        if ref is not None and i + 1 < len(parts):
            where = ".".join(parts[: i + 1])
            value = why.split("=", 1)[1].strip() if "=" in why else "VALUE"
            target = ".".join([ref.group(1), *parts[i + 1 :]])
            return (
                f"{target}={value}",
                f"{where} is the interpolation {node}, and Hydra cannot override a key under "
                "an interpolation",
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
            fix="pass the training config that selects this model (`- model: NAME`), or drop "
            "the overrides",
        )
    wants_composition = (
        shape == "overlay" or bool(overrides) or (member and isinstance(root.get("defaults"), list))
    )
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
            training = installed("anemoi-training")
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
                    "anemoi-training is not installed here, so its presets cannot be found "
                    f"({why})",
                    "install anemoi-training (`pip install --no-deps anemoi-training`) to "
                    "compose it as training does",
                )
            elif kind == UNTRUSTED_SEARCH_PATH:
                config.findings.insert(
                    0,
                    Finding(
                        "error",
                        "trust",
                        str(p),
                        f"refused to compose: {why.partition(': ')[2] or why}",
                        "remove the search path; if it names a public package you trust, "
                        "`--trust PACKAGE` (or "
                        "$KERNEL_LOCK_TRUST); a __main__ or private module is never imported",
                    ),
                )
            else:
                working = override_through_interpolation(
                    why, {"model": root} if shape == "model-file" else root
                )
                config.findings.insert(
                    0,
                    Finding(
                        "error",
                        "compose",
                        str(p),
                        f"Hydra cannot compose this config as anemoi-training would: {why}"
                        + (f" ({working[1]})" if working else ""),
                        f"override `{working[0]}` instead"
                        + " (it sets the entry every block pointing there uses)"
                        if working
                        else "fix the defaults list or the overrides; `anemoi-training train` "
                        "would fail the same way",
                    ),
                )
    config.path = str(p)
    config.overrides = list(overrides)
    if shape == decided.shape:
        config.why, config.alternative = decided.why, decided.alternative
    else:
        config.why = (
            f"asked to read it as one (it looks like {SHAPES[decided.shape].split(' (')[0]}: "
            f"{decided.why})"
        )
    return config
