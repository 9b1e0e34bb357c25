"""DGL's GNN layers for this package's blocks: the package's one SAGE layer
(:class:`pytorch_zerocopy.nn.SAGEConv`, DGL's signature, built on the fused mean aggregation)."""

from ..nn import SAGEConv

__all__ = ["SAGEConv"]
