"""benchmarks/soak.py: growth after the first epoch on made-up samples, epoch lines counted in
the trainer's own format, and a short soak of ``zerocopy train`` on the CPU pipeline that must
sample, count epochs, stop the job with Ctrl-C and leave no process of it behind."""

import json
import mmap
import os
import subprocess
import sys
import uuid

import psutil
import pytest

from benchmarks.soak import (
    JOB_MEMORY,
    MIB,
    Sample,
    baseline_index,
    count_epochs,
    growth,
    jobs_shm_entries,
    largest_memory_growth,
    shm_entries_held,
    split_argv,
)
from pytorch_zerocopy.pipeline import EpochStats
from pytorch_zerocopy.train import format_epoch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sample(seconds, epochs, rss_mib=100, fds=10, threads=8, gpu_mib=None, host_mib=1000):
    return Sample(seconds=seconds, epochs_done=epochs, processes=4, threads=threads, fds=fds,
                  rss_bytes=rss_mib * MIB, pss_bytes=None, uss_bytes=None, shm_used_bytes=50 * MIB,
                  shm_file_bytes=0, host_used_bytes=host_mib * MIB,
                  gpu_used_bytes={} if gpu_mib is None else {0: gpu_mib * MIB}, sample_seconds=0.01)


def _by_name(growths):
    return {g.name: g for g in growths}


def test_growth_counts_from_the_first_sample_after_the_first_epoch():
    samples = [_sample(0, 0, rss_mib=900, fds=40, gpu_mib=9000),  # the first epoch's peak is not growth
               _sample(10, 0, rss_mib=700, fds=30, gpu_mib=8000),
               _sample(20, 1, rss_mib=300, fds=12, threads=9, gpu_mib=2000),  # the baseline
               _sample(30, 2, rss_mib=364, fds=15, threads=8, gpu_mib=2000),
               _sample(40, 3, rss_mib=340, fds=12, threads=7, gpu_mib=2010)]
    assert baseline_index(samples) == 2
    g = _by_name(growth(samples))
    assert g["rss"].baseline == 300 and g["rss"].peak == 364 and g["rss"].growth == 64
    assert g["rss"].peak_seconds == 30  # the largest later value, not the last
    assert g["fds"].growth == 3 and g["fds"].unit == "count"
    assert g["threads"].growth == -1  # shrinking is reported as it is
    assert g["gpu0_used"].growth == 10 and g["gpu0_used"].unit == "MiB"
    assert g["host_used"].growth == 0 and g["processes"].growth == 0
    assert "pss" not in g and "uss" not in g  # not read: left out, not zero
    assert largest_memory_growth(growth(samples)).name == "rss"


def test_the_largest_memory_growth_is_named_and_the_jobs_own_kept_apart():
    samples = [_sample(0, 1, rss_mib=100, host_mib=1000), _sample(5, 1, rss_mib=120, host_mib=1500)]
    growths = growth(samples)
    worst = largest_memory_growth(growths)
    assert (worst.name, worst.growth) == ("host_used", 500)
    job = largest_memory_growth(growths, JOB_MEMORY)
    assert (job.name, job.growth) == ("rss", 20)


def test_no_growth_without_a_finished_epoch_or_a_later_sample():
    assert growth([_sample(0, 0), _sample(5, 0, rss_mib=500)]) == []
    assert growth([_sample(0, 0), _sample(5, 1)]) == []  # only the baseline itself
    assert growth([]) == [] and largest_memory_growth([]) is None


def test_epoch_lines_are_counted_in_the_trainers_format():
    stats = EpochStats(epoch=0, train_seconds=1.5, train_batches=24, feature_bytes=10 << 20, loss=1.2, val_acc=0.9)
    lines = ["fanouts [10, 10], batch size 1024, epochs 100. Each epoch: its training minibatches ...",
             format_epoch(stats), "epoch 1 training:  50%|#####     | 12/24", format_epoch(stats),
             "test accuracy 0.9000 on 30,000 test nodes"]
    assert count_epochs(lines) == 2


def test_the_jobs_arguments_follow_the_double_dash():
    assert split_argv(["--minutes", "1", "--", "--epochs", "3", "--", "x"]) == (["--minutes", "1"],
                                                                                ["--epochs", "3", "--", "x"])
    assert split_argv(["--period", "2"]) == (["--period", "2"], [])


def test_shm_entries_are_the_jobs_when_held_or_named_after_its_pids():
    name = f"soak-test-{os.getpid()}-{uuid.uuid4().hex}"
    path = os.path.join("/dev/shm", name)
    try:
        with open(path, "w+b") as f:
            f.write(b"x" * 4096)
            f.flush()
            assert name in shm_entries_held(os.getpid())  # held open
            mapped = mmap.mmap(f.fileno(), 4096)
        assert name in shm_entries_held(os.getpid())  # mapped only, as a named semaphore is
        mapped.close()
        assert name not in shm_entries_held(os.getpid())
    finally:
        os.unlink(path)
    held = {"sem.mp-abc"}
    names = {"sem.mp-abc", "torch_4242_1_0", "psm_other", "sem.mp-xyz"}
    assert jobs_shm_entries(names, held, [4242]) == {"sem.mp-abc", "torch_4242_1_0"}


def _group_members(pgid):
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                members.append(pid)
        except (OSError, psutil.Error):
            continue
    return members


@pytest.mark.slow
def test_a_short_soak_of_the_cpu_pipeline(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), "--minutes", "0.35", "--period", "2",
           "--grace", "30", "--out", str(tmp_path), "--name", "soak_test", "--",
           "--dataset", "papers-like:3k:4", "--feature-dim", "8", "--batch-size", "64", "--fanouts", "3,3",
           "--hidden", "8", "--epochs", "1000000"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, check=False)
    path = tmp_path / "soak_test.json"
    assert path.exists(), out.stdout + out.stderr
    result = json.loads(path.read_text())
    assert (tmp_path / "soak_test.md").read_text().count("Bars: ") == 1

    trace = result["trace"]
    assert len(trace) >= 5, trace
    assert max(s["processes"] for s in trace) >= 3  # the launcher, a sampler, a producer and a trainer
    epochs = [s["epochs_done"] for s in trace]
    assert epochs == sorted(epochs) and epochs[-1] > 0
    bars = result["bars"]
    assert bars["epochs_done"] >= epochs[-1] > 0
    assert bars["epochs_done"] == count_epochs([line["text"] for line in result["stdout"]])
    for key in ("soak_growth_mib", "soak_job_growth_mib", "soak_fds_growth", "soak_threads_growth",
                "soak_processes_growth"):
        assert isinstance(bars[key], (int, float)), (key, bars)
    assert 0.3 < bars["soak_minutes"] < 1.5
    assert {"rss", "pss", "uss", "host_used", "fds", "threads", "processes"} <= {g["name"] for g in result["growth"]}

    stop = result["stop"]
    assert stop["reason"] == "time" and stop["signals"][0] == "SIGINT"
    assert stop["exit_code"] == 130 and stop["interrupted_message"], result["stderr_tail"][-5:]
    assert result["leaks"]["survivors"] == [] and result["leaks"]["shm_files_left"] == []
    assert result["leaks"]["monitor_fds_after"] <= result["leaks"]["monitor_fds_before"]
    # Checked here too, not only by the tool: nothing of the job's group or tree is alive.
    assert _group_members(result["job_pid"]) == []
    seen = result["processes_seen"]
    assert len(seen) >= 3 and not [p for p in seen if _alive(p["pid"], p["create_time"])]
    pids = [p["pid"] for p in seen]
    assert not [n for n in os.listdir("/dev/shm") if any(f"_{p}_" in n for p in pids)]


def _alive(pid, create_time):
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
