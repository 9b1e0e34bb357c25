"""GraphSAGE node classification through the zero-copy pipeline: ``zerocopy train``.

Modes (the paper's Figure 11; :mod:`pytorch_zerocopy.pipeline.plan` has the vocabulary):

==================  ==========================================================================
``cpu``             sampling, gathering and training on the CPU
``dma``             CPU sampling (the library's multithreaded op in sampler processes), CPU
                    gather into pinned host slots in a producer process, async copy to the GPU
                    overlapped with training: DGL's default path
``zerocopy-naive``  ``index_select`` on the table's CUDA alias inside the trainer: no reordering,
                    no separate producer, no partitioning
``zerocopy``        a producer process samples each minibatch on the GPU (the graph read from
                    host memory) and gathers its features with the routed zero-copy gather into a
                    GPU ring shared with the trainer (several minibatches per gather), with the
                    GPU partitioned (``mps`` by default where available)
``gpu``             the feature table copied into GPU memory first (the upper bound), sampled on
                    the GPU like ``zerocopy``
==================  ==========================================================================

Without a GPU, ``zerocopy`` runs the same three-process pipeline on the CPU (CPU sampling in a
sampler process, CPU gather from the table in a producer, ring slots in shared memory, CPU
training). Every setting is checked once, when the run's :class:`~pytorch_zerocopy.pipeline.Plan`
is built: a bad one ends the command with one line and status 2.

With no flags, ``zerocopy`` on a GPU takes the fast path the plan decides
(:func:`~pytorch_zerocopy.pipeline.make_plan`): the producer loads the feature table itself into
the host memory kind this machine's GPU reads fastest (measured once per machine), keeps a tenth
of the rows in a GPU cache chosen by pre-sampling (``--cache``; each epoch line then reports the
share of input rows the cache held) and gets the MPS share measured best for that setting.
``--cache``, ``--host-memory`` and ``--producer-share`` override it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .feature_table import CacheConfig, CachePolicy
from .launch import LaunchOptions
from .pipeline.plan import GatherIn, Mode, Partition, Phase, Plan, PlanError, gpu_available, make_plan

MODES = tuple(m.value for m in Mode)
PARTITIONS = ("auto",) + tuple(p.value for p in Partition)
_PHASE_WORDS = {Phase.TRAIN: "training", Phase.VAL: "validation", Phase.TEST: "test"}
EPOCH_LEGEND = ("Each epoch: its training minibatches and their time, the rate at which their input nodes' feature "
                "rows were read (bytes / training time), the mean training loss and the validation accuracy; test "
                "accuracy after the last epoch.")


class ProgressPrinter:
    """Turns pipeline messages into a tqdm bar per phase and one summary line per epoch. Each
    bar counts one phase's minibatches (an epoch's training bar counts exactly the training
    minibatches its summary line reports); ``totals`` holds each phase's count. With
    ``trace``, each summary is followed by the epoch's per-minibatch timings."""

    def __init__(self, totals: Dict[Phase, int], quiet: bool = False, trace: bool = False):
        self.totals = totals
        self.quiet = quiet
        self.trace = trace
        self.bar = None
        self.current: Optional[Tuple[int, int]] = None  # (epoch, phase's place in the epoch) of the bar

    def __call__(self, message) -> None:
        from .pipeline import EpochStats, PartitionInfo, StepDone
        from .pipeline.messages import CacheChoice, TableReady
        from .pipeline.trace import describe_trace
        from .unified import format_bytes

        if self.quiet:
            return
        if isinstance(message, TableReady):
            print(f"feature table: {format_bytes(message.nbytes)} in {message.placement.describe}, ready in "
                  f"{message.seconds:.1f} s", flush=True)
        elif isinstance(message, CacheChoice):
            print(message.describe(), flush=True)
        elif isinstance(message, PartitionInfo):
            if message.kind is Partition.MPS:
                print(f"GPU partition: MPS, producer {message.producer_share:g}% / trainer "
                      f"{message.consumer_share:g}% of the threads")
            elif message.kind is Partition.GREEN:
                print(f"GPU partition: green contexts, producer {message.producer_sms} SMs / trainer "
                      f"{message.consumer_sms} SMs of {message.total_sms} (granularity {message.granularity}, "
                      f"requested {message.requested_producer_sms}"
                      + ("" if message.disjoint else "; torch's green contexts: the SM sets may overlap") + ")")
        elif isinstance(message, StepDone):
            key = (message.epoch, list(Phase).index(message.phase))
            if self.current is None or key > self.current:  # a late minibatch of an earlier phase has no bar
                self._close()
                from tqdm import tqdm

                self.current = key
                self.bar = tqdm(total=self.totals[message.phase],
                                desc=f"epoch {message.epoch} {_PHASE_WORDS[message.phase]}", unit="minibatch",
                                leave=False, file=sys.stderr, dynamic_ncols=True)
            if key == self.current:
                self.bar.update(1)
        elif isinstance(message, EpochStats):
            self._close()
            print(format_epoch(message), flush=True)
            if self.trace and message.trace is not None:
                print(f"  trace: {describe_trace(message.trace)}", flush=True)
            if message.test_nodes:
                print(f"test accuracy {message.test_acc:.4f} on {message.test_nodes:,} test nodes", flush=True)

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def format_epoch(s) -> str:
    """An epoch's summary line (see :data:`EPOCH_LEGEND`)."""
    secs = s.train_seconds
    rate = s.train_batches / secs if secs > 0 else float("nan")
    gbs = s.feature_bytes / secs / 1e9 if secs > 0 else float("nan")
    line = (f"epoch {s.epoch}: {s.train_batches} training minibatches in {secs:.2f} s ({rate:.1f}/s), "
            f"feature rows read at {gbs:.2f} GB/s, loss {s.loss:.4f}, val acc {s.val_acc:.4f}")
    if s.cache_lookups:
        line += f", cache held {s.cache_hit_rate:.1%} of the input rows"
    return line


def _printer(plan: Plan, ds, quiet: bool) -> ProgressPrinter:
    """A printer whose bars count the minibatches :func:`~.pipeline.minibatches.epoch_batches`
    gives each phase."""
    def count(nodes: int, limit: Optional[int]) -> int:
        n = math.ceil(nodes / plan.batch_size)
        return n if limit is None else min(n, limit)

    totals = {Phase.TRAIN: count(ds.train_idx.numel() // plan.world_size, plan.max_batches),
              Phase.VAL: count(ds.val_idx.numel(), plan.val_batches),
              Phase.TEST: count(ds.test_idx.numel(), plan.val_batches)}
    return ProgressPrinter(totals, quiet, plan.trace)


def run_plan(plan: Plan, dataset, *, mps_fallback: bool = False, quiet: bool = False,
             cached_rows: Optional[torch.Tensor] = None, gatherer: Optional[str] = None) -> List:
    """Runs ``plan`` on ``dataset`` with a progress display. ``mps_fallback``: the MPS partition
    was the package's choice, not the user's; where its daemon cannot start, run unpartitioned.
    ``cached_rows``: the rows of ``plan.cache`` when already chosen (else chosen here);
    ``gatherer``: the address of the machine's gatherer serving this plan's trainer, when one is
    running. A plan that resumes starts from the epoch after its checkpoint's
    (:func:`.pipeline.checkpoint.resolve`)."""
    from .pipeline import checkpoint, run_pipeline
    from .pipeline.partition import MpsError

    plan = checkpoint.resolve(plan, dataset)
    if plan.first_epoch and not quiet:
        print(f"resuming after epoch {plan.first_epoch - 1} from the checkpoint in {plan.checkpoint_dir}", flush=True)
    printer = _printer(plan, dataset, quiet)
    try:
        return run_pipeline(plan, dataset, printer, cached_rows=cached_rows, gatherer=gatherer)
    except MpsError as e:
        if not mps_fallback:
            raise
        if not quiet:
            print(f"MPS is not usable here ({e}); running without a GPU partition")
        return run_pipeline(replace(plan, partition=Partition.NONE), dataset, printer, cached_rows=cached_rows)


def train(dataset=None, mode: str = "zerocopy", partition: str = "auto", *, feature_dim: Optional[int] = None,
          quiet: bool = False, **settings) -> List:
    """Trains GraphSAGE on ``dataset`` (a :class:`NodeDataset` or a spec for ``load_dataset``);
    ``settings`` are :class:`~pytorch_zerocopy.pipeline.Plan` fields (``fanouts``,
    ``batch_size``, ``epochs``, ``max_batches``, ...). Returns the per-epoch
    :class:`~pytorch_zerocopy.pipeline.EpochStats`. Raises :class:`PlanError` for a bad
    setting, before anything starts."""
    from .datasets import NodeDataset, load_dataset

    if not isinstance(dataset, NodeDataset):
        dataset = load_dataset(dataset or "community", feature_dim=feature_dim)
    plan = make_plan(mode, partition, row_bytes=dataset.row_bytes, table_bytes=dataset.feature_source.nbytes,
                     quiet=quiet, **settings)
    return run_plan(plan, dataset, mps_fallback=partition == "auto", quiet=quiet)


PEER_FAILURE_GRACE_S = 5.0
# What torch.distributed's backends say when the other end of a collective has gone away.
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing",
              "remote process exited", "Broken pipe")


def lost_a_peer(message: str) -> bool:
    """Whether a failure message says that a collective lost a peer process."""
    return any(s in message for s in _PEER_LOST)


def _rank_main(dataset, plan: Plan, cached_rows: Optional[torch.Tensor] = None,
               gatherer: Optional[str] = None) -> List:
    """One data-parallel worker of :func:`train_data_parallel` (a torch.distributed.elastic
    worker): its own pipeline on GPU ``LOCAL_RANK`` (or the CPU), training its shard; with
    ``gatherer`` (``Plan.gather_in`` machine), its trainer reads what the machine's gatherer at
    that address samples and gathers for it (``machine-reads``: its producer's rows are read
    there).

    The worker only supervises its pipeline's processes and never opens a CUDA context itself
    (so under a shared MPS daemon every GPU client is a role with its thread share). A worker
    that was restarted resumes from the job's checkpoint (:func:`.pipeline.checkpoint.after_restart`);
    it returns no epochs when the job had finished training before the restart."""
    from .launch import restart_count
    from .pipeline import PipelineError, checkpoint

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    plan = plan.for_rank(rank, int(os.environ["WORLD_SIZE"]), local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if restart_count():
        plan = checkpoint.after_restart(plan)
        if plan is None:
            return []
    if plan.on_gpu and local_rank >= torch.cuda.device_count():
        raise RuntimeError(f"worker {rank} has local rank {local_rank}, but this machine has "
                           f"{torch.cuda.device_count()} GPU(s): ask for at most that many with --gpus")
    try:
        return run_plan(plan, dataset, quiet=rank != 0, cached_rows=cached_rows, gatherer=gatherer)
    except PipelineError as e:
        if lost_a_peer(str(e)):
            # A consequence of another rank's failure, not a cause: give the failing rank time to
            # exit first, so the launcher reports its traceback (the agent ends this worker then).
            time.sleep(PEER_FAILURE_GRACE_S)
        raise


def check_restarts(max_restarts: int, plan: Plan) -> None:
    """Raises :class:`PlanError` unless ``max_restarts`` (restarts of a job) can work
    with ``plan``: restarted workers resume from its checkpoints, so it needs ``checkpoint_dir``."""
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise PlanError("max_restarts", f"max_restarts must be an int >= 0, got {max_restarts!r}")
    if max_restarts and plan.checkpoint_dir is None:
        raise PlanError("max_restarts", "max_restarts resumes restarted workers from the last checkpoint: it needs "
                                        "checkpoint_dir (--checkpoint DIR)")


def train_data_parallel(dataset, nproc: int, mode: str = "zerocopy", partition: str = "auto", *,
                        launch_options=None, quiet: bool = False, use_gpu: Optional[bool] = None,
                        cached_rows: Optional[torch.Tensor] = None, plan: Optional[Plan] = None,
                        **settings) -> Dict[int, List]:
    """Data-parallel training: ``nproc`` pipelines on this machine (one per GPU; CPU workers over
    gloo without a GPU), gradients averaged over NCCL (inside the step's CUDA graphs; with DDP
    when ``cuda_graph=False`` and on CPU workers), one shared copy of the dataset.

    The plan is made once, here (``settings``: :class:`Plan` fields), unless ``plan`` is given
    (made by :func:`make_plan` with ``local_processes=nproc``); each worker takes its rank's
    share of it (:meth:`Plan.for_rank`). The dataset is put in shared memory once, here, and
    every worker maps it. The machine holds one copy of the feature table: on two GPUs the plan's
    default has one process of the machine (``Plan.gather_in`` machine,
    :mod:`.pipeline.machine`) load it, in the host memory kind the GPUs read fastest, and sample
    and gather for every worker's trainer; on more (see
    :data:`~.pipeline.plan.MACHINE_GATHERER_TRAINERS`) each worker's own producer maps one table
    in a shareable placement (``unified``), made here once; where the job's GPUs hang off
    several NUMA nodes the shared graph and table are interleaved over them (``Plan.numa_nodes``,
    :mod:`pytorch_zerocopy.numa`). ``use_gpu=False`` keeps every
    pipeline on the CPU (gloo) even where GPUs exist. With MPS partitioning (the default for
    ``zerocopy`` where MPS exists), this process starts one MPS control daemon that serves
    every GPU of the machine, each pipeline's producer and trainer
    connect to it with their thread shares, and it is stopped when the run ends, also when a
    worker fails. ``cached_rows``: the rows of a ``cache`` setting, when already chosen
    (:func:`~pytorch_zerocopy.pipeline.gather.choose_cached_rows`); else chosen here, once for
    every rank. Returns each rank's epoch statistics.

    Checkpoints (``checkpoint_dir``, ``resume``: :mod:`pytorch_zerocopy.pipeline.checkpoint`):
    on one machine the checkpoint is checked here, before any worker starts. With
    ``launch_options.max_restarts`` (which needs ``checkpoint_dir``), a job whose worker (or
    gatherer) dies is restarted whole, and its workers resume from the last checkpoint: the job
    loses at most the epoch in flight, and the statistics returned are those of the last
    attempt's epochs. On one machine the restarts are this function's (:func:`_attempts`): each
    attempt gets its own MPS daemon and gatherer, as a process killed while it had GPU work in
    flight can leave the MPS server and its other clients in an undefined state; across
    machines they are elastic's, which restarts the workers only.
    """
    from .pipeline import checkpoint
    from .pipeline.gather import choose_cached_rows

    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise PlanError("nproc", f"nproc must be >= 1, got {nproc!r}")
    if plan is None:
        plan = make_plan(mode, partition, row_bytes=dataset.row_bytes, table_bytes=dataset.feature_source.nbytes,
                         gpu=use_gpu, local_processes=nproc, quiet=quiet, **settings)
    options = launch_options or LaunchOptions()
    options.nproc_per_node = nproc
    check_restarts(options.max_restarts, plan)
    if plan.checkpoint_dir is not None and options.single_machine():
        checkpoint.resolve(replace(plan, world_size=nproc), dataset)  # the workers resolve it again, as they start
    # One shared copy of the graph (and of a shareable table), made here, that every worker maps.
    dataset.share_for_gpus(plan.numa_nodes, features=plan.table_in.shareable)
    if cached_rows is None:  # once, for every rank
        cached_rows = choose_cached_rows(plan, dataset, None if quiet else lambda c: print(c.describe(), flush=True))
    if not options.single_machine():
        return _attempt(plan, dataset, cached_rows, options, partition, quiet)
    return _attempts(lambda launch_options: _attempt(plan, dataset, cached_rows, launch_options, partition, quiet),
                     options, quiet)


def _attempts(run: Callable[[LaunchOptions], Dict[int, List]], options: LaunchOptions, quiet: bool) -> Dict[int, List]:
    """``run``'s result for the first attempt that succeeds, of ``1 + options.max_restarts``:
    each attempt is launched with elastic's own restarts off and its number in the workers'
    environment (:data:`~pytorch_zerocopy.launch.ATTEMPT_ENV`, read by
    :func:`~pytorch_zerocopy.launch.restart_count`). Raises the last attempt's failure."""
    from .launch import ATTEMPT_ENV, WorkerFailed
    from .pipeline import PipelineError

    for attempt in range(options.max_restarts + 1):
        env = {**options.extra_env, ATTEMPT_ENV: str(attempt)}
        try:
            return run(replace(options, max_restarts=0, extra_env=env))
        except (WorkerFailed, PipelineError) as e:
            if attempt == options.max_restarts:
                raise
            if not quiet:
                print(f"the job failed ({_one_line(e)}); restarting it from its last checkpoint "
                      f"(restart {attempt + 1} of {options.max_restarts})", flush=True)
    raise AssertionError("unreachable")


def _attempt(plan: Plan, dataset, cached_rows: Optional[torch.Tensor], options: LaunchOptions, partition: str,
             quiet: bool) -> Dict[int, List]:
    """One attempt of :func:`train_data_parallel`'s job: its MPS daemon (when the plan
    partitions the GPUs with MPS), its gatherer and its workers, all stopped when it ends."""
    from .pipeline.partition import MpsDaemon, MpsError

    if plan.partition is not Partition.MPS:
        return _launch_ranks(plan, dataset, cached_rows, options, None, quiet)
    daemon = MpsDaemon()
    try:
        daemon.start()
    except MpsError as e:
        if partition != "auto":
            raise
        if not quiet:
            print(f"MPS is not usable here ({e}); running without a GPU partition")
        return _launch_ranks(replace(plan, partition=Partition.NONE), dataset, cached_rows, options, None, quiet)
    try:
        if not quiet:
            print(f"GPU partition: MPS, one daemon for all {options.nproc_per_node} pipelines of this machine")
        options.extra_env = {**options.extra_env, **daemon.shared_env()}
        return _launch_ranks(plan, dataset, cached_rows, options, daemon, quiet)
    finally:
        daemon.stop()


def _launch_ranks(plan: Plan, dataset, cached_rows: Optional[torch.Tensor], options, daemon, quiet: bool) -> Dict[int, List]:
    """Launches the ranks of :func:`train_data_parallel`; with ``Plan.gather_in`` machine (or
    machine-reads), the
    machine's gatherer first (a child of this process under ``daemon``'s producer share, when
    MPS partitions the GPUs), serving the trainers until the launch ends (every elastic
    restart's, across machines). A job that fails after the gatherer did raises the gatherer's
    failure."""
    from .launch import launch
    from .pipeline.machine import gatherer_main
    from .pipeline.runner import Supervisor, cpu_role_environment

    if not plan.gather_in.machine:
        return launch(_rank_main, (dataset, plan, cached_rows), options)
    sup = Supervisor()
    try:
        env = dict(cpu_role_environment(plan))
        if daemon is not None:
            env.update(daemon.client_env(plan.producer_share, below_normal=plan.producer_yields))
        sock = sup.listen()
        sup.start("gatherer", gatherer_main, (plan, dataset, cached_rows, sock), env)
        address = sock.getsockname()
        sock.close()
        if not quiet:
            print(f"one gatherer for all {options.nproc_per_node} trainers of this machine: "
                  f"the feature table in {plan.table_in.describe}", flush=True)
        try:
            return launch(_rank_main, (dataset, plan, cached_rows, address), options)
        except BaseException:
            sup.check(timeout=1.0)  # the gatherer's own failure, when it is the cause
            raise
    finally:
        sup.shutdown()


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``--help`` with every flag's default (as its help words it, where it does; none where it
    is empty or None), and descriptions kept as written."""

    def _get_help_string(self, action):
        if "(default" in (action.help or "") or action.default in (None, ""):
            return action.help
        return super()._get_help_string(action)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=MODES, default="zerocopy",
                   help="how features reach the trainer: cpu (no GPU), dma (CPU gather + copy), zerocopy-naive (the "
                        "trainer's GPU reads its rows in place with index_select: no producer process, reordering or "
                        "partition), zerocopy (GPU reads host memory in place), gpu (table copied into GPU memory)")
    p.add_argument("--partition", choices=PARTITIONS, default="auto",
                   help="GPU partition for --mode zerocopy (auto: MPS where available)")
    p.add_argument("--dataset", default="community",
                   help="'community' (embedded), 'papers-like:NODES[:DEGREE]', or an OGB directory")
    p.add_argument("--fanouts", default="10,10", help="neighbours per layer, input layer first (e.g. 15,10,5)")
    p.add_argument("--batch-size", type=int, default=1024, help="seed nodes per minibatch")
    p.add_argument("--epochs", type=int, default=2, help="training epochs (test accuracy after the last)")
    p.add_argument("--feature-dim", type=int, default=None,
                   help="feature width of generated datasets (default: 64 for community, 128 for papers-like)")
    p.add_argument("--max-batches", type=int, default=None, help="training minibatches per epoch (default: all)")
    cache_memory = "GPU memory" if gpu_available() else "host memory (no GPU here; GPU memory on a GPU)"
    p.add_argument("--cache", default=None, metavar="SIZE",
                   help=f"--mode zerocopy: keep the hottest feature rows in {cache_memory}: a share of the table "
                        "('10%%'), a size ('2GiB', '500MB'), a row count, or 'none' (default: on a GPU, 10%% of the "
                        "rows, at most a quarter of the GPU's memory; none on the CPU)")
    p.add_argument("--cache-policy", choices=tuple(c.value for c in CachePolicy), default=None,
                   help="which rows --cache holds: presample (the rows a pre-sampled epoch of the training seeds "
                        "reads most; GNNLab's choice) or degree (nodes in the most neighbour lists) "
                        "(default: presample)")
    p.add_argument("--host-memory", choices=("auto", "mapped", "managed"), default="auto",
                   help="mode zerocopy on a GPU: where the producer holds the feature table: managed (its own "
                        "managed memory kept in host memory), mapped (shared memory mapped in place) or auto (the "
                        "kind this machine's GPU reads faster, measured once; 'zerocopy doctor' shows both)")
    p.add_argument("--producer-share", type=float, default=None,
                   help="MPS: percent of GPU threads for the producer (default: 25 with a cache in front of managed "
                        "memory, else 10)")
    p.add_argument("--producer-sms", type=int, default=16, help="green: SMs for the producer (rounded up)")
    p.add_argument("--sample-on", choices=("auto", "cpu", "gpu"), default="auto",
                   help="where minibatches are sampled (auto: on the GPU that gathers, except --mode dma and cpu)")
    p.add_argument("--gather-in", choices=("auto",) + tuple(g.value for g in GatherIn), default="auto",
                   help="which process gathers: producer (one per GPU, its own table), machine (one process of "
                        "the machine samples and gathers for every GPU), machine-reads (a producer per GPU samples; "
                        "one process of the machine holds the table and reads the rows), trainer (inline); auto: "
                        "the plan's choice for the GPU count")
    p.add_argument("--samplers", type=int, default=None,
                   help="sampler processes, when sampling on the CPU (default: 2 for dma, else 1)")
    p.add_argument("--gather-batches", type=int, default=None,
                   help="zerocopy: minibatches gathered per call by the producer (default: from the row width)")
    p.add_argument("--hidden", type=int, default=128, help="hidden units per GraphSAGE layer")
    p.add_argument("--eager", action="store_true",
                   help="issue each training step op by op (with DDP on several GPUs) instead of replaying it "
                        "from CUDA graphs")
    p.add_argument("--trace", action="store_true",
                   help="record per-minibatch timings (waits, sample, gather, GPU train) and print their p50/p90 "
                        "after each epoch")
    p.add_argument("--gpus", type=int, default=1,
                   help="data-parallel trainers on this machine, one per GPU (CPU workers without a GPU); with --mode zerocopy on GPUs "
                        "one gatherer process holds the feature table and samples and gathers for all of them")
    # torchrun's multi-machine flags, with torchrun's names (one launcher per machine).
    p.add_argument("--nnodes", default="1", help="machines in the job, or MIN:MAX")
    p.add_argument("--node-rank", type=int, default=0, help="this machine's rank in the job")
    p.add_argument("--rdzv-backend", default="c10d", help="rendezvous backend (several machines)")
    p.add_argument("--rdzv-endpoint", default="", help="host:port of the rendezvous (several machines)")
    p.add_argument("--rdzv-id", default="", help="job id shared by the machines' launchers")
    p.add_argument("--seed", type=int, default=0, help="seed of parameters, minibatch order and sampling")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="write the model, the optimiser and the epoch to DIR/checkpoint.pt after every epoch "
                        "(atomically; one directory every rank sees)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run whose checkpoint --checkpoint DIR holds, from the epoch after it, with "
                        "the minibatches an uninterrupted run would have trained on")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="restart the job up to N times when a worker (or the gatherer) dies, resuming from the "
                        "last checkpoint (needs --checkpoint)")


# The command-line flag of each setting a bad value of which the plan reports.
_FLAGS = {"batch_size": "--batch-size", "epochs": "--epochs", "max_batches": "--max-batches", "hidden": "--hidden",
          "fanouts": "--fanouts", "num_samplers": "--samplers", "gather_batches": "--gather-batches",
          "producer_share": "--producer-share", "producer_sms": "--producer-sms", "seed": "--seed",
          "feature_dim": "--feature-dim", "nproc": "--gpus", "mode": "--mode", "partition": "--partition",
          "sample_on": "--sample-on", "gather_in": "--gather-in", "cache": "--cache", "cache_policy": "--cache-policy",
          "feature_placement": "--host-memory", "checkpoint_dir": "--checkpoint", "resume": "--resume",
          "max_restarts": "--max-restarts"}


def _one_line(error: Exception) -> str:
    """The error's message with the setting named by its flag, on one line."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    for setting, flag in _FLAGS.items():
        if message.startswith(setting + " "):
            return flag + message[len(setting):]
    return message


def _parse_fanouts(text: str):
    try:
        return tuple(int(f) for f in str(text).split(",") if f.strip())
    except ValueError:
        raise PlanError("fanouts", f"fanouts must be comma-separated integers, got {text!r}") from None


_BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_cache(text: str, policy: Optional[str] = None) -> Optional[CacheConfig]:
    """``--cache SIZE`` as a :class:`CacheConfig`: ``'10%'`` (a share of the table's rows),
    ``'2GiB'`` / ``'500MB'`` (bytes of cached rows) or ``'100000'`` (rows); ``'none'``: no cache
    (None); ``policy``: ``'presample'`` (default) or ``'degree'``. Raises :class:`PlanError`
    naming ``cache``."""
    policy_ = CachePolicy(policy or CachePolicy.PRESAMPLE.value)
    t = str(text).strip().lower().replace(" ", "")
    if t == "none":
        if policy is not None:
            raise PlanError("cache_policy", "cache_policy applies to a cache, not to --cache none")
        return None
    want = "a share of the table ('10%'), a size ('2GiB', '500MB'), a row count ('100000') or 'none'"
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)(%|[kmgt]i?b|b)?", t)
    if m is None:
        raise PlanError("cache", f"cache must be {want}, got {text!r}")
    number, unit = float(m.group(1)), m.group(2)
    if unit == "%":
        if not 0 < number <= 100:
            raise PlanError("cache", f"cache must be a share in (0%, 100%], got {text!r}")
        return CacheConfig(policy=policy_, fraction=number / 100)
    if unit is not None:
        size = int(number * _BYTE_UNITS[unit])
        if size < 1:
            raise PlanError("cache", f"cache must be at least one byte, got {text!r}")
        return CacheConfig(policy=policy_, cache_bytes=size)
    if number != int(number) or number < 1:
        raise PlanError("cache", f"cache must be {want}; a row count is a whole number >= 1, got {text!r}")
    return CacheConfig(policy=policy_, rows=int(number))


def run_from_args(args: argparse.Namespace) -> int:
    from .datasets import parse_dataset
    from .launch import WorkerFailed
    from .pipeline import PipelineError

    settings = dict(batch_size=args.batch_size, epochs=args.epochs, max_batches=args.max_batches,
                    producer_share=args.producer_share, producer_sms=args.producer_sms, hidden=args.hidden,
                    seed=args.seed, feature_placement=None if args.host_memory == "auto" else args.host_memory,
                    checkpoint_dir=args.checkpoint, resume=args.resume)
    if args.samplers is not None:
        settings["num_samplers"] = args.samplers
    if args.gather_batches is not None:
        settings["gather_batches"] = args.gather_batches
    if args.eager:
        settings["cuda_graph"] = False
    if args.sample_on != "auto":
        settings["sample_on"] = args.sample_on
    if args.gather_in != "auto":
        settings["gather_in"] = args.gather_in
    if args.trace:
        settings["trace"] = True
    # A job that may restart runs its one pipeline as a launched worker (train_data_parallel restarts it).
    distributed = args.gpus != 1 or args.nnodes not in ("1", "1:1") or args.max_restarts != 0
    try:
        if args.gpus < 1:
            raise PlanError("nproc", f"nproc must be >= 1, got {args.gpus}")
        settings["fanouts"] = _parse_fanouts(args.fanouts)
        if args.cache is not None:
            settings["cache"] = parse_cache(args.cache, args.cache_policy)
        elif args.cache_policy is not None:
            raise PlanError("cache_policy", "cache_policy applies to a cache: give --cache SIZE too")
        spec = parse_dataset(args.dataset, feature_dim=args.feature_dim, seed=args.seed)
        plan = make_plan(args.mode, args.partition, row_bytes=spec.row_bytes, table_bytes=spec.table_bytes,
                         local_processes=args.gpus, quiet=False, **settings)
        check_restarts(args.max_restarts, plan)
    except ValueError as e:
        print(f"zerocopy train: {_one_line(e)}", file=sys.stderr)
        return 2
    if plan.device == "cpu" and plan.mode in (Mode.ZEROCOPY, Mode.CPU):
        print("No CUDA GPU available: running the CPU path (CPU sampling, gathering and training"
              + (", same sampler -> producer -> trainer pipeline" if plan.mode is Mode.ZEROCOPY else "") + ").")

    start = time.perf_counter()
    try:
        ds = spec.load()
        print(f"dataset {ds.describe()} (ready in {time.perf_counter() - start:.1f} s)")
        print(f"training GraphSAGE ({len(plan.fanouts)} layers, hidden {plan.hidden}) on {ds.name}; {plan.describe()}")
        print(f"fanouts {list(plan.fanouts)}, batch size {plan.batch_size}, epochs {plan.epochs}. {EPOCH_LEGEND}")
        if distributed:
            from .launch import LaunchOptions

            where = f"{args.gpus} GPU(s)" if plan.on_gpu else f"{args.gpus} CPU worker(s) over gloo"
            print(f"data-parallel: {where} per machine, {args.nnodes} machine(s)")
            options = LaunchOptions(nnodes=args.nnodes, node_rank=args.node_rank, rdzv_backend=args.rdzv_backend,
                                    rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                                    max_restarts=args.max_restarts)
            train_data_parallel(ds, args.gpus, args.mode, args.partition, launch_options=options, quiet=False,
                                plan=plan)
        else:
            run_plan(plan, ds, mps_fallback=args.partition == "auto")
    except (PipelineError, WorkerFailed) as e:
        print(f"zerocopy train failed: {e}", file=sys.stderr)
        return 1
    except (RuntimeError, ValueError, OSError) as e:
        print(f"zerocopy train: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: all pipeline processes stopped", file=sys.stderr)
        return 130
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0
