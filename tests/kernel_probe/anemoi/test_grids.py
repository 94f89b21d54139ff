"""The graph sizes an anemoi config describes (kernel_probe.anemoi.grids): the known grids as data,
each edge builder's count, the dataset's grid read, named or assumed, and refusals."""

from __future__ import annotations

import json

import pytest

from kernel_probe.anemoi import grids
from kernel_probe.errors import InputFileError


def test_the_known_grids_have_their_documented_sizes():
    # O96 as anemoi-graphs' hetero_data_graph.txt shows it; N320 and O1280 as ECMWF documents them
    assert grids.GRIDS["o96"] == 40_320
    assert grids.GRIDS["n320"] == 542_080
    assert grids.GRIDS["o1280"] == 6_599_680
    assert (grids.GRIDS["o32"], grids.GRIDS["o48"]) == (5_248, 10_944)
    assert grids.tri_nodes(5) == 10_242 and grids.tri_nodes(6) == 40_962


def _multi_scale(data: dict) -> dict:
    return {
        "nodes": {
            "data": {"node_builder": data},
            "hidden": {
                "node_builder": {"_target_": "anemoi.graphs.nodes.TriNodes", "resolution": 5}
            },
        },
        "edges": [
            {
                "source_name": "data",
                "target_name": "hidden",
                "edge_builders": [
                    {"_target_": "anemoi.graphs.edges.CutOffEdges", "cutoff_factor": 0.6}
                ],
            },
            {
                "source_name": "hidden",
                "target_name": "hidden",
                "edge_builders": [
                    {
                        "_target_": "anemoi.graphs.edges.MultiScaleEdges",
                        "x_hops": 1,
                        "scale_resolutions": 5,
                    }
                ],
            },
            {
                "source_name": "hidden",
                "target_name": "data",
                "edge_builders": [
                    {"_target_": "anemoi.graphs.edges.KNNEdges", "num_nearest_neighbours": 3}
                ],
            },
        ],
    }


def test_anemoi_graphs_documented_o96_graph_is_reproduced():
    data = {"_target_": "anemoi.graphs.nodes.ReducedGaussianGridNodes", "grid": "o96"}
    sizes = grids.graph_sizes(_multi_scale(data))
    assert sizes.nodes == {"data": 40_320, "hidden": 10_242}
    # hetero_data_graph.txt: data -> hidden 62,980, multi-scale 81,900; KNN: 3 per data node
    assert sizes.edges[("data", "hidden")] == 62_980
    assert sizes.edges[("hidden", "hidden")] == 81_900
    assert sizes.edges[("hidden", "data")] == 3 * 40_320
    assert any("estimated" in n for n in sizes.notes)


def test_the_data_grid_is_read_from_the_dataset_then_its_name_then_assumed(tmp_path):
    zarr = tmp_path / "my.zarr"
    (zarr / "latitudes").mkdir(parents=True)
    (zarr / "latitudes" / ".zarray").write_text(json.dumps({"shape": [1234]}))
    builder = {
        "_target_": "anemoi.graphs.nodes.AnemoiDatasetNodes",
        "dataset": {"dataset": str(zarr)},
    }
    notes: list[str] = []
    assert grids.node_count("data", {"node_builder": builder}, notes) == 1234
    named = dict(builder, dataset="aifs-ea-an-oper-0001-mars-n320-1979-2022-6h-v6")
    assert grids.node_count("data", {"node_builder": named}, notes) == 542_080
    assert "N320 grid, named by the dataset" in notes[-1]
    unknown = dict(builder, dataset="/nowhere/my-data.zarr")
    assert grids.node_count("data", {"node_builder": unknown}, notes) == 542_080
    assert "assumed" in notes[-1] and "/nowhere/my-data.zarr" in notes[-1]


@pytest.mark.parametrize(
    ("builder", "said"),
    [
        ({"_target_": "anemoi.graphs.nodes.ReducedGaussianGridNodes", "grid": "o97"}, "o97"),
        ({"_target_": "anemoi.graphs.nodes.HEALPixNodes", "resolution": 3}, "HEALPixNodes"),
    ],
)
def test_a_grid_or_builder_it_cannot_size_is_refused_naming_it(builder, said):
    with pytest.raises(InputFileError) as caught:
        grids.node_count("hidden", {"node_builder": builder}, [])
    assert said in str(caught.value) and "graph.nodes.hidden.node_builder" in str(caught.value)
    assert caught.value.fix


def test_an_edge_builder_it_cannot_count_is_refused_naming_it():
    data = {"_target_": "anemoi.graphs.nodes.ReducedGaussianGridNodes", "grid": "o48"}
    graph = _multi_scale(data)
    graph["edges"][0]["edge_builders"] = [{"_target_": "anemoi.graphs.edges.ICONTopologicalEdges"}]
    with pytest.raises(InputFileError, match="ICONTopologicalEdges"):
        grids.graph_sizes(graph)
