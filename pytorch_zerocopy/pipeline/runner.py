"""Starts the pipeline's roles as processes, supervises them and cleans up.

Supervision: the parent blocks on every child's process sentinel and report pipe at once
(``multiprocessing.connection.wait``), so it neither sleeps nor polls. A role that raises sends
its traceback on its pipe and exits; a role that dies (signal, ``os._exit``) is seen through its
sentinel. Either way the parent terminates the other roles (SIGTERM, then SIGKILL after a grace
period), stops the MPS daemon if it started one, and raises :class:`PipelineError` naming the
role, with its traceback. Ctrl-C reaches only the parent (children start with SIGINT ignored),
which shuts down the same way and re-raises ``KeyboardInterrupt``; SIGTERM to the parent does
the same. Nothing outlives the run: children are joined, queues closed, the ring's GPU buffers
die with their owner, shared-memory segments are unlinked at creation.

Threads: each role sets its torch threads from the plan (:func:`~.plan.make_plan` shares the
cores out). The roles of a CPU run also start with ``OMP_WAIT_POLICY=PASSIVE`` unless the
environment sets it: an idle OpenMP thread then sleeps instead of spinning, so one role's
waiting threads take no core from another role, or from other work on the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from multiprocessing import queues as mp_queues
from multiprocessing.connection import wait
from typing import Callable, Dict, List, Optional

import torch
import torch.multiprocessing as mp

from .._process import enter_child
from ..datasets.base import NodeDataset
from . import checkpoint
from .consumer import consumer_main
from .machine import gatherer_main, listen
from .gather import choose_cached_rows
from .messages import PartitionInfo
from .minibatches import SampleStage
from .plan import GatherIn, Partition, Plan
from .producer import producer_main
from .sampler import sampler_main
from .stats import EpochStats

TERMINATE_GRACE_SECONDS = 5.0


class PipelineError(RuntimeError):
    """A role of the pipeline failed; ``role`` names it and ``remote_traceback`` says how."""

    def __init__(self, role: str, remote_traceback: str):
        super().__init__(f"the {role} failed:\n{remote_traceback}")
        self.role = role
        self.remote_traceback = remote_traceback


def _role_entry(role: str, conn, fn: Callable, args: tuple, parent_pid: int, tempdir: str) -> None:
    """Runs one role in a child; reports ``("done", None)`` or ``("error", traceback)``.

    The child dies with its parent and keeps its temp files in the run's ``tempdir``
    (:func:`pytorch_zerocopy._process.enter_child`). On success the queues this process wrote
    to are flushed and the process leaves with ``os._exit``: every peer has consumed what it
    needed by then (the roles' end-of-run handshakes guarantee it), and skipping interpreter
    teardown saves seconds per role.
    """
    enter_child(parent_pid, tempdir)
    try:
        if role == "consumer":
            fn(*args, conn.send)
        else:
            fn(*args)
        for arg in args:
            for q in (arg.values() if isinstance(arg, dict) else [arg]):
                if isinstance(q, mp_queues.Queue):
                    q.close()
                    q.join_thread()
        conn.send(("done", None))
        conn.close()
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)
    os._exit(0)


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code} without reporting an error"


class _Terminated(BaseException):
    """SIGTERM received by the supervising process."""


@contextlib.contextmanager
def _sigterm_raises():
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def environment_added(extra: Dict[str, str]):
    """``os.environ`` plus ``extra`` (a spawned child inherits the environment at start)."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def direct_queue(ctx):
    """A queue whose ``put`` writes to its pipe in the calling thread (``SimpleQueue``), for
    the small, bounded messages sent per minibatch or group of them (slots given back, seed
    ranges; a loader's producer's slots ready).

    Why not ``Queue``: its ``put`` hands the message to a feeder thread, which needs the
    sender's GIL to pickle and write it; a sender running a training step in Python holds the
    GIL, so every message forces a switch between the threads, paid out of the step's time
    (benchmarks/seed_queue.py measures it). The price: ``put``
    blocks once the pipe's buffer is full, so what is sent this way must stay bounded (slots,
    batches in flight: a few KB); ``get`` has no timeout."""
    return ctx.SimpleQueue()


def close_queue(q) -> None:
    """Closes a ``Queue`` (not waiting for its feeder thread) or a :func:`direct_queue`."""
    q.close()
    if hasattr(q, "cancel_join_thread"):
        q.cancel_join_thread()


class Supervisor:
    """Owns the role processes of one run, and the directory of their temp files.

    Roles die with the process that started them (so :meth:`run` must be called from the
    thread that called :meth:`start`, and that thread must stay alive until :meth:`shutdown`),
    and their temp files live in ``tempdir``, removed by :meth:`shutdown`."""

    def __init__(self):
        self.ctx = mp.get_context("spawn")
        self.procs: List = []  # (role, process, parent end of its report pipe)
        self.tempdir: Optional[str] = None  # made by the first start()

    def start(self, role: str, fn: Callable, args: tuple, env: Optional[Dict[str, str]] = None) -> None:
        if self.tempdir is None:
            self.tempdir = tempfile.mkdtemp(prefix="zc-")
        recv, send = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=_role_entry, args=(role, send, fn, args, os.getpid(), self.tempdir),
                                name=f"zerocopy-{role}", daemon=True)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
        try:
            with environment_added(env or {}):
                proc.start()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        send.close()
        self.procs.append((role, proc, recv))

    def listen(self):
        """A listening Unix socket in this supervisor's temp directory (:func:`.machine.listen`),
        for a role to accept connections on; the directory goes at :meth:`shutdown`."""
        if self.tempdir is None:
            self.tempdir = tempfile.mkdtemp(prefix="zc-")
        return listen(self.tempdir)

    def pids(self) -> Dict[str, int]:
        return {f"{role}{i}": p.pid for i, (role, p, _) in enumerate(self.procs)}

    def run(self, on_message: Callable[[tuple], None], timeout: Optional[float] = None) -> None:
        """Blocks until every role has finished; raises :class:`PipelineError` on a failure,
        ``TimeoutError`` when roles are still running after ``timeout`` seconds."""
        conns = {conn: role for role, _, conn in self.procs}
        sentinels = {p.sentinel: (role, p, conn) for role, p, conn in self.procs}
        deadline = None if timeout is None else time.monotonic() + timeout

        def handle(conn) -> None:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                conns.pop(conn, None)
                return
            if msg[0] == "error":
                raise PipelineError(conns[conn], msg[1])
            if msg[0] != "done":
                on_message(msg)

        while sentinels:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(conns) + list(sentinels), left)
            if not ready:
                running = ", ".join(role for role, _, _ in sentinels.values())
                raise TimeoutError(f"roles still running after {timeout:g} s: {running}")
            for r in ready:
                if r in conns:
                    handle(r)
            for r in ready:
                if r not in sentinels:
                    continue
                role, proc, conn = sentinels.pop(r)
                while conn in conns and conn.poll():  # read what it said before exiting
                    handle(conn)
                proc.join()
                if proc.exitcode != 0:
                    raise PipelineError(role, f"the {role} process (pid {proc.pid}) {_describe_exit(proc.exitcode)}")
        for conn in list(conns):
            while conn in conns and conn.poll():
                handle(conn)

    def check(self, timeout: float = 0.0) -> None:
        """Raises :class:`PipelineError` when a role has reported a failure or died, waiting at
        most ``timeout`` seconds for one to exit. For a parent that does not wait in :meth:`run`
        (a loader's training loop)."""
        if timeout:
            ended = wait([p.sentinel for _, p, _ in self.procs], timeout)
            for _, proc, _ in self.procs:
                if proc.sentinel in ended:  # its files are closed; its exit status may come a moment later
                    proc.join(timeout)
        for role, proc, conn in self.procs:
            code = proc.exitcode  # read first: a role reports its failure before it exits
            try:
                while conn.poll():
                    msg = conn.recv()
                    if msg[0] == "error":
                        raise PipelineError(role, msg[1])
            except (EOFError, OSError):
                pass
            if code not in (None, 0):
                raise PipelineError(role, f"the {role} process (pid {proc.pid}) {_describe_exit(code)}")

    def shutdown(self) -> None:
        """Ends every role still alive (SIGTERM, then SIGKILL) and joins them all."""
        for _, proc, _ in self.procs:
            if proc.is_alive():
                proc.terminate()
        for _, proc, _ in self.procs:
            proc.join(TERMINATE_GRACE_SECONDS)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for _, proc, conn in self.procs:
            _remove_orphan_segments(proc.pid)
            conn.close()
            proc.close()
        self.procs = []
        if self.tempdir is not None:
            shutil.rmtree(self.tempdir, ignore_errors=True)
            self.tempdir = None


def _remove_orphan_segments(pid: int, shm_dir: str = "/dev/shm") -> None:
    """Unlinks shared-memory segments a dead child left behind.

    torch names a tensor's segment ``torch_<pid>_...`` and unlinks it right after creating it;
    a role killed between the two (SIGKILL, or SIGTERM at shutdown) would leak it.
    """
    prefix = f"torch_{pid}_"
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(shm_dir, name))
            except OSError:
                pass


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def cpu_role_environment(plan: Plan) -> Dict[str, str]:
    """What the roles' environment adds on a CPU run (see the module docstring)."""
    if plan.on_gpu or "OMP_WAIT_POLICY" in os.environ:
        return {}
    return {"OMP_WAIT_POLICY": "PASSIVE"}


def run_pipeline(plan: Plan, ds: NodeDataset, on_message: Optional[Callable[[object], None]] = None,
                 on_start: Optional[Callable[[Dict[str, int]], None]] = None,
                 cached_rows: Optional[torch.Tensor] = None, gatherer: Optional[str] = None) -> List[EpochStats]:
    """Runs the plan's roles to completion: ``plan.sampler_processes`` samplers, a producer
    (``plan.gather_in`` producer), the machine's gatherer (``machine``: started here, serving
    this trainer only, unless ``gatherer`` gives the address of one already serving the
    machine) or both (``machine-reads``: the producer's rows read by that gatherer), and the
    trainer. The plan was validated when it was built.

    Returns the trainer's per-epoch statistics. ``on_message`` sees every progress message
    (:class:`~.messages.StepDone`, :class:`~.messages.PartitionInfo`,
    :class:`~.stats.EpochStats`) as it arrives; ``on_start`` the role processes' pids.
    ``cached_rows``: the rows of ``plan.cache``, when already chosen
    (:func:`~.gather.choose_cached_rows`; data-parallel ranks share one choice); else they are
    chosen here, before any role starts. With ``plan.checkpoint_dir`` the run resumes, or
    refuses to start, as :func:`.checkpoint.resolve` decides, before any role starts.
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"run_pipeline needs a Plan (pytorch_zerocopy.pipeline.make_plan), got {type(plan).__name__}")
    plan = checkpoint.resolve(plan, ds)
    ds.share_memory_()
    if plan.cache is None:
        cached_rows = None
    elif cached_rows is None:
        cached_rows = choose_cached_rows(plan, ds, on_message)
    epochs: List[EpochStats] = []
    partition = PartitionInfo(Partition.NONE)

    def dispatch(msg: tuple) -> None:
        nonlocal partition
        message = msg[1]  # the trainer's ("progress", message)
        if isinstance(message, PartitionInfo):
            partition = message
        if isinstance(message, EpochStats):
            message.partition = partition  # how the GPU was shared in this run
            message.gather_batches = plan.gather_batches
            message.cache_rows = 0 if cached_rows is None else int(cached_rows.numel())
            epochs.append(message)
        if on_message is not None:
            on_message(message)

    sup = Supervisor()
    ctx = sup.ctx
    samplers = plan.sampler_processes
    queues = {"consumed": ctx.Event()}
    if samplers:
        queues["batch"] = ctx.Queue(maxsize=plan.queue_depth * samplers)
    if plan.gather_in.producer:
        queues["ready"] = ctx.Queue()
        queues["free"] = direct_queue(ctx)  # the trainer's, per minibatch
    if gatherer is not None:
        if not plan.gather_in.machine:
            raise ValueError(f"run_pipeline: a gatherer address serves a plan whose gather_in is 'machine' or "
                             f"'machine-reads', not "
                             f"{plan.gather_in.value!r}")
        queues["gatherer"] = gatherer
    batch_q = queues.get("batch")
    stack = contextlib.ExitStack()
    try:
        with stack, _sigterm_raises():
            role_env = cpu_role_environment(plan)
            producer_env: Dict[str, str] = dict(role_env)
            consumer_env: Dict[str, str] = dict(role_env)
            if plan.partition is Partition.MPS:
                from .partition import MpsDaemon, shared_daemon

                # One daemon serves every GPU: a launcher of several pipelines shares its own.
                daemon = shared_daemon()
                shared = daemon is not None
                if daemon is None:
                    daemon = stack.enter_context(MpsDaemon())
                producer_env.update(daemon.client_env(plan.producer_share, below_normal=plan.producer_yields))
                consumer_env.update(daemon.client_env(100.0 - plan.producer_share))
                dispatch(("progress", PartitionInfo(Partition.MPS, producer_share=plan.producer_share,
                                                    consumer_share=100.0 - plan.producer_share,
                                                    shared_daemon=shared)))
            stack.callback(sup.shutdown)  # also when starting a role fails (before the MPS daemon stops)
            barrier = ctx.Barrier(samplers) if samplers > 1 else None
            for w in range(samplers):
                sup.start("sampler", sampler_main, (plan, ds, w, batch_q, queues["consumed"], barrier), role_env)
            if plan.gather_in.machine and gatherer is None:
                sock = sup.listen()
                sup.start("gatherer", gatherer_main, (plan, ds, cached_rows, sock, 1), producer_env)
                queues["gatherer"] = sock.getsockname()
                sock.close()
            if plan.gather_in.producer:
                reads = plan.gather_in is GatherIn.MACHINE_READS  # the gatherer holds the table and its cache
                sup.start("producer", producer_main,
                          (plan, ds, batch_q, queues["ready"], queues["free"], None if reads else cached_rows,
                           SampleStage(), queues["gatherer"] if reads else None), producer_env)
            inline_rows = cached_rows if plan.gather_in is GatherIn.TRAINER else None
            sup.start("consumer", consumer_main, (plan, ds, queues, inline_rows), consumer_env)
            if on_start is not None:
                on_start(sup.pids())
            try:
                sup.run(dispatch)
            finally:
                sup.shutdown()
    except _Terminated:
        raise KeyboardInterrupt("terminated by SIGTERM") from None
    finally:
        for name, q in queues.items():
            if name in ("consumed", "gatherer"):
                continue
            close_queue(q)
    return epochs
