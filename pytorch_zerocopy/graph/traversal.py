"""Graph traversal ops on a :class:`CSRGraph`: bfs, sssp, connected components, pagerank.

Each op runs where the graph's ``indptr`` lives (the GPU for ``"cuda"``, ``"unified"``,
``"managed"`` and ``"uvm"`` graphs, the CPU otherwise), on the current CUDA stream, and returns its result on
that device. ``variant`` picks how a GPU schedules the work and reads neighbour lists:

* ``"naive"``     a thread per vertex walks its own list (uncoalesced, 32-byte requests).
* ``"merged"``    a warp per vertex, consecutive lanes reading consecutive neighbours (EMOGI §4.3).
* ``"aligned"``   merged, with each list's first read moved back to the preceding 128-byte
                  boundary so every request is a whole 128-byte line; bfs / sssp warps take 32
                  consecutive vertices at a time, as EMOGI's chunked kernels do.
* ``"frontier"``  bfs / sssp: a device-side queue of the active vertices replaces the scan of
                  every vertex at every level (warp-per-vertex aligned reads); a step holding
                  more than 1/128 of the vertices is expanded in vertex-id order instead. sssp
                  adds a near-far worklist (bucket width ``delta``). cc: Afforest's sampling
                  (link every vertex to two neighbours, then skip the lists of the largest
                  component). pagerank: power iteration with an edge-balanced sweep.
* ``"direction"`` bfs: direction-optimizing. Levels with a large frontier go bottom-up: every
                  unvisited vertex reads its in-neighbour list (the graph itself when it is
                  symmetric, else :meth:`CSRGraph.csc`) in 64-byte steps and stops at the first
                  neighbour in the frontier, so most lists are read only in part.
* ``"async"``     bfs / sssp / pagerank: one persistent kernel over a device worklist (Atos): no
                  level barrier and no host round trip until the work runs out. It wins where
                  levels are many and small and the first path found is mostly a shortest one
                  (regular meshes); on a road network it re-visits lists many times over.
* ``"push"``      pagerank: residual push (EMOGI's PageRank family) from x = 1/N; only vertices
                  whose residual is above a threshold push, and their lists alone are read.
* ``"staged"``    cc: the edge list crosses PCIe once by DMA, in chunks, into GPU-memory buffers
                  that an edge-balanced union-find consumes while the next chunks are copied.
* ``"auto"``      (the default) chooses from the graph; see :func:`auto_variant`.

Which op takes which variant: :data:`OP_VARIANTS`. The CPU implementation is one reference
algorithm per op, whatever the variant.

Termination on the GPU is decided on the device: each level's kernel first reads a device
counter saying whether the previous level found work and returns at once when it did not, so
the host launches levels in growing batches (1, 2, 4, ... up to 64; pagerank: up to 16
iterations) and reads the counter back once per batch (one 8-byte pinned device-to-host copy
and a stream sync per batch, not per level). A bfs of D levels thus costs about log2(D) +
D / 64 synchronisations and at most 64 launches that find nothing to do. The async variants
synchronise once per run of their persistent kernel.

Malformed graphs. The CPU ops check ``indptr`` and ``indices`` in full before following any list.
The GPU ops do not read the whole graph up front (its edge list may be billions of entries in
host memory): every kernel checks the offsets and ids it reads, with integer compares on values
it already holds, reads a list whose offsets are not ``0 <= indptr[v] <= indptr[v + 1] <=
len(indices)`` as empty and skips an id outside ``[0, num_nodes)``, and records the first offender.
The host reads the record with the counters it already copies back (connected components and
the async variants: once, after their kernels) and raises a ``ValueError`` naming the vertex or
position, as the sampling ops do; the CUDA context stays usable. A fault in a list the
traversal never reads (a vertex it does not reach, or whose list a bottom-up level does not
need) is not seen.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
from typing import Dict, Optional, Tuple

import torch

from .._compat import register_fake
from ..placement import Placement
from .csr import CSRGraph


class Variant(enum.IntEnum):
    """The ``variant`` argument of the graph ops, as the compiled ops take it."""

    NAIVE = 0
    MERGED = 1
    ALIGNED = 2
    FRONTIER = 3
    DIRECTION = 4
    ASYNC = 5
    PUSH = 6
    STAGED = 7


_COMMON = ("naive", "merged", "aligned", "frontier")
OP_VARIANTS: Dict[str, Tuple[str, ...]] = {
    "bfs": _COMMON + ("direction", "async"),
    "sssp": _COMMON + ("async",),
    "connected_components": _COMMON + ("staged",),
    "pagerank": _COMMON + ("push", "async"),
}
VARIANTS = tuple(v.name.lower() for v in Variant)
DEFAULT_VARIANT = "auto"

# Mean degree at or below which a graph is treated as mesh- or road-like (high diameter, small
# levels), where the async variants win.
MESH_MEAN_DEGREE = 8.0
# The async variants' worklist holds 2 * num_nodes entries, at most 2^31.
ASYNC_MAX_NODES = 1 << 30
# The async BFS (label-correcting) on a mesh-like graph only where the mesh is regular: the
# coefficient of variation of the degrees of a strided sample of DEGREE_SAMPLE vertices at most
# this. Where links are missing at random (a road network), the first path found to a vertex is
# seldom a shortest one and the search re-visits lists over and over.
MESH_MAX_DEGREE_SPREAD = 0.1
DEGREE_SAMPLE = 4096
# A BFS over lists in GPU memory takes the direction-optimizing variant only on a graph whose
# degree spread (as above) is above this: a few vertices hold much of the edge list, so the
# bottom-up levels skip most ids, and the top-down ones read the hubs' lists in chunks. Where
# degrees are even (a uniform random graph), one merged pass per level reads the ids in order
# at no more cost.
SKEWED_DEGREE_SPREAD = 1.0
# Mean degree at or above which connected components read from host memory take Afforest's
# sampling (``frontier``) rather than the staged copy of the whole edge list: see choose_variant.
CC_SAMPLING_MIN_DEGREE = 24.0


def degree_spread(indptr: torch.Tensor) -> float:
    """The coefficient of variation (std / mean, 0 for an edgeless graph) of the degrees of
    every vertex, or of :data:`DEGREE_SAMPLE` of them spread by a multiplicative hash (a stride
    would fall in step with a lattice's rows). Reads at most ``2 * DEGREE_SAMPLE`` offsets where
    they are (host memory or GPU: one small copy back); deterministic, draws nothing from
    torch's generators."""
    n = indptr.numel() - 1
    if n <= 0:
        return 0.0
    at = torch.arange(min(n, DEGREE_SAMPLE), device=indptr.device)
    if n > DEGREE_SAMPLE:
        at = (at * 2654435761) % n
    deg = (indptr[at + 1] - indptr[at]).to("cpu", torch.float64)
    mean = float(deg.mean())
    return float(deg.std(correction=0)) / mean if mean > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class GraphTraits:
    """What :func:`choose_variant` looks at in a graph."""

    placement: Placement
    on_gpu: bool  # the ops run on a GPU (indptr on a CUDA device)
    symmetric: bool
    has_in_lists: bool  # in-neighbour lists at hand: symmetric, or CSRGraph.csc() already computed
    num_nodes: int
    num_edges: int
    degree_spread: float = 0.0  # see degree_spread(); measured only where it decides (GraphTraits.of)

    @property
    def mesh_like(self) -> bool:
        """Mean degree at most MESH_MEAN_DEGREE (high diameter, small levels), small enough for
        the async worklist."""
        return 0 < self.num_nodes < ASYNC_MAX_NODES and self.num_edges <= MESH_MEAN_DEGREE * self.num_nodes

    @classmethod
    def of(cls, graph: CSRGraph, op: str = "bfs") -> "GraphTraits":
        """The traits of ``graph`` that :func:`choose_variant` reads for ``op``: the degree
        spread (a GPU op and a host synchronisation) only where it decides, a BFS on a GPU over
        a mesh-like graph or over lists in GPU memory with in-neighbour lists at hand; the rest
        come from the graph's sizes without touching its arrays."""
        t = cls(placement=graph.placement, on_gpu=graph.device.type == "cuda", symmetric=graph.symmetric,
                has_in_lists=graph.symmetric or graph._csc is not None, num_nodes=graph.num_nodes,
                num_edges=graph.num_edges)
        spread_decides = t.mesh_like or (t.placement is Placement.GPU and t.has_in_lists)
        if op == "bfs" and t.on_gpu and spread_decides:
            t = dataclasses.replace(t, degree_spread=degree_spread(graph.indptr))
        return t


def choose_variant(op: str, traits: GraphTraits) -> str:
    """The variant ``variant="auto"`` runs for ``op`` on a graph with these traits.

    A pure function of the traits: the placement and three statistics computed once per call
    from the offsets (mean degree, and on a GPU for a mesh-like graph the degree spread of a
    sample), never from the graph's name or family. What each statistic stands for:

    * mean degree <= MESH_MEAN_DEGREE (``mesh_like``): the graph is sparse like a mesh or a road
      network, so a BFS or SSSP wave needs thousands of levels, each holding few vertices. A
      variant that scans every vertex per level (naive, merged, aligned; direction and frontier
      do so only for levels holding over 1/128 of the vertices) then pays levels x vertices;
      one that expands a queue (frontier) or a worklist (async) pays for the frontier alone.
      Above it, levels are few and large (power-law and uniform random graphs: under 30), and
      a scan of a level costs little beside reading its lists.
    * degree spread > SKEWED_DEGREE_SPREAD, for a BFS over lists in GPU memory: a power-law
      graph, where the direction-optimizing BFS skips most of the hubs' ids.
    * degree spread <= MESH_MAX_DEGREE_SPREAD (a lattice): every vertex has the same few edges.
      The async label-correcting BFS then mostly finds shortest paths first; where links are
      missing at random it re-visits lists many times over. A thread per vertex (naive) is also
      balanced only there (decides the BFS alone).
    * mean degree >= CC_SAMPLING_MIN_DEGREE, for connected components over host memory:
      Afforest's sampling reads the offsets and two ids of every vertex at random (a request
      each over the link), then skips the lists of the largest component; the staged variant
      streams every id once at the copy ceiling. Sampling pays only where a vertex has many
      more ids than the requests it costs.
    * where the lists are read from: in GPU memory a read is served in 32-byte sectors, so the
      merged read (lanes start at the list's first element) wastes no lanes; over the link a
      read is whole 128-byte lines, so the aligned read (each step one line) wins there.

    The rules:

    * bfs on a GPU, mesh-like: ``"async"`` on a lattice, else ``"frontier"``. Otherwise, where
      the in-neighbour lists are at hand (a symmetric graph, or one whose :meth:`CSRGraph.csc`
      was already computed), ``"direction"``, except in GPU memory on a graph of even degrees,
      which takes ``"merged"`` (reading fewer bytes, the point of ``"direction"``, saves little
      there); without them, ``"merged"`` in GPU memory, ``"frontier"`` over the link and
      ``"aligned"`` elsewhere.
    * sssp: ``"frontier"`` on a mesh-like graph (its near-far worklist expands few vertices
      per step; the async search re-relaxes weighted paths many times over), else
      ``"merged"`` in GPU memory and ``"aligned"`` elsewhere.
    * connected_components: ``"staged"`` for a directed graph, for a mesh-like one on a GPU
      wherever its lists are (sampling's random requests buy nothing where every vertex has a few ids;
      label propagation would take a pass per level), and over the link for one whose mean
      degree is below CC_SAMPLING_MIN_DEGREE; otherwise ``"frontier"`` (in GPU memory a
      random read costs a sector, not a trip over the link, so sampling pays at any degree
      above a mesh's).
    * pagerank: ``"naive"`` (power iteration, a thread per vertex) on a mesh-like graph in GPU
      memory: every list is short, so a thread per vertex is balanced and a pass costs less
      than a push round's worklist upkeep; else ``"push"`` (its rounds read only the lists of
      vertices whose residual is large, which over the link saves trips).
    """
    if op not in OP_VARIANTS:
        raise ValueError(f"op must be one of {sorted(OP_VARIANTS)}, got {op!r}")
    in_gpu = traits.placement is Placement.GPU
    over_link = traits.placement in (Placement.MAPPED, Placement.MANAGED, Placement.UVM)
    mesh_like = traits.mesh_like
    lattice = mesh_like and traits.degree_spread <= MESH_MAX_DEGREE_SPREAD
    if op == "bfs":
        if mesh_like and traits.on_gpu:
            return "async" if lattice else "frontier"
        if traits.has_in_lists and not (in_gpu and traits.degree_spread <= SKEWED_DEGREE_SPREAD):
            return "direction"
        if in_gpu:
            return "merged"
        return "frontier" if over_link else "aligned"
    if op == "sssp":
        if mesh_like:
            return "frontier"
        return "merged" if in_gpu else "aligned"
    if op == "connected_components":
        dense = traits.num_edges >= CC_SAMPLING_MIN_DEGREE * traits.num_nodes
        if not traits.symmetric or (mesh_like and traits.on_gpu) or (over_link and not dense):
            return "staged"
        return "frontier"
    return "naive" if in_gpu and mesh_like else "push"


def auto_variant(op: str, graph: CSRGraph) -> str:
    """The variant ``variant="auto"`` runs for ``op`` on ``graph`` (see :func:`choose_variant`)."""
    return choose_variant(op, GraphTraits.of(graph, op))


def _variant(op: str, variant: str, graph: CSRGraph) -> Variant:
    if variant == "auto":
        variant = auto_variant(op, graph)
    if variant not in OP_VARIANTS[op]:
        raise ValueError(f"{op}: variant must be 'auto' or one of {list(OP_VARIANTS[op])}, got {variant!r}")
    return Variant[variant.upper()]


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
    ``[edges_read, levels]`` comes last (the direction variant reads some lists only in part).
    The direction variant on a directed graph computes :meth:`CSRGraph.csc` on first use.
    A graph of another structure that defines ``__zerocopy_bfs__`` (a
    :class:`~pytorch_zerocopy.graph.DynamicGraph`) searches itself, with the same arguments.
    """
    own = getattr(type(graph), "__zerocopy_bfs__", None)
    if own is not None:
        return own(graph, source, variant=variant, predecessors=predecessors, return_stats=return_stats)
    _check_graph(graph, "bfs")
    source = _check_source(graph, source, "bfs")
    v = _variant("bfs", variant, graph)
    in_indptr = in_indices = None
    if v == Variant.DIRECTION:
        t = graph if graph.symmetric else graph.csc()
        in_indptr, in_indices = t.indptr, t.indices
    depth, pred, stats = torch.ops.zerocopy.graph_bfs.default(
        graph.indptr, graph.indices, source, int(v), bool(predecessors), in_indptr, in_indices)
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
    if graph.weights is not None and graph.min_weight is not None and not graph.min_weight >= 0:  # NaN too
        raise ValueError(f"sssp: weights must be non-negative numbers, the graph's smallest weight is "
                         f"{graph.min_weight}")
    if delta is None:
        mean_w = 1.0 if graph.weights is None else (graph.mean_weight or 1.0)
        mean_deg = graph.num_edges / max(graph.num_nodes, 1)
        delta = mean_w * max(1.0, 32.0 / max(mean_deg, 1e-9))
    elif not delta > 0:
        raise ValueError(f"sssp: delta must be > 0, got {delta}")
    dist, stats = torch.ops.zerocopy.graph_sssp.default(
        graph.indptr, graph.indices, graph.weights, source, int(_variant("sssp", variant, graph)), float(delta))
    return (dist, stats) if return_stats else dist


def connected_components(
    graph: CSRGraph, *, weak: bool = False, variant: str = DEFAULT_VARIANT, return_stats: bool = False
):
    """The component of every vertex, labelled by the smallest vertex id in it (ids' dtype).

    Components are defined for undirected graphs: a graph not marked ``symmetric`` is refused
    unless ``weak=True``, which returns weakly connected components (edge direction ignored).
    The GPU runs one pass of concurrent union-find over the edge list (larger roots hooked
    under smaller ones), so the edge list is read at most once; the ``frontier`` variant on an
    undirected graph skips the lists of vertices already in the largest component, the
    ``staged`` one copies the list through GPU memory by DMA (see the module docstring).
    ``stats[0]`` counts the edges actually read.
    """
    _check_graph(graph, "connected_components")
    if not graph.symmetric and not weak:
        raise ValueError(
            "connected_components: the graph is not known to be undirected (symmetric=False). Build it "
            "with symmetrize=True, mark it symmetric=True if every edge has its reverse, or pass "
            "weak=True for weakly connected components.")
    labels, stats = torch.ops.zerocopy.graph_connected_components.default(
        graph.indptr, graph.indices, int(_variant("connected_components", variant, graph)), graph.symmetric)
    return (labels, stats) if return_stats else labels


def pagerank(
    graph: CSRGraph,
    alpha: float = 0.85,
    tol: float = 1e-4,
    max_iter: int = 100,
    *,
    variant: str = DEFAULT_VARIANT,
    return_stats: bool = False,
):
    """float32 PageRank along out-edges, to within ``tol`` of the exact result in L1.

    The exact PageRank solves ``rank[u] = (1 - alpha) / N + alpha * (sum over edges v->u of
    rank[v] / outdeg(v) + dangling / N)``, where dangling is the total rank of vertices without
    out-edges (every CSR entry counts, so duplicate edges weigh more). Every variant stops once
    its L1 distance to that solution is provably at most ``tol`` (up to float32 rounding, about
    1e-7 relative): power iteration (from ``1 / N``) when its last change is at most
    ``tol * (1 - alpha) / alpha``, residual push (``push``) when its residuals sum to at most
    that same threshold (it returns its estimate plus the residuals, whose distance to the
    solution that bounds by ``tol``), ``async`` when its residuals sum to at most
    ``tol * (1 - alpha)``. ``max_iter`` caps iterations (push: rounds; async: work, in
    passes over the edge list), and ``stats[1]`` reports them. The GPU accumulates with float
    atomics, so the last bits vary from run to run.
    """
    _check_graph(graph, "pagerank")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"pagerank: alpha must be in [0, 1], got {alpha}")
    if tol < 0:
        raise ValueError(f"pagerank: tol must be >= 0, got {tol}")
    if max_iter < 0:
        raise ValueError(f"pagerank: max_iter must be >= 0, got {max_iter}")
    rank, stats = torch.ops.zerocopy.graph_pagerank.default(
        graph.indptr, graph.indices, float(alpha), float(tol), int(max_iter), int(_variant("pagerank", variant, graph)))
    return (rank, stats) if return_stats else rank


# --- fake kernels (shapes, dtypes and devices only) ---------------------------------------


def _stats_like(indptr: torch.Tensor) -> torch.Tensor:
    return indptr.new_empty((2,), dtype=torch.int64)


@register_fake("zerocopy::graph_bfs")
def _bfs_fake(indptr, indices, source, variant, predecessors, in_indptr=None, in_indices=None):
    n = indptr.shape[0] - 1
    pred = indptr.new_empty((n if predecessors else 0,), dtype=indices.dtype)
    return indptr.new_empty((n,), dtype=torch.int32), pred, _stats_like(indptr)


@register_fake("zerocopy::graph_sssp")
def _sssp_fake(indptr, indices, weights, source, variant, delta=0.0):
    dtype = torch.float32 if weights is not None and weights.dtype == torch.float32 else torch.int64
    return indptr.new_empty((indptr.shape[0] - 1,), dtype=dtype), _stats_like(indptr)


@register_fake("zerocopy::graph_connected_components")
def _cc_fake(indptr, indices, variant, symmetric=False, chunk_edges=0):
    return indptr.new_empty((indptr.shape[0] - 1,), dtype=indices.dtype), _stats_like(indptr)


@register_fake("zerocopy::graph_pagerank")
def _pagerank_fake(indptr, indices, alpha, tol, max_iter, variant):
    return indptr.new_empty((indptr.shape[0] - 1,), dtype=torch.float32), _stats_like(indptr)


@register_fake("zerocopy::managed_copy")
def _managed_copy_fake(src, device, on_host=False):
    return torch.empty_like(src, device=torch.device("cuda", device))
