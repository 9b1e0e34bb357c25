"""PyG (torch_geometric) support: a zero-copy remote backend and a ``NeighborLoader``.

A PyG training script switches by changing its import line::

    from pytorch_zerocopy.pyg import NeighborLoader   # was: from torch_geometric.loader import ...

and keeps PyG's models (``SAGEConv``, ``GraphSAGE``, ``trim_to_layer``) and its minibatches:
PyG ``Data`` objects with ``x``, ``edge_index``, ``y``, ``batch_size``, ``n_id``, ``e_id``,
``input_id``, ``num_sampled_nodes`` and ``num_sampled_edges`` laid out as PyG's own loader
lays them out. Where a GPU serves unified tensors, neighbours are sampled on the GPU straight
from the host-resident graph and feature rows are gathered from host memory by the GPU; without
one, both run on the CPU. ``NeighborLoader(..., pipeline=True)`` runs sampling and the gather of
``x`` in the pipeline's processes instead, minibatches in flight while the training loop runs.

The pieces, usable on their own:

* :class:`FeatureStore`: PyG's ``FeatureStore`` over host-resident (unified) tables, read with
  :func:`pytorch_zerocopy.gather_rows`.
* :class:`GraphStore`: PyG's ``GraphStore`` over a :class:`pytorch_zerocopy.graph.CSRGraph`
  (the in-neighbour lists, host-resident).
* :class:`NeighborSampler`: a PyG ``BaseSampler`` over this package's sampling op.
* :func:`stores_from_data`: a PyG ``Data`` as such a ``(FeatureStore, GraphStore)`` pair;
  :func:`data_from_dataset`: a :mod:`pytorch_zerocopy.datasets` dataset as a PyG ``Data``.
* :class:`DeviceData`: the loader's minibatches, PyG's ``Data`` whose ``to()`` the device they
  are on costs nothing.

PyG is needed by this subpackage only; ``import pytorch_zerocopy`` never imports it.
"""

try:
    import torch_geometric  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "pytorch_zerocopy.pyg needs PyG (torch_geometric), which is not installed here. "
        "Install it with: pip install torch-geometric  (pure Python; this loader samples with "
        "pytorch_zerocopy's own op, so pyg-lib and torch-sparse are not needed)"
    ) from e

from .feature_store import FeatureStore
from .graph_store import GraphStore
from .loader import NeighborLoader
from .sampler import NeighborSampler, SampledHops, sample_hops
from .data import DataExtras, DeviceData, data_from_dataset, stores_from_data

__all__ = [
    "DataExtras",
    "DeviceData",
    "FeatureStore",
    "GraphStore",
    "NeighborLoader",
    "NeighborSampler",
    "data_from_dataset",
    "SampledHops",
    "sample_hops",
    "stores_from_data",
]
