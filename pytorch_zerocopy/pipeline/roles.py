"""The three roles of the training pipeline: sampler, producer and consumer.

Each role function runs in its own spawned process and communicates only through the queues
it is given. Slot ownership between producer and consumer is a pair of blocking queues
(``ready``: producer -> consumer, ``free``: consumer -> producer), so neither side sleeps or
polls; on a GPU, ordering of the GPU work itself is carried by one IPC-shared CUDA event per
slot and direction, recorded by the side that finished with the slot and waited on by the other
side's stream, so the hand-off costs one queue message and no host synchronisation per minibatch.

Ring contract: slot ``s`` belongs to the producer from the moment it takes ``s`` from ``free``
until it puts ``SlotReady(s)`` on ``ready``; then to the consumer until it puts ``s`` back. The
buffers themselves are shared once (``RingHandles``) and reshared only when a slot must grow.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections import Counter, defaultdict
from typing import Iterator, List, Optional

import torch

from ..datasets.base import NodeDataset
from ..datasets.base import shared_host_tensor
from ..unified import to_unified
from .gather import FeatureGather, to_device_async
from .messages import (RELEASED, EpochMark, FreeEvents, Minibatch, PipelineConfig, RingHandles,
                       SlotReady)
from .model import GraphSAGE
from .sampler import sample_blocks
from .trace import ConsumerTrace, ProducerTimings, ProducerTrace
from .train_step import make_train_step


def maybe_fail(cfg: PipelineConfig, role: str, step: int) -> None:
    """Fails the way ``cfg.inject_failure`` asks, if it names this role and minibatch (and this
    rank, when it names one)."""
    if cfg.inject_failure is None:
        return
    who, how, at, *only_rank = cfg.inject_failure
    if who != role or step != at or (only_rank and only_rank[0] != cfg.rank):
        return
    if how == "raise":
        raise RuntimeError(f"injected failure in the {role} at minibatch {step}")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exit":
        os._exit(3)
    raise ValueError(f"unknown injected failure {how!r}")


def resolve_device(name: str) -> torch.device:
    """``cfg.device`` as a device with an index (the current GPU when none is given)."""
    device = torch.device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def _set_threads(n: int) -> None:
    if n > 0:
        torch.set_num_threads(n)


# --- sampler ------------------------------------------------------------------------------


def epoch_batches(cfg: PipelineConfig, ds: NodeDataset, epoch: int, kind: str) -> List[torch.Tensor]:
    """The seed batches of one epoch: a shuffled training split, or the validation split in order.

    With several data-parallel ranks, every rank draws the same permutation and takes its own
    equal, disjoint slice of it, so all ranks run the same number of training steps (the
    gradient all-reduce needs that); validation runs over the whole split on every rank."""
    if kind == "train":
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)
        ids = ds.train_idx[torch.randperm(ds.train_idx.numel(), generator=gen)]
        if cfg.world_size > 1:
            per_rank = ids.numel() // cfg.world_size
            ids = ids[cfg.rank * per_rank:(cfg.rank + 1) * per_rank]
        limit = cfg.max_batches
    else:
        ids = ds.val_idx
        limit = cfg.val_batches
    batches = list(torch.split(ids, cfg.batch_size))
    return batches[:limit] if limit is not None else batches


def minibatch_seed(seed: int, epoch: int, kind: str, index: int) -> int:
    """A seed per minibatch, the same in every process and run."""
    return ((seed * 1_000_003 + epoch) * 2 + (kind == "val")) * 10_000_019 + index


def sampler_main(cfg: PipelineConfig, ds: NodeDataset, worker: int, batch_q, consumed, barrier=None) -> None:
    """Samples this worker's share (every ``num_samplers``-th minibatch) of every epoch.

    With several workers, ``barrier`` (a ``Barrier`` of ``num_samplers`` parties) holds each
    worker at the end of every phase (an epoch's training or validation minibatches) until all
    have finished it, so phases reach the trainer in order and per-epoch timings mean something.

    Tensors put on a queue are fetched from the sending process when received, so the sampler
    stays alive until the consumer sets ``consumed`` (an ``Event``) at the end of the run.
    """
    _set_threads(cfg.sampler_threads)
    step = 0
    replayed = {"train": [], "val": []}
    replay_turn = {"train": 0, "val": 0}
    for epoch in range(cfg.epochs):
        for kind in ("train", "val"):
            for i, seeds in enumerate(epoch_batches(cfg, ds, epoch, kind)):
                if i % cfg.num_samplers != worker:
                    continue
                maybe_fail(cfg, "sampler", step)
                step += 1
                pool = replayed[kind]
                if cfg.replay is not None and len(pool) >= cfg.replay:
                    sample = pool[replay_turn[kind] % len(pool)]
                    replay_turn[kind] += 1
                    batch = Minibatch.__new__(Minibatch)
                    batch.__dict__.update(sample.__dict__, kind=kind, epoch=epoch, step=i)
                else:
                    # One generator per minibatch: the sample does not depend on the worker count.
                    gen = torch.Generator().manual_seed(minibatch_seed(cfg.seed, epoch, kind, i))
                    input_nodes, output_nodes, blocks = sample_blocks(ds.indptr, ds.indices, seeds, cfg.fanouts, gen)
                    batch = Minibatch(kind, epoch, i, input_nodes, ds.labels[output_nodes], blocks)
                    if cfg.replay is not None:
                        pool.append(batch)
                batch_q.put(batch)
            batch_q.put(EpochMark(epoch, kind))
            if barrier is not None:
                barrier.wait()
    batch_q.put(None)
    consumed.wait()


# --- producer -----------------------------------------------------------------------------


def slot_capacity(cfg: PipelineConfig, ds: NodeDataset, budget_bytes: int = 2 << 30) -> int:
    """Initial rows per slot: the largest possible input set, capped by ``budget_bytes``."""
    bound = cfg.batch_size * math.prod(f + 1 if f > 0 else ds.num_nodes for f in cfg.fanouts)
    row_bytes = ds.feature_dim * ds.features.element_size()
    return max(1, min(ds.num_nodes, bound, budget_bytes // row_bytes))


def _new_slot(rows: int, ds: NodeDataset, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return torch.empty(rows, ds.feature_dim, dtype=ds.features.dtype, device=device)
    return shared_host_tensor((rows, ds.feature_dim), ds.features.dtype)


def _upload_packed(batch: Minibatch, packed: List[torch.Tensor], slot: int, device: torch.device):
    """Copies ``batch``'s packed tensor into GPU slot ``slot`` (growing it if needed) on the
    current stream; returns ``(the minibatch over the GPU copy, the new buffer or None)``."""
    m = batch.packed_numel
    grown = None
    if m > packed[slot].numel():
        packed[slot] = grown = torch.empty(max(m, packed[slot].numel() * 5 // 4), dtype=torch.int64, device=device)
    on_device = packed[slot][:m]
    # Staged through torch's pinned-memory cache: the staging block is reused only after the
    # copy has run, so the host never waits here.
    on_device.copy_(batch.packed.pin_memory(), non_blocking=True)
    return batch.with_packed(on_device), grown


def producer_main(cfg: PipelineConfig, ds: NodeDataset, batch_q, ready_q, free_q) -> None:
    """Gathers each minibatch's input features into a free ring slot and hands it over."""
    _set_threads(cfg.producer_threads)
    host_slots = cfg.gather in ("dma", "cpu") or cfg.device == "cpu"
    device = torch.device("cpu") if host_slots else resolve_device(cfg.device)
    gather = FeatureGather(ds.features, "cpu" if cfg.gather == "dma" else cfg.gather, device)
    rows = slot_capacity(cfg, ds)
    buffers = [_new_slot(rows, ds, device) for _ in range(cfg.num_slots)]
    on_gpu = device.type == "cuda"
    # GPU slots also carry each minibatch's packed tensor, uploaded here: the consumer then
    # receives a tensor-free description and copies nothing (room for the input ids, the
    # labels and about two edges per input node; grown like the feature buffers otherwise).
    packed = [torch.empty(3 * rows + cfg.batch_size, dtype=torch.int64, device=device)
              for _ in buffers] if on_gpu else []
    ready_events = [torch.cuda.Event(interprocess=True) for _ in buffers] if on_gpu else []
    if on_gpu:
        for ev in ready_events:  # an IPC handle needs a created event; recording creates it
            ev.record()
        torch.cuda.synchronize()
    ready_q.put(RingHandles(buffers, ready_events, packed))
    handshake = free_q.get()
    if not isinstance(handshake, FreeEvents):
        raise RuntimeError(f"producer: expected the consumer's events first, got {handshake!r}")
    free_events = handshake.events
    for s in range(cfg.num_slots):
        free_q.put(s)
    stream = torch.cuda.current_stream(device) if on_gpu else None
    tracer = ProducerTrace(stream) if cfg.trace else None

    # With GPU slots, ``cfg.gather_batches`` minibatches are gathered by one call: a minibatch's
    # rows are few and scattered over the whole table, so one gather of several minibatches'
    # rows walks each page of the table once for more rows (rows per second rise with rows per
    # call; benchmarks/results/gather_bandwidth.md). The rows then move to their slots by
    # device-to-device copies. Every minibatch of a group is ready when the group is.
    group_size = cfg.gather_batches if on_gpu else 1
    merged = None  # the group's rows, before they move to their slots
    pending: List[tuple] = []  # (minibatch, seconds waited for it)
    step = 0

    def flush() -> None:
        nonlocal merged
        if not pending:
            return
        t_slot = time.perf_counter()
        slots = [free_q.get() for _ in pending]
        t_issue = time.perf_counter()
        if on_gpu:
            for slot in slots:
                stream.wait_event(free_events[slot])  # the consumer's last use of the slot
        events = tracer.gather_events() if tracer is not None else None
        if events is not None:
            events[0].record(stream)
        parts = []  # per minibatch: slot, rows, what is sent, grown buffer, grown packed, ids
        for (item, _), slot in zip(pending, slots):
            n = item.input_nodes.numel()
            grown = None
            if n > buffers[slot].shape[0]:
                buffers[slot] = grown = _new_slot(max(n, buffers[slot].shape[0] * 5 // 4), ds, device)
            packed_grown, sent = None, item
            if on_gpu:
                item, packed_grown = _upload_packed(item, packed, slot, device)
                sent = item.with_packed(None)
            parts.append((slot, n, sent, grown, packed_grown, item.input_nodes))
        if len(parts) == 1:
            gather.gather_into(parts[0][5], buffers[parts[0][0]])
        else:
            total = sum(p[1] for p in parts)
            if merged is None or merged.shape[0] < total:
                merged = _new_slot(max(total, (merged.shape[0] * 5 // 4) if merged is not None else 0), ds, device)
            gather.gather_into(torch.cat([p[5] for p in parts]), merged)
            offset = 0
            for slot, n, *_ in parts:
                buffers[slot][:n].copy_(merged[offset:offset + n])
                offset += n
        if events is not None:
            events[1].record(stream)
        if on_gpu:
            for slot in slots:
                ready_events[slot].record(stream)
        if tracer is not None:
            tracer.gather_done(events, len(parts))
            issue = (time.perf_counter() - t_issue) / len(parts)
            for _, waited in pending:
                tracer.host_time("batch_wait_ms", waited)
                tracer.host_time("slot_wait_ms", (t_issue - t_slot) / len(parts))
                tracer.host_time("issue_ms", issue)
        for slot, n, sent, grown, packed_grown, _ in parts:
            timings = tracer.take() if tracer is not None else None
            ready_q.put(SlotReady(slot, n, sent, grown, timings, packed_grown))
        pending.clear()

    finished = 0
    while finished < cfg.num_samplers:
        t_get = time.perf_counter()
        item = batch_q.get()
        if item is None:
            finished += 1
            continue
        if isinstance(item, EpochMark):
            flush()  # the minibatches before a mark reach the consumer before it
            ready_q.put(item)
            continue
        maybe_fail(cfg, "producer", step)
        step += 1
        pending.append((item, time.perf_counter() - t_get))
        if len(pending) >= group_size:
            flush()
    flush()
    ready_q.put(None)
    # The consumer maps our buffers: keep them alive until it says it has dropped them.
    while free_q.get() != RELEASED:
        pass
    if on_gpu:
        torch.cuda.synchronize()


# --- consumer -----------------------------------------------------------------------------


class RingSource:
    """Consumer side of the ring: yields ``(features, minibatch)`` and gives slots back.

    With host slots and a CUDA trainer (the DMA path) each slot is registered once and copied
    to the GPU asynchronously on a copy stream; the slot returns to the producer as soon as its
    copy has completed, so CPU gathering, the copy and training overlap.
    """

    def __init__(self, cfg: PipelineConfig, ready_q, free_q, device: torch.device):
        self.ready_q, self.free_q, self.device, self.cfg = ready_q, free_q, device, cfg
        handles = ready_q.get()
        if not isinstance(handles, RingHandles):
            raise RuntimeError(f"consumer: expected the ring's buffers first, got {handles!r}")
        self.buffers = list(handles.buffers)
        self.ready_events = list(handles.ready_events)
        self.packed = list(handles.packed)
        self.gpu_slots = self.buffers[0].device.type == "cuda"
        self.copy_in = (not self.gpu_slots) and device.type == "cuda"
        if self.gpu_slots:
            self.free_events = [torch.cuda.Event(interprocess=True) for _ in self.buffers]
            for ev in self.free_events:
                ev.record()
            torch.cuda.synchronize()
        else:
            self.free_events = []
        if self.copy_in:
            self._mapped = [to_unified(b) for b in self.buffers]  # page-locks them: async copies
            self.copy_stream = torch.cuda.Stream(device)
        self.free_q.put(FreeEvents(self.free_events))
        self._copy_done = None

    def __iter__(self) -> Iterator:
        finished = False
        while not finished:
            item = self.ready_q.get()
            if item is None:
                finished = True
                continue
            if isinstance(item, EpochMark):
                yield item, None
                continue
            if item.buffer is not None or item.packed_buffer is not None:
                if self.gpu_slots:
                    # The producer may reuse the old buffer's memory as soon as we drop it:
                    # finish our queued reads of it first (rare: slots grow a few times at most).
                    torch.cuda.current_stream(self.device).synchronize()
                if item.buffer is not None:
                    self.buffers[item.slot] = item.buffer
                    if self.copy_in:
                        self._mapped[item.slot] = to_unified(item.buffer)
                if item.packed_buffer is not None:
                    self.packed[item.slot] = item.packed_buffer
            view = self.buffers[item.slot][: item.rows]
            if self.gpu_slots:
                torch.cuda.current_stream(self.device).wait_event(self.ready_events[item.slot])
                item.batch = item.batch.with_packed(self.packed[item.slot][: item.batch.packed_numel])
                yield item, view
            elif self.copy_in:
                compute = torch.cuda.current_stream(self.device)
                with torch.cuda.stream(self.copy_stream):
                    feats = view.to(self.device, non_blocking=True)
                    done = torch.cuda.Event()
                    done.record(self.copy_stream)
                compute.wait_event(done)
                feats.record_stream(compute)
                self._copy_done = done
                yield item, feats
            else:
                yield item, view

    def release(self, item: SlotReady) -> None:
        if self.gpu_slots:
            self.free_events[item.slot].record(torch.cuda.current_stream(self.device))
        elif self.copy_in:
            self._copy_done.synchronize()  # the host slot may be refilled once copied out
        self.free_q.put(item.slot)

    def close(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.buffers, self.ready_events, self.free_events, self._mapped, self.packed = [], [], [], [], []
        self.free_q.put(RELEASED)


class InlineSource:
    """The trainer gathers itself (``cpu``, ``naive``, ``gpu`` modes and the green partition).

    With ``side_stream`` the gather of minibatch ``i+1`` is issued on that stream before
    minibatch ``i`` is handed out, so on a partitioned GPU the two run concurrently.
    """

    def __init__(self, cfg: PipelineConfig, ds: NodeDataset, batch_q, device: torch.device,
                 side_stream: Optional["torch.cuda.Stream"] = None):
        self.cfg, self.batch_q, self.device, self.side = cfg, batch_q, device, side_stream
        self.gather = FeatureGather(ds.features, cfg.gather, device)
        self.step = 0

    def _items(self):
        finished = 0
        while finished < self.cfg.num_samplers:
            item = self.batch_q.get()
            if item is None:
                finished += 1
            else:
                yield item

    def _fetch(self, batch: Minibatch):
        maybe_fail(self.cfg, "producer", self.step)
        self.step += 1
        n = batch.input_nodes.numel()
        if self.device.type != "cuda":
            return SlotReady(-1, n, batch), self.gather.gather(batch.input_nodes), None
        # One upload of the packed minibatch; the gather takes its ids from the GPU copy.
        with torch.cuda.stream(self.side or torch.cuda.current_stream(self.device)):
            batch = batch.with_packed(to_device_async(batch.packed, self.device))
            feats = self.gather.gather(batch.input_nodes).to(self.device)
            if self.side is None:
                return SlotReady(-1, n, batch), feats, None
            done = torch.cuda.Event()
            done.record(self.side)
        return SlotReady(-1, n, batch), feats, done

    def __iter__(self) -> Iterator:
        pending = None
        for item in self._items():
            if isinstance(item, EpochMark):
                if pending is not None:
                    yield self._hand_out(pending)
                    pending = None
                yield item, None
                continue
            fetched = self._fetch(item)
            if self.side is None:
                yield fetched[0], fetched[1]
                continue
            if pending is not None:
                yield self._hand_out(pending)
            pending = fetched
        if pending is not None:
            yield self._hand_out(pending)

    def _hand_out(self, fetched):
        ready, feats, done = fetched
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(done)
        feats.record_stream(compute)
        ready.batch.packed.record_stream(compute)
        return ready, feats

    def release(self, item) -> None:
        pass

    def close(self) -> None:
        pass


def consumer_main(cfg: PipelineConfig, ds: NodeDataset, source_kind: str, queues, report) -> None:
    """Trains GraphSAGE on the minibatches the source yields; reports progress to ``report``.

    ``report(message)`` receives ``("step", kind, epoch, feature_bytes)`` per minibatch and
    ``("epoch", stats)`` per epoch. Steady-state statistics (``steady_*``) leave out each
    epoch's first training minibatch; ``steady_wait_seconds`` is the part of that time the
    trainer spent blocked on its next minibatch (the input pipeline limiting the run).
    """
    _set_threads(cfg.consumer_threads)
    device = resolve_device(cfg.device)
    side = None
    if source_kind == "ring":
        source = RingSource(cfg, queues["ready"], queues["free"], device)
    else:
        if cfg.partition == "green":
            from .partition import green_streams

            side, compute, info = green_streams(device, cfg.producer_sms)
            report(("partition", info))
            torch.cuda.set_stream(compute)
        source = InlineSource(cfg, ds, queues["batch"], device, side)

    torch.manual_seed(cfg.seed)
    model = GraphSAGE(ds.feature_dim, cfg.hidden, ds.num_classes, len(cfg.fanouts), cfg.dropout).to(device)
    train_step = make_train_step(model, cfg, device)  # joins the process group with several ranks
    row_bytes = ds.feature_dim * ds.features.element_size()
    marks: Counter = Counter()
    # With several sampler workers, one epoch's validation minibatches (or the next epoch's
    # training ones) may arrive before another worker's last training minibatch: statistics
    # are kept per epoch and an epoch is reported once all its marks have arrived, in order.
    stats = defaultdict(_new_stats)
    traces = defaultdict(lambda: ConsumerTrace(device.type == "cuda"))  # per epoch, with cfg.trace
    producer_timings = ProducerTimings()
    complete: set = set()
    next_report = 0
    train_clock = None  # when the current training phase began
    step = 0

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    incoming = iter(source)
    while True:
        # Time the trainer spends blocked on its next minibatch: near zero when the input
        # pipeline keeps ahead, most of the step when it is what limits the run.
        t_wait = time.perf_counter()
        try:
            item, feats = next(incoming)
        except StopIteration:
            break
        waited = time.perf_counter() - t_wait
        if isinstance(item, EpochMark):
            marks[(item.epoch, item.kind)] += 1
            if marks[(item.epoch, item.kind)] < cfg.num_samplers:
                continue
            st = stats[item.epoch]
            if item.kind == "train":
                sync()
                now = time.perf_counter()
                st["train_seconds"] = now - (train_clock if train_clock is not None else now)
                train_clock = now
                st["loss"] = float(st["loss_sum"]) / max(1, st["train_batches"])
                if st["train_batches"] >= 2:
                    st["steady_seconds"] = now - st["steady_t0"]
                    st["steady_batches"] = st["train_batches"] - 1
                    st["steady_bytes"] += st["feature_bytes"]
                else:
                    st["steady_bytes"] = 0
                if cfg.trace:
                    st["trace"] = (traces.pop(item.epoch, None) or ConsumerTrace(False)).summary(producer_timings)
            else:
                st["val_acc"] = float(st["correct"]) / max(1, st["val_nodes"])
                sync()
                train_clock = time.perf_counter()  # validation time is not training time
            complete.add((item.epoch, item.kind))
            while (next_report, "train") in complete and (next_report, "val") in complete:
                done = stats.pop(next_report)
                done["epoch"] = next_report
                for key in ("loss_sum", "correct", "steady_t0"):
                    done.pop(key, None)
                done["train_step"] = train_step.summary()
                done["param_checksum"] = float(sum(p.detach().double().abs().sum() for p in model.parameters()))
                report(("epoch", done))
                next_report += 1
            continue

        batch = item.batch
        st = stats[batch.epoch]
        if train_clock is None:
            train_clock = time.perf_counter()
        maybe_fail(cfg, "consumer", step)
        step += 1
        tracing = cfg.trace and batch.kind == "train"
        if cfg.trace:
            producer_timings.add(item.trace)
        if tracing:
            traces[batch.epoch].step_begins(waited)
        on_device = batch.with_packed(to_device_async(batch.packed, device))  # one copy for all
        if tracing:
            traces[batch.epoch].inputs_copied()
        blocks, labels = on_device.blocks, on_device.labels
        if feats.dtype != torch.float32:
            feats = feats.float()
        if batch.kind == "train":
            if st["train_batches"] >= 1:  # inside the steady-state window
                st["steady_wait_seconds"] += waited
            model.train()
            loss = train_step(blocks, feats, labels)
            if tracing:
                traces[batch.epoch].step_ends()
            st["loss_sum"] = st["loss_sum"] + loss
            st["train_batches"] += 1
            st["feature_bytes"] += item.rows * row_bytes
            if st["train_batches"] == 1:
                # Steady-state clock: from the end of the epoch's first minibatch, which carries
                # the pipeline's fill (or its head start), to the end of the last.
                sync()
                st["steady_t0"] = time.perf_counter()
                st["steady_bytes"] = -item.rows * row_bytes
        else:
            model.eval()
            with torch.no_grad():
                pred = model(blocks, feats).argmax(1)
            st["correct"] = st["correct"] + (pred == labels).sum()
            st["val_nodes"] += labels.numel()
        del feats, blocks
        source.release(item)
        report(("step", batch.kind, batch.epoch, item.rows * row_bytes))
    source.close()
    train_step.close()  # before the process group: graphs holding NCCL work would block its end
    if cfg.world_size > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    queues["consumed"].set()


def _new_stats() -> dict:
    return {"train_seconds": 0.0, "train_batches": 0, "feature_bytes": 0, "loss_sum": 0.0,
            "loss": float("nan"), "correct": 0, "val_nodes": 0, "val_acc": float("nan"),
            "steady_seconds": float("nan"), "steady_batches": 0, "steady_bytes": 0, "steady_wait_seconds": 0.0}
