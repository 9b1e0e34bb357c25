"""Failure handling: any role failing ends the run quickly, with its traceback, leaving nothing."""

import gc
import os
import threading
import time

import psutil
import pytest

from pytorch_zerocopy import registration_stats
from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.pipeline import Mode, PipelineError, Plan, SampleOn, run_pipeline
from pytorch_zerocopy.pipeline.plan import GatherIn, InjectedFailure

RUN_LIMIT_SECONDS = 60  # generous for a loaded 2-core machine; a broken supervisor hangs forever


@pytest.fixture(scope="module")
def tiny():
    return community_graph(num_nodes=3000, feature_dim=16, seed=2)


def _shm_entries(pids):
    names = set(os.listdir("/dev/shm"))
    return {n for n in names if any(f"_{p}_" in n or n.endswith(f"_{p}") for p in pids)}


def _run_with_deadline(plan, ds):
    """run_pipeline in a thread; returns (exception or None, pids, seconds). On a hang, kills
    the children so the suite can go on, and fails."""
    pids = {}
    outcome = {}

    def target():
        try:
            run_pipeline(plan, ds, on_start=pids.update)
            outcome["error"] = None
        except BaseException as e:  # noqa: BLE001
            outcome["error"] = e

    start = time.monotonic()
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(RUN_LIMIT_SECONDS)
    seconds = time.monotonic() - start
    if t.is_alive():
        for pid in pids.values():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        pytest.fail(f"the pipeline did not end within {RUN_LIMIT_SECONDS} s after a failure")
    return outcome["error"], pids, seconds


def snapshot():
    """What this process holds before a run: shared-memory segments and live registrations."""
    return _shm_entries([os.getpid()]), registration_stats()["live_pieces"]


def _assert_nothing_left(pids, before):
    shm_before, regs_before = before
    for name, pid in pids.items():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, \
            f"{name} (pid {pid}) is still alive"
    children = [c for c in psutil.Process().children(recursive=True)
                if "resource_tracker" not in " ".join(c.cmdline())]
    assert children == [], f"leftover child processes: {children}"
    gc.collect()
    leaked = _shm_entries(list(pids.values()) + [os.getpid()]) - shm_before
    assert not leaked, f"leaked shared-memory segments: {leaked}"
    assert registration_stats()["live_pieces"] == regs_before


@pytest.mark.parametrize("how", ["raise", "kill"])
@pytest.mark.parametrize("role", ["sampler", "producer", "consumer"])
def test_a_failing_role_ends_the_run_with_its_traceback(tiny, role, how):
    before = snapshot()
    plan = Plan(mode=Mode.ZEROCOPY, device="cpu", sample_on=SampleOn.CPU, num_slots=2, batch_size=100, epochs=1,
                fanouts=(4, 4), hidden=16, inject_failure=InjectedFailure(role, how, 2))
    error, pids, seconds = _run_with_deadline(plan, tiny)
    assert isinstance(error, PipelineError), f"expected a PipelineError, got {error!r}"
    assert error.role == role
    if how == "raise":
        assert f"injected failure in the {role} at minibatch 2" in str(error)
        assert "Traceback" in error.remote_traceback and "maybe_fail" in error.remote_traceback
    else:
        assert "SIGKILL" in str(error)
    _assert_nothing_left(pids, before)


def test_a_role_exiting_without_a_report_is_an_error(tiny):
    # The trainer gathers inline here: two processes, no producer.
    before = snapshot()
    plan = Plan(mode=Mode.CPU, device="cpu", gather_in=GatherIn.TRAINER, batch_size=100, epochs=1, fanouts=(4, 4),
                hidden=16, inject_failure=InjectedFailure("consumer", "exit", 1))
    error, pids, _ = _run_with_deadline(plan, tiny)
    assert isinstance(error, PipelineError) and error.role == "consumer"
    assert "exited with status 3" in str(error)
    _assert_nothing_left(pids, before)
