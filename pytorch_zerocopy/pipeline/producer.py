"""The producer: gathers each minibatch's input features into a free ring slot and hands the
slot to the trainer (:mod:`.ring`).

Its minibatches come from the sampler processes (``Plan.sample_on`` cpu) or from its own
:class:`~.minibatches.GpuSampler` (``gpu``): then sampling runs in this process, on the GPU it
gathers on (inside its MPS partition), on a stream of its own, the next minibatches' samples in
flight while the current ones are gathered, and the blocks reach the slot by a device-to-device
copy; they never leave the GPU or cross a process.

Cache: with ``cached_rows`` (chosen by the parent for ``Plan.cache``) the producer holds those
rows in its GPU's memory and gathers through them; each epoch mark it forwards carries the
cache's hit counts over the minibatches of that phase.

Groups: ``Plan.gather_batches`` minibatches are gathered by one call: a minibatch's rows are
few and scattered over the whole table, so one gather of several minibatches' rows walks each
page of the table once for more rows (rows per second rise with rows per call). The rows then
move to their slots by device-to-device copies. Every minibatch of a group is ready when the
group is.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import List, Optional

import torch

from ..datasets.base import NodeDataset
from .gather import CacheHits, FeatureGather
from .messages import EpochMark
from .minibatches import GpuSampler, Sampled, from_samplers
from .plan import Plan, SampleOn
from .process import maybe_fail, set_threads, trainer_device
from .ring import RingWriter
from .trace import ProducerTrace


class _GroupGather:
    """Gathers a group's rows into its slots: one call straight into the slot for one
    minibatch, else one call into a staging buffer and a copy per slot."""

    def __init__(self, gather: FeatureGather, ring: RingWriter):
        self.gather, self.ring = gather, ring
        self.merged: Optional[torch.Tensor] = None

    def __call__(self, slots: List[int], batches) -> None:
        if len(slots) == 1:
            b = batches[0]
            self.gather.gather_into(b.input_nodes, self.ring.rows(slots[0], b.layout.input_rows))
            return
        total = sum(b.layout.input_rows for b in batches)
        if self.merged is None or self.merged.shape[0] < total:
            current = self.merged.shape[0] if self.merged is not None else 0
            self.merged = self.ring.feature_buffer(max(total, current * 5 // 4))
        self.gather.gather_into(torch.cat([b.input_nodes for b in batches]), self.merged)
        offset = 0
        for slot, b in zip(slots, batches):
            n = b.layout.input_rows
            self.ring.rows(slot, n).copy_(self.merged[offset:offset + n])
            offset += n


def producer_main(plan: Plan, ds: NodeDataset, batch_q, ready_q, free_q,
                  cached_rows: Optional[torch.Tensor] = None) -> None:
    """Fills ring slots until the minibatches of the run are done (see the module docstring)."""
    set_threads(plan.producer_threads)
    device = torch.device("cpu") if plan.host_slots else trainer_device(plan)
    on_gpu = device.type == "cuda"
    gather = FeatureGather(ds.features, plan.mode, device, cached_rows, plan.host_memory)
    hits = CacheHits(gather.cache) if gather.cache is not None else None
    tracer = ProducerTrace(on_gpu) if plan.trace else None
    if plan.sample_on is SampleOn.GPU:
        source = GpuSampler(plan, ds, device, ahead=plan.gather_batches, trace=tracer)
    else:
        source = from_samplers(batch_q, plan.mark_sources)
    ring = RingWriter(plan, ds, device, ready_q, free_q)
    stream = ring.stream
    gather_group = _GroupGather(gather, ring)
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
            packed = sampled.batch.packed
            if sampled.ready is not None:
                stream.wait_event(sampled.ready)  # the sample is complete on its stream
                packed.record_stream(stream)
            batches.append(ring.load(slot, sampled.batch))
        span = tracer.span() if tracer is not None else None
        if span is not None:
            span[0].record(stream)
        t_gather = time.perf_counter()
        gather_group(slots, batches)
        if tracer is not None:
            if span is not None:
                span[1].record(stream)
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
            ring.publish(slot, batch, tracer.take() if tracer is not None else None)
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
