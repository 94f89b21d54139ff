"""The anemoi model a training config describes, built as anemoi-training builds it: the child-side
builder behind the model spec ``anemoi:CONFIG`` (docs/model.md, docs/anemoi.md).

``CONFIG`` is a YAML path (composed as ``check-config`` reads it) or the name of a config or model
preset anemoi-training ships. :func:`build` composes and validates it as training does, then builds
``AnemoiModelInterface`` on a graph of the config's sizes (``grids``), not built: meta tensors, or
seeded values off the meta device (``_Values``); the inputs are one training batch.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernel_lock.trust import anemoi_flash_generation
from kernel_probe.anemoi import children
from kernel_probe.anemoi.children import _fill_missing, closest_members
from kernel_probe.anemoi.config import classify, group_member, load_config, mappings_where
from kernel_probe.anemoi.grids import GraphSizes, dataset_name, graph_sizes
from kernel_probe.anemoi.reading import SEARCH_ROOTS, packaged_dir
from kernel_probe.errors import InputFileError
from kernel_probe.isolation.protocol import ComposeReply, ComposeRequest

# anemoi-training's test variables (a dataset's prognostic variables are the dataset's own)
ASSUMED_PROGNOSTIC = ("10u", "10v", "2t", "msl", "t_850", "z_500")
FLASH = "flash_attention"
SDPA = "scaled_dot_product_attention"
SEED = 0
SEEDED_GRAPH = (
    "the graph is synthetic: its sizes are the config's, its coordinates, attributes and edges "
    "seeded values (kernel_probe.anemoi.model._Values), not the grid's geometry; the inputs are "
    "seeded too"
)


# ---- the config ----------------------------------------------------------------------------------
def _where_to_compose(config: str) -> tuple[Path, str, list[str], Any]:
    """(config dir, config name, overrides, a model node to put in place or None) for ``config``."""
    packaged = packaged_dir()
    path, root = Path(config), None
    if path.suffix in (".yaml", ".yml") or path.is_file():
        root = load_config(path)
        if classify(root, path).shape != "model-file":  # an overlay or a complete config
            return path.resolve().parent, path.stem, [], None
        if group_member(root, path):
            return path.resolve().parent.parent, "config", [f"model={path.stem}"], None
    if packaged is None:
        raise InputFileError(
            "anemoi-training is not installed here: its configs (and the presets a model file is "
            "composed with) cannot be found",
            path=config,
            fix="pip install --no-deps anemoi-training (as .ci/anemoi-install does)",
        )
    if root is not None:
        return packaged, "config", [], root  # a model file alone: the packaged config around it
    if (packaged / f"{config}.yaml").is_file():
        return packaged, config, [], None
    if (packaged / "model" / f"{config}.yaml").is_file():
        return packaged, shipped_with(packaged, config), [f"model={config}"], None
    shipped = sorted(p.stem for p in packaged.glob("*.yaml"))
    presets = sorted(p.stem for p in (packaged / "model").glob("*.yaml"))
    raise InputFileError(
        f"{config!r} is neither a YAML file nor a config anemoi-training ships",
        path=config,
        fix=f"name a file, a shipped config ({', '.join(shipped)}) or a model preset "
        f"({', '.join(presets)})",
    )


def shipped_with(packaged: Path, preset: str) -> str:
    """The one packaged config that selects a model preset (``- model: NAME``), else ``config``."""
    selecting = [
        path.stem
        for path in sorted(packaged.glob("*.yaml"))
        if any(
            isinstance(d, Mapping) and d.get("model") == preset
            for d in load_config(path).get("defaults") or []
        )
    ]
    return selecting[0] if len(selecting) == 1 else "config"


def composed(config: str) -> Any:
    """The training config ``config`` names, composed in this process (a child) as check-config
    composes it: an OmegaConf DictConfig, interpolations unresolved."""
    from omegaconf import OmegaConf, open_dict  # reason: Hydra, in the child

    where, name, overrides, model = _where_to_compose(config)
    request = ComposeRequest(
        config_dir=str(where), config_name=name, overrides=tuple(overrides), trusted=SEARCH_ROOTS
    )
    try:
        reply = ComposeReply.from_json(children.compose(request.to_json()))
    except Exception as exc:
        raise InputFileError(
            f"Hydra cannot compose it as anemoi-training would: {type(exc).__name__}: {exc}",
            path=config,
            fix="`kernel-probe check-config CONFIG` names the problem",
        ) from None
    cfg = OmegaConf.create(reply.tree)
    if model is not None:
        with open_dict(cfg):
            cfg["model"] = OmegaConf.create(dict(model))
    return cfg


def validated(cfg: Any, config: str) -> Any:
    """``cfg`` as anemoi-training's trainer sees it: ``???`` filled, resolved, and through
    ``BaseSchema`` where ``config_validation`` is on."""
    from omegaconf import OmegaConf  # reason: Hydra, in the child

    _fill_missing(cfg, (), [])
    try:
        OmegaConf.resolve(cfg)
    except Exception as exc:
        raise InputFileError(
            f"OmegaConf cannot resolve it: {exc}",
            path=config,
            fix="set what the reference points at (anemoi-training resolves it the same way)",
        ) from None
    if not cfg.get("config_validation", True):
        return cfg
    from anemoi.training.schemas.base_schema import BaseSchema, convert_to_omegaconf
    from pydantic import ValidationError

    try:
        return convert_to_omegaconf(BaseSchema(**cfg))
    except ValidationError as exc:
        errors, _ = closest_members([dict(e) for e in exc.errors()], OmegaConf.to_container(cfg))
        said = "; ".join(f"{e['where']}: {e['message']}" for e in errors[:4])
        more = f" (and {len(errors) - 4} more)" if len(errors) > 4 else ""
        raise InputFileError(
            f"anemoi-training's schema rejects it, so training would not build this model: "
            f"{said}{more}",
            path=config,
            fix="`kernel-probe check-config CONFIG` reports each error at its path",
        ) from None


# ---- sizes ---------------------------------------------------------------------------------------
def variables(dataset: Mapping[str, Any], dataset_path: str) -> list[str]:
    """The dataset's variables where its metadata is readable here, else the config's forcings and
    diagnostics after ``ASSUMED_PROGNOSTIC`` (with a warning)."""
    try:
        attrs = json.loads((Path(dataset_path) / ".zattrs").read_text())
        names = [str(v) for v in attrs["variables"]]
        if names:
            return names
    except (OSError, ValueError, KeyError, TypeError):
        pass
    own = [*(dataset.get("forcing") or []), *(dataset.get("diagnostic") or [])]
    warnings.warn(
        f"the dataset ({dataset_path or 'not set'}) is not readable here: its variables are the "
        f"config's forcings and diagnostics and {len(ASSUMED_PROGNOSTIC)} assumed prognostic ones "
        f"({', '.join(ASSUMED_PROGNOSTIC)}); the encoder's input and the decoder's output widths "
        "follow from them",
        stacklevel=2,
    )
    return [*ASSUMED_PROGNOSTIC, *(str(v) for v in own if v not in ASSUMED_PROGNOSTIC)]


def sdpa_where_no_flash(cfg: Any) -> None:
    """Every ``flash_attention`` component set to anemoi's SDPA where flash-attn does not import."""
    if anemoi_flash_generation() is not None:
        return
    for where, comp in list(mappings_where(cfg, lambda m: "attention_implementation" in m)):
        if comp.get("attention_implementation") == FLASH:
            comp["attention_implementation"] = SDPA  # type: ignore[index]  # a DictConfig
            warnings.warn(
                f"{where}: flash-attn is not importable here: built with anemoi's {SDPA} (the same "
                "attention; anemoi's inference setting "
                "ANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND does the same)",
                stacklevel=2,
            )


# ---- the model -----------------------------------------------------------------------------------
def _graph(cfg: Any, sizes: GraphSizes) -> Any:
    """A ``HeteroData`` with the config's node and edge sets at their sizes (:class:`_Values`)."""
    from torch_geometric.data import HeteroData  # type: ignore[import-untyped]  # in the child

    g, values = HeteroData(), _Values()
    for name, n in sizes.nodes.items():
        g[name].x = values.coordinates(n)
        for attribute in cfg.graph.nodes[name].get("attributes") or {}:
            g[name][attribute] = values.uniform(n, 1)
    widths = {"edge_length": 1, "edge_dirs": 2}
    for edge in cfg.graph.edges:
        key = (str(edge.source_name), str(edge.target_name))
        store, n = g[(key[0], "to", key[1])], sizes.edges[key]
        store.edge_index = values.edges(n, sizes.nodes[key[0]], sizes.nodes[key[1]])
        for attribute in edge.attributes:
            store[attribute] = values.normal(n, widths.get(str(attribute), 1))
    if not values.meta:
        warnings.warn(SEEDED_GRAPH, stacklevel=2)
    return g


class _Values:
    """The graph's and the batch's values: empty on the meta device, else seeded (``SEED``); edge
    destinations spread evenly, so every index is in range (:data:`SEEDED_GRAPH`)."""

    def __init__(self) -> None:
        import torch  # reason: torch in the child only

        self.torch, self.device = torch, torch.empty(0).device
        self.meta = self.device.type == "meta"
        self.gen = torch.Generator().manual_seed(SEED)

    def _drawn(self, draw: Any, *shape: int) -> Any:
        if self.meta:
            return self.torch.empty(*shape)
        return draw(shape, generator=self.gen, device="cpu").to(self.device)

    def uniform(self, *shape: int) -> Any:
        return self._drawn(self.torch.rand, *shape) + 0.5

    def normal(self, *shape: int) -> Any:
        return self._drawn(self.torch.randn, *shape)

    def coordinates(self, n: int) -> Any:
        """(latitude, longitude) in radians."""
        return (self._drawn(self.torch.rand, n, 2) - 0.5) * self.torch.tensor([3.1416, 6.2832])

    def edges(self, n: int, sources: int, destinations: int) -> Any:
        torch = self.torch
        if self.meta:
            return torch.empty(2, n, dtype=torch.long)
        src = torch.randint(sources, (n,), generator=self.gen)
        return torch.stack([src, torch.arange(n) * destinations // max(n, 1)]).to(self.device)


def build(config: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(``AnemoiModelInterface``, its forward's args, kwargs) for ``config``; call it under ``with
    torch.device("meta")``."""
    import numpy as np  # reason: torch and anemoi in the child only
    import torch
    from anemoi.models.data_indices.collection import IndexCollection
    from anemoi.models.interface import AnemoiModelInterface
    from anemoi.models.utils.config import get_multiple_datasets_config

    from kernel_probe.anemoi import meta_graph  # reason: numpy and torch, in the child

    cfg = validated(composed(config), config)
    sdpa_where_no_flash(cfg)
    sizes = graph_sizes(cfg.graph)
    for note in sizes.notes:
        warnings.warn(note, stacklevel=2)
    indices, statistics, names = {}, {}, {}
    for name, dataset in get_multiple_datasets_config(cfg.data).items():
        path = dataset_name(cfg.dataloader.get("dataset"))
        names[name] = variables(dataset, path)
        indices[name] = IndexCollection(dataset, {v: j for j, v in enumerate(names[name])})
        n = len(names[name])
        zeros, ones = np.zeros(n), np.ones(n)
        statistics[name] = {"mean": zeros, "stdev": ones, "minimum": -ones, "maximum": ones}
    device = torch.empty(0).device
    if "multistep_input" not in (cfg.get("task") or {}):
        raise InputFileError(
            f"its task ({(cfg.get('task') or {}).get('_target_', 'none')}) is not a forecaster "
            "(no task.multistep_input): this builder builds forecasters' inputs",
            path=config,
            fix="probe it from its flags (--attention, --activation, ...) for now",
        )
    meta_graph.install()
    try:
        model = meta_graph.interface(
            config=cfg,
            n_step_input=int(cfg.task.multistep_input),
            n_step_output=int(cfg.task.get("multistep_output", 1)),
            graph_data=_graph(cfg, sizes),
            statistics=statistics,
            data_indices=indices,
            metadata={"metadata_inference": {name: {} for name in indices}},
            statistics_tendencies=None,
            supporting_arrays={name: {} for name in indices},
        )
    except Exception as exc:  # anemoi-models' own refusal of this config
        cause = exc.__cause__ or exc
        raise InputFileError(
            f"anemoi-models cannot build it: {type(cause).__name__}: {str(cause)[:300]}",
            path=config,
            fix="`kernel-probe check-config CONFIG` checks the config as training reads it",
        ) from None
    assert type(model) is AnemoiModelInterface
    meta_graph.known_sizes(model)
    attention_through_the_slot(model)
    model.to(device)
    # (batch, multistep_input, ensemble members per device, grid, input variables)
    run = int(cfg.dataloader.batch_size.training), int(cfg.task.multistep_input)
    ensemble = int(cfg.training.get("ensemble_size_per_device", 1) or 1)
    batch, values = {}, _Values()
    for name, index in indices.items():
        inputs = len(index.data.input.full)  # type: ignore[attr-defined]
        batch[name] = values.normal(*run, ensemble, sizes.nodes[name], inputs)
    return model, (batch,), forward_keywords(model.model, config)


def attention_through_the_slot(model: Any) -> None:
    """Each anemoi attention (without softcap or alibi) run through the Attention slot's
    ``SDPAttention`` with its own window, so the trace records the window."""
    import torch  # reason: torch and anemoi in the child only
    from anemoi.models.layers.attention import MultiHeadSelfAttention

    from kernel_lock.attention import SDPAttention  # reason: torch, in the child

    class Through(torch.nn.Module):
        """anemoi's call of its attention backend, made of the slot's module."""

        def __init__(self, window: int) -> None:
            super().__init__()
            self.slot = SDPAttention(window=window)

        def forward(self, query, key, value, batch_size, causal=False, window_size=None,
                    dropout_p=0.0, softcap=None, alibi_slopes=None):  # fmt: skip
            return self.slot(query, key, value, dropout_p=dropout_p, is_causal=causal)

    for module in model.modules():
        if not isinstance(module, MultiHeadSelfAttention):
            continue
        if (module.softcap or 0.0) > 0 or module.alibi_slopes is not None:
            continue
        window = -1 if module.window_size is None else int(module.window_size)
        module.attention = Through(window)
        module._attention_backend_applied = True  # anemoi's env override: already the slot's


def forward_keywords(inner: Any, config: str) -> dict[str, Any]:
    """What the model's forward takes beside the batch (an ensemble model: ``fcstep=0``); a
    transport (diffusion) model is refused."""
    from anemoi.models.models.ens_encoder_processor_decoder import AnemoiEnsModelEncProcDec
    from anemoi.models.models.transport_encoder_processor_decoder import (
        AnemoiTransportModelEncProcDec,
    )

    if isinstance(inner, AnemoiTransportModelEncProcDec):
        raise InputFileError(
            f"{type(inner).__name__} (a transport, diffusion, model) takes a conditioned target "
            "and a condition besides the batch, which this builder does not construct",
            path=config,
            fix="probe it from its flags (--attention, --activation, ...) for now",
        )
    return {"fcstep": 0} if isinstance(inner, AnemoiEnsModelEncProcDec) else {}
