"""The node-classification dataset container shared by generators and loaders."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, Tuple, Union

import torch

from ..graph import CSRGraph
from ..unified import require_shared_memory

if TYPE_CHECKING:
    from .features import FeatureSource


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

    Features: ``feature_source`` (:class:`~pytorch_zerocopy.datasets.features.FeatureSource`;
    a ``[num_nodes, dim]`` CPU tensor given here is wrapped as one) says where the rows come
    from, so the process that reads them loads them straight into the placement it reads
    fastest (:func:`~pytorch_zerocopy.datasets.features.load_table`) and no other copy of the
    table need exist. :attr:`features` is the rows as a host tensor in shared memory, made on
    first use (generated or read then, once) and kept: a child process that receives the
    dataset maps the same bytes.

    ``labels`` are int64 in ``[0, num_classes)`` (-1: unlabelled). Splits hold node ids. All
    tensors live on the CPU; :meth:`share_memory_` moves the graph, labels and any feature
    tensor into shared memory so that sending the dataset to ``torch.multiprocessing``
    children costs no copy (a feature source that is not yet a tensor travels as itself).
    """

    name: str
    graph: CSRGraph
    feature_source: "FeatureSource"
    labels: torch.Tensor
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    num_classes: int

    def __post_init__(self) -> None:
        from .features import FeatureSource, TensorFeatures

        if isinstance(self.feature_source, torch.Tensor):
            self.feature_source = TensorFeatures(self.feature_source)
        if not isinstance(self.feature_source, FeatureSource):
            raise TypeError(f"NodeDataset: features must be a tensor or a FeatureSource, got "
                            f"{type(self.feature_source).__name__}")
        if self.feature_source.num_rows != self.graph.num_nodes:
            raise ValueError(f"NodeDataset: {self.feature_source.num_rows} feature rows for a graph of "
                             f"{self.graph.num_nodes} nodes")

    @property
    def features(self) -> torch.Tensor:
        """The feature rows as a CPU tensor in shared memory (made on first use; see the class
        docstring)."""
        from .features import TensorFeatures, shared_rows

        if self.feature_source.host_tensor() is None:
            self.feature_source = TensorFeatures(shared_rows(self.feature_source))
        return self.feature_source.host_tensor()

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_edges(self) -> int:
        return self.graph.num_edges

    @property
    def feature_dim(self) -> int:
        return self.feature_source.width

    @property
    def feature_dtype(self) -> torch.dtype:
        return self.feature_source.dtype

    @property
    def row_bytes(self) -> int:
        """Bytes of one node's feature row."""
        return self.feature_source.row_bytes

    @property
    def graph_bytes(self) -> int:
        """Bytes of the graph's arrays (offsets, neighbour ids, weights)."""
        g = self.graph
        return sum(t.numel() * t.element_size() for t in (g.indptr, g.indices, g.weights) if t is not None)

    def edges(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(src, dst)`` of every edge, in edge-id order (DGL's ``g.edges()``; e.g.
        ``dgl.graph(ds.edges())`` builds the same graph in DGL)."""
        g = self.graph
        dst = torch.repeat_interleave(torch.arange(g.num_nodes), g.indptr[1:] - g.indptr[:-1])
        return g.indices.long(), dst

    def share_memory_(self) -> "NodeDataset":
        for t in (self.graph.indptr, self.graph.indices, self.labels, self.train_idx, self.val_idx, self.test_idx):
            t.share_memory_()
        host = self.feature_source.host_tensor()
        if host is not None and not host.is_shared():
            host.share_memory_()
        return self

    def share_for_gpus(self, numa_nodes: Sequence[int], features: bool) -> "NodeDataset":
        """:meth:`share_memory_`, then the graph's arrays interleaved over ``numa_nodes`` (their
        pages move: :func:`pytorch_zerocopy.numa.interleave`; none for ``()``), and with
        ``features`` the one shared feature table every GPU maps, made there (a table this
        dataset does not hold yet is placed before it is filled, so its pages never move)."""
        from ..numa import interleave
        from .features import TensorFeatures, shared_rows

        self.share_memory_()
        for t in (self.graph.indptr, self.graph.indices):
            interleave(t, numa_nodes)
        if features:
            table = shared_rows(self.feature_source, numa_nodes)
            if self.feature_source.host_tensor() is None:
                self.feature_source = TensorFeatures(table)
        return self

    def describe(self) -> str:
        gib = self.feature_source.nbytes / 2**30
        return (f"{self.name}: {self.num_nodes:,} nodes, {self.num_edges:,} edges, "
                f"{self.feature_dim} x {str(self.feature_dtype).replace('torch.', '')} features "
                f"({gib:.2f} GiB), {self.num_classes} classes, train/val/test "
                f"{self.train_idx.numel():,}/{self.val_idx.numel():,}/{self.test_idx.numel():,}")


def in_neighbour_graph(indptr: torch.Tensor, indices: torch.Tensor, symmetric: bool = False) -> CSRGraph:
    """The :class:`CSRGraph` of a dataset from in-neighbour lists its builder made well formed
    (int64 offsets, ids in range: not checked again)."""
    return CSRGraph(indptr, indices, symmetric=symmetric, validate=False)
