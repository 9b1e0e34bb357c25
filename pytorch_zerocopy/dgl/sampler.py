"""``NeighborSampler``: DGL's multi-layer neighbour sampler, backed by this package's kernels.

Where sampling runs follows DGL: on the GPU when the graph is on a GPU, on the GPU reading
the graph from host memory ("UVA": the graph's CPU structure mapped in place as unified
tensors) when the seeds are on a GPU and the graph is not, else on the CPU (multithreaded).
The loader can ask for UVA explicitly.

Graphs: a ``dgl.DGLGraph`` (with DGL installed), or the package's
:class:`~pytorch_zerocopy.graph.CSRGraph` with DGL's node and edge data in its ``ndata`` /
``edata`` (build one as ``dgl.graph`` would with :func:`pytorch_zerocopy.dgl.graph`). The
neighbour lists of the sampled direction (the CSC for ``edge_dir='in'``) are prepared once per
graph and placement, sampling weights in their order.

Output per batch, as DGL's: ``(input_nodes, output_nodes, blocks)`` with ``blocks[0]`` the input
layer. With DGL installed and a ``dgl.DGLGraph`` given, blocks are real DGL blocks
(``dgl.create_block``) carrying ``dgl.NID``/``dgl.EID``; otherwise :class:`Block`. Prefetched
node features land in ``blocks[0].srcdata``, labels in ``blocks[-1].dstdata``, edge features in
every block's ``edata``. Features of a graph on the CPU are read in place from unified tensors
(mapped once, on first use), so they reach the GPU without an intermediate copy; node features
with a :class:`NodeCache` (the loader's ``gpu_cache``) are read through its GPU cache.

Stages: :meth:`NeighborSampler.sample_with` samples (one op call, edge ids mapped to the
graph's), then :meth:`NeighborSampler.deliver` builds the blocks and reads the prefetched data.
The loader's process way (:mod:`pytorch_zerocopy.pipeline.loader`) runs the first in its
processes (:class:`BlockStage`) and the second in the training process, with the first
prefetched node feature gathered by its producer.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from .. import sampling as _sampling
from .. import unified as _unified
from ..block import EID, Block
from ..feature_table import CacheConfig, CachedTable, FeatureReader, FeatureTable, cached_rows_for
from ..graph import CSRGraph
from ..pipeline.loader import FedStage
from ..pipeline.trace import UNTIMED, Stage, StageTimes, stage_timer
from ..placement import Placement, op_device, to_device_async
from ._backend import is_dgl_graph, real_dgl


def _names(x: Optional[Union[str, Sequence[str]]], what: str) -> List[str]:
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        raise NotImplementedError(f"{what}: per-type dicts are for heterogeneous graphs, which are not supported")
    return list(x)


def _compute_device(placement: Placement, graph_device: torch.device) -> torch.device:
    if placement is Placement.GPU:
        return graph_device
    if placement is Placement.MAPPED and _unified.gpu_backed():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _GraphState:
    """What a sampler keeps per graph and placement: the neighbour lists of the sampled
    direction (placed; edge ids are positions in them), the graph's id of each position, the
    sampling weights in position order, and a reader per node or edge data table it has read
    (with the table it was made for)."""

    def __init__(self, lists: CSRGraph, edge_ids: Optional[torch.Tensor], probs: Optional[torch.Tensor]):
        self.lists = lists
        self.edge_ids = edge_ids
        self.probs = probs
        self.readers: Dict[Tuple[str, str], Tuple[torch.Tensor, FeatureReader]] = {}


class NodeCache:
    """A node feature table read through a :class:`~pytorch_zerocopy.CachedTable`: the rows
    ``config`` picks from the neighbour lists a sampler reads (``CachePolicy.DEGREE``: the
    nodes in the most lists; ``CachePolicy.PRESAMPLE``: the nodes most read by minibatches
    pre-sampled from ``seeds``) held on ``device`` (a GPU, or the CPU without one), the rest
    read from host memory in the same call: the table mapped in place, or a copy in
    ``placement`` (``MANAGED``, ``GPU``) when given.

    Lifetime: the cache is a snapshot of ``table``; in-place writes to it make the next read
    raise (see :mod:`pytorch_zerocopy.feature_table`), and a graph whose feature is replaced by
    another tensor must get a new loader."""

    def __init__(self, name: str, table: torch.Tensor, lists: CSRGraph, config: CacheConfig, device: torch.device,
                 placement: Optional[Placement] = None, seeds: Optional[torch.Tensor] = None):
        if not isinstance(table, torch.Tensor) or table.dim() == 0 or table.shape[0] != lists.num_nodes:
            raise ValueError(f"gpu_cache: node feature {name!r} must hold one row per node ({lists.num_nodes}), "
                             f"got {getattr(table, 'shape', type(table).__name__)}")
        if not table.is_contiguous():
            raise ValueError(f"gpu_cache: node feature {name!r} must be contiguous to be cached in place")
        rows = table.view(table.shape[0], -1)
        ids = cached_rows_for((lists.indptr, lists.indices), config, rows.shape[0],
                              rows.shape[1] * rows.element_size(), seeds=seeds)
        self.name, self.table = name, table
        if placement is None:
            placement = Placement.MAPPED if device.type == "cuda" or _unified.is_unified(rows) else Placement.CPU
        elif placement is not Placement.MAPPED and _unified.is_unified(rows):
            rows = rows.cpu()  # copied into `placement` from the host bytes
        self.features = CachedTable(FeatureTable(rows, placement, device=device if device.type == "cuda" else None), ids)

    def gather(self, table: torch.Tensor, index: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Rows ``index`` (valid node ids) of ``table``, which must still be the cached one."""
        if table is not self.table:
            raise RuntimeError(f"gpu_cache: node feature {self.name!r} was replaced after the DataLoader cached its "
                               "rows; create a new DataLoader for the new tensor")
        rows = self.features.read(index, check_bounds=False)
        return rows.view((index.numel(),) + tuple(table.shape[1:])).to(device)


class NeighborSampler:
    """DGL's ``dgl.dataloading.NeighborSampler`` (same arguments and semantics).

    ``fanouts[i]`` is the number of neighbours each node of layer ``i`` samples (``-1``: all).
    ``prob``/``mask`` name an edge feature (``graph.edata[prob]``) holding non-negative
    sampling weights; a weight of 0 excludes an edge. ``fused`` is accepted and ignored
    (sampling is always one fused kernel per layer). Heterogeneous graphs and ``exclude_eids``
    are not supported and raise ``NotImplementedError``.
    """

    def __init__(
        self,
        fanouts: Sequence[int],
        edge_dir: str = "in",
        prob: Optional[str] = None,
        mask: Optional[str] = None,
        replace: bool = False,
        prefetch_node_feats: Optional[Sequence[str]] = None,
        prefetch_labels: Optional[Sequence[str]] = None,
        prefetch_edge_feats: Optional[Sequence[str]] = None,
        output_device: Optional[Union[str, torch.device]] = None,
        fused: bool = True,
    ):
        if isinstance(fanouts, int):
            raise TypeError("fanouts must be a list with one fanout per layer, e.g. [10, 10]")
        fanouts = list(fanouts)
        if not fanouts:
            raise ValueError("fanouts must hold at least one fanout (one per layer)")
        for f in fanouts:
            if isinstance(f, dict):
                raise NotImplementedError("per-edge-type fanouts are for heterogeneous graphs, which are not supported")
            if isinstance(f, bool) or not isinstance(f, int) or f < -1:
                raise ValueError(f"fanouts must be ints >= 0 or -1 (all neighbours), got {fanouts}")
        if edge_dir not in ("in", "out"):
            raise ValueError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
        if mask is not None and prob is not None:
            raise ValueError("prob and mask are mutually exclusive; multiply the probability by the mask instead")
        self.fanouts = fanouts
        self.edge_dir = edge_dir
        self.prob = prob if prob is not None else mask
        self.replace = bool(replace)
        self.prefetch_node_feats = _names(prefetch_node_feats, "prefetch_node_feats")
        self.prefetch_labels = _names(prefetch_labels, "prefetch_labels")
        self.prefetch_edge_feats = _names(prefetch_edge_feats, "prefetch_edge_feats")
        self.output_device = None if output_device is None else torch.device(output_device)
        self.fused = fused
        self._graph: Any = None
        self._states: Dict[Placement, _GraphState] = {}

    # -- graph structure ------------------------------------------------------------------

    def _state(self, g: Any, placement: Placement) -> _GraphState:
        if self._graph is not g:
            self._graph, self._states = g, {}
        state = self._states.get(placement)
        if state is None:
            state = self._prepare(g, placement)
            self._states[placement] = state
        return state

    def _prepare(self, g: Any, placement: Placement) -> _GraphState:
        """The neighbour lists of ``self.edge_dir``, their edge ids and weights, in ``placement``."""
        if is_dgl_graph(g):
            if g.is_block or len(g.ntypes) != 1 or len(g.etypes) != 1:
                raise NotImplementedError("NeighborSampler supports homogeneous graphs only")
            indptr, indices, eids = g.adj_tensors("csc" if self.edge_dir == "in" else "csr")
            indptr, indices = indptr.cpu().long(), indices.cpu()
            eids = eids.cpu().long() if eids is not None and eids.numel() else None
        elif isinstance(g, CSRGraph):
            lists = g.csc() if self.edge_dir == "in" else g
            indptr, indices, eids = lists.indptr.cpu(), lists.indices.cpu(), lists.eids
            eids = None if eids is None else eids.cpu()
        else:
            raise TypeError("the graph must be a pytorch_zerocopy CSRGraph (pytorch_zerocopy.dgl.graph((src, dst)) "
                            f"builds one) or a dgl.DGLGraph, got {type(g).__name__}")
        probs = None
        if self.prob is not None:
            if self.prob not in g.edata:
                raise KeyError(f"prob/mask: the graph has no edge feature {self.prob!r}")
            weights = g.edata[self.prob]
            if weights.dim() != 1 or weights.numel() != indices.numel():
                raise ValueError(f"edge feature {self.prob!r} must hold one weight per edge "
                                 f"({indices.numel()}), got shape {tuple(weights.shape)}")
            weights = weights.detach().cpu().float()
            if bool((weights < 0).any()):
                raise ValueError(f"edge feature {self.prob!r} holds negative sampling weights")
            probs = weights if eids is None else weights[eids]
        graph_device = _graph_device(g)
        device = graph_device if placement is Placement.GPU else None
        # Own copies for the unified placement: mapping works in place, and the graph's own
        # storage is left as it is.
        own = placement is Placement.MAPPED
        lists = CSRGraph(indptr, indices.clone() if own else indices, validate=False).to(placement, device)
        compute = _compute_device(placement, graph_device)
        return _GraphState(lists, _place(eids, placement, compute, own), _place(probs, placement, compute, own))

    # -- sampling -------------------------------------------------------------------------

    def sample(self, g: Any, seed_nodes: torch.Tensor, exclude_eids: Any = None):
        """``(input_nodes, output_nodes, blocks)`` for ``seed_nodes``, as DGL's ``sample``."""
        if isinstance(seed_nodes, dict):
            raise NotImplementedError("seed node dicts are for heterogeneous graphs, which are not supported")
        seed_nodes = torch.as_tensor(seed_nodes)
        graph_device = _graph_device(g)
        if graph_device.type == "cuda":
            placement = Placement.GPU
        elif seed_nodes.is_cuda:
            placement = Placement.MAPPED
        else:
            placement = Placement.CPU
        out = self.output_device or seed_nodes.device
        return self.sample_with(g, seed_nodes, placement, out, exclude_eids)

    def sample_with(self, g: Any, seed_nodes: torch.Tensor, placement: Placement,
                    device: torch.device, exclude_eids: Any = None, seed: Optional[int] = None,
                    node_caches: Optional[Dict[str, NodeCache]] = None, times: Optional[StageTimes] = None):
        """Samples with the graph structure in ``placement`` and returns blocks on ``device``;
        prefetched node features named in ``node_caches`` are read through their caches;
        ``times`` records the stages."""
        if exclude_eids is not None:
            raise NotImplementedError("exclude_eids is not supported by this NeighborSampler")
        state = self._state(g, placement)
        times = stage_timer(times)
        with times.timed(Stage.SAMPLE):
            layers = _layers(state.lists, seed_nodes, self.fanouts, self.replace, state.probs, state.edge_ids, seed)
        return self.deliver(g, layers, seed_nodes, placement, device, node_caches, times=times)

    def deliver(self, g: Any, layers: List[Block], seed_nodes: torch.Tensor, placement: Placement,
                device: torch.device, node_caches: Optional[Dict[str, NodeCache]] = None,
                gathered: Optional[Dict[str, torch.Tensor]] = None, times: Optional[StageTimes] = None):
        """``(input_nodes, output_nodes, blocks)`` on ``device`` from sampled ``layers`` (each
        with its nodes and the graph's edge ids) of ``seed_nodes``, the prefetched data read
        (``gathered``: node features already read at the input nodes, by name; all of it then
        counts as build time in ``times``)."""
        times = stage_timer(times)
        if gathered:
            with times.timed(Stage.BUILD):
                return self._deliver(g, layers, seed_nodes, placement, device, node_caches or {}, gathered, UNTIMED)
        return self._deliver(g, layers, seed_nodes, placement, device, node_caches or {}, {}, times)

    def _deliver(self, g, layers, seed_nodes, placement, device, node_caches, gathered, times: StageTimes):
        with times.timed(Stage.BUILD):
            output_nodes = to_device_async(seed_nodes, device)
            input_nodes = layers[0].nodes.to(device)
            blocks = [self._block(g, lay, device) for lay in layers]
        with times.timed(Stage.GATHER):
            self._prefetch(g, self._state(g, placement), blocks, input_nodes, output_nodes, device, node_caches,
                           gathered)
        return input_nodes, output_nodes, blocks

    def stage(self, g: Any) -> "BlockStage":
        """This sampler over ``g`` as a stage of the loader's process way."""
        state = self._state(g, Placement.CPU)
        return BlockStage(self.fanouts, self.replace, state.probs, state.edge_ids)

    def sample_blocks(self, g: Any, seed_nodes: torch.Tensor, exclude_eids: Any = None):
        return self.sample(g, seed_nodes, exclude_eids)

    def _block(self, g: Any, lay: Block, device: torch.device):
        src, dst = lay.src.to(device), lay.dst.to(device)
        nodes, eids = lay.nodes.to(device), lay.eids.to(device)
        if is_dgl_graph(g):
            dgl = real_dgl()
            block = dgl.create_block((src, dst), num_src_nodes=lay.num_src,
                                     num_dst_nodes=lay.num_dst, idtype=g.idtype, device=device)
            block.srcdata[dgl.NID] = nodes
            block.dstdata[dgl.NID] = nodes[: lay.num_dst]
            block.edata[dgl.EID] = eids
            return block
        return Block(src, dst, lay.num_src, lay.num_dst, nodes=nodes, eids=eids)

    def lists(self, g: Any, placement: Placement) -> CSRGraph:
        """The neighbour lists this sampler reads from ``g`` in ``placement`` (prepared once)."""
        return self._state(g, placement).lists

    def _prefetch(self, g, state, blocks, input_nodes, output_nodes, device, node_caches, gathered) -> None:
        ndata = g.ndata if hasattr(g, "ndata") else {}
        edata = g.edata if hasattr(g, "edata") else {}
        for name in self.prefetch_node_feats:
            table = _lookup(ndata, name, "node")
            if name in gathered:
                rows = gathered[name]
                blocks[0].srcdata[name] = rows.view((rows.shape[0],) + tuple(table.shape[1:])).to(device)
            elif name in node_caches:
                blocks[0].srcdata[name] = node_caches[name].gather(table, input_nodes, device)
            else:
                blocks[0].srcdata[name] = _gather(state, "n", name, table, input_nodes, device)
        for name in self.prefetch_labels:
            blocks[-1].dstdata[name] = _gather(state, "n", name, _lookup(ndata, name, "node"), output_nodes, device)
        for name in self.prefetch_edge_feats:
            table = _lookup(edata, name, "edge")
            for block in blocks:
                eids = block.edata[EID] if not is_dgl_graph(g) else block.edata[real_dgl().EID]
                block.edata[name] = _gather(state, "e", name, table, eids, device)


class MultiLayerFullNeighborSampler(NeighborSampler):
    """Every neighbour in each of ``num_layers`` layers (DGL's class of the same name)."""

    def __init__(self, num_layers: int, **kwargs):
        super().__init__([-1] * int(num_layers), **kwargs)


def _layers(lists: CSRGraph, seeds: torch.Tensor, fanouts: Sequence[int], replace: bool,
            probs: Optional[torch.Tensor], edge_ids: Optional[torch.Tensor], seed: Optional[int]) -> List[Block]:
    """The sampled layers (input side first), their ``eids`` the graph's edge ids: ``lists``
    are the sampled direction's, their rows sampled as stored; ``edge_ids`` the graph's id of
    each position (None: the position is the id)."""
    layers = _sampling.sample_layers(lists, seeds, fanouts, edge_dir="out", replace=replace, probs=probs, seed=seed)
    if edge_ids is None:
        return layers
    return [Block(lay.src, lay.dst, lay.num_src, lay.num_dst, nodes=lay.nodes,
                  eids=edge_ids[lay.eids.to(op_device(edge_ids))]) for lay in layers]


class BlockStage(FedStage):
    """The sampler's sampling as the sample stage of the loader's process way: blocks with the
    graph's edge ids, drawn with the seed the training process sent. ``probs`` and
    ``edge_ids`` are in the order of the lists' positions (host tensors, mapped in place for a
    GPU that samples)."""

    eids = True

    def __init__(self, fanouts: Sequence[int], replace: bool, probs: Optional[torch.Tensor],
                 edge_ids: Optional[torch.Tensor]):
        self.fanouts, self.replace, self.probs, self.edge_ids = list(fanouts), bool(replace), probs, edge_ids
        self.placed: Optional[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]] = None  # in the sampling process

    def start(self, graph: CSRGraph, seeds: torch.Tensor, plan, batch) -> _sampling.PendingSample:
        if self.placed is None:
            placement = Placement.MAPPED if graph.indptr.is_cuda else Placement.CPU
            self.placed = tuple(_place(t, placement, torch.device("cpu"), own=False) for t in (self.probs, self.edge_ids))
        probs, edge_ids = self.placed
        return _sampling.PendingSample.done(_layers(graph, seeds, self.fanouts, self.replace, probs, edge_ids,
                                                    batch.sample_seed))


def _lookup(data, name: str, kind: str) -> torch.Tensor:
    try:
        return data[name]
    except KeyError:
        raise KeyError(f"prefetch: the graph has no {kind} feature {name!r}") from None


def _graph_device(g: Any) -> torch.device:
    dev = getattr(g, "device", None)
    if dev is None:
        dev = getattr(g, "indptr", torch.empty(0)).device
    dev = torch.device(dev)
    return torch.device("cpu") if dev.type == _unified.DEVICE_TYPE else dev


def _place(t: Optional[torch.Tensor], placement: Placement, compute: torch.device,
           own: bool) -> Optional[torch.Tensor]:
    """A per-position array where sampling reads it: mapped in place (unified), else on
    ``compute``."""
    if t is None:
        return None
    if placement is Placement.MAPPED:
        return _unified.to_unified((t.clone() if own else t).contiguous())
    return t.to(compute)


def _reader(state: _GraphState, kind: str, name: str, table: torch.Tensor, device: torch.device) -> FeatureReader:
    """The reader of node (``kind`` "n") or edge ("e") data ``table`` for reads landing on
    ``device``, made once per table: a CUDA table read in place, a host table read by a GPU
    mapped in place (no copy), a host table read on the CPU as it is."""
    held = state.readers.get((kind, name))
    if held is not None and held[0] is table:
        return held[1]
    rows = table.reshape(table.shape[0], -1) if table.dim() != 2 else table
    if rows.is_cuda:
        placement = Placement.GPU
    elif _unified.is_unified(rows) or (device.type == "cuda" and _unified.gpu_backed()):
        placement = Placement.MAPPED
    else:
        placement = Placement.CPU
    reader = FeatureTable(rows.contiguous() if not rows.is_cuda else rows, placement,
                          device=device if device.type == "cuda" and placement is not Placement.CPU else None)
    state.readers[(kind, name)] = (table, reader)
    return reader


def _gather(state: _GraphState, kind: str, name: str, table: torch.Tensor, index: torch.Tensor,
            device: torch.device) -> torch.Tensor:
    """``table[index]`` on ``device``, read through the table's :func:`_reader`. ``index`` holds
    valid ids (a sample's nodes, edge ids, or seeds its kernels checked): no bounds check, which
    would cost a GPU a host synchronisation."""
    reader = _reader(state, kind, name, table, device)
    rows = reader.read(index.to(reader.device) if index.device != reader.device and reader.device.type == "cpu"
                       else index, check_bounds=False)
    return rows.view((index.numel(),) + tuple(table.shape[1:])).to(device)
