"""Neighbour sampling with PyG's conventions, over this package's sampling op.

PyG's ``NeighborLoader`` returns one subgraph per minibatch, not one block per layer:

* nodes: the seeds first (in input order), then the nodes first reached in hop 1, then those
  first reached in hop 2, ...; ``num_sampled_nodes`` counts them per hop (seeds included);
* edges: hop 1's edges first, then hop 2's, ...; ``num_sampled_edges`` counts them per hop;
  hop ``h`` samples in-neighbours of the nodes first reached in hop ``h - 1`` only (each node's
  neighbourhood is sampled once), and every sampled edge is kept, also into a node already
  reached; ``edge_index = [row, col]`` runs from the sampled neighbour (``row``) to the node
  that sampled it (``col``), so messages flow towards the seeds;
* ``e_id``: the edge's id (its column in the ``edge_index`` the graph was built from).

:func:`sample_hops` produces that with one call of
:func:`pytorch_zerocopy.sampling.sample_layers` for all hops, under the frontier rule
:attr:`~pytorch_zerocopy.sampling.Frontier.NEW` (layer ``h`` samples the nodes first reached in
layer ``h - 1``; nodes are numbered once, in the order above), whose outermost node list and
per-layer local ids are the minibatch's: no compaction follows. It runs where the graph lives:
on the GPU for a unified (host-resident, GPU-mapped) or CUDA graph, reading the neighbour lists
in place; on the CPU for a CPU graph. Its outputs live there too. On the GPU the whole sample
waits for the GPU once (every hop's sizes and the error words, read together at the end), plus
once per hop of fanout ``-1`` (its size has no bound known in advance), all on the current
stream. :func:`sample_hops_async` queues the same sample without that wait (seeds on the CPU
are moved without one too) and waits in :meth:`~pytorch_zerocopy.sampling.PendingSample.result`
for this sample's work only: the loader starts minibatch ``i + 2``'s sample that way on a side
stream before it hands out minibatch ``i`` (:mod:`pytorch_zerocopy.pipeline.ahead`), and
:meth:`NeighborSampler.sample_from_nodes_async` is PyG's sampler call in that form.

Randomness: a minibatch's draws follow from one seed (hop ``h`` draws with a seed derived from
it and ``h``), by default drawn from torch's default CPU generator, so ``torch.manual_seed``
makes a run repeatable; the loader's process way draws the same seeds in the training process
and sends them with the seed batches. For a given seed the CPU and the GPU draw the same
sample. ``fanout = -1`` takes every neighbour and is deterministic.

Processes: :class:`HopStage` is this sampling as a stage of the loader's process way
(:mod:`pytorch_zerocopy.pipeline.loader`): on a GPU it queues the sample without waiting for it
(:func:`~pytorch_zerocopy.sampling.sample_layers_async`), and the hops travel packed as blocks
(:meth:`SampledHops.blocks`, :meth:`SampledHops.from_minibatch`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch_geometric.sampler import BaseSampler, NodeSamplerInput, SamplerOutput
from torch_geometric.sampler.base import NumNeighbors, SubgraphType

from ..block import Block
from ..graph import CSRGraph
from ..pipeline.loader import FedStage
from ..pipeline.messages import Minibatch, PackedParts
from ..placement import cat_to_device_async, op_device, to_device_async
from ..sampling import Frontier, PendingSample, sample_layers, sample_layers_async


@dataclass(frozen=True)
class SampledHops:
    """One minibatch's subgraph in PyG's layout (see the module docstring).

    ``node``: global ids (int64); ``row``/``col``: local edge endpoints (int64, indices into
    ``node``; from a sample, the two rows of one ``[2, E]`` buffer, which
    :func:`edge_index` returns without a copy); ``edge``: the edges' ids (int64);
    ``num_sampled_nodes``: ``len(fanouts) + 1`` counts (seeds first); ``num_sampled_edges``:
    ``len(fanouts)`` counts.
    """

    node: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    edge: torch.Tensor
    num_sampled_nodes: List[int]
    num_sampled_edges: List[int]

    def blocks(self) -> List[Block]:
        """The hops as blocks, the seeds' hop first: hop ``h``'s block has every node as a
        source (``src`` = its ``row``, indices into :attr:`node`) and the nodes reached before
        hop ``h`` as destinations (``dst`` = its ``col``), its edges' ids as ``eids``; the
        first block's ``nodes`` are :attr:`node`. What a :class:`Minibatch` packs."""
        total, reached = int(self.node.numel()), 0
        out = []
        pieces = zip(torch.split(self.row, self.num_sampled_edges), torch.split(self.col, self.num_sampled_edges),
                     torch.split(self.edge, self.num_sampled_edges), self.num_sampled_nodes)
        for h, (row, col, edge, new) in enumerate(pieces):
            reached += new
            out.append(Block(row, col, total, reached, nodes=self.node if h == 0 else None, eids=edge))
        return out

    @classmethod
    def from_layers(cls, blocks: Sequence[Block]) -> "SampledHops":
        """The hops of a :func:`~pytorch_zerocopy.sampling.sample_layers` sample taken with
        ``Frontier.NEW`` (its blocks, the layer farthest from the seeds first): the outermost
        block's nodes (the same tensor) and every block's edges, concatenated, the seeds' hop
        first. No host synchronisation: the counts are the blocks' sizes."""
        hops = list(blocks)[::-1]
        counts = [hops[0].num_dst] + [b.num_src - b.num_dst for b in hops]
        edges = [b.num_edges() for b in hops]
        first = hops[0].src
        pairs = torch.empty((2, sum(edges)), dtype=first.dtype, device=first.device)
        torch.cat([b.src for b in hops], out=pairs[0])
        torch.cat([b.dst for b in hops], out=pairs[1])
        return cls(blocks[0].nodes, pairs[0], pairs[1], torch.cat([b.eids for b in hops]), counts, edges)

    @classmethod
    def from_minibatch(cls, mb: Minibatch, parts: PackedParts) -> "SampledHops":
        """The hops a :class:`Minibatch` packed from :meth:`blocks`, views of its ``parts``
        (:meth:`~pytorch_zerocopy.pipeline.messages.Minibatch.parts`)."""
        shapes = mb.layout.shapes
        reached = [num_dst for _, num_dst in shapes]
        counts = [reached[0]] + [b - a for a, b in zip(reached, reached[1:])] + [shapes[0][0] - reached[-1]]
        row, col = parts.edges.unbind(0)
        return cls(parts.nodes, row, col, parts.eids, counts, list(mb.layout.num_edges))


def edge_index(row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """``torch.stack([row, col])``; a view of their buffer, no copy, where ``col`` directly
    follows ``row`` in one (a sample's :class:`SampledHops`): the result then aliases both."""
    e = row.numel()
    base = row._base  # views of one tensor: one storage (checked without making storage objects)
    if (base is not None and col._base is base and row.dim() == col.dim() == 1 and col.numel() == e
            and row.dtype == col.dtype and row.stride(0) == col.stride(0) == 1
            and col.storage_offset() == row.storage_offset() + e):
        return row.as_strided((2, e), (e, 1))
    return torch.stack([row, col], dim=0)


def _check_fanouts(fanouts: Sequence[int]) -> List[int]:
    if not isinstance(fanouts, (list, tuple)):
        raise TypeError(f"num_neighbors must be a list of fanouts, one per hop (e.g. [10, 10]), got {fanouts!r}")
    values = list(fanouts)
    if not values:
        raise ValueError("num_neighbors must hold one fanout per hop, got an empty list")
    for f in values:
        if isinstance(f, bool) or not isinstance(f, int) or f < -1:
            raise ValueError(f"num_neighbors must be ints >= 0 or -1 (every neighbour), got {values}")
    return values


def sample_hops(csc: CSRGraph, seeds: torch.Tensor, fanouts: Sequence[int], *,
                replace: bool = False, seed: Optional[int] = None) -> SampledHops:
    """Samples ``fanouts[h]`` in-neighbours per node in hop ``h`` (PyG's order: the first
    fanout applies to the seeds) from ``csc``, a ``CSRGraph`` whose row ``v`` lists the sources
    of ``v``'s in-edges and whose ``eids`` give the edges' ids. ``seeds`` must be distinct.
    ``seed``: the minibatch's random seed (None: drawn from torch's default generator). One
    call of the sampling op (see the module docstring).
    """
    fanouts = _check_fanouts(fanouts)
    blocks = sample_layers(csc, seeds.reshape(-1), fanouts[::-1], edge_dir="out", replace=replace, seed=seed,
                           frontier=Frontier.NEW)
    return SampledHops.from_layers(blocks)


def sample_hops_async(csc: CSRGraph, seeds: torch.Tensor, fanouts: Sequence[int], *,
                      replace: bool = False, seed: Optional[int] = None) -> PendingSample:
    """:func:`sample_hops` without waiting: the same sample for the same ``seed``, from
    :meth:`~pytorch_zerocopy.sampling.PendingSample.result` (a :class:`SampledHops`). On the GPU
    it is queued on the current stream with no host synchronisation (but one per hop of fanout
    ``-1``), CPU ``seeds`` moved there through pinned memory without one; use the result on that
    stream (or wait for the pending sample's ``event``). On the CPU the sample is taken now.
    ``seed=None`` draws the seed now, from torch's default generator."""
    fanouts = _check_fanouts(fanouts)
    seeds = to_device_async(seeds.reshape(-1), op_device(csc.indptr))
    pending = sample_layers_async(csc, seeds, fanouts[::-1], edge_dir="out", replace=replace, seed=seed,
                                  frontier=Frontier.NEW)
    return pending.then(SampledHops.from_layers)


def _fanout_list(num_neighbors) -> List[int]:
    values = num_neighbors.values if isinstance(num_neighbors, NumNeighbors) else num_neighbors
    if isinstance(values, dict):
        raise NotImplementedError("num_neighbors per edge type is for heterogeneous graphs, which are not supported")
    return _check_fanouts(values)


class NeighborSampler(BaseSampler):
    """PyG's ``BaseSampler`` over this package's sampling op (see the module docstring).

    ``data``: a ``(FeatureStore, GraphStore)`` pair whose graph store is this package's
    :class:`~pytorch_zerocopy.pyg.GraphStore` (:func:`~pytorch_zerocopy.pyg.stores_from_data`
    makes one from a PyG ``Data``). ``subgraph_type``: ``"directional"`` (PyG's default: the
    sampled edges only) or ``"bidirectional"`` (each sampled edge also reversed, PyG's
    conversion). Sampling runs where the graph store's lists live (see :func:`sample_hops`).
    """

    def __init__(self, data, num_neighbors, replace: bool = False, subgraph_type="directional"):
        from .graph_store import GraphStore

        if not (isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[1], GraphStore)):
            raise TypeError("NeighborSampler needs a (FeatureStore, pytorch_zerocopy.pyg.GraphStore) pair; "
                            "build one from a PyG Data with pytorch_zerocopy.pyg.stores_from_data")
        self.graph_store: GraphStore = data[1]
        self.fanouts = _fanout_list(num_neighbors)
        self.replace = bool(replace)
        self.subgraph_type = SubgraphType(subgraph_type)
        if self.subgraph_type == SubgraphType.induced:
            raise NotImplementedError("subgraph_type='induced' is not supported by this sampler; "
                                      "use 'directional' or 'bidirectional'")

    @property
    def num_neighbors(self) -> NumNeighbors:
        return NumNeighbors(self.fanouts)

    @property
    def device(self) -> torch.device:
        """Where sampling runs and minibatches are built."""
        indptr = self.graph_store.csc_graph.indptr
        return indptr.device

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs) -> SamplerOutput:
        return self.sample_from_nodes_async(index).result()

    def sample_from_nodes_async(self, index: NodeSamplerInput) -> PendingSample:
        """:meth:`sample_from_nodes` without waiting (:func:`sample_hops_async`): its
        :meth:`~pytorch_zerocopy.sampling.PendingSample.result` is the ``SamplerOutput``, with
        the tensors on the stream current at this call and at ``result()`` (the loader calls
        both on the minibatch's side stream). The sampling seed is drawn now."""
        if index.input_type is not None:
            raise NotImplementedError("heterogeneous sampling (an input node type) is not supported")
        if index.time is not None:
            raise NotImplementedError("temporal sampling (input_time / time_attr) is not supported")
        return self.sample_seeds_async(index.node, index.input_id)

    def sample_seeds_async(self, node: torch.Tensor, input_id: Optional[torch.Tensor]) -> PendingSample:
        """:meth:`sample_from_nodes_async` of the seeds ``node`` (``input_id``: their positions
        among the loader's input nodes, or None): CPU tensors reach a GPU in one staged copy,
        tensors already where sampling runs are used in place. The sampling seed is drawn now."""
        device = op_device(self.graph_store.csc_graph.indptr)
        if device.type == "cuda" and input_id is not None and node.device.type == input_id.device.type == "cpu":
            both = cat_to_device_async([node, input_id], device, torch.int64)  # one staged copy for both
            node, input_id = both[:node.numel()], both[node.numel():]
        pending = sample_hops_async(self.graph_store.csc_graph, node, self.fanouts, replace=self.replace)
        return pending.then(lambda hops: self.output(hops, input_id))

    def output(self, hops: SampledHops, input_id: Optional[torch.Tensor]) -> SamplerOutput:
        """``hops`` as PyG's sampler output (made bidirectional when the sampler is), with
        ``input_id`` moved to where the hops are (without the host waiting for the GPU)."""
        if input_id is not None:
            input_id = to_device_async(input_id, hops.node.device)
        out = SamplerOutput(node=hops.node, row=hops.row, col=hops.col, edge=hops.edge,
                            num_sampled_nodes=hops.num_sampled_nodes,
                            num_sampled_edges=hops.num_sampled_edges,
                            metadata=(input_id, None))
        if self.subgraph_type == SubgraphType.bidirectional:
            out = out.to_bidirectional()
        return out

    def stage(self, carried: Optional["CarriedTables"] = None) -> "HopStage":
        """This sampler as a stage of the loader's process way (``carried``: the node tables
        its role reads and packs, see :class:`HopStage`)."""
        return HopStage(self.fanouts, self.replace, carried)

    def sample_from_edges(self, index, neg_sampling=None):
        raise NotImplementedError("link-level sampling (LinkNeighborLoader) is not supported by this sampler")


CARRIED_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
"""The dtypes of the node tables a sampling role can pack into a minibatch's int64 labels part
(as their bytes: every value kept)."""


class CarriedTables:
    """Node tables (labels, masks) that the process way's sampling role reads at each
    minibatch's nodes and packs into its labels part, so that the training process takes them
    out of the minibatch's one copy instead of reading each table itself.

    ``tables``: ``(name, host tensor)`` pairs, one row per node, a dtype of
    :data:`CARRIED_DTYPES`, in shared memory (the role maps them). The role reads them through
    one :class:`~pytorch_zerocopy.FeatureTable` per dtype (the tables of the dtype side by
    side, one row per node), made when it first reads: a copy in its GPU's memory (the loader
    carries only tables that fit there,
    :func:`~pytorch_zerocopy.feature_table.default_side_readings`), or on the CPU. So a
    minibatch costs one read per dtype, and its packed values are, per dtype in
    :data:`CARRIED_DTYPES` order, the bytes of each table's values node after node (a table of
    ``[nodes, k]`` rows: its ``k`` columns one after the other), transposed where they are
    read, then zeros up to a whole int64 (:meth:`words`): :meth:`unpack` takes each table as
    views of them, with no conversion. The role reads the tables as they are when it first reads
    them: the loader refuses minibatches once one was written in place.
    """

    def __init__(self, tables: Sequence[Tuple[str, torch.Tensor]]):
        ordered = sorted(tables, key=lambda t: CARRIED_DTYPES.index(t[1].dtype))  # stable: names keep their order
        for name, host in ordered:
            if host.device.type != "cpu" or not host.is_shared() or host.dim() < 1:
                raise ValueError(f"CarriedTables: table {name!r} must be a CPU tensor in shared memory, "
                                 "one row per node")
        self.names = tuple(name for name, _ in ordered)
        self.hosts = tuple(host for _, host in ordered)
        self.row_shapes = tuple(tuple(host.shape[1:]) for host in self.hosts)
        self.widths = tuple(math.prod(shape) for shape in self.row_shapes)
        self.width = sum(self.widths)  # values packed per node
        self._groups: List[_DtypeRun] = []  # the tables of one dtype: tables [first, end), values per node
        for i, host in enumerate(self.hosts):
            if self._groups and self._groups[-1].dtype == host.dtype:
                last = self._groups[-1]
                self._groups[-1] = _DtypeRun(host.dtype, last.first, i + 1, last.width + self.widths[i])
            else:
                self._groups.append(_DtypeRun(host.dtype, i, i + 1, self.widths[i]))
        self._readers: Optional[list] = None  # per dtype, where read (never pickled)

    def __getstate__(self):
        return {**self.__dict__, "_readers": None}

    def words(self, n: int) -> int:
        """The int64 values packed for a minibatch of ``n`` nodes."""
        return sum(self.run_words(n))

    def run_words(self, n: int) -> List[int]:
        """The int64 values packed per dtype (in :data:`CARRIED_DTYPES` order) for ``n`` nodes:
        the pieces :meth:`unpack` takes."""
        return [run.words(n) for run in self._groups]

    def read(self, nodes: torch.Tensor) -> torch.Tensor:
        """Every table's rows at ``nodes`` (valid node ids), packed (see the class docstring),
        where ``nodes`` are (on the current stream)."""
        if self._readers is None:
            self._readers = [self._reader(run.first, run.end, nodes.device) for run in self._groups]
        n = nodes.numel()
        out = torch.empty(self.words(n), dtype=torch.int64, device=nodes.device)
        at = 0
        for run, reader in zip(self._groups, self._readers):
            words = run.words(n)
            values = reader.read(nodes, check_bounds=False).t().reshape(-1)  # column after column
            if run.dtype == torch.int64:
                out[at: at + words].copy_(values)
            else:
                room = out[at: at + words].view(torch.uint8)
                size = values.numel() * values.element_size()
                room[:size].copy_(values.view(torch.uint8))
                if size < room.numel():
                    room[size:].zero_()
            at += words
        return out

    def _reader(self, first: int, end: int, device: torch.device):
        from ..feature_table import FeatureTable

        rows = [host.reshape(host.shape[0], -1) for host in self.hosts[first:end]]
        side_by_side = rows[0] if len(rows) == 1 else torch.cat(rows, dim=1)
        return FeatureTable(side_by_side, "cuda" if device.type == "cuda" else "cpu", device=device)

    def unpack(self, pieces: Sequence[torch.Tensor], n: int) -> Dict[str, torch.Tensor]:
        """The tables' rows of a minibatch of ``n`` nodes from its packed values, in the pieces
        of :meth:`run_words` (one per dtype), by name, contiguous: views of the pieces for
        tables of one value per node (a table of several values per node: a copy)."""
        if len(pieces) != len(self._groups):
            raise ValueError(f"CarriedTables.unpack: {len(self._groups)} pieces (one per dtype) needed, "
                             f"got {len(pieces)}")
        out: Dict[str, torch.Tensor] = {}
        for run, part in zip(self._groups, pieces):
            widths = self.widths[run.first:run.end]
            if run.dtype is torch.int64:
                tables = (part,) if len(widths) == 1 else part.split_with_sizes([n * w for w in widths])
            else:  # the run's values, then the padding to a whole int64
                values = part.view(run.dtype)
                cuts = [n * w for w in widths]
                tables = values.split_with_sizes(cuts + [values.numel() - n * run.width])
            for k, table in zip(range(run.first, run.end), tables):
                w, shape = self.widths[k], self.row_shapes[k]
                if w != 1 or shape:
                    table = table.view(w, n).t().contiguous().view((n,) + shape)
                out[self.names[k]] = table
        return out


@dataclass(frozen=True)
class _DtypeRun:
    """The carried tables of one dtype: tables ``[first, end)``, ``width`` values per node."""

    dtype: torch.dtype
    first: int
    end: int
    width: int

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def words(self, n: int) -> int:
        """The int64 values its bytes take for ``n`` nodes (rounded up)."""
        return -(-n * self.width * self.itemsize // 8)


class HopStage(FedStage):
    """:func:`sample_hops` as the sample stage of the loader's process way: a seed batch's hops,
    drawn with the seed the training process sent, packed as :meth:`SampledHops.blocks` (the
    sample :func:`sample_hops` takes for that seed). On a GPU the sample is queued on the current
    stream and :meth:`~pytorch_zerocopy.sampling.PendingSample.result` waits for it, once. The
    labels part: the carried input ids, then ``carried``'s tables at the minibatch's nodes."""

    eids = True

    def __init__(self, fanouts: Sequence[int], replace: bool, carried: Optional[CarriedTables] = None):
        self.fanouts, self.replace = _check_fanouts(list(fanouts)), bool(replace)
        self.carried = carried

    def finish_labels(self, labels: torch.Tensor, blocks: Sequence[Block]) -> torch.Tensor:
        if self.carried is None:
            return labels
        return torch.cat([labels, self.carried.read(blocks[0].nodes)])

    def start(self, graph: CSRGraph, seeds: torch.Tensor, plan, batch) -> PendingSample:
        pending = sample_hops_async(graph, seeds, self.fanouts, replace=self.replace, seed=batch.sample_seed)
        return pending.then(SampledHops.blocks)
