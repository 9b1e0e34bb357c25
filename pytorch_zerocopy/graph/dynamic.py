"""DynamicGraph: a graph whose edges and vertices change in batches, updated on the GPU.

A :class:`DynamicGraph` holds adjacency lists in fixed-size pages cut from one pool, as faimGraph
does (Winter et al., SC 2018), with the pages managed on the device: freed pages go to a
free-page queue and are reused before fresh pages (Ouroboros's index queue), deleted vertex ids
go to a free-vertex queue and are reused before fresh ids. Each list is a small radix tree of
pages (a page table instead of faimGraph's linked pages), so entry ``k`` of any list is
``1 + height`` dependent loads away (height 0 up to ``page_size`` entries, 1 up to
``page_size**2``, ...): random access, which sampling needs, without walking a chain. Layout,
page order and queue arithmetic: ``csrc/dynamic_graph.h``.

Placements: ``"cuda"`` (everything in GPU memory), ``"unified"`` (the page pool, which holds the
edges, in host memory mapped for the GPU, read and written by the GPU in place: for graphs
larger than the GPU; per-vertex and per-page tables in GPU memory) and ``"cpu"``. The same
object drives the CPU and CUDA ops: all state is torch tensors (pool, per-vertex roots, heights
and degrees, per-page owners, the free-page ring and its ``[head, tail, fresh]`` counters, the
free-vertex ring).

Semantics (identical on every placement; the CUDA kernels reproduce the CPU's pages exactly):

* Vertex ids are ``0 .. num_nodes - 1``; ``num_nodes`` only grows. A deleted id has no edges
  and cannot take part in updates until :meth:`insert_vertices` hands it out again.
* Neighbour order. A graph built from a :class:`CSRGraph` keeps each row's order. Inserted
  edges are appended to their source's list in ascending destination order. Deleting edges
  from a list of ``d`` entries that keeps ``d'`` moves the surviving entries at positions
  ``>= d'`` (ascending) into the holes below ``d'`` (ascending); other entries do not move.
  :meth:`to_csr` lists every vertex's neighbours in this order.
* ``insert_edges`` ignores duplicates: within the batch (the first occurrence, in batch order,
  wins, with its weight) and against edges already present (whose weight is kept). A graph
  built from a CSR keeps the CSR's parallel edges.
* ``delete_edges`` removes every copy of each listed edge; absent edges are ignored.
* A ``symmetric`` (undirected) graph applies every edge update in both directions.
* ``delete_vertices`` removes the vertices' own lists and every edge pointing at them; no edge
  ever points at a deleted id. How the in-edges are found (see "In-edges" below) changes the
  cost, never the result: the same pages, tables and queues on every path.
* All-or-nothing: a batch is checked (lengths, dtypes, ids in range and alive), its pages are
  counted and reserved, and only then written. A batch that raises leaves the graph unchanged.
  When the pool lacks pages the graph grows it (``grow=True``, by 1.5x or to what the batch
  needs) or raises :class:`PoolFullError`.

In-edges. Deleting a vertex edits every list holding an edge into it. Which lists those are:

* A symmetric graph: the vertex's own list. Every edge is stored in both directions, so the
  out-list of ``v`` names exactly the lists holding ``v``; nothing extra is kept. (``from_csr``
  with ``symmetric=True`` checks that the CSR's edges come in both directions.)
* A directed graph built with ``in_index=True``: its in-edge index, a second set of paged lists
  (one pool, same page size and placement, no weights) where list ``v`` names a superset of the
  sources of ``v``'s in-edges, with repeats. ``insert_edges`` appends ``d -> s`` for every entry
  it adds (one append, no membership test); ``delete_edges`` leaves the index alone, so an
  entry may name a list that no longer holds the edge, and deletion then finds nothing there.
  Deleting ``v`` empties its index list. When the index holds more than twice the graph's
  entries (plus ``_INDEX_SLACK``) the next ``insert_edges`` rebuilds it exactly from the lists
  (a sort of every entry: rare, and the one update whose cost grows with the graph). Costs:
  the index's pages (about the graph's), and an append per edge insertion batch; edge deletion
  costs nothing extra.
* A directed graph without the index: one sweep over every page of the pool
  (``dynamic_graph_find_touching``, faimGraph's directed vertex deletion), O(edges) per batch.

The index is opt-in because it doubles the pages and adds to every insertion, which a graph
whose vertices are never deleted should not pay. With a list to read, deleting a batch of
vertices marks the ids in their lists (or index lists; ``dynamic_graph_mark_neighbours``),
reads the lists of the other marked vertices testing each entry against the batch's mask
(``dynamic_graph_find_marked``) and removes the hits, and empties the deleted vertices' own
lists (and index lists) whole (``dynamic_graph_clear``): work in proportion to the lists touched.

Reading while updating: :meth:`sample_neighbors`, :meth:`sample_layers` and :meth:`bfs` run on
the paged lists and give the same results as the package's ops on the :meth:`to_csr`
snapshot (same seed, same samples: draws are a hash of (seed, node, draw number) and lists are
walked in snapshot order); edge ids are pool slots instead of CSR positions. Updates and reads
run on the current CUDA stream, one batch at a time: call them from one stream (or synchronise),
e.g. apply updates between minibatches.
"""

from __future__ import annotations

import math
import numbers
import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch

from .. import unified as _unified
from .._compat import register_fake
from ..block import Block
from ..placement import Placement
from .. import sampling as _sampling  # attribute access at call time: sampling imports graph
from .csr import CSRGraph, _as_tensor, _cuda_device
from .traversal import _check_source

__all__ = ["DynamicGraph", "MemoryFootprint", "PoolFullError", "PLACEMENTS"]

# Where a page pool can live.
PLACEMENTS = (Placement.CPU, Placement.GPU, Placement.MAPPED)
_INT32_MAX = 2**31 - 1
_MIN_PAGES = 64
_GROWTH = 1.5
# Stale entries the in-edge index may hold beyond the graph's own count before it is rebuilt.
_INDEX_SLACK = 4096


class PoolFullError(RuntimeError):
    """The page pool cannot hold a batch (raised only with ``grow=False``)."""


@dataclass(frozen=True)
class MemoryFootprint:
    """Bytes held by a :class:`DynamicGraph`.

    ``pool_bytes``: the page pool (ids, plus weights), allocated; ``used_pool_bytes``: its pages
    in use; ``page_table_bytes``: per-page owner, rank and the free-page ring;
    ``vertex_bytes``: per-vertex root, height, degree, alive flag and the free-vertex ring.
    A graph with an in-edge index counts the index's bytes in the same fields.
    """

    pool_bytes: int
    used_pool_bytes: int
    page_table_bytes: int
    vertex_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.pool_bytes + self.page_table_bytes + self.vertex_bytes

    @property
    def used_bytes(self) -> int:
        """What the graph needs now: pages in use plus the tables."""
        return self.used_pool_bytes + self.page_table_bytes + self.vertex_bytes


def csr_bytes(graph: CSRGraph) -> int:
    """Bytes of a CSR graph's arrays (offsets, ids, weights): the footprint to compare with."""
    return graph.indptr.numel() * graph.indptr.element_size() + graph.edge_list_bytes


def _pages_of(offsets: torch.Tensor, page_size: int) -> int:
    """Pages (data and index) of the lists delimited by ``offsets`` (``n + 1`` ascending
    offsets): what ``dynamic_graph_pages_needed`` counts for them appended to empty lists (one
    synchronisation)."""
    n = offsets.numel() - 1
    if n <= 0:
        return 0
    dev = offsets.device
    need = _ops().dynamic_graph_pages_needed.default(torch.zeros(n, dtype=torch.int64, device=dev),
                                                      torch.arange(n, device=dev), offsets.to(torch.int64), page_size)
    return int(need)


def _page_shift(page_size: int) -> int:
    if isinstance(page_size, bool) or not isinstance(page_size, numbers.Integral):
        raise TypeError(f"page_size must be an int, got {type(page_size).__name__}")
    page_size = int(page_size)
    if page_size < 4 or page_size > 4096 or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two in [4, 4096], got {page_size}")
    return page_size.bit_length() - 1


# --- op wrappers ---------------------------------------------------------------------------


def _ops():
    return torch.ops.zerocopy


@register_fake("zerocopy::dynamic_graph_append")
def _append_fake(pool, weights, root, height, degree, page_owner, page_rank, page_ring, meta, vertices,
                 run_offsets, run_dst, run_weights, page_size):
    return None


@register_fake("zerocopy::dynamic_graph_remove")
def _remove_fake(pool, weights, root, height, degree, page_owner, page_rank, page_ring, meta, vertices,
                 pos_offsets, positions, page_size):
    return None


@register_fake("zerocopy::dynamic_graph_clear")
def _clear_fake(pool, root, height, degree, page_owner, page_rank, page_ring, meta, vertices, page_size):
    return torch.empty((), dtype=torch.int64, device="cpu")


@register_fake("zerocopy::dynamic_graph_contains")
def _contains_fake(pool, root, height, degree, vertices, run_offsets, run_dst, page_size):
    return run_dst.new_empty(run_dst.shape, dtype=torch.bool)


@register_fake("zerocopy::dynamic_graph_find")
def _find_fake(pool, root, height, degree, vertices, run_offsets, run_dst, page_size):
    total = torch.library.get_ctx().new_dynamic_size()
    return vertices.new_empty((vertices.shape[0] + 1,)), vertices.new_empty((total,))


@register_fake("zerocopy::dynamic_graph_find_marked")
def _find_marked_fake(pool, root, height, degree, vertices, mask, page_size):
    total = torch.library.get_ctx().new_dynamic_size()
    return vertices.new_empty((vertices.shape[0] + 1,)), vertices.new_empty((total,))


@register_fake("zerocopy::dynamic_graph_pages_needed")
def _pages_needed_fake(degree, vertices, run_offsets, page_size):
    return degree.new_empty(())


@register_fake("zerocopy::dynamic_graph_mark_neighbours")
def _mark_neighbours_fake(pool, root, height, degree, vertices, page_size):
    return root.new_empty(root.shape, dtype=torch.bool)


@register_fake("zerocopy::dynamic_graph_find_touching")
def _find_touching_fake(pool, root, height, degree, page_owner, page_rank, meta, mask, page_size):
    total = torch.library.get_ctx().new_dynamic_size()
    return degree.new_empty((total,)), degree.new_empty((total,))


@register_fake("zerocopy::dynamic_graph_to_csr")
def _to_csr_fake(pool, weights, root, height, degree, page_owner, page_rank, meta, page_size, with_slots):
    edges = torch.library.get_ctx().new_dynamic_size()
    w = weights.new_empty((edges,)) if weights is not None else pool.new_empty((0,), dtype=torch.float32)
    slots = degree.new_empty((edges if with_slots else 0,))
    return degree.new_empty((degree.shape[0] + 1,)), pool.new_empty((edges,)), w, slots


@register_fake("zerocopy::dynamic_graph_sample")
def _sample_fake(pool, root, height, degree, seeds, fanout, replace, seed, page_size):
    total = torch.library.get_ctx().new_dynamic_size()
    return (seeds.new_empty((seeds.shape[0] + 1,)), pool.new_empty((total,)), degree.new_empty((total,)),
            degree.new_empty((total,)))


@register_fake("zerocopy::dynamic_graph_sample_layers")
def _sample_layers_fake(pool, root, height, degree, seeds, fanouts, replace, seed, page_size):
    return _sampling._layer_fakes(degree, fanouts)


@register_fake("zerocopy::dynamic_graph_bfs")
def _bfs_fake(pool, root, height, degree, page_owner, page_rank, meta, source, predecessors, page_size):
    n = root.shape[0]
    return (degree.new_empty((n,), dtype=torch.int32), root.new_empty((n if predecessors else 0,)),
            degree.new_empty((2,)))


# --- the graph -----------------------------------------------------------------------------


class DynamicGraph:
    """A graph updated in batches (see the module docstring). Build one with :meth:`from_csr`."""

    def __init__(self, *, pool: torch.Tensor, weights: Optional[torch.Tensor], root: torch.Tensor,
                 height: torch.Tensor, degree: torch.Tensor, alive: torch.Tensor, page_owner: torch.Tensor,
                 page_rank: torch.Tensor, page_ring: torch.Tensor, vertex_ring: torch.Tensor,
                 meta: torch.Tensor, page_size: int, num_nodes: int, symmetric: bool, placement: Placement,
                 grow: bool, num_entries: int = 0) -> None:
        """Wraps existing state (``num_entries``: the entries of all lists); use :meth:`from_csr`."""
        self.pool = pool
        self.weights = weights
        self.root = root
        self.height = height
        self.degree = degree
        self.alive = alive
        self.page_owner = page_owner
        self.page_rank = page_rank
        self.page_ring = page_ring
        self.vertex_ring = vertex_ring
        self.meta = meta
        self.page_size = int(page_size)
        self.symmetric = bool(symmetric)
        self.placement = placement
        self.grow = bool(grow)
        self._shift = _page_shift(page_size)
        self._num_nodes = int(num_nodes)
        # The free-vertex queue: vertex_ring[head % cap .. tail % cap) are deleted ids to reuse.
        self._vertex_head = 0
        self._vertex_tail = 0
        # Entries of all lists, kept on the host so the in-edge index can be sized without a sync.
        self._entries = int(num_entries)
        # The in-edge index of a directed graph (see the module docstring), or None.
        self._in: Optional[DynamicGraph] = None
        self._index_entries = 0

    # --- construction --------------------------------------------------------------------

    @classmethod
    def from_csr(
        cls,
        graph: CSRGraph,
        *,
        placement: Union[Placement, str] = Placement.CPU,
        device: Union[int, str, torch.device, None] = None,
        page_size: int = 32,
        headroom: float = 0.5,
        symmetric: Optional[bool] = None,
        grow: bool = True,
        in_index: bool = False,
    ) -> "DynamicGraph":
        """A dynamic graph holding ``graph``'s edges, each row's order kept.

        ``placement``: ``"cpu"``, ``"cuda"`` or ``"unified"`` (see the module docstring);
        ``device`` names the GPU (default: the current one). ``page_size``: slots per page, a
        power of two in [4, 4096] (32 int32 ids = one 128-byte line). ``headroom``: spare pages
        allocated beyond what the graph needs, as a fraction. ``symmetric``: whether updates
        apply in both directions (default: ``graph.symmetric``); ``True`` on a CSR not marked
        symmetric checks that its edges come in both directions. ``grow``: grow the pool when a
        batch needs more pages than are free (else :class:`PoolFullError`). ``in_index``: keep
        an in-edge index, so that :meth:`delete_vertices` on a directed graph reads the lists
        holding edges into the vertices instead of sweeping every page (see the module
        docstring); a symmetric graph needs none and keeps none.
        """
        if not isinstance(graph, CSRGraph):
            raise TypeError(f"from_csr: graph must be a CSRGraph, got {type(graph).__name__}")
        placement = Placement.parse(placement)
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {[p.value for p in PLACEMENTS]}, got {placement.value!r}")
        if not headroom >= 0:
            raise ValueError(f"headroom must be >= 0, got {headroom}")
        _page_shift(page_size)
        if not isinstance(in_index, bool):
            raise TypeError(f"from_csr: in_index must be a bool, got {type(in_index).__name__}")
        symmetric = graph.symmetric if symmetric is None else bool(symmetric)
        if symmetric and not graph.symmetric:
            _check_symmetric(graph)
        dev = _state_device(placement, device)
        dtype = graph.indices.dtype
        n = graph.num_nodes
        indptr = graph.indptr.to(dev)
        need = _pages_of(indptr, page_size)
        num_pages = max(_MIN_PAGES, math.ceil(need * (1.0 + headroom)))
        _check_id_range(dtype, num_pages, max(n, 1))
        wdtype = None if graph.weights is None else graph.weights.dtype
        g = cls._empty(placement, dev, dtype, wdtype, num_pages, max(n, 1), n, page_size, symmetric, grow)
        g._entries = graph.num_edges if n else 0
        if n and graph.num_edges:
            indices, weights = _edge_arrays_for(graph, placement, dev)
            vertices = torch.arange(n, device=dev)
            _ops().dynamic_graph_append.default(
                g.pool, g.weights, g.root, g.height, g.degree, g.page_owner, g.page_rank, g.page_ring, g.meta,
                vertices, indptr, indices, weights, g.page_size)
        if in_index and not symmetric:
            g._build_in_index()
        return g

    def _build_in_index(self) -> None:
        """(Re)builds the in-edge index exactly: index list ``v`` holds the source of every
        entry ``u -> v``, ascending, repeats kept."""
        n, dev = self._num_nodes, self.device
        snap = self.to_csr()
        src = torch.repeat_interleave(torch.arange(n, device=dev), snap.indptr[1:] - snap.indptr[:-1])
        dst = snap.indices.to(torch.int64)
        key, _ = torch.sort(dst * self._key_base() + src)
        indegree = torch.bincount(dst, minlength=n) if dst.numel() else torch.zeros(n, dtype=torch.int64, device=dev)
        offsets = torch.zeros(n + 1, dtype=torch.int64, device=dev)
        torch.cumsum(indegree, 0, out=offsets[1:])
        num_pages = max(_MIN_PAGES, math.ceil(_pages_of(offsets, self.page_size) * (1.0 + 0.5)))
        index = DynamicGraph._empty(self.placement, dev, self.pool.dtype, None, num_pages, self.root.numel(), n,
                                    self.page_size, False, True)
        if key.numel():
            index._append_runs(torch.arange(n, device=dev), offsets, key % self._key_base(), None,
                               "in-edge index")
        self._in = index
        self._index_entries = int(key.numel())
        self._in._entries = self._index_entries

    @classmethod
    def _empty(cls, placement: Placement, dev: torch.device, dtype: torch.dtype, wdtype: Optional[torch.dtype],
               num_pages: int, capacity: int, num_nodes: int, page_size: int, symmetric: bool,
               grow: bool) -> "DynamicGraph":
        pool = _pool_tensor(placement, dev, num_pages * page_size, dtype, -1)
        weights = None if wdtype is None else _pool_tensor(placement, dev, num_pages * page_size, wdtype, 0)
        alive = torch.zeros(capacity, dtype=torch.bool, device=dev)
        alive[:num_nodes] = True
        return cls(
            pool=pool, weights=weights,
            root=torch.full((capacity,), -1, dtype=dtype, device=dev),
            height=torch.zeros(capacity, dtype=torch.int8, device=dev),
            degree=torch.zeros(capacity, dtype=torch.int64, device=dev),
            alive=alive,
            page_owner=torch.full((num_pages,), -1, dtype=dtype, device=dev),
            page_rank=torch.full((num_pages,), -1, dtype=torch.int32, device=dev),
            page_ring=torch.full((num_pages,), -1, dtype=dtype, device=dev),
            vertex_ring=torch.full((capacity,), -1, dtype=torch.int64, device=dev),
            meta=torch.zeros(3, dtype=torch.int64, device=dev),
            page_size=page_size, num_nodes=num_nodes, symmetric=symmetric, placement=placement, grow=grow)

    # --- how deletion finds in-edges ---------------------------------------------------------

    @property
    def in_edge_lookup(self) -> str:
        """How :meth:`delete_vertices` finds the lists holding edges into a vertex:
        ``"out_lists"`` (symmetric graph), ``"index"`` (directed, ``in_index=True``) or
        ``"sweep"`` (directed, every page read)."""
        if self.symmetric:
            return "out_lists"
        return "index" if self._in is not None else "sweep"

    # --- properties ----------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """Where the ops run: the device of the per-vertex state."""
        return self.degree.device

    @property
    def num_nodes(self) -> int:
        """Vertex ids in use or deleted: ids are ``0 .. num_nodes - 1``."""
        return self._num_nodes

    @property
    def num_edges(self) -> int:
        """Entries in all lists (a symmetric graph counts each edge twice, as its CSR does).
        Reads the degrees (one synchronisation)."""
        return int(self.degree[: self._num_nodes].sum())

    @property
    def num_pages(self) -> int:
        """Pages in the pool."""
        return self.page_owner.numel()

    @property
    def free_pages(self) -> int:
        """Pages a batch can take: queued for reuse plus never used (one synchronisation)."""
        head, tail, fresh = self.meta.tolist()
        return tail - head + self.num_pages - fresh

    def out_degree(self) -> torch.Tensor:
        """int64 list length of every vertex id (0 for deleted ones), on :attr:`device`."""
        return self.degree[: self._num_nodes]

    def is_alive(self) -> torch.Tensor:
        """bool per vertex id: False for deleted ids."""
        return self.alive[: self._num_nodes]

    def memory(self) -> MemoryFootprint:
        """The bytes this graph holds (see :class:`MemoryFootprint`); one synchronisation."""
        page_bytes = self.page_size * (self.pool.element_size()
                                       + (0 if self.weights is None else self.weights.element_size()))
        used_pages = self.num_pages - self.free_pages
        tables = sum(t.numel() * t.element_size() for t in (self.page_owner, self.page_rank, self.page_ring))
        tables += self.meta.numel() * self.meta.element_size()
        vertex = sum(t.numel() * t.element_size()
                     for t in (self.root, self.height, self.degree, self.alive, self.vertex_ring))
        own = MemoryFootprint(self.num_pages * page_bytes, used_pages * page_bytes, tables, vertex)
        if self._in is None:
            return own
        index = self._in.memory()
        return MemoryFootprint(*(a + b for a, b in zip(dataclasses.astuple(own), dataclasses.astuple(index))))

    def __repr__(self) -> str:
        w = "none" if self.weights is None else str(self.weights.dtype).replace("torch.", "")
        return (f"DynamicGraph(num_nodes={self._num_nodes}, page_size={self.page_size}, "
                f"pages={self.num_pages}, ids={str(self.pool.dtype).replace('torch.', '')}, weights={w}, "
                f"symmetric={self.symmetric}, in_edge_lookup={self.in_edge_lookup!r}, "
                f"placement={self.placement.value!r}, device={self.device})")

    # --- batch checks ----------------------------------------------------------------------

    def _vertex_ids(self, x, name: str, op: str) -> torch.Tensor:
        t = _as_tensor(x, name)
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{op}: {name} must hold int32 or int64 vertex ids, got {t.dtype}")
        return t.to(device=self.device, dtype=torch.int64)

    def _check_alive(self, op: str, *, counts: Sequence[torch.Tensor] = (), **batches: torch.Tensor) -> List[int]:
        """Raises for the first id of any batch that is out of range or deleted; returns the
        values of ``counts`` (int64 scalars on the device), read in the same sync (the one)."""
        n = self._num_nodes
        facts = []
        for t in batches.values():
            if t.numel() == 0:
                facts.append(torch.zeros(2, dtype=torch.int64, device=self.device))
                continue
            # Per id 2: out of range, 1: deleted, 0: alive; the first of the worst kind.
            dead = ~self.alive[t.clamp(0, max(n - 1, 0))]
            code = torch.where((t < 0) | (t >= n), 2, dead.to(torch.int64))
            first = torch.argmax(code)
            facts.append(torch.stack([code[first], first]))
        facts.extend(c.reshape(1).expand(2) for c in counts)
        values = torch.stack(facts).tolist() if facts else []
        for (name, t), (worst, i) in zip(batches.items(), values):
            if worst == 2:
                raise IndexError(f"{op}: {name}[{i}] = {int(t[i])} is out of range for a graph with {n} vertex ids")
            if worst == 1:
                raise ValueError(f"{op}: {name}[{i}] = {int(t[i])} is a deleted vertex")
        return [c for c, _ in values[len(batches):]]

    def _edge_batch(self, src, dst, op: str) -> Tuple[torch.Tensor, torch.Tensor]:
        s = self._vertex_ids(src, "src", op)
        d = self._vertex_ids(dst, "dst", op)
        if s.numel() != d.numel():
            raise ValueError(f"{op}: src and dst must have the same length, got {s.numel()} and {d.numel()}")
        self._check_alive(op, src=s, dst=d)
        return s, d

    def _batch_weights(self, weights, count: int, op: str) -> Optional[torch.Tensor]:
        if self.weights is None:
            if weights is not None:
                raise ValueError(f"{op}: the graph has no weights, but weights were given")
            return None
        if weights is None:
            raise ValueError(f"{op}: the graph is weighted ({self.weights.dtype}); pass one weight per edge")
        w = _as_tensor(weights, "weights")
        if w.numel() != count:
            raise ValueError(f"{op}: weights must have one entry per edge ({count}), got {w.numel()}")
        want = self.weights.dtype
        if want == torch.int32 and w.is_floating_point():
            raise TypeError(f"{op}: the graph's weights are int32, got {w.dtype} weights")
        return w.to(device=self.device, dtype=want)

    def _key_base(self) -> int:
        return max(self._num_nodes, 1)

    # --- edge updates --------------------------------------------------------------------

    def insert_edges(self, src, dst, weights=None) -> int:
        """Adds edges ``src[i] -> dst[i]`` (both directions on a symmetric graph), skipping
        duplicates within the batch and edges already present; returns how many list entries
        were added. Ids must be alive. All-or-nothing (see the module docstring)."""
        op = "insert_edges"
        s, d = self._edge_batch(src, dst, op)
        w = self._batch_weights(weights, s.numel(), op)
        if self.symmetric:
            s, d = torch.cat([s, d]), torch.cat([d, s])
            w = None if w is None else torch.cat([w, w])
        if s.numel() == 0:
            return 0
        base = self._key_base()
        key, order = torch.sort(s * base + d, stable=True)
        first = torch.ones_like(key, dtype=torch.bool)
        first[1:] = key[1:] != key[:-1]
        key, order = key[first], order[first]
        s = torch.div(key, base, rounding_mode="floor")
        d = key - s * base
        vertices, offsets = _runs(s)
        found = _ops().dynamic_graph_contains.default(self.pool, self.root, self.height, self.degree, vertices,
                                                      offsets, d, self.page_size)
        new = ~found
        s, d, order = s[new], d[new], order[new]
        added = s.numel()
        if added == 0:
            return 0
        vertices, offsets = _runs(s)
        self._append_runs(vertices, offsets, d, None if w is None else w[order], op)
        self._entries += added
        if self._in is not None:
            self._index_added(s, d)
        return added

    def _append_runs(self, vertices: torch.Tensor, offsets: torch.Tensor, dst: torch.Tensor,
                     weights: Optional[torch.Tensor], op: str) -> None:
        """Appends dst[offsets[r] .. offsets[r + 1]) to the list of vertices[r] (ascending,
        distinct), after reserving the pages."""
        need = _ops().dynamic_graph_pages_needed.default(self.degree, vertices, offsets, self.page_size)
        self._reserve_pages(need, op)
        _ops().dynamic_graph_append.default(
            self.pool, self.weights, self.root, self.height, self.degree, self.page_owner, self.page_rank,
            self.page_ring, self.meta, vertices, offsets, dst, weights, self.page_size)

    def _index_added(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Records the new entries ``src[i] -> dst[i]`` in the in-edge index, or rebuilds the
        index when its stale entries would pass the bound of the module docstring."""
        if self._index_entries + src.numel() > 2 * self._entries + _INDEX_SLACK:
            self._build_in_index()
            return
        base = self._key_base()
        key, _ = torch.sort(dst * base + src)
        head = torch.div(key, base, rounding_mode="floor")
        vertices, offsets = _runs(head)
        self._in._append_runs(vertices, offsets, key - head * base, None, "insert_edges (in-edge index)")
        self._index_entries += src.numel()

    def _find_edges(self, src: torch.Tensor, dst: torch.Tensor):
        """Where the distinct edges ``(src, dst)`` sit in their lists: ``(vertices, offsets,
        positions)`` of ``dynamic_graph_find``, the lists of ``vertices`` in ascending order,
        each list's hits in ``positions[offsets[i] .. offsets[i + 1])``."""
        base = self._key_base()
        key = torch.unique(src * base + dst)
        heads = torch.div(key, base, rounding_mode="floor")
        vertices, offsets = _runs(heads)
        found_offsets, positions = _ops().dynamic_graph_find.default(
            self.pool, self.root, self.height, self.degree, vertices, offsets, key - heads * base, self.page_size)
        return vertices, found_offsets, positions

    def delete_edges(self, src, dst) -> int:
        """Removes every copy of each edge ``src[i] -> dst[i]`` (both directions on a symmetric
        graph); edges not present are ignored, ids must be alive. Returns how many list entries
        were removed. All-or-nothing (see the module docstring)."""
        op = "delete_edges"
        s, d = self._edge_batch(src, dst, op)
        if self.symmetric:
            s, d = torch.cat([s, d]), torch.cat([d, s])
        if s.numel() == 0:
            return 0
        vertices, pos_offsets, positions = self._find_edges(s, d)
        removed = self._remove(vertices, pos_offsets, positions)
        self._entries -= removed
        return removed

    def _remove(self, vertices: torch.Tensor, pos_offsets: torch.Tensor, positions: torch.Tensor) -> int:
        removed = positions.numel()
        if removed:
            _ops().dynamic_graph_remove.default(
                self.pool, self.weights, self.root, self.height, self.degree, self.page_owner, self.page_rank,
                self.page_ring, self.meta, vertices, pos_offsets, positions, self.page_size)
        return removed

    def _clear(self, vertices: torch.Tensor) -> int:
        """Empties the lists of ``vertices`` (ascending, distinct); returns the entries removed."""
        return int(_ops().dynamic_graph_clear.default(self.pool, self.root, self.height, self.degree, self.page_owner,
                                                  self.page_rank, self.page_ring, self.meta, vertices, self.page_size))

    def has_edges(self, src, dst) -> torch.Tensor:
        """bool per pair: whether ``src[i] -> dst[i]`` is in the graph (ids in range; a deleted
        id has no edges)."""
        op = "has_edges"
        s = self._vertex_ids(src, "src", op)
        d = self._vertex_ids(dst, "dst", op)
        if s.numel() != d.numel():
            raise ValueError(f"{op}: src and dst must have the same length, got {s.numel()} and {d.numel()}")
        n = self._num_nodes
        for name, t in (("src", s), ("dst", d)):
            if t.numel() and (int(t.min()) < 0 or int(t.max()) >= n):
                raise IndexError(f"{op}: {name} holds ids out of range for a graph with {n} vertex ids")
        if s.numel() == 0:
            return torch.zeros(0, dtype=torch.bool, device=self.device)
        base = self._key_base()
        key, inverse = torch.unique(s * base + d, return_inverse=True)
        us = torch.div(key, base, rounding_mode="floor")
        vertices, offsets = _runs(us)
        found = _ops().dynamic_graph_contains.default(self.pool, self.root, self.height, self.degree, vertices,
                                                      offsets, key - us * base, self.page_size)
        return found[inverse]

    # --- vertex updates ------------------------------------------------------------------

    def insert_vertices(self, count: int) -> torch.Tensor:
        """Adds ``count`` vertices without edges; returns their ids (int64, on :attr:`device`):
        deleted ids first, oldest deletion first, then fresh ids from :attr:`num_nodes` up."""
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise ValueError(f"insert_vertices: count must be an int >= 0, got {count!r}")
        count = int(count)
        queued = self._vertex_tail - self._vertex_head
        take = min(count, queued)
        fresh = count - take
        _check_id_range(self.pool.dtype, self.num_pages, self._num_nodes + fresh)
        if self._num_nodes + fresh > self.root.numel():
            self._grow_vertices(self._num_nodes + fresh)
        cap = self.vertex_ring.numel()
        reused = self.vertex_ring[(self._vertex_head + torch.arange(take, device=self.device)) % cap]
        ids = torch.cat([reused, torch.arange(self._num_nodes, self._num_nodes + fresh, device=self.device)])
        self.alive[ids] = True
        self._vertex_head += take
        self._num_nodes += fresh
        if self._in is not None:
            self._in._num_nodes = self._num_nodes
        return ids

    def delete_vertices(self, ids) -> int:
        """Deletes the vertices (duplicates ignored; each must be alive): their lists and every
        edge pointing at them go, their ids join the free-vertex queue in ascending order.
        Returns how many list entries were removed. The in-edges are found as
        :attr:`in_edge_lookup` says; the result is the same on every path."""
        return self._delete_vertices(ids, sweep=False)

    def _delete_vertices(self, ids, *, sweep: bool) -> int:
        """delete_vertices; ``sweep=True`` finds the in-edges by the page sweep on any graph
        (the reference the list paths are compared with)."""
        op = "delete_vertices"
        v = self._vertex_ids(ids, "ids", op)
        dying = torch.zeros(self.root.numel(), dtype=torch.bool, device=self.device)
        if self._num_nodes > 0:
            dying[v.clamp(0, self._num_nodes - 1)] = True  # a bad id raises below, before any use
        (count,) = self._check_alive(op, counts=[dying.sum()], ids=v)
        if count == 0:
            return 0
        v = torch.nonzero_static(dying, size=count).flatten()  # ascending, without duplicates; no sync
        # Every path removes the edges into dying vertices from the other lists first, then
        # empties the dying lists whole, so all of them leave the same pages and free queue.
        if sweep or self.in_edge_lookup == "sweep":
            owners, positions = _ops().dynamic_graph_find_touching.default(
                self.pool, self.root, self.height, self.degree, self.page_owner, self.page_rank, self.meta, dying,
                self.page_size)
            others = ~dying[owners]
            vertices, pos_offsets = _runs(owners[others])
            positions = positions[others]
        else:
            # The other lists that may hold an edge into a dying vertex (its out-list on a
            # symmetric graph, its index list otherwise), ascending.
            lists = self if self.symmetric else self._in
            touched = _ops().dynamic_graph_mark_neighbours.default(lists.pool, lists.root, lists.height,
                                                                   lists.degree, v, self.page_size)
            touched &= ~dying
            vertices = torch.nonzero(touched).flatten()
            pos_offsets, positions = _ops().dynamic_graph_find_marked.default(
                self.pool, self.root, self.height, self.degree, vertices, dying, self.page_size)
        removed = self._remove(vertices, pos_offsets, positions) + self._clear(v)
        self._entries -= removed
        if self._in is not None:
            self._index_entries -= self._in._clear(v)  # v's index lists go whole
        self.alive[v] = False
        cap = self.vertex_ring.numel()
        slots = (self._vertex_tail + torch.arange(v.numel(), device=self.device)) % cap
        self.vertex_ring[slots] = v
        self._vertex_tail += v.numel()
        return removed

    # --- capacity --------------------------------------------------------------------------

    def _reserve_pages(self, need: torch.Tensor, op: str) -> None:
        need_i, head, tail, fresh = torch.cat([need.reshape(1), self.meta]).tolist()
        free = tail - head + self.num_pages - fresh
        if need_i <= free:
            return
        if not self.grow:
            raise PoolFullError(
                f"{op}: the page pool is full: the batch needs {need_i} pages and {free} of its {self.num_pages} "
                f"are free; reserve more with reserve_pages() or build the graph with grow=True or more headroom")
        self.reserve_pages(max(math.ceil(self.num_pages * _GROWTH), self.num_pages + need_i - free))

    def reserve_pages(self, num_pages: int) -> None:
        """Grows the pool to at least ``num_pages`` pages (never shrinks). Page ids stay valid;
        the free-page queue keeps its order."""
        num_pages = int(num_pages)
        old = self.num_pages
        if num_pages <= old:
            return
        _check_id_range(self.pool.dtype, num_pages, self.root.numel())
        size = self.page_size
        self.pool = _grown(self.pool, num_pages * size, -1, self.placement)
        if self.weights is not None:
            self.weights = _grown(self.weights, num_pages * size, 0, self.placement)
        self.page_owner = _grown(self.page_owner, num_pages, -1, "cpu")
        self.page_rank = _grown(self.page_rank, num_pages, -1, "cpu")
        head, tail, fresh = self.meta.tolist()
        self.page_ring = _relinearised(self.page_ring, head, tail, num_pages)
        self.meta = torch.tensor([0, tail - head, fresh], dtype=torch.int64, device=self.device)

    def _grow_vertices(self, needed: int) -> None:
        cap = max(needed, math.ceil(self.root.numel() * _GROWTH))
        self.root = _grown(self.root, cap, -1, "cpu")
        self.height = _grown(self.height, cap, 0, "cpu")
        self.degree = _grown(self.degree, cap, 0, "cpu")
        self.alive = _grown(self.alive, cap, False, "cpu")
        self.vertex_ring = _relinearised(self.vertex_ring, self._vertex_head, self._vertex_tail, cap)
        self._vertex_tail -= self._vertex_head
        self._vertex_head = 0
        if self._in is not None:
            self._in._grow_vertices(cap)

    # --- reads ---------------------------------------------------------------------------

    def to_csr(self, *, return_slots: bool = False):
        """The graph as a :class:`CSRGraph` (on :attr:`device`: placement ``"cuda"`` for GPU
        state, ``"cpu"`` otherwise), rows in list order (see the module docstring); deleted ids
        are rows without edges. With ``return_slots=True`` also the pool slot of every CSR
        position (int64): ``snapshot position p`` is ``pool slot slots[p]``."""
        n = self._num_nodes
        indptr, indices, weights, slots = _ops().dynamic_graph_to_csr.default(
            self.pool, self.weights, self.root[:n], self.height[:n], self.degree[:n], self.page_owner,
            self.page_rank, self.meta, self.page_size, bool(return_slots))
        placement = Placement.GPU if indptr.device.type == "cuda" else Placement.CPU
        csr = CSRGraph(indptr, indices, weights if self.weights is not None else None, symmetric=self.symmetric,
                       placement=placement, validate=False)
        return (csr, slots) if return_slots else csr

    def sample_neighbors(self, seeds: torch.Tensor, fanout: int, *, replace: bool = False,
                         seed: Optional[int] = None) -> "_sampling.SampledNeighbors":
        """:func:`pytorch_zerocopy.sampling.sample_neighbors` (uniform) over the out-neighbour
        lists: the same offsets, neighbours and seed indices as that op on :meth:`to_csr` for
        the same ``seed``; ``edge_pos`` holds pool slots (valid until the next update; a
        slot's weight is ``weights[slot]``). Deleted ids get no neighbours."""
        if not isinstance(seeds, torch.Tensor):
            raise TypeError(f"sample_neighbors: seeds must be a tensor, got {type(seeds).__name__}")
        if seeds.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"sample_neighbors: seeds must be int32 or int64, got {seeds.dtype}")
        if isinstance(fanout, bool) or not isinstance(fanout, int):
            raise TypeError(f"sample_neighbors: fanout must be an int, got {type(fanout).__name__}")
        if fanout < -1:
            raise ValueError(f"sample_neighbors: fanout must be -1 (all neighbours) or >= 0, got {fanout}")
        seed = _sampling._resolve_seed(seed)
        seeds = seeds.reshape(-1).to(device=self.device, dtype=torch.int64)
        out = _ops().dynamic_graph_sample.default(self.pool, self.root[: self._num_nodes],
                                                  self.height[: self._num_nodes], self.degree[: self._num_nodes],
                                                  seeds, int(fanout), bool(replace), seed,
                                                  self.page_size)
        return _sampling.SampledNeighbors(*out)

    def sample_layers(self, seeds: torch.Tensor, fanouts: Sequence[int], *, edge_dir: str = "in",
                      replace: bool = False, probs: Optional[torch.Tensor] = None,
                      seed: Optional[int] = None) -> List[Block]:
        """:func:`pytorch_zerocopy.sampling.sample_layers` over this graph: the same blocks as
        that function on :meth:`to_csr` for the same ``seed``, with pool slots as edge ids.

        ``edge_dir='in'`` needs a symmetric graph (a directed one keeps out-lists only; its
        in-edge ids are then the slots of the stored reverse entries). Uniform sampling only:
        ``probs`` must be None.
        """
        if edge_dir not in ("in", "out"):
            raise ValueError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
        if edge_dir == "in" and not self.symmetric:
            raise ValueError("sample_layers: a directed DynamicGraph keeps out-neighbour lists only; sample with "
                             "edge_dir='out', or keep the graph symmetric")
        if probs is not None:
            raise ValueError("sample_layers: a DynamicGraph samples uniformly; probs must be None")
        fanouts = _sampling.applied_fanouts(fanouts)
        seeds = _sampling._as_seeds(seeds, self.device).long()
        seed = _sampling._resolve_seed(seed)
        n = self._num_nodes
        nodes, src, dst, eids = _ops().dynamic_graph_sample_layers.default(
            self.pool, self.root[:n], self.height[:n], self.degree[:n], seeds, fanouts, bool(replace), seed,
            self.page_size)
        return _sampling.layer_blocks(seeds.numel(), nodes, src, dst, eids)

    def bfs(self, source: int, *, variant: Optional[str] = None, predecessors: bool = False,
            return_stats: bool = False):
        """:func:`pytorch_zerocopy.graph.bfs` over the paged lists: the same depths as on
        :meth:`to_csr` (and on the CPU the same predecessors). ``variant`` is accepted for
        the signature's sake and ignored: the GPU sweeps the pages of the active vertices."""
        del variant
        source = _check_source(_SizedGraph(self._num_nodes), source, "bfs")
        depth, pred, stats = _ops().dynamic_graph_bfs.default(
            self.pool, self.root[: self._num_nodes], self.height[: self._num_nodes],
            self.degree[: self._num_nodes], self.page_owner, self.page_rank, self.meta, source, bool(predecessors),
            self.page_size)
        out = (depth, pred) if predecessors else (depth,)
        if return_stats:
            out = out + (stats,)
        return out[0] if len(out) == 1 else out

    # The dispatch hooks: pytorch_zerocopy.sampling.sample_layers(graph, ...) and
    # pytorch_zerocopy.graph.bfs(graph, ...) hand a graph that has them to these methods.
    __zerocopy_sample_layers__ = sample_layers
    __zerocopy_bfs__ = bfs


class _SizedGraph:
    """The one attribute traversal's source check reads."""

    def __init__(self, num_nodes: int) -> None:
        self.num_nodes = num_nodes


# --- helpers -------------------------------------------------------------------------------


def _runs(sorted_ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The distinct values of an ascending int64 tensor and the offsets of their runs."""
    vertices, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    offsets = torch.zeros(vertices.numel() + 1, dtype=torch.int64, device=sorted_ids.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    return vertices, offsets


def _check_symmetric(graph: CSRGraph) -> None:
    """Raises unless every entry ``u -> v`` of ``graph`` is matched by an entry ``v -> u`` (as
    many copies of each): what ``symmetric=True`` promises ``delete_vertices``."""
    n = graph.num_nodes
    indptr = graph.indptr
    src = torch.repeat_interleave(torch.arange(n, device=indptr.device), indptr[1:] - indptr[:-1])
    dst = graph.indices.to(device=indptr.device, dtype=torch.int64)
    forward, _ = torch.sort(src * max(n, 1) + dst)
    backward, _ = torch.sort(dst * max(n, 1) + src)
    if not torch.equal(forward, backward):
        raise ValueError("from_csr: symmetric=True needs a graph whose edges come in both directions (every "
                         "u -> v matched by v -> u); this CSR's are not: build it with "
                         "CSRGraph.from_coo(..., symmetrize=True), or pass symmetric=False")


def _state_device(placement: Placement, device) -> torch.device:
    if placement is Placement.CPU:
        return torch.device("cpu")
    if placement is Placement.GPU:
        return _cuda_device(device)
    return _cuda_device(device) if _unified.gpu_backed() else torch.device("cpu")


def _pool_tensor(placement: Placement, dev: torch.device, numel: int, dtype: torch.dtype, fill) -> torch.Tensor:
    if placement is not Placement.MAPPED:
        return torch.full((numel,), fill, dtype=dtype, device=dev)
    udev = f"{_unified.DEVICE_TYPE}:{dev.index}" if dev.type == "cuda" else None
    t = _unified.empty_unified(numel, dtype, udev)
    t.fill_(fill)
    return t


def _grown(t: torch.Tensor, numel: int, fill, placement: Placement) -> torch.Tensor:
    """A longer copy of ``t`` (same dtype and placement) with the new tail set to ``fill``."""
    if placement is Placement.MAPPED:
        dev = torch.device("cuda", t.device.index) if _unified.gpu_backed() else torch.device("cpu")
        out = _pool_tensor(Placement.MAPPED, dev, numel, t.dtype, fill)
    else:
        out = torch.full((numel,), fill, dtype=t.dtype, device=t.device)
    out[: t.numel()].copy_(t)
    return out


def _relinearised(ring: torch.Tensor, head: int, tail: int, capacity: int) -> torch.Tensor:
    """A ring of ``capacity`` entries holding ring[head .. tail) (indices mod len) at 0 .. tail - head."""
    out = torch.full((capacity,), -1, dtype=ring.dtype, device=ring.device)
    if tail > head:
        idx = (head + torch.arange(tail - head, device=ring.device)) % ring.numel()
        out[: tail - head] = ring[idx]
    return out


def _edge_arrays_for(graph: CSRGraph, placement: Placement, dev: torch.device):
    """The CSR's edge list where the build kernel reads it: on the GPU for "cuda"; mapped in
    place (zero-copy) for "unified"; on the CPU for "cpu"."""
    if placement is Placement.MAPPED and dev.type == "cuda":
        return (_unified.to_unified(graph.indices.cpu()),
                None if graph.weights is None else _unified.to_unified(graph.weights.cpu()))
    return graph.indices.to(dev), None if graph.weights is None else graph.weights.to(dev)


def _check_id_range(dtype: torch.dtype, num_pages: int, num_ids: int) -> None:
    if dtype == torch.int32 and (num_pages > _INT32_MAX or num_ids > _INT32_MAX):
        raise ValueError(f"a DynamicGraph with int32 ids holds at most {_INT32_MAX} pages and vertex ids; "
                         f"asked for {num_pages} pages and {num_ids} ids: build it from a CSR with int64 ids")
