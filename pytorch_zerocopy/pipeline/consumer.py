"""The trainer (the pipeline's consumer): trains GraphSAGE on the minibatches its source yields
and reports progress and per-epoch statistics to the parent.

Its source is the ring (``Plan.gather_in`` producer: :class:`~.ring.RingReader`; ``machine``:
the same over its connection to the machine's gatherer, :mod:`.machine`) or
:class:`InlineSource`, which gathers in this process (``trainer``), sampling on the GPU here too
when the plan says so.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from dataclasses import replace
from typing import Dict, Iterator, Optional

import torch

from .._process import release_free_memory
from ..datasets.base import NodeDataset
from ..nn import GraphSAGE
from ..feature_table import CachedTable
from ..placement import to_device_async
from . import checkpoint
from .gather import CacheHits, feature_reader, table_ready
from .messages import EpochMark, Minibatch, SlotReady, StepDone
from .machine import connect
from .minibatches import GpuSampler, Sampled, from_samplers, run_phases, trainer_seed
from .plan import GatherIn, Partition, Phase, Plan, SampleOn
from .process import failing, set_threads, trainer_device
from .ring import RingReader
from .stats import EpochAccumulator
from .trace import NO_TRACE, ProducerTrace, TrainerTrace, timed_read
from .train_step import make_train_step


class InlineSource:
    """The trainer gathers itself (``cpu``, ``zerocopy-naive`` and ``gpu`` modes, the green
    partition): yields ``(SlotReady, features)`` (slot ``-1``) and ``(EpochMark, None)``.

    Minibatches come from the sampler processes or, sampling on the GPU, from a
    :class:`~.minibatches.GpuSampler` in this process (its next sample runs while the current
    minibatch is gathered and trained). With ``side_stream`` the gather of minibatch ``i+1`` is
    issued on that stream before minibatch ``i`` is handed out, so on a partitioned GPU the two
    run concurrently. With ``cached_rows`` the gather runs through a cache of those rows on
    ``device``, and each epoch mark carries its hit counts.
    """

    def __init__(self, plan: Plan, ds: NodeDataset, batch_q, device: torch.device,
                 side_stream: Optional["torch.cuda.Stream"] = None, cached_rows: Optional[torch.Tensor] = None):
        self.device, self.side = device, side_stream
        self.reader = reader = feature_reader(plan, ds, device, cached_rows)
        self.hits = CacheHits(reader) if isinstance(reader, CachedTable) else None
        trace = ProducerTrace(device.type == "cuda") if plan.trace else None
        if plan.sample_on is SampleOn.GPU:
            items = GpuSampler(plan, ds, device, ahead=1, trace=trace)
        else:
            items = from_samplers(batch_q, plan.mark_sources)
        # The stages, chosen once: the read and the message timed with a trace, the source
        # behind the producer's injected failure when the plan names one.
        self.items = failing(items, plan, "producer")
        self.read = reader.read if trace is None else timed_read(reader.read, trace)
        self.message = _message if trace is None else functools.partial(_traced_message, trace)

    def _fetch(self, sampled: Sampled):
        batch, n = sampled.batch, sampled.batch.layout.input_rows
        if self.device.type != "cuda":
            feats = self.read(batch.input_nodes, check_bounds=False)
            if self.hits is not None:
                self.hits.add(batch.epoch, batch.phase, batch.input_nodes)
            return self.message(sampled, batch, n), feats, None
        stream = self.side or torch.cuda.current_stream(self.device)
        with torch.cuda.stream(stream):
            if sampled.ready is not None:
                stream.wait_event(sampled.ready)
                batch.packed.record_stream(stream)
            # One upload of a CPU-sampled minibatch; the gather takes its ids from that copy.
            batch = batch.with_packed(to_device_async(batch.packed, self.device))
            feats = self.read(batch.input_nodes, check_bounds=False)  # issued on ``stream``
            if self.hits is not None:
                self.hits.add(batch.epoch, batch.phase, batch.input_nodes)
            done = None
            if self.side is not None:
                done = torch.cuda.Event()
                done.record(self.side)
        return self.message(sampled, batch, n), feats, done

    def __iter__(self) -> Iterator:
        pending = None
        for item in self.items:
            if isinstance(item, EpochMark):
                if pending is not None:
                    yield self._hand_out(pending)
                    pending = None
                if self.hits is not None:
                    item = replace(item, cache=self.hits.take(item.epoch, item.phase))
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


def _message(sampled: Sampled, batch: Minibatch, rows: int) -> SlotReady:
    """The message of an inline minibatch (slot ``-1``)."""
    return SlotReady(-1, rows, batch)


def _traced_message(trace: ProducerTrace, sampled: Sampled, batch: Minibatch, rows: int) -> SlotReady:
    """:func:`_message` carrying ``trace``'s timings complete so far, ``sampled``'s included."""
    trace.sampled(sampled)
    return SlotReady(-1, rows, batch, trace=trace.take())


def consumer_main(plan: Plan, ds: NodeDataset, queues: Dict, cached_rows: Optional[torch.Tensor], report) -> None:
    """Trains on every minibatch of the run; ``report(("progress", message))`` sends the
    gathering process's :class:`~.messages.TableReady` first, a
    :class:`~.messages.StepDone` per minibatch, a :class:`~.messages.PartitionInfo` (green
    partition) and an :class:`~.stats.EpochStats` per epoch, in epoch order. ``cached_rows``:
    the rows of the feature cache when this process gathers (``Plan.gather_in`` trainer).

    Randomness: the model starts from ``plan.seed``; the random stream dropout draws from is
    reseeded when each epoch's training begins (:func:`~.minibatches.trainer_seed`), so an
    epoch trains the same whether the run began with it or before it.

    Checkpoints (:mod:`.checkpoint`): a resumed run loads its checkpoint before its first step
    (so before any CUDA graph is captured). With ``plan.checkpoint_dir``, rank 0 copies the
    training state when an epoch's training ends and writes it once the epoch is complete,
    before reporting the epoch: a reported epoch is a checkpointed one."""
    set_threads(plan.consumer_threads)
    device = trainer_device(plan)

    def send(message) -> None:
        report(("progress", message))

    if plan.gather_in.producer:
        source = RingReader(queues["ready"], queues["free"], device)
        loaded = source.table
    elif plan.gather_in is GatherIn.MACHINE:
        link = connect(queues["gatherer"], plan)
        source = RingReader(link, link, device)
        loaded = source.table
    else:
        side = None
        if plan.partition is Partition.GREEN:
            from .partition import green_streams

            side, compute, info = green_streams(device, plan.producer_sms)
            send(info)
            torch.cuda.set_stream(compute)
        source = InlineSource(plan, ds, queues.get("batch"), device, side, cached_rows)
        loaded = table_ready(source.reader)
    if loaded is not None:
        send(loaded)

    torch.manual_seed(plan.seed)
    model = GraphSAGE(ds.feature_dim, plan.hidden, ds.num_classes, len(plan.fanouts), plan.dropout).to(device)
    train_step = make_train_step(model, plan, device)  # joins the process group with several ranks
    if plan.first_epoch:
        checkpoint.restore_for(plan, ds, model, train_step.opt)
    run = checkpoint.RunIdentity.of(plan, ds)
    writes_checkpoints = plan.checkpoint_dir is not None and plan.rank == 0
    ended_training: Dict[int, checkpoint.TrainingState] = {}  # per epoch, until it is written
    seeded_epoch = -1  # the latest epoch whose training the random stream was seeded for
    row_bytes = ds.row_bytes
    on_gpu = device.type == "cuda"
    marks: Counter = Counter()
    # With several sampler processes, one epoch's validation minibatches (or the next epoch's
    # training ones) may arrive before another sampler's last training minibatch: statistics
    # are kept per epoch and an epoch is reported once all its marks have arrived, in order.
    epochs: Dict[int, EpochAccumulator] = {}
    trace = TrainerTrace(on_gpu) if plan.trace else NO_TRACE  # the steps' timing hook, chosen once
    complete: set = set()
    next_report = plan.first_epoch
    train_clock = None  # when the current training phase began

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    def epoch(e: int) -> EpochAccumulator:
        if e not in epochs:
            epochs[e] = EpochAccumulator(e)
        return epochs[e]

    incoming = iter(failing(source, plan, "consumer", lambda got: not isinstance(got[0], EpochMark)))
    while True:
        # Time the trainer spends blocked on its next minibatch: near zero when the input
        # keeps ahead, most of the step when it is what limits the run.
        t_wait = time.perf_counter()
        try:
            item, feats = next(incoming)
        except StopIteration:
            break
        waited = time.perf_counter() - t_wait
        if isinstance(item, EpochMark):
            trace.mark_arrives(item)
            if item.cache is not None and item.phase is Phase.TRAIN:
                epoch(item.epoch).cache_counted(item.cache)
            marks[(item.epoch, item.phase)] += 1
            if marks[(item.epoch, item.phase)] < plan.mark_sources:
                continue
            acc = epoch(item.epoch)
            if item.phase is Phase.TRAIN:
                sync()
                now = time.perf_counter()
                acc.end_training(train_clock if train_clock is not None else now, now)
                train_clock = now
                if writes_checkpoints:
                    ended_training[item.epoch] = checkpoint.TrainingState.capture(model, train_step.opt)
                acc.stats.trace = trace.epoch_summary(item.epoch)
            elif item.phase is Phase.VAL:
                acc.end_validation()
                sync()
                train_clock = time.perf_counter()  # validation time is not training time
            else:
                acc.end_test()
            complete.add((item.epoch, item.phase))
            while next_report in epochs and all((next_report, p) in complete for p in run_phases(plan, next_report)):
                stats = epochs.pop(next_report).stats
                stats.train_step = train_step.summary()
                stats.param_checksum = float(sum(p.detach().double().abs().sum() for p in model.parameters()))
                if writes_checkpoints:
                    checkpoint.save(plan.checkpoint_dir,
                                    checkpoint.Checkpoint(next_report, run, ended_training.pop(next_report)))
                send(stats)
                release_free_memory()  # the epoch's freed host blocks go back to the kernel
                next_report += 1
            continue

        batch = item.batch
        acc = epoch(batch.epoch)
        if train_clock is None:
            train_clock = time.perf_counter()
        trace.step_begins(item, waited)
        on_device = batch.with_packed(to_device_async(batch.packed, device))  # one copy for all
        trace.inputs_copied()
        blocks, labels = on_device.blocks, on_device.labels
        if feats.dtype != torch.float32:
            feats = feats.float()
        feature_bytes = item.rows * row_bytes
        if batch.phase is Phase.TRAIN:
            if batch.epoch > seeded_epoch:
                torch.manual_seed(trainer_seed(plan.seed, batch.epoch, plan.rank))
                seeded_epoch = batch.epoch
            model.train()
            loss = train_step(blocks, feats, labels)
            trace.step_ends()
            acc.trained(loss, feature_bytes, waited, sync)
        else:
            model.eval()
            with torch.no_grad():
                correct = (model(blocks, feats).argmax(1) == labels).sum()
            if batch.phase is Phase.VAL:
                acc.validated(correct, labels.numel())
            else:
                acc.tested(correct, labels.numel())
        del feats, blocks
        source.release(item)
        send(StepDone(batch.phase, batch.epoch, feature_bytes))
    source.close()
    train_step.close()  # before the process group: graphs holding NCCL work would block its end
    if plan.world_size > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    queues["consumed"].set()
