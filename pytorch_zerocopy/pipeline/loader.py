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
torch's generator there, as in-process): an epoch's :class:`EpochBatches`, written once, at
the epoch's start, into a buffer in shared memory (:class:`SeedBuffer`, made once and remade
only for a larger epoch; :class:`EpochSeeds` says where the epoch lies in it). Then it keeps up
to ``Plan.num_slots + Plan.queue_depth + Plan.gather_batches`` minibatches in flight, topped
up a group (``gather_batches``) at a time with one :class:`SeedRange` of ints per sampling
role: per minibatch the calling process copies nothing and sends no tensor (a tensor on a
queue would need its GIL, held by a training step written in Python, to be received). An
epoch ends with an :class:`~.messages.EpochMark` from every sampling role.

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
from dataclasses import dataclass, replace
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import torch

from ..datasets.base import NodeDataset, shared_host_tensor
from ..feature_table import CacheConfig
from ..graph import CSRGraph
from ..sampling import draw_seeds
from .gather import choose_cached_rows
from .messages import EpochMark, Minibatch, PackedParts, SlotReady
from .minibatches import SampleStage, SeedBatch
from .partition import this_process_client_env
from .plan import GatherIn, Partition, Phase, Plan, PlanError, make_plan
from .producer import producer_main
from .ring import RingReader
from .runner import PipelineError, Supervisor, close_queue, cpu_role_environment, direct_queue
from .sampler import sampler_main
from .trace import Stage, StageTimes

LOADER_PRODUCER_SHARE = 50.0
"""The producer's share of the GPU's threads in a loader's process way under MPS. It yields to
the training process there (below-normal priority: the user's step is what must not wait), and
it samples on the GPU, a chain of small kernels and a wait per minibatch that runs behind the
step's kernels: on a smaller share it falls behind the step."""
HEALTH_CHECK_SECONDS = 0.5  # how often a loop waiting for a minibatch checks the roles are alive
CLOSE_TIMEOUT_SECONDS = 60.0
_PRODUCER_STAGES = {"sample_ms": Stage.SAMPLE, "gather_ms": Stage.GATHER}


@dataclass(frozen=True)
class EpochBatches:
    """One epoch's minibatches, as a loader hands them to :meth:`LoaderProcesses.epoch`, in
    order: minibatch ``i`` has the seeds ``seeds[cuts[i]:cuts[i + 1]]`` (CPU int64 node ids),
    draws with ``sample_seeds[i]`` and carries ``carried[cuts[i]:cuts[i + 1]]`` (CPU int64
    values packed as its labels part, so they reach the training process where the minibatch
    is, in its one copy; None: no labels part)."""

    seeds: torch.Tensor
    cuts: torch.Tensor
    sample_seeds: torch.Tensor
    carried: Optional[torch.Tensor] = None

    def __post_init__(self):
        for name in ("seeds", "cuts", "sample_seeds", "carried"):
            t = getattr(self, name)
            if t is None and name == "carried":
                continue
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() != 1 or t.device.type != "cpu":
                got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"EpochBatches.{name} must be a 1-D CPU int64 tensor, got {got}")
        b = self.sample_seeds.numel()
        if self.cuts.numel() != b + 1:
            raise ValueError(f"EpochBatches: {b} sample seeds need {b + 1} cuts, got {self.cuts.numel()}")
        if b and (int(self.cuts[0]) != 0 or int(self.cuts[-1]) != self.seeds.numel()
                  or bool((self.cuts[1:] < self.cuts[:-1]).any())):
            raise ValueError(f"EpochBatches: cuts must rise from 0 to len(seeds) = {self.seeds.numel()}, got "
                             f"{self.cuts.tolist()[:8]}...")
        if self.carried is not None and self.carried.numel() != self.seeds.numel():
            raise ValueError(f"EpochBatches: carried must hold one value per seed ({self.seeds.numel()}), "
                             f"got {self.carried.numel()}")

    @classmethod
    def of(cls, batches: Sequence[Tuple[torch.Tensor, Optional[torch.Tensor]]],
           sample_seeds: torch.Tensor) -> "EpochBatches":
        """The epoch of ``batches``, each ``(seeds, carried or None)`` (all carried or none)."""
        sizes = [int(s.numel()) for s, _ in batches]
        cuts = torch.zeros(len(sizes) + 1, dtype=torch.int64)
        if sizes:
            torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0, out=cuts[1:])
        seeds = torch.cat([s.reshape(-1) for s, _ in batches]) if batches else torch.empty(0, dtype=torch.int64)
        carried = None
        if batches and batches[0][1] is not None:
            carried = torch.cat([c.reshape(-1) for _, c in batches])
        return cls(seeds.to(torch.int64), cuts, sample_seeds, None if carried is None else carried.to(torch.int64))

    @classmethod
    def cut(cls, seeds: torch.Tensor, size: int, carried: Optional[torch.Tensor] = None) -> "EpochBatches":
        """The epoch of ``seeds`` (and ``carried``) in order, cut into minibatches of ``size``,
        the last one partial where ``size`` does not divide them; one sampling seed per
        minibatch drawn now from torch's default generator (:func:`~pytorch_zerocopy.sampling.draw_seeds`)."""
        n = seeds.numel()
        cuts = torch.arange(0, n + size, size).clamp_(max=n)  # each minibatch's start, then the end
        return cls(seeds.to(torch.int64), cuts, draw_seeds(cuts.numel() - 1),
                   None if carried is None else carried.to(torch.int64))

    @property
    def num_batches(self) -> int:
        return self.sample_seeds.numel()


@dataclass(frozen=True)
class SeedBuffer:
    """Calling process -> sampling roles, when the buffer of the epochs' seeds is made (and
    remade, larger, for an epoch that does not fit): ``values``, int64 in shared memory."""

    values: torch.Tensor


@dataclass(frozen=True)
class EpochSeeds:
    """Calling process -> sampling roles, at an epoch's start: the buffer holds, in order, its
    ``seeds`` seed ids, as many carried values where ``carried``, its ``batches`` sample
    seeds, then its ``batches + 1`` cuts (:class:`EpochBatches`)."""

    epoch: int
    seeds: int
    batches: int
    carried: bool


@dataclass(frozen=True)
class SeedRange:
    """Calling process -> a sampling role: sample minibatches ``range(start, stop, step)`` of
    ``epoch`` (a top-up costs one queue write per role)."""

    epoch: int
    start: int
    stop: int
    step: int = 1


class _SeedBuffer:
    """The calling process's side of the seeds' buffer: one epoch's :class:`EpochBatches` at a
    time, rewritten at the next epoch's start (by then every role has read the last one: the
    epoch ended with each role's mark)."""

    def __init__(self):
        self.values: Optional[torch.Tensor] = None

    def write(self, epoch: int, batches: EpochBatches, queues: list) -> EpochSeeds:
        """Writes ``batches`` into the buffer (made, or remade larger, first and sent to every
        role in ``queues``) and returns where they lie."""
        parts = [batches.seeds] + ([batches.carried] if batches.carried is not None else []) + \
            [batches.sample_seeds, batches.cuts]
        need = sum(p.numel() for p in parts)
        if self.values is None or self.values.numel() < need:
            size = need if self.values is None else max(need, 2 * self.values.numel())
            self.values = shared_host_tensor((size,), torch.int64)
            for q in queues:
                q.put(SeedBuffer(self.values))
        torch.cat(parts, out=self.values[:need])
        return EpochSeeds(epoch, batches.seeds.numel(), batches.num_batches, batches.carried is not None)


class _RoleSeeds:
    """A sampling role's side: the current epoch's parts of the buffer (views)."""

    def __init__(self):
        self.values: Optional[torch.Tensor] = None  # the buffer, once sent
        self.epoch: Optional[EpochSeeds] = None  # the epoch whose parts follow
        self.seeds = self.carried = None
        self.sample_seeds: List[int] = []
        self.cuts: List[int] = []

    def start(self, epoch: EpochSeeds) -> None:
        if self.values is None:
            raise RuntimeError("a loader's sampling role got an epoch's seeds before their buffer")
        n, b = epoch.seeds, epoch.batches
        self.seeds = self.values[:n]
        at = n
        self.carried = self.values[at: at + n] if epoch.carried else None
        at += n if epoch.carried else 0
        self.sample_seeds = self.values[at: at + b].tolist()
        self.cuts = self.values[at + b: at + 2 * b + 1].tolist()
        self.epoch = epoch

    def batches(self, r: SeedRange) -> Iterator[SeedBatch]:
        if self.epoch is None or self.epoch.epoch != r.epoch:
            raise RuntimeError(f"a loader's sampling role got minibatches of epoch {r.epoch} before that epoch's seeds")
        for i in range(r.start, r.stop, r.step):
            a, b = self.cuts[i], self.cuts[i + 1]
            # Views of the buffer: read before the minibatch is delivered, then rewritten.
            yield SeedBatch(Phase.TRAIN, r.epoch, i, self.seeds[a:b], self.sample_seeds[i],
                            None if self.carried is None else self.carried[a:b])


class FedStage(SampleStage):
    """A loader's sample stage, whose seeds come from the loader's process: sampling role ``w``
    reads an epoch's :class:`EpochSeeds` (in the :class:`SeedBuffer` it was sent), then the
    :class:`SeedRange` s of its minibatches and the epoch's mark from ``queues[w]`` until None
    (:class:`LoaderProcesses` sets :attr:`queues` before the roles start). The labels part
    packed is what the loader carried along (else empty), completed by
    :meth:`~.minibatches.SampleStage.finish_labels`: the loader reads what else it needs."""

    queues: Optional[list] = None
    waits_for_delivery = True

    def seeds(self, plan: Plan, ds: NodeDataset, worker: int, workers: int):
        q = self.queues[worker]
        seeds = _RoleSeeds()
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, SeedBuffer):
                seeds.values = item.values
            elif isinstance(item, EpochSeeds):
                seeds.start(item)
            elif isinstance(item, SeedRange):
                yield from seeds.batches(item)
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
    step runs here) on :data:`LOADER_PRODUCER_SHARE` of the GPU; elsewhere the producer's process
    and this one take turns on the GPU. ``cache``: the plan's cache of the gathered table (None:
    the plan's default)."""
    partition = "mps" if this_process_client_env(100.0) is not None else "none"
    settings = {"producer_share": LOADER_PRODUCER_SHARE}
    if cache is not None:
        settings["cache"] = cache
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
    graph = CSRGraph(in_shared_memory(lists.indptr), in_shared_memory(lists.indices), placement="cpu", validate=False,
                     eids=None if lists.eids is None else in_shared_memory(lists.eids))
    rows = in_shared_memory(table).reshape(table.shape[0], -1)
    return NodeDataset(name, graph, rows, none, seeds.reshape(-1).long(), none, none, 0)


def in_shared_memory(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU, itself where it is contiguous in shared memory, else a copy there."""
    t = t.cpu()
    if t.is_shared() and t.is_contiguous():
        return t
    return shared_host_tensor(t.shape, t.dtype).copy_(t)


class _Watched:
    """``get`` of a :func:`~.runner.direct_queue` that checks, while it waits, that every role
    is alive. A message that cannot be received (its tensors were shared by a role that died
    meanwhile) raises the role's failure."""

    def __init__(self, q, sup: Supervisor):
        self.q, self.sup = q, sup

    def get(self):
        try:
            while not self.q._reader.poll(HEALTH_CHECK_SECONDS):
                self.sup.check()
            return self.q.get()
        except (OSError, EOFError, RuntimeError):
            self.sup.check(timeout=HEALTH_CHECK_SECONDS)
            raise


class _Epoch:
    """One epoch's minibatches (:class:`EpochBatches`), sent at most ``limit`` ahead of
    delivery, ``chunk`` at a time; the marks received; ``times``, where its stages are recorded
    (or None)."""

    def __init__(self, queues: list, epoch: int, batches: EpochBatches, limit: int, chunk: int,
                 times: Optional[StageTimes] = None):
        self.queues, self.epoch, self.total, self.times = queues, epoch, batches.num_batches, times
        self.limit, self.chunk = limit, max(1, min(chunk, limit))
        self.sent = self.delivered_count = self.marks = 0
        self.ended = False

    def top_up(self) -> None:
        """Sends the next minibatches, once at least ``chunk`` may go (or the epoch's last
        ones remain), with one message per sampling role; the marks after the last."""
        if self.ended:
            return
        free = self.limit - (self.sent - self.delivered_count)
        left = self.total - self.sent
        if free < min(self.chunk, left):
            return
        stop = self.sent + min(free, left)
        roles = len(self.queues)
        for r, q in enumerate(self.queues):
            first = self.sent + (r - self.sent) % roles  # minibatch i goes to role i % roles
            if first < stop:
                q.put(SeedRange(self.epoch, first, stop, roles))
        self.sent = stop
        if self.sent == self.total:
            self.end()

    def end(self) -> None:
        if not self.ended:
            for q in self.queues:
                q.put(EpochMark(self.epoch, Phase.TRAIN))
            self.ended = True

    @property
    def complete(self) -> bool:
        return self.marks == len(self.queues)

    def delivered(self) -> None:
        self.delivered_count += 1


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
        # In flight: what the ring and the queue hold, and a group's worth more, so that seeds
        # are sent a group at a time (one write per role) and the roles never run short.
        self.in_flight = self.plan.num_slots + self.plan.queue_depth + self.plan.gather_batches
        self.seed_buffer = _SeedBuffer()
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
        # The producer's messages too: a Queue's feeder thread would wait for the producer's GIL.
        ready_q, free_q, self.consumed = direct_queue(ctx), direct_queue(ctx), ctx.Event()
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
            self.reader = RingReader(_Watched(ready_q, sup), free_q, self.device, copies_out=True)
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

    def epoch(self, batches: EpochBatches, times: Optional[StageTimes] = None,
              label_sizes: Callable[[int], Sequence[int]] = lambda rows: ()
              ) -> Iterator[Tuple[Minibatch, torch.Tensor, PackedParts]]:
        """Runs one epoch of ``batches``; yields ``(minibatch, features, parts)`` in the order
        the producer finished them (the order of ``batches`` with one sampling role):
        ``parts``, the minibatch's packed tensor cut with its labels part in pieces of
        ``label_sizes(rows)`` for a minibatch of ``rows`` input rows
        (:meth:`~.messages.Minibatch.parts`). ``times`` records the deliver stage, and the
        sample and gather times the producer measured."""
        if not isinstance(batches, EpochBatches):
            raise TypeError(f"a loader's epoch is an EpochBatches, got {type(batches).__name__}")
        if self.closed:
            raise RuntimeError("this loader's processes were closed; make a new loader")
        if self.sup is None:
            self._start(trace=times is not None)
        return self._run(batches, times, label_sizes)

    def _run(self, batches: EpochBatches, times: Optional[StageTimes], label_sizes: Callable[[int], Sequence[int]]):
        if self.open is not None:
            raise RuntimeError("the loader's process way runs one epoch at a time: finish (or close) the open "
                               "iterator before starting another")
        where = self.seed_buffer.write(self.epochs, batches, self.seed_queues)
        for q in self.seed_queues:
            q.put(where)
        run = self.open = _Epoch(self.seed_queues, self.epochs, batches, self.in_flight, self.plan.gather_batches,
                                 times)
        self.epochs += 1
        take = self._next if times is None else _timed_delivery(self._next, times)
        try:
            run.top_up()
            while True:
                got = take(run, label_sizes)
                if got is None:
                    break
                run.delivered()
                run.top_up()
                yield got
        finally:
            if self.open is run and not self.closed:
                self._drain(run)

    def _next(self, run: _Epoch, label_sizes: Callable[[int], Sequence[int]]
              ) -> Optional[Tuple[Minibatch, torch.Tensor, PackedParts]]:
        """The next minibatch of ``run``, taken out of its slot (:meth:`.RingReader.take_out`),
        or None once its marks are in."""
        if self.open is not run:
            raise RuntimeError("this epoch was ended: the loader's processes were closed during it")
        while not run.complete:
            item, feats = self._receive()
            if run.times is not None:  # what the producer measured, with a slot or at the mark
                _add_producer_timings(run.times, item.trace)
            if isinstance(item, EpochMark):
                run.marks += 1
                continue
            return self.reader.take_out(item, feats, label_sizes(item.rows))
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
        self.open = None



def _timed_delivery(take: Callable, times: StageTimes):
    """``take`` (:meth:`LoaderProcesses._next`) with each minibatch's delivery timed into
    ``times`` (the deliver stage: the wait for it and its taking out of the ring; ``_next`` adds
    the sample and gather times the producer measured)."""

    def timed_take(run: _Epoch, label_sizes: Callable[[int], Sequence[int]]):
        began = times.begin()
        got = take(run, label_sizes)
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
