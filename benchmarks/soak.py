"""Soak test of ``zerocopy train`` as a user runs it: the job runs for ``--minutes`` while its
resources are sampled every ``--period`` seconds; then it is stopped as Ctrl-C stops it and
checked for leftovers.

    python benchmarks/soak.py --minutes 30 --period 60 -- --dataset papers-like:2000000 --epochs 1000
    python benchmarks/soak.py --minutes 0.5 --period 5 -- --epochs 100   # CPU: the embedded dataset

Everything after ``--`` is passed to ``python -m pytorch_zerocopy train`` (the ``zerocopy``
command), run from this checkout (its root first on ``PYTHONPATH``) in its own process group.
At the end of ``--minutes`` the group gets SIGINT (what Ctrl-C sends; the job prints
"interrupted" and exits 130), then SIGTERM and SIGKILL if it is still there ``--grace`` seconds
later. The job's stdout and stderr are drained by threads all along; stdout is kept whole in the
result, stderr's last lines (tqdm's bars go there).

Each sample (:class:`Sample`) covers the job's processes (its process tree, walked recursively,
and any process left in its process group): summed RSS, PSS and USS (read from
``/proc/PID/smaps_rollup``, one page-table walk per process: the sample records its own cost),
open file descriptors, threads, processes; ``/dev/shm`` in use (statvfs, which counts unlinked
segments, and the bytes allocated to the files listed there); the host's ``MemTotal -
MemAvailable``; each GPU's used memory (nvidia-smi, where present: this process never opens a
CUDA context); and the epochs done, counted from the line the job prints after each epoch
(``epoch N: ... training minibatches in ...``, :func:`pytorch_zerocopy.train.format_epoch`).

Summed RSS counts a page shared by k processes (the dataset in /dev/shm, a mapped table) k
times; PSS splits it among them; USS is each process's private memory. Host used memory and GPU
memory are the whole machine's and the whole GPU's, other users included.

Growth (:func:`growth`): the baseline is the first sample taken once the first epoch line is
out, so the first epoch's allocations (caches, pools, CUDA graphs) are not growth; a quantity's
growth is its largest value in the later samples minus its baseline value (MiB for memory,
counts for fds, threads and processes). Bars: ``soak_growth_mib`` (the largest growth of any
memory quantity, named by ``soak_growth_quantity``; host and GPU memory count other users too),
``soak_job_growth_mib`` (the largest of RSS, PSS and USS: the job's alone), ``soak_fds_growth``,
``soak_threads_growth``, ``soak_processes_growth``, ``soak_minutes`` (the job's actual run time),
``epochs_done``, ``leak_free``.

Leak checks once the job has stopped (:class:`LeakCheck`): no process of the job left (its
process group, and every process seen in its tree); no ``/dev/shm`` entry of the job's left that
was not there before it (an entry is the job's when a sample found one of its processes mapping
or holding it open, as multiprocessing's named semaphores ``sem.mp-*`` are, or when its name
holds one of the job's pids, as torch's ``torch_<pid>_*`` do; other new entries, which other
users of /dev/shm make, are listed apart); this process's own file descriptors back to their
count before the job. The job's own fd count at its last sample against the baseline is
reported beside them. A process left behind is killed after it is recorded. Results:
``<name>.{json,md,png}`` under ``--out``; the exit status is 0 when the job ran until
``--minutes`` and left nothing behind.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.pipeline_common import header_lines, machine_info, write_report

MIB = 1 << 20
SHM_DIR = "/dev/shm"
# The line format_epoch prints after each epoch (rank 0's only, in a data-parallel job).
EPOCH_LINE = re.compile(r"^epoch (\d+): \d+ training minibatches in ")
STDERR_TAIL_LINES = 200
TRACE_HEADING = "Every sample (memory in MiB; RSS, PSS, USS summed over the job's processes):"
SETTLE_S = 10.0  # how long the job's processes get to exit after its launcher has


# --- samples ---------------------------------------------------------------------------------------


@dataclass
class Sample:
    """The job's resources at one moment."""

    seconds: float  # since the job started
    epochs_done: int  # epoch lines the job had printed
    processes: int  # live processes of the job
    threads: int
    fds: int  # open file descriptors, summed over the processes
    rss_bytes: int  # summed: a page shared by k processes counts k times
    pss_bytes: int | None  # summed proportional set size; None where smaps_rollup was unreadable
    uss_bytes: int | None  # summed private memory; None as pss_bytes
    shm_used_bytes: int  # /dev/shm's used blocks (statvfs): unlinked segments included
    shm_file_bytes: int  # bytes allocated to the files listed under /dev/shm
    host_used_bytes: int  # MemTotal - MemAvailable of the machine
    gpu_used_bytes: dict[int, int]  # GPU index -> memory.used of the whole GPU; empty without nvidia-smi
    sample_seconds: float  # how long taking this sample took


@dataclass
class Quantity:
    """One sampled quantity of a :class:`Sample`, in the unit growth is reported in."""

    name: str
    unit: str  # "MiB" or "count"
    value: float


@dataclass
class Growth:
    """A quantity's largest value after the baseline sample, minus its baseline value."""

    name: str
    unit: str
    baseline: float
    peak: float
    growth: float
    peak_seconds: float  # when the peak was sampled, since the job started


@dataclass
class ProcessTotals:
    processes: int = 0
    threads: int = 0
    fds: int = 0
    rss_bytes: int = 0
    pss_bytes: int | None = 0
    uss_bytes: int | None = 0


@dataclass
class ProcessInfo:
    pid: int
    name: str
    cmdline: str


@dataclass
class SeenProcess:
    pid: int
    create_time: float  # psutil's: with the pid, names the process even once the pid is reused


@dataclass
class OutputLine:
    seconds: float  # since the job started
    text: str


@dataclass
class StopRecord:
    """How the job ended."""

    reason: str  # "time" (stopped at --minutes), "exited" (ended by itself), "soak interrupted"
    signals: list[str]  # signals sent to the job's process group, in order
    exit_code: int | None  # the job's status; negative: the signal that ended it
    stop_seconds: float  # from the first signal to the job's exit (0 when it exited by itself)
    interrupted_message: bool  # the job printed "interrupted" (its answer to SIGINT)


@dataclass
class LeakCheck:
    """What the job left once it had stopped."""

    survivors: list[ProcessInfo]  # processes of the job still alive SETTLE_S after it stopped (then killed)
    shm_files_left: list[str]  # the job's /dev/shm entries, absent before it and present after it
    shm_new_not_the_jobs: list[str]  # other /dev/shm entries absent before the job and present after it
    shm_used_delta_bytes: int  # /dev/shm's used bytes after the job minus before it
    monitor_fds_before: int
    monitor_fds_after: int
    job_fds_last_minus_baseline: int | None  # the job's fds at its last sample minus at the baseline

    @property
    def clean(self) -> bool:
        return not self.survivors and not self.shm_files_left and self.monitor_fds_after <= self.monitor_fds_before


def quantities(sample: Sample) -> list[Quantity]:
    """The sample's quantities that growth is computed for; PSS and USS only where read."""
    mib = [("rss", sample.rss_bytes), ("pss", sample.pss_bytes), ("uss", sample.uss_bytes),
           ("shm_used", sample.shm_used_bytes), ("shm_files", sample.shm_file_bytes),
           ("host_used", sample.host_used_bytes)]
    mib += [(f"gpu{index}_used", used) for index, used in sorted(sample.gpu_used_bytes.items())]
    out = [Quantity(name, "MiB", value / MIB) for name, value in mib if value is not None]
    out += [Quantity(name, "count", value) for name, value in
            (("fds", sample.fds), ("threads", sample.threads), ("processes", sample.processes))]
    return out


def baseline_index(samples: Sequence[Sample]) -> int | None:
    """The first sample taken once the first epoch had finished; None before that."""
    return next((i for i, s in enumerate(samples) if s.epochs_done >= 1), None)


def growth(samples: Sequence[Sample]) -> list[Growth]:
    """Every quantity's growth after the baseline (:func:`baseline_index`): its largest value in
    the later samples minus its baseline value. Empty without a baseline or a later sample; a
    quantity missing from the baseline or from every later sample is left out."""
    base = baseline_index(samples)
    if base is None:
        return []
    later = [(s.seconds, {q.name: q for q in quantities(s)}) for s in samples[base + 1:]]
    result = []
    for q in quantities(samples[base]):
        values = [(by_name[q.name].value, seconds) for seconds, by_name in later if q.name in by_name]
        if values:
            peak, when = max(values, key=lambda v: v[0])
            result.append(Growth(q.name, q.unit, q.value, peak, peak - q.value, when))
    return result


JOB_MEMORY = ("rss", "pss", "uss")  # the memory quantities that are the job's alone


def largest_memory_growth(growths: Sequence[Growth], names: Sequence[str] | None = None) -> Growth | None:
    """The memory quantity (among ``names``, or any) that grew most; None if there is none."""
    memory = [g for g in growths if g.unit == "MiB" and (names is None or g.name in names)]
    return max(memory, key=lambda g: g.growth) if memory else None


def count_epochs(lines: Sequence[str]) -> int:
    """Epoch lines among the job's stdout lines."""
    return sum(1 for line in lines if EPOCH_LINE.match(line))


# --- reading the machine ----------------------------------------------------------------------------


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_members(pgid: int) -> list[psutil.Process]:
    """Live processes whose process group is ``pgid``."""
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                members.append(psutil.Process(pid))
        except (OSError, psutil.Error):
            continue
    return [p for p in members if _alive(p)]


def job_processes(root_pid: int, pgid: int) -> list[psutil.Process]:
    """The job's live processes: ``root_pid``, its descendants and the rest of its group."""
    found: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(root_pid)
        for p in [root] + root.children(recursive=True):
            found[p.pid] = p
    except psutil.Error:
        pass
    for p in group_members(pgid):
        found.setdefault(p.pid, p)
    return [p for p in found.values() if _alive(p)]


def _add_process(totals: ProcessTotals, proc: psutil.Process) -> None:
    """Adds one process to ``totals``; a process gone meanwhile adds nothing."""
    try:
        with proc.oneshot():
            threads, fds = proc.num_threads(), proc.num_fds()
            try:
                full = proc.memory_full_info()
                rss, pss, uss = full.rss, getattr(full, "pss", None), full.uss
            except psutil.AccessDenied:
                rss, pss, uss = proc.memory_info().rss, None, None
    except psutil.Error:
        return
    totals.processes += 1
    totals.threads += threads
    totals.fds += fds
    totals.rss_bytes += rss
    totals.pss_bytes = None if pss is None or totals.pss_bytes is None else totals.pss_bytes + pss
    totals.uss_bytes = None if uss is None or totals.uss_bytes is None else totals.uss_bytes + uss


def process_totals(procs: Sequence[psutil.Process]) -> ProcessTotals:
    totals = ProcessTotals()
    for proc in procs:
        _add_process(totals, proc)
    return totals


def shm_used_bytes() -> int:
    st = os.statvfs(SHM_DIR)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def shm_file_bytes() -> int:
    """Bytes allocated to the files under /dev/shm (a sparse file counts what it holds)."""
    total = 0
    for dirpath, _, names in os.walk(SHM_DIR):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue
    return total


def shm_names() -> set[str]:
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


def shm_entries_held(pid: int) -> set[str]:
    """Names of the /dev/shm entries that process ``pid`` maps or holds open (unlinked ones,
    such as torch's shared tensors, have no name left and are not listed)."""
    paths = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.rstrip("\n").split(None, 5)
                if len(parts) == 6:
                    paths.add(parts[5])
        fd_dir = f"/proc/{pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                paths.add(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                continue
    except OSError:
        pass
    prefix = SHM_DIR + "/"
    return {path[len(prefix):] for path in paths if path.startswith(prefix) and not path.endswith(" (deleted)")}


def jobs_shm_entries(names: set[str], held: set[str], pids: Sequence[int]) -> set[str]:
    """Those of ``names`` that are the job's: held by one of its processes, or named after one."""
    return {n for n in names if n in held or any(f"_{pid}_" in n for pid in pids)}


def host_used_bytes(meminfo: str = "/proc/meminfo") -> int:
    """``MemTotal - MemAvailable`` of the machine, in bytes."""
    fields = {}
    with open(meminfo) as f:
        for line in f:
            key, _, rest = line.partition(":")
            fields[key] = int(rest.split()[0]) * 1024
    return fields["MemTotal"] - fields["MemAvailable"]


def gpu_used_bytes() -> dict[int, int]:
    """GPU index -> used memory of the whole GPU, from nvidia-smi; empty where it is absent or fails."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode != 0:
        return {}
    used = {}
    for line in out.stdout.strip().splitlines():
        index, _, mib = line.partition(",")
        try:
            used[int(index)] = int(float(mib)) * MIB
        except ValueError:
            continue
    return used


def own_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# --- the job ----------------------------------------------------------------------------------------


class JobOutput:
    """Drains one of the job's streams on a daemon thread, so its pipe never fills. Keeps every
    line, or only the last ``keep`` lines; ``lines()`` is a snapshot, safe from any thread."""

    def __init__(self, stream, started: float, keep: int | None = None):
        self._stream = stream
        self._started = started
        self._lines = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self.interrupted = False  # a line starting "interrupted" was seen, kept or not
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        for text in self._stream:
            line = OutputLine(round(time.monotonic() - self._started, 3), text.rstrip("\n"))
            with self._lock:
                self._lines.append(line)
                self.interrupted = self.interrupted or text.startswith("interrupted")

    def lines(self) -> list[OutputLine]:
        with self._lock:
            return list(self._lines)

    def finish(self, timeout: float = 30.0) -> None:
        """Waits for the stream's end (the job and every process holding it gone), then closes it."""
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._stream.close()


@dataclass
class Job:
    """A running ``zerocopy train``: its process (the leader of its own process group), its
    output, every process seen in its tree (pid -> creation time) and the /dev/shm entries they
    held."""

    proc: subprocess.Popen
    started: float
    stdout: JobOutput
    stderr: JobOutput
    seen: dict[int, float] = field(default_factory=dict)
    shm_held: set[str] = field(default_factory=set)  # /dev/shm entries a sample found it holding

    @property
    def pgid(self) -> int:
        return self.proc.pid

    def epochs_done(self) -> int:
        return count_epochs([line.text for line in self.stdout.lines()])


def train_command(train_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytorch_zerocopy", "train", *train_args]


def sigint_not_ignored() -> None:
    """SIGINT is the job's stop signal, and a child inherits an ignored SIGINT across exec (a
    handled one starts at its default): a soak started with SIGINT ignored (a background job of
    a script) takes Python's default handler before it starts the job."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def start_job(train_args: Sequence[str]) -> Job:
    """Starts the job in a new session (its own process group, no terminal), this checkout's
    package first on its path."""
    sigint_not_ignored()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen(train_command(train_args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, encoding="utf-8", errors="replace", bufsize=1, env=env,
                            start_new_session=True)
    started = time.monotonic()
    return Job(proc, started, JobOutput(proc.stdout, started), JobOutput(proc.stderr, started, STDERR_TAIL_LINES))


def take_sample(job: Job) -> Sample:
    t0 = time.monotonic()
    procs = job_processes(job.proc.pid, job.pgid)
    for p in procs:
        try:
            job.seen.setdefault(p.pid, p.create_time())
        except psutil.Error:
            continue
        job.shm_held |= shm_entries_held(p.pid)
    totals = process_totals(procs)
    return Sample(seconds=round(t0 - job.started, 3), epochs_done=job.epochs_done(), processes=totals.processes,
                  threads=totals.threads, fds=totals.fds, rss_bytes=totals.rss_bytes, pss_bytes=totals.pss_bytes,
                  uss_bytes=totals.uss_bytes, shm_used_bytes=shm_used_bytes(), shm_file_bytes=shm_file_bytes(),
                  host_used_bytes=host_used_bytes(), gpu_used_bytes=gpu_used_bytes(),
                  sample_seconds=round(time.monotonic() - t0, 4))


def sample_until(job: Job, seconds: float, period: float, samples: list[Sample]) -> str:
    """Samples the job every ``period`` seconds, and once more at the end, until ``seconds``
    after its start or its exit. Returns why sampling ended: "time" or "exited"."""
    deadline = job.started + seconds
    next_at = job.started
    while True:
        now = time.monotonic()
        if now >= next_at or now >= deadline:
            samples.append(take_sample(job))
            while next_at <= now:
                next_at += period
            if now >= deadline:
                return "time"
        try:
            job.proc.wait(timeout=max(0.0, min(next_at, deadline) - time.monotonic()))
            return "exited"
        except subprocess.TimeoutExpired:
            continue


def _signal_group(job: Job, sig: signal.Signals, sent: list[str]) -> None:
    try:
        os.killpg(job.pgid, sig)
        sent.append(sig.name)
    except ProcessLookupError:
        pass


def stop_job(job: Job, grace: float) -> list[str]:
    """Ctrl-C to the job's group, then SIGTERM ``grace`` seconds later, then SIGKILL as long again
    later; returns once the job's leader has exited, with the signals sent, in order."""
    sent: list[str] = []
    if job.proc.poll() is None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            _signal_group(job, sig, sent)
            try:
                job.proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        job.proc.wait()
    return sent


def _same_process(pid: int, created: float) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - created) < 0.01 and _alive(p) else None
    except psutil.Error:
        return None


def leftover_processes(job: Job, settle: float = SETTLE_S) -> list[psutil.Process]:
    """The job's processes still alive ``settle`` seconds (at most) after its leader exited: its
    group's members and every process seen in its tree."""
    deadline = time.monotonic() + settle
    while True:
        left = {p.pid: p for p in group_members(job.pgid)}
        for pid, created in job.seen.items():
            p = _same_process(pid, created)
            if p is not None:
                left.setdefault(pid, p)
        if not left or time.monotonic() >= deadline:
            return list(left.values())
        time.sleep(0.2)


def describe_process(p: psutil.Process) -> ProcessInfo:
    try:
        return ProcessInfo(p.pid, p.name(), " ".join(p.cmdline())[:300])
    except psutil.Error:
        return ProcessInfo(p.pid, "?", "")


def kill_all(procs: Sequence[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(procs), timeout=10)


def fds_after_baseline(samples: Sequence[Sample]) -> int | None:
    """The job's fds at its last sample minus at the baseline; None without a baseline."""
    base = baseline_index(samples)
    return None if base is None else samples[-1].fds - samples[base].fds


# --- the soak ---------------------------------------------------------------------------------------


@dataclass
class SoakRun:
    """One soak: the job's command, its samples, how it stopped, what it left."""

    command: list[str]
    minutes_asked: float
    period: float
    job_pid: int
    job_seconds: float  # from the job's start to its exit
    samples: list[Sample]
    stop: StopRecord
    leaks: LeakCheck
    processes_seen: list[SeenProcess]  # every process sampled in the job's tree or group
    shm_held: list[str]  # /dev/shm entries a sample found the job's processes holding
    stdout: list[OutputLine]
    stderr_tail: list[OutputLine]


def soak(train_args: Sequence[str], minutes: float, period: float, grace: float) -> SoakRun:
    """Runs the job for ``minutes``, sampling every ``period`` seconds; stops it, records what it
    left and kills any process of it still alive."""
    shm_before, shm_used_before, fds_before = shm_names(), shm_used_bytes(), own_fds()
    job = start_job(train_args)
    samples: list[Sample] = []
    try:
        reason = sample_until(job, minutes * 60.0, period, samples)
    except KeyboardInterrupt:
        reason = "soak interrupted"
    stop_started = time.monotonic()
    signals = stop_job(job, grace)
    stop_seconds = time.monotonic() - stop_started if signals else 0.0
    job_seconds = time.monotonic() - job.started
    left = leftover_processes(job)
    survivors = [describe_process(p) for p in left]
    kill_all(left)
    job.stdout.finish()
    job.stderr.finish()
    stop = StopRecord(reason, signals, job.proc.returncode, round(stop_seconds, 3), job.stderr.interrupted)
    new_entries = shm_names() - shm_before
    jobs = jobs_shm_entries(new_entries, job.shm_held, list(job.seen))
    leaks = LeakCheck(survivors=survivors, shm_files_left=sorted(jobs), shm_new_not_the_jobs=sorted(new_entries - jobs),
                      shm_used_delta_bytes=shm_used_bytes() - shm_used_before, monitor_fds_before=fds_before,
                      monitor_fds_after=own_fds(), job_fds_last_minus_baseline=fds_after_baseline(samples))
    return SoakRun(command=train_command(train_args), minutes_asked=minutes, period=period, job_pid=job.pgid,
                   job_seconds=round(job_seconds, 3), samples=samples, stop=stop, leaks=leaks,
                   processes_seen=[SeenProcess(pid, created) for pid, created in sorted(job.seen.items())],
                   shm_held=sorted(job.shm_held), stdout=job.stdout.lines(), stderr_tail=job.stderr.lines())


def bars(run: SoakRun, growths: Sequence[Growth]) -> dict[str, object]:
    by_name = {g.name: g.growth for g in growths}
    worst, job_worst = largest_memory_growth(growths), largest_memory_growth(growths, JOB_MEMORY)
    return {"soak_growth_mib": None if worst is None else round(worst.growth, 3),
            "soak_growth_quantity": None if worst is None else worst.name,
            "soak_job_growth_mib": None if job_worst is None else round(job_worst.growth, 3),
            "soak_fds_growth": by_name.get("fds"), "soak_threads_growth": by_name.get("threads"),
            "soak_processes_growth": by_name.get("processes"),
            "soak_minutes": round(run.job_seconds / 60.0, 3),
            "epochs_done": count_epochs([line.text for line in run.stdout]),
            "leak_free": run.leaks.clean}


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# --- the report -------------------------------------------------------------------------------------


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.0f}"


def trace_table(samples: Sequence[Sample]) -> list[str]:
    gpus = sorted({i for s in samples for i in s.gpu_used_bytes})
    head = (["t (s)", "epochs", "processes", "threads", "fds", "RSS", "PSS", "USS", "/dev/shm used",
             "/dev/shm files", "host used"] + [f"GPU {i} used" for i in gpus] + ["sample ms"])
    lines = [TRACE_HEADING, "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in samples:
        row = [f"{s.seconds:.0f}", str(s.epochs_done), str(s.processes), str(s.threads), str(s.fds),
               _mib(s.rss_bytes), _mib(s.pss_bytes), _mib(s.uss_bytes), _mib(s.shm_used_bytes),
               _mib(s.shm_file_bytes), _mib(s.host_used_bytes)]
        row += [_mib(s.gpu_used_bytes.get(i)) for i in gpus] + [f"{s.sample_seconds * 1e3:.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""]


def growth_table(samples: Sequence[Sample], growths: Sequence[Growth]) -> list[str]:
    base = baseline_index(samples)
    if not growths:
        return ["Growth: none computed (no sample after the first epoch's, or no epoch finished).", ""]
    lines = [(f"Growth after the first epoch (baseline: the sample at {samples[base].seconds:.0f} s, "
              f"{samples[base].epochs_done} epoch(s) done; growth = largest later value - baseline):"), "",
             "| quantity | unit | baseline | peak | growth | peak at (s) |", "|---|---|---|---|---|---|"]
    for g in growths:
        lines.append(f"| {g.name} | {g.unit} | {g.baseline:.1f} | {g.peak:.1f} | {g.growth:+.1f} | "
                     f"{g.peak_seconds:.0f} |")
    return lines + [""]


def leak_lines(run: SoakRun) -> list[str]:
    leaks = run.leaks
    survivors = ", ".join(f"{p.pid} ({p.name})" for p in leaks.survivors) or "none"
    return ["Leak checks after the job stopped:", "",
            f"- processes of the job left after {SETTLE_S:g} s: {survivors}"
            + (" (killed by the soak)" if leaks.survivors else ""),
            (f"- the job's /dev/shm entries left: {', '.join(leaks.shm_files_left) or 'none'} "
             f"({len(run.shm_held)} seen held by its processes during the run)"),
            (f"- other /dev/shm entries new since before the job (not the job's): "
             f"{', '.join(leaks.shm_new_not_the_jobs) or 'none'}; /dev/shm used "
             f"{leaks.shm_used_delta_bytes / MIB:+.1f} MiB against before the job"),
            f"- this process's fds: {leaks.monitor_fds_before} before the job, {leaks.monitor_fds_after} after",
            f"- the job's fds at its last sample minus at the baseline: {leaks.job_fds_last_minus_baseline}",
            f"- clean: {leaks.clean}", ""]


def report_lines(run: SoakRun, growths: Sequence[Growth], summary: dict[str, object],
                 info: dict[str, object]) -> list[str]:
    stop = run.stop
    md = header_lines(f"Soak: `zerocopy train` for {run.job_seconds / 60:.1f} minutes", info, {})
    md += [(f"Job: `{' '.join(run.command[1:])}`, sampled every {run.period:g} s "
            f"({len(run.samples)} samples); {run.minutes_asked:g} minutes asked."), "",
           (f"Stopped: {stop.reason}; signals {', '.join(stop.signals) or 'none'}; exit code {stop.exit_code}; "
            f"'interrupted' printed: {stop.interrupted_message}; {stop.stop_seconds:.1f} s from the first "
            "signal to the job's exit."), "",
           "Bars: " + ", ".join(f"{k} = {v}" for k, v in summary.items()), ""]
    return md + growth_table(run.samples, growths) + leak_lines(run) + trace_table(run.samples)


def plot_trace(run: SoakRun):
    """A callback for :func:`write_report`: memory, counts and epochs against minutes."""
    samples = run.samples

    def plot(plt):
        minutes = [s.seconds / 60 for s in samples]
        _fig, (mem, counts, epochs) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
        series = {"RSS": [s.rss_bytes for s in samples], "PSS": [s.pss_bytes for s in samples],
                  "USS": [s.uss_bytes for s in samples], "/dev/shm used": [s.shm_used_bytes for s in samples],
                  "host used": [s.host_used_bytes for s in samples]}
        for i in sorted({i for s in samples for i in s.gpu_used_bytes}):
            series[f"GPU {i} used"] = [s.gpu_used_bytes.get(i) for s in samples]
        for label, values in series.items():
            if all(v is not None for v in values):
                mem.plot(minutes, [v / MIB for v in values], marker=".", label=label)
        mem.set_ylabel("MiB")
        mem.legend(fontsize="small")
        for label, values in (("fds", [s.fds for s in samples]), ("threads", [s.threads for s in samples]),
                              ("processes", [s.processes for s in samples])):
            counts.plot(minutes, values, marker=".", label=label)
        counts.set_ylabel("count")
        counts.legend(fontsize="small")
        epochs.plot(minutes, [s.epochs_done for s in samples], marker=".")
        epochs.set_ylabel("epochs done")
        epochs.set_xlabel("minutes since the job started")
        base = baseline_index(samples)
        if base is not None:
            for ax in (mem, counts, epochs):
                ax.axvline(minutes[base], color="grey", linestyle="--", linewidth=0.8)
        mem.set_title("zerocopy train soak (dashed: the growth baseline)")

    return plot


# --- the command line -------------------------------------------------------------------------------


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The soak's own arguments and, after ``--``, the job's."""
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="%(prog)s [options] [-- ZEROCOPY_TRAIN_ARGS...]")
    p.add_argument("--minutes", type=float, default=30.0, help="how long the job runs before it is stopped")
    p.add_argument("--period", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--grace", type=float, default=60.0,
                   help="seconds the job gets after SIGINT before SIGTERM, and after SIGTERM before SIGKILL")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--name", default="soak", help="base name of the result files")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    own, train_args = split_argv(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    for name in ("minutes", "period", "grace"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    info = machine_info()
    run = soak(train_args, args.minutes, args.period, args.grace)
    growths = growth(run.samples)
    summary = bars(run, growths)
    result = {"machine": info, "commit": _git_commit(), "config": vars(args), "command": run.command,
              "bars": summary, "growth": [asdict(g) for g in growths], "trace": [asdict(s) for s in run.samples],
              "stop": asdict(run.stop), "leaks": {**asdict(run.leaks), "clean": run.leaks.clean},
              "job_pid": run.job_pid, "job_seconds": run.job_seconds,
              "processes_seen": [asdict(p) for p in run.processes_seen], "shm_held": run.shm_held,
              "stdout": [asdict(line) for line in run.stdout],
              "stderr_tail": [asdict(line) for line in run.stderr_tail]}
    md = report_lines(run, growths, summary, info)
    write_report(args.out, args.name, result, md, plot_trace(run))
    print("\n".join(md[:md.index(TRACE_HEADING)] if TRACE_HEADING in md else md))
    if run.stop.reason == "exited":
        tail = "\n".join(line.text for line in run.stderr_tail[-10:])
        print(f"soak: the job ended by itself (status {run.stop.exit_code}) after {run.job_seconds:.0f} s; "
              f"its last stderr lines:\n{tail}", file=sys.stderr)
    return 0 if run.stop.reason == "time" and run.leaks.clean else 1


if __name__ == "__main__":
    sys.exit(main())
