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
minibatch: the process that gathers owns the table.

Cache: with ``cached_rows`` (chosen by the parent for ``Plan.cache``) the producer holds those
rows in its GPU's memory and gathers through them; each epoch mark it forwards carries the
cache's hit counts over the minibatches of that phase.

Groups: ``Plan.gather_batches`` minibatches are gathered by one call: a minibatch's rows are
few and scattered over the whole table, so one gather of several minibatches' rows walks each
page of the table once for more rows (rows per second rise with rows per call). The rows then
move to their slots by device-to-device copies, on a stream of their own that overlaps them
with the next group's gather. Every minibatch of a group is ready when the group is.

Grid: ``Plan.gather_tuning`` reaches the gather op as arguments (it may bound the kernel's grid
to a few blocks per SM of the producer's share).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Iterator, List, Optional, Union

import torch

from ..datasets.base import NodeDataset
from ..feature_table import CachedTable, FeatureReader
from .gather import CacheHits, feature_reader, gather_into, table_ready
from .messages import EpochMark
from .minibatches import GpuSampler, SampleStage, Sampled, from_samplers, sample_here
from .plan import Plan, SampleOn
from .process import maybe_fail, set_threads, trainer_device
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


def sample_source(plan: Plan, ds: NodeDataset, batch_q, device: torch.device, tracer: Optional[ProducerTrace],
                  stage: SampleStage = SampleStage()) -> Iterator[Union[Sampled, EpochMark]]:
    """Where the process that gathers takes its minibatches from: its own
    :class:`~.minibatches.GpuSampler` on ``device`` (``Plan.sample_on`` gpu), the sampler
    processes' ``batch_q``, or, with no sampler process (the machine's gatherer on the CPU),
    its own calls of the CPU sampling op."""
    if plan.sample_on is SampleOn.GPU:
        return iter(GpuSampler(plan, ds, device, ahead=plan.gather_batches, trace=tracer, stage=stage))
    if plan.sampler_processes:
        return from_samplers(batch_q, plan.mark_sources)
    return sample_here(plan, ds, stage)


def producer_main(plan: Plan, ds: NodeDataset, batch_q, ready_q, free_q,
                  cached_rows: Optional[torch.Tensor] = None, stage: SampleStage = SampleStage()) -> None:
    """Fills ring slots until the minibatches of the run are done (see the module docstring);
    ``stage``: what its :class:`~.minibatches.GpuSampler` samples, when it samples."""
    set_threads(plan.producer_threads)
    device = torch.device("cpu") if plan.host_slots else trainer_device(plan)
    reader = feature_reader(plan, ds, device, cached_rows)
    tracer = ProducerTrace(device.type == "cuda") if plan.trace else None
    source = sample_source(plan, ds, batch_q, trainer_device(plan) if plan.on_gpu else device, tracer, stage)
    produce(plan, source, reader, RingWriter(plan, ds, device, ready_q, free_q, table=table_ready(reader)), tracer)


def produce(plan: Plan, source: Iterator[Union[Sampled, EpochMark]], reader: FeatureReader, ring: RingWriter,
            tracer: Optional[ProducerTrace]) -> None:
    """Gathers the minibatches of ``source`` through ``reader`` into ``ring``'s slots, groups
    of ``plan.gather_batches``, forwarding each epoch mark after the minibatches before it (with
    the cache's hit counts when ``reader`` is a :class:`CachedTable`), then closes the ring."""
    hits = CacheHits(reader) if isinstance(reader, CachedTable) else None
    stream = ring.stream
    gather_group = _GroupGather(reader, ring)
    group: List[Sampled] = []
    step = 0

    def flush() -> None:
        if not group:
            return
        t_slot = time.perf_counter()
        slots = ring.take(len(group))
        t_issue = time.perf_counter()
        batches = []
        for sampled, slot in zip(group, slots):
            batch, packed = sampled.batch, sampled.batch.packed
            if sampled.ready is not None and stream is None:  # a GPU sample for host slots
                sampled.ready.synchronize()
                batch = batch.with_packed(packed.cpu())
            elif sampled.ready is not None:
                stream.wait_event(sampled.ready)  # the sample is complete on its stream
                packed.record_stream(stream)
            batches.append(ring.load(slot, batch))
        span = tracer.span() if tracer is not None else None
        if span is not None:
            span[0].record(stream)
        t_gather = time.perf_counter()
        complete_on = gather_group(slots, batches)
        if tracer is not None:
            if span is not None:
                span[1].record(complete_on)
                tracer.gpu("gather_ms", [span], len(group))
            else:
                tracer.host("gather_ms", time.perf_counter() - t_gather, len(group))
            tracer.host("issue_ms", time.perf_counter() - t_issue, len(group))
            for sampled in group:
                tracer.host("batch_wait_ms", sampled.waited)
                tracer.host("slot_wait_ms", (t_issue - t_slot) / len(group))
                if sampled.spans:
                    tracer.gpu("sample_ms", sampled.spans)
                elif sampled.batch.sample_ms:
                    tracer.value("sample_ms", sampled.batch.sample_ms)
        for slot, batch in zip(slots, batches):
            ring.publish(slot, batch, tracer.take() if tracer is not None else None, complete_on)
        if hits is not None:  # counted after the slots' ready events: the trainer does not wait for it
            for b in batches:
                hits.add(b.epoch, b.phase, b.input_nodes)
        group.clear()

    for item in source:
        if isinstance(item, EpochMark):
            flush()  # the minibatches before a mark reach the trainer before it
            ring.mark(item if hits is None else replace(item, cache=hits.take(item.epoch, item.phase)))
            continue
        maybe_fail(plan, "producer", step)
        step += 1
        group.append(item)
        if len(group) >= plan.gather_batches:
            flush()
    flush()
    ring.close()
