"""GraphSAGE node classification through the zero-copy pipeline: ``zerocopy train``.

Modes (the paper's Figure 11):

==================  ==========================================================================
``cpu``             sampling, gathering and training on the CPU
``dma``             CPU gather (all threads) into pinned host slots in a producer process, async
                    copy to the GPU overlapped with training
``zerocopy-naive``  ``index_select`` on the table's CUDA alias inside the trainer: no reordering,
                    no separate producer, no partitioning
``zerocopy``        routed zero-copy gather in a producer process writing a GPU ring shared with
                    the consumer (several minibatches per gather, their blocks uploaded with
                    them), with the GPU partitioned (``mps`` by default where available)
``gpu``             the feature table copied into GPU memory first (the upper bound)
==================  ==========================================================================

Without a GPU, ``zerocopy`` runs the same three-process pipeline on the CPU (CPU gather from
the unified table, ring slots in shared memory, CPU training).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import replace
from typing import Dict, List, Optional

import torch

MODES = ("cpu", "dma", "zerocopy-naive", "zerocopy", "gpu")
PARTITIONS = ("auto", "none", "mps", "green")


def gpu_available() -> bool:
    from .unified import gpu_backed

    return torch.cuda.is_available() and gpu_backed()


def dma_gather_threads(cores: Optional[int] = None) -> int:
    """Threads of the DMA path's CPU gather: all of ``cores`` (default: this machine's) but two,
    which stay free for the trainer's host (it issues every GPU launch of a step) and the
    samplers. With every core gathering, the trainer's host was starved: 11 ms to issue a step
    that runs in 2 ms on the GPU (H200, 16 cores); with two cores free it still took 9-10 ms,
    so this is not the whole cause (benchmarks/results/training.md, dma row of the trace)."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores - 2)


def default_gather_batches(row_bytes: int) -> int:
    """Minibatches the zerocopy producer gathers per call, for rows of ``row_bytes``.

    Short rows are bound by rows per second, which rise with the rows per call (one
    minibatch's ~113 K rows of 512 B: 3.3 ms a gather; eight at once: 2.1 ms a minibatch, on an
    H200; benchmarks/results/training_gather_groups.md): up to 8 for rows under 512 B, fewer as
    rows widen, 1 from 4 KiB, where a single minibatch already streams near the copy ceiling and
    more slots would only hold more GPU memory (the ring needs 2 slots per minibatch of a group)."""
    return max(1, min(8, 4096 // max(1, row_bytes)))


def pipeline_config(mode: str, partition: str = "auto", **overrides):
    """The :class:`PipelineConfig` of a mode; ``partition='auto'`` picks MPS for ``zerocopy``
    when its control binary exists, else none. Raises with a clear message when the mode needs
    a GPU and there is none."""
    from .pipeline import PipelineConfig

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {PARTITIONS}, got {partition!r}")
    gpu = gpu_available()
    if mode in ("dma", "zerocopy-naive", "gpu") and not gpu:
        raise RuntimeError(f"mode {mode!r} needs a CUDA GPU and a CUDA build of pytorch_zerocopy; "
                           "on this machine use --mode zerocopy (the CPU pipeline) or --mode cpu")
    if partition in ("mps", "green") and not gpu:
        raise RuntimeError(f"partition={partition!r} needs a CUDA GPU")
    if partition in ("mps", "green") and mode != "zerocopy":
        raise ValueError(f"partition={partition!r} applies to --mode zerocopy only")
    device = "cuda" if gpu and mode != "cpu" else "cpu"
    cfg = PipelineConfig(device=device)
    if mode == "cpu":
        cfg = replace(cfg, gather="cpu")
    elif mode == "dma":
        cfg = replace(cfg, gather="dma", producer_process=True, producer_threads=dma_gather_threads())
    elif mode == "zerocopy-naive":
        cfg = replace(cfg, gather="naive")
    elif mode == "gpu":
        cfg = replace(cfg, gather="gpu")
    else:
        if partition == "auto":
            partition = "mps" if gpu and shutil.which("nvidia-cuda-mps-control") else "none"
        if partition == "green":
            cfg = replace(cfg, gather="zerocopy", partition="green")
        else:
            cfg = replace(cfg, gather="zerocopy", producer_process=True, partition=partition)
    return replace(cfg, **overrides)


class ProgressPrinter:
    """Turns pipeline messages into a tqdm bar per epoch and one summary line per epoch."""

    def __init__(self, batches_per_epoch: int, val_batches: int, quiet: bool = False):
        self.per_epoch = batches_per_epoch + val_batches
        self.quiet = quiet
        self.bar = None
        self.epoch = -1

    def __call__(self, msg: tuple) -> None:
        if self.quiet:
            return
        kind = msg[0]
        if kind == "partition":
            info = msg[1]
            if info["kind"] == "mps":
                print(f"GPU partition: MPS, producer {info['producer_share']:g}% / consumer "
                      f"{info['consumer_share']:g}% of the threads")
            else:
                print(f"GPU partition: green contexts, producer {info['producer_sms']} SMs / consumer "
                      f"{info['consumer_sms']} SMs of {info['total_sms']} (granularity {info['granularity']}, "
                      f"requested {info['requested_producer_sms']}"
                      + ("" if info.get("disjoint") else "; torch's green contexts: the SM sets may overlap") + ")")
        elif kind == "step":
            _, _, epoch, _ = msg
            if epoch != self.epoch:
                self._close()
                from tqdm import tqdm

                self.epoch = epoch
                self.bar = tqdm(total=self.per_epoch, desc=f"epoch {epoch}", unit="mb", leave=False,
                                file=sys.stderr, dynamic_ncols=True)
            self.bar.update(1)
        elif kind == "epoch":
            self._close()
            print(format_epoch(msg[1]), flush=True)

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def format_epoch(s: dict) -> str:
    secs = s["train_seconds"]
    rate = s["train_batches"] / secs if secs > 0 else float("nan")
    gbs = s["feature_bytes"] / secs / 1e9 if secs > 0 else float("nan")
    return (f"epoch {s['epoch']}: {secs:.2f} s, {s['train_batches']} minibatches ({rate:.1f}/s), "
            f"features {gbs:.2f} GB/s, loss {s['loss']:.4f}, val acc {s['val_acc']:.4f}")


def train(dataset=None, mode: str = "zerocopy", partition: str = "auto", fanouts=(10, 10),
          batch_size: int = 1024, epochs: int = 2, feature_dim: Optional[int] = None,
          max_batches: Optional[int] = None, quiet: bool = False, **overrides) -> List[Dict]:
    """Trains GraphSAGE on ``dataset`` (a :class:`NodeDataset` or a spec for ``load_dataset``)."""
    from .datasets import NodeDataset, load_dataset
    from .pipeline import run_pipeline
    from .pipeline.partition import MpsError

    if not isinstance(dataset, NodeDataset):
        dataset = load_dataset(dataset or "community", feature_dim=feature_dim)
    cfg = pipeline_config(mode, partition, fanouts=tuple(int(f) for f in fanouts), batch_size=batch_size,
                          epochs=epochs, max_batches=max_batches, **overrides)
    # Minibatches per gather: as asked, else the default for the zerocopy GPU ring; the ring
    # then gets two slots per minibatch of a group unless num_slots is given too.
    groups = overrides.get("gather_batches")
    if groups is None and cfg.gather == "zerocopy" and cfg.producer_process and cfg.device.startswith("cuda"):
        groups = default_gather_batches(dataset.feature_dim * dataset.features.element_size())
    if groups is not None:
        cfg = replace(cfg, gather_batches=groups)
        if "num_slots" not in overrides:
            cfg = replace(cfg, num_slots=max(cfg.num_slots, 2 * groups))
    n_train = -(-dataset.train_idx.numel() // batch_size)
    n_val = -(-dataset.val_idx.numel() // batch_size)
    printer = ProgressPrinter(min(n_train, max_batches or n_train), min(n_val, cfg.val_batches or n_val), quiet)
    try:
        return run_pipeline(cfg, dataset, printer)
    except MpsError as e:
        if partition != "auto":
            raise
        # MPS was only the default choice: without a working daemon, train unpartitioned.
        if not quiet:
            print(f"MPS is not usable here ({e}); running without a GPU partition")
        return run_pipeline(replace(cfg, partition="none"), dataset, printer)


PEER_FAILURE_GRACE_S = 5.0
# What torch.distributed's backends say when the other end of a collective has gone away.
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing",
              "remote process exited", "Broken pipe")


def lost_a_peer(message: str) -> bool:
    """Whether a failure message says that a collective lost a peer process."""
    return any(s in message for s in _PEER_LOST)


def _rank_main(dataset, mode: str, partition: str, fanouts, batch_size: int, epochs: int, kwargs: dict) -> List[Dict]:
    """One data-parallel worker of :func:`train_data_parallel` (a torch.distributed.elastic
    worker): its own pipeline on GPU ``LOCAL_RANK`` (or the CPU), training its shard.

    The worker only supervises its pipeline's processes and never opens a CUDA context itself
    (so under a shared MPS daemon every GPU client is a role with its thread share)."""
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    overrides = dict(kwargs)
    use_gpu = overrides.pop("use_gpu", None)
    if use_gpu is False:
        overrides["device"] = "cpu"
    elif gpu_available() and mode != "cpu":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"worker {rank} has local rank {local_rank}, but this machine has "
                               f"{torch.cuda.device_count()} GPU(s): ask for at most that many with --gpus")
        overrides["device"] = f"cuda:{local_rank}"
    # The machine's cores are split between its pipelines: the roles that use all of a
    # process's threads (the DMA gather, CPU training) would otherwise oversubscribe them.
    share = max(1, (os.cpu_count() or 1) // local_world)
    if local_world > 1 and overrides.get("producer_threads") in (None, 0) and mode == "dma":
        overrides["producer_threads"] = dma_gather_threads(share)
    if local_world > 1 and overrides.get("consumer_threads") in (None, 0):
        overrides["consumer_threads"] = share
    from .pipeline import PipelineError

    try:
        return train(dataset, mode, partition, fanouts, batch_size, epochs, quiet=rank != 0,
                     rank=rank, world_size=world_size, **overrides)
    except PipelineError as e:
        if lost_a_peer(str(e)):
            # A consequence of another rank's failure, not a cause: give the failing rank time to
            # exit first, so the launcher reports its traceback (the agent ends this worker then).
            time.sleep(PEER_FAILURE_GRACE_S)
        raise


def _resolve_parallel_partition(mode: str, partition: str) -> str:
    if partition == "auto":
        use_mps = mode == "zerocopy" and gpu_available() and shutil.which("nvidia-cuda-mps-control")
        return "mps" if use_mps else "none"
    if partition == "green":
        return partition
    if partition == "mps" and mode != "zerocopy":
        raise ValueError("partition='mps' applies to --mode zerocopy only")
    if partition == "mps" and not gpu_available():
        raise RuntimeError("partition='mps' needs a CUDA GPU")
    return partition


def train_data_parallel(dataset, nproc: int, mode: str = "zerocopy", partition: str = "auto", fanouts=(10, 10),
                        batch_size: int = 1024, epochs: int = 2, launch_options=None, quiet: bool = False,
                        use_gpu: Optional[bool] = None, **kwargs) -> Dict[int, List[Dict]]:
    """Data-parallel training: ``nproc`` pipelines on this machine (one per GPU; CPU workers over
    gloo without a GPU), gradients averaged over NCCL (inside the step's CUDA graphs; with DDP
    when ``cuda_graph=False`` and on CPU workers), one shared copy of the dataset.

    ``dataset`` must live in shared memory (every :mod:`pytorch_zerocopy.datasets` loader puts
    it there): the workers map it, they do not copy it. ``use_gpu=False`` keeps every
    pipeline on the CPU (gloo) even where GPUs exist (``zerocopy`` and ``cpu`` modes). With MPS
    partitioning (the default for ``zerocopy`` where MPS exists), this process starts one MPS
    control daemon that serves every GPU of the machine, each pipeline's producer and consumer
    connect to it with their thread shares, and it is stopped when the run ends, also when a
    worker fails. Returns each rank's epoch statistics.
    """
    from .launch import LaunchOptions, launch
    from .pipeline.partition import MpsDaemon, MpsError

    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if use_gpu is False:
        if mode not in ("zerocopy", "cpu"):
            raise ValueError(f"use_gpu=False runs the CPU pipeline: mode must be 'zerocopy' or 'cpu', got {mode!r}")
        if partition in ("mps", "green"):
            raise ValueError(f"partition={partition!r} partitions a GPU, but use_gpu=False")
        resolved = "none"
    else:
        resolved = _resolve_parallel_partition(mode, partition)
    options = launch_options or LaunchOptions()
    options.nproc_per_node = nproc
    args = (dataset, mode, resolved, tuple(fanouts), batch_size, epochs, dict(kwargs, use_gpu=use_gpu))
    if resolved != "mps":
        return launch(_rank_main, args, options)
    daemon = MpsDaemon()
    try:
        daemon.start()
    except MpsError as e:
        if partition != "auto":
            raise
        if not quiet:
            print(f"MPS is not usable here ({e}); running without a GPU partition")
        return launch(_rank_main, (dataset, mode, "none") + args[3:], options)
    try:
        if not quiet:
            print(f"GPU partition: MPS, one daemon for all {nproc} pipelines of this machine")
        options.extra_env = {**options.extra_env, **daemon.shared_env()}
        return launch(_rank_main, args, options)
    finally:
        daemon.stop()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=MODES, default="zerocopy", help="how features reach the trainer")
    p.add_argument("--partition", choices=PARTITIONS, default="auto",
                   help="GPU partition for --mode zerocopy (auto: MPS where available)")
    p.add_argument("--dataset", default="community",
                   help="'community' (embedded, default), 'papers-like:NODES[:DEGREE]', or an OGB directory")
    p.add_argument("--fanouts", default="10,10", help="neighbours per layer, input layer first (e.g. 15,10,5)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--feature-dim", type=int, default=None, help="feature width of generated datasets")
    p.add_argument("--max-batches", type=int, default=None, help="training minibatches per epoch (default: all)")
    p.add_argument("--producer-share", type=float, default=10.0, help="MPS: percent of GPU threads for the producer")
    p.add_argument("--producer-sms", type=int, default=16, help="green: SMs for the producer (rounded up)")
    p.add_argument("--samplers", type=int, default=1, help="sampler processes")
    p.add_argument("--gather-batches", type=int, default=None,
                   help="zerocopy: minibatches gathered per call by the producer (default: the mode's)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--eager", action="store_true",
                   help="issue each training step op by op (with DDP on several GPUs) instead of replaying it "
                        "from CUDA graphs")
    p.add_argument("--gpus", type=int, default=1,
                   help="data-parallel pipelines on this machine, one per GPU (CPU workers without a GPU)")
    # torchrun's multi-machine flags, with torchrun's names (one launcher per machine).
    p.add_argument("--nnodes", default="1", help="machines in the job, or MIN:MAX")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--rdzv-backend", default="c10d")
    p.add_argument("--rdzv-endpoint", default="", help="host:port of the rendezvous (several machines)")
    p.add_argument("--rdzv-id", default="")
    p.add_argument("--seed", type=int, default=0)


def run_from_args(args: argparse.Namespace) -> int:
    from .pipeline import PipelineError

    if args.gpus < 1:
        print(f"zerocopy train: --gpus must be >= 1, got {args.gpus}", file=sys.stderr)
        return 2
    distributed = args.gpus > 1 or args.nnodes not in ("1", "1:1")
    try:
        fanouts = [int(f) for f in str(args.fanouts).split(",") if f.strip()]
    except ValueError:
        print(f"zerocopy train: --fanouts must be comma-separated integers, got {args.fanouts!r}", file=sys.stderr)
        return 2
    if args.mode in ("zerocopy", "cpu") and not gpu_available():
        print("No CUDA GPU available: running the CPU path (CPU sampling, gathering and training"
              + (", same sampler -> producer -> consumer pipeline" if args.mode == "zerocopy" else "") + ").")
    from .datasets import load_dataset

    start = time.perf_counter()
    ds = load_dataset(args.dataset, feature_dim=args.feature_dim, seed=args.seed)
    print(f"dataset {ds.describe()} (ready in {time.perf_counter() - start:.1f} s)")
    print(f"mode {args.mode}, fanouts {fanouts}, batch size {args.batch_size}, epochs {args.epochs}")
    kwargs = dict(max_batches=args.max_batches, producer_share=args.producer_share, producer_sms=args.producer_sms,
                  num_samplers=args.samplers, hidden=args.hidden, seed=args.seed, cuda_graph=not args.eager)
    if args.gather_batches is not None:
        kwargs["gather_batches"] = args.gather_batches
    try:
        if distributed:
            from .launch import LaunchOptions

            where = f"{args.gpus} GPU(s)" if gpu_available() else f"{args.gpus} CPU worker(s) over gloo"
            print(f"data-parallel: {where} per machine, {args.nnodes} machine(s)")
            options = LaunchOptions(nnodes=args.nnodes, node_rank=args.node_rank, rdzv_backend=args.rdzv_backend,
                                    rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id)
            train_data_parallel(ds, args.gpus, args.mode, args.partition, fanouts, args.batch_size, args.epochs,
                                launch_options=options, **kwargs)
        else:
            train(ds, args.mode, args.partition, fanouts, args.batch_size, args.epochs, **kwargs)
    except (RuntimeError, ValueError) as e:
        from .launch import WorkerFailed

        if isinstance(e, (PipelineError, WorkerFailed)):
            print(f"zerocopy train failed: {e}", file=sys.stderr)
            return 1
        print(f"zerocopy train: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: all pipeline processes stopped", file=sys.stderr)
        return 130
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0
