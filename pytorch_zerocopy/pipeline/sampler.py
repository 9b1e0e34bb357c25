"""The sampler role (``Plan.sample_on`` cpu): a process that samples its share of the run's
minibatches with the library's multithreaded CPU sampling op and puts them on the batch queue.

What it samples is its :class:`~.minibatches.SampleStage`'s (default: the training run's, in
which worker ``w`` of ``n`` samples every ``n``-th minibatch of each phase from the ``w``-th
on), one op call per minibatch, with ``Plan.sampler_threads`` threads. With several workers,
``barrier`` (a ``Barrier`` of ``n`` parties) holds each at the end of every phase until all
have finished it, so phases reach the trainer in order and per-epoch timings mean something.

Tensors put on a queue are fetched from the sending process when received, so a sampler stays
alive until the trainer sets ``consumed`` (an ``Event``) at the end of the run.
"""

from __future__ import annotations

from ..datasets.base import NodeDataset
from .messages import EpochMark
from .minibatches import Replay, SampleStage, sample_on_cpu
from .plan import Plan
from .process import maybe_fail, set_threads


def sampler_main(plan: Plan, ds: NodeDataset, worker: int, batch_q, consumed, barrier=None,
                 stage: SampleStage = SampleStage()) -> None:
    set_threads(plan.sampler_threads)
    replay = Replay(plan.replay)
    step = 0
    for item in stage.seeds(plan, ds, worker, plan.num_samplers):
        if isinstance(item, EpochMark):
            batch_q.put(item)
            if barrier is not None:
                barrier.wait()
            continue
        maybe_fail(plan, "sampler", step)
        step += 1
        kept = replay.take(item.phase)
        if kept is not None:
            batch = kept.relabelled(item.epoch, item.index)
        else:
            batch = sample_on_cpu(ds.graph, ds.labels, plan, item, stage)
            replay.keep(item.phase, batch)
        batch_q.put(batch)
    batch_q.put(None)
    consumed.wait()
