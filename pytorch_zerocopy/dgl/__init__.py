"""DGL-compatible mini-batch loading backed by this package's neighbour sampling.

A DGL training script switches by changing its import line::

    from pytorch_zerocopy.dgl import DataLoader, NeighborSampler

and keeps using ``dgl.nn`` layers: with DGL installed and a ``dgl.DGLGraph`` given, the blocks
are real DGL blocks. Without DGL, build the graph with :func:`graph` (DGL's ``dgl.graph``: a
:class:`~pytorch_zerocopy.graph.CSRGraph` with ``ndata``/``edata``) and use
:mod:`pytorch_zerocopy.dgl.nn` layers over the :class:`Block` objects yielded.
"""

from . import nn
from ._backend import real_dgl
from ..block import EID, NID, Block
from ..graph import CSRGraph
from .dataloader import DataLoader
from .graph import graph
from .sampler import MultiLayerFullNeighborSampler, NeighborSampler

NodeDataLoader = DataLoader

__all__ = [
    "Block",
    "CSRGraph",
    "DataLoader",
    "EID",
    "MultiLayerFullNeighborSampler",
    "NID",
    "NeighborSampler",
    "NodeDataLoader",
    "graph",
    "nn",
    "real_dgl",
]
