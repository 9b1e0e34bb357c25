"""Neighbour sampling over a graph held in CPU, GPU or unified (host-mapped) memory.

One layer: :func:`sample_neighbors` picks, for every seed node, up to ``fanout`` entries of its
neighbour list (``indices[indptr[v]:indptr[v+1]]``). Several layers: :func:`sample_layers`
samples outward from the seeds with one fanout per layer and compacts each layer into a message
flow graph (:class:`~pytorch_zerocopy.block.Block`: unique nodes, destination nodes first;
relabelled edges), all layers in one call of the op ``zerocopy::sample_layers``.

Frontiers (:class:`Frontier`). Layer ``l`` samples the neighbours of its frontier: with
``Frontier.ALL`` (DGL's rule) every node of layer ``l - 1``; with ``Frontier.NEW`` (PyG's hops)
only the nodes first reached in layer ``l - 1``, so each node's neighbours are sampled at most
once. Either way a layer's nodes are every node reached so far, each keeping its index from the
layer that first reached it, so the outermost block's nodes list every node of the sample.

The graph is a :class:`~pytorch_zerocopy.graph.CSRGraph` (row ``v`` lists ``v``'s
out-neighbours). ``edge_dir='out'`` samples its rows; ``'in'`` (DGL's default) samples its
transpose :meth:`CSRGraph.csc() <pytorch_zerocopy.graph.CSRGraph.csc>`, computed once per graph
and kept. A raw ``(indptr, indices)`` pair is turned into a validated CSRGraph on each call
(and, for ``'in'``, transposed each call): build the CSRGraph once to sample it many times.

Where it runs. On the GPU when the graph's ``indptr`` is a CUDA tensor (placements ``"cuda"``
and ``"unified"``: the kernels then read the neighbour lists from host memory over PCIe, DGL's
"UVA sampling"); on the CPU otherwise, multithreaded. Seeds are moved to that device.

Synchronisation. On the GPU a :func:`sample_layers` call makes one host synchronisation, under
either frontier rule: it reads every layer's sizes and the kernels' error words at once, at the
end (plus one per layer with fanout ``-1``, whose size has no bound known in advance).
:func:`sample_layers_async` makes none: it returns a :class:`PendingSample` whose
:meth:`~PendingSample.result` waits for this call's work only (a CUDA event), so sampling
minibatch ``i + 1`` can overlap other work.

Determinism. Every random draw is a hash of ``(seed, seed node id, draw number)``: a given seed
gives the same sample on every run and every thread count, and the CPU and CUDA kernels give
identical uniform samples, with identical node order after compaction, under either frontier
rule. Layer ``l`` (counted from the seeds) draws with a seed derived from ``(seed, l)`` (layer 0
with ``seed`` itself), so a node that is a seed in two layers gets independent samples in each.

Validation. The kernels never trust the graph: every offset pair, neighbour id, edge id and
probability they visit is checked, and bad input raises ``IndexError`` (seeds out of range) or
``ValueError`` naming the argument; NaN, infinite or negative probabilities are errors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from . import unified as _unified
from ._compat import register_fake
from .block import Block
from .graph.csr import CSRGraph

__all__ = [
    "Block",
    "Frontier",
    "PendingSample",
    "SampledNeighbors",
    "as_csr_graph",
    "compact",
    "draw_seed",
    "draw_seeds",
    "sample_layers",
    "sample_layers_async",
    "sample_neighbors",
]

_MASK64 = (1 << 64) - 1
_NUM_SAMPLE_ERRORS = 7  # sampling::kNumSampleErrors (csrc/sampling.h): error words in a status
EDGE_DIRS = ("in", "out")

GraphLike = Union[CSRGraph, Tuple[torch.Tensor, torch.Tensor]]


class Frontier(enum.IntEnum):
    """Which nodes layer ``l >= 1`` of a multi-layer sample draws neighbours for (the op's
    ``frontier`` argument, ``sampling::Frontier`` in csrc/sampling.h)."""

    ALL = 0  # every node of layer l - 1: DGL's message flow graphs
    NEW = 1  # the nodes first reached in layer l - 1: PyG's hops


def _as_frontier(frontier) -> Frontier:
    if isinstance(frontier, bool) or not isinstance(frontier, int):
        raise TypeError(f"frontier must be a pytorch_zerocopy.sampling.Frontier, got {frontier!r}")
    try:
        return Frontier(frontier)
    except ValueError:
        raise ValueError(f"frontier must be Frontier.ALL or Frontier.NEW, got {frontier!r}") from None


class SampledNeighbors(NamedTuple):
    """One layer's raw sample. Seed ``i`` got ``neighbors[offsets[i]:offsets[i+1]]``, found at
    positions ``edge_pos[...]`` of the adjacency's ``indices``."""

    offsets: torch.Tensor  # int64, len(seeds) + 1
    neighbors: torch.Tensor  # dtype of indices
    edge_pos: torch.Tensor  # int64
    seed_index: torch.Tensor  # int64: the i of the seed each sampled edge belongs to


def _compute_device(t: torch.Tensor) -> torch.device:
    """Where an op on ``t`` runs: its own device; for a unified tensor, its GPU or the CPU."""
    if _unified.is_unified(t):
        if not _unified.gpu_backed():
            return torch.device("cpu")
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        return torch.device("cuda", index)
    return t.device


def _signed64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


def draw_seed() -> int:
    """A sampling seed drawn from torch's default CPU generator: what ``seed=None`` draws."""
    return int(torch.randint(0, 2**62, ()).item())


def draw_seeds(n: int) -> torch.Tensor:
    """``n`` sampling seeds (int64) drawn at once: the seeds ``n`` calls of :func:`draw_seed`
    draw, in order, from the same generator state."""
    return torch.randint(0, 2**62, (n,))


def _resolve_seed(seed: Optional[int]) -> int:
    if seed is None:
        return draw_seed()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    return _signed64(seed)


def _as_probs(probs: Optional[torch.Tensor], num_edges: int, device: torch.device) -> Optional[torch.Tensor]:
    """float32 probabilities on ``device`` (unified ones stay where they are)."""
    if probs is None:
        return None
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"probs must be a tensor, got {type(probs).__name__}")
    if probs.dim() != 1 or probs.numel() != num_edges:
        raise ValueError(f"probs must hold one value per edge ({num_edges} edges), got shape {tuple(probs.shape)}")
    if not probs.is_floating_point():
        raise TypeError(f"probs must be a floating tensor, got {probs.dtype}")
    if probs.dtype != torch.float32:
        probs = probs.float()
    if _unified.is_unified(probs):
        return probs
    return probs.to(device)


def _as_seeds(seeds, device: torch.device) -> torch.Tensor:
    if not isinstance(seeds, torch.Tensor):
        seeds = torch.as_tensor(seeds)
    if seeds.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"seeds must be an int32 or int64 tensor, got {seeds.dtype}")
    return seeds.reshape(-1).to(device)


# ----------------------------------------------------------------------------------------------
# One layer.


def sample_neighbors(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    seeds: torch.Tensor,
    fanout: int,
    *,
    replace: bool = False,
    probs: Optional[torch.Tensor] = None,
    seed: Optional[int] = None,
) -> SampledNeighbors:
    """Samples up to ``fanout`` neighbours of every node in ``seeds`` (see the module doc).

    ``fanout=-1`` takes every neighbour (every one with a positive probability when ``probs``
    is given: one per position of ``indices``). Without replacement a seed gets
    ``min(fanout, degree)`` distinct edges; with replacement exactly ``fanout`` (none when it
    has no neighbour). Edges with probability 0 are never sampled. ``seed=None`` draws one from
    torch's default generator. The same kernels as layer 0 of :func:`sample_layers` with the
    same seed, without the compaction; on the GPU two host synchronisations (the edge total,
    then the error words).
    """
    for name, t in (("indptr", indptr), ("indices", indices), ("seeds", seeds)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"sample_neighbors: {name} must be a tensor, got {type(t).__name__}")
    if isinstance(fanout, bool) or not isinstance(fanout, int):
        raise TypeError(f"sample_neighbors: fanout must be an int, got {type(fanout).__name__}")
    if fanout < -1:
        raise ValueError(f"sample_neighbors: fanout must be -1 (all neighbours) or >= 0, got {fanout}")
    if indptr.dtype != torch.int64:
        indptr = indptr.long()
    device = _compute_device(indptr)
    probs = _as_probs(probs, indices.numel(), device)
    seeds = _as_seeds(seeds, device)
    out = torch.ops.zerocopy.sample_neighbors.default(
        indptr, indices, seeds, int(fanout), bool(replace), probs, _resolve_seed(seed)
    )
    return SampledNeighbors(*out)


@register_fake("zerocopy::sample_neighbors")
def _sample_neighbors_fake(indptr, indices, seeds, fanout, replace, probs, seed):
    ctx = torch.library.get_ctx()
    total = ctx.new_dynamic_size()
    offsets = seeds.new_empty((seeds.shape[0] + 1,), dtype=torch.int64)
    return (offsets, indices.new_empty((total,)), indptr.new_empty((total,)),
            indptr.new_empty((total,)))


# ----------------------------------------------------------------------------------------------
# Compaction (message flow graphs).


@register_fake("zerocopy::compact_ids")
def _compact_ids_fake(seeds, neighbors):
    ctx = torch.library.get_ctx()
    nodes = seeds.new_empty((ctx.new_dynamic_size(),), dtype=torch.int64)
    return nodes, neighbors.new_empty(neighbors.shape, dtype=torch.int64)


def compact(seeds: torch.Tensor, neighbors: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Unique node ids of ``cat(seeds, neighbors)`` in order of first appearance, and the
    position of each neighbour in that list (both int64).

    With unique seeds the list starts with the seeds themselves, in order (the destination
    nodes of a message flow graph come first), so seed ``i`` has local id ``i``. The op
    ``zerocopy::compact_ids``: the hash-table compaction of :func:`sample_layers`, on the CPU or
    the GPU (one host synchronisation there), on the seeds' device.
    """
    if neighbors.device != seeds.device:
        neighbors = neighbors.to(seeds.device)
    nodes, local = torch.ops.zerocopy.compact_ids.default(seeds, neighbors)
    return nodes, local


# ----------------------------------------------------------------------------------------------
# Multi-layer sampling.


def as_csr_graph(graph: GraphLike) -> CSRGraph:
    """``graph`` as a :class:`CSRGraph`: itself, or a validated graph over an ``(indptr, indices)``
    pair (row ``v`` lists ``v``'s out-neighbours; the arrays are used in place, on their
    device; the checks read them once on the host)."""
    if isinstance(graph, CSRGraph):
        return graph
    if isinstance(graph, (tuple, list)) and len(graph) == 2:
        indptr, indices = graph
        if not isinstance(indptr, torch.Tensor) or not isinstance(indices, torch.Tensor):
            raise TypeError("graph: an (indptr, indices) pair must hold two tensors, got "
                            f"({type(indptr).__name__}, {type(indices).__name__})")
        if indptr.dtype in (torch.int32, torch.int16, torch.int8, torch.uint8):
            indptr = indptr.long()
        if _unified.is_unified(indices):
            placement = "unified"
        else:
            placement = "cuda" if indptr.is_cuda else "cpu"
        return CSRGraph(indptr, indices, placement=placement)
    raise TypeError(f"graph must be a CSRGraph or an (indptr, indices) pair, got {type(graph).__name__}")


@dataclass(frozen=True)
class _LayersCall:
    """The checked arguments of one multi-layer sample, in the op's terms."""

    indptr: torch.Tensor
    indices: torch.Tensor
    seeds: torch.Tensor
    fanouts: List[int]  # in the order applied: fanouts[0] is sampled from the seeds
    replace: bool
    probs: Optional[torch.Tensor]
    eids: Optional[torch.Tensor]
    seed: int
    device: torch.device  # where the op runs
    frontier: Frontier = Frontier.ALL

    def op_args(self) -> tuple:
        return (self.indptr, self.indices, self.seeds, self.fanouts, self.replace, self.probs, self.eids,
                self.seed)

    def run(self, op):
        """``op`` (``sample_layers`` or ``sample_layers_launch``) over these arguments."""
        return op(*self.op_args(), frontier=int(self.frontier))

    def blocks(self, nodes: Sequence[torch.Tensor], src: Sequence[torch.Tensor], dst: Sequence[torch.Tensor],
               eids: Sequence[torch.Tensor]) -> List[Block]:
        return layer_blocks(self.seeds.numel(), nodes, src, dst, eids)


def layer_blocks(num_seeds: int, nodes: Sequence[torch.Tensor], src: Sequence[torch.Tensor],
                 dst: Sequence[torch.Tensor], eids: Sequence[torch.Tensor]) -> List[Block]:
    """The layers of a ``sample_layers`` op (layer 0 sampled from the seeds) as blocks, the
    layer farthest from the seeds first."""
    out: List[Block] = []
    num_dst = num_seeds
    for layer_nodes, s, d, e in zip(nodes, src, dst, eids):
        out.append(Block(s, d, layer_nodes.numel(), num_dst, nodes=layer_nodes, eids=e))
        num_dst = layer_nodes.numel()
    out.reverse()
    return out


def applied_fanouts(fanouts: Sequence[int]) -> List[int]:
    """Checked fanouts (input side first, as users give them) in the order a ``sample_layers``
    op applies them: the first is sampled from the seeds."""
    fanouts = list(fanouts)
    if not fanouts:
        raise ValueError("fanouts must hold at least one fanout (one per layer)")
    for f in fanouts:
        if isinstance(f, bool) or not isinstance(f, int) or f < -1:
            raise ValueError(f"fanouts must be ints >= 0 or -1 (all neighbours), got {fanouts}")
    return list(reversed(fanouts))


def _layers_call(graph: GraphLike, seeds, fanouts: Sequence[int], edge_dir: str, replace: bool,
                 probs: Optional[torch.Tensor], seed: Optional[int], frontier: Frontier) -> _LayersCall:
    fanouts = applied_fanouts(fanouts)
    if edge_dir not in EDGE_DIRS:
        raise ValueError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
    frontier = _as_frontier(frontier)
    g = as_csr_graph(graph)
    adj = g if edge_dir == "out" else g.csc()
    device = _compute_device(adj.indptr)
    return _LayersCall(adj.indptr, adj.indices, _as_seeds(seeds, device), fanouts, bool(replace),
                       _as_probs(probs, adj.num_edges, device), adj.eids, _resolve_seed(seed), device, frontier)


def sample_layers(
    graph: GraphLike,
    seeds: torch.Tensor,
    fanouts: Sequence[int],
    *,
    edge_dir: str = "in",
    replace: bool = False,
    probs: Optional[torch.Tensor] = None,
    seed: Optional[int] = None,
    frontier: Frontier = Frontier.ALL,
) -> List[Block]:
    """Multi-layer neighbour sampling, DGL's NeighborSampler order.

    ``fanouts[i]`` is the fanout of layer ``i`` counted from the input side: the last fanout is
    applied to ``seeds`` first, and the returned list of :class:`~pytorch_zerocopy.block.Block`
    starts with the layer farthest from the seeds (``result[0].nodes`` are the input nodes,
    ``result[-1].nodes[:len(seeds)]`` the seeds). Block ``l``'s edges run from the sampled
    neighbour (``src``) to the seed that sampled it (``dst``), whatever ``edge_dir``, in
    (seed, draw) order; its ``eids`` are the graph's ids of those edges; its nodes are its
    destination nodes, then the new neighbours in order of first appearance.

    ``frontier`` (see the module doc): with ``Frontier.NEW`` a block's destination nodes are
    still every node reached before its layer, but only those first reached in the layer before
    have edges, and its new nodes are the neighbours reached for the first time in the whole
    sample: ``result[0].nodes`` is PyG's node list (the seeds, then each hop's new nodes) and
    every block's ``src``/``dst`` index into it.

    ``graph``: a :class:`CSRGraph` or an ``(indptr, indices)`` pair (see the module doc).
    ``seeds``: distinct node ids (int32/int64). ``probs``: one sampling weight per edge of
    ``graph``, indexed by edge id, finite and >= 0 (0: never sampled); place it like the graph
    (a CPU tensor is copied to the GPU on each call). ``seed=None`` draws one from torch's
    default generator; a given seed reproduces the sample.

    A graph of another structure that defines ``__zerocopy_sample_layers__`` (a
    :class:`~pytorch_zerocopy.graph.DynamicGraph`) samples itself, with the same arguments
    (``Frontier.ALL`` only).
    """
    own = getattr(type(graph), "__zerocopy_sample_layers__", None)
    if own is not None:
        if _as_frontier(frontier) is not Frontier.ALL:
            raise NotImplementedError(f"sample_layers: a {type(graph).__name__} samples with Frontier.ALL only")
        return own(graph, seeds, fanouts, edge_dir=edge_dir, replace=replace, probs=probs, seed=seed)
    call = _layers_call(graph, seeds, fanouts, edge_dir, replace, probs, seed, frontier)
    nodes, src, dst, eids = call.run(torch.ops.zerocopy.sample_layers.default)
    return call.blocks(nodes, src, dst, eids)


class PendingSample:
    """A :func:`sample_layers_async` call whose GPU work may still be running.

    Lifetime: the object keeps the graph's arrays, the seeds and the probabilities alive until
    :meth:`result` returns (the kernels read them until then). The blocks are produced on the
    CUDA stream that was current at the call: use them on that stream, or make another stream
    wait on :attr:`event`. :meth:`result` waits for this call's work only (the event), never for
    the whole device, and raises the errors the kernels found (bad seeds, offsets, ids or
    probabilities) as :func:`sample_layers` would.
    """

    def __init__(self, call: _LayersCall, buffers: Optional[tuple], status: Optional[torch.Tensor],
                 event: Optional[torch.cuda.Event], blocks: Optional[List[Block]] = None):
        self._call = call
        self._buffers = buffers
        self._status = status
        self.event = event
        self._taken = blocks is not None
        self._result: Any = blocks
        self._finish: Optional[Callable[[List[Block]], Any]] = None

    @classmethod
    def done(cls, blocks: List[Block]) -> "PendingSample":
        """A sample already taken: :meth:`result` returns ``blocks``."""
        return cls(None, None, None, None, blocks)

    def then(self, finish: Callable[[Any], Any]) -> "PendingSample":
        """Makes :meth:`result` return ``finish(blocks)`` (after any function given before),
        called once: when the blocks are ready, or now if they are. Returns this object."""
        if self._taken:
            self._result = finish(self._result)
        elif self._finish is None:
            self._finish = finish
        else:
            before = self._finish
            self._finish = lambda blocks: finish(before(blocks))
        return self

    def ready(self) -> bool:
        """Whether the GPU work has finished (never blocks)."""
        return self._taken or self.event is None or self.event.query()

    def result(self) -> Any:
        """The blocks, as :func:`sample_layers` returns them (or what the functions given to
        :meth:`then` make of them)."""
        if not self._taken:
            self.event.synchronize()
            c = self._call
            sizes = torch.ops.zerocopy.sample_layers_check.default(self._status, c.indptr, c.indices, c.seeds,
                                                                   c.probs, c.eids)
            nodes, src, dst, eids = self._buffers
            num_layers = len(c.fanouts)
            node_counts = sizes[1:num_layers + 1]
            edge_counts = sizes[num_layers + 1:]
            blocks = c.blocks([t[:n] for t, n in zip(nodes, node_counts)],
                              [t[:e] for t, e in zip(src, edge_counts)],
                              [t[:e] for t, e in zip(dst, edge_counts)],
                              [t[:e] for t, e in zip(eids, edge_counts)])
            self._result = blocks if self._finish is None else self._finish(blocks)
            self._taken = True
            self._call = self._buffers = self._status = self._finish = None
        return self._result


def sample_layers_async(
    graph: GraphLike,
    seeds: torch.Tensor,
    fanouts: Sequence[int],
    *,
    edge_dir: str = "in",
    replace: bool = False,
    probs: Optional[torch.Tensor] = None,
    seed: Optional[int] = None,
    frontier: Frontier = Frontier.ALL,
) -> PendingSample:
    """:func:`sample_layers` without waiting: on the GPU the work is queued on the current stream
    and the sizes are copied to pinned host memory behind it, with no host synchronisation
    (except one per fanout ``-1`` layer). On the CPU the sample is taken now. Same arguments and
    the same blocks, from :meth:`PendingSample.result`."""
    call = _layers_call(graph, seeds, fanouts, edge_dir, replace, probs, seed, frontier)
    if call.device.type != "cuda":
        nodes, src, dst, eids = call.run(torch.ops.zerocopy.sample_layers.default)
        return PendingSample(call, None, None, None, call.blocks(nodes, src, dst, eids))
    nodes, src, dst, eids, status = call.run(torch.ops.zerocopy.sample_layers_launch.default)
    host = torch.empty(status.shape, dtype=torch.int64, pin_memory=True)
    host.copy_(status, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(call.device))
    return PendingSample(call, (nodes, src, dst, eids), host, event)


def _layer_fakes(indptr: torch.Tensor, fanouts: Sequence[int]):
    ctx = torch.library.get_ctx()
    nodes, src, dst, eids = [], [], [], []
    for _ in fanouts:
        n, e = ctx.new_dynamic_size(), ctx.new_dynamic_size()
        nodes.append(indptr.new_empty((n,), dtype=torch.int64))
        src.append(indptr.new_empty((e,), dtype=torch.int64))
        dst.append(indptr.new_empty((e,), dtype=torch.int64))
        eids.append(indptr.new_empty((e,), dtype=torch.int64))
    return nodes, src, dst, eids


@register_fake("zerocopy::sample_layers")
def _sample_layers_fake(indptr, indices, seeds, fanouts, replace, probs, eids, seed, *, frontier=0):
    return _layer_fakes(indptr, fanouts)


@register_fake("zerocopy::sample_layers_launch")
def _sample_layers_launch_fake(indptr, indices, seeds, fanouts, replace, probs, eids, seed, *, frontier=0):
    nodes, src, dst, out_eids = _layer_fakes(indptr, fanouts)
    status = indptr.new_empty((2 * len(fanouts) + 1 + _NUM_SAMPLE_ERRORS,), dtype=torch.int64)
    return nodes, src, dst, out_eids, status

