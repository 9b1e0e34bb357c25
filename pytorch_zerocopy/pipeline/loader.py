"""The process way of running a loader's stages: seeds -> sample -> gather -> deliver, with the
pipeline's roles in processes of their own feeding the calling process (the training loop).

A loader (:class:`pytorch_zerocopy.pyg.NeighborLoader`, :class:`pytorch_zerocopy.dgl.DataLoader`)
runs its stages in the calling process unless asked for this way (``pipeline=True``). Then a
:class:`LoaderProcesses` runs them: the plan's sampler process (``Plan.sample_on`` cpu), or the
producer's own GPU sampler (``gpu``), runs the loader's :class:`FedStage`; the producer
gathers each minibatch's input rows into the ring (:mod:`.ring`); the calling process takes
them out, builds the loader's minibatch and hands it to the training loop while the next
minibatches are sampled and gathered, so loading overlaps the loop's step.

Seeds: the calling process decides them, in the loader's own order (shuffling draws from
torch's generator there, as in-process), and keeps up to ``Plan.num_slots + Plan.queue_depth
+ Plan.gather_batches`` batches in flight (:class:`LoaderBatch` es), topped up a group
(``gather_batches``) at a time. A batch's seeds, and what the loader carries
along for its minibatch's labels part, go into a row of the seed slots, a buffer in shared
memory made once (:class:`SeedSlots`), and the sampling role is sent only which rows (a
top-up's :class:`SeedSpan` s of ints in one :class:`SeedSpans`): no tensor and no array crosses a queue, whose
feeder thread would need the calling process's GIL (held by a training step written in
Python) for every one. A row is reused once its minibatch is delivered; an epoch ends with an
:class:`~.messages.EpochMark` from every sampling role.

Lifetime: the processes start with the first epoch and serve every later one. :meth:`close`
ends them (the loaders call it from their own ``close()``, when they are garbage-collected,
and at interpreter exit), and they die with the thread that started them whatever happens
(:mod:`pytorch_zerocopy._process`). Leaving an epoch early (``break``) drains the minibatches
in flight once the epoch's iterator is closed or collected; the next epoch starts clean. One
epoch at a time: a second iterator while one is open raises ``RuntimeError``.

Delivered tensors: slots are reused, so a minibatch's feature rows (and, in GPU slots, its
packed tensor) are copied out of the slot before it goes back to the producer; the loop owns
what it gets, as in-process (one device copy of the rows per minibatch).

Failures: a role that fails or dies raises :class:`~.runner.PipelineError` in the loop, at the
next minibatch it waits for, and every role is ended.
"""

from __future__ import annotations

import copy
import queue
from dataclasses import dataclass, replace
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ..datasets.base import NodeDataset, shared_host_tensor
from ..feature_table import CacheConfig
from ..graph import CSRGraph
from .gather import choose_cached_rows
from .messages import EpochMark, Minibatch, SlotReady
from .minibatches import SampleStage, SeedBatch
from .partition import this_process_client_env
from .plan import GatherIn, Partition, Phase, Plan, PlanError, make_plan
from .producer import producer_main
from .ring import RingReader
from .runner import PipelineError, Supervisor, close_queue, cpu_role_environment, direct_queue
from .sampler import sampler_main
from .trace import Stage, StageTimes

HEALTH_CHECK_SECONDS = 0.5  # how often a loop waiting for a minibatch checks the roles are alive
CLOSE_TIMEOUT_SECONDS = 60.0
_PRODUCER_STAGES = {"sample_ms": Stage.SAMPLE, "gather_ms": Stage.GATHER}


@dataclass(frozen=True)
class LoaderBatch:
    """One minibatch's seeds, as a loader hands them to :meth:`LoaderProcesses.epoch`: ``seeds``
    (CPU int64 node ids),
    ``sample_seed`` (the seed of its random draws, or None) and ``carried`` (CPU int64 values
    packed as the minibatch's labels part, so they reach the training process where the
    minibatch is, in its one copy; None: no labels part)."""

    seeds: torch.Tensor
    sample_seed: Optional[int]
    carried: Optional[torch.Tensor] = None

    @property
    def width(self) -> int:
        """The values it takes in a row of the seed slots."""
        return self.seeds.numel() + (0 if self.carried is None else self.carried.numel())


@dataclass(frozen=True)
class SeedSlots:
    """Calling process -> sampling roles, when the seed slots are made (and remade, larger,
    for a batch that does not fit): ``rows``, ``[slots, capacity]`` int64 in shared memory."""

    rows: torch.Tensor


@dataclass(frozen=True)
class SeedSpan:
    """Calling process -> a sampling role, per minibatch: minibatch ``index`` of ``epoch`` has
    the first ``count`` seeds of row ``row`` of the seed slots, then ``carried`` values of its
    labels part; ``sample_seed`` as in :class:`~.minibatches.SeedBatch`."""

    epoch: int
    index: int
    row: int
    count: int
    sample_seed: Optional[int]
    carried: int = 0


@dataclass(frozen=True)
class SeedSpans:
    """Calling process -> a sampling role: :class:`SeedSpan` s sent together (a top-up of
    several rows costs one queue write)."""

    spans: Tuple[SeedSpan, ...]


class _SeedRows:
    """The calling process's side of the seed slots: the shared rows and the free ones. A row
    is taken when a batch is sent and given back when its minibatch is delivered (or, for an
    epoch ended early, once the roles' marks show they read every batch sent)."""

    def __init__(self, slots: int, capacity: int):
        self.slots, self.capacity = slots, max(1, capacity)
        self.rows: Optional[torch.Tensor] = None
        self.free = list(range(slots))

    def fits(self, width: int) -> bool:
        """Whether ``width`` values fit a row of the rows as they are (else :meth:`put` remakes them)."""
        return self.rows is not None and width <= self.rows.shape[1]

    def put(self, seeds: torch.Tensor, queues: list, carried: Optional[torch.Tensor] = None) -> int:
        """Writes ``seeds``, then ``carried``, into a free row (the rows made, or remade larger,
        first, and sent to every role in ``queues``); returns the row."""
        n = seeds.numel()
        width = n + (0 if carried is None else carried.numel())
        if not self.fits(width):
            wider = self.capacity if self.rows is None else 2 * self.rows.shape[1]
            self.rows = shared_host_tensor((self.slots, max(wider, width)), torch.int64)
            for q in queues:
                q.put(SeedSlots(self.rows))
        row = self.free.pop()
        self.rows[row, :n].copy_(seeds.reshape(-1))
        if carried is not None:
            self.rows[row, n:width].copy_(carried.reshape(-1))
        return row

    def release(self, row: int) -> None:
        self.free.append(row)


class FedStage(SampleStage):
    """A loader's sample stage, whose seeds come from the loader's process: sampling role ``w``
    reads :class:`SeedSpan` s (of the :class:`SeedSlots` it was sent) and marks from
    ``queues[w]`` until None (:class:`LoaderProcesses` sets :attr:`queues` before the roles
    start). The labels part packed is what the loader carried along (else empty): the loader
    reads what else it needs itself."""

    queues: Optional[list] = None
    waits_for_delivery = True

    def seeds(self, plan: Plan, ds: NodeDataset, worker: int, workers: int):
        q = self.queues[worker]
        rows: Optional[torch.Tensor] = None
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, SeedSlots):
                rows = item.rows
            elif isinstance(item, SeedSpans):
                for span in item.spans:
                    # Views of the row: read before the minibatch is delivered, then reused.
                    row = rows[span.row]
                    carried = row[span.count:span.count + span.carried] if span.carried else None
                    yield SeedBatch(Phase.TRAIN, span.epoch, span.index, row[:span.count], span.sample_seed, carried)
            elif isinstance(item, EpochMark):
                yield item
            else:
                raise TypeError(f"a loader's sampling role got {type(item).__name__} on its seed queue")

    def labels(self, labels: torch.Tensor, batch: SeedBatch) -> torch.Tensor:
        return batch.seeds.new_empty(0) if batch.carried is None else batch.carried


def loader_plan(fanouts: Sequence[int], batch_size: int, row_bytes: int, table_bytes: int,
                cache: Optional[CacheConfig] = None) -> Plan:
    """The plan of a loader's process way: :func:`~.plan.make_plan` of mode ``zerocopy`` for
    the loader's ``fanouts`` (input side first; a fanout of 0 sizes slots as 1) and
    ``batch_size`` on this machine. The GPU is partitioned with MPS only where this process is
    itself an MPS client (:func:`~.partition.this_process_client_env`; ``zerocopy mps`` runs a
    script as one), with the producer yielding to this process (``producer_yields``: the user's
    step runs here); elsewhere the producer's process and this one take turns on the GPU.
    ``cache``: the plan's cache of the gathered table (None: the plan's default)."""
    partition = "mps" if this_process_client_env(100.0) is not None else "none"
    settings = {} if cache is None else {"cache": cache}
    return make_plan("zerocopy", partition, row_bytes=row_bytes, table_bytes=table_bytes,
                     fanouts=tuple(f if f != 0 else 1 for f in fanouts), batch_size=batch_size, cuda_graph=False,
                     producer_yields=True, **settings)


def check_plan(plan: Plan) -> Plan:
    """``plan`` if a loader's process way can run it (a producer gathers), else
    :class:`~.plan.PlanError`."""
    if not isinstance(plan, Plan):
        raise TypeError(f"pipeline must be True, False or a pytorch_zerocopy.pipeline.Plan, got {plan!r}")
    if plan.gather_in is not GatherIn.PRODUCER:
        raise PlanError("gather_in", "a loader's process way gathers in a producer process: the plan's gather_in "
                                     f"must be 'producer', got {plan.gather_in.value!r}")
    if plan.partition is Partition.MPS and this_process_client_env(plan.producer_share) is None:
        raise PlanError("partition", "partition 'mps' shares the GPU between the producer and this process, which "
                                     "is no MPS client (start it with CUDA_MPS_PIPE_DIRECTORY naming a running "
                                     "daemon), or use partition 'none'")
    return plan


def loader_dataset(name: str, lists: CSRGraph, table: torch.Tensor, seeds: torch.Tensor) -> NodeDataset:
    """What a loader's roles read: ``lists`` (the rows its stage samples, with their ``eids``
    if any), ``table`` (the rows the producer gathers, one per node) and ``seeds`` (the ids a
    cache's pre-sampling starts from); no labels. Host tensors already in shared memory are
    used in place, others copied there once (a tensor another process maps must not move)."""
    none = torch.empty(0, dtype=torch.int64)
    graph = CSRGraph(_shared(lists.indptr), _shared(lists.indices), placement="cpu", validate=False,
                     eids=None if lists.eids is None else _shared(lists.eids))
    rows = _shared(table).reshape(table.shape[0], -1)
    return NodeDataset(name, graph, rows, none, seeds.reshape(-1).long(), none, none, 0)


def _shared(t: torch.Tensor) -> torch.Tensor:
    t = t.cpu()
    if t.is_shared() and t.is_contiguous():
        return t
    return shared_host_tensor(t.shape, t.dtype).copy_(t)


class _Watched:
    """``get`` of a queue that checks, while it waits, that every role is alive. A message
    that cannot be received (its tensors were shared by a role that died meanwhile) raises the
    role's failure."""

    def __init__(self, q, sup: Supervisor):
        self.q, self.sup = q, sup

    def get(self):
        while True:
            try:
                return self.q.get(timeout=HEALTH_CHECK_SECONDS)
            except queue.Empty:
                self.sup.check()
            except (OSError, EOFError, RuntimeError):
                self.sup.check(timeout=HEALTH_CHECK_SECONDS)
                raise


class _Epoch:
    """One epoch's seed batches, sent ``limit`` ahead of delivery; the seed rows of those in
    flight, by step; the marks received; ``times``, where its stages are recorded (or None)."""

    def __init__(self, queues: list, epoch: int, todo: Iterator["LoaderBatch"], rows: _SeedRows, chunk: int,
                 times: Optional[StageTimes] = None):
        self.queues, self.epoch, self.todo, self.rows, self.times = queues, epoch, todo, rows, times
        self.limit, self.chunk = rows.slots, max(1, min(chunk, rows.slots))
        self.rows_in_flight: Dict[int, int] = {}  # step -> its seed row
        self.sent = self.marks = 0
        self.ended = False

    def top_up(self) -> None:
        """Fills the free seed rows, once at least ``chunk`` are free (or the epoch's last
        batches remain), with one message per sampling role."""
        if self.ended or self.limit - len(self.rows_in_flight) < self.chunk:
            return
        spans: List[List[SeedSpan]] = [[] for _ in self.queues]
        while not self.ended and len(self.rows_in_flight) < self.limit:
            nxt = next(self.todo, None)
            if nxt is None:
                self._send(spans)
                self.end()
                return
            if not isinstance(nxt, LoaderBatch):
                raise TypeError(f"a loader's epoch yields LoaderBatch es, got {type(nxt).__name__}")
            if not self.rows.fits(nxt.width):  # the rows are remade: what refers to the old ones goes first
                self._send(spans)
            row = self.rows.put(nxt.seeds, self.queues, nxt.carried)
            self.rows_in_flight[self.sent] = row
            count = nxt.seeds.numel()
            spans[self.sent % len(self.queues)].append(
                SeedSpan(self.epoch, self.sent, row, count, nxt.sample_seed, nxt.width - count))
            self.sent += 1
        self._send(spans)

    def _send(self, spans: List[List[SeedSpan]]) -> None:
        for q, some in zip(self.queues, spans):
            if some:
                q.put(SeedSpans(tuple(some)))
                some.clear()

    def end(self) -> None:
        if not self.ended:
            for q in self.queues:
                q.put(EpochMark(self.epoch, Phase.TRAIN))
            self.ended = True

    @property
    def complete(self) -> bool:
        return self.marks == len(self.queues)

    def delivered(self, step: int) -> None:
        self.rows.release(self.rows_in_flight.pop(step))

    def drained(self) -> None:
        """After every role's mark: the rows of the batches never delivered go back."""
        for row in self.rows_in_flight.values():
            self.rows.release(row)
        self.rows_in_flight.clear()


class LoaderProcesses:
    """A loader's stages run by the pipeline's roles (module docstring). ``stage`` samples
    (it must pickle), ``ds`` is what the roles read (:func:`loader_dataset`), ``plan`` how
    (:func:`loader_plan`, or a user's plan that :func:`check_plan` accepts)."""

    def __init__(self, plan: Plan, ds: NodeDataset, stage: FedStage):
        self.plan, self.ds, self.stage = check_plan(plan), ds, stage
        self.device = torch.device(plan.device)
        self.sup: Optional[Supervisor] = None
        self.reader: Optional[RingReader] = None
        self.incoming: Optional[Iterator] = None
        self.queues: List = []
        self.open: Optional[_Epoch] = None
        # In flight: what the ring and the queue hold, and a group's worth more, so that rows
        # are sent a group at a time (one write per role) and the roles never run short.
        self.seed_rows = _SeedRows(self.plan.num_slots + self.plan.queue_depth + self.plan.gather_batches,
                                   self.plan.batch_size)
        self.epochs = 0
        self.closed = False

    # --- start and end ------------------------------------------------------------------

    def _start(self, trace: bool) -> None:
        plan = replace(self.plan, trace=trace)
        sup = Supervisor()
        ctx = sup.ctx
        # Written by this process per minibatch, while the user's step may hold the GIL.
        seed_queues = [direct_queue(ctx) for _ in range(plan.mark_sources)]
        samplers = plan.sampler_processes
        batch_q = ctx.Queue(maxsize=plan.queue_depth * samplers) if samplers else None
        ready_q, free_q, self.consumed = ctx.Queue(), direct_queue(ctx), ctx.Event()
        self.seed_queues = seed_queues
        self.queues = [q for q in seed_queues + [batch_q, ready_q, free_q] if q is not None]
        stage = copy.copy(self.stage)
        stage.queues = seed_queues
        self.sup = sup
        try:
            self.ds.share_memory_()
            cached_rows = choose_cached_rows(plan, self.ds)
            env = cpu_role_environment(plan)
            for w in range(samplers):
                sup.start("sampler", sampler_main, (plan, self.ds, w, batch_q, self.consumed, None, stage), env)
            producer_env = dict(env)
            if plan.partition is Partition.MPS:  # a client of this process's daemon (check_plan)
                producer_env.update(this_process_client_env(plan.producer_share, below_normal=plan.producer_yields))
            sup.start("producer", producer_main, (plan, self.ds, batch_q, ready_q, free_q, cached_rows, stage),
                      producer_env)
            self.reader = RingReader(_Watched(ready_q, sup), free_q, self.device)
        except BaseException:
            self._end()
            raise
        self.incoming = iter(self.reader)

    def close(self) -> None:
        """Ends the roles, after the epoch in flight (if any) is drained; idempotent. Raises
        what a role reported, if one failed."""
        if self.closed:
            return
        self.closed = True
        if self.sup is None:
            return
        try:
            if self.open is not None:
                self._drain(self.open)
            for q in self.seed_queues:
                q.put(None)
            for item, _ in self.incoming:  # the producer's end of the run
                if isinstance(item, SlotReady):
                    self.reader.release(item)
            self.reader.close()
            self.consumed.set()
            self.sup.run(lambda message: None, timeout=CLOSE_TIMEOUT_SECONDS)
        finally:
            self._end()

    def _end(self) -> None:
        """Ends every role now (SIGTERM, then SIGKILL) and closes the queues."""
        sup, self.sup = self.sup, None
        self.closed = True
        self.open = None
        if sup is None:
            return
        self.reader = self.incoming = None
        try:
            self.consumed.set()
            sup.shutdown()
        finally:
            for q in self.queues:
                close_queue(q)
            self.queues = []

    # --- epochs ---------------------------------------------------------------------------

    def epoch(self, batches, times: Optional[StageTimes] = None) -> Iterator[Tuple[Minibatch, torch.Tensor]]:
        """Runs one epoch: ``batches`` yields :class:`LoaderBatch` es;
        yields ``(minibatch, features)`` in the order the producer finished them (the
        order of ``batches`` with one sampling role). ``times`` records the deliver stage, and
        the sample and gather times the producer measured."""
        if self.closed:
            raise RuntimeError("this loader's processes were closed; make a new loader")
        if self.sup is None:
            self._start(trace=times is not None)
        return self._run(iter(batches), times)

    def _run(self, todo, times: Optional[StageTimes]):
        if self.open is not None:
            raise RuntimeError("the loader's process way runs one epoch at a time: finish (or close) the open "
                               "iterator before starting another")
        run = self.open = _Epoch(self.seed_queues, self.epochs, todo, self.seed_rows, self.plan.gather_batches, times)
        self.epochs += 1
        take = self._next if times is None else _timed_delivery(self._next, times)
        try:
            run.top_up()
            while True:
                got = take(run)
                if got is None:
                    break
                _, batch, feats = got
                run.delivered(batch.step)
                run.top_up()
                yield batch, feats
        finally:
            if self.open is run and not self.closed:
                self._drain(run)

    def _next(self, run: _Epoch) -> Optional[Tuple[SlotReady, Minibatch, torch.Tensor]]:
        """The next minibatch of ``run``, out of its slot, or None once its marks are in."""
        if self.open is not run:
            raise RuntimeError("this epoch was ended: the loader's processes were closed during it")
        while not run.complete:
            item, feats = self._receive()
            if run.times is not None:  # what the producer measured, with a slot or at the mark
                _add_producer_timings(run.times, item.trace)
            if isinstance(item, EpochMark):
                run.marks += 1
                continue
            batch, feats = self._take(item, feats)
            return item, batch, feats
        self.open = None
        return None

    def _receive(self):
        try:
            got = next(self.incoming, None)
            if got is None:
                self.sup.check()
                raise PipelineError("producer", "the producer ended the run before the epoch was complete")
            return got
        except BaseException:
            self._end()
            raise

    def _take(self, item: SlotReady, feats: torch.Tensor) -> Tuple[Minibatch, torch.Tensor]:
        """The minibatch and its rows as tensors of their own; the slot goes back."""
        batch = item.batch
        if self.reader.gpu_slots:
            batch = batch.with_packed(batch.packed.clone())
        if self.reader.gpu_slots or not self.reader.copy_in:
            feats = feats.clone()
        self.reader.release(item)
        return batch, feats

    def _drain(self, run: _Epoch) -> None:
        """Ends ``run`` early: no more seeds are sent, and the minibatches in flight are taken
        and given back unused."""
        run.end()
        while not run.complete:
            item, _ = self._receive()
            if isinstance(item, EpochMark):
                run.marks += 1
            else:
                self.reader.release(item)
        run.drained()
        self.open = None



def _timed_delivery(take: Callable[[_Epoch], Optional[Tuple[SlotReady, Minibatch, torch.Tensor]]], times: StageTimes):
    """``take`` (:meth:`LoaderProcesses._next`) with each minibatch's delivery timed into
    ``times`` (the deliver stage: the wait for it and its taking out of the ring; ``_next`` adds
    the sample and gather times the producer measured)."""

    def timed_take(run: _Epoch):
        began = times.begin()
        got = take(run)
        if got is not None:
            times.end(Stage.DELIVER, began)
        return got
    return timed_take


def _add_producer_timings(times: StageTimes, trace: Optional[dict]) -> None:
    """The sample and gather times the producer measured (a message's ``trace``) into ``times``."""
    for key, values in (trace or {}).items():
        if key in _PRODUCER_STAGES:
            times.add(_PRODUCER_STAGES[key], values)


class ProcessWay:
    """What a loader that may run its stages in processes shares: ``processes`` (its
    :class:`LoaderProcesses`, None in-process) and their end, by :meth:`close` or ``with``.
    After ``close`` the loader cannot be iterated with ``pipeline`` again."""

    processes: Optional[LoaderProcesses] = None

    def close(self) -> None:
        """Ends the process way's processes (nothing to do in-process)."""
        if self.processes is not None:
            self.processes.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
