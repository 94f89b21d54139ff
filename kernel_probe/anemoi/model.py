"""The anemoi model a training config describes, built as anemoi-training builds it: the child-side
builder behind the model spec ``anemoi:CONFIG``, and what a probe declares for it.

``CONFIG`` is a YAML path (an overlay with a ``defaults:`` list, a model file, a complete config:
composed as ``check-config`` reads it, ``kernel_probe.anemoi.reading``) or the name of a config
anemoi-training ships (``ensemble_crps``; a model preset, ``transformer``, is composed with the one
shipped config that selects it, else the packaged ``config``, with ``model=<name>``).
:func:`build` composes it, fills the mandatory ``???`` values (the dataset, the output root) with
placeholders, validates it with anemoi-training's ``BaseSchema`` (where ``config_validation`` is
on, as training does; its errors refuse the build), and builds ``AnemoiModelInterface`` (encoders,
processor and decoders through the config's ``layer_kernels``, by anemoi-models' own code) on the
graph the config describes, sized by ``kernel_probe.anemoi.grids`` (O96 = 40,320 nodes, N320 =
542,080, ...); the inputs are one training batch: ``(batch, multistep_input, ensemble, data
nodes, input variables)``.

The graph itself is not built (that needs the dataset, anemoi-utils' grid files and scikit-learn):
its node coordinates, edge attributes and edge indices are tensors of the real sizes:
uninitialised on the meta device (``with torch.device("meta")``: the trace, no memory at any
size), seeded elsewhere (check-model on the CPU or a GPU: a synthetic graph with every edge index
in range, and seeded inputs, a warning says so; ``_Values``). Two of anemoi-models' graph
helpers read the graph's values (the in-degrees that split the edges into chunks, the sources a
chunk touches); on the meta device they take each destination's in-degree as equal and every
source as touched (``meta_graph``: chunk sizes are estimates there; any other tensor goes to
anemoi's own code). The variables are the
dataset's where it is readable here, else the config's forcings and diagnostics plus
``ASSUMED_PROGNOSTIC`` (a warning says so). Where flash-attn is not importable here, a
``flash_attention`` component is built with anemoi's ``scaled_dot_product_attention`` (the same
attention; a warning says so).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_probe.anemoi.config import classify, group_member, load_config, mappings_where
from kernel_probe.anemoi.grids import GraphSizes, dataset_name, graph_sizes
from kernel_probe.anemoi.reading import SEARCH_ROOTS, packaged_dir
from kernel_probe.errors import InputFileError

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
    path = Path(config)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        root = load_config(path)
        kind = classify(root, path).shape
        if kind == "overlay":
            return path.resolve().parent, path.stem, [], None
        if kind == "model-file" and group_member(root, path):
            return path.resolve().parent.parent, "config", [f"model={path.stem}"], None
        if kind == "full":
            return path.resolve().parent, path.stem, [], None
        if packaged is None:
            raise _no_training(config)
        return packaged, "config", [], root  # a model file alone: the packaged config around it
    if packaged is None:
        raise _no_training(config)
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
    """The packaged config a model preset is shipped with: the one config that selects it (``-
    model: transformer_ens`` in ``ensemble_crps.yaml``: its data, graph and training), else
    ``config`` (anemoi-training's default, which ``model=<preset>`` overrides)."""
    selecting = [
        path.stem
        for path in sorted(packaged.glob("*.yaml"))
        if any(
            isinstance(d, Mapping) and d.get("model") == preset
            for d in load_config(path).get("defaults") or []
        )
    ]
    return selecting[0] if len(selecting) == 1 else "config"


def _no_training(config: str) -> InputFileError:
    return InputFileError(
        "anemoi-training is not installed here: its configs (and the presets a model file is "
        "composed with) cannot be found",
        path=config,
        fix="pip install --no-deps anemoi-training (as .ci/anemoi-install does)",
    )


def composed(config: str) -> Any:
    """The training config ``config`` names, composed by Hydra as check-config composes it (in
    this process: the caller is a child), as an OmegaConf DictConfig, interpolations unresolved."""
    from omegaconf import OmegaConf, open_dict  # reason: Hydra, in the child

    from kernel_probe.anemoi import children  # reason: Hydra's composition, in the child
    from kernel_probe.isolation.protocol import ComposeReply, ComposeRequest

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
    """``cfg`` as anemoi-training's trainer sees it: ``???`` filled with placeholders, resolved, and
    through its ``BaseSchema`` where ``config_validation`` is on (errors refuse, naming them)."""
    from omegaconf import OmegaConf  # reason: Hydra, in the child

    from kernel_probe.anemoi.children import _fill_missing, closest_members

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
@dataclass(frozen=True)
class Inputs:
    """One training batch's sizes."""

    batch: int
    steps: int
    ensemble: int


def batch_sizes(cfg: Any) -> Inputs:
    """The training batch: ``dataloader.batch_size.training``, ``task.multistep_input``, and the
    ensemble members per device of an ensemble training (else 1)."""
    batch = int(cfg.dataloader.batch_size.training)
    steps = int(cfg.task.get("multistep_input", 1)) if cfg.get("task") is not None else 1
    ensemble = int(cfg.training.get("ensemble_size_per_device", 1) or 1)
    return Inputs(batch, steps, ensemble)


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
    """Every ``flash_attention`` component built with anemoi's SDPA path where flash-attn does not
    import here (a warning names each)."""
    from kernel_lock.trust import anemoi_flash_generation

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
    """A ``HeteroData`` with the config's node and edge sets at their sizes: values unset on the
    meta device, else seeded ones (:class:`_Values`)."""
    import torch  # reason: torch in the child only
    from torch_geometric.data import HeteroData  # type: ignore[import-untyped]

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
    if torch.empty(0).device.type != "meta":
        warnings.warn(SEEDED_GRAPH, stacklevel=2)
    return g


class _Values:
    """The graph's and the batch's values on the default device: uninitialised on the meta device
    (tracing reads no value); elsewhere (check-model computes) seeded (``SEED``) values of the real
    sizes: coordinates uniform over latitude and longitude, attributes uniform in [0.5, 1.5), edge
    features and inputs standard normal, each edge set's sources drawn uniformly and its
    destinations spread evenly (every destination the same in-degree, up to one): every index in
    range. A synthetic graph (:data:`SEEDED_GRAPH`): the models compared see the same one."""

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
    """(``AnemoiModelInterface``, its forward's args, kwargs) for the training config ``config``
    (the module docstring): call it under ``with torch.device("meta")``."""
    import numpy as np  # reason: torch and anemoi in the child only
    import torch
    from anemoi.models.data_indices.collection import IndexCollection
    from anemoi.models.interface import AnemoiModelInterface
    from anemoi.models.utils.config import get_multiple_datasets_config

    from kernel_probe.anemoi import meta_graph

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
    run = batch_sizes(cfg)
    batch, values = {}, _Values()
    for name, index in indices.items():
        inputs = len(index.data.input.full)  # type: ignore[attr-defined]
        grid = sizes.nodes[name]
        batch[name] = values.normal(run.batch, run.steps, run.ensemble, grid, inputs)
    return model, (batch,), forward_keywords(model.model, config)


def attention_through_the_slot(model: Any) -> None:
    """Each anemoi attention's backend (its SDPA or flash wrapper) called through the Attention
    slot's module, ``kernel_lock.attention.SDPAttention``, with the attention's own window: the
    trace then records the window (anemoi's SDPA path passes it as a boolean mask, which says no
    window), so the probe checks and the lock pins it, and the export and check-config agree with
    the config's ``window_size``. The same attention (query i sees key j iff |i - j| <=
    window_size), no parameter, the same state dict. One with a softcap or alibi slopes is left as
    anemoi built it."""
    import torch  # reason: torch and anemoi in the child only
    from anemoi.models.layers.attention import MultiHeadSelfAttention

    from kernel_lock.attention import SDPAttention

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
    """What the model's forward takes beside the batch: an ensemble model the forecast step (its
    first, 0). A transport (diffusion) model's conditioned target and condition are refused."""
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
