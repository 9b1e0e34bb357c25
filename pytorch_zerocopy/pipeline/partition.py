"""GPU partitioning between the producer (zero-copy gathers) and the consumer (training).

* :class:`MpsDaemon`: a private CUDA MPS control daemon (its own pipe and log directories in a
  temporary directory, so it neither sees nor disturbs any other MPS on the machine). Clients
  started with :meth:`MpsDaemon.client_env` connect to it with a share of the GPU's threads.
* :func:`run_as_client`: a command run as a client of a private daemon (``zerocopy mps``), so
  that the processes it starts can share the GPU with it through MPS.
* :func:`green_streams`: two streams on two disjoint SM sets of one process (green contexts).

The paper (§3.2.2) gives the producer ~10% of the GPU: a few SMs keep enough PCIe reads in
flight, and the rest train undisturbed.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

import torch

MPS_CONTROL = "nvidia-cuda-mps-control"
# Set by a launcher that started one daemon for every pipeline of the machine (several GPUs):
# the daemon's root directory. A pipeline that finds it attaches instead of starting its own.
SHARED_DAEMON_ENV = "PYTORCH_ZEROCOPY_MPS_ROOT"
READY_TIMEOUT_SECONDS = 20.0
STOP_TIMEOUT_SECONDS = 20.0


class MpsError(RuntimeError):
    pass


def _pids_with_pipe_dir(pipe_dir: str) -> List[int]:
    """Processes of this user whose environment names ``pipe_dir`` as their MPS pipe directory."""
    needle = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/comm") as c:
                        if c.read().strip().startswith("nvidia-cuda-mps"):
                            found.append(int(entry))
        except OSError:
            continue
    return found


# The CUDA driver's file for each MPS client process, in /dev/shm: cuda.shm.<n>.<client pid, hex>.<n>.
# The driver does not remove it when the client ends.
_CLIENT_FILE = re.compile(r"cuda\.shm\.\d+\.([0-9a-f]+)\.\d+")
SHM_DIR = "/dev/shm"


def _listing(directory: str) -> FrozenSet[str]:
    try:
        return frozenset(os.listdir(directory))
    except OSError:
        return frozenset()


def remove_ended_client_files(before: FrozenSet[str], directory: str = SHM_DIR) -> List[str]:
    """Removes the MPS client files (see ``_CLIENT_FILE``) in ``directory`` that are not in
    ``before`` (its listing when a daemon started) and whose process has ended; returns their
    names. A live process's file, and every other file, is left alone."""
    removed = []
    for name in sorted(_listing(directory) - before):
        m = _CLIENT_FILE.fullmatch(name)
        if m is None or _alive(int(m.group(1), 16)):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def _wait_exit(pid: int, timeout: float) -> bool:
    """Blocks until process ``pid`` (not necessarily our child) exits; False on timeout."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


def _daemon_env(root: str) -> Dict[str, str]:
    return {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"), "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log")}


def _stop_daemon(binary: str, root: str, pids: Iterable[int], shm_before: Optional[FrozenSet[str]]) -> None:
    """Stops the daemon whose directories are under ``root``: ``quit`` on its control pipe, then
    waits for its processes (``pids`` and those naming its pipe; SIGKILL after
    ``STOP_TIMEOUT_SECONDS``), removes ``root`` and, given the /dev/shm listing from when it
    started, the files of its clients that have ended. Safe on a daemon already stopped."""
    env = _daemon_env(root)
    try:
        subprocess.run([binary], input="quit\n", capture_output=True, text=True, env={**os.environ, **env},
                       timeout=STOP_TIMEOUT_SECONDS)
    except (subprocess.TimeoutExpired, OSError):
        pass
    for pid in set(pids) | set(_pids_with_pipe_dir(env["CUDA_MPS_PIPE_DIRECTORY"])):
        if not _wait_exit(pid, STOP_TIMEOUT_SECONDS):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    shutil.rmtree(root, ignore_errors=True)
    if shm_before is not None:
        remove_ended_client_files(shm_before)


_REAPER_STATE = "reaper.json"  # in a daemon's root: what its reaper needs to stop it
# The reaper: a process of its own session, started with each daemon, holding the read end of a
# pipe whose write end only the daemon's owner holds. One byte means the owner stopped the
# daemon; end of file means the owner died without stopping it (SIGKILL, a SIGTERM without a
# handler), and the reaper stops it. It imports nothing heavy until then.
_REAPER = """
import os, sys
fd, binary, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
try:
    told = os.read(fd, 1)
except OSError:
    told = b""
if not told and os.path.isdir(root):
    from pytorch_zerocopy.pipeline.partition import reap_daemon
    reap_daemon(binary, root)
"""


def reap_daemon(binary: str, root: str) -> None:
    """What a daemon's reaper does once its owner has died: stops the daemon at ``root`` with
    the processes and /dev/shm listing its owner recorded there."""
    try:
        with open(os.path.join(root, _REAPER_STATE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {}
    before = state.get("shm_before")
    _stop_daemon(binary, root, state.get("pids", []), None if before is None else frozenset(before))


class MpsDaemon:
    """A private MPS control daemon, started on ``__enter__``/:meth:`start`, stopped on exit.

    Readiness: ``nvidia-cuda-mps-control -d`` returns once the daemon has forked; the daemon
    answers on its control pipe when ready and offers no other signal (no pid file, no fd to
    wait on), so :meth:`start` sends it a query (``get_server_list``) and retries the query,
    every 20 ms, until it answers (at most ``READY_TIMEOUT_SECONDS``). Stopping sends ``quit``
    and then blocks on the daemon's exit with a pidfd. :meth:`stop` runs from ``__exit__``, from
    an ``atexit`` hook (normal interpreter exit) and is idempotent; the supervising runner turns
    SIGTERM and Ctrl-C into exceptions so the ``finally`` path runs. A process that dies without
    running either (SIGKILL, a SIGTERM nobody handles) leaves the daemon to its reaper (see
    ``_REAPER``), which stops it the same way.
    """

    def __init__(self, binary: str = MPS_CONTROL):
        path = shutil.which(binary)
        if path is None:
            raise MpsError(
                f"partition='mps' needs CUDA MPS, but {binary!r} is not on PATH. Install the NVIDIA "
                "driver utilities, or use partition='green' or 'none'.")
        self.binary = path
        self.root: Optional[str] = None
        self.pids: List[int] = []
        self.owned = True  # False for a handle on a daemon another process started
        self.shm_before: FrozenSet[str] = frozenset()  # /dev/shm when it started
        self._reaper: Optional[subprocess.Popen] = None
        self._reaper_fd: Optional[int] = None  # the write end of the reaper's pipe

    @classmethod
    def attach(cls, root: str) -> "MpsDaemon":
        """A handle on a running daemon that another process started (and will stop):
        :meth:`client_env` works, :meth:`stop` leaves the daemon alone."""
        if not os.path.isdir(os.path.join(root, "pipe")):
            raise MpsError(f"no MPS daemon directory at {root!r} ({SHARED_DAEMON_ENV}); "
                           "was its launcher stopped?")
        daemon = cls.__new__(cls)
        daemon.binary = shutil.which(MPS_CONTROL) or MPS_CONTROL
        daemon.root = root
        daemon.pids = []
        daemon.owned = False
        daemon.shm_before = frozenset()
        daemon._reaper = daemon._reaper_fd = None
        return daemon

    def shared_env(self) -> Dict[str, str]:
        """Environment that makes the pipelines of child processes attach to this daemon."""
        assert self.root is not None, "MpsDaemon not started"
        return {SHARED_DAEMON_ENV: self.root}

    @property
    def env(self) -> Dict[str, str]:
        assert self.root is not None, "MpsDaemon not started"
        return _daemon_env(self.root)

    def client_env(self, share_percent: float, below_normal: bool = False) -> Dict[str, str]:
        """Environment for a client process limited to ``share_percent`` of the GPU's threads, at
        MPS's below-normal client priority if ``below_normal`` (:func:`client_priority_env`)."""
        if not 0 < share_percent <= 100:
            raise ValueError(f"an MPS thread share must be in (0, 100], got {share_percent}")
        env = dict(self.env)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{share_percent:g}"
        env.update(client_priority_env(below_normal))
        return env

    def _control(self, command: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary], input=command + "\n", capture_output=True, text=True,
                              env={**os.environ, **self.env}, timeout=timeout)

    def start(self) -> "MpsDaemon":
        self.shm_before = _listing(SHM_DIR)
        self.root = tempfile.mkdtemp(prefix="zerocopy-mps-")
        os.makedirs(self.env["CUDA_MPS_PIPE_DIRECTORY"])
        os.makedirs(self.env["CUDA_MPS_LOG_DIRECTORY"])
        atexit.register(self.stop)
        try:
            self._record_state()
            self._start_reaper()
            # Output goes to a file, not a pipe: a daemon that kept an inherited pipe open
            # would make waiting for this command's output wait for the daemon's exit.
            start_log = os.path.join(self.root, "start.log")
            with open(start_log, "w") as log:
                started = subprocess.run([self.binary, "-d"], stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env={**os.environ, **self.env}, timeout=30)
            if started.returncode != 0:
                with open(start_log) as log:
                    raise MpsError(f"{self.binary} -d failed ({started.returncode}): {log.read().strip()}")
            deadline = time.monotonic() + READY_TIMEOUT_SECONDS
            while True:
                answer = self._control("get_server_list")
                if answer.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise MpsError(f"the MPS control daemon did not answer within {READY_TIMEOUT_SECONDS} s: "
                                   f"{answer.stderr.strip()}; log: {self._log_tail()}")
                time.sleep(0.02)
            self.pids = _pids_with_pipe_dir(self.env["CUDA_MPS_PIPE_DIRECTORY"])
            self._record_state()
        except BaseException:
            self.stop()
            raise
        return self

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self.env["CUDA_MPS_LOG_DIRECTORY"], "control.log")) as f:
                return f.read()[-2000:]
        except OSError:
            return "(no control.log)"

    def _record_state(self) -> None:
        """Writes what the reaper needs to stop the daemon (its processes, /dev/shm before it)."""
        path = os.path.join(self.root, _REAPER_STATE)
        with open(path + ".tmp", "w") as f:
            json.dump({"pids": self.pids, "shm_before": sorted(self.shm_before)}, f)
        os.replace(path + ".tmp", path)

    def _start_reaper(self) -> None:
        read_fd, self._reaper_fd = os.pipe()
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)}
        try:
            self._reaper = subprocess.Popen(
                [sys.executable, "-c", _REAPER, str(read_fd), self.binary, self.root], pass_fds=(read_fd,),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, env=env)
        finally:
            os.close(read_fd)

    def _release_reaper(self) -> None:
        """Tells the reaper that the daemon was stopped here, and waits for it to end."""
        if self._reaper_fd is not None:
            try:
                os.write(self._reaper_fd, b"x")
            except OSError:
                pass
            os.close(self._reaper_fd)
            self._reaper_fd = None
        if self._reaper is not None:
            try:
                self._reaper.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
            self._reaper = None

    def stop(self) -> None:
        """Stops the daemon (and its server) and removes its directories and the driver's files
        of its clients that have ended (:func:`remove_ended_client_files`, for files made while
        it ran); safe to call twice. A handle from :meth:`attach` only forgets the daemon."""
        if self.root is None:
            return
        if not self.owned:
            self.root = None
            return
        _stop_daemon(self.binary, self.root, self.pids, self.shm_before)
        self._release_reaper()
        self.root = None
        atexit.unregister(self.stop)

    def __enter__(self) -> "MpsDaemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def client_priority_env(below_normal: bool) -> Dict[str, str]:
    """The variable that sets an MPS client's scheduling priority: below normal (1) or normal
    (0). The server schedules the pending work of normal clients before that of below-normal
    ones; running blocks are not preempted. Set either way, so a client never inherits the
    priority of the process that started it."""
    return {"CUDA_MPS_CLIENT_PRIORITY": "1" if below_normal else "0"}


def this_process_client_env(share_percent: float, below_normal: bool = False) -> Optional[Dict[str, str]]:
    """The environment of another client of the MPS daemon this process is a client of (its
    environment names the daemon's pipe directory), limited to ``share_percent`` of the GPU's
    threads, at below-normal priority if ``below_normal``; None when this process is no MPS
    client. A running process cannot join a daemon (the CUDA driver reads the variables once,
    at its first call), so a process that is not a client already can start MPS clients but
    never share the GPU with them through MPS."""
    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe_dir:
        return None
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": f"{share_percent:g}",
           **client_priority_env(below_normal)}
    if os.environ.get("CUDA_MPS_LOG_DIRECTORY"):
        env["CUDA_MPS_LOG_DIRECTORY"] = os.environ["CUDA_MPS_LOG_DIRECTORY"]
    return env


def run_as_client(argv: List[str], share_percent: float = 100.0, binary: str = MPS_CONTROL) -> int:
    """Runs the command ``argv`` as a client of a private MPS daemon started here (with
    ``share_percent`` of the GPU's threads) and stopped when it ends; returns its exit status.
    The command's own pipelines attach to the same daemon (:data:`SHARED_DAEMON_ENV`), and a
    loader's process way in it shares the GPU with it through MPS
    (:func:`this_process_client_env`). SIGINT and SIGTERM reach the command; the daemon is
    stopped after it exits, or by its reaper if this process dies first."""
    if not argv:
        raise ValueError("run_as_client needs a command to run")
    with MpsDaemon(binary) as daemon:
        env = {**os.environ, **daemon.client_env(share_percent), **daemon.shared_env()}
        try:
            child = subprocess.Popen(list(argv), env=env)
        except OSError as e:
            raise MpsError(f"cannot run {argv[0]!r}: {e}") from None
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
        try:
            while True:
                try:
                    return child.wait()
                except KeyboardInterrupt:  # the terminal sent SIGINT to the command too
                    continue
        finally:
            signal.signal(signal.SIGTERM, previous)


def shared_daemon() -> Optional[MpsDaemon]:
    """The daemon a launcher shares with this process (see :data:`SHARED_DAEMON_ENV`), or None."""
    root = os.environ.get(SHARED_DAEMON_ENV)
    return MpsDaemon.attach(root) if root else None


def sm_granularity(device: torch.device) -> int:
    """SMs per allocation unit of a green context: 8 on Hopper and newer, 2 before (Ampere)."""
    major, _ = torch.cuda.get_device_capability(device)
    return 8 if major >= 9 else 2


def round_sms(requested: int, total: int, granularity: int) -> Tuple[int, int]:
    """(producer SMs, consumer SMs): the request rounded up to the granularity, the rest after."""
    if requested < 1:
        raise ValueError(f"producer_sms must be positive, got {requested}")
    producer = -(-requested // granularity) * granularity
    consumer = (total - producer) // granularity * granularity
    if consumer < granularity:
        raise ValueError(f"{requested} producer SMs leave no consumer SMs on a {total}-SM GPU")
    return producer, consumer


_LIVE_GREEN_CONTEXTS: list = []


def green_streams(device: torch.device, producer_sms: int):
    """(producer stream, consumer stream, :class:`~.messages.PartitionInfo`) on two green
    contexts of ``device``.

    The producer gets ``producer_sms`` rounded up to the hardware granularity; the consumer the
    rest. Disjoint SM sets come from the driver API (:mod:`.green`); where that fails, torch's
    ``torch.cuda.green_contexts`` is used, whose contexts may share SMs, and the info says so
    (``disjoint=False``) along with the counts actually used.
    """
    from .messages import PartitionInfo
    from .plan import Partition

    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).multi_processor_count
    gran = sm_granularity(torch.device("cuda", index))
    prod_sms, cons_sms = round_sms(producer_sms, total, gran)
    info = dict(kind=Partition.GREEN, total_sms=total, granularity=gran, requested_producer_sms=producer_sms)
    from .green import GreenContextError, disjoint_green_streams

    try:
        p_stream, c_stream, p_n, c_n = disjoint_green_streams(index, prod_sms)
        return p_stream, c_stream, PartitionInfo(producer_sms=p_n, consumer_sms=c_n, disjoint=True, api="driver",
                                                 **info)
    except GreenContextError as e:
        driver_error = str(e)

    try:
        from torch.cuda import green_contexts
    except ImportError as e:
        raise RuntimeError(f"partition='green': the driver API failed ({driver_error}) and this torch has no "
                           f"torch.cuda.green_contexts ({e}); use partition='mps' or 'none'") from None
    if not getattr(green_contexts, "SUPPORTED", False):
        raise RuntimeError(f"partition='green': the driver API failed ({driver_error}) and this torch build has "
                           "no green-context support; use partition='mps' or 'none'.")
    producer_ctx = green_contexts.GreenContext.create(num_sms=prod_sms, device_id=index)
    consumer_ctx = green_contexts.GreenContext.create(num_sms=cons_sms, device_id=index)
    if not hasattr(producer_ctx, "Stream"):
        raise RuntimeError("partition='green': this torch's GreenContext has no Stream(); "
                           "upgrade torch or use partition='mps'.")
    # The contexts must outlive their streams: they live as long as the process.
    _LIVE_GREEN_CONTEXTS.extend([producer_ctx, consumer_ctx])
    return producer_ctx.Stream(), consumer_ctx.Stream(), PartitionInfo(
        producer_sms=prod_sms, consumer_sms=cons_sms, disjoint=False, api="torch", driver_error=driver_error, **info)
