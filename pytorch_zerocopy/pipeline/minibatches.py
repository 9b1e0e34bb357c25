"""The minibatches of a run: which seeds each one has, and sampling them with the library's
sampling op (:func:`pytorch_zerocopy.sampling.sample_layers`), on the CPU or on the GPU.

Every minibatch is identified by ``(epoch, phase, index)``; its seeds come from a permutation
drawn from ``(plan.seed, epoch)`` and its sample from :func:`minibatch_seed`, so a run gives
the same minibatches whatever the number of sampler processes or threads, and the CPU and GPU
kernels give identical uniform samples for the same minibatch.

The graph sampled is ``dataset.graph``, whose rows are in-neighbour lists (see
:class:`~pytorch_zerocopy.datasets.NodeDataset`): :func:`sample_blocks` reads the rows as
stored (``edge_dir='out'`` of :func:`~pytorch_zerocopy.sampling.sample_layers`), so sampling
needs no transpose, and block edges run from the sampled in-neighbour to its seed.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from .. import sampling as _sampling
from ..block import Block
from ..datasets.base import NodeDataset
from ..graph import CSRGraph
from ..placement import cat_to_device_async
from .messages import EpochMark, Minibatch
from .plan import Phase, Plan
from .trace import ProducerTrace, Span, TracedSampling


@dataclass(frozen=True)
class SeedBatch:
    """The seeds of minibatch ``index`` of ``epoch``'s ``phase``; ``sample_seed``: the seed of
    its random draws where whoever made the batch chose it (a loader's process way; the
    training run derives its seeds with :func:`minibatch_seed`); ``carried``: int64 values the
    batch's maker sends along to be packed as the minibatch's labels part (a loader's: PyG's
    input ids), None where the stage's labels are the seeds' own."""

    phase: Phase
    epoch: int
    index: int
    seeds: torch.Tensor
    sample_seed: Optional[int] = None
    carried: Optional[torch.Tensor] = None

    def __reduce__(self):
        # Pickled by value (the seeds are a few KB of host memory): a tensor put on a
        # multiprocessing queue travels as a shared-memory handle, whose receiver opens a
        # connection to the sender's process for every tensor, on the sampling role's path.
        carried = None if self.carried is None else self.carried.numpy()
        return (_seed_batch, (self.phase, self.epoch, self.index, self.seeds.numpy(), self.sample_seed, carried))


def _seed_batch(phase: Phase, epoch: int, index: int, seeds, sample_seed: Optional[int], carried=None) -> SeedBatch:
    return SeedBatch(phase, epoch, index, torch.from_numpy(seeds), sample_seed,
                     None if carried is None else torch.from_numpy(carried))


def epoch_batches(plan: Plan, ds: NodeDataset, epoch: int, phase: Phase) -> List[torch.Tensor]:
    """The seed batches of one epoch's phase: a shuffled training split, or the validation
    (test) split in order, at most ``plan.val_batches`` of them.

    With several data-parallel ranks, every rank draws the same permutation and takes its own
    equal, disjoint slice of it, so all ranks run the same number of training steps (the
    gradient all-reduce needs that); validation runs over the whole split on every rank."""
    if phase is Phase.TRAIN:
        gen = torch.Generator().manual_seed(plan.seed * 1_000_003 + epoch)
        ids = ds.train_idx[torch.randperm(ds.train_idx.numel(), generator=gen)]
        if plan.world_size > 1:
            per_rank = ids.numel() // plan.world_size
            ids = ids[plan.rank * per_rank:(plan.rank + 1) * per_rank]
        limit = plan.max_batches
    else:
        ids = ds.val_idx if phase is Phase.VAL else ds.test_idx
        limit = plan.val_batches
    batches = list(torch.split(ids, plan.batch_size))
    return batches[:limit] if limit is not None else batches


_PHASE_CODE = {Phase.TRAIN: 0, Phase.VAL: 1, Phase.TEST: 2}


def minibatch_seed(seed: int, epoch: int, phase: Phase, index: int) -> int:
    """The sampling seed of one minibatch, the same in every process, run and device (a
    non-negative int64)."""
    return (((seed * 1_000_003 + epoch) * 3 + _PHASE_CODE[phase]) * 10_000_019 + index) & ((1 << 63) - 1)


def trainer_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of the trainer's random stream (dropout) when ``epoch``'s training begins on
    ``rank``: what the trainer draws is then a function of ``(seed, epoch, rank)`` and the
    minibatches, so a run resumed at an epoch draws what an uninterrupted run draws there."""
    return (((seed * 1_000_003 + epoch) * 1_000_033 + rank) * 10_000_019 + 7) & ((1 << 63) - 1)


def run_phases(plan: Plan, epoch: int) -> Tuple[Phase, ...]:
    """The phases of ``epoch``, in order: training, validation, and after the last epoch test."""
    return (Phase.TRAIN, Phase.VAL) + ((Phase.TEST,) if epoch == plan.epochs - 1 else ())


def schedule(plan: Plan, ds: NodeDataset, worker: int = 0, workers: int = 1) -> Iterator[Union[SeedBatch, EpochMark]]:
    """Every ``workers``-th minibatch of the run from ``worker`` on, in order, each phase followed
    by its :class:`EpochMark`; the run's epochs are ``plan.first_epoch`` to the last."""
    for epoch in range(plan.first_epoch, plan.epochs):
        for phase in run_phases(plan, epoch):
            for i, seeds in enumerate(epoch_batches(plan, ds, epoch, phase)):
                if i % workers == worker:
                    yield SeedBatch(phase, epoch, i, seeds)
            yield EpochMark(epoch, phase)


def sample_blocks(graph: CSRGraph, seeds: torch.Tensor, plan: Plan, batch: SeedBatch) -> List[Block]:
    """The blocks of ``batch`` sampled from ``graph`` (in-neighbour rows; see the module
    docstring), on the device of ``graph``'s ``indptr``."""
    return _sampling.sample_layers(graph, seeds, plan.fanouts, edge_dir="out",
                                   seed=minibatch_seed(plan.seed, batch.epoch, batch.phase, batch.index))


class SampleStage:
    """The seeds and sample stages that a sampling role runs (a sampler process, or the
    :class:`GpuSampler` of the process that gathers): which seed batches come, in which
    order, and how a batch of seeds becomes the blocks and labels a :class:`Minibatch` packs.

    This one is the training run's: :func:`schedule`'s seeds, DGL-style blocks sampled from
    the dataset's in-neighbour rows with :func:`minibatch_seed`, the seeds' labels. A loader
    that runs its stages in processes (:mod:`.loader`) gives its own. A stage travels to the
    roles' processes: it must pickle.
    """

    eids = False  # whether its blocks carry edge ids, packed with them
    # Whether seeds() waits for seed batches that are sent only as earlier minibatches are
    # delivered (a loader's): a GPU sampler then takes no seeds past a phase mark until it has
    # handed the mark out, else it keeps samples in flight across phases.
    waits_for_delivery = False

    def seeds(self, plan: Plan, ds: NodeDataset, worker: int, workers: int) -> Iterator[Union[SeedBatch, EpochMark]]:
        """The seed batches (and phase marks) of sampling worker ``worker`` of ``workers``."""
        return schedule(plan, ds, worker, workers)

    def labels(self, labels: torch.Tensor, batch: SeedBatch) -> torch.Tensor:
        """The labels part of ``batch``'s minibatch (a host tensor): its seeds' rows of the
        dataset's ``labels``."""
        return labels.index_select(0, batch.seeds)

    def finish_labels(self, labels: torch.Tensor, blocks: Sequence[Block]) -> torch.Tensor:
        """The labels part packed with ``blocks`` (the sample of :meth:`start`), from
        :meth:`labels`' (where the blocks are, on the current stream): those as they are."""
        return labels

    def start(self, graph: CSRGraph, seeds: torch.Tensor, plan: Plan, batch: SeedBatch) -> _sampling.PendingSample:
        """Samples ``batch`` (its ``seeds`` on ``graph``'s device) from ``graph``: on a GPU
        queued on the current stream, with no host synchronisation; on the CPU done on return.
        Its :meth:`~pytorch_zerocopy.sampling.PendingSample.result` is what gets packed, its
        first block's ``nodes`` the input nodes."""
        return _sample_async(graph, seeds, plan, batch)


def sample_on_cpu(graph: CSRGraph, labels: torch.Tensor, plan: Plan, batch: SeedBatch,
                  stage: SampleStage = SampleStage()) -> Minibatch:
    """``batch`` sampled by ``stage`` on the CPU with this process's threads, packed; its
    ``sample_ms`` is the host time sampling took."""
    start = time.perf_counter()
    blocks = stage.start(graph, batch.seeds, plan, batch).result()
    labels = stage.finish_labels(stage.labels(labels, batch), blocks)
    sample_ms = (time.perf_counter() - start) * 1e3
    return Minibatch.pack(batch.phase, batch.epoch, batch.index, blocks, labels, sample_ms, eids=stage.eids)


class SampleSteps(NamedTuple):
    """Sampling in two steps: ``start(batch)`` issues the sample of a :class:`SeedBatch`,
    ``finish(batch, started)`` completes it (what ``start`` returned) into what the role hands
    on. The wrappers of a sampling stage (:func:`replayed`, :class:`~.trace.TracedSampling`)
    take and give this shape."""

    start: Callable[[SeedBatch], Any]
    finish: Callable[[SeedBatch, Any], Any]


def _started(batch: SeedBatch, started):
    return started


def cpu_steps(ds: NodeDataset, plan: Plan, stage: SampleStage) -> SampleSteps:
    """:func:`sample_on_cpu` as :class:`SampleSteps`: ``start`` samples and packs, ``finish``
    hands the :class:`Minibatch` on."""
    return SampleSteps(lambda batch: sample_on_cpu(ds.graph, ds.labels, plan, batch, stage), _started)


@dataclass(frozen=True)
class _Kept:
    """A kept sample (a :class:`Minibatch` or :class:`Sampled`) that :class:`Replay` sends again."""

    sample: Any


class Replay:
    """The ``Plan.replay`` diagnostic around sampling ``steps``: the first ``count`` samples of
    each phase are kept and then sent again in turn, relabelled (``relabelled``: no sampling
    time, no trace spans), instead of sampling new ones. A sample is kept when it is finished;
    until ``count`` are kept, every minibatch is sampled."""

    def __init__(self, steps: SampleSteps, count: int):
        self.steps, self.count = steps, count
        self.pool: Dict[Phase, list] = {p: [] for p in Phase}
        self.turn = {p: 0 for p in Phase}

    def start(self, batch: SeedBatch):
        pool = self.pool[batch.phase]
        if len(pool) < self.count:
            return self.steps.start(batch)
        kept = pool[self.turn[batch.phase] % len(pool)]
        self.turn[batch.phase] += 1
        return _Kept(kept)

    def finish(self, batch: SeedBatch, started):
        if isinstance(started, _Kept):
            return started.sample.relabelled(batch.epoch, batch.index)
        out = self.steps.finish(batch, started)
        pool = self.pool[batch.phase]
        if len(pool) < self.count:
            pool.append(out)
        return out


def replayed(steps: SampleSteps, count: Optional[int]) -> SampleSteps:
    """``steps`` behind :class:`Replay` of ``count`` (``Plan.replay``); ``steps`` itself when
    ``count`` is None."""
    return steps if count is None else Replay(steps, count)


@dataclass
class Sampled:
    """A minibatch ready for gathering. ``ready``: the event after which its packed tensor is
    complete on the GPU (None when it was sampled on the CPU); ``spans``: the stretches of the
    sampling stream's time its sampling took (with ``Plan.trace``: issue, then completion and
    packing; the wait in between, while earlier minibatches are gathered, is not counted);
    ``waited``: host seconds the gathering side waited for it; ``issued``: host seconds spent
    issuing its GPU sample and packing it, the wait for its sizes left out (with ``Plan.trace``;
    with several trainers served by one process this grows while their threads contend for
    the interpreter)."""

    batch: Minibatch
    ready: Optional["torch.cuda.Event"] = None
    spans: Tuple[Span, ...] = ()
    waited: float = 0.0
    issued: float = 0.0

    def relabelled(self, epoch: int, step: int) -> "Sampled":
        """This sample sent again as minibatch ``step`` of ``epoch`` (replay): the same packed
        tensor and ready event, no sampling time, no spans, no wait."""
        return Sampled(self.batch.relabelled(epoch, step), self.ready)


def sample_here(plan: Plan, ds: NodeDataset, stage: SampleStage = SampleStage()) -> Iterator[Union[Sampled, EpochMark]]:
    """Every minibatch of ``stage``'s seeds (and its phase marks) sampled on the CPU by this
    process, in order: the source of a process that gathers without sampler processes."""
    for item in stage.seeds(plan, ds, 0, 1):
        if isinstance(item, EpochMark):
            yield item
        else:
            yield Sampled(sample_on_cpu(ds.graph, ds.labels, plan, item, stage))


def from_samplers(batch_q, sources: int) -> Iterator[Union[Sampled, EpochMark]]:
    """What ``sources`` sampler processes put on ``batch_q``, until each has sent its end (None)."""
    finished = 0
    while finished < sources:
        start = time.perf_counter()
        item = batch_q.get()
        if item is None:
            finished += 1
        elif isinstance(item, EpochMark):
            yield item
        else:
            yield Sampled(item, waited=time.perf_counter() - start)


def _sample_async(graph: CSRGraph, seeds: torch.Tensor, plan: Plan, batch: SeedBatch) -> _sampling.PendingSample:
    """Queues the sample of one minibatch on the current stream (no host synchronisation)."""
    return _sampling.sample_layers_async(graph, seeds, plan.fanouts, edge_dir="out",
                                         seed=minibatch_seed(plan.seed, batch.epoch, batch.phase, batch.index))


class GpuSampler:
    """Samples the minibatches of ``stage`` (default: the training run's) on ``device`` with
    the library's GPU op, which reads the dataset's in-neighbour lists where ``plan.lists_in``
    puts them: mapped in place
    (``unified``: DGL's UVA sampling; no copy of the graph), this process's copy of them in
    managed memory kept in host memory (``managed``), or GPU memory (``cuda``); no host round
    trip for the blocks.

    Iterating yields :class:`Sampled` minibatches (packed on ``device``) and
    :class:`EpochMark` s in the stage's order. Sampling runs on its own stream, ``ahead``
    minibatches in flight: before a minibatch is handed out, the samples of the next ``ahead``
    are issued, so they run on the GPU while the caller gathers (and trains) the current ones;
    the host waits only for each sample's sizes, once, when its turn comes.

    Lifetime: a yielded packed tensor was allocated on this sampler's stream; a caller that
    uses it on another stream waits for ``ready`` there and calls ``record_stream``.
    """

    def __init__(self, plan: Plan, ds: NodeDataset, device: torch.device, ahead: int = 1,
                 trace: Optional[ProducerTrace] = None, stage: SampleStage = SampleStage()):
        self.plan, self.ds, self.device, self.stage = plan, ds, device, stage
        self.ahead = max(1, ahead)
        self.graph = ds.graph.to(plan.lists_in, device)
        self.labels = ds.labels
        self.stream = torch.cuda.Stream(device)
        # The sampling stage, chosen once: its two steps, timed on the sampling stream with a
        # GPU trace (``trace``), behind the replay diagnostic with ``plan.replay``.
        steps = SampleSteps(self._start, self._finish)
        if trace is not None and trace.on_gpu:
            steps = TracedSampling(steps, trace, self.stream)
        self.steps = replayed(steps, plan.replay)

    def _start(self, batch: SeedBatch):
        with torch.cuda.stream(self.stream):
            # Seeds and their labels reach the GPU in one asynchronous copy.
            n = batch.seeds.numel()
            labels = self.stage.labels(self.labels, batch)
            both = cat_to_device_async([batch.seeds, labels], self.device, torch.int64)
            pending = self.stage.start(self.graph, both[:n], self.plan, batch)
        return pending, both[n:]

    def _finish(self, batch: SeedBatch, started) -> Sampled:
        pending, labels = started
        with torch.cuda.stream(self.stream):
            t = time.perf_counter()
            blocks = pending.result()  # the host waits for the sample's sizes, once
            waited = time.perf_counter() - t
            labels = self.stage.finish_labels(labels, blocks)
            mb = Minibatch.pack(batch.phase, batch.epoch, batch.index, blocks, labels, eids=self.stage.eids)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return Sampled(mb, ready, (), waited)

    def __iter__(self) -> Iterator[Union[Sampled, EpochMark]]:
        work = self.stage.seeds(self.plan, self.ds, 0, 1)
        start, finish = self.steps.start, self.steps.finish
        queue: Deque[Tuple] = deque()  # (item, what start returned)
        in_flight = marks = 0  # marks: queued, not yet handed out

        def refill() -> None:
            nonlocal in_flight, marks
            while in_flight < self.ahead and not (marks and self.stage.waits_for_delivery):
                item = next(work, None)
                if item is None:
                    return
                if isinstance(item, EpochMark):
                    queue.append((item, None))
                    marks += 1
                    continue
                queue.append((item, start(item)))
                in_flight += 1

        refill()
        while queue:
            item, started = queue.popleft()
            if isinstance(item, EpochMark):
                marks -= 1
                yield item
                refill()
                continue
            in_flight -= 1
            out = finish(item, started)
            refill()  # the next samples run while the caller works on this one
            yield out
