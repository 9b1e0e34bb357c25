"""The consumer's training step (forward, backward, gradient all-reduce, Adam): eager, or
replayed from CUDA graphs over minibatches padded to fixed capacities.

Why graphs: a GraphSAGE step here is ~0.5 ms of GPU work but 1.4-2.2 ms of host time to issue
(~60 launches, plus DDP's per-step bookkeeping: benchmarks/results/ddp_step.md), so with a
fast input path the trainer's host, not its GPU, paces training. Replaying a graph issues the
whole step in one launch.

Graphs need fixed shapes and addresses, and sampled minibatches vary in size, so each minibatch
is copied into static buffers of fixed capacities (:class:`PaddedBatch`). Padding changes no
result: padded edges point at a reserved padded destination row, padded labels are ignored by
the loss, and a padded row's gradient is exactly zero, so every real row, the loss and every
parameter gradient are those of the unpadded minibatch (up to the order of floating-point sums).

Two graphs, not one: ``forward_backward`` (rank-local) and ``update`` (gradient all-reduce plus
Adam). NCCL requires a collective to be graph-captured on every rank or on none, so the
all-reduce lives in ``update``, which every rank replays every step; a minibatch larger than the
capacities (rare: they carry headroom over the warm-up minibatches) then runs forward and
backward eagerly on its rank alone and still meets its peers in the same captured all-reduce.
Gradients are views into one flat buffer that the all-reduce averages in place (no DDP: its
reducer runs host code during backward, which a replayed graph never runs).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch.nn import functional as F

from ..block import Block

IGNORE_LABEL = -100  # cross_entropy's default ignore_index: padded labels carry it


def batch_sizes(blocks: Sequence[Block], labels: torch.Tensor) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """``(nodes, edges)`` of a minibatch: ``nodes[l]`` source rows of block ``l`` (``nodes[L]`` the
    output rows), ``edges[l]`` edges of block ``l``. Raises if the blocks do not chain."""
    nodes = [b.num_src_nodes() for b in blocks] + [blocks[-1].num_dst_nodes()]
    for i, (a, b) in enumerate(zip(blocks[:-1], blocks[1:])):
        if a.num_dst_nodes() != b.num_src_nodes():
            raise ValueError(f"block {i} has {a.num_dst_nodes()} destination nodes but block {i + 1} has "
                             f"{b.num_src_nodes()} source nodes")
    if labels.numel() != nodes[-1]:
        raise ValueError(f"{labels.numel()} labels for {nodes[-1]} output nodes")
    return tuple(nodes), tuple(b.num_edges() for b in blocks)


def _round_up(n: int, to: int = 64) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class Capacity:
    """Fixed sizes of a padded minibatch: ``nodes[l]`` rows entering layer ``l`` (``nodes[L]``
    output rows), ``edges[l]`` edges of block ``l``. Row ``nodes[l] - 1`` (``l >= 1``) is kept
    for padded edges, so a minibatch fits only with strictly fewer real rows."""

    nodes: Tuple[int, ...]
    edges: Tuple[int, ...]

    @classmethod
    def covering(cls, sizes: Sequence[Tuple[Tuple[int, ...], Tuple[int, ...]]], headroom: float) -> "Capacity":
        """The capacity for ``headroom`` times the largest of ``sizes`` (``batch_sizes`` values),
        rounded up; rows never grow from one layer to the next inward (``nodes[l] >=
        nodes[l + 1]``: a layer's destination rows are the first of its source rows)."""
        if headroom < 1:
            raise ValueError(f"headroom must be >= 1, got {headroom}")
        layers = len(sizes[0][1])
        nodes = [_round_up(math.ceil(max(s[0][i] for s in sizes) * headroom) + 1) for i in range(layers + 1)]
        for i in range(layers - 1, -1, -1):
            nodes[i] = max(nodes[i], nodes[i + 1])
        edges = [_round_up(max(1, math.ceil(max(s[1][i] for s in sizes) * headroom))) for i in range(layers)]
        return cls(tuple(nodes), tuple(edges))

    def fits(self, sizes: Tuple[Tuple[int, ...], Tuple[int, ...]]) -> bool:
        nodes, edges = sizes
        return (len(edges) == len(self.edges) and all(n < cap for n, cap in zip(nodes, self.nodes))
                and all(e <= cap for e, cap in zip(edges, self.edges)))


class PaddedBatch:
    """Static buffers of one :class:`Capacity`; :meth:`load` copies a minibatch into them.

    Contract after ``load``: ``feats[:n]`` and the first ``e`` entries of each block's edges
    are the minibatch's; padded edges run from a valid source row to the reserved padded
    destination row ``nodes[l + 1] - 1``; labels past the real ones are ``IGNORE_LABEL``.
    Padded feature rows hold earlier minibatches' rows (or zeros): finite, never read by a
    real row. All copies are issued on the current stream and never synchronise.
    """

    def __init__(self, capacity: Capacity, feature_dim: int, device: torch.device,
                 dtype: torch.dtype = torch.float32):
        self.capacity = capacity
        nodes, edges = capacity.nodes, capacity.edges
        self.feats = torch.zeros(nodes[0], feature_dim, dtype=dtype, device=device)
        # Padded sources start at row 0; later they hold earlier minibatches' sources, which are
        # below those minibatches' row counts and so below the capacity: always valid rows.
        self.src = [torch.zeros(e, dtype=torch.int64, device=device) for e in edges]
        self.dst = [torch.full((e,), nodes[i + 1] - 1, dtype=torch.int64, device=device) for i, e in enumerate(edges)]
        self.labels = torch.full((nodes[-1],), IGNORE_LABEL, dtype=torch.int64, device=device)
        self.blocks = [Block(self.src[i], self.dst[i], nodes[i], nodes[i + 1]) for i in range(len(edges))]

    def load(self, blocks: Sequence[Block], feats: torch.Tensor, labels: torch.Tensor) -> None:
        """Copies a minibatch that :meth:`Capacity.fits` into the buffers."""
        self.feats[: feats.shape[0]].copy_(feats)
        for i, block in enumerate(blocks):
            src, dst = block.edges()
            e = src.numel()
            self.src[i][:e].copy_(src)
            self.dst[i][:e].copy_(dst)
            self.dst[i][e:].fill_(self.capacity.nodes[i + 1] - 1)
        m = labels.numel()
        self.labels[:m].copy_(labels)
        self.labels[m:].fill_(IGNORE_LABEL)


class EagerTrainStep:
    """The step issued op by op; ``model`` may be DDP-wrapped (its hooks all-reduce gradients)."""

    kind = "eager"

    def __init__(self, model: torch.nn.Module, lr: float, device: torch.device):
        self.model = model
        # The fused CUDA Adam: one launch per step instead of a few per parameter group.
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, fused=device.type == "cuda")

    def __call__(self, blocks: List[Block], feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Trains on one minibatch; returns the loss (detached, on the device, not synchronised)."""
        loss = F.cross_entropy(self.model(blocks, feats), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def summary(self) -> dict:
        return {"kind": self.kind}

    def close(self) -> None:
        pass


class GraphedTrainStep:
    """The step replayed from two CUDA graphs (see the module docstring).

    The first ``warmup`` minibatches train eagerly (on a side stream, as capture requires): they
    create Adam's state, NCCL's communicator and the library handles outside any capture, and
    their sizes set the capacities, ``headroom`` times the largest. The graphs are captured at
    the next minibatch. ``world_size > 1`` needs an initialised default process group; rank 0's
    parameters are broadcast at construction, so every rank starts from the same model.

    ``capture=False`` runs the same padded step, flat gradients and all-reduce without graphs
    (the CPU, and tests of the padding itself).

    Returned losses are static tensors overwritten by the next step: read them on the current
    stream before calling again (adding them to a running sum does).
    """

    kind = "cuda-graph"

    def __init__(self, model: torch.nn.Module, lr: float, device: torch.device, *, world_size: int = 1,
                 warmup: int = 3, headroom: float = 1.25, capture: bool = True):
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (Adam's state must exist before capture), got {warmup}")
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        params = [p for p in model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1 or any(p.device != device for p in params):
            raise ValueError(f"all parameters must share one dtype and live on {device}, got {dtypes}")
        self.model, self.device, self.world_size = model, device, world_size
        self.warmup, self.headroom, self.capture = warmup, headroom, capture
        if world_size > 1:
            import torch.distributed as dist

            with torch.no_grad():
                for p in params:
                    dist.broadcast(p, 0)
        # Gradients are views into one buffer: backward accumulates into them in place (they are
        # never set to None), the all-reduce averages the buffer, Adam reads the views.
        self.flat_grad = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=device)
        offset = 0
        for p in params:
            p.grad = self.flat_grad[offset: offset + p.numel()].view_as(p)
            offset += p.numel()
        self.opt = torch.optim.Adam(params, lr=lr, fused=device.type == "cuda", capturable=capture)
        self.seen: List[Tuple[Tuple[int, ...], Tuple[int, ...]]] = []
        self.padded: Optional[PaddedBatch] = None
        self.graphs: Optional[Tuple["torch.cuda.CUDAGraph", "torch.cuda.CUDAGraph"]] = None
        self.static_loss: Optional[torch.Tensor] = None
        self.steps = 0
        self.fallbacks = 0  # minibatches past the capacities, trained eagerly
        self.capture_seconds = 0.0
        self.side = torch.cuda.Stream(device) if capture else None

    # -- the two halves of a step, as run eagerly and as captured --

    def _forward_backward(self, blocks, feats, labels) -> torch.Tensor:
        self.flat_grad.zero_()
        loss = F.cross_entropy(self.model(blocks, feats), labels, ignore_index=IGNORE_LABEL)
        loss.backward()
        return loss.detach()

    def _update(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(self.flat_grad)
            self.flat_grad.div_(self.world_size)
        self.opt.step()

    def _padded_forward_backward(self) -> torch.Tensor:
        return self._forward_backward(self.padded.blocks, self.padded.feats, self.padded.labels)

    # -- building --

    def _build(self, feature_dim: int) -> None:
        capacity = Capacity.covering(self.seen, self.headroom)
        self.padded = PaddedBatch(capacity, feature_dim, self.device, self.flat_grad.dtype)
        if not self.capture:
            return
        start = time.perf_counter()
        forward_backward, update = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        # thread_local: the process group's watchdog thread may query its own events meanwhile.
        with torch.cuda.graph(forward_backward, capture_error_mode="thread_local"):
            self.static_loss = self._padded_forward_backward()
        with torch.cuda.graph(update, capture_error_mode="thread_local"):
            self._update()
        self.graphs = (forward_backward, update)
        self.capture_seconds = time.perf_counter() - start  # once per run, before its first replay

    # -- the step --

    def __call__(self, blocks: List[Block], feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Trains on one minibatch; returns the loss (valid until the next call, never synchronised)."""
        sizes = batch_sizes(blocks, labels)
        self.steps += 1
        if self.padded is None:
            self.seen.append(sizes)
            if len(self.seen) <= self.warmup:
                return self._warmup_step(blocks, feats, labels)
            self._build(feats.shape[1])
        if self.padded.capacity.fits(sizes):
            self.padded.load(blocks, feats, labels)
            if self.graphs is not None:
                self.graphs[0].replay()
                loss = self.static_loss
            else:
                loss = self._padded_forward_backward()
        else:
            self.fallbacks += 1
            loss = self._forward_backward(blocks, feats, labels)
        if self.graphs is not None:
            self.graphs[1].replay()
        else:
            self._update()
        return loss

    def _warmup_step(self, blocks, feats, labels) -> torch.Tensor:
        if self.side is None:
            loss = self._forward_backward(blocks, feats, labels)
            self._update()
            return loss
        current = torch.cuda.current_stream(self.device)
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side):
            loss = self._forward_backward(blocks, feats, labels)
            self._update()
        current.wait_stream(self.side)
        return loss

    def close(self) -> None:
        """Releases the graphs. Must come before the process group is destroyed: with a graph that
        captured the all-reduce still alive, destroying it never returned (2 x H200, NCCL keeps
        a communicator while graphs that captured it exist)."""
        if self.graphs is not None:
            self.graphs = None
            self.static_loss = None
            torch.cuda.synchronize(self.device)

    def summary(self) -> dict:
        """What the step did: its kind, capacities (once built), steps, eager fallbacks and the
        time the capture took."""
        out = {"kind": self.kind if self.capture else "padded", "steps": self.steps, "fallbacks": self.fallbacks,
               "warmup": self.warmup}
        if self.padded is not None:
            out["capacity"] = {"nodes": list(self.padded.capacity.nodes), "edges": list(self.padded.capacity.edges)}
        if self.capture_seconds:
            out["capture_seconds"] = self.capture_seconds
        return out


def make_train_step(model: torch.nn.Module, plan, device: torch.device):
    """The step ``plan`` asks for: graphed on a CUDA device when ``plan.cuda_graph`` (never with
    the green partition: a graph captured on an ordinary stream would not keep to the green
    context's SMs, and the plan refuses that combination); eager otherwise, with DDP when
    ``plan.world_size > 1``. Joins the default process group first when there are several ranks."""
    distributed = plan.world_size > 1
    if distributed:
        from ..launch import init_process_group

        # The trainer is a child of the launched worker and inherits its torchrun environment
        # (MASTER_ADDR, MASTER_PORT and the agent's store): env:// reaches the launcher's store.
        init_process_group("nccl" if device.type == "cuda" else "gloo", plan.rank, plan.world_size)
    if device.type == "cuda" and plan.cuda_graph:
        return GraphedTrainStep(model, plan.lr, device, world_size=plan.world_size, warmup=plan.graph_warmup)
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        # Gradients are views into the all-reduce buckets, which saves the copies out of them.
        # (static_graph measured no better, and adds a Python autograd function to every step.)
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                        gradient_as_bucket_view=True)
    return EagerTrainStep(model, plan.lr, device)
