"""The producer: gathers each minibatch's input features into a free ring slot and hands the
slot to the trainer (:mod:`.ring`).

Its minibatches come from the sampler processes (``Plan.sample_on`` cpu) or from its own
:class:`~.minibatches.GpuSampler` (``gpu``): then sampling runs in this process, on the plan's
GPU (inside its MPS partition), on a stream of its own, the next minibatches' samples in flight
while the current ones are gathered, and the blocks reach a GPU slot by a device-to-device
copy; they never leave the GPU or cross a process. With host slots (mode ``dma`` sampling on
the GPU) each sample comes back to host memory once, and the CPU gathers its rows.

Table: the producer loads the feature table itself, straight from the dataset's feature source
into ``Plan.table_in`` (:func:`~.gather.feature_reader`), before it takes the first
minibatch: the process that gathers owns the table. With ``Plan.gather_in`` machine-reads the
machine's gatherer holds it (and the cache), and the producer's reads go there
(:class:`~.machine_reads.MachineRows`).

Cache: with ``cached_rows`` (chosen by the parent for ``Plan.cache``) the producer holds those
rows in its GPU's memory and gathers through them; each epoch mark it forwards carries the
cache's hit counts over the minibatches of that phase.

Groups: ``Plan.gather_batches`` minibatches are gathered by one call: a minibatch's rows are
few and scattered over the whole table, so one gather of several minibatches' rows walks each
page of the table once for more rows (rows per second rise with rows per call). The rows then
move to their slots by device-to-device copies, on a stream of their own that overlaps them
with the next group's gather. Every minibatch of a group is ready when the group is. A phase
(the run's start, and after each epoch mark) starts with groups of 1, 1, 2, 2, 4, 4, ...
minibatches up to ``Plan.gather_batches`` (:func:`group_sizes`): the trainer's first minibatch
of a phase waits for one sample and one gather, not for a whole group's, while the later groups
form behind it.

Grid: ``Plan.gather_tuning`` reaches the gather op as arguments (it may bound the kernel's grid
to a few blocks per SM of the producer's share).

Diagnostics wrap the stages, chosen once where the role is assembled: with ``Plan.trace`` a
group's flush is :class:`_TracedFlush` around :class:`_Flush`, and the GPU sampler's steps are
timed (:class:`~.trace.TracedSampling`); an injected failure wraps the source
(:func:`sample_source`).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from typing import Iterable, Iterator, List, Optional, Union

import torch

from ..datasets.base import NodeDataset
from ..feature_table import CachedTable, FeatureReader
from .gather import CacheHits, feature_reader, gather_into, table_ready
from .machine_reads import MachineRows
from .messages import CacheCounts, EpochMark, Minibatch
from .minibatches import GpuSampler, SampleStage, Sampled, from_samplers, sample_here
from .plan import GatherIn, Plan, SampleOn
from .process import failing, set_threads, trainer_device
from .ring import RingWriter
from .trace import ProducerTrace


class _GroupGather:
    """Gathers a group's rows into its slots: one call straight into the slot for one
    minibatch, else one call into a staging buffer and a copy per slot.

    On a GPU the copies run on a stream of their own, out of one of two staging buffers in
    turn (host slots use one), so one group's copies overlap the next group's gather; a staging buffer is refilled
    only after the copies out of it have run. A call returns the stream on which the group's
    slots are complete (None for host slots, complete on return)."""

    def __init__(self, reader: FeatureReader, ring: RingWriter):
        self.reader, self.ring = reader, ring
        self.staging: List[Optional[torch.Tensor]] = [None, None]
        self.copied: List[Optional["torch.cuda.Event"]] = [None, None]  # copies out of each buffer done
        self.turn = 0
        self.copy_stream = torch.cuda.Stream(ring.device) if ring.on_gpu else None

    def _buffer(self, k: int, rows: int) -> torch.Tensor:
        current = self.staging[k]
        if current is None or current.shape[0] < rows:
            if current is not None and self.copy_stream is not None:
                current.record_stream(self.copy_stream)  # its memory is reused only after the copies
            grown = max(rows, current.shape[0] * 5 // 4) if current is not None else rows
            self.staging[k] = current = self.ring.feature_buffer(grown)
        return current

    def __call__(self, slots: List[int], batches) -> Optional["torch.cuda.Stream"]:
        stream = self.ring.stream
        if len(slots) == 1:
            b = batches[0]
            gather_into(self.reader, b.input_nodes, self.ring.rows(slots[0], b.layout.input_rows))
            return stream
        k = self.turn
        if self.copy_stream is not None:  # host slots are complete on return: one buffer serves
            self.turn ^= 1
        staging = self._buffer(k, sum(b.layout.input_rows for b in batches))
        if self.copied[k] is not None:
            stream.wait_event(self.copied[k])
        gather_into(self.reader, torch.cat([b.input_nodes for b in batches]), staging)
        if self.copy_stream is None:
            self._copy_out(slots, batches, staging)
            return None
        gathered = torch.cuda.Event()
        gathered.record(stream)
        self.copy_stream.wait_event(gathered)
        with torch.cuda.stream(self.copy_stream):
            self._copy_out(slots, batches, staging)
        self.copied[k] = torch.cuda.Event()
        self.copied[k].record(self.copy_stream)
        return self.copy_stream

    def _copy_out(self, slots: List[int], batches, staging: torch.Tensor) -> None:
        offset = 0
        for slot, b in zip(slots, batches):
            n = b.layout.input_rows
            self.ring.rows(slot, n).copy_(staging[offset:offset + n])
            offset += n


class _Flush:
    """Gathers a group of sampled minibatches and hands them on: ``ring.take`` free slots,
    :meth:`load` the minibatches into them, gather their rows (:class:`_GroupGather`),
    :meth:`publish` the slots (counting the cache's hits, with ``hits``)."""

    def __init__(self, reader: FeatureReader, ring: RingWriter):
        self.ring = ring
        self.gather = _GroupGather(reader, ring)
        self.hits = _hit_counter(reader)

    def __call__(self, group: List[Sampled]) -> None:
        slots = self.ring.take(len(group))
        batches = self.load(group, slots)
        self.publish(slots, batches, self.gather(slots, batches), _NO_TRACES)

    def load(self, group: List[Sampled], slots: List[int]) -> List[Minibatch]:
        """Each minibatch of ``group`` loaded into its slot, once its sample is complete: a GPU
        sample for GPU slots is waited for on the ring's stream; one for host slots, by the
        host, and copied to host memory."""
        stream = self.ring.stream
        batches = []
        for sampled, slot in zip(group, slots):
            batch, packed = sampled.batch, sampled.batch.packed
            if sampled.ready is not None and stream is None:  # a GPU sample for host slots
                sampled.ready.synchronize()
                batch = batch.with_packed(packed.cpu())
            elif sampled.ready is not None:
                stream.wait_event(sampled.ready)  # the sample is complete on its stream
                packed.record_stream(stream)
            batches.append(self.ring.load(slot, batch))
        return batches

    def publish(self, slots: List[int], batches: List[Minibatch], complete_on: Optional["torch.cuda.Stream"],
                traces: Iterable[Optional[dict]]) -> None:
        """Hands the slots to the trainer (one message), each with the next of ``traces``, then
        counts the cache's hits (after the slots' ready events: the trainer does not wait for it)."""
        self.ring.publish(slots, batches, [trace for _, trace in zip(slots, traces)], complete_on)
        if self.hits is not None:
            for b in batches:
                self.hits.add(b.epoch, b.phase, b.input_nodes)


_NO_TRACES = itertools.repeat(None)


class _MachineHits:
    """The hit counts of the machine's gatherer's cache, for a producer that reads through it
    (:class:`~.machine_reads.MachineRows`): the gatherer counts every read; a mark takes the
    counts since the previous mark (the minibatches before it were flushed first)."""

    def __init__(self, reader: MachineRows):
        self.reader = reader

    def add(self, epoch: int, phase, input_nodes: torch.Tensor) -> None:
        pass  # counted where the rows are read

    def take(self, epoch: int, phase) -> CacheCounts:
        return self.reader.cache_counts()


def _hit_counter(reader: FeatureReader) -> Optional[Union[CacheHits, _MachineHits]]:
    """What counts the cache's hits of ``reader``'s reads: None without a cache."""
    if isinstance(reader, CachedTable):
        return CacheHits(reader)
    if isinstance(reader, MachineRows) and reader.cached:
        return _MachineHits(reader)
    return None


class _TracedFlush:
    """A :class:`_Flush` whose groups are timed into ``tracer`` (``Plan.trace``): the host's
    wait for free slots and its time to issue the group, the gather (GPU time between two
    events, the first on the ring's stream before the gather, the second on the stream that
    completes the group's slots; host time with host slots), and each minibatch's wait and
    sample; each slot's message carries the timings complete when it is published."""

    def __init__(self, flush: _Flush, tracer: ProducerTrace):
        self.flush, self.tracer = flush, tracer

    def __call__(self, group: List[Sampled]) -> None:
        flush, tracer, n = self.flush, self.tracer, len(group)
        t_slot = time.perf_counter()
        slots = flush.ring.take(n)
        t_issue = time.perf_counter()
        batches = flush.load(group, slots)
        span = tracer.span()
        if span is not None:
            span[0].record(flush.ring.stream)
        t_gather = time.perf_counter()
        complete_on = flush.gather(slots, batches)
        if span is not None:
            span[1].record(complete_on)
            tracer.gpu("gather_ms", [span], n)
        else:
            tracer.host("gather_ms", time.perf_counter() - t_gather, n)
        tracer.host("issue_ms", time.perf_counter() - t_issue, n)
        for sampled in group:
            tracer.sampled(sampled)
            tracer.host("slot_wait_ms", (t_issue - t_slot) / n)
        flush.publish(slots, batches, complete_on, (tracer.take() for _ in slots))


def sample_source(plan: Plan, ds: NodeDataset, batch_q, device: torch.device, tracer: Optional[ProducerTrace],
                  stage: SampleStage = SampleStage()) -> Iterable[Union[Sampled, EpochMark]]:
    """Where the process that gathers takes its minibatches from: its own
    :class:`~.minibatches.GpuSampler` on ``device`` (``Plan.sample_on`` gpu; timed into
    ``tracer`` when given), the sampler processes' ``batch_q``, or, with no sampler process
    (the machine's gatherer on the CPU), its own calls of the CPU sampling op; behind the
    producer's injected failure when the plan names one."""
    if plan.sample_on is SampleOn.GPU:
        source = GpuSampler(plan, ds, device, ahead=plan.gather_batches, trace=tracer, stage=stage)
    elif plan.sampler_processes:
        source = from_samplers(batch_q, plan.mark_sources)
    else:
        source = sample_here(plan, ds, stage)
    return failing(source, plan, "producer")


def producer_main(plan: Plan, ds: NodeDataset, batch_q, ready_q, free_q,
                  cached_rows: Optional[torch.Tensor] = None, stage: SampleStage = SampleStage(),
                  gatherer: Optional[str] = None) -> None:
    """Fills ring slots until the minibatches of the run are done (see the module docstring);
    ``stage``: what its :class:`~.minibatches.GpuSampler` samples, when it samples. With
    ``Plan.gather_in`` machine-reads the rows are read by the machine's gatherer listening at
    ``gatherer`` (:mod:`.machine_reads`), which holds the table and the cache (``cached_rows``
    is then None)."""
    set_threads(plan.producer_threads)
    device = torch.device("cpu") if plan.host_slots else trainer_device(plan)
    if plan.gather_in is GatherIn.MACHINE_READS:
        if gatherer is None:
            raise ValueError("producer: gather_in 'machine-reads' needs the machine's gatherer's address")
        remote = MachineRows(gatherer, plan, device)
        reader, loaded = remote, remote.table
    else:
        remote = None
        reader = feature_reader(plan, ds, device, cached_rows)
        loaded = table_ready(reader)
    try:
        tracer = ProducerTrace(device.type == "cuda") if plan.trace else None
        source = sample_source(plan, ds, batch_q, trainer_device(plan) if plan.on_gpu else device, tracer, stage)
        produce(plan, source, reader, RingWriter(plan, ds, device, ready_q, free_q, table=loaded), tracer)
    finally:
        if remote is not None:
            remote.close()  # after the ring's close, which waited for this process's GPU work


def group_sizes(limit: int) -> Iterator[int]:
    """The sizes of a phase's groups: 1, 1, 2, 2, 4, 4, ..., then ``limit`` from there on. Each
    size comes twice: while a group is gathered the trainer trains on the group before it, so a
    group as large as the one before needs only that the producer keep pace, and the minibatches
    ready in the ring grow until the next size; a group twice as large as the one before (sizes
    doubling at every group) would need the producer twice as fast as the trainer, or the
    trainer waits at every phase's start."""
    size = 1
    while size < limit:
        yield size
        yield size
        size *= 2
    yield from itertools.repeat(limit)


def produce(plan: Plan, source: Iterable[Union[Sampled, EpochMark]], reader: FeatureReader, ring: RingWriter,
            tracer: Optional[ProducerTrace]) -> None:
    """Gathers the minibatches of ``source`` through ``reader`` into ``ring``'s slots, in groups
    of :func:`group_sizes` up to ``plan.gather_batches`` from each phase's start (timed into
    ``tracer`` when given), forwarding each epoch mark after the minibatches before it (with the
    cache's hit counts when ``reader`` is a :class:`CachedTable`), then closes the ring."""
    flush = _Flush(reader, ring)
    hits = flush.hits
    if tracer is not None:
        flush = _TracedFlush(flush, tracer)
    group: List[Sampled] = []
    sizes = group_sizes(plan.gather_batches)  # of the groups from the phase's start
    size = next(sizes)
    for item in source:
        if isinstance(item, EpochMark):
            if group:  # the minibatches before a mark reach the trainer before it
                flush(group)
                group = []
            if hits is not None:
                item = replace(item, cache=hits.take(item.epoch, item.phase))
            ring.mark(item if tracer is None else replace(item, trace=tracer.take_all()))
            sizes = group_sizes(plan.gather_batches)
            size = next(sizes)
            continue
        group.append(item)
        if len(group) >= size:
            flush(group)
            group = []
            size = next(sizes)
    if group:
        flush(group)
    ring.close()
