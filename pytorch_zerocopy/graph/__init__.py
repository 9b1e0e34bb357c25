"""Graphs in CSR form placed in host, unified, GPU or managed memory, and traversal ops on them."""

from .csr import PLACEMENTS, CSRGraph
from .generators import grid_graph, kronecker_graph, uniform_random_graph
from .io import load_bel, load_edge_list, load_npz, save_bel, save_edge_list, save_npz
from .traversal import VARIANTS, bfs, connected_components, pagerank, sssp

__all__ = [
    "CSRGraph",
    "PLACEMENTS",
    "VARIANTS",
    "bfs",
    "connected_components",
    "grid_graph",
    "kronecker_graph",
    "load_bel",
    "load_edge_list",
    "load_npz",
    "pagerank",
    "save_bel",
    "save_edge_list",
    "save_npz",
    "sssp",
    "uniform_random_graph",
]
