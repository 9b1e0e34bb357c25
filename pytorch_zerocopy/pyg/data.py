"""A PyG ``Data`` object as this package's ``(FeatureStore, GraphStore)`` pair.

PyG's own loader cuts every attribute of ``data`` down to the minibatch: node-level tensors by
node (``x``, ``y``, masks), edge-level tensors by edge (``edge_attr``, ``edge_weight``), and
copies graph-level values as they are. :func:`stores_from_data` sorts the attributes the same
way: node-level tensors become feature-store tables, ``edge_index`` the graph store's
in-neighbour lists (edge ids = ``edge_index`` columns), and the rest lands in
:class:`DataExtras`, which completes each minibatch.

No copy of a table is made: CPU tensors are mapped in place for the GPU where one serves
unified tensors (their memory stays page-locked while the stores live), else used as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import torch
from torch_geometric.data import Data

from .feature_store import FeatureStore
from ..placement import Placement
from .graph_store import GraphStore, csc_from_coo


class DeviceData(Data):
    """PyG's ``Data`` as this package's loaders make minibatches, whose ``to(device)`` returns
    the minibatch itself at once where every tensor in it (also in a list, tuple or dict) is
    already on ``device``, as each of a loader's is: PyG's ``to`` would visit every attribute
    (about a dozen a minibatch, a Python call and a ``Tensor.to`` each) to move nothing. Any
    other call, with attribute names too, is PyG's ``to``; either way the minibatch itself is
    returned, as PyG's does."""

    def to(self, device, *args: str, non_blocking: bool = False):
        if not args and self._all_on(device):
            return self
        return super().to(device, *args, non_blocking=non_blocking)

    def _all_on(self, device) -> bool:
        if isinstance(device, torch.device):
            want = device
        else:
            try:
                want = torch.device(device)
            except (TypeError, RuntimeError, ValueError):
                return False  # PyG's to says what is wrong with it, or moves to a device torch names otherwise
        if want.type == "cuda" and want.index is None:
            if not torch.cuda.is_available():
                return False  # PyG's to raises torch's error
            want = torch.device("cuda", torch.cuda.current_device())
        for store in self.stores:
            for value in store._mapping.values():
                if type(value) is torch.Tensor:  # most of a minibatch's values: no call
                    if value.device != want:
                        return False
                elif not _on(value, want):
                    return False
        return True


def _on(value: Any, device: torch.device) -> bool:
    """Whether every tensor in ``value`` is on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.device == device
    if isinstance(value, (list, tuple, dict)):
        for v in value.values() if isinstance(value, dict) else value:
            if type(v) is not int and not _on(v, device):  # a minibatch's lists are of counts
                return False
    return True


@dataclass
class DataExtras:
    """What a ``Data`` holds beyond node tables and the edge list.

    ``edge_tables``: edge-level tensors, one row per ``edge_index`` column, read by ``e_id``
    (in a :class:`FeatureStore`, whose rows are edges); ``graph_values``: everything else,
    attached to every minibatch unchanged (as PyG's loader does).
    """

    edge_tables: FeatureStore
    edge_names: Tuple[str, ...] = ()
    graph_values: Dict[str, Any] = field(default_factory=dict)
    explicit_num_nodes: bool = False

    def complete(self, batch: Data) -> Data:
        """Adds the edge-level rows of ``batch.e_id`` and the graph-level values to ``batch``;
        keeps ``num_nodes`` an explicit attribute only where ``data`` had one (as PyG does).
        ``e_id`` must hold valid edge ids, as a sampler's edges do: the rows are read without
        the bounds check that costs a GPU a host synchronisation."""
        stored = batch._store._mapping  # Data's own `in` lists every store's keys first
        if not self.explicit_num_nodes and "num_nodes" in stored:
            del batch.num_nodes
        for name in self.edge_names:
            batch[name] = self.edge_tables.read_rows(name, batch.e_id)
        for name, value in self.graph_values.items():
            if name not in stored:
                batch[name] = value
        return batch


def data_from_dataset(dataset) -> Data:
    """A PyG ``Data`` over a :class:`pytorch_zerocopy.datasets.NodeDataset`, without copying its
    tables: ``x`` is the dataset's (shared-memory) feature table itself, ``y`` its labels,
    ``edge_index`` its edges (source -> target; the dataset lists in-neighbours) and
    ``train_mask``/``val_mask``/``test_mask`` its splits."""
    n = dataset.num_nodes
    edge_index = torch.stack(dataset.edges())
    masks = {}
    for name, idx in (("train_mask", dataset.train_idx), ("val_mask", dataset.val_idx),
                      ("test_mask", dataset.test_idx)):
        masks[name] = torch.zeros(n, dtype=torch.bool).index_fill_(0, idx, True)
    return Data(x=dataset.features, y=dataset.labels, edge_index=edge_index, num_classes=dataset.num_classes,
                **masks)


def stores_from_data(data: Data, placement: Optional[str] = None
                     ) -> Tuple[FeatureStore, GraphStore, DataExtras]:
    """The stores a ``NeighborLoader`` reads for ``data`` (see the module docstring).

    ``placement``: where the graph store keeps the in-neighbour lists and whether feature
    tables are mapped for the GPU (``"unified"``, ``"cpu"`` or ``"cuda"``; default
    ``"unified"`` where a GPU serves unified tensors, else ``"cpu"``).
    """
    if not isinstance(data, Data):
        raise TypeError(f"data must be a torch_geometric.data.Data, got {type(data).__name__} "
                        "(HeteroData is not supported)")
    if "edge_index" not in data:
        names = ", ".join(data.keys())
        raise ValueError(f"data has no edge_index (attributes: {names}); "
                         "a SparseTensor adj_t is not supported: pass edge_index")
    num_nodes = data.num_nodes
    if num_nodes is None:
        raise ValueError("data.num_nodes is unknown: give data.num_nodes or a node feature tensor")
    edge_index = data.edge_index
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"data.edge_index must be a [2, num_edges] tensor, got {getattr(edge_index, 'shape', edge_index)!r}")
    graph_store = GraphStore.from_csc(csc_from_coo(edge_index[0], edge_index[1], int(num_nodes)), placement)
    map_tables = graph_store.placement is not Placement.CPU
    features = FeatureStore(map_host_tables=map_tables)
    edge_tables = FeatureStore(map_host_tables=map_tables)
    edge_names = []
    graph_values: Dict[str, Any] = {}
    for name, value in data.items():
        if name in ("edge_index", "num_nodes"):
            continue
        if isinstance(value, torch.Tensor) and data.is_node_attr(name):
            features.put_tensor(value, group_name=None, attr_name=name, index=None)
        elif isinstance(value, torch.Tensor) and data.is_edge_attr(name):
            edge_tables.put_tensor(value, group_name=None, attr_name=name, index=None)
            edge_names.append(name)
        else:
            graph_values[name] = value
    return features, graph_store, DataExtras(edge_tables, tuple(edge_names), graph_values,
                                             explicit_num_nodes="num_nodes" in data._store)
