"""Checkpoints and resumption (pytorch_zerocopy.pipeline.checkpoint): atomic files read back with
weights_only, runs resumed on the CPU bit for bit where an uninterrupted run would be, and a
data-parallel job that loses a rank mid-epoch restarting from its last checkpoint, leaving nothing
behind."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from typing import Set

import psutil
import pytest
import torch

from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.nn import GraphSAGE
from pytorch_zerocopy.launch import WorkerFailed
from pytorch_zerocopy.pipeline import PipelineError, PlanError, make_plan
from pytorch_zerocopy.pipeline import checkpoint
from pytorch_zerocopy.pipeline.plan import InjectedFailure, Plan
from pytorch_zerocopy.train import train
from test_pipeline_gpu import _mps_daemons

needs_two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                    reason="needs 2 GPUs")

# Small runs: 4 training and 2 validation minibatches per epoch (per rank), 2 test minibatches.
RUN = dict(fanouts=(4, 4), batch_size=64, max_batches=4, val_batches=2, hidden=16)
JOB_LIMIT_SECONDS = 300  # generous for a loaded 2-core machine; a hung restart would block forever


@pytest.fixture(scope="module")
def tiny():
    return community_graph(num_nodes=3000, feature_dim=16, seed=2)


def _model_and_adam(ds, seed: int):
    torch.manual_seed(seed)
    model = GraphSAGE(ds.feature_dim, 16, ds.num_classes, 2, 0.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt


def _trained_state(ds, seed: int = 1) -> checkpoint.TrainingState:
    model, opt = _model_and_adam(ds, seed)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return checkpoint.TrainingState.capture(model, opt)


def _plan(directory, **settings) -> Plan:
    return make_plan("zerocopy", checkpoint_dir=str(directory), **{**RUN, "epochs": 3, **settings})


def test_plan_checks_the_checkpoint_settings(tmp_path):
    with pytest.raises(PlanError, match="give checkpoint_dir"):
        make_plan("zerocopy", resume=True)
    with pytest.raises(PlanError, match="checkpoint_dir must be"):
        make_plan("zerocopy", checkpoint_dir="")
    with pytest.raises(PlanError, match="resume must be True or False"):
        make_plan("zerocopy", checkpoint_dir=str(tmp_path), resume="yes")
    with pytest.raises(PlanError, match="replay"):
        make_plan("zerocopy", checkpoint_dir=str(tmp_path), resume=True, replay=2)
    with pytest.raises(PlanError, match="first_epoch must be 0 unless"):
        make_plan("zerocopy", checkpoint_dir=str(tmp_path), first_epoch=1, epochs=3)
    with pytest.raises(PlanError, match="first_epoch must be in"):
        make_plan("zerocopy", checkpoint_dir=str(tmp_path), resume=True, first_epoch=3, epochs=3)
    with pytest.raises(PlanError, match="inject_failure"):
        make_plan("zerocopy", inject_failure=InjectedFailure("consumer", "kill", 1, attempt=-1))
    plan = make_plan("zerocopy", checkpoint_dir=str(tmp_path), resume=True, first_epoch=2, epochs=3)
    assert (plan.checkpoint_dir, plan.resume, plan.first_epoch) == (str(tmp_path), True, 2)


def test_a_checkpoint_round_trips_through_weights_only(tiny, tmp_path):
    state = _trained_state(tiny)
    run = checkpoint.RunIdentity.of(_plan(tmp_path), tiny)
    checkpoint.save(str(tmp_path), checkpoint.Checkpoint(4, run, state))
    assert os.listdir(tmp_path) == ["checkpoint.pt"]
    # Plain containers and tensors only: weights_only reads the whole file.
    raw = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert raw["epoch"] == 4 and raw["run"]["fanouts"] == (4, 4)
    found = checkpoint.load(str(tmp_path))
    assert found.epoch == 4 and found.run == run

    model, opt = _model_and_adam(tiny, seed=2)  # other parameters, no Adam state yet
    assert not torch.equal(next(iter(model.parameters())), next(iter(state.model.values())))
    storage = [p.data_ptr() for p in model.parameters()]
    found.state.restore(model, opt)
    for name, value in model.state_dict().items():
        assert torch.equal(value, state.model[name]), name
    assert [p.data_ptr() for p in model.parameters()] == storage  # loaded in place
    for i, s in opt.state_dict()["state"].items():
        for key, value in s.items():
            assert torch.equal(value, state.optimizer[i][key]), (i, key)
    assert opt.param_groups[0]["lr"] == 1e-2  # the optimiser's own hyperparameters stay


def test_a_write_that_fails_leaves_the_last_checkpoint(tiny, tmp_path, monkeypatch):
    run = checkpoint.RunIdentity.of(_plan(tmp_path), tiny)
    first = _trained_state(tiny, seed=1)
    checkpoint.save(str(tmp_path), checkpoint.Checkpoint(0, run, first))

    def dies_mid_write(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(str(tmp_path), checkpoint.Checkpoint(1, run, _trained_state(tiny, seed=3)))
    monkeypatch.undo()
    found = checkpoint.load(str(tmp_path))
    assert found.epoch == 0
    assert all(torch.equal(found.state.model[k], v) for k, v in first.model.items())
    # The next write replaces the leftover temporary file.
    checkpoint.save(str(tmp_path), checkpoint.Checkpoint(1, run, first))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt"] and checkpoint.load(str(tmp_path)).epoch == 1


def test_resolve_says_in_one_line_what_cannot_resume(tiny, tmp_path):
    directory = tmp_path / "new"
    fresh = _plan(directory)
    assert checkpoint.resolve(fresh, tiny) == fresh and directory.is_dir()  # made
    with pytest.raises(PlanError, match="resume found no checkpoint"):
        checkpoint.resolve(replace(fresh, resume=True), tiny)

    checkpoint.save(str(directory), checkpoint.Checkpoint(0, checkpoint.RunIdentity.of(fresh, tiny),
                                                          _trained_state(tiny)))
    resumed = checkpoint.resolve(replace(fresh, resume=True), tiny)
    assert resumed.first_epoch == 1 and checkpoint.resolve(resumed, tiny) == resumed
    with pytest.raises(PlanError, match=r"already holds a checkpoint \(epoch 0\)"):
        checkpoint.resolve(fresh, tiny)  # a new run would overwrite it
    for change, words in [(dict(batch_size=32), "batch_size 64 there, 32 here"),
                          (dict(fanouts=(4, 4, 4)), "fanouts (4, 4) there, (4, 4, 4) here"),
                          (dict(hidden=8), "hidden 16 there, 8 here"),
                          (dict(seed=5), "seed 0 there, 5 here")]:
        with pytest.raises(PlanError, match="another run wrote it") as error:
            checkpoint.resolve(replace(fresh, resume=True, **change), tiny)
        assert words in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(PlanError, match="world_size 1 there, 2 here"):
        checkpoint.resolve(replace(fresh, resume=True, world_size=2), tiny)
    other = community_graph(num_nodes=2000, feature_dim=16, seed=2)
    with pytest.raises(PlanError, match="num_nodes 3000 there, 2000 here"):
        checkpoint.resolve(replace(fresh, resume=True), other)
    with pytest.raises(PlanError, match="nothing to do"):
        checkpoint.resolve(replace(fresh, resume=True, epochs=1), tiny)
    # Another learning rate or more epochs continue the same run.
    assert checkpoint.resolve(replace(fresh, resume=True, lr=1e-4, epochs=9), tiny).first_epoch == 1

    (directory / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(PlanError, match="resume cannot read the checkpoint"):
        checkpoint.resolve(replace(fresh, resume=True), tiny)


def test_a_restarted_worker_resumes_when_the_job_has_a_checkpoint(tiny, tmp_path):
    plan = _plan(tmp_path)
    assert checkpoint.after_restart(plan) == plan  # died before its first checkpoint: start again
    run = checkpoint.RunIdentity.of(plan, tiny)
    checkpoint.save(str(tmp_path), checkpoint.Checkpoint(1, run, _trained_state(tiny)))
    assert checkpoint.after_restart(plan) == replace(plan, resume=True)
    checkpoint.save(str(tmp_path), checkpoint.Checkpoint(2, run, _trained_state(tiny)))
    assert checkpoint.after_restart(plan) is None  # the last epoch was done: nothing to run


def _summary(epochs):
    return [(e.epoch, e.train_batches, e.loss, e.val_acc, e.test_acc, e.param_checksum) for e in epochs]


@pytest.mark.slow
def test_a_resumed_run_trains_what_an_uninterrupted_run_trains(tiny, tmp_path):
    """On the CPU the pipeline is deterministic: epoch 2 resumed from epoch 1's checkpoint is
    epoch 2 of a run that never stopped, bit for bit (loss, accuracies, parameters). The runs
    stay on the CPU where a GPU exists too (a resumed GPU run captures its graphs again and
    rounds otherwise: the two-GPU kill test below compares those within tolerance)."""
    cpu = dict(RUN, gpu=False)
    straight = train(tiny, "zerocopy", quiet=True, epochs=3, checkpoint_dir=str(tmp_path / "a"), **cpu)
    first = train(tiny, "zerocopy", quiet=True, epochs=2, checkpoint_dir=str(tmp_path / "b"), **cpu)
    # The same first two epochs (the shorter run also tests after its last).
    assert [s[:4] + s[5:] for s in _summary(first)] == [s[:4] + s[5:] for s in _summary(straight)[:2]]
    resumed = train(tiny, "zerocopy", quiet=True, epochs=3, checkpoint_dir=str(tmp_path / "b"), resume=True, **cpu)
    assert [e.epoch for e in resumed] == [2]
    assert _summary(resumed) == _summary(straight)[2:]
    assert checkpoint.load(str(tmp_path / "b")).epoch == 2
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path / "b"))


JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint_job.py")


def _processes_with(marker: str) -> Set[int]:
    """Live processes whose environment carries ``marker``: a job's processes."""
    found = set()
    for p in psutil.process_iter():
        try:
            if p.environ().get("ZC_TEST_JOB") == marker:
                found.add(p.pid)
        except (psutil.Error, OSError):
            continue
    return found


def _run_job(settings: dict, marker: str, tmpdir: str):
    """tests/checkpoint_job.py with ``settings``, its environment carrying ``marker`` and its temp
    directory ``tmpdir``: (each rank's epochs as lists, the job's stderr, the pids its processes
    had, as seen every half second while it ran)."""
    env = dict(os.environ, ZC_TEST_JOB=marker, TMPDIR=tmpdir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(JOB)), env.get("PYTHONPATH"))
                                        if p)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        job = subprocess.Popen([sys.executable, JOB, json.dumps(settings)], env=env, stdout=out, stderr=err,
                               text=True)
        pids = {job.pid}
        deadline = time.monotonic() + JOB_LIMIT_SECONDS
        while job.poll() is None:
            if time.monotonic() > deadline:
                job.kill()  # its processes die with it
                job.wait()
                pytest.fail(f"the job did not end within {JOB_LIMIT_SECONDS} s")
            pids |= _processes_with(marker)
            time.sleep(0.5)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert job.returncode == 0, stderr[-4000:]
    ranks = json.loads(stdout.strip().splitlines()[-1])
    return {int(r): epochs for r, epochs in ranks.items()}, stderr, pids


def _shm_left_by(pids: Set[int], before: Set[str]) -> Set[str]:
    """``/dev/shm`` entries made since ``before`` that no live process maps, but those another
    program made: torch names a segment after the process that made it (``torch_<pid>_*``), and
    a job's named semaphores (``sem.mp-*``) are accounted for by its resource tracker, which
    reports any it had to remove (other programs' cannot be told apart here)."""
    new = set(os.listdir("/dev/shm")) - before
    mapped = set()
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/maps") as f:
                mapped.update(line.rsplit("/", 1)[-1].strip() for line in f if "/dev/shm/" in line)
        except OSError:
            continue
    ours = {f"torch_{p}_" for p in pids}
    return {n for n in new - mapped
            if not n.startswith("sem.mp-") and (not n.startswith("torch_") or any(n.startswith(o) for o in ours))}


@pytest.mark.slow
@pytest.mark.parametrize("ranks_on", [pytest.param("cpu", id="cpu-gloo"),
                                      pytest.param("cpu-machine", id="cpu-gloo-one-gatherer"),
                                      pytest.param("cuda", id="two-gpus-nccl",
                                                   marks=[pytest.mark.cuda, needs_two_gpus])])
def test_a_killed_rank_costs_at_most_the_epoch_in_flight(tmp_path, ranks_on):
    """Rank 1's trainer is killed (SIGKILL) in the middle of epoch 1's training; the job is
    restarted, resumes after epoch 0 from the checkpoint, finishes, and ends where a job that
    never failed ends. Nothing is left: processes, shared memory (the job's semaphores included:
    its resource tracker reports any it had to clean up), temp directories, MPS daemons. With
    one gatherer for the machine (``cpu-machine``; the default on two GPUs), the restarted
    trainers are served by a new gatherer, started with them."""
    on_cpu = ranks_on.startswith("cpu")
    settings = dict(RUN, epochs=2, use_gpu=not on_cpu)
    if ranks_on == "cpu-machine":
        settings["gather_in"] = "machine"
    marker = uuid.uuid4().hex
    # The jobs' temp directories (zc-*) go to a directory of this test's, short enough for the
    # Unix sockets multiprocessing keeps in them.
    private_tmp = tempfile.mkdtemp(prefix="zt-")
    try:
        reference, _, _ = _run_job(dict(settings, checkpoint_dir=str(tmp_path / "reference")), marker, private_tmp)
        shm = set(os.listdir("/dev/shm"))
        # Each epoch: 4 training then 2 validation minibatches per rank; minibatch 8 of rank 1's
        # trainer is epoch 1's third training minibatch (after epoch 0's checkpoint was written).
        restarted, stderr, pids = _run_job(dict(settings, checkpoint_dir=str(tmp_path / "job"), kill=[1, 8],
                                                max_restarts=1), marker, private_tmp)
        # torch's compile cache (torchinductor_<user>) is meant to stay; nothing else is.
        leftovers = [n for n in os.listdir(private_tmp) if not n.startswith("torchinductor_")]
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)

    assert "killed by SIGKILL" in stderr  # the first attempt did lose its rank
    # The restarted attempt resumed after epoch 0: only epoch 1 was lost and trained again.
    assert {r: [e[0] for e in epochs] for r, epochs in restarted.items()} == {0: [1], 1: [1]}
    assert checkpoint.load(str(tmp_path / "job")).epoch == 1
    final, expected = restarted[0][-1], reference[0][-1]
    assert final[5] == expected[5] > 0  # test nodes
    if on_cpu:  # deterministic: the same minibatches, dropout and sums give the same model
        assert restarted[0] == reference[0][1:] and restarted[1] == reference[1][1:]
    else:  # the resumed run captures its graphs again: the same minibatches, other rounding
        assert final[4] == pytest.approx(expected[4], abs=0.05)  # test accuracy
        assert final[6] == pytest.approx(expected[6], rel=1e-2)  # parameter checksum
    assert final[6] == pytest.approx(restarted[1][-1][6], rel=1e-6)  # the ranks agree

    assert len(pids) > 6 and _processes_with(marker) == set()  # it ran workers and roles; none is left
    assert "leaked" not in stderr  # the job's resource tracker removed no semaphore of ours
    assert _shm_left_by(pids, shm) == set()
    assert leftovers == []
    assert _mps_daemons() == []


class _Failing:
    """A stand-in for one attempt of a job: fails the first ``failures`` calls, recording the
    options each call got."""

    def __init__(self, failures: int, error: Exception):
        self.failures, self.error, self.calls = failures, error, []

    def __call__(self, options):
        self.calls.append(options)
        if len(self.calls) <= self.failures:
            raise self.error
        return {0: ["epochs"]}


@pytest.mark.parametrize("error", [WorkerFailed("rank 1 died"), PipelineError("gatherer", "killed by SIGABRT")],
                         ids=["worker", "gatherer"])
def test_a_job_on_one_machine_restarts_whole_attempts(error):
    """On one machine the launcher restarts the job itself: every attempt runs with elastic's
    restarts off and its number in the workers' environment (so each gets its own MPS daemon
    and gatherer, and its workers resume); the last attempt's failure is raised."""
    from pytorch_zerocopy.launch import ATTEMPT_ENV, LaunchOptions
    from pytorch_zerocopy.train import _attempts

    run = _Failing(2, error)
    options = LaunchOptions(nproc_per_node=2, max_restarts=2, extra_env={"KEEP": "1"})
    assert _attempts(run, options, quiet=True) == {0: ["epochs"]}
    assert [o.extra_env for o in run.calls] == [{"KEEP": "1", ATTEMPT_ENV: str(a)} for a in range(3)]
    assert {o.max_restarts for o in run.calls} == {0} and options.max_restarts == 2

    run = _Failing(2, error)
    with pytest.raises(type(error)):
        _attempts(run, LaunchOptions(max_restarts=1), quiet=True)
    assert len(run.calls) == 2
    run = _Failing(1, KeyboardInterrupt("stopped"))
    with pytest.raises(KeyboardInterrupt):  # an interrupted job is not restarted
        _attempts(run, LaunchOptions(max_restarts=3), quiet=True)
    assert len(run.calls) == 1


def test_restart_count_reads_both_restarters(monkeypatch):
    from pytorch_zerocopy.launch import ATTEMPT_ENV, restart_count

    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv(ATTEMPT_ENV, raising=False)
    assert restart_count() == 0
    monkeypatch.setenv(ATTEMPT_ENV, "2")
    assert restart_count() == 2
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert restart_count() == 3
