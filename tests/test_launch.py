"""The launcher on the CPU: 2 real worker processes over gloo, one shared table."""

import psutil
import pytest
import torch

import pytorch_zerocopy as zc
from pytorch_zerocopy.launch import LaunchOptions, WorkerFailed, launch

import launch_workers


@pytest.fixture(scope="module")
def shared_table():
    table = zc.empty_shared((131072, 128), torch.float32)  # 64 MiB
    table.copy_(torch.randn(131072, 128, generator=torch.Generator().manual_seed(7)))
    return table


def _run(table, nproc):
    return launch(launch_workers.ddp_on_shared_table, (table, 5), LaunchOptions(nproc_per_node=nproc))


def test_two_ranks_train_in_lockstep_on_one_shared_table(shared_table):
    results = _run(shared_table, 2)
    assert sorted(results) == [0, 1]
    expect = float(shared_table.double().sum())
    r0, r1 = results[0], results[1]
    assert r0["world_size"] == r1["world_size"] == 2
    for r in (r0, r1):
        assert abs(r["checksum"] - expect) < 1e-6 * abs(expect) + 1e-3
    # Gradients were averaged: both ranks hold the same weights, and training changed them.
    for p0, p1, init in zip(r0["params"], r1["params"], r0["initial"]):
        torch.testing.assert_close(p0, p1)
        assert not torch.allclose(p0, init)


def test_host_memory_does_not_grow_with_ranks(shared_table):
    table_bytes = shared_table.numel() * shared_table.element_size()
    one = _run(shared_table, 1)
    two = _run(shared_table, 2)
    growth = [r["anon_growth"] for r in (*one.values(), *two.values())]
    # Mapping and reading the whole table adds no private copy in any rank.
    assert max(growth) < table_bytes // 4, growth


def test_a_failing_rank_ends_the_job_with_its_traceback():
    with pytest.raises(WorkerFailed) as info:
        launch(launch_workers.fail_on_rank_one, ("boom from rank one",), LaunchOptions(nproc_per_node=2))
    text = str(info.value)
    assert "rank 1" in text and "boom from rank one" in text
    left = [p for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]  # multiprocessing's own helper
    assert left == [], f"workers left running: {[p.cmdline() for p in left]}"


def test_bad_options():
    with pytest.raises(ValueError, match="nproc_per_node"):
        launch(launch_workers.fail_on_rank_one, ("x",), LaunchOptions(nproc_per_node=0))
    with pytest.raises(ValueError, match="rdzv-endpoint"):
        launch(launch_workers.fail_on_rank_one, ("x",), LaunchOptions(nproc_per_node=1, nnodes="2"))
