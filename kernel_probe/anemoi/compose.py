"""The child side of reading an anemoi config: Hydra composition, exactly as anemoi-training does
it.

Runs in a child process (``kernel_probe.isolation.child.run_function``): Hydra and OmegaConf read
files and expand interpolations, and a hostile or broken config must not take the caller with it.
anemoi-training composes with ``@hydra.main(config_path=None, config_name="config")`` and its
search-path plugin (``hydra_plugins.anemoi_searchpath``, installed with it), which appends the
working directory and the packaged presets (``pkg://anemoi.training/config``) behind the primary
``--config-path``. Here the primary config directory is the one holding the user's file and the
config name is the file's stem, so ``defaults: [model: gnn]`` finds the same preset training would.

Nothing is imported from the model code: composition only reads YAML. The answer is JSON: the
composed tree with interpolations left as written (so inheritance stays visible), and every
``layer_kernels`` entry resolved by OmegaConf itself, or the error OmegaConf raised for it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast


def layer_kernels_paths(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every path to a ``layer_kernels`` key under ``node`` (a plain container), depth first."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            here = (*path, str(key))
            if key == "layer_kernels":
                yield here
            else:
                yield from layer_kernels_paths(value, here)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from layer_kernels_paths(value, (*path, str(i)))


UNTRUSTED_SEARCH_PATH = "UntrustedSearchPath"


class UntrustedSearchPath(Exception):
    """A ``pkg://`` search path names a package outside the caller's trust: it is not imported."""


def guard_search_paths(trusted: tuple[str, ...]) -> None:
    """Make Hydra refuse, before importing it, a ``pkg://`` package outside ``trusted`` (a private
    or ``__main__`` one always): Hydra imports the package to list its files, and importing a module
    runs it."""
    from hydra._internal.config_repository import ConfigRepository

    original = ConfigRepository.initialize_sources

    def initialize_sources(self: Any, config_search_path: Any) -> None:
        for element in config_search_path.get_path():
            path = str(element.path or "")
            if not path.startswith("pkg://"):
                continue
            module = path[len("pkg://") :].replace("/", ".").rstrip(".")
            private = any(part.startswith("_") for part in module.split("."))
            if private or not any(module == t or module.startswith(t + ".") for t in trusted):
                why = (
                    "a private or __main__ module is never imported"
                    if private
                    else "it is not trusted"
                )
                raise UntrustedSearchPath(
                    f"search path {path} (from {element.provider}) names {module!r}, and "
                    f"{why}; nothing was imported"
                )
        original(self, config_search_path)

    ConfigRepository.initialize_sources = initialize_sources  # type: ignore[method-assign]  # this child only


def _get(cfg: Any, path: tuple[str, ...]) -> Any:
    node = cfg
    for part in path:
        node = (
            node[int(part)]
            if isinstance(node, list) or type(node).__name__ == "ListConfig"
            else node[part]
        )
    return node


def compose(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A ``ComposeRequest`` -> its ``ComposeReply`` (as JSON): the composed config (see the module
    docstring)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

    from kernel_probe.isolation.protocol import ComposeReply, ComposeRequest

    request = ComposeRequest.from_json(payload)
    guard_search_paths(request.trusted)
    with initialize_config_dir(version_base=None, config_dir=request.config_dir):
        cfg = hydra_compose(
            config_name=request.config_name,
            overrides=list(request.overrides),
            return_hydra_config=True,
        )
    runtime = cfg.hydra.runtime
    # runtime.choices is a DictConfig, so its container is a dict
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
    blocks: dict[str, Any] = {}
    for path in layer_kernels_paths(tree):
        dotted = ".".join(path)
        entries: dict[str, Any] = {}
        try:
            block = _get(cfg, path)
        except Exception as exc:  # the block itself is an interpolation that does not resolve
            blocks[dotted] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        if block is None:
            blocks[dotted] = {"entries": {}}
            continue
        if not isinstance(block, DictConfig):
            blocks[dotted] = {
                "value": OmegaConf.to_container(block, resolve=False)
                if isinstance(block, ListConfig)
                else block
            }
            continue
        for key in block:
            try:
                value = block[key]
                entries[str(key)] = (
                    OmegaConf.to_container(value, resolve=True)
                    if isinstance(value, (DictConfig, ListConfig))
                    else value
                )
            except Exception as exc:  # anemoi would fail on exactly this entry
                entries[str(key)] = {"__error__": f"{type(exc).__name__}: {exc}"}
        blocks[dotted] = {"entries": entries}
    return ComposeReply(tree=tree, blocks=blocks, choices=choices, sources=sources).to_json()
