"""The plan of a training run: every choice made once, in the parent, before any role starts.

A :class:`Plan` is frozen and validated when it is built (:meth:`Plan.__post_init__` is the one
place where settings are checked); the roles only read it. :func:`make_plan` builds the plan of a
mode on this machine: it resolves what the user left to the package (the GPU partition, the
device, where minibatches are sampled and gathered, thread counts from the cores this process
may use, minibatches per gather from the feature rows' width) and raises :class:`PlanError`
naming the setting that cannot work.

Vocabulary (one word per thing, in every layer):

================  ==============================================================================
``Mode``          how features reach the trainer: ``cpu`` (no GPU), ``dma`` (CPU gather into
                  pinned host slots, copied to the GPU), ``zerocopy-naive`` (``index_select`` on
                  the table's CUDA alias), ``zerocopy`` (the routed zero-copy gather),
                  ``gpu`` (the table copied into GPU memory: the upper bound)
``Partition``     how producer and trainer share one GPU: ``none``, ``mps`` (two processes under
                  a private MPS daemon), ``green`` (two streams on disjoint SM sets, one process)
``SampleOn``      ``cpu``: sampler processes run the library's multithreaded CPU sampling op;
                  ``gpu``: the process that gathers samples with the library's GPU op, reading
                  the graph's in-neighbour lists from unified (host) memory
``GatherIn``      ``producer``: a producer process gathers into a ring of slots shared with the
                  trainer; ``trainer``: the trainer gathers inline; ``machine``: one process of
                  the machine (:mod:`.machine`) holds the table and samples and gathers for
                  every local trainer, a thread, a stream and a ring per trainer;
                  ``machine-reads``: a producer process per trainer samples and fills its
                  ring, and the machine's one process holds the table and reads the rows of
                  every producer's gathers (:mod:`.machine_reads`)
``cache``         a :class:`~pytorch_zerocopy.feature_table.CacheConfig`: the feature rows the
                  gathering process keeps in GPU memory (a
                  :class:`~pytorch_zerocopy.feature_table.CachedTable`), mode ``zerocopy``
``Placement``     where the gathering process holds the feature table (``feature_placement``)
                  and where the sampling process reads the neighbour lists
                  (``graph_placement``): :class:`~pytorch_zerocopy.placement.Placement`. The
                  process that gathers loads the table itself, straight from the dataset's
                  feature source: ``managed`` (its own managed memory kept in host memory) or
                  ``unified`` (shared memory mapped in place, one copy for every process of the
                  machine) for ``zerocopy`` on a GPU, ``cpu`` for the CPU gathers, ``cuda`` for
                  mode ``gpu``
================  ==============================================================================

Defaults are the fast path: on a GPU, mode ``zerocopy`` reads from the host memory kind this
machine's GPU reads fastest (measured once per machine, :mod:`pytorch_zerocopy.probe`), keeps
a tenth of the rows in a GPU cache chosen by pre-sampling, and gives the producer the MPS share
and gather grid measured best for that setting; every setting given is an override.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum
from typing import Any, Optional, Tuple, Type, TypeVar, Union

from ..feature_table import CacheConfig, CachePolicy
from ..ops import GatherTuning
from ..placement import Placement, PlacementError

__all__ = ["GatherIn", "InjectedFailure", "Mode", "Partition", "Phase", "Plan", "PlanError", "SampleOn",
           "available_cores", "default_cache", "default_gather_batches", "gpu_available", "make_plan"]


class Mode(Enum):
    CPU = "cpu"
    DMA = "dma"
    ZEROCOPY_NAIVE = "zerocopy-naive"
    ZEROCOPY = "zerocopy"
    GPU = "gpu"


class Partition(Enum):
    NONE = "none"
    MPS = "mps"
    GREEN = "green"


class SampleOn(Enum):
    CPU = "cpu"
    GPU = "gpu"


class GatherIn(Enum):
    PRODUCER = "producer"
    TRAINER = "trainer"
    MACHINE = "machine"
    MACHINE_READS = "machine-reads"

    @property
    def ring(self) -> bool:
        """Whether another process gathers into a ring the trainer reads."""
        return self is not GatherIn.TRAINER

    @property
    def producer(self) -> bool:
        """Whether each trainer has a producer process of its own filling its ring."""
        return self in (GatherIn.PRODUCER, GatherIn.MACHINE_READS)

    @property
    def machine(self) -> bool:
        """Whether one process of the machine holds the feature table for every local trainer."""
        return self in (GatherIn.MACHINE, GatherIn.MACHINE_READS)


class Phase(Enum):
    """The phases of a run: each epoch trains on training minibatches, then evaluates
    validation minibatches; after the last epoch, test minibatches are evaluated."""

    TRAIN = "train"
    VAL = "val"
    TEST = "test"


E = TypeVar("E", bound=Enum)


class PlanError(ValueError):
    """A setting that cannot work; ``setting`` names it (a :class:`Plan` field or ``mode`` /
    ``partition``), the message says what it must be."""

    def __init__(self, setting: str, message: str):
        super().__init__(message)
        self.setting = setting


def _enum(kind: Type[E], value, setting: str) -> E:
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        raise PlanError(setting, f"{setting} must be one of {choices}, got {value!r}") from None


@dataclass(frozen=True)
class InjectedFailure:
    """Makes ``role`` (``"sampler"``, ``"producer"`` or ``"consumer"``) fail at its minibatch
    ``at`` (of rank ``rank`` only, when given): ``how`` is ``"raise"``, ``"kill"`` (SIGKILL)
    or ``"exit"`` (``os._exit(3)``). ``attempt``: only in that attempt of an elastic job
    (``TORCHELASTIC_RESTART_COUNT``; 0, the first, is also every run outside a launcher), so a
    restarted job does not fail again; None: in every attempt. It exists to test failure
    handling."""

    role: str
    how: str
    at: int
    rank: Optional[int] = None
    attempt: Optional[int] = 0


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, which containers and
    ``taskset`` narrow), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def gpu_available() -> bool:
    """A CUDA GPU and a build of this package that serves unified tensors on it. Creates no
    CUDA context."""
    import torch

    from ..unified import gpu_backed

    return torch.cuda.is_available() and gpu_backed()


def default_gather_batches(row_bytes: int) -> int:
    """Minibatches the producer gathers per call into a GPU ring, for rows of ``row_bytes``: 8 up
    to 512 B, fewer as rows widen, 1 from 4 KiB. Short rows are bound by rows per second, which
    rise with the rows per call (benchmarks/results/training_gather_groups.md); wide rows stream
    near the copy ceiling one minibatch at a time, and every minibatch of a group costs the ring
    two slots of GPU memory."""
    return max(1, min(8, 4096 // max(1, row_bytes)))


# The producer's MPS share: the paper's 10%; with a cache in front of managed memory the
# bounded gather lets a larger share feed the trainer without crowding it (training.md: 25%
# beat 20% and 10% on an H100 and an H200).
PRODUCER_SHARE = 10.0
CACHED_MANAGED_PRODUCER_SHARE = 25.0
# The default cache: a tenth of the rows, chosen by pre-sampling an epoch, at most this share of
# the GPU's memory (the rest stays for training and the ring).
DEFAULT_CACHE_FRACTION = 0.1
DEFAULT_CACHE_GPU_SHARE = 0.25
# The most local trainers the machine's gatherer serves by default. Its serving threads share
# one interpreter, and issuing a GPU sample is host work that holds it between the op calls, so
# more threads than this issue fewer samples per second together than fewer would; with more
# trainers, each gets a producer process of its own (reading one shared mapped table).
MACHINE_GATHERER_TRAINERS = 2

_FAILING_ROLES = ("sampler", "producer", "consumer")
_FAILURE_KINDS = ("raise", "kill", "exit")


@dataclass(frozen=True)
class Plan:
    """Everything the roles of one run read besides the dataset; picklable (sent to spawned
    children). Build it with :func:`make_plan`; constructing one directly validates it too.

    Placement: ``device`` is the trainer's (``"cpu"`` or ``"cuda:N"``; the producer uses the
    same GPU). ``sample_on`` / ``gather_in``: see the module docstring. ``num_samplers`` sampler
    processes run when ``sample_on`` is ``cpu`` (none otherwise), ``sampler_threads`` threads
    each; ``producer_threads`` / ``consumer_threads``: torch threads of those processes.

    Ring (``gather_in`` producer): ``num_slots`` feature slots; the producer gathers
    ``gather_batches`` minibatches per call (one walk over the table's pages for more rows; a
    phase's first calls take 1, 1, 2, 2, 4, 4, ... of them) and copies them to their slots,
    which needs ``num_slots >= 2 * gather_batches`` so one group trains while the next is
    gathered. With GPU sampling the producer keeps the next ``gather_batches`` minibatches'
    samples in flight while it gathers the current ones.

    Cache (mode ``zerocopy``): ``cache`` sizes a GPU cache of hot feature rows and picks its
    policy; the rows are chosen once, in the parent, from the dataset's graph (and training
    seeds: ``CachePolicy.PRESAMPLE`` pre-samples them as the run samples, with the plan's
    fanouts, batch size and seed, which the plan writes into the config), and the process that
    gathers holds them in GPU memory and gathers through them.

    Placement: ``feature_placement`` is where the gathering process holds the feature table,
    loaded there straight from the dataset's feature source; ``graph_placement`` where the
    sampling process reads the in-neighbour lists (see the module docstring). None: what the
    mode and device imply (:attr:`table_in`, :attr:`lists_in`: ``cpu`` on the CPU; ``unified``
    for mode ``zerocopy`` and ``zerocopy-naive`` on a GPU, ``cuda`` for mode ``gpu``; the lists
    ``unified`` when sampled on a GPU); :func:`make_plan` measures which host memory kind is
    faster instead, and sets ``feature_placement``.

    Partition: ``producer_share`` percent of the GPU's threads for the producer under MPS, and
    with ``producer_yields`` at MPS's below-normal client priority, so that the trainer's pending
    kernels are scheduled before the producer's (a loader's process way, which feeds a user's
    step: that step is what must not wait);
    ``producer_sms`` SMs for the gathering stream under green contexts. ``gather_tuning``
    (:class:`~pytorch_zerocopy.ops.GatherTuning`): how the producer's gather kernel is launched.
    Under MPS the two processes' blocks share SMs; a full grid of gather blocks, stalled on host
    reads, crowds the trainer's blocks out of them, and a bounded grid with deeper unrolling
    keeps the link busy with fewer of them.

    Training: GraphSAGE with ``len(fanouts)`` layers (``fanouts[0]`` nearest the input, ``-1``:
    every neighbour), ``hidden`` units, ``dropout``, Adam at ``lr``; ``batch_size`` seeds per
    minibatch; ``epochs`` epochs of at most ``max_batches`` training and ``val_batches``
    validation minibatches (None: the whole split), then at most ``val_batches`` minibatches of
    the test split, evaluated after the last epoch. ``cuda_graph``: replay each step from CUDA
    graphs after ``graph_warmup`` eager steps (:mod:`.train_step`; not with the green partition).
    Sampling is reproducible per ``(seed, epoch, phase, minibatch)`` wherever it runs.

    Diagnostics: ``replay`` samples only that many distinct minibatches per sampling source
    and phase and sends them again in turn (a run that does not measure sampling; results from
    it must say so); ``trace`` records per-minibatch timings (:mod:`.trace`);
    ``inject_failure`` (:class:`InjectedFailure`) tests failure handling.

    Checkpoints (:mod:`.checkpoint`): with ``checkpoint_dir``, the rank-0 trainer writes the
    run's state there after every epoch; ``resume`` continues the run whose checkpoint it
    holds. ``first_epoch`` is the epoch this run starts at: 0, or, resuming, the one after the
    checkpoint's (:func:`.checkpoint.resolve` sets it when the run starts).

    Data parallel: this pipeline is rank ``rank`` of ``world_size``; each trains its own shard
    of every epoch's training ids (:meth:`for_rank`). ``numa_nodes``: the NUMA nodes the
    machine's shared host tables (the graph's arrays, a shared feature table) are interleaved
    over (:mod:`pytorch_zerocopy.numa`); ``()``: where the kernel first places them.
    """

    mode: Mode = Mode.ZEROCOPY
    partition: Partition = Partition.NONE
    device: str = "cpu"
    sample_on: SampleOn = SampleOn.CPU
    gather_in: GatherIn = GatherIn.PRODUCER
    fanouts: Tuple[int, ...] = (10, 10)
    batch_size: int = 1024
    epochs: int = 2
    max_batches: Optional[int] = None
    val_batches: Optional[int] = None
    hidden: int = 128
    dropout: float = 0.3
    lr: float = 3e-3
    seed: int = 0
    num_samplers: int = 1
    sampler_threads: int = 1
    producer_threads: int = 1
    consumer_threads: int = 1
    num_slots: int = 3
    gather_batches: int = 1
    cache: Optional[CacheConfig] = None
    feature_placement: Optional[Placement] = None
    graph_placement: Optional[Placement] = None
    queue_depth: int = 4
    producer_share: float = PRODUCER_SHARE
    producer_yields: bool = False
    producer_sms: int = 16
    gather_tuning: GatherTuning = GatherTuning()
    cuda_graph: bool = True
    graph_warmup: int = 3
    replay: Optional[int] = None
    trace: bool = False
    inject_failure: Optional[InjectedFailure] = None
    checkpoint_dir: Optional[str] = None
    resume: bool = False
    first_epoch: int = 0
    rank: int = 0
    world_size: int = 1
    numa_nodes: Tuple[int, ...] = ()

    # --- validation: the one place -----------------------------------------------------

    def __post_init__(self) -> None:
        for name, kind in (("mode", Mode), ("partition", Partition), ("sample_on", SampleOn),
                           ("gather_in", GatherIn)):
            object.__setattr__(self, name, _enum(kind, getattr(self, name), name))
        for name in ("feature_placement", "graph_placement"):
            value = getattr(self, name)
            if value is not None:
                try:
                    object.__setattr__(self, name, Placement.parse(value, name))
                except PlacementError as e:
                    raise PlanError(name, str(e)) from None
        fanouts = self.fanouts
        if isinstance(fanouts, (int, str)) or not hasattr(fanouts, "__iter__"):
            raise PlanError("fanouts", f"fanouts must be a sequence of ints (one per layer), got {fanouts!r}")
        object.__setattr__(self, "fanouts", tuple(fanouts))
        if isinstance(self.numa_nodes, (list, tuple)):
            object.__setattr__(self, "numa_nodes", tuple(self.numa_nodes))
        if isinstance(self.inject_failure, (tuple, list)):
            object.__setattr__(self, "inject_failure", InjectedFailure(*self.inject_failure))
        self._check_types()
        self._check_ranges()
        self._check_placement()
        self._check_data_placement()
        self._check_checkpoint()
        if self.cache is not None:
            # The pre-sampling pass samples as the run does: the dataset's in-neighbour rows as
            # stored, the run's fanouts, batch size and seed.
            object.__setattr__(self, "cache", replace(self.cache, fanouts=self.fanouts, batch_size=self.batch_size,
                                                      edge_dir="out", seed=self.seed))

    def _fail(self, name: str, want: str) -> None:
        raise PlanError(name, f"{name} must be {want}, got {getattr(self, name)!r}")

    def _check_types(self) -> None:
        ints = ("batch_size", "epochs", "hidden", "seed", "num_samplers", "sampler_threads", "producer_threads",
                "consumer_threads", "num_slots", "gather_batches", "queue_depth", "producer_sms", "graph_warmup",
                "rank", "world_size")
        for name in ints + ("max_batches", "val_batches", "replay"):
            v = getattr(self, name)
            if v is None and name not in ints:
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                self._fail(name, "an int" if name in ints else "an int or None")
        for name in ("dropout", "lr", "producer_share"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                self._fail(name, "a finite number")
        for name in ("cuda_graph", "trace", "producer_yields"):
            if not isinstance(getattr(self, name), bool):
                self._fail(name, "True or False")
        if any(isinstance(f, bool) or not isinstance(f, int) for f in self.fanouts):
            self._fail("fanouts", "ints, one per layer")
        nodes = self.numa_nodes
        if not isinstance(nodes, tuple) or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in nodes) \
                or len(set(nodes)) != len(nodes):
            self._fail("numa_nodes", "distinct NUMA node numbers >= 0 (a tuple; empty: no placement)")
        if self.inject_failure is not None and not isinstance(self.inject_failure, InjectedFailure):
            self._fail("inject_failure", "an InjectedFailure or None")
        if self.cache is not None and not isinstance(self.cache, CacheConfig):
            self._fail("cache", "a pytorch_zerocopy.CacheConfig or None")
        if not isinstance(self.gather_tuning, GatherTuning):
            self._fail("gather_tuning", "a pytorch_zerocopy.ops.GatherTuning")

    def _check_ranges(self) -> None:
        checks = [
            ("fanouts", len(self.fanouts) >= 1 and all(f == -1 or f >= 1 for f in self.fanouts),
             "one positive fanout (or -1: every neighbour) per layer"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("epochs", self.epochs >= 1, ">= 1"),
            ("max_batches", self.max_batches is None or self.max_batches >= 1, "None or >= 1"),
            ("val_batches", self.val_batches is None or self.val_batches >= 1, "None or >= 1"),
            ("hidden", self.hidden >= 1, ">= 1"),
            ("dropout", 0 <= self.dropout < 1, "in [0, 1)"),
            ("lr", self.lr > 0, "> 0"),
            ("seed", self.seed >= 0, ">= 0"),
            ("num_samplers", self.gather_in is GatherIn.MACHINE
             or self.num_samplers >= (1 if self.sample_on is SampleOn.CPU else 0),
             ">= 1 (sampler processes)" if self.sample_on is SampleOn.CPU else ">= 0"),
            ("num_samplers", self.gather_in is not GatherIn.MACHINE or self.num_samplers == 0,
             "0 with gather_in 'machine' (the machine's gatherer samples in its own threads)"),
            ("sampler_threads", self.sampler_threads >= 1, ">= 1"),
            ("producer_threads", self.producer_threads >= 1, ">= 1"),
            ("consumer_threads", self.consumer_threads >= 1, ">= 1"),
            ("num_slots", self.num_slots >= 2, ">= 2 (the producer fills one slot while the trainer reads another)"),
            ("gather_batches", self.gather_batches >= 1, ">= 1"),
            ("num_slots", self.gather_batches == 1 or self.num_slots >= 2 * self.gather_batches,
             f">= 2 * gather_batches = {2 * self.gather_batches} (one group of slots trains while the next is "
             "gathered)"),
            ("queue_depth", self.queue_depth >= 1, ">= 1"),
            ("producer_share", 0 < self.producer_share < 100, "in (0, 100) (percent of the GPU's threads)"),
            ("producer_sms", self.producer_sms >= 1, ">= 1"),
            ("gather_tuning", 0 <= self.gather_tuning.blocks_per_sm <= 32 and self.gather_tuning.unroll in (0, 4, 8, 16),
             "blocks_per_sm in [0, 32] and unroll 0, 4, 8 or 16"),
            ("graph_warmup", self.graph_warmup >= 1, ">= 1"),
            ("replay", self.replay is None or self.replay >= 1, "None or >= 1"),
            ("world_size", self.world_size >= 1, ">= 1"),
            ("rank", 0 <= self.rank < self.world_size, f"in [0, world_size = {self.world_size})"),
        ]
        for name, ok, want in checks:
            if not ok:
                self._fail(name, want)
        f = self.inject_failure
        if f is not None and (f.role not in _FAILING_ROLES or f.how not in _FAILURE_KINDS or f.at < 0
                              or not (f.attempt is None or (isinstance(f.attempt, int) and f.attempt >= 0))):
            self._fail("inject_failure", f"a role of {_FAILING_ROLES}, a way of {_FAILURE_KINDS}, a minibatch >= 0 "
                                         "and an attempt >= 0 or None")

    def _check_placement(self) -> None:
        device = self.device
        kind, _, index = device.partition(":") if isinstance(device, str) else ("", "", "")
        if not (device == "cpu" or (kind == "cuda" and index.isdigit())):
            self._fail("device", "'cpu' or 'cuda:N'")
        cuda = kind == "cuda"
        mode, part = self.mode, self.partition
        if mode is Mode.CPU and cuda:
            raise PlanError("mode", "mode 'cpu' trains on the CPU: device must be 'cpu'")
        if mode in (Mode.DMA, Mode.ZEROCOPY_NAIVE, Mode.GPU) and not cuda:
            raise PlanError("mode", f"mode {mode.value!r} needs a CUDA GPU and a CUDA build of pytorch_zerocopy; "
                                    "without one use mode 'zerocopy' (the CPU pipeline) or 'cpu'")
        if part is not Partition.NONE:
            if not cuda:
                raise PlanError("partition", f"partition {part.value!r} partitions a GPU: it needs a CUDA device")
            if mode is not Mode.ZEROCOPY:
                raise PlanError("partition", f"partition {part.value!r} applies to mode 'zerocopy' only")
        if part is Partition.MPS and not self.gather_in.ring:
            raise PlanError("partition", "partition 'mps' puts the producer in its own process: gather_in must "
                                         "be 'producer', 'machine' or 'machine-reads'")
        if self.gather_in.machine and mode is not Mode.ZEROCOPY:
            raise PlanError("gather_in", f"gather_in {self.gather_in.value!r} (one process of the machine holds the "
                                         f"table for every local trainer) applies to mode 'zerocopy', not "
                                         f"{mode.value!r}")
        if part is Partition.GREEN and self.gather_in is not GatherIn.TRAINER:
            raise PlanError("partition", "partition 'green' gathers on a stream of the trainer's process: "
                                         "gather_in must be 'trainer'")
        if mode is Mode.DMA and self.gather_in is not GatherIn.PRODUCER:
            raise PlanError("gather_in", "mode 'dma' gathers in a producer process (pinned host slots): "
                                         "gather_in must be 'producer'")
        if mode in (Mode.CPU, Mode.ZEROCOPY_NAIVE) and self.gather_in is not GatherIn.TRAINER:
            raise PlanError("gather_in", f"mode {mode.value!r} gathers inside the trainer: gather_in must be 'trainer'")
        if self.sample_on is SampleOn.GPU:
            if not cuda:
                raise PlanError("sample_on", "sample_on 'gpu' needs a CUDA device")
            if self.num_samplers:
                raise PlanError("num_samplers", "num_samplers applies to sample_on 'cpu' (sampler processes); "
                                                "sampling on the GPU runs in the gathering process, got "
                                                f"{self.num_samplers}")
        if self.cache is not None and mode is not Mode.ZEROCOPY:
            raise PlanError("cache", f"cache applies to mode 'zerocopy' only (rows gathered zero-copy from the host "
                                     f"table), not {mode.value!r}")
        if self.gather_tuning != GatherTuning() and not (mode is Mode.ZEROCOPY and cuda and self.gather_in.ring):
            raise PlanError("gather_tuning", "gather_tuning tunes the producer's gathers on a GPU: it needs mode "
                                             "'zerocopy', a CUDA device and gather_in 'producer', 'machine' or "
                                             "'machine-reads'")
        if self.cuda_graph and part is Partition.GREEN:
            raise PlanError("cuda_graph", "cuda_graph must be False with partition 'green' (a graph captured on an "
                                          "ordinary stream would not keep to the green context's SMs)")

    @property
    def table_in(self) -> Placement:
        """Where the gathering process holds the feature table: ``feature_placement``, or when
        None, what the mode and device imply (no measurement)."""
        if self.feature_placement is not None:
            return self.feature_placement
        if not self.on_gpu or self.mode in (Mode.CPU, Mode.DMA):
            return Placement.CPU
        return Placement.GPU if self.mode is Mode.GPU else Placement.MAPPED

    @property
    def lists_in(self) -> Placement:
        """Where the sampling process reads the neighbour lists: ``graph_placement``, or when
        None, mapped host memory for GPU sampling and the CPU's for CPU sampling."""
        if self.graph_placement is not None:
            return self.graph_placement
        return Placement.MAPPED if self.sample_on is SampleOn.GPU else Placement.CPU

    def _check_data_placement(self) -> None:
        allowed = {
            Mode.CPU: (Placement.CPU,),
            Mode.DMA: (Placement.CPU,),
            Mode.ZEROCOPY_NAIVE: (Placement.MAPPED,),
            Mode.GPU: (Placement.GPU,),
            Mode.ZEROCOPY: (Placement.MAPPED, Placement.MANAGED) if self.on_gpu else (Placement.CPU,),
        }[self.mode]
        if self.table_in not in allowed:
            words = " or ".join(repr(p.value) for p in allowed)
            raise PlanError("feature_placement", f"feature_placement must be {words} for mode {self.mode.value!r} on "
                                                 f"{self.device!r}, got {self.table_in.value!r}")
        lists = ((Placement.MAPPED, Placement.MANAGED, Placement.GPU) if self.sample_on is SampleOn.GPU
                 else (Placement.CPU,))
        if self.lists_in not in lists:
            words = " or ".join(repr(p.value) for p in lists)
            raise PlanError("graph_placement", f"graph_placement must be {words} when sampling on "
                                               f"{self.sample_on.value!r}, got {self.lists_in.value!r}")

    def _check_checkpoint(self) -> None:
        d = self.checkpoint_dir
        if d is not None and (not isinstance(d, str) or not d):
            self._fail("checkpoint_dir", "a directory (a non-empty str) or None")
        if not isinstance(self.resume, bool):
            self._fail("resume", "True or False")
        if isinstance(self.first_epoch, bool) or not isinstance(self.first_epoch, int):
            self._fail("first_epoch", "an int")
        if self.resume and d is None:
            raise PlanError("resume", "resume continues from the last checkpoint in checkpoint_dir: give "
                                      "checkpoint_dir (--checkpoint DIR) too")
        if self.resume and self.replay is not None:
            raise PlanError("resume", "resume cannot continue a replay run (a diagnostic that replays the run's "
                                      "first minibatches)")
        if not 0 <= self.first_epoch < self.epochs:
            self._fail("first_epoch", f"in [0, epochs = {self.epochs})")
        if self.first_epoch and not self.resume:
            self._fail("first_epoch", "0 unless the run resumes from a checkpoint (resume)")

    # --- derived facts -------------------------------------------------------------------

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def host_slots(self) -> bool:
        """Whether the ring's slots are host memory (DMA, and the CPU pipeline)."""
        return self.mode is Mode.DMA or not self.on_gpu

    @property
    def sampler_processes(self) -> int:
        """Sampler processes to start (none when the gathering process samples: on the GPU, or
        the machine's gatherer)."""
        return self.num_samplers if self.sample_on is SampleOn.CPU and self.gather_in is not GatherIn.MACHINE else 0

    @property
    def mark_sources(self) -> int:
        """How many processes end each phase with an :class:`~.messages.EpochMark`: every
        sampler process, or the one process that samples on the GPU."""
        return self.sampler_processes or 1

    def for_rank(self, rank: int, world_size: int, local_rank: int, local_world: int) -> "Plan":
        """This plan for data-parallel rank ``rank`` of ``world_size`` (``local_rank`` of
        ``local_world`` on this machine): its own GPU, and this machine's cores shared out."""
        device = f"cuda:{local_rank}" if self.on_gpu else "cpu"
        threads = _threads(self.mode, self.on_gpu, self.sampler_processes, available_cores() // max(1, local_world))
        return replace(self, rank=rank, world_size=world_size, device=device, **threads)

    def describe(self) -> str:
        """One line: the mode and where sampling, gathering and training run."""
        device = self.device
        where = {GatherIn.MACHINE: "in the machine's gatherer process (one for every GPU of the machine)",
                 GatherIn.MACHINE_READS: "in the producer process, its rows read by the machine's gatherer "
                                         "process (one table for every GPU of the machine)"}.get(
            self.gather_in, f"in the {self.gather_in.value} process")
        if self.sample_on is SampleOn.CPU and self.gather_in is GatherIn.MACHINE:
            sampling = f"sampling on the CPU {where}"
        elif self.sample_on is SampleOn.CPU:
            n = self.sampler_processes
            sampling = f"sampling on the CPU in {n} sampler process{'es' if n != 1 else ''}"
        else:
            sampling = f"sampling on {device} " + ("in the producer process" if self.gather_in is GatherIn.MACHINE_READS
                                                   else where)
        gathering = {
            Mode.CPU: f"gathering on the CPU {where}",
            Mode.DMA: f"gathering on the CPU {where}, copied to {device}",
            Mode.ZEROCOPY_NAIVE: f"gathering on {device} from host memory (index_select on its mapping) {where}",
            Mode.ZEROCOPY: (f"gathering on {device} zero-copy from host memory {where}" if self.on_gpu
                            else f"gathering on the CPU {where}"),
            Mode.GPU: f"gathering on {device} from a copy of the table in its memory {where}",
        }[self.mode]
        parts = [f"mode {self.mode.value}: {sampling}", gathering, f"training on {device}"]
        if self.partition is Partition.MPS:
            parts.append(f"GPU partition mps (the producer on {self.producer_share:g} % of the GPU's threads)")
        elif self.partition is not Partition.NONE:
            parts.append(f"GPU partition {self.partition.value}")
        if self.partition is Partition.MPS and self.producer_yields:
            parts.append("the producer at below-normal MPS priority")
        if self.gather_in.ring and self.on_gpu and not self.host_slots:
            parts.append(f"{self.gather_batches} minibatch(es) per gather")
        if self.cache is not None:
            parts.append(f"{'GPU' if self.on_gpu else 'host'} cache of {describe_cache_size(self.cache)} "
                         f"({self.cache.policy.value})")
        if self.gather_tuning.blocks_per_sm:
            parts.append(f"gathers as {self.gather_tuning.blocks_per_sm} block(s) per SM of the producer's share")
        if self.on_gpu and self.mode is Mode.ZEROCOPY:
            parts.append(f"feature table in {self.table_in.describe} ({self.table_in.value})")
        if self.sample_on is SampleOn.GPU and self.lists_in is not Placement.MAPPED:
            parts.append(f"neighbour lists in {self.lists_in.describe}")
        if self.replay:
            parts.append(f"DIAGNOSTIC: replaying {self.replay} pre-sampled minibatches")
        if self.numa_nodes:
            parts.append(f"shared host tables interleaved over NUMA nodes {', '.join(map(str, self.numa_nodes))}")
        return ", ".join(parts)

    def settings(self) -> dict:
        """The plan as plain values (enums by their values), for reports."""
        return _plain(asdict(self))


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def describe_cache_size(cache: CacheConfig) -> str:
    """How a cache is sized, in words: ``10% of the rows``, ``1.50 GiB`` or ``1000 rows``."""
    if cache.fraction is not None:
        return f"{cache.fraction * 100:g}% of the rows"
    if cache.cache_bytes is not None:
        from ..unified import format_bytes

        return format_bytes(cache.cache_bytes)
    return f"{cache.rows:,} rows"


_PLAN_FIELDS = {f.name for f in fields(Plan)}
# Settings make_plan decides when they are not given (or given as None).
_RESOLVED = {"device", "sample_on", "gather_in", "num_samplers", "gather_batches", "num_slots", "sampler_threads",
             "producer_threads", "consumer_threads", "cuda_graph", "gather_tuning", "producer_share",
             "feature_placement", "graph_placement", "numa_nodes"}
# The producer's gather beside training under MPS, from managed host memory (whose large GPU
# pages keep a bounded grid at the link): blocks per SM of its share and loads per lane.
BOUNDED_GATHER = GatherTuning(blocks_per_sm=4, unroll=16)



def _threads(mode: Mode, on_gpu: bool, samplers: int, cores: int) -> dict:
    """Torch threads per role, from the ``cores`` available to the run, so that the roles
    together never ask for more threads than there are cores (one each at least): an OpenMP
    thread that waits at a barrier for a descheduled sibling stalls its whole process.

    A CPU trainer gets the cores the other roles leave (training is the heavy part; samplers
    get a quarter between them, the producer one). On a GPU the trainer's and the producer's
    hosts only issue work: one thread each, and the rest goes to the CPU samplers, if any; the
    DMA path's CPU gather takes half the cores first (all but one when it samples on the GPU)."""
    cores = max(1, cores)
    samplers = max(0, samplers)
    if not on_gpu:
        sampler = max(1, cores // (4 * max(1, samplers)))
        return dict(sampler_threads=sampler, producer_threads=1,
                    consumer_threads=max(1, cores - samplers * sampler - 1))
    if mode is Mode.DMA:  # the CPU gather: every core no sampler process needs
        producer = max(1, cores - 1) if samplers == 0 else max(1, min(cores // 2, cores - samplers - 1))
    else:
        producer = 1
    sampler = max(1, (cores - producer - 1) // max(1, samplers))
    return dict(sampler_threads=sampler, producer_threads=producer, consumer_threads=1)


def make_plan(mode: Union[str, Mode] = "zerocopy", partition: Union[str, Partition] = "auto", *,
              row_bytes: Optional[int] = None, table_bytes: Optional[int] = None, gpu: Optional[bool] = None,
              local_processes: int = 1, quiet: bool = True, **settings) -> Plan:
    """The plan of ``mode`` on this machine, with ``settings`` (any :class:`Plan` field) applied.

    Resolves, unless ``settings`` fix them: ``device`` (``cuda:0`` where a GPU serves unified
    tensors and ``gpu`` is not False, else the CPU); ``partition='auto'`` (MPS for ``zerocopy``
    on a GPU where its control binary exists, else none); ``sample_on`` (the GPU wherever the
    trainer is on a GPU, except the CPU-sampling ``dma`` path); ``gather_in`` (a producer
    process for ``dma`` and ``zerocopy`` unless partitioned with green contexts, the trainer
    otherwise); ``num_samplers`` (CPU sampling: 2 for ``dma``, else 1); thread counts
    (:func:`available_cores`); ``gather_batches`` (:func:`default_gather_batches` of
    ``row_bytes`` for a GPU ring, 1 otherwise), ``num_slots`` (at least 3, and two per
    minibatch of a gather group), ``cuda_graph`` (off with green contexts).

    For ``zerocopy`` on a GPU, the fast path: ``feature_placement`` is the host memory kind this
    machine's GPU reads fastest (:func:`pytorch_zerocopy.probe.host_read_rates`, measured once
    per machine); with 2 to :data:`MACHINE_GATHERER_TRAINERS` local processes on a GPU,
    ``gather_in`` is ``machine``: one process of the machine holds that table and gathers for
    every local trainer; with more, and in any plan that keeps a producer per trainer, the
    producers share one ``unified`` copy; ``cache`` (when not given at all; None
    means no cache) is a tenth of the rows chosen by pre-sampling, at most a quarter of the
    GPU's memory for a table of ``table_bytes``; ``producer_share`` is 25 with a cache in front
    of managed memory under MPS, else 10; ``gather_tuning`` a bounded grid under MPS from managed
    memory. ``quiet=False`` says when the machine is measured. A setting given as None is
    decided the same way (except ``cache``). Raises :class:`PlanError` for anything that cannot
    work.
    """
    unknown = sorted(set(settings) - _PLAN_FIELDS - {"mode", "partition"})
    if unknown:
        raise PlanError(unknown[0], f"unknown setting {unknown[0]!r}")
    settings = {k: v for k, v in settings.items() if not (v is None and k in _RESOLVED)}
    mode = _enum(Mode, mode, "mode")
    auto = partition == "auto"
    partition = Partition.NONE if auto else _enum(Partition, partition, "partition")
    use_gpu = gpu_available() if gpu is None else bool(gpu)
    if gpu and not gpu_available():
        raise PlanError("gpu", "gpu=True, but there is no CUDA GPU with a CUDA build of pytorch_zerocopy here")
    if mode in (Mode.DMA, Mode.ZEROCOPY_NAIVE, Mode.GPU) and not use_gpu:
        raise PlanError("mode", f"mode {mode.value!r} needs a CUDA GPU and a CUDA build of pytorch_zerocopy; "
                                "on this machine use mode 'zerocopy' (the CPU pipeline) or 'cpu'")
    if partition is not Partition.NONE and not use_gpu:
        raise PlanError("partition", f"partition {partition.value!r} needs a CUDA GPU")
    device = settings.pop("device", "cuda:0" if use_gpu and mode is not Mode.CPU else "cpu")
    if device == "cuda":
        device = "cuda:0"
    on_gpu = device != "cpu"
    if on_gpu and not use_gpu:
        raise PlanError("device", f"device {device!r} needs a CUDA GPU and a CUDA build of pytorch_zerocopy")
    sample_on = settings.pop("sample_on", None)
    if sample_on is None:
        sample_on = SampleOn.GPU if on_gpu and mode is not Mode.DMA else SampleOn.CPU
    sample_on = _enum(SampleOn, sample_on, "sample_on")
    gather_in = settings.pop("gather_in", None)
    if gather_in is None:
        producer = mode in (Mode.DMA, Mode.ZEROCOPY) and partition is not Partition.GREEN
        machine = producer and mode is Mode.ZEROCOPY and on_gpu and 1 < local_processes <= MACHINE_GATHERER_TRAINERS
        gather_in = GatherIn.MACHINE if machine else GatherIn.PRODUCER if producer else GatherIn.TRAINER
    gather_in = _enum(GatherIn, gather_in, "gather_in")
    if (auto and mode is Mode.ZEROCOPY and on_gpu and gather_in.ring
            and shutil.which("nvidia-cuda-mps-control")):
        partition = Partition.MPS
    num_samplers = settings.pop("num_samplers", None)
    if num_samplers is None:
        num_samplers = ((2 if mode is Mode.DMA else 1) if sample_on is SampleOn.CPU and gather_in is not GatherIn.MACHINE
                        else 0)
    samplers = num_samplers if sample_on is SampleOn.CPU and isinstance(num_samplers, int) else 0
    resolved = _threads(mode, on_gpu, samplers, available_cores())
    gpu_ring = gather_in.ring and on_gpu and mode is not Mode.DMA
    groups = settings.get("gather_batches")
    if groups is None:
        groups = resolved["gather_batches"] = default_gather_batches(row_bytes) if gpu_ring and row_bytes else 1
    if "num_slots" not in settings and isinstance(groups, int) and not isinstance(groups, bool):
        resolved["num_slots"] = max(3, 2 * groups)
    if partition is Partition.GREEN:
        resolved["cuda_graph"] = False
    fast_path = mode is Mode.ZEROCOPY and on_gpu
    rates = None
    if fast_path and ("feature_placement" not in settings or "cache" not in settings):
        from ..probe import host_read_rates

        rates = host_read_rates(quiet=quiet)
    if fast_path and "feature_placement" not in settings:
        # Several processes gathering on one machine share one mapped copy; the machine's one
        # gatherer holds its own copy in the fastest kind.
        shared = local_processes > 1 and not gather_in.machine
        resolved["feature_placement"] = Placement.MAPPED if shared or rates is None else rates.fastest
    if fast_path and "cache" not in settings:
        resolved["cache"] = default_cache(table_bytes, rates.gpu_memory_bytes if rates is not None else None)
    try:
        memory = Placement.parse(settings.get("feature_placement", resolved.get("feature_placement", Placement.MAPPED)),
                                 "feature_placement")
    except PlacementError as e:
        raise PlanError("feature_placement", str(e)) from None
    cache = settings.get("cache", resolved.get("cache"))
    resolved["producer_share"] = PRODUCER_SHARE
    if partition is Partition.MPS and gpu_ring and mode is Mode.ZEROCOPY and memory is Placement.MANAGED:
        resolved["gather_tuning"] = BOUNDED_GATHER
        if cache is not None:
            resolved["producer_share"] = CACHED_MANAGED_PRODUCER_SHARE
    if on_gpu and local_processes > 1:
        from ..numa import interleave_nodes

        resolved["numa_nodes"] = interleave_nodes(local_processes)
    resolved.update(settings)
    return Plan(mode=mode, partition=partition, device=device, sample_on=sample_on, gather_in=gather_in,
                num_samplers=num_samplers, **resolved)


def default_cache(table_bytes: Optional[int], gpu_memory_bytes: Optional[int]) -> CacheConfig:
    """The cache a zerocopy plan on a GPU keeps when none is asked for: a tenth of the rows,
    chosen by pre-sampling, capped at a quarter of the GPU's memory."""
    if table_bytes and gpu_memory_bytes and DEFAULT_CACHE_FRACTION * table_bytes > DEFAULT_CACHE_GPU_SHARE * gpu_memory_bytes:
        return CacheConfig(policy=CachePolicy.PRESAMPLE, cache_bytes=int(DEFAULT_CACHE_GPU_SHARE * gpu_memory_bytes))
    return CacheConfig(policy=CachePolicy.PRESAMPLE, fraction=DEFAULT_CACHE_FRACTION)
