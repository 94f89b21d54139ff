"""anemoi-training's own schema on a config, run in a child as ``anemoi-training train`` runs it.

The parent side: what the schema is run on (:func:`schema_input`), which shipped preset an error
belongs to, and the findings. The child side, which imports anemoi-training, is
``kernel_probe.anemoi.schema``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_probe.anemoi.blocks import Config, Finding
from kernel_probe.anemoi.reading import COMPOSE_MEMORY, installed
from kernel_probe.isolation.child import run_function
from kernel_probe.isolation.protocol import SchemaReply, SchemaRequest

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


@dataclass(frozen=True)
class SchemaRun:
    """What the schema is run on for one reading of a config (:func:`schema_run`): the child's
    request, and what its reply's errors are read against."""

    request: SchemaRequest
    how: str  # how it is validated ("the composed config", ...), said in the status line
    preset: str  # the packaged model preset the config builds on ('' if none)
    shipped: bool  # the config is one of anemoi-training's own files, as shipped


def schema_run(config: Config) -> SchemaRun | str:
    """The schema's request for ``config``, or the status saying why it is not run (``not run:
    ...``, with how to get it)."""
    packaged = packaged_dir()
    if packaged is None or installed("anemoi-training") is None or installed("hydra-core") is None:
        return f"not run: anemoi-training is not installed here; {SCHEMA_FIX}"
    what = schema_input(config)
    if isinstance(what, str):
        return f"not run: {what}"
    tree, model_file, how = what
    preset = _preset_of(config, packaged)
    return SchemaRun(
        SchemaRequest(tree=tree, model_file=model_file, preset=preset),
        how,
        preset,
        _inside(Path(config.path), packaged),  # one of anemoi-training's own configs, as shipped
    )


def schema_findings(
    config: Config,
    timeout: float = SCHEMA_TIMEOUT,
    *,
    run: SchemaRun | str | None = None,
    reply: SchemaReply | None = None,
) -> tuple[str, list[Finding]]:
    """anemoi-training's ``BaseSchema`` on the config, as ``anemoi-training train`` runs it (in a
    child): (one line saying how it was run, or why not and how to get it; its errors at their
    config paths, an error the shipped preset has too marked as the preset's own).

    ``run`` (from :func:`schema_run`) and ``reply``: the schema already ran for it in another child
    (``kernel_probe.anemoi.config_child``); without ``reply`` it runs here in its own child."""
    run = schema_run(config) if run is None else run
    if isinstance(run, str):
        return run, []
    if reply is None:
        result = run_function(
            "kernel_probe.anemoi.schema",
            "validate",
            run.request,
            timeout=timeout,
            memory_limit=COMPOSE_MEMORY,
        )
        if not result.ok:
            return "run, and failed", [
                Finding(
                    "error",
                    "preset" if run.shipped else "schema",
                    "(config)",
                    f"anemoi-training's schema could not validate this config: {result.reason}",
                    "`anemoi-training train` resolves the config first and would fail the same way",
                )
            ]
        reply = SchemaReply.from_json(result.value)
    return _status(config, run, reply), _errors(config, run, reply)


def _status(config: Config, run: SchemaRun, reply: SchemaReply) -> str:
    """The line saying how the schema was run and what it left for the command line."""
    training = f"anemoi-training {reply.version}"
    off = isinstance(config.tree, Mapping) and config.tree.get("config_validation") is False
    return (
        f"checked with {training}'s BaseSchema ({run.how})"
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


def _errors(config: Config, run: SchemaRun, reply: SchemaReply) -> list[Finding]:
    """The schema's errors as findings: the shipped preset's own marked as the preset's."""
    training = f"anemoi-training {reply.version}"
    off = isinstance(config.tree, Mapping) and config.tree.get("config_validation") is False
    severity = "warning" if off else "error"
    shipped, preset = run.shipped, run.preset
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
    return out


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
