"""The host side of a run: memlock reported truthfully, temp files cleaned up, children that die
with their parent, Ctrl-C of a data-parallel run ending like a single pipeline's."""

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from pytorch_zerocopy.doctor import CAP_IPC_LOCK, check_memlock, effective_capabilities

# --- zerocopy doctor: memlock ----------------------------------------------------------------------


def test_memlock_enforced_for_root_without_cap_ipc_lock():
    no_cap = 0x1FFFFFFFF & ~(1 << CAP_IPC_LOCK)  # everything but CAP_IPC_LOCK: docker's root
    check = check_memlock(64 << 10, no_cap)
    assert check.status == "WARN" and "enforced" in check.detail and "64.0 KiB" in check.detail
    assert "ulimit -l" in check.detail


def test_memlock_not_enforced_with_cap_ipc_lock():
    check = check_memlock(64 << 10, 1 << CAP_IPC_LOCK)
    assert check.status == "OK" and "not enforced" in check.detail


def test_memlock_unlimited_and_unknown_capabilities():
    assert check_memlock(resource.RLIM_INFINITY, None).status == "OK"
    unknown = check_memlock(8 << 20, None)
    assert unknown.status == "WARN" and "unreadable" in unknown.detail


def test_effective_capabilities_read_from_proc_status(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t00000000a80425fb\n")
    caps = effective_capabilities(str(status))
    assert caps == 0xA80425FB and not caps >> CAP_IPC_LOCK & 1  # docker's default set
    status.write_text("Name:\tpython\n")
    assert effective_capabilities(str(status)) is None
    assert effective_capabilities() is not None  # this process's own, on Linux


# --- zerocopy train: temp files, orphans, Ctrl-C -----------------------------------------------------

TRAIN = [sys.executable, "-m", "pytorch_zerocopy", "train", "--dataset", "papers-like:3k:4", "--feature-dim", "8",
         "--batch-size", "64", "--fanouts", "3,3", "--hidden", "8"]
START_LIMIT_S = 120  # a loaded 2-core machine starts a dozen Python processes slowly


def _env(tmpdir):
    # The CPU path everywhere (CPU workers over gloo for --gpus N), also on a GPU machine.
    return dict(os.environ, TMPDIR=str(tmpdir), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")


@pytest.fixture
def tmpdir_for_run():
    """A private, empty $TMPDIR for one run, with a short path: multiprocessing's Unix sockets
    live under it, and a socket path may not exceed 108 bytes (pytest's tmp_path can)."""
    path = tempfile.mkdtemp(prefix="zct-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _live(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _descendants(pid):
    try:
        return [c for c in psutil.Process(pid).children(recursive=True) if _live(c)]
    except psutil.Error:
        return []


def _started_processes(proc, count):
    """Waits until ``proc`` has started ``count`` Python processes (spawned roles or workers),
    lets the rest of the run start, and returns every live descendant."""
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        spawned = [k for k in _descendants(proc.pid) if "multiprocessing.spawn" in " ".join(k.cmdline())]
        if len(spawned) >= count:
            time.sleep(2.0)  # the remaining roles start and map the dataset
            return _descendants(proc.pid)
        time.sleep(0.2)
    out, err = proc.communicate(timeout=30) if proc.poll() is not None else ("", "")
    pytest.fail(f"the run did not start {count} processes in {START_LIMIT_S} s: {out}\n{err}")


def _shm_names(pids):
    return {n for n in os.listdir("/dev/shm") if any(f"_{p}_" in n for p in pids)}


def _kill_all(procs):
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_run_leaves_tmpdir_as_it_found_it(tmpdir_for_run, gpus):
    tmpdir = tmpdir_for_run
    cmd = TRAIN + ["--mode", "zerocopy", "--epochs", "1", "--max-batches", "2", "--gpus", str(gpus)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(tmpdir))
    assert out.returncode == 0, out.stdout + out.stderr
    # torch's compiler caches (torchinductor_<user>) are meant to outlive a run; nothing else is.
    left = sorted(n for n in os.listdir(tmpdir) if not n.startswith("torchinductor_"))
    assert left == [], "the run left temp files behind"


def test_children_die_with_a_killed_parent(tmpdir_for_run):
    tmpdir = tmpdir_for_run
    proc = subprocess.Popen(TRAIN + ["--epochs", "1000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=_env(tmpdir), start_new_session=True)
    kids = []
    try:
        kids = _started_processes(proc, 2)  # at least the trainer and a sampler or producer
        pids = [k.pid for k in kids]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(kids, timeout=10)
        assert [p.pid for p in alive if _live(p)] == [], "children outlived the SIGKILLed parent"
        assert _shm_names(pids) == set()
    finally:
        _kill_all(kids)
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_of_a_data_parallel_run_exits_130_cleanly(tmpdir_for_run):
    """Ctrl-C (SIGINT to the terminal's process group) during ``zerocopy train --gpus 2`` on CPU
    workers (gloo): status 130, the single pipeline's message, no traceback, no process left."""
    tmpdir = tmpdir_for_run
    proc = subprocess.Popen(TRAIN + ["--gpus", "2", "--epochs", "1000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(tmpdir), start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    kids = []
    try:
        kids = _started_processes(proc, 2 + 2 * 2)  # 2 workers, each with at least 2 roles
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 130, err
        assert "interrupted: all pipeline processes stopped" in err
        assert "Traceback" not in err and "SignalException" not in err, err
        _, alive = psutil.wait_procs(kids, timeout=15)
        assert [p.pid for p in alive if _live(p)] == [], "processes outlived the interrupted run"
        left = sorted(n for n in os.listdir(tmpdir) if not n.startswith("torchinductor_"))
        assert left == [], "the interrupted run left temp files behind"
    finally:
        _kill_all(kids)
        if proc.poll() is None:
            proc.kill()
