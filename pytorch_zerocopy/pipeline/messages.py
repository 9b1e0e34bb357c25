"""What travels between the pipeline's roles, and what the trainer reports to the parent.

Sampler -> producer / trainer: :class:`Minibatch` and :class:`EpochMark` on the batch queue.
Producer -> trainer: :class:`RingHandles` once (with the producer's :class:`TableReady`), then
:class:`SlotReady` and :class:`EpochMark` on the ready queue; trainer -> producer:
:class:`FreeEvents` once, then slot numbers on the free queue, then :data:`RELEASED`. With the
machine's gatherer both directions share one connection, which the trainer opens with a
:class:`GatherRequest`; :class:`GathererFailed` ends it. With ``machine-reads`` a producer
reads its rows through the machine's gatherer: :class:`ReadRequest`, :class:`ReadsOpen`,
:class:`ReadShare`, :class:`ReadRows`, :data:`ROWS_READ`, :data:`READ_COUNTS`. Trainer -> parent (through the
supervisor's report pipe): :class:`TableReady` (whichever process gathers), :class:`StepDone`,
:class:`PartitionInfo` and :class:`~.stats.EpochStats`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from ..block import Block
from ..placement import Placement
from .plan import Partition, Phase, Plan


@dataclass(frozen=True)
class Layout:
    """Where the parts of a packed minibatch lie: ``sizes`` of its input node ids, its labels,
    then every block's ``src``, every block's ``dst`` and, with ``eids``, every block's edge ids
    (each region in block order, so a region of all blocks is one contiguous slice);
    ``shapes`` holds each block's ``(num_src, num_dst)``. Every block's source nodes are the
    first ``num_src`` input nodes."""

    sizes: Tuple[int, ...]
    shapes: Tuple[Tuple[int, int], ...]
    eids: bool = False

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def input_rows(self) -> int:
        """Input nodes, i.e. feature rows the minibatch needs."""
        return self.sizes[0]

    @property
    def num_edges(self) -> Tuple[int, ...]:
        """Each block's edge count."""
        return self.sizes[2: 2 + len(self.shapes)]

    def region(self, k: int) -> Tuple[int, int]:
        """``(start, stop)`` of edge region ``k`` (0: src, 1: dst, 2: eids) of every block."""
        edges = sum(self.num_edges)
        start = self.sizes[0] + self.sizes[1] + k * edges
        return start, start + edges


class PackedParts(NamedTuple):
    """A packed minibatch's parts (:meth:`Minibatch.parts`), views of its tensor: ``nodes``,
    the input node ids; ``labels``, the labels part in the pieces asked for; ``edges``, every
    block's ``src`` then every block's ``dst``, as one ``[2, E]`` view; ``eids``, every block's
    edge ids (None when not packed)."""

    nodes: torch.Tensor
    labels: Tuple[torch.Tensor, ...]
    edges: torch.Tensor
    eids: Optional[torch.Tensor]


@dataclass
class Minibatch:
    """One sampled minibatch: its input node ids, its labels and its blocks, all in one int64
    tensor ``packed`` (so sending it to another process shares one shared-memory segment, and
    moving it to a GPU is one copy); the attributes are views into it.

    Which blocks, in which order, and what the labels are is the sample stage's choice
    (:class:`~.minibatches.SampleStage`): the training run packs DGL-style blocks (input side
    first) and its seeds' labels; the loaders' stages pack what their loader builds from.

    ``packed`` may be None: the minibatch's description, which pickles without a tensor (the
    GPU ring sends that, the packed tensor itself being in the slot). ``sample_ms``: host time
    its sampling took, when a sampler process measured it (0 for a replayed minibatch).
    """

    phase: Phase
    epoch: int
    step: int
    layout: Layout
    packed: Optional[torch.Tensor]
    sample_ms: float = 0.0

    @classmethod
    def pack(cls, phase: Phase, epoch: int, step: int, blocks: Sequence[Block], labels: torch.Tensor,
             sample_ms: float = 0.0, eids: bool = False) -> "Minibatch":
        """Packs ``blocks`` (``blocks[0].nodes``: the input nodes; with ``eids``, each block's
        ``eids`` too) and ``labels`` on their device (one concatenation, issued on the current
        stream)."""
        if blocks[0].nodes is None:
            raise ValueError("Minibatch.pack: blocks[0] must carry its source nodes' ids (Block.nodes)")
        if eids and any(b.eids is None for b in blocks):
            raise ValueError("Minibatch.pack: eids=True needs every block's edge ids (Block.eids)")
        parts = [blocks[0].nodes, labels] + [b.src for b in blocks] + [b.dst for b in blocks]
        if eids:
            parts += [b.eids for b in blocks]
        layout = Layout(tuple(int(t.numel()) for t in parts), tuple((b.num_src, b.num_dst) for b in blocks), eids)
        packed = torch.cat([t.reshape(-1).to(torch.int64) for t in parts])
        return cls(phase, epoch, step, layout, packed, sample_ms)

    @property
    def input_nodes(self) -> torch.Tensor:
        return self.packed[: self.layout.sizes[0]]

    @property
    def labels(self) -> torch.Tensor:
        a = self.layout.sizes[0]
        return self.packed[a: a + self.layout.sizes[1]]

    @property
    def src(self) -> torch.Tensor:
        """Every block's ``src``, in block order (one view)."""
        return self.packed[slice(*self.layout.region(0))]

    @property
    def dst(self) -> torch.Tensor:
        """Every block's ``dst``, in block order (one view)."""
        return self.packed[slice(*self.layout.region(1))]

    @property
    def eids(self) -> Optional[torch.Tensor]:
        """Every block's edge ids, in block order (one view), or None when not packed."""
        return self.packed[slice(*self.layout.region(2))] if self.layout.eids else None

    def part_sizes(self, label_sizes: Sequence[int] = ()) -> List[int]:
        """The sizes :meth:`parts` cuts the packed tensor into: the input nodes, the labels
        part in pieces of ``label_sizes`` (which must add up to its size; empty: one piece),
        the blocks' ``src`` and ``dst`` together, and their edge ids when packed. A first
        piece of -1 is what the others leave."""
        sizes, layout = self.layout.sizes, self.layout
        edges = sum(layout.num_edges)
        pieces = list(label_sizes) if label_sizes else [sizes[1]]
        if pieces[0] == -1:  # the first piece: the rest
            pieces[0] = sizes[1] - sum(pieces[1:])
        if min(pieces) < 0 or sum(pieces) != sizes[1]:
            raise ValueError(f"Minibatch.parts: label pieces {list(label_sizes)} do not add up to the labels part "
                             f"({sizes[1]})")
        return [sizes[0], *pieces, 2 * edges] + ([edges] if layout.eids else [])

    def parts(self, label_sizes: Sequence[int] = ()) -> PackedParts:
        """Every part of the packed tensor at once (one split, one op where the properties
        above take one each), cut at :meth:`part_sizes`."""
        return self.as_parts(self.packed.split_with_sizes(self.part_sizes(label_sizes)))

    def as_parts(self, views: Sequence[torch.Tensor]) -> PackedParts:
        """The :class:`PackedParts` of ``views``, the packed tensor cut at :meth:`part_sizes`."""
        k = len(views) - (2 if self.layout.eids else 1)
        edges = views[k]
        return PackedParts(views[0], tuple(views[1:k]), edges.view(2, edges.numel() // 2),
                           views[k + 1] if self.layout.eids else None)

    @property
    def blocks(self) -> List[Block]:
        """The blocks (views), each with its source nodes' ids and, when packed, edge ids."""
        counts = list(self.layout.num_edges)
        src, dst = torch.split(self.src, counts), torch.split(self.dst, counts)
        eids = torch.split(self.eids, counts) if self.layout.eids else (None,) * len(counts)
        nodes = self.input_nodes
        return [Block(s, d, n_src, n_dst, nodes=nodes[:n_src], eids=e)
                for s, d, e, (n_src, n_dst) in zip(src, dst, eids, self.layout.shapes)]

    def with_packed(self, packed: Optional[torch.Tensor]) -> "Minibatch":
        """The same minibatch over another copy of its packed tensor (e.g. on the GPU), or with
        none (a description that pickles without any tensor)."""
        return replace(self, packed=packed)

    def relabelled(self, epoch: int, step: int) -> "Minibatch":
        """This minibatch's content sent again as minibatch ``step`` of ``epoch`` (replay)."""
        return replace(self, epoch=epoch, step=step, sample_ms=0.0)

    def __repr__(self) -> str:
        return (f"Minibatch({self.phase.value}, epoch {self.epoch}, step {self.step}, "
                f"{self.layout.input_rows} input nodes, {len(self.layout.shapes)} blocks)")


@dataclass(frozen=True)
class CacheCounts:
    """Of ``lookups`` feature rows gathered through a GPU cache, ``hits`` were held by it."""

    hits: int
    lookups: int

    def __add__(self, other: "CacheCounts") -> "CacheCounts":
        return CacheCounts(self.hits + other.hits, self.lookups + other.lookups)


@dataclass(frozen=True)
class EpochMark:
    """Sent by each sampling source after its share of an epoch's ``phase`` minibatches. The
    gathering side adds ``cache``: its cache's counts over that phase's minibatches gathered
    since its previous mark of the phase (None without a cache), and with ``Plan.trace``
    ``trace``: its timings of that phase not yet sent with a slot (:class:`SlotReady`), all
    complete (not compared: marks equal by what they mark)."""

    epoch: int
    phase: Phase
    cache: Optional[CacheCounts] = None
    trace: Optional[dict] = field(default=None, compare=False)


@dataclass
class SlotReady:
    """Producer -> trainer: ``slot`` holds the first ``rows`` feature rows of ``batch``.

    With GPU slots the slot also holds ``batch``'s packed tensor and ``batch`` travels without it.
    ``buffer`` / ``packed_buffer`` are set when the slot's feature rows / packed part had to
    grow: the trainer replaces its view of the slot (sharing happens once per growth, not per
    minibatch). ``trace``: the producer's timings completed since its last message
    (``Plan.trace``; :class:`~.trace.ProducerTrace`).
    """

    slot: int
    rows: int
    batch: Minibatch
    buffer: Optional[torch.Tensor] = None
    trace: Optional[dict] = None
    packed_buffer: Optional[torch.Tensor] = None


@dataclass
class SlotsReady:
    """Producer -> trainer: a group's slots (:class:`SlotReady` each, in order), ready together,
    in one message: the trainer receives a group once instead of once per minibatch."""

    items: List[SlotReady]


@dataclass
class RingHandles:
    """Producer -> trainer, once at start: the slot buffers, their "ready" events and (GPU
    slots) each slot's buffer for the minibatch's packed tensor."""

    buffers: List[torch.Tensor]
    ready_events: List = field(default_factory=list)
    packed: List[torch.Tensor] = field(default_factory=list)
    table: Optional[TableReady] = None  # the gathering process's table (None: not a FeatureTable)


@dataclass
class FreeEvents:
    """Trainer -> producer, once at start: the events the trainer records on releasing a slot."""

    events: List = field(default_factory=list)


@dataclass(frozen=True)
class FreeSlots:
    """Trainer -> producer: slots given back together, those of one :class:`SlotsReady` once
    the trainer has released every one of them (one message per group, not per minibatch)."""

    slots: Tuple[int, ...]


RELEASED = "released"  # trainer -> producer: all shared buffers dropped; the producer may exit


@dataclass(frozen=True)
class GatherRequest:
    """Trainer -> the machine's gatherer, first on its connection: gather for ``plan`` (the
    trainer's rank's plan: its GPU, its shard, the epoch it starts at)."""

    plan: Plan


@dataclass(frozen=True)
class GathererFailed:
    """The machine's gatherer -> a trainer, in place of its next ring message: serving that
    trainer failed, as ``remote_traceback`` says."""

    remote_traceback: str


# --- producer <-> the machine's gatherer (gather_in machine-reads, :mod:`.machine_reads`) ------


@dataclass(frozen=True)
class ReadRequest:
    """Producer -> the machine's gatherer, first on its connection: read rows for ``plan``'s
    GPU; on a GPU, ``requested`` is the producer's interprocess event, recorded once each
    request's ids are in place (None on the CPU)."""

    plan: Plan
    requested: Optional[object] = None


@dataclass(frozen=True)
class ReadsOpen:
    """The machine's gatherer -> a producer, once it can serve: its table (``table``, None
    when the gatherer reads through no FeatureTable) of ``shape`` and ``dtype``; on a GPU,
    ``done``: the gatherer's interprocess event, recorded once each request's rows are
    written; ``cached``: whether a GPU cache of rows stands in front of the table."""

    table: Optional["TableReady"]
    shape: Tuple[int, int]
    dtype: torch.dtype
    done: Optional[object] = None
    cached: bool = False


@dataclass(frozen=True)
class ReadShare:
    """Producer -> the machine's gatherer: remember ``base`` (a 1-D tensor over a whole
    storage of the producer's, shared by CUDA IPC or shared memory) as ``key`` for the
    requests that name it; ``base`` None: forget ``key``. The producer keeps the storage alive
    until it has sent that."""

    key: int
    base: Optional[torch.Tensor]


@dataclass(frozen=True)
class ReadRows:
    """Producer -> the machine's gatherer: write rows ``ids`` into ``out``, where ``ids`` is
    elements ``[ids_offset, ids_offset + rows)`` of storage ``ids_key`` (int64) and ``out`` the
    ``rows x width`` contiguous elements from ``out_offset`` of storage ``out_key``. Answered by
    :data:`ROWS_READ` (or :class:`GathererFailed`)."""

    ids_key: int
    ids_offset: int
    out_key: int
    out_offset: int
    rows: int


ROWS_READ = "rows-read"  # the machine's gatherer -> a producer: the last ReadRows is issued
# Producer -> the machine's gatherer: the cache's counts (a CacheCounts) over the rows read since
# the last such request.
READ_COUNTS = "read-counts"


# --- trainer -> parent ------------------------------------------------------------------------


@dataclass(frozen=True)
class StepDone:
    """One minibatch trained (or validated), with the bytes of feature rows it read."""

    phase: Phase
    epoch: int
    feature_bytes: int


@dataclass(frozen=True)
class PartitionInfo:
    """How the GPU was shared in a run. MPS: the thread shares and whether a launcher's daemon
    was shared; green contexts: SM counts as granted, and whether the SM sets are disjoint."""

    kind: Partition
    producer_share: Optional[float] = None
    consumer_share: Optional[float] = None
    shared_daemon: Optional[bool] = None
    producer_sms: Optional[int] = None
    consumer_sms: Optional[int] = None
    total_sms: Optional[int] = None
    granularity: Optional[int] = None
    requested_producer_sms: Optional[int] = None
    disjoint: Optional[bool] = None
    api: Optional[str] = None
    driver_error: Optional[str] = None


@dataclass(frozen=True)
class TableReady:
    """The feature table of the process that gathers, once loaded: ``nbytes`` in
    ``placement``, ready ``seconds`` after its loading began (allocating and filling it, or
    mapping rows already in host memory). Producer -> trainer with the ring's buffers; the
    trainer reports it."""

    placement: Placement
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class CacheChoice:
    """The rows a run's GPU cache holds, chosen before any role starts: ``rows`` of
    ``table_rows`` rows of ``row_bytes`` bytes, by ``policy`` (a CachePolicy's value), in
    ``seconds``."""

    rows: int
    table_rows: int
    row_bytes: int
    policy: str
    seconds: float

    def describe(self) -> str:
        from ..unified import format_bytes

        return (f"cache: {self.rows:,} of {self.table_rows:,} rows ({format_bytes(self.rows * self.row_bytes)}) "
                f"chosen by {self.policy} in {self.seconds:.1f} s")
