"""The sizes of an anemoi model's graph from its config's ``graph:`` section, without building it
(plain arithmetic, no torch): node sets ``ReducedGaussianGridNodes`` (``GRIDS``: O``N`` has
4N(N + 9) points, N320 542,080), ``TriNodes`` (10 * 4**r + 2) and ``AnemoiDatasetNodes`` (the
dataset's zarr, else the grid its name names, else ``ASSUMED_DATA_GRID``, noted); edge sets
``KNNEdges``, ``MultiScaleEdges`` on ``TriNodes`` with ``x_hops: 1`` (60 * 4**l per level) and
``CutOffEdges`` (estimated: ``CUTOFF_EDGES``). Any other builder is refused, naming it
(docs/anemoi.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_probe.errors import InputFileError

# the grids anemoi-graphs' ReducedGaussianGridNodes accepts (graphs/schemas/node_schemas.py)
GRIDS = {f"o{n}": 4 * n * (n + 9) for n in (16, 32, 48, 96, 160, 256, 320, 1280)}
GRIDS["n320"] = 542_080
ASSUMED_DATA_GRID = "n320"  # AIFS: N320 data, O96 hidden (shared/research/anemoi.md)
# CutOffEdges connects each target node to the source nodes within cutoff_factor x the target
# grid's spacing, so the count grows with the source nodes and the factor squared (the target's
# count cancels): edges ~ K x factor**2 x source nodes, K from anemoi-graphs' documented graph
# (O96 data -> r5 hidden, factor 0.6: 62,980 edges).
CUTOFF_EDGES = 62_980 / (0.6**2 * GRIDS["o96"])
EARTH_RADIUS_KM = 6371.0
_GRID_IN_NAME = re.compile(r"(?<![a-z0-9])([on]\d+)(?![0-9])")


@dataclass
class GraphSizes:
    """Nodes per node set, edges per (source, target) edge set, and how each was found."""

    nodes: dict[str, int] = field(default_factory=dict)
    edges: dict[tuple[str, str], int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _refuse(where: str, problem: str, fix: str) -> InputFileError:
    return InputFileError(problem, key=where, fix=fix)


def tri_nodes(resolution: int) -> int:
    """Nodes of the icosahedron refined ``resolution`` times.

    >>> tri_nodes(5), tri_nodes(6)
    (10242, 40962)
    """
    return 10 * 4**resolution + 2


def grid_nodes(grid: str, where: str) -> int:
    """The points of one of anemoi-graphs' reduced Gaussian grids (``o96``, ``n320``, ...).

    >>> grid_nodes("o96", "graph"), grid_nodes("N320", "graph"), grid_nodes("o1280", "graph")
    (40320, 542080, 6599680)
    """
    try:
        return GRIDS[str(grid).lower()]
    except KeyError:
        raise _refuse(
            where,
            f"grid {grid!r} is not one of anemoi-graphs' reduced Gaussian grids",
            f"use one of {', '.join(GRIDS)}",
        ) from None


def dataset_name(dataset: Any) -> str:
    """The dataset a node builder's ``dataset`` names (a path or name, or a mapping holding one)."""
    while isinstance(dataset, Mapping):
        dataset = dataset.get("dataset")
    return dataset if isinstance(dataset, str) else ""


def dataset_nodes(dataset: Any, where: str, notes: list[str]) -> int:
    """The data nodes of an ``AnemoiDatasetNodes`` builder: the dataset's grid (see the module)."""
    name = dataset_name(dataset)
    try:  # its ``latitudes`` array's metadata, where the dataset is a readable zarr here
        meta = json.loads((Path(name) / "latitudes" / ".zarray").read_text()) if name else {}
        points = int(meta["shape"][0])
        notes.append(f"{where}: {points:,} nodes, read from the dataset {name}")
        return points
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    found = [g for g in _GRID_IN_NAME.findall(Path(name).name.lower()) if g in GRIDS]
    if found:
        notes.append(f"{where}: the {found[-1].upper()} grid, named by the dataset {name!r}")
        return GRIDS[found[-1]]
    notes.append(
        f"{where}: the dataset ({name or 'not set'}) is not readable here and its name names no "
        f"grid: {ASSUMED_DATA_GRID.upper()} ({GRIDS[ASSUMED_DATA_GRID]:,} nodes, AIFS's data "
        "grid) assumed; name the dataset, or set the node builder to ReducedGaussianGridNodes "
        "with the grid"
    )
    return GRIDS[ASSUMED_DATA_GRID]


def node_count(name: str, spec: Mapping[str, Any], notes: list[str]) -> int:
    """The nodes of the node set ``name`` (its ``graph.nodes.<name>`` entry)."""
    where = f"graph.nodes.{name}.node_builder"
    builder = spec.get("node_builder") if isinstance(spec, Mapping) else None
    builder = builder if isinstance(builder, Mapping) else {}
    target = str(builder.get("_target_", ""))
    kind = target.rsplit(".", 1)[-1]
    if kind == "ReducedGaussianGridNodes":
        return grid_nodes(builder["grid"], where)
    if kind == "TriNodes":
        return tri_nodes(int(builder["resolution"]))
    if kind == "AnemoiDatasetNodes":
        return dataset_nodes(builder.get("dataset"), where, notes)
    raise _refuse(
        where,
        f"node builder {target or '(none)'!r}: its node count is not known without building "
        "the graph",
        "use ReducedGaussianGridNodes (grid: o96, n320, ...), TriNodes (resolution: r) or "
        "AnemoiDatasetNodes",
    )


def edge_count(edge: Mapping[str, Any], graph: Mapping[str, Any], sizes: GraphSizes) -> int:
    """The edges of one entry of ``graph.edges`` (every builder's, summed)."""
    source, target = str(edge["source_name"]), str(edge["target_name"])
    where = f"graph.edges[{source} -> {target}]"
    total = 0
    for builder in edge.get("edge_builders") or []:
        kind = str(builder.get("_target_", "")).rsplit(".", 1)[-1]
        if kind == "KNNEdges":
            total += int(builder["num_nearest_neighbours"]) * sizes.nodes[target]
        elif kind == "CutOffEdges" and (
            builder.get("cutoff_factor") is not None
            or builder.get("cutoff_distance_km") is not None
        ):
            if builder.get("cutoff_factor") is not None:
                n = CUTOFF_EDGES * float(builder["cutoff_factor"]) ** 2 * sizes.nodes[source]
            else:
                r = float(builder["cutoff_distance_km"]) / EARTH_RADIUS_KM
                n = sizes.nodes[source] * sizes.nodes[target] * r * r / 4
            total += round(n)
            sizes.notes.append(f"{where}: ~{round(n):,} cut-off edges (estimated, see grids.py)")
        elif kind == "MultiScaleEdges" and int(builder.get("x_hops", 1)) == 1:
            nodes = graph["nodes"][source]["node_builder"]
            if source != target or not str(nodes.get("_target_", "")).endswith("TriNodes"):
                raise _refuse(where, "MultiScaleEdges counted on TriNodes only", "use TriNodes")
            scale = builder.get("scale_resolutions")
            scale = int(nodes["resolution"]) if scale is None else scale
            levels = range(scale + 1) if isinstance(scale, int) else map(int, scale)
            total += sum(60 * 4**level for level in levels)
        else:
            raise _refuse(
                where,
                f"edge builder {builder.get('_target_')!r}: its edge count is not known without "
                "building the graph",
                "use KNNEdges, CutOffEdges or MultiScaleEdges (x_hops: 1)",
            )
    return total


def graph_sizes(graph: Mapping[str, Any]) -> GraphSizes:
    """Every node and edge set's size for a resolved ``graph:`` section."""
    sizes = GraphSizes()
    for name, spec in (graph.get("nodes") or {}).items():
        sizes.nodes[str(name)] = node_count(str(name), spec, sizes.notes)
    for edge in graph.get("edges") or []:
        key = (str(edge["source_name"]), str(edge["target_name"]))
        sizes.edges[key] = edge_count(edge, graph, sizes)
    if not sizes.nodes:
        raise _refuse("graph.nodes", "the config's graph has no node sets", "compose the graph")
    return sizes
