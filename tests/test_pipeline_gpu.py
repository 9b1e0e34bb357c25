"""The pipeline on a GPU: every mode trains (sampling on the GPU where the plan says so), MPS and
green-context partitions, failures with MPS.

CPU-only checks of the partition helpers run everywhere; the rest carry the ``cuda`` marker.
"""

import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.pipeline import GatherIn, Partition, PartitionInfo, PipelineError, SampleOn, make_plan, run_pipeline
from pytorch_zerocopy.pipeline.partition import SHARED_DAEMON_ENV, MpsDaemon, MpsError, round_sms, shared_daemon
from pytorch_zerocopy.pipeline.plan import InjectedFailure
from test_pipeline_failures import _assert_nothing_left, _run_with_deadline, snapshot

needs_mps = pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None,
                               reason="nvidia-cuda-mps-control not installed")


def _mps_daemons():
    """Our MPS processes: those whose pipe directory is one of ours (zerocopy-mps-*)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if not f.read().startswith("nvidia-cuda-mps"):
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if b"zerocopy-mps-" in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


# --- everywhere -----------------------------------------------------------------------------


def test_round_sms():
    assert round_sms(16, 132, 8) == (16, 112)
    assert round_sms(10, 132, 8) == (16, 112)
    assert round_sms(1, 132, 8) == (8, 120)
    assert round_sms(13, 108, 2) == (14, 94)
    with pytest.raises(ValueError, match="positive"):
        round_sms(0, 132, 8)
    with pytest.raises(ValueError, match="no consumer SMs"):
        round_sms(130, 132, 8)


def test_missing_mps_binary_is_a_clear_error():
    with pytest.raises(MpsError, match="not on PATH"):
        MpsDaemon(binary="nvidia-cuda-mps-control-that-does-not-exist")


FAKE_MPS_CONTROL = """#!/bin/bash
# Stands in for nvidia-cuda-mps-control: '-d' starts a long-lived process that inherits our
# stdout (as a careless daemon would) and records its pid; commands come on stdin.
pidfile="$CUDA_MPS_PIPE_DIRECTORY/fake.pid"
if [ "$1" = "-d" ]; then
  [ -n "$FAKE_MPS_FAIL" ] && { echo "cannot start: $FAKE_MPS_FAIL"; exit 1; }
  sleep 300 &
  echo $! > "$pidfile"
  exit 0
fi
read -r cmd
[ -f "$pidfile" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
case "$cmd" in
  get_server_list) exit 0 ;;
  quit) kill "$(cat "$pidfile")"; rm -f "$pidfile"; exit 0 ;;
esac
exit 1
"""


def test_mps_daemon_lifecycle_with_a_stand_in(tmp_path, monkeypatch):
    """Start waits for the control pipe to answer, does not hang on a daemon holding our
    output, and stop ends what start began and removes the private directories."""
    import psutil

    fake = tmp_path / "fake-mps-control"
    fake.write_text(FAKE_MPS_CONTROL)
    fake.chmod(0o755)
    daemon = MpsDaemon(binary=str(fake)).start()
    root = daemon.root
    pidfile = os.path.join(daemon.env["CUDA_MPS_PIPE_DIRECTORY"], "fake.pid")
    pid = int(open(pidfile).read())
    assert psutil.pid_exists(pid)
    env = daemon.client_env(12.5)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12.5" and env["CUDA_MPS_PIPE_DIRECTORY"].startswith(root)
    with pytest.raises(ValueError, match="share"):
        daemon.client_env(0)
    reaper = daemon._reaper
    assert reaper is not None and reaper.poll() is None  # waiting for the owner's word or its death
    daemon.stop()
    daemon.stop()  # idempotent
    assert reaper.poll() is not None  # told, it ended
    psutil.wait_procs([psutil.Process(pid)] if psutil.pid_exists(pid) else [], timeout=5)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(root)

    monkeypatch.setenv("FAKE_MPS_FAIL", "no GPU here")
    with pytest.raises(MpsError, match="no GPU here"):
        MpsDaemon(binary=str(fake)).start()


def test_a_killed_owner_leaves_no_mps_daemon(tmp_path):
    """A process killed without running its cleanup (SIGKILL) leaves its daemon to the reaper,
    which stops it and removes its directories."""
    import psutil

    fake = tmp_path / "fake-mps-control"
    fake.write_text(FAKE_MPS_CONTROL)
    fake.chmod(0o755)
    code = ("import time\nfrom pytorch_zerocopy.pipeline.partition import MpsDaemon\n"
            f"d = MpsDaemon(binary={str(fake)!r}).start()\nprint(d.root, flush=True)\ntime.sleep(300)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        root = owner.stdout.readline().strip()
        pid = int(open(os.path.join(root, "pipe", "fake.pid")).read())
        assert psutil.pid_exists(pid)
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
    deadline = time.monotonic() + 60
    while os.path.exists(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(root)
    gone = not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert gone, "the daemon outlived its killed owner"


def test_run_as_client_runs_the_command_under_a_private_daemon(tmp_path):
    """``zerocopy mps -- CMD``'s core: CMD sees the daemon's pipe, its share and the shared
    daemon's root (so its pipelines attach), its exit status comes back, and the daemon and
    its directories are gone after it ends."""
    import psutil

    from pytorch_zerocopy.pipeline.partition import SHARED_DAEMON_ENV, run_as_client

    fake = tmp_path / "fake-mps-control"
    fake.write_text(FAKE_MPS_CONTROL)
    fake.chmod(0o755)
    seen = tmp_path / "seen.txt"
    script = ("import os, sys\n"
              "pid = open(os.path.join(os.environ['CUDA_MPS_PIPE_DIRECTORY'], 'fake.pid')).read().strip()\n"
              f"open({str(seen)!r}, 'w').write('\\n'.join([os.environ.get(k, '') for k in "
              f"('CUDA_MPS_PIPE_DIRECTORY', 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', {SHARED_DAEMON_ENV!r})] + [pid]))\n"
              "sys.exit(int(pid) % 7 + 3)\n")
    rc = run_as_client([sys.executable, "-c", script], 40, binary=str(fake))
    pipe, share, root, pid = seen.read_text().split("\n")
    assert pipe.startswith(root) and os.path.basename(pipe) == "pipe" and share == "40"
    assert rc == int(pid) % 7 + 3  # the command's own status
    assert not os.path.exists(root)
    gone = not psutil.pid_exists(int(pid)) or psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE
    assert gone, "the daemon outlived the command"
    with pytest.raises(ValueError, match="needs a command"):
        run_as_client([], binary=str(fake))
    with pytest.raises(MpsError, match="cannot run"):
        run_as_client([str(tmp_path / "no-such-command")], binary=str(fake))


def test_mps_client_files_of_ended_processes_are_removed(tmp_path):
    """The CUDA driver leaves a file in /dev/shm per MPS client process; stopping a daemon
    removes those made while it ran whose process has ended, and nothing else."""
    from pytorch_zerocopy.pipeline.partition import remove_ended_client_files

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    older = f"cuda.shm.0.{ended.pid:x}.1"
    (tmp_path / older).write_text("")
    before = frozenset(os.listdir(tmp_path))
    names = [f"cuda.shm.0.{ended.pid:x}.2", f"cuda.shm.0.{os.getpid():x}.1", "cuda.shm.0.zz.1", "torch_1_2",
             f"cuda.shm.0.{ended.pid:x}.3.tmp"]
    for name in names:
        (tmp_path / name).write_text("")
    assert remove_ended_client_files(before, str(tmp_path)) == [names[0]]
    assert sorted(os.listdir(tmp_path)) == sorted([older] + names[1:])


def test_attached_mps_daemon_is_shared_not_stopped(tmp_path, monkeypatch):
    """A pipeline under a launcher's daemon attaches to it: same pipe, and its stop() leaves
    the daemon to the launcher that started it."""
    import psutil

    fake = tmp_path / "fake-mps-control"
    fake.write_text(FAKE_MPS_CONTROL)
    fake.chmod(0o755)
    owner = MpsDaemon(binary=str(fake)).start()
    try:
        pid = int(open(os.path.join(owner.env["CUDA_MPS_PIPE_DIRECTORY"], "fake.pid")).read())
        monkeypatch.delenv(SHARED_DAEMON_ENV, raising=False)
        assert shared_daemon() is None
        for key, value in owner.shared_env().items():
            monkeypatch.setenv(key, value)
        handle = shared_daemon()
        env = handle.client_env(10)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == owner.env["CUDA_MPS_PIPE_DIRECTORY"]
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"
        handle.stop()
        assert psutil.pid_exists(pid) and os.path.isdir(owner.root)
    finally:
        root = owner.root
        owner.stop()
    assert not os.path.exists(root)
    monkeypatch.setenv(SHARED_DAEMON_ENV, str(tmp_path / "no-daemon-here"))
    with pytest.raises(MpsError, match="no MPS daemon directory"):
        shared_daemon()


# --- GPU ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph():
    return community_graph(num_nodes=20_000, feature_dim=64, seed=3)


def _plan(graph, mode, partition="auto", **kw):
    kw = {"batch_size": 512, "epochs": 2, "fanouts": (8, 8), "hidden": 64, "lr": 1e-2, **kw}
    return make_plan(mode, partition, row_bytes=graph.row_bytes, **kw)


def _train(graph, mode, partition="auto", **kw):
    pids = {}
    before = snapshot()
    epochs = run_pipeline(_plan(graph, mode, partition, **kw), graph, on_start=pids.update)
    return epochs, pids, before


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["dma", "zerocopy-naive", "gpu", "cpu"])
def test_gpu_modes_train(graph, mode):
    epochs, pids, before = _train(graph, mode)
    assert len(epochs) == 2 and epochs[-1].val_acc > 0.5
    _assert_nothing_left(pids, before)


@pytest.mark.cuda
@pytest.mark.parametrize("settings", [dict(mode="zerocopy", partition="none", num_slots=2, gather_batches=1),
                                      dict(mode="zerocopy", partition="none", sample_on="cpu", num_samplers=2),
                                      dict(mode="gpu", gather_in="producer")],
                         ids=["zerocopy-gpu-sampling", "zerocopy-cpu-sampling", "gpu-ring"])
def test_gpu_ring_trains(graph, settings):
    """The GPU ring with the producer sampling on the GPU (no sampler process), with CPU sampler
    processes instead, and the gpu mode's table behind the same ring."""
    epochs, pids, before = _train(graph, **settings)
    samplers = [name for name in pids if name.startswith("sampler")]
    assert len(samplers) == (2 if settings.get("sample_on") == "cpu" else 0)
    assert epochs[-1].val_acc > 0.5
    assert all(e.train_batches == -(-graph.train_idx.numel() // 512) for e in epochs)
    _assert_nothing_left(pids, before)


@pytest.mark.cuda
def test_training_step_never_synchronises(graph):
    """A GraphSAGE step (forward, backward, fused Adam) on GPU blocks issues no host
    synchronisation, so the trainer's host runs ahead of its GPU."""
    from pytorch_zerocopy.nn import GraphSAGE
    from pytorch_zerocopy.sampling import sample_layers

    seeds = graph.train_idx[:256]
    blocks = [b.to("cuda") for b in sample_layers(graph.graph, seeds, [8, 8], edge_dir="out", seed=0)]
    feats, labels = graph.features[blocks[0].nodes.cpu()].cuda(), graph.labels[seeds].cuda()
    model = GraphSAGE(graph.feature_dim, 64, graph.num_classes).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(model(blocks, feats), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(loss).item()


@pytest.mark.cuda
@pytest.mark.parametrize("mode, partition", [("zerocopy", "none"), ("gpu", "none")])
def test_trace_times_the_gpu_pipeline(graph, mode, partition):
    """On a GPU the trace times every steady step's gap, blocks copy and training step, and the
    gathering side's GPU samples and gathers (in the producer, or inline in the trainer); the
    parts of a step never exceed the epoch they belong to."""
    # One minibatch per gather, so every GPU timing but the last few travels.
    epochs, pids, before = _train(graph, mode, partition, trace=True, gather_batches=1)
    _assert_nothing_left(pids, before)
    for e in epochs:
        steps = e.trace.per_step
        assert len(steps["gpu_train_ms"]) == len(steps["gpu_gap_ms"]) == e.steady_batches
        assert all(v > 0 for v in steps["gpu_train_ms"]) and all(v >= 0 for v in steps["gpu_gap_ms"])
        busy = sum(steps["gpu_train_ms"]) + sum(steps["gpu_gap_ms"]) + sum(steps["gpu_copy_ms"])
        assert busy <= e.train_seconds * 1e3 * 1.05
    # GPU timings travel once complete: those of the last few minibatches may never be sent.
    for key in ("gather_ms", "sample_ms"):
        timed = sum(e.trace.producer[key]["n"] for e in epochs)
        assert timed >= sum(e.train_batches for e in epochs) - 4, key
        assert all(e.trace.producer[key]["p50"] > 0 for e in epochs), key


@pytest.mark.cuda
@needs_mps
def test_mps_daemon_limits_clients_and_stops():
    total = torch.cuda.get_device_properties(0).multi_processor_count
    probe = [sys.executable, "-c", "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)"]
    with MpsDaemon() as daemon:
        root = daemon.root
        out = subprocess.run(probe, env={**os.environ, **daemon.client_env(10)}, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        sms = int(out.stdout.strip().splitlines()[-1])
        assert 0 < sms <= total * 0.2, (sms, total)
        assert _mps_daemons()
    assert not os.path.exists(root)
    assert _mps_daemons() == []


@pytest.mark.cuda
@needs_mps
def test_zerocopy_with_mps_trains_and_cleans_up(graph):
    messages = []
    epochs = run_pipeline(_plan(graph, "zerocopy", "mps", producer_share=10), graph, messages.append)
    info = PartitionInfo(Partition.MPS, producer_share=10, consumer_share=90, shared_daemon=False)
    assert info in messages
    assert all(e.partition == info for e in epochs)
    assert epochs[-1].val_acc > 0.5
    assert _mps_daemons() == []


@pytest.mark.cuda
@needs_mps
@pytest.mark.parametrize("role", ["producer", "consumer"])
def test_mps_run_failure_stops_the_daemon(graph, role):
    plan = _plan(graph, "zerocopy", "mps", epochs=1, inject_failure=InjectedFailure(role, "kill", 2))
    before = snapshot()
    error, pids, _ = _run_with_deadline(plan, graph)
    assert isinstance(error, PipelineError) and error.role == role and "SIGKILL" in str(error)
    _assert_nothing_left(pids, before)
    assert _mps_daemons() == []


@pytest.mark.cuda
def test_green_partition_trains(graph):
    messages = []
    plan = _plan(graph, "zerocopy", "green", producer_sms=12)
    assert plan.gather_in is GatherIn.TRAINER and plan.sample_on is SampleOn.GPU and not plan.cuda_graph
    epochs = run_pipeline(plan, graph, messages.append)
    info = next(m for m in messages if isinstance(m, PartitionInfo))
    assert info.kind is Partition.GREEN and info.producer_sms % info.granularity == 0
    assert info.producer_sms >= 12 and info.producer_sms + info.consumer_sms <= info.total_sms
    # The driver path gives disjoint SM sets; torch's API alone cannot (its contexts overlap).
    assert info.disjoint, info.driver_error
    assert epochs[-1].val_acc > 0.5


@pytest.mark.cuda
@pytest.mark.parametrize("role", ["producer", "consumer"])
def test_gpu_ring_failure_ends_the_run(graph, role):
    plan = _plan(graph, "zerocopy", "none", epochs=1, inject_failure=InjectedFailure(role, "raise", 2))
    before = snapshot()
    error, pids, _ = _run_with_deadline(plan, graph)
    assert isinstance(error, PipelineError) and error.role == role
    assert "injected failure" in error.remote_traceback
    _assert_nothing_left(pids, before)
