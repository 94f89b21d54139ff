"""What building and running an anemoi model on the meta device needs (imported in the child
only): input normalisers built on the CPU (:func:`interface`), ``edge_inc`` buffers that keep
their values (:class:`KnownInts`), and the two graph helpers that read the edge index's values
wrapped for a meta edge index (:func:`install`: equal in-degrees, every source touched)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_INSTALLED: list[bool] = []


class KnownInts(torch.Tensor):
    """A meta tensor of integers that knows its values (``tolist``, indexing)."""

    known: np.ndarray

    @staticmethod
    def __new__(cls, values: Any) -> KnownInts:
        """The meta tensor of ``values``."""
        array = np.asarray(values, dtype=np.int64)
        empty = torch.empty(array.shape, dtype=torch.long, device="meta")
        out = torch.Tensor._make_subclass(cls, empty)
        out.known = array
        return out

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """``tolist`` and indexing from the known values; anything else as a plain meta tensor."""
        self = args[0] if args else None
        if isinstance(self, KnownInts):
            if func is torch.Tensor.tolist:
                return self.known.tolist()
            if func is torch.Tensor.__getitem__:
                return KnownInts(self.known[args[1]])
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def known_sizes(model: torch.nn.Module) -> None:
    """Every CPU ``edge_inc`` buffer of ``model`` made a :class:`KnownInts` where the default device
    is meta (else left as it is)."""
    if torch.empty(0).device.type != "meta":
        return
    for module in model.modules():
        inc = module._buffers.get("edge_inc")
        if inc is not None and inc.device.type == "cpu":
            module._buffers["edge_inc"] = KnownInts(inc.numpy())


def install() -> None:
    """anemoi-models' two value-reading graph helpers, wrapped for a meta edge index (once)."""
    if _INSTALLED:
        return
    from anemoi.models.distributed import khop_edges
    from anemoi.models.layers import mapper

    partition, drop = khop_edges.build_graph_partition, khop_edges._drop_unconnected_src_nodes

    def build_graph_partition(edge_index: Any, num_parts: int, num_nodes: Any) -> Any:
        if edge_index.device.type != "meta":
            return partition(edge_index, num_parts, num_nodes)
        dst = khop_edges.get_balanced_partition_sizes(num_nodes[1], num_parts)
        edges, ends = edge_index.size(1), np.cumsum(dst)
        cut = [0, *(int(edges * int(e) // max(num_nodes[1], 1)) for e in ends)]
        splits = [b - a for a, b in zip(cut, cut[1:], strict=False)]
        return khop_edges.GraphPartition(
            num_nodes=num_nodes,
            num_edges=edges,
            num_parts=num_parts,
            dst_splits=dst,
            edge_splits=splits,
        )

    def drop_unconnected_src_nodes(x_src: Any, edge_index: Any, in_place: bool = True) -> Any:
        if edge_index.device.type != "meta":
            return drop(x_src, edge_index, in_place)
        return x_src, edge_index, torch.arange(x_src.shape[0], device=x_src.device)

    khop_edges.build_graph_partition = build_graph_partition
    mapper.build_graph_partition = build_graph_partition  # imported by name there
    khop_edges._drop_unconnected_src_nodes = drop_unconnected_src_nodes
    _INSTALLED.append(True)


def interface(**kwargs: Any) -> Any:
    """``AnemoiModelInterface(**kwargs)``, its input and output processors built on the CPU."""
    from anemoi.models.interface import AnemoiModelInterface

    class _CpuProcessors(AnemoiModelInterface):
        def _build_processors_for_dataset(self, *args: Any, **kw: Any) -> Any:
            with torch.device("cpu"):
                return super()._build_processors_for_dataset(*args, **kw)

    model: Any = _CpuProcessors(**kwargs)
    model.__class__ = AnemoiModelInterface  # what anemoi-training builds (and pickles)
    return model
