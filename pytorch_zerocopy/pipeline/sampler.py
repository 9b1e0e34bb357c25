"""The sampler role (``Plan.sample_on`` cpu): a process that samples its share of the run's
minibatches with the library's multithreaded CPU sampling op and puts them on the batch queue.

What it samples is its :class:`~.minibatches.SampleStage`'s (default: the training run's, in
which worker ``w`` of ``n`` samples every ``n``-th minibatch of each phase from the ``w``-th
on), one op call per minibatch, with ``Plan.sampler_threads`` threads. With several workers,
``barrier`` (a ``Barrier`` of ``n`` parties) holds each at the end of every phase until all
have finished it, so phases reach the trainer in order and per-epoch timings mean something.
The replay diagnostic and an injected failure wrap its sampling and its seeds, when the plan
asks for them.

Tensors put on a queue are fetched from the sending process when received, so a sampler stays
alive until the trainer sets ``consumed`` (an ``Event``) at the end of the run.
"""

from __future__ import annotations

from ..datasets.base import NodeDataset
from .messages import EpochMark
from .minibatches import SampleStage, cpu_steps, replayed
from .plan import Plan
from .process import failing, set_threads


def sampler_main(plan: Plan, ds: NodeDataset, worker: int, batch_q, consumed, barrier=None,
                 stage: SampleStage = SampleStage()) -> None:
    set_threads(plan.sampler_threads)
    sampling = replayed(cpu_steps(ds, plan, stage), plan.replay)
    start, finish = sampling.start, sampling.finish
    for item in failing(stage.seeds(plan, ds, worker, plan.num_samplers), plan, "sampler"):
        if isinstance(item, EpochMark):
            batch_q.put(item)
            if barrier is not None:
                barrier.wait()
            continue
        batch_q.put(finish(item, start(item)))
    batch_q.put(None)
    consumed.wait()
