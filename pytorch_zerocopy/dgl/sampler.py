"""``NeighborSampler``: DGL's multi-layer neighbour sampler, backed by this package's kernels.

Where sampling runs follows DGL: on the GPU when the graph is on a GPU, on the GPU reading
the graph from host memory ("UVA": the graph's CPU structure mapped in place as unified
tensors) when the seeds are on a GPU and the graph is not, else on the CPU (multithreaded).
The loader can ask for UVA explicitly.

Output per batch, as DGL's: ``(input_nodes, output_nodes, blocks)`` with ``blocks[0]`` the input
layer. With DGL installed and a ``dgl.DGLGraph`` given, blocks are real DGL blocks
(``dgl.create_block``) carrying ``dgl.NID``/``dgl.EID``; otherwise :class:`Block`. Prefetched
node features land in ``blocks[0].srcdata``, labels in ``blocks[-1].dstdata``, edge features in
every block's ``edata``. Features of a graph on the CPU are read in place from unified tensors
(mapped once, on first use), so they reach the GPU without an intermediate copy.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from .. import sampling as _sampling
from .. import unified as _unified
from ..graph.csr import CSRGraph
from ._backend import is_dgl_graph, real_dgl
from ..block import EID, NID, Block
from .block import Graph

Placement = str  # 'cpu', 'cuda' or 'unified'


def _names(x: Optional[Union[str, Sequence[str]]], what: str) -> List[str]:
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        raise NotImplementedError(f"{what}: per-type dicts are for heterogeneous graphs, which are not supported")
    return list(x)


class _GraphState:
    """What a sampler keeps per graph and placement: the neighbour lists (and their sampling
    weights in list order) and the unified copies of features."""

    def __init__(self, adjacency: CSRGraph, probs: Optional[torch.Tensor]):
        self.adjacency = adjacency
        self.probs = probs  # sampling weights by edge id
        self.unified_feats: Dict[Tuple[str, str], Tuple[torch.Tensor, torch.Tensor]] = {}


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
            state = _GraphState(*self._adjacency(g, placement))
            self._states[placement] = state
        return state

    def _adjacency(self, g: Any, placement: Placement) -> Tuple[CSRGraph, Optional[torch.Tensor]]:
        if is_dgl_graph(g):
            if g.is_block or len(g.ntypes) != 1 or len(g.etypes) != 1:
                raise NotImplementedError("NeighborSampler supports homogeneous graphs only")
            fmt = "csc" if self.edge_dir == "in" else "csr"
            indptr, indices, eids = g.adj_tensors(fmt)
            adj = CSRGraph(indptr.long(), indices, eids=eids if eids is not None and eids.numel() else None,
                           placement="cuda" if indptr.is_cuda else "cpu", validate=False)
            edata = g.edata
        else:
            if not isinstance(g, Graph):
                g = Graph(g)
            adj = g.csc() if self.edge_dir == "in" else _sampling.as_csr_graph((g.indptr, g.indices))
            edata = g.edata
        probs = None
        if self.prob is not None:
            if self.prob not in edata:
                raise KeyError(f"prob/mask: the graph has no edge feature {self.prob!r}")
            weights = edata[self.prob]
            if weights.dim() != 1 or weights.numel() != adj.indices.numel():
                raise ValueError(f"edge feature {self.prob!r} must hold one weight per edge "
                                 f"({adj.indices.numel()}), got shape {tuple(weights.shape)}")
            weights = weights.detach().cpu().float()
            if bool((weights < 0).any()):
                raise ValueError(f"edge feature {self.prob!r} holds negative sampling weights")
            probs = weights
        return _place_adjacency(adj, probs, placement)

    # -- sampling -------------------------------------------------------------------------

    def sample(self, g: Any, seed_nodes: torch.Tensor, exclude_eids: Any = None):
        """``(input_nodes, output_nodes, blocks)`` for ``seed_nodes``, as DGL's ``sample``."""
        if isinstance(seed_nodes, dict):
            raise NotImplementedError("seed node dicts are for heterogeneous graphs, which are not supported")
        seed_nodes = torch.as_tensor(seed_nodes)
        graph_device = _graph_device(g)
        if graph_device.type == "cuda":
            placement = "cuda"
        elif seed_nodes.is_cuda:
            placement = "unified"
        else:
            placement = "cpu"
        out = self.output_device or seed_nodes.device
        return self.sample_with(g, seed_nodes, placement, out, exclude_eids)

    def sample_with(self, g: Any, seed_nodes: torch.Tensor, placement: Placement,
                    device: torch.device, exclude_eids: Any = None, seed: Optional[int] = None):
        """Samples with the graph structure in ``placement`` and returns blocks on ``device``."""
        if exclude_eids is not None:
            raise NotImplementedError("exclude_eids is not supported by this NeighborSampler")
        state = self._state(g, placement)
        layers = _sampling.sample_layers(state.adjacency, seed_nodes, self.fanouts, edge_dir="out",
                                         replace=self.replace, probs=state.probs, seed=seed)
        output_nodes = seed_nodes.to(device)
        input_nodes = layers[0].nodes.to(device)
        blocks = [self._block(g, lay, device) for lay in layers]
        self._prefetch(g, state, blocks, input_nodes, output_nodes, device)
        return input_nodes, output_nodes, blocks

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

    def _prefetch(self, g, state, blocks, input_nodes, output_nodes, device) -> None:
        ndata = g.ndata if hasattr(g, "ndata") else {}
        edata = g.edata if hasattr(g, "edata") else {}
        for name in self.prefetch_node_feats:
            blocks[0].srcdata[name] = _gather(state, "n", name, _lookup(ndata, name, "node"), input_nodes, device)
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


def _place_adjacency(adj: CSRGraph, probs: Optional[torch.Tensor],
                     placement: Placement) -> Tuple[CSRGraph, Optional[torch.Tensor]]:
    tensors = [adj.indptr.long(), adj.indices, adj.eids, probs]
    if placement == "unified":
        # Own copies, mapped in place: the graph's own storage is left as it is.
        placed = [None if t is None else
                  (t if _unified.is_unified(t) else _unified.to_unified(t.detach().cpu().contiguous().clone()))
                  for t in tensors]
    else:
        placed = [None if t is None else
                  (t.cpu() if _unified.is_unified(t) and placement == "cpu" else t.to(placement))
                  for t in tensors]
    indptr, indices, eids, probs = placed
    return CSRGraph(indptr, indices, eids=eids, placement=placement, validate=False), probs


def _gather(state: _GraphState, kind: str, name: str, table: torch.Tensor, index: torch.Tensor,
            device: torch.device) -> torch.Tensor:
    """``table[index]`` on ``device``. A CPU table read from a GPU is mapped once as a unified
    tensor (in place, no copy) and gathered from there by the GPU."""
    if device.type == "cuda" and table.device.type == "cpu":
        cached = state.unified_feats.get((kind, name))
        if cached is None or cached[0] is not table:
            cached = (table, _unified.to_unified(table.contiguous()))
            state.unified_feats[(kind, name)] = cached
        table = cached[1]
    if _unified.is_unified(table):
        where = torch.device("cuda", torch.cuda.current_device()) if _unified.gpu_backed() else torch.device("cpu")
        return table[index.to(where)].to(device)
    return table[index.to(table.device)].to(device)
