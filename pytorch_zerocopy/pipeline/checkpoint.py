"""Checkpoints of a training run (``Plan.checkpoint_dir``): written by the rank-0 trainer after
every epoch, read when a run resumes (``Plan.resume``) or an elastic job restarts its workers.

What a checkpoint holds: one file, ``<checkpoint_dir>/checkpoint.pt``, with the last epoch the
run completed (its training, validation and, after the last epoch, test phases all done), the
model's parameters and Adam's state as they were when that epoch's training ended, and the
identity of the run that wrote it (:class:`RunIdentity`). That is all a run needs to go on as
if it had never stopped: an epoch's minibatches are a pure function of ``(plan.seed, epoch,
phase, index)`` (:mod:`.minibatches`), and the trainer reseeds its random stream (dropout) from
``(plan.seed, epoch, rank)`` when each epoch's training begins
(:func:`~.minibatches.trainer_seed`). A run resumed after epoch ``e`` therefore shuffles,
samples and drops out exactly what an uninterrupted run does from epoch ``e + 1`` on; on the
CPU its losses, accuracies and parameters are bit for bit the same. (The trainer trains
minibatches in the order they arrive: with several sampler processes that order, and so the
run's trajectory, varies from run to run, resumed or not.) On a GPU with CUDA graphs
the resumed run makes its graphs again, with eager warm-up steps and padded capacities taken
from its own first minibatches, so it trains on the same minibatches but its parameters agree
with an uninterrupted run's only statistically (other dropout masks, other summation orders).

Atomicity: the file is written to ``checkpoint.pt.tmp`` in the same directory, flushed and
fsynced, renamed over ``checkpoint.pt`` (``os.replace``), and the directory fsynced: a reader
finds the previous checkpoint or the new one, whole, whatever ends the writer. A writer killed
mid-write leaves the temporary file, which the next write replaces.

Format: tensors and plain containers only (no pickled classes), read back with
``torch.load(weights_only=True)``; tensors are saved from the CPU, so a checkpoint written on
a GPU resumes on the CPU and the other way round.

One writer, every rank a reader: with several machines ``checkpoint_dir`` must be a directory
every rank sees (a shared file system). Resuming needs the run's world size: an elastic job
whose machines come and go between restarts cannot resume a checkpoint of another size.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..datasets.base import NodeDataset
from .plan import Plan, PlanError

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 1  # bumped when what the file holds changes; another format is refused, not guessed at


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint must share with the run that resumes it: the dataset and the model's
    shape (else its tensors do not fit) and what decides the minibatch sequence (else the
    resumed run is another run). ``epochs``, ``lr``, ``dropout`` and where the run executes
    (mode, device, partition) may change between a run and its resumption."""

    dataset: str
    num_nodes: int
    num_edges: int
    feature_dim: int
    num_classes: int
    hidden: int
    fanouts: Tuple[int, ...]
    batch_size: int
    max_batches: Optional[int]
    seed: int
    world_size: int

    @classmethod
    def of(cls, plan: Plan, ds: NodeDataset) -> "RunIdentity":
        return cls(dataset=ds.name, num_nodes=ds.num_nodes, num_edges=ds.num_edges, feature_dim=ds.feature_dim,
                   num_classes=ds.num_classes, hidden=plan.hidden, fanouts=tuple(plan.fanouts),
                   batch_size=plan.batch_size, max_batches=plan.max_batches, seed=plan.seed,
                   world_size=plan.world_size)

    def differences(self, other: "RunIdentity") -> List[str]:
        """``"<field> <this> there, <other> here"`` for every field where ``other`` differs."""
        return [f"{f.name} {getattr(self, f.name)!r} there, {getattr(other, f.name)!r} here"
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


@dataclass
class TrainingState:
    """The model's parameters and Adam's per-parameter state, as CPU copies that own their
    memory (later steps do not change them)."""

    model: Dict[str, torch.Tensor]
    optimizer: Dict[int, Dict[str, Any]]

    @classmethod
    def capture(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> "TrainingState":
        """A copy of the state now. On a GPU the caller has synchronised, or the copies wait
        for the work queued on the current stream (``.cpu()`` does)."""
        params = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        state = {i: {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                 for i, s in optimizer.state_dict()["state"].items()}
        return cls(params, state)

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Loads this state into ``model`` and ``optimizer``. Parameters are copied into the
        existing tensors (their storage, and the gradient views into a flat buffer, are kept);
        Adam's state tensors are replaced, so this must come before any CUDA graph captures the
        step. The optimiser keeps its own hyperparameters and flags (``lr`` from the plan,
        ``fused``, ``capturable``): only its per-parameter state comes from the checkpoint."""
        model.load_state_dict(self.model)
        groups = optimizer.state_dict()
        groups["state"] = self.optimizer
        optimizer.load_state_dict(groups)


@dataclass
class Checkpoint:
    """Epoch ``epoch`` of the run ``run`` completed, with the state its training ended in."""

    epoch: int
    run: RunIdentity
    state: TrainingState

    def to_file(self) -> Dict[str, Any]:
        return {"format": FORMAT, "epoch": self.epoch, "run": asdict(self.run), "model": self.state.model,
                "optimizer": self.state.optimizer}

    @classmethod
    def from_file(cls, data: Dict[str, Any]) -> "Checkpoint":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"format {found!r}, this version reads format {FORMAT}")
        run = dict(data["run"])
        run["fanouts"] = tuple(run["fanouts"])
        return cls(int(data["epoch"]), RunIdentity(**run), TrainingState(data["model"], data["optimizer"]))


def checkpoint_path(directory: str) -> str:
    return os.path.join(directory, CHECKPOINT_FILE)


def save(directory: str, checkpoint: Checkpoint) -> None:
    """Writes ``checkpoint`` as ``directory``'s checkpoint, atomically (see the module
    docstring). One writer per directory at a time."""
    path = checkpoint_path(directory)
    temporary = path + ".tmp"
    with open(temporary, "wb") as f:
        torch.save(checkpoint.to_file(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself reaches the disk
    finally:
        os.close(fd)


def load(directory: str) -> Optional[Checkpoint]:
    """``directory``'s checkpoint, or None when it has none. Raises :class:`PlanError`
    (``resume``) naming the file when it cannot be read."""
    path = checkpoint_path(directory)
    if not os.path.exists(path):
        return None
    try:
        return Checkpoint.from_file(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as e:  # noqa: BLE001 - whatever is wrong with the file, say which file
        reason = " ".join(str(e).split()) or type(e).__name__
        raise PlanError("resume", f"resume cannot read the checkpoint {path}: {reason}") from None


def resolve(plan: Plan, ds: NodeDataset) -> Plan:
    """The plan a run starts from. Without ``checkpoint_dir``: ``plan``. With it: makes the
    directory and, with ``resume``, checks the checkpoint there against this run and returns
    the plan from the epoch after it (``first_epoch``); a plan already resolved comes back as it
    is. Raises :class:`PlanError` with one line: no checkpoint to resume, one of another run, one
    of a run already complete, or, not resuming, a checkpoint already there (a new run would
    overwrite it, and an elastic restart of the new run would resume it)."""
    directory = plan.checkpoint_dir
    if directory is None or plan.first_epoch > 0:
        return plan
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise PlanError("checkpoint_dir", f"checkpoint_dir {directory!r} cannot be made: {e.strerror}") from None
    found = load(directory)
    if not plan.resume:
        if found is not None:
            raise PlanError("checkpoint_dir", f"checkpoint_dir {directory!r} already holds a checkpoint (epoch "
                                              f"{found.epoch}): continue it with resume (--resume), or give another "
                                              "directory")
        return plan
    if found is None:
        raise PlanError("resume", f"resume found no checkpoint in {directory!r} (a run with checkpoint_dir writes "
                                  "one after every epoch)")
    differences = found.run.differences(RunIdentity.of(plan, ds))
    if differences:
        raise PlanError("resume", f"resume cannot continue the checkpoint in {directory!r}: another run wrote it "
                                  f"({'; '.join(differences)})")
    if found.epoch >= plan.epochs - 1:
        raise PlanError("resume", f"resume has nothing to do: the checkpoint in {directory!r} is of epoch "
                                  f"{found.epoch}, the run's last of {plan.epochs} (ask for more epochs to train further)")
    return replace(plan, first_epoch=found.epoch + 1)


def after_restart(plan: Plan) -> Optional[Plan]:
    """The plan of a worker that elastic restarted: it resumes from the job's checkpoint when
    there is one (a restart loses at most the epoch in flight), and starts again otherwise.
    None when the checkpoint is of the last epoch: the job had finished training before the
    restart, and nothing is left to run."""
    if plan.checkpoint_dir is None:
        return plan
    found = load(plan.checkpoint_dir)
    if found is None:
        return plan
    if found.epoch >= plan.epochs - 1:
        return None
    return replace(plan, resume=True, first_epoch=0)


def restore_for(plan: Plan, ds: NodeDataset, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Loads the checkpoint a resolved plan resumes (``first_epoch > 0``) into ``model`` and
    ``optimizer``. Raises if the directory's checkpoint is no longer the one the plan was
    resolved against (another writer meanwhile)."""
    found = load(plan.checkpoint_dir)
    if found is None or found.epoch != plan.first_epoch - 1 or found.run != RunIdentity.of(plan, ds):
        what = "none" if found is None else f"epoch {found.epoch}"
        raise RuntimeError(f"the checkpoint in {plan.checkpoint_dir!r} changed after the run started: it resumes "
                           f"after epoch {plan.first_epoch - 1}, the directory now holds {what}")
    found.state.restore(model, optimizer)
