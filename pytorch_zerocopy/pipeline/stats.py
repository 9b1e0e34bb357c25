"""Per-epoch statistics of a training run, as the trainer reports them.

Steady state: the statistics named ``steady_*`` leave out each epoch's first training
minibatch, which carries the pipeline's fill (or a head start); their clock runs from the end
of that minibatch to the end of the last. ``steady_wait_seconds`` is the part of that time the
trainer's host spent blocked on its next minibatch: near zero when the input keeps ahead, most
of the time when the input limits the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from .messages import CacheCounts, PartitionInfo
from .trace import TraceSummary


@dataclass
class EpochStats:
    """One epoch: training (loss, time, feature rows read), validation accuracy and, for the
    last epoch, test accuracy."""

    epoch: int
    train_seconds: float = 0.0  # the training phase, from its first minibatch to its last
    train_batches: int = 0
    feature_bytes: int = 0  # feature rows read by the training minibatches
    loss: float = float("nan")  # mean training loss
    val_acc: float = float("nan")
    val_nodes: int = 0
    test_acc: float = float("nan")  # after the last epoch only
    test_nodes: int = 0
    steady_seconds: float = float("nan")
    steady_batches: int = 0
    steady_bytes: int = 0
    steady_wait_seconds: float = 0.0
    train_step: dict = field(default_factory=dict)  # the step's summary (:mod:`.train_step`)
    param_checksum: float = float("nan")  # sum of |parameters| after the epoch
    trace: Optional[TraceSummary] = None  # with ``Plan.trace``
    partition: Optional[PartitionInfo] = None  # how the GPU was shared (set by the runner)
    gather_batches: int = 1  # minibatches per gather (set by the runner from the plan)
    cache_rows: int = 0  # rows in the feature cache (set by the runner; 0: no cache)
    cache_hits: int = 0  # input rows of the training minibatches read from the cache
    cache_lookups: int = 0  # input rows of the training minibatches gathered through the cache

    @property
    def cache_hit_rate(self) -> float:
        """Share of the training minibatches' input rows the feature cache held (nan: no cache)."""
        return self.cache_hits / self.cache_lookups if self.cache_lookups else float("nan")

    @property
    def steady_ms_per_minibatch(self) -> float:
        """Steady-state time per training minibatch (the whole phase's if it had one minibatch)."""
        if self.steady_batches >= 1:
            return self.steady_seconds / self.steady_batches * 1e3
        return self.train_seconds / max(1, self.train_batches) * 1e3

    @property
    def input_wait_share(self) -> float:
        """Share of the steady-state time the trainer waited for its input."""
        return self.steady_wait_seconds / self.steady_seconds if self.steady_batches >= 1 else float("nan")


class EpochAccumulator:
    """The trainer's running sums for one epoch. Losses and correct counts stay on the device
    until the epoch ends (adding them never synchronises)."""

    def __init__(self, epoch: int):
        self.stats = EpochStats(epoch)
        self.loss_sum = 0.0
        self.correct = 0
        self.test_correct = 0
        self.steady_t0 = 0.0

    def trained(self, loss: torch.Tensor, feature_bytes: int, waited: float, sync) -> None:
        """One training minibatch done (``waited``: seconds the host waited for it); ``sync``
        waits for the device (called once, after the first minibatch, to start the steady clock)."""
        st = self.stats
        if st.train_batches >= 1:  # inside the steady-state window
            st.steady_wait_seconds += waited
        self.loss_sum = self.loss_sum + loss
        st.train_batches += 1
        st.feature_bytes += feature_bytes
        if st.train_batches == 1:
            sync()
            self.steady_t0 = time.perf_counter()
            st.steady_bytes = -feature_bytes

    def cache_counted(self, counts: CacheCounts) -> None:
        """The feature cache's counts over some of the epoch's training minibatches."""
        self.stats.cache_hits += counts.hits
        self.stats.cache_lookups += counts.lookups

    def validated(self, correct: torch.Tensor, nodes: int) -> None:
        self.correct = self.correct + correct
        self.stats.val_nodes += nodes

    def tested(self, correct: torch.Tensor, nodes: int) -> None:
        self.test_correct = self.test_correct + correct
        self.stats.test_nodes += nodes

    def end_training(self, started: float, now: float) -> None:
        """The epoch's training phase began at ``started`` and ended (device synchronised) at ``now``."""
        st = self.stats
        st.train_seconds = now - started
        st.loss = float(self.loss_sum) / max(1, st.train_batches)
        if st.train_batches >= 2:
            st.steady_seconds = now - self.steady_t0
            st.steady_batches = st.train_batches - 1
            st.steady_bytes += st.feature_bytes
        else:
            st.steady_bytes = 0

    def end_validation(self) -> None:
        self.stats.val_acc = float(self.correct) / max(1, self.stats.val_nodes)

    def end_test(self) -> None:
        if self.stats.test_nodes:
            self.stats.test_acc = float(self.test_correct) / self.stats.test_nodes
