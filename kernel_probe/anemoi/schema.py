"""The child side of checking a composed anemoi config with anemoi-training's own schema.

``anemoi-training train`` (config validation on, its default) resolves the composed config and
builds ``anemoi.training.schemas.base_schema.BaseSchema`` from it; a config the schema rejects never
trains. This runs the same two steps in a child process
(``kernel_probe.isolation.child.run_function``: the schema is anemoi-training's code) and answers
with the errors at config paths.

Mandatory values left as ``???`` (the dataset, the output root: usually given on the command line)
would stop ``OmegaConf.resolve``; each is filled with a placeholder, reported as unset, and the
schema's verdict on that path is left out. pydantic reports a union field (anemoi's model schemas:
base, ensemble, hierarchical, transport) once per member; the errors of the member that fits best
(fewest errors) are kept, and the member is named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PLACEHOLDER = "/kernel-probe/unset"


def _member_split(loc: tuple[Any, ...], tree: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """(config path, [(config path so far, union member tag)]): pydantic's ``loc`` walked along the
    config, every component that is not a key of the config at that point being a union tag."""
    path: list[str] = []
    tags: list[tuple[str, str]] = []
    node = tree
    for part in loc:
        if isinstance(node, Mapping) and str(part) in node:
            path.append(str(part))
            node = node[str(part)]
        elif (
            isinstance(node, list)
            and isinstance(part, int | str)
            and str(part).isdigit()
            and int(part) < len(node)
        ):
            path.append(str(part))
            node = node[int(part)]
        elif (
            isinstance(node, (Mapping, list)) and isinstance(part, str) and _looks_like_member(part)
        ):
            tags.append((".".join(path), part))
        else:  # a key the config lacks (missing) or should not have: a path, not a member
            path.append(str(part))
            node = None
    return path, tags


def _looks_like_member(part: str) -> bool:
    # pydantic names union members by their class (BaseModelSchema), a validator wrapper
    # (function-after[...]), a generic container type (dict[str,union[...]]) or, for a discriminated
    # union, the discriminator's value (a dotted _target_)
    return part[:1].isupper() or part.startswith("function-") or "[" in part or "." in part


def closest_members(
    errors: list[dict[str, Any]], tree: Any
) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Each error at its config path, keeping only the best-fitting member of every union."""
    split = [(e, *_member_split(tuple(e.get("loc", ())), tree)) for e in errors]
    chosen: dict[str, str] = {}
    depth = 0
    while any(len(tags) > depth for _, _, tags in split):  # nested unions: one level at a time
        counts: dict[tuple[Any, ...], dict[str, int]] = {}
        for _, _, tags in split:
            if len(tags) > depth:
                per = counts.setdefault((tuple(tags[:depth]), tags[depth][0]), {})
                per[tags[depth][1]] = per.get(tags[depth][1], 0) + 1
        # ties: the first
        best = {key: min(per, key=lambda tag: per[tag]) for key, per in counts.items()}
        if depth == 0:
            chosen = {where: tag for (_, where), tag in best.items()}
        split = [
            (e, path, tags)
            for e, path, tags in split
            if len(tags) <= depth or best[(tuple(tags[:depth]), tags[depth][0])] == tags[depth][1]
        ]
        depth += 1
    out = [
        {
            "where": ".".join(path) or "(root)",
            "type": str(e.get("type", "")),
            "message": str(e.get("msg")),
        }
        for e, path, _ in split
    ]
    unique = list({(o["where"], o["type"], o["message"]): o for o in out}.values())
    return unique, {where or "(root)": tag for where, tag in chosen.items()}


def _fill_missing(cfg: Any, path: tuple[str, ...], unset: list[str]) -> None:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        for key in list(cfg.keys()):
            if OmegaConf.is_missing(cfg, key):
                cfg[key] = PLACEHOLDER
                unset.append(".".join((*path, str(key))))
            else:
                _fill_missing(cfg._get_node(key), (*path, str(key)), unset)
    elif isinstance(cfg, ListConfig):
        for i in range(len(cfg)):
            if OmegaConf.is_missing(cfg, i):
                cfg[i] = PLACEHOLDER
                unset.append(".".join((*path, str(i))))
            else:
                _fill_missing(cfg._get_node(i), (*path, str(i)), unset)


def validate(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A ``SchemaRequest`` -> its ``SchemaReply`` (as JSON)."""
    from importlib import metadata

    from omegaconf import OmegaConf, open_dict

    from kernel_probe.isolation.protocol import SchemaReply, SchemaRequest

    request = SchemaRequest.from_json(payload)
    if request.model_file:
        cfg = _packaged()
        with open_dict(cfg):
            cfg["model"] = OmegaConf.create(request.tree)
    else:
        cfg = OmegaConf.create(request.tree)
    errors, unset, members = _errors(cfg)
    preset: list[dict[str, str]] = []
    if request.preset:
        preset = _errors(_packaged([f"model={request.preset}"]))[0]
    return SchemaReply(
        errors=errors,
        unset=unset,
        members=members,
        preset=preset,
        version=metadata.version("anemoi-training"),
    ).to_json()


def _packaged(overrides: list[str] | None = None) -> Any:
    """anemoi-training's packaged ``config``, composed (with ``overrides``)."""
    import anemoi.training
    from hydra import compose, initialize_config_dir

    config_dir = str(next(iter(anemoi.training.__path__))) + "/config"
    with initialize_config_dir(version_base=None, config_dir=config_dir):
        return compose(config_name="config", overrides=overrides or [])


def _errors(cfg: Any) -> tuple[list[dict[str, str]], list[str], dict[str, str]]:
    from anemoi.training.schemas.base_schema import BaseSchema
    from omegaconf import OmegaConf
    from pydantic import ValidationError

    unset: list[str] = []
    _fill_missing(cfg, (), unset)
    OmegaConf.resolve(cfg)
    tree = OmegaConf.to_container(cfg)
    try:
        BaseSchema(**cfg)
        errors: list[dict[str, str]] = []
        members: dict[str, str] = {}
    except ValidationError as exc:
        errors, members = closest_members([dict(e) for e in exc.errors()], tree)
    errors = [
        e
        for e in errors
        if not any(e["where"] == u or e["where"].startswith(u + ".") for u in unset)
    ]
    return errors, unset, members
