"""Build the whole anemoi model (AnemoiModelInterface -> AnemoiModelEncProcDec) on CPU, the way
anemoi-training builds it, from a composed config and a small synthetic graph.

The sequence follows anemoi-training 0.17.1: compose (Hydra, the packaged presets), validate
(`AnemoiTrainer.__init__`: resolve, `BaseSchema`, back to OmegaConf), output masks and supporting
arrays (`BaseGraphModule.__init__`), then `AnemoiModelInterface`. The graph has what the config's
`graph:` section asks for (node sets `data` and `hidden`, edge sets with `edge_length` and
`edge_dirs`), on 40 data nodes and the 12 vertices of an icosahedron; anemoi-graphs' own edge
builders need scikit-learn, so the attributes are computed here (same names, shapes and scaling).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

N_DATA, N_HIDDEN = 40, 12
PROGNOSTIC = ["10u", "10v", "2t", "msl", "t_850", "z_500"]

# The user's overlay: a small model on this CPU. Each line says why it is needed.
SMALL = {
    "system": {
        "input": {
            "dataset": "/nonexistent/unused.zarr",
            "graph": "/nonexistent/graph.pt",
        },  # mandatory ???
        "output": {"root": "/nonexistent/output"},
    },
    "diagnostics": {"log": {"mlflow": {"tracking_uri": None}}},  # mandatory ???
    "model": {
        "num_channels": 32,
        "processor": {"num_layers": 2, "num_chunks": 1},
    },  # small; chunks divide layers
}
PRESET_EXTRA: dict[str, dict[str, Any]] = {
    "gnn": {},
    "graphtransformer": {
        "model": {
            "processor": {"graph_attention_backend": "pyg"},
            "encoders": {"0": {"mapper": {"graph_attention_backend": "pyg"}}},
            "decoders": {"0": {"mapper": {"graph_attention_backend": "pyg"}}},
        }
    },
    # anemoi-training's own transformer pairing (ensemble_crps.yaml): no hidden->hidden edges; SDPA,
    # not flash attention, on a CPU. And two keys anemoi-training 0.17.1's transformer.yaml lacks
    # for anemoi-models 0.19.0 (version drift upstream): latent_aggregator,
    # decoders.0.mapper.num_channels.
    "transformer": {
        "graph": "encoder_decoder_only",
        "model": {
            "processor": {"attention_implementation": "scaled_dot_product_attention"},
            "latent_aggregator": {"_target_": "anemoi.models.layers.aggregator.SumAggregator"},
            "encoders": {"0": {"mapper": {"graph_attention_backend": "pyg"}}},
            "decoders": {
                "0": {
                    "mapper": {
                        "graph_attention_backend": "pyg",
                        "num_channels": "${model.num_channels}",
                    }
                }
            },
        },
    },
}


# The transformer's attention heads at the CPU size: SMALL's 32 channels as the preset's 16 heads
# are heads of 2 channels, and a CPU's attention costs heads x nodes**2 whatever their width (1,600
# nodes, batch 2, forward and backward: 0.30 s with 16 heads of 2, 0.026 s with 2 heads of 16); 2
# heads of 16 keep the preset's code paths (window, processor chunks, checkpointing) at a tenth of
# the time.
CPU_HEADS = 2


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = value
    return base


def write_overlay(path: Path, preset: str) -> Path:
    """A user's config: anemoi-training's defaults list with `model: <preset>`, plus the small
    settings."""
    import copy

    import yaml

    body = deep_merge(copy.deepcopy(SMALL), copy.deepcopy(PRESET_EXTRA[preset]))
    graph = body.pop("graph", "multi_scale")
    defaults = [
        {"data": "zarr"},
        {"dataloader": "native_grid"},
        {"diagnostics": "evaluation"},
        {"system": "example"},
        {"graph": graph},
        {"model": preset},
        {"task": "forecaster"},
        {"training": "single"},
        "_self_",
    ]
    path.write_text(yaml.safe_dump({"defaults": defaults, **body}, sort_keys=False))
    return path


def write_sized(
    path: Path,
    preset: str,
    data_grid: str = "o16",
    hidden: int | str | None = None,
    heads: int | None = CPU_HEADS,
) -> Path:
    """:func:`write_overlay` at a size of one's choice: the dataset named after ``data_grid`` (the
    builder reads the grid from the name), the hidden nodes an icosahedron refined ``hidden`` times
    (an int: TriNodes; r2 = 162 nodes; the multi-scale graph's) or a reduced Gaussian grid (a name,
    ``"o96"``: the encoder-decoder graph's, whose schema takes no TriNodes keys); the transformer's
    attention ``heads`` (None: the preset's 16). The default is check-model's CPU-sized model: an
    O16 dataset (1,600 nodes), r2 or O16 hidden nodes, and for the transformer :data:`CPU_HEADS`."""
    import yaml

    body = yaml.safe_load(write_overlay(path, preset).read_text())
    if preset == "transformer" and heads is not None:
        body["model"]["processor"]["num_heads"] = heads
    body["system"]["input"]["dataset"] = f"/nonexistent/aifs-{data_grid}-unused.zarr"
    gaussian = preset == "transformer"  # its graph: encoder_decoder_only (PRESET_EXTRA)
    hidden = ("o16" if gaussian else 2) if hidden is None else hidden
    if gaussian != isinstance(hidden, str):
        raise ValueError(f"{preset}'s hidden nodes: {'a grid name' if gaussian else 'an int'}")
    builder = {"grid": hidden} if gaussian else {"resolution": hidden}
    body["graph"] = {"nodes": {"hidden": {"node_builder": builder}}}
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def compose_file(path: Path):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base=None, config_dir=str(path.resolve().parent)):
        return compose(config_name=path.stem)


def validated(cfg):
    """What AnemoiTrainer.__init__ does with the composed config (config_validation: True)."""
    from anemoi.training.schemas.base_schema import BaseSchema, convert_to_omegaconf
    from omegaconf import OmegaConf

    OmegaConf.resolve(cfg)
    return convert_to_omegaconf(BaseSchema(**cfg))


# ---- the graph -----------------------------------------------------------------------------------
def _xyz(latlon):
    lat, lon = latlon[:, 0], latlon[:, 1]
    return torch.stack(
        [torch.cos(lat) * torch.cos(lon), torch.cos(lat) * torch.sin(lon), torch.sin(lat)], -1
    )


def _nearest(src, dst, k):
    """Edges from each dst node's k nearest src nodes: edge_index [src; dst]."""
    distance = torch.arccos((_xyz(dst) @ _xyz(src).T).clamp(-1, 1))
    idx = distance.topk(k, dim=1, largest=False).indices
    return torch.stack([idx.reshape(-1), torch.arange(dst.shape[0]).repeat_interleave(k)])


def _attributes(src, dst, edges):
    s, d = src[edges[0]], dst[edges[1]]
    a = (
        torch.sin((d[:, 0] - s[:, 0]) / 2) ** 2
        + torch.cos(s[:, 0]) * torch.cos(d[:, 0]) * torch.sin((d[:, 1] - s[:, 1]) / 2) ** 2
    )
    length = (2 * torch.atan2(a.sqrt(), (1 - a).sqrt()))[:, None]
    lat, lon = d[:, 0], d[:, 1]
    east = torch.stack([-torch.sin(lon), torch.cos(lon), torch.zeros_like(lon)], -1)
    north = torch.stack(
        [-torch.sin(lat) * torch.cos(lon), -torch.sin(lat) * torch.sin(lon), torch.cos(lat)], -1
    )
    v = _xyz(s) - _xyz(d)
    dirs = torch.stack([(v * east).sum(-1), (v * north).sum(-1)], -1)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True).clamp(min=1e-8)
    return {
        "edge_length": (length / length.std()).float(),
        "edge_dirs": (dirs / dirs.std()).float(),
    }


def graph_for(config):
    from torch_geometric.data import HeteroData

    hidden = config.model.model.hidden_nodes_name
    i = torch.arange(N_DATA, dtype=torch.float64) + 0.5  # a Fibonacci sphere
    data = torch.stack(
        [torch.asin(1 - 2 * i / N_DATA), (math.pi * (1 + 5**0.5) * i) % (2 * math.pi) - math.pi], -1
    )
    p = (1 + 5**0.5) / 2
    ico = torch.tensor(
        [
            [0, 1, p],
            [0, -1, p],
            [0, 1, -p],
            [0, -1, -p],
            [1, p, 0],
            [-1, p, 0],
            [1, -p, 0],
            [-1, -p, 0],
            [p, 0, 1],
            [-p, 0, 1],
            [p, 0, -1],
            [-p, 0, -1],
        ],
        dtype=torch.float64,
    )
    ico = ico / ico.norm(dim=-1, keepdim=True)
    coords = {
        "data": data,
        hidden: torch.stack([torch.asin(ico[:, 2]), torch.atan2(ico[:, 1], ico[:, 0])], -1),
    }
    g = HeteroData()
    for name, latlon in coords.items():
        g[name].x = latlon.float()
        for attribute in config.graph.nodes[name].get("attributes") or {}:
            g[name][attribute] = torch.ones(g[name].num_nodes, 1)
    for edge in config.graph.edges:
        s, t = edge.source_name, edge.target_name
        if (s, t) == ("data", hidden):  # every node on both sides connected
            own = torch.stack(
                [
                    torch.arange(N_DATA),
                    torch.arccos((_xyz(data) @ _xyz(coords[hidden]).T).clamp(-1, 1)).argmin(1),
                ]
            )
            edges = torch.unique(torch.cat([_nearest(coords[s], coords[t], 4), own], 1), dim=1)
        elif s == t:
            edges = _nearest(coords[s], coords[t], 6)
            edges = edges[:, edges[0] != edges[1]]
        else:
            edges = _nearest(coords[s], coords[t], 3)
        store = g[(s, "to", t)]
        store.edge_index = edges.long()
        values = _attributes(coords[s], coords[t], edges)
        for attribute in edge.attributes:
            store[attribute] = values[attribute]
    return g


# ---- the model -----------------------------------------------------------------------------------
def build(config) -> tuple[Any, Any]:
    """(AnemoiModelInterface, data indices) for a validated config, as BaseGraphModule builds it."""
    import numpy as np
    from anemoi.models.data_indices.collection import IndexCollection
    from anemoi.models.interface import AnemoiModelInterface
    from anemoi.models.utils.config import get_multiple_datasets_config
    from anemoi.training.utils.masks import build_output_masks

    graph = graph_for(config)
    indices, statistics, arrays, metadata = {}, {}, {}, {"metadata_inference": {}}
    for name, dataset in get_multiple_datasets_config(config.data).items():
        variables = (
            PROGNOSTIC + list(dataset.get("forcing") or []) + list(dataset.get("diagnostic") or [])
        )
        indices[name] = IndexCollection(dataset, {v: j for j, v in enumerate(variables)})
        rng = np.random.default_rng(0)
        n = len(variables)
        statistics[name] = {
            "mean": rng.normal(size=n),
            "stdev": rng.uniform(0.5, 2.0, size=n),
            "minimum": -10.0 * np.ones(n),
            "maximum": 10.0 * np.ones(n),
        }
        lat, lon = graph[name].x.T.numpy()
        arrays[name] = {"latitudes": np.rad2deg(lat), "longitudes": np.rad2deg(lon)}
        metadata["metadata_inference"][name] = {}
    for name, mask in build_output_masks(
        get_multiple_datasets_config(config.model.output_mask), graph
    ).items():
        arrays[name].update(mask.supporting_arrays)
    torch.manual_seed(0)
    model = AnemoiModelInterface(
        config=config,
        n_step_input=int(config.task.multistep_input),
        n_step_output=int(config.task.multistep_output),
        graph_data=graph,
        statistics=statistics,
        data_indices=indices,
        metadata=metadata,
        statistics_tendencies=None,
        supporting_arrays=arrays,
    )
    return model, indices["data"]


def batch(model, index, seed: int = 0) -> dict[str, torch.Tensor]:
    """The model's input as the task feeds it: (batch, input steps, ensemble, grid, input
    variables)."""
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(2, model.n_step_input, 1, N_DATA, len(index.name_to_index), generator=g)
    return {"data": full[..., index.data.input.full]}
