"""Data-parallel launcher on torch.distributed.elastic (torchrun's machinery).

One launcher per machine builds the shared state once (feature table, graph: host shared
memory), then starts ``nproc_per_node`` workers through ``elastic_launch``, the engine behind
``torchrun``. The shared tensors travel to the workers as ``torch.multiprocessing`` shared
memory, so every worker maps the same bytes (on its own GPU, with ``.to("unified")``) and the
machine holds one copy whatever the number of workers (paper §3.4, Listing 3).

Rendezvous is torchrun's: a single machine uses a private c10d store on localhost; several
machines pass torchrun's standard ``--nnodes``, ``--node-rank``, ``--rdzv-backend``,
``--rdzv-endpoint`` and ``--rdzv-id``. A worker that fails ends the job: elastic stops the
others and :func:`launch` raises with the failing worker's traceback; with
``LaunchOptions.max_restarts`` it instead restarts every worker of the job, up to that many
times (the workers see :func:`restart_count`; :func:`launch` returns the last attempt's
results). Ctrl-C (SIGINT) or SIGTERM to the launcher stops every worker and raises
``KeyboardInterrupt``, as a single pipeline does.
Workers die with the launcher (even one killed by SIGKILL) and keep their temp files (and
elastic's logs, unless ``log_dir`` is given) in a directory removed when the job ends, where
the launcher keeps its own while the job runs (``tempfile.tempdir``, restored after). Shared
memory is released when the last process holding it exits (its segment is unlinked at
creation), so a crash leaks nothing.

    from pytorch_zerocopy.launch import LaunchOptions, launch, init_worker
    results = launch(my_worker, (shared_table,), LaunchOptions(nproc_per_node=2))
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence

import torch

from ._process import enter_child


class WorkerFailed(RuntimeError):
    """A worker of a launched job failed; the message holds its rank and traceback."""


@dataclass
class LaunchOptions:
    nproc_per_node: int = 1
    nnodes: str = "1"
    node_rank: int = 0
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str = ""
    rdzv_id: str = ""
    max_restarts: int = 0
    monitor_interval: float = 0.1
    log_dir: Optional[str] = None
    extra_env: Dict[str, str] = field(default_factory=dict)

    def single_machine(self) -> bool:
        return self.nnodes in ("1", "1:1")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(spec: str):
    lo, _, hi = spec.partition(":")
    return int(lo), int(hi or lo)


def launch(entrypoint: Callable[..., Any], args: Sequence[Any], options: LaunchOptions) -> Dict[int, Any]:
    """Runs ``entrypoint(*args)`` in ``options.nproc_per_node`` workers; returns their results by rank.

    Each worker finds its place in the environment torchrun sets (RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT); :func:`init_worker` reads it. ``entrypoint`` must be
    importable (a module-level function): workers are started with spawn.
    """
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if options.nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {options.nproc_per_node}")
    min_nodes, max_nodes = _nodes(options.nnodes)
    endpoint = options.rdzv_endpoint
    if not endpoint:
        if not options.single_machine():
            raise ValueError("several machines need --rdzv-endpoint (host:port of the rendezvous)")
        endpoint = f"127.0.0.1:{_free_port()}"
    rdzv_configs = {"rank": options.node_rank}
    if options.single_machine():
        rdzv_configs["is_host"] = True
    tempdir = tempfile.mkdtemp(prefix="zc-")
    env_before = dict(os.environ)
    tempdir_before = tempfile.tempdir
    try:
        config = LaunchConfig(
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            nproc_per_node=options.nproc_per_node,
            run_id=options.rdzv_id or f"zerocopy-{uuid.uuid4().hex[:12]}",
            rdzv_backend=options.rdzv_backend,
            rdzv_endpoint=endpoint,
            rdzv_configs=rdzv_configs,
            max_restarts=options.max_restarts,
            monitor_interval=options.monitor_interval,
            start_method="spawn",
            logs_specs=_logs_specs(options.log_dir or os.path.join(tempdir, "logs")),
        )
        os.environ.update(options.extra_env)
        # This process's temp files during the job go to the job's directory: torch.multiprocessing
        # leaves a failed worker's error file (pytorch-errorfile-*.pickle) in the temp directory.
        tempfile.tempdir = tempdir
        with _signal_handlers_restored():
            return elastic_launch(config, _worker_entry)(entrypoint, os.getpid(), tempdir, *args)
    except ChildFailedError as e:
        raise WorkerFailed(_describe_failure(e)) from None
    except SignalException as e:
        # elastic has stopped every worker (the signal, then SIGKILL after its timeout).
        raise KeyboardInterrupt(f"interrupted by {e.sigval.name}: all workers stopped") from None
    finally:
        tempfile.tempdir = tempdir_before
        os.environ.clear()
        os.environ.update(env_before)
        shutil.rmtree(tempdir, ignore_errors=True)


# The attempt of a job that its launcher restarted itself (see :func:`restart_count`).
ATTEMPT_ENV = "ZEROCOPY_JOB_ATTEMPT"


def restart_count() -> int:
    """How many times this worker's job was restarted: by elastic (``TORCHELASTIC_RESTART_COUNT``)
    or by a launcher that restarts whole attempts itself (:data:`ATTEMPT_ENV`, as
    :func:`pytorch_zerocopy.train.train_data_parallel` does on one machine); the processes a
    worker starts inherit both. 0 in a first attempt, and outside a launcher."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + int(os.environ.get(ATTEMPT_ENV, "0"))


def _worker_entry(entrypoint: Callable[..., Any], launcher_pid: int, tempdir: str, *args: Any) -> Any:
    """A worker's first frame: it dies with the launcher and keeps its temp files in the job's
    directory (:func:`pytorch_zerocopy._process.enter_child`), then runs ``entrypoint``.

    SIGTERM (elastic stopping the workers, as before a restart) ends the worker by an exception,
    so the interpreter's exit handlers still run: multiprocessing unlinks the named semaphores
    of the worker's queues (``/dev/shm/sem.mp-*``), which a worker ended by the signal's default
    action would leave to the launcher's resource tracker, that is until the launcher exits."""
    enter_child(launcher_pid, tempdir)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return entrypoint(*args)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


_ELASTIC_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


@contextlib.contextmanager
def _signal_handlers_restored():
    """elastic installs handlers that raise SignalException for these signals and leaves them
    installed: the caller's own handlers (Ctrl-C raising KeyboardInterrupt) come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {name: signal.getsignal(getattr(signal, name)) for name in _ELASTIC_SIGNALS if hasattr(signal, name)}
    try:
        yield
    finally:
        for name, handler in saved.items():
            if handler is not None:
                signal.signal(getattr(signal, name), handler)


def _logs_specs(log_dir: str):
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    return DefaultLogsSpecs(log_dir=log_dir, redirects=Std.NONE, tee=Std.NONE)


def _describe_failure(error) -> str:
    lines = []
    for rank, failure in sorted(error.failures.items()):
        message = _callstack(failure.message) or str(failure.message)
        lines.append(f"worker rank {rank} failed (exit code {failure.exitcode}):\n{message}")
    return "\n".join(lines) if lines else str(error)


def _callstack(message) -> Optional[str]:
    """The worker's Python traceback out of elastic's error record, wherever it is nested."""
    if isinstance(message, dict):
        if isinstance(message.get("py_callstack"), str):
            return message["py_callstack"]
        for value in message.values():
            found = _callstack(value)
            if found:
                return found
    return None


@dataclass
class WorkerInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def init_worker(backend: Optional[str] = None, use_gpu: Optional[bool] = None) -> WorkerInfo:
    """Inside a launched worker: picks its GPU (or the CPU) and joins the process group.

    ``use_gpu=None`` uses GPU ``LOCAL_RANK`` where a GPU exists; ``False`` keeps the worker on
    the CPU (gloo), e.g. to test a launch with more workers than GPUs.
    """
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if use_gpu is None:
        use_gpu = torch.cuda.is_available()
    if use_gpu:
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"worker {rank} has local rank {local_rank}, but this machine has only "
                               f"{torch.cuda.device_count()} GPU(s): launch at most that many per node")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        # No device_id: with the unified device registered, torch takes it for the process's
        # accelerator and rejects a CUDA device_id. NCCL binds to the current device instead.
        init_process_group(backend or ("nccl" if device.type == "cuda" else "gloo"), rank, world_size)
    return WorkerInfo(rank, local_rank, world_size, device)


def init_process_group(backend: str, rank: int, world_size: int) -> None:
    """Joins the default process group through torchrun's environment (``env://``), in a
    launched worker or a process it started (which inherits the environment).

    Elastic's agent keeps one store for the whole job (``TORCHELASTIC_USE_AGENT_STORE``), and
    torch does not separate a restarted attempt's keys from the previous attempt's (pytorch
    issue 135712; torch 2.13 still reuses the agent's store server across rendezvous rounds):
    a restarted rank could read a dead peer's gloo address or NCCL id and wait forever. Here
    each attempt's keys live under their own prefix (:func:`restart_count`). Every agent counts
    its own restarts, so this holds for a job on one machine; with several machines, restarts
    need torch to keep attempts apart itself.
    """
    import torch.distributed as dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        return
    store, _, _ = next(dist.rendezvous("env://", rank, world_size))
    dist.init_process_group(backend, store=dist.PrefixStore(f"zerocopy/attempt_{restart_count()}", store),
                            rank=rank, world_size=world_size)


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """torchrun's own flags, with torchrun's names."""
    parser.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", type=int, default=1)
    parser.add_argument("--nnodes", default="1", help="number of machines, or MIN:MAX")
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0)
    parser.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", default="c10d")
    parser.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default="")
    parser.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", default="")
    parser.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=0)


def options_from_args(args: argparse.Namespace) -> LaunchOptions:
    return LaunchOptions(nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
                         rdzv_backend=args.rdzv_backend, rdzv_endpoint=args.rdzv_endpoint,
                         rdzv_id=args.rdzv_id, max_restarts=args.max_restarts)
