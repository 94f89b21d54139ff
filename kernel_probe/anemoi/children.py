"""The child side of reading and checking an anemoi config, JSON in and out: :func:`compose`
(Hydra's composition; an untrusted ``pkg://`` is refused before Hydra imports it), :func:`validate`
(``BaseSchema``) and :func:`check` (the schema, address space capped, then the entries)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from importlib import metadata
from typing import Any, cast

from kernel_probe.anemoi.config import layer_kernels_paths
from kernel_probe.anemoi.entries import check_entries
from kernel_probe.isolation.protocol import (
    ComposeReply,
    ComposeRequest,
    ConfigCheckReply,
    ConfigCheckRequest,
    EntryCheckReply,
    SchemaReply,
    SchemaRequest,
)

UNTRUSTED_SEARCH_PATH = "UntrustedSearchPath"
PLACEHOLDER = "/kernel-probe/unset"


class UntrustedSearchPath(Exception):
    """A ``pkg://`` search path names a package outside the caller's trust: it is not imported."""


# ---- compose -------------------------------------------------------------------------------------
def guard_search_paths(trusted: tuple[str, ...]) -> None:
    """Make Hydra refuse, before importing it, a ``pkg://`` package outside ``trusted`` (a private
    or ``__main__`` one always)."""
    from hydra._internal.config_repository import ConfigRepository  # reason: Hydra, in the child

    original = ConfigRepository.initialize_sources

    def initialize_sources(self: Any, config_search_path: Any) -> None:
        for element in config_search_path.get_path():
            path = str(element.path or "")
            if not path.startswith("pkg://"):
                continue
            module = path[len("pkg://") :].replace("/", ".").rstrip(".")
            private = any(part.startswith("_") for part in module.split("."))
            if private or not any(module == t or module.startswith(t + ".") for t in trusted):
                why = "a private or __main__ module is never imported" if private else ""
                raise UntrustedSearchPath(
                    f"search path {path} (from {element.provider}) names {module!r}, and "
                    f"{why or 'it is not trusted'}; nothing was imported"
                )
        original(self, config_search_path)

    ConfigRepository.initialize_sources = initialize_sources  # type: ignore[method-assign]  # this child only


def _get(cfg: Any, path: tuple[str, ...]) -> Any:
    node = cfg
    for part in path:
        listed = isinstance(node, list) or type(node).__name__ == "ListConfig"
        node = node[int(part)] if listed else node[part]
    return node


def _block(cfg: Any, path: tuple[str, ...]) -> dict[str, Any]:
    """One block of the composed config for the parent: its entries, each resolved or its error."""
    from omegaconf import DictConfig, ListConfig, OmegaConf  # reason: Hydra, in the child

    try:
        block = _get(cfg, path)
    except Exception as exc:  # the block itself is an interpolation that does not resolve
        return {"error": f"{type(exc).__name__}: {exc}"}
    if block is None:
        return {"entries": {}}
    if not isinstance(block, DictConfig):
        as_list = isinstance(block, ListConfig)
        return {"value": OmegaConf.to_container(block, resolve=False) if as_list else block}
    entries: dict[str, Any] = {}
    for key in block:
        try:
            value = block[key]
            container = isinstance(value, (DictConfig, ListConfig))
            entries[str(key)] = OmegaConf.to_container(value, resolve=True) if container else value
        except Exception as exc:  # anemoi would fail on exactly this entry
            entries[str(key)] = {"__error__": f"{type(exc).__name__}: {exc}"}
    return {"entries": entries}


def compose(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A ``ComposeRequest`` -> its ``ComposeReply`` (as JSON): the composed config."""
    from hydra import compose as hydra_compose  # reason: Hydra, in the child
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    request = ComposeRequest.from_json(payload)
    guard_search_paths(request.trusted)
    with (
        _address_space(request.memory),
        initialize_config_dir(version_base=None, config_dir=request.config_dir),
    ):
        cfg = hydra_compose(
            config_name=request.config_name,
            overrides=list(request.overrides),
            return_hydra_config=True,
        )
    runtime = cfg.hydra.runtime
    choices = {
        str(k): str(v)
        for k, v in cast("dict[Any, Any]", OmegaConf.to_container(runtime.choices)).items()
        if not str(k).startswith("hydra/") and v is not None
    }
    sources = [
        f"{s.provider}: {s.path}"
        for s in runtime.config_sources
        if s.provider not in ("hydra", "schema")
    ]
    with open_dict(cfg):
        del cfg["hydra"]
    tree = OmegaConf.to_container(cfg, resolve=False)
    blocks = {".".join(path): _block(cfg, path) for path in layer_kernels_paths(tree)}
    return ComposeReply(tree=tree, blocks=blocks, choices=choices, sources=sources).to_json()


# ---- anemoi-training's schema --------------------------------------------------------------------
def _looks_like_member(part: str) -> bool:
    # pydantic names a union member by its class (BaseModelSchema), a validator wrapper
    # (function-after[...]), a generic container (dict[str,union[...]]) or a discriminator's
    # value (a dotted _target_)
    return part[:1].isupper() or part.startswith("function-") or "[" in part or "." in part


def _member_split(loc: tuple[Any, ...], tree: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """(config path, [(config path so far, union member tag)]): pydantic's ``loc`` walked along the
    config, each component that is not a key of the config there being a union tag."""
    path: list[str] = []
    tags: list[tuple[str, str]] = []
    node = tree
    for part in loc:
        listed = isinstance(node, list) and str(part).isdigit() and int(part) < len(node)
        if listed or (isinstance(node, Mapping) and str(part) in node):
            path.append(str(part))
            node = node[int(part) if listed else str(part)]
        elif (
            isinstance(node, (Mapping, list)) and isinstance(part, str) and _looks_like_member(part)
        ):
            tags.append((".".join(path), part))
        else:  # a key the config lacks (missing) or should not have: a path, not a member
            path.append(str(part))
            node = None
    return path, tags


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
        best = {key: min(per, key=lambda tag: per[tag]) for key, per in counts.items()}  # ties: 1st
        if depth == 0:
            chosen = {where: tag for (_, where), tag in best.items()}
        split = [
            (e, path, tags)
            for e, path, tags in split
            if len(tags) <= depth or best[(tuple(tags[:depth]), tags[depth][0])] == tags[depth][1]
        ]
        depth += 1
    unique: dict[tuple[str, ...], dict[str, str]] = {}
    for e, path, _ in split:
        where, kind, message = ".".join(path) or "(root)", str(e.get("type", "")), str(e.get("msg"))
        unique.setdefault(
            (where, kind, message), {"where": where, "type": kind, "message": message}
        )
    return list(unique.values()), {where or "(root)": tag for where, tag in chosen.items()}


def _fill_missing(cfg: Any, path: tuple[str, ...], unset: list[str]) -> None:
    from omegaconf import DictConfig, ListConfig, OmegaConf  # reason: Hydra, in the child

    if isinstance(cfg, DictConfig | ListConfig):
        keys: list[Any] = list(cfg.keys()) if isinstance(cfg, DictConfig) else list(range(len(cfg)))
        for key in keys:
            if OmegaConf.is_missing(cfg, key):
                cfg[key] = PLACEHOLDER
                unset.append(".".join((*path, str(key))))
            else:
                _fill_missing(cfg._get_node(key), (*path, str(key)), unset)


def _packaged(overrides: list[str] | None = None) -> Any:
    """anemoi-training's packaged ``config``, composed (with ``overrides``)."""
    import anemoi.training  # reason: anemoi-training, in the child
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = str(next(iter(anemoi.training.__path__))) + "/config"
    with initialize_config_dir(version_base=None, config_dir=config_dir):
        return hydra_compose(config_name="config", overrides=overrides or [])


def _errors(cfg: Any) -> tuple[list[dict[str, str]], list[str], dict[str, str]]:
    from anemoi.training.schemas.base_schema import BaseSchema  # reason: in the child
    from omegaconf import OmegaConf
    from pydantic import ValidationError

    unset: list[str] = []
    _fill_missing(cfg, (), unset)
    OmegaConf.resolve(cfg)
    tree = OmegaConf.to_container(cfg)
    errors: list[dict[str, str]] = []
    members: dict[str, str] = {}
    try:
        BaseSchema(**cfg)
    except ValidationError as exc:
        errors, members = closest_members([dict(e) for e in exc.errors()], tree)
    errors = [
        e
        for e in errors
        if not any(e["where"] == u or e["where"].startswith(u + ".") for u in unset)
    ]
    return errors, unset, members


def validate(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A ``SchemaRequest`` -> its ``SchemaReply`` (as JSON), within its ``memory`` budget."""
    request = SchemaRequest.from_json(payload)
    return _validate(request, request.memory)


def _validate(request: SchemaRequest, memory: int) -> dict[str, Any]:
    import torch  # noqa: F401  # reason: mapped before the cap (see _address_space)

    with _address_space(memory):
        from omegaconf import OmegaConf, open_dict  # reason: Hydra, in the child

        if request.model_file:
            cfg = _packaged()
            with open_dict(cfg):
                cfg["model"] = OmegaConf.create(request.tree)
        else:
            cfg = OmegaConf.create(request.tree)
        errors, unset, members = _errors(cfg)
        preset = _errors(_packaged([f"model={request.preset}"]))[0] if request.preset else []
        return SchemaReply(
            errors=errors,
            unset=unset,
            members=members,
            preset=preset,
            version=metadata.version("anemoi-training"),
        ).to_json()


# ---- the schema and the entries in one child -----------------------------------------------------
def check(payload: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``ConfigCheckRequest``s -> their ``ConfigCheckReply``s (as JSON), in order; whatever raises
    fails them all (the parent then asks each part again, alone)."""
    out = []
    for one in payload:
        request = ConfigCheckRequest.from_json(one)
        schema: SchemaReply | None = None
        if request.schema is not None:
            schema = SchemaReply.from_json(_validate(request.schema, request.schema_memory))
        entries = check_entries([e.to_json() for e in request.entries])
        replies = tuple(EntryCheckReply.from_json(e) for e in entries)
        out.append(ConfigCheckReply(schema=schema, entries=replies).to_json())
    return out


@contextlib.contextmanager
def _address_space(budget: int) -> Iterator[None]:
    """While the block runs, this process may map at most ``budget`` bytes more than now (0: no
    cap; docs/anemoi.md); import torch before it (a CUDA build maps GBs no budget should count)."""
    if not budget:
        yield
        return
    import resource  # reason: POSIX only, and only here

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    capped = _mapped() + budget
    capped = capped if hard == resource.RLIM_INFINITY else min(capped, hard)
    resource.setrlimit(resource.RLIMIT_AS, (capped, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _mapped() -> int:
    """This process's address space now (VmSize, bytes); 0 where /proc is not (not Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            return next(int(ln.split()[1]) << 10 for ln in fh if ln.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return 0
