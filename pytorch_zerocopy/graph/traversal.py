"""Graph traversal ops on a :class:`CSRGraph`: bfs, sssp, connected components, pagerank.

Each op runs where the graph's ``indptr`` lives (the GPU for ``"cuda"``, ``"unified"`` and
``"managed"`` graphs, the CPU otherwise), on the current CUDA stream, and returns its result on
that device. ``variant`` picks how a GPU reads neighbour lists (EMOGI §4.3):

* ``"naive"``     a thread per vertex walks its own list (uncoalesced, 32-byte requests).
* ``"merged"``    a warp per vertex, consecutive lanes reading consecutive neighbours.
* ``"aligned"``   merged, with each list's first read moved back to the preceding 128-byte
                  boundary so every request is a whole 128-byte line (the default).
* ``"frontier"``  bfs / sssp: a device-side queue of the active vertices replaces the scan of
                  every vertex at every level (warp-per-vertex aligned reads), which is what
                  wins on high-diameter graphs; a step holding more than 1/128 of the vertices
                  is expanded in vertex-id order instead, because random-order reads of short
                  lists from host memory are bound by address translation. sssp adds a
                  near-far worklist (bucket width ``delta``) so that fewer lists are read
                  again after their distance drops. cc / pagerank, where every vertex is
                  active in every pass, use an edge-balanced sweep (each warp streams a
                  fixed-size aligned slice of the edge list), so low-degree vertices do not
                  leave lanes idle. cc on an undirected graph first links every vertex to
                  its first two neighbours, estimates the largest component from 1024
                  sampled vertices, and the sweep then skips the lists of the vertices
                  already in it (Afforest's sampling): most of the edge list is never read.

The CPU implementation is one reference algorithm per op, whatever the variant.

Termination on the GPU is decided on the device: each level's kernel first reads a device
counter saying whether the previous level found work and returns at once when it did not, so
the host launches levels in growing batches (1, 2, 4, ... up to 64; pagerank: up to 16
iterations) and reads the counter back once per batch (one 8-byte pinned device-to-host copy
and a stream sync per batch, not per level). A bfs of D levels thus costs about log2(D) +
D / 64 synchronisations and at most 64 launches that find nothing to do. Connected
components needs none: it is one pass of union-find plus a labelling pass.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from .._compat import register_fake
from .csr import CSRGraph

VARIANTS = {"naive": 0, "merged": 1, "aligned": 2, "frontier": 3}
DEFAULT_VARIANT = "aligned"


def _variant(variant: str) -> int:
    try:
        return VARIANTS[variant]
    except KeyError:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}") from None


def _check_graph(graph: CSRGraph, op: str) -> None:
    if not isinstance(graph, CSRGraph):
        raise TypeError(f"{op}: graph must be a CSRGraph, got {type(graph).__name__}")


def _check_source(graph: CSRGraph, source: int, op: str) -> int:
    if isinstance(source, torch.Tensor) and source.numel() == 1 and not source.is_floating_point():
        source = int(source)
    if isinstance(source, bool) or not isinstance(source, numbers.Integral):
        raise TypeError(f"{op}: source must be an integer vertex id, got {type(source).__name__}")
    source = int(source)
    if not 0 <= source < graph.num_nodes:
        raise IndexError(f"{op}: source must be in [0, {graph.num_nodes}), got {source}")
    return source


def bfs(
    graph: CSRGraph,
    source: int,
    *,
    variant: str = DEFAULT_VARIANT,
    predecessors: bool = False,
    return_stats: bool = False,
):
    """Breadth-first search from ``source``.

    Returns int32 ``depth`` (hops from ``source``; -1 where unreachable), and with
    ``predecessors=True`` also ``pred`` (the parent of each vertex in a BFS tree, in the ids'
    dtype; ``pred[source] == source``, -1 where unreachable; on the GPU any valid parent, on the
    CPU the first one found). With ``return_stats=True`` an int64 tensor
    ``[edges_scanned, levels]`` comes last.
    """
    _check_graph(graph, "bfs")
    source = _check_source(graph, source, "bfs")
    depth, pred, stats = torch.ops.zerocopy.graph_bfs.default(
        graph.indptr, graph.indices, source, _variant(variant), bool(predecessors))
    out = (depth, pred) if predecessors else (depth,)
    if return_stats:
        out = out + (stats,)
    return out[0] if len(out) == 1 else out


def sssp(
    graph: CSRGraph,
    source: int,
    *,
    variant: str = DEFAULT_VARIANT,
    delta: Optional[float] = None,
    return_stats: bool = False,
):
    """Single-source shortest path distances from ``source`` over non-negative weights.

    float32 weights give float32 distances; int32 weights, or a graph without weights (unit
    weights), give int64 distances. Unreachable vertices hold the dtype's maximum. On the GPU
    the search is Bellman-Ford over the vertices whose distance dropped (EMOGI's SSSP); the
    ``frontier`` variant orders it with a near-far worklist whose bucket width is ``delta``
    (default: mean weight * max(1, 32 / mean degree)). With float32 weights a distance may
    differ from the CPU's Dijkstra in the last bits when two paths have nearly equal length.
    """
    _check_graph(graph, "sssp")
    source = _check_source(graph, source, "sssp")
    if graph.weights is not None and graph.min_weight is not None and graph.min_weight < 0:
        raise ValueError(f"sssp: weights must be non-negative, the graph's smallest weight is {graph.min_weight}")
    if delta is None:
        mean_w = 1.0 if graph.weights is None else (graph.mean_weight or 1.0)
        mean_deg = graph.num_edges / max(graph.num_nodes, 1)
        delta = mean_w * max(1.0, 32.0 / max(mean_deg, 1e-9))
    elif not delta > 0:
        raise ValueError(f"sssp: delta must be > 0, got {delta}")
    dist, stats = torch.ops.zerocopy.graph_sssp.default(
        graph.indptr, graph.indices, graph.weights, source, _variant(variant), float(delta))
    return (dist, stats) if return_stats else dist


def connected_components(
    graph: CSRGraph, *, weak: bool = False, variant: str = DEFAULT_VARIANT, return_stats: bool = False
):
    """The component of every vertex, labelled by the smallest vertex id in it (ids' dtype).

    Components are defined for undirected graphs: a graph not marked ``symmetric`` is refused
    unless ``weak=True``, which returns weakly connected components (edge direction ignored).
    The GPU runs one pass of concurrent union-find over the edge list (larger roots hooked
    under smaller ones), so the edge list is read at most once; the ``frontier`` variant on an
    undirected graph skips the lists of vertices already in the largest component (see the
    module docstring). ``stats[0]`` counts the edges actually read.
    """
    _check_graph(graph, "connected_components")
    if not graph.symmetric and not weak:
        raise ValueError(
            "connected_components: the graph is not known to be undirected (symmetric=False). Build it "
            "with symmetrize=True, mark it symmetric=True if every edge has its reverse, or pass "
            "weak=True for weakly connected components.")
    labels, stats = torch.ops.zerocopy.graph_connected_components.default(
        graph.indptr, graph.indices, _variant(variant), graph.symmetric)
    return (labels, stats) if return_stats else labels


def pagerank(
    graph: CSRGraph,
    alpha: float = 0.85,
    tol: float = 1e-3,
    max_iter: int = 100,
    *,
    variant: str = DEFAULT_VARIANT,
    return_stats: bool = False,
):
    """float32 PageRank by power iteration along out-edges.

    ``rank[u] = (1 - alpha) / N + alpha * (sum over edges v->u of rank[v] / outdeg(v)
    + dangling / N)``, where dangling is the total rank of vertices without out-edges; starts
    from ``1 / N`` and stops after the first iteration whose L1 change is below ``tol``, or
    after ``max_iter`` iterations. The GPU accumulates with float atomics, so the last bits
    vary from run to run.
    """
    _check_graph(graph, "pagerank")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"pagerank: alpha must be in [0, 1], got {alpha}")
    if tol < 0:
        raise ValueError(f"pagerank: tol must be >= 0, got {tol}")
    if max_iter < 0:
        raise ValueError(f"pagerank: max_iter must be >= 0, got {max_iter}")
    rank, stats = torch.ops.zerocopy.graph_pagerank.default(
        graph.indptr, graph.indices, float(alpha), float(tol), int(max_iter), _variant(variant))
    return (rank, stats) if return_stats else rank


# --- fake kernels (shapes, dtypes and devices only) ---------------------------------------


def _stats_like(indptr: torch.Tensor) -> torch.Tensor:
    return indptr.new_empty((2,), dtype=torch.int64)


@register_fake("zerocopy::graph_bfs")
def _bfs_fake(indptr, indices, source, variant, predecessors):
    n = indptr.shape[0] - 1
    pred = indptr.new_empty((n if predecessors else 0,), dtype=indices.dtype)
    return indptr.new_empty((n,), dtype=torch.int32), pred, _stats_like(indptr)


@register_fake("zerocopy::graph_sssp")
def _sssp_fake(indptr, indices, weights, source, variant, delta=0.0):
    dtype = torch.float32 if weights is not None and weights.dtype == torch.float32 else torch.int64
    return indptr.new_empty((indptr.shape[0] - 1,), dtype=dtype), _stats_like(indptr)


@register_fake("zerocopy::graph_connected_components")
def _cc_fake(indptr, indices, variant, symmetric=False):
    return indptr.new_empty((indptr.shape[0] - 1,), dtype=indices.dtype), _stats_like(indptr)


@register_fake("zerocopy::graph_pagerank")
def _pagerank_fake(indptr, indices, alpha, tol, max_iter, variant):
    return indptr.new_empty((indptr.shape[0] - 1,), dtype=torch.float32), _stats_like(indptr)


@register_fake("zerocopy::managed_copy")
def _managed_copy_fake(src, device):
    return torch.empty_like(src, device=torch.device("cuda", device))
