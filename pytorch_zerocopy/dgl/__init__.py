"""DGL-compatible mini-batch loading backed by this package's neighbour sampling.

A DGL training script switches by changing its import line::

    from pytorch_zerocopy.dgl import DataLoader, NeighborSampler

and keeps using ``dgl.nn`` layers: with DGL installed and a ``dgl.DGLGraph`` given, the blocks
are real DGL blocks. Without DGL, pass a :class:`Graph` (CSR structure + ``ndata``/``edata``)
and use :mod:`pytorch_zerocopy.dgl.nn` layers over the :class:`Block` objects yielded.
"""

from . import nn
from ._backend import real_dgl
from ..block import EID, NID, Block
from .block import Graph
from .dataloader import DataLoader
from .sampler import MultiLayerFullNeighborSampler, NeighborSampler

NodeDataLoader = DataLoader

__all__ = [
    "Block",
    "DataLoader",
    "EID",
    "Graph",
    "MultiLayerFullNeighborSampler",
    "NID",
    "NeighborSampler",
    "NodeDataLoader",
    "nn",
    "real_dgl",
]
