"""Graphs in CSR form placed in host, unified, GPU or managed memory, and traversal ops on them.

A graph's edge list can stay in host memory while a GPU traverses it (EMOGI, VLDB 2021)::

    from pytorch_zerocopy.graph import CSRGraph, bfs, kronecker_graph

    g = kronecker_graph(24, weights="int")   # a CPU graph, generated in chunks on the GPU
    ug = g.to("unified")                     # edge list mapped for the GPU in place, offsets on it
    depth = bfs(ug, 0)                       # int32 depths on the GPU, -1 where unreachable

Placements (:class:`~pytorch_zerocopy.placement.Placement`): ``"cpu"``, ``"unified"``
(zero-copy), ``"cuda"`` (GPU memory), ``"uvm"`` (CUDA managed memory migrating to the GPU, the
UVM baseline) and ``"managed"`` (zero-copy from a managed copy kept in host memory). Variants of the ops (how a GPU schedules the work and
reads the lists; ``"auto"`` by default): see :mod:`pytorch_zerocopy.graph.traversal`.
File formats: EMOGI ``.bel``, text edge lists, ``.npz`` (:mod:`pytorch_zerocopy.graph.io`).
Graphs that change: :class:`DynamicGraph` (:mod:`pytorch_zerocopy.graph.dynamic`), batched edge
and vertex updates applied by GPU kernels to paged adjacency lists, with sampling and BFS on them.
"""

from .csr import CSRGraph
from .dynamic import DynamicGraph, MemoryFootprint, PoolFullError
from .generators import grid_graph, kronecker_graph, power_law_graph, road_graph, uniform_random_graph
from .io import load_bel, load_edge_list, load_npz, save_bel, save_edge_list, save_npz
from .reorder import NodeOrder, degree_order, presample_order
from .traversal import (OP_VARIANTS, VARIANTS, GraphTraits, Variant, auto_variant, bfs, choose_variant,
                        connected_components, pagerank, sssp)

__all__ = [
    "CSRGraph",
    "DynamicGraph",
    "GraphTraits",
    "MemoryFootprint",
    "NodeOrder",
    "OP_VARIANTS",
    "PoolFullError",
    "VARIANTS",
    "Variant",
    "auto_variant",
    "bfs",
    "choose_variant",
    "connected_components",
    "degree_order",
    "grid_graph",
    "kronecker_graph",
    "load_bel",
    "load_edge_list",
    "load_npz",
    "pagerank",
    "power_law_graph",
    "presample_order",
    "road_graph",
    "save_bel",
    "save_edge_list",
    "save_npz",
    "sssp",
    "uniform_random_graph",
]
