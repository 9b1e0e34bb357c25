"""What travels between the pipeline's roles, and the run's configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from ..block import Block

ROLES = ("sampler", "producer", "consumer")


@dataclass
class PipelineConfig:
    """Everything a role needs besides the dataset; picklable (sent to spawned children).

    ``gather`` is how features reach the trainer:
      ``"zerocopy"`` routed zero-copy gather (``table[idx]`` on the unified table),
      ``"naive"``    ``index_select`` on the table's plain CUDA alias, in the trainer's stream,
      ``"dma"``      CPU ``index_select`` (all threads) into pinned host slots + async copy,
      ``"gpu"``      the table copied into GPU memory first,
      ``"cpu"``      CPU index_select (the device is the CPU).
    ``producer_process``: gather in a producer process that owns a ring of ``num_slots``
    buffers shared with the consumer once; otherwise the trainer gathers inline.
    ``partition``: ``"none"``, ``"mps"`` (producer / consumer processes under a private MPS
    daemon, ``producer_share`` percent of the threads for the producer) or ``"green"`` (inline
    gather on a stream of a green context with ``producer_sms`` SMs, training on another).
    ``replay``: sample only this many distinct minibatches per worker and kind, once, and
    send them again in turn for the rest of the run: takes CPU sampling out of the measurement
    when benchmarking the data path (the paper's Figure 11 compares data paths, not samplers).
    ``inject_failure``: ``(role, "raise" | "exit", minibatch[, rank])`` makes that role fail at
    that minibatch (of that rank only, when one is given); it exists to test the failure handling.
    ``rank`` / ``world_size``: one data-parallel pipeline among several (see below).
    ``gather_batches``: with GPU ring slots, the producer gathers this many minibatches' rows
    in one call (more rows per walk over the table's pages) and copies them to their slots;
    needs ``num_slots >= 2 * gather_batches`` so one group trains while the next is gathered.
    ``trace``: record per-minibatch timings of the consumer and the producer (host waits, GPU
    step and gather times, the GPU's idle gaps between steps); each epoch's statistics then
    carry a ``"trace"`` entry (:mod:`.trace`).
    ``cuda_graph``: on a CUDA trainer, replay each training step from CUDA graphs over
    minibatches padded to fixed capacities, set after ``graph_warmup`` eager minibatches
    (:mod:`.train_step`; not with the green partition). Off: op-by-op steps, DDP with ranks.
    """

    device: str = "cpu"
    gather: str = "cpu"
    producer_process: bool = False
    partition: str = "none"
    producer_share: float = 10.0
    producer_sms: int = 16
    num_slots: int = 3
    num_samplers: int = 1
    sampler_threads: int = 1
    producer_threads: int = 1
    consumer_threads: int = 0
    fanouts: Tuple[int, ...] = (10, 10)
    batch_size: int = 1024
    epochs: int = 2
    max_batches: Optional[int] = None
    val_batches: Optional[int] = None
    hidden: int = 128
    dropout: float = 0.3
    lr: float = 3e-3
    seed: int = 0
    queue_depth: int = 4
    replay: Optional[int] = None
    inject_failure: Optional[Tuple] = None
    trace: bool = False
    gather_batches: int = 1
    cuda_graph: bool = True
    graph_warmup: int = 3
    # Data-parallel training (pytorch_zerocopy.launch): this pipeline's rank among
    # ``world_size`` pipelines. Each trains on its own shard of every epoch's training ids and
    # its consumer joins the process group (env:// rendezvous inherited from the launcher).
    rank: int = 0
    world_size: int = 1


class Minibatch:
    """Sampler output: input node ids, the seeds' labels and the blocks of one minibatch.

    All its integer tensors travel packed in one int64 tensor, so sending a minibatch to
    another process shares one shared-memory segment instead of one per tensor; the
    attributes are views into it.
    """

    def __init__(self, kind: str, epoch: int, step: int, input_nodes: torch.Tensor, labels: torch.Tensor,
                 blocks: List[Block]):
        self.kind = kind  # "train" or "val"
        self.epoch = epoch
        self.step = step
        parts = [input_nodes, labels] + [t for b in blocks for t in (b.src, b.dst)]
        self._sizes = [int(t.numel()) for t in parts]
        self._shapes = [(b.num_src, b.num_dst) for b in blocks]
        self.packed = torch.cat([t.reshape(-1).to(torch.int64) for t in parts])

    def _views(self) -> List[torch.Tensor]:
        return list(torch.split(self.packed, self._sizes))

    @property
    def input_nodes(self) -> torch.Tensor:
        return self.packed[: self._sizes[0]]

    @property
    def labels(self) -> torch.Tensor:
        return self.packed[self._sizes[0]: self._sizes[0] + self._sizes[1]]

    @property
    def blocks(self) -> List[Block]:
        views = self._views()[2:]
        return [Block(views[2 * i], views[2 * i + 1], n_src, n_dst) for i, (n_src, n_dst) in enumerate(self._shapes)]

    @property
    def packed_numel(self) -> int:
        """Elements of the packed tensor (known also when it does not travel with the minibatch)."""
        return sum(self._sizes)

    def with_packed(self, packed: Optional[torch.Tensor]) -> "Minibatch":
        """The same minibatch over another copy of the packed tensor (e.g. on the GPU), or with
        none (``None``: a description that pickles without any tensor)."""
        moved = Minibatch.__new__(Minibatch)
        moved.__dict__.update(self.__dict__, packed=packed)
        return moved

    def __repr__(self) -> str:
        return (f"Minibatch({self.kind}, epoch {self.epoch}, step {self.step}, {self._sizes[0]} input nodes, "
                f"{len(self._shapes)} blocks)")


@dataclass
class EpochMark:
    """Sent by each sampler worker after its share of an epoch's ``kind`` minibatches."""

    epoch: int
    kind: str


@dataclass
class SlotReady:
    """Producer -> consumer: ``slot`` holds the first ``rows`` feature rows of ``batch``.

    With GPU slots the slot also holds ``batch``'s packed tensor (blocks, labels, input ids),
    copied to the GPU by the producer, and ``batch`` travels without it (no tensor is pickled).
    ``buffer`` / ``packed_buffer`` are set when the slot's features / packed part had to grow:
    the consumer replaces its view of the slot (sharing happens once per growth, not per
    minibatch).
    """

    slot: int
    rows: int
    batch: Minibatch
    buffer: Optional[torch.Tensor] = None
    trace: Optional[dict] = None  # the producer's completed timings (``PipelineConfig.trace``)
    packed_buffer: Optional[torch.Tensor] = None


@dataclass
class RingHandles:
    """Producer -> consumer, once at start: the slot buffers, their "ready" events and (GPU
    slots) each slot's buffer for the minibatch's packed tensor."""

    buffers: List[torch.Tensor]
    ready_events: List = field(default_factory=list)
    packed: List[torch.Tensor] = field(default_factory=list)


@dataclass
class FreeEvents:
    """Consumer -> producer, once at start: the events the consumer records on releasing a slot."""

    events: List = field(default_factory=list)


RELEASED = "released"  # consumer -> producer: all shared buffers dropped; the producer may exit
