"""The node-classification dataset container shared by generators and loaders."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Tuple, Union

import torch

from ..graph import CSRGraph
from ..unified import require_shared_memory


def shared_host_tensor(shape: Union[int, Sequence[int]], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor allocated directly in shared memory (no copy).

    Unlike :func:`pytorch_zerocopy.empty_shared` it never touches the GPU: no CUDA context is
    created and nothing is registered, so a process that only prepares data stays GPU-free
    (an MPS partition started later then owns the GPU). Children that receive the tensor map
    the same bytes and register them themselves when they make them unified.
    """
    shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    require_shared_memory(nbytes, f"a shared {tuple(shape)} {str(dtype).replace('torch.', '')} tensor",
                          "free space in it")
    storage = torch.UntypedStorage._new_shared(max(1, nbytes))
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


@dataclass
class NodeDataset:
    """A node-classification dataset: a graph with node features, labels and splits.

    ``graph`` is a :class:`~pytorch_zerocopy.graph.CSRGraph` whose row ``v`` lists ``v``'s
    in-neighbours (the sources of the edges into ``v``): the transpose (CSC) of the edge list,
    which is what a GNN layer aggregates over and what neighbour sampling reads, so sampling
    needs no transpose at run time (``sample_layers(ds.graph, seeds, fanouts,
    edge_dir='out')`` samples the rows as stored; block edges run from the sampled
    in-neighbour to its seed). Directed datasets (``papers_like``, OGB's papers100M) are built
    in this orientation directly; the generated community graph is symmetric
    (``graph.symmetric``), so its rows are both its in- and out-neighbour lists. Edge ids are
    positions in these rows.

    ``features`` is a ``[num_nodes, dim]`` host tensor in shared memory (a child process that
    receives it maps the same bytes; convert it there with ``.to("unified")``). ``labels`` are
    int64 in ``[0, num_classes)`` (-1: unlabelled). Splits hold node ids. All tensors live on the
    CPU; :meth:`share_memory_` moves the graph and labels into shared memory so that sending
    the dataset to ``torch.multiprocessing`` children costs no copy.
    """

    name: str
    graph: CSRGraph
    features: torch.Tensor
    labels: torch.Tensor
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_edges(self) -> int:
        return self.graph.num_edges

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def row_bytes(self) -> int:
        """Bytes of one node's feature row."""
        return self.feature_dim * self.features.element_size()

    def edges(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(src, dst)`` of every edge, in edge-id order (DGL's ``g.edges()``; e.g.
        ``dgl.graph(ds.edges())`` builds the same graph in DGL)."""
        g = self.graph
        dst = torch.repeat_interleave(torch.arange(g.num_nodes), g.indptr[1:] - g.indptr[:-1])
        return g.indices.long(), dst

    def share_memory_(self) -> "NodeDataset":
        for t in (self.graph.indptr, self.graph.indices, self.labels, self.train_idx, self.val_idx, self.test_idx):
            t.share_memory_()
        if not self.features.is_shared():
            self.features.share_memory_()
        return self

    def describe(self) -> str:
        gib = self.features.numel() * self.features.element_size() / 2**30
        return (f"{self.name}: {self.num_nodes:,} nodes, {self.num_edges:,} edges, "
                f"{self.feature_dim} x {str(self.features.dtype).replace('torch.', '')} features "
                f"({gib:.2f} GiB), {self.num_classes} classes, train/val/test "
                f"{self.train_idx.numel():,}/{self.val_idx.numel():,}/{self.test_idx.numel():,}")


def in_neighbour_graph(indptr: torch.Tensor, indices: torch.Tensor, symmetric: bool = False) -> CSRGraph:
    """The :class:`CSRGraph` of a dataset from in-neighbour lists its builder made well formed
    (int64 offsets, ids in range: not checked again)."""
    return CSRGraph(indptr, indices, symmetric=symmetric, validate=False)
