"""anemoi-training's own schema on a config, run in a child as ``anemoi-training train`` runs it.

The parent side: what the schema is run on (:func:`schema_input`), which shipped preset an error
belongs to, and the findings. The child side, which imports anemoi-training, is
``kernel_probe.anemoi.schema``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernel_probe.anemoi.blocks import Config, Finding
from kernel_probe.anemoi.reading import COMPOSE_MEMORY, installed
from kernel_probe.isolation.child import run_function

SCHEMA_TIMEOUT = 120.0
SCHEMA_FIX = (
    "install anemoi-training (`pip install --no-deps anemoi-training`, then its light "
    "dependencies as .ci/anemoi-install does) to check what `anemoi-training train` will say"
)


def packaged_dir() -> Path | None:
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
                "the file holds only part of a model node (no model class at "
                "model.model._target_); check the training config or overlay that uses it"
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
    """The packaged model preset the config builds on ('' if none): an error the preset has as
    shipped is the preset's own."""
    name = config.choices.get("model", "")
    if name and (packaged / "model" / f"{name}.yaml").is_file():
        return name
    p = Path(config.path)
    if config.shape == "model-file" and (packaged / "model" / f"{p.stem}.yaml").is_file():
        return p.stem  # the preset itself, or a copy of it (named the same) edited by the user
    return ""


def schema_findings(config: Config, timeout: float = SCHEMA_TIMEOUT) -> tuple[str, list[Finding]]:
    """anemoi-training's ``BaseSchema`` on the config, as ``anemoi-training train`` runs it (in a
    child): (one line saying how it was run, or why not and how to get it; its errors at their
    config paths, an error the shipped preset has too marked as the preset's own)."""
    from kernel_probe.isolation.protocol import SchemaReply, SchemaRequest

    packaged = packaged_dir()
    if packaged is None or installed("anemoi-training") is None or installed("hydra-core") is None:
        return f"not run: anemoi-training is not installed here; {SCHEMA_FIX}", []
    what = schema_input(config)
    if isinstance(what, str):
        return f"not run: {what}", []
    tree, model_file, how = what
    preset = _preset_of(config, packaged)
    # one of anemoi-training's own configs, as shipped
    shipped = _inside(Path(config.path), packaged)
    request = SchemaRequest(tree=tree, model_file=model_file, preset=preset)
    result = run_function(
        "kernel_probe.anemoi.schema",
        "validate",
        request,
        timeout=timeout,
        memory_limit=COMPOSE_MEMORY,
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
            f"; {len(reply.unset)} mandatory value(s) left for the command line: "
            f"{', '.join(reply.unset)}"
            if reply.unset
            else ""
        )
        + (
            "; config_validation is False, so training itself would not run this check"
            if off
            else ""
        )
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
            name = (
                f"`{Path(config.path).name}` config" if mine or not preset else f"`{preset}` preset"
            )
            out.append(
                Finding(
                    severity,
                    "preset",
                    shown,
                    f"{e['message']} ({e['type']}){via}: {training}'s own {name} fails its schema "
                    "here as shipped, whatever this config does; not a kernel-lock matter",
                    "set it in your config (anemoi-training train rejects the preset as it is), "
                    f"or pin the anemoi-models version {training} was released with",
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
            "layer_kernels belongs in the model node: under `model:` of a training config or an "
            "overlay, at the root of a model file (config/model/<name>.yaml); `kernel-probe "
            "export LOCK --config THIS_FILE` prints it in the right place"
        )
    if kind == "extra_forbidden":
        return "remove the key, or check its spelling against anemoi-training's schema"
    if kind == "missing":
        return "set it (anemoi-training's presets show the expected value)"
    return "see anemoi-training's schema for this field"
