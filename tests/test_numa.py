"""NUMA placement of shared host tables (pytorch_zerocopy.numa): the machine as sysfs and
nvidia-smi describe it, the plan's decision, and the kernel's policy on a table's pages."""

import os

import pytest
import torch

from pytorch_zerocopy import numa
from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.datasets.base import shared_host_tensor
from pytorch_zerocopy.pipeline import PlanError
from pytorch_zerocopy.pipeline.plan import Plan

linux_mbind = pytest.mark.skipif(not os.path.exists("/proc/self/numa_maps"), reason="needs Linux NUMA policies")


def _policy(t: torch.Tensor) -> str:
    """The memory policy /proc/self/numa_maps gives the mapping that holds ``t``'s first byte."""
    address = t.untyped_storage().data_ptr()
    best = None
    with open("/proc/self/numa_maps") as f:
        for line in f:
            start = int(line.split()[0], 16)
            if start <= address and (best is None or start > best[0]):
                best = (start, line.split()[1])
    return best[1]


def test_node_lists_are_read_from_sysfs(tmp_path):
    (tmp_path / "has_memory").write_text("0-1,3\n")
    assert numa.memory_nodes(str(tmp_path)) == [0, 1, 3]
    (tmp_path / "has_memory").unlink()
    (tmp_path / "node0").mkdir()
    (tmp_path / "node2").mkdir()
    assert numa.memory_nodes(str(tmp_path)) == [0, 2]
    assert numa.memory_nodes(str(tmp_path / "missing")) == [0]


@pytest.fixture
def two_sockets(monkeypatch, tmp_path):
    """Four GPUs, two per node, on a host of two nodes with memory."""
    rows = []
    for i, (address, node) in enumerate((("0000:1b:00.0", 0), ("0000:1c:00.0", 0), ("0000:9b:00.0", 1),
                                         ("0000:9c:00.0", 1))):
        (tmp_path / address).mkdir()
        (tmp_path / address / "numa_node").write_text(f"{node}\n")
        rows.append(f"{i}, GPU-{i}{i}{i}{i}-uuid, 0000{address.upper()}")
    monkeypatch.setattr(numa, "nvidia_smi", lambda args: "\n".join(rows))
    monkeypatch.setattr(numa, "memory_nodes", lambda root=None: [0, 1])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path


def test_gpu_nodes_follow_cuda_visible_devices(two_sockets, monkeypatch):
    root = str(two_sockets)
    assert numa.gpu_nodes(root) == {0: 0, 1: 0, 2: 1, 3: 1}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-0000,1")
    assert numa.gpu_nodes(root) == {0: 1, 1: 0, 2: 0}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,nonsense,0")
    assert numa.gpu_nodes(root) == {0: 1}  # CUDA stops at the first entry it cannot resolve
    (two_sockets / "0000:9b:00.0" / "numa_node").write_text("-1\n")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert numa.gpu_nodes(root)[2] is None


def test_interleave_nodes_only_where_the_gpus_span_nodes(two_sockets, monkeypatch):
    nodes = numa.gpu_nodes(str(two_sockets))
    assert numa.interleave_nodes(4, nodes) == (0, 1)
    assert numa.interleave_nodes(2, nodes) == ()  # GPUs 0 and 1 share node 0
    assert numa.interleave_nodes(1, nodes) == ()
    assert numa.interleave_nodes(4, {0: 0, 1: 0, 2: None, 3: 1}) == ()  # a node unknown: no placement
    monkeypatch.setattr(numa, "memory_nodes", lambda root=None: [0])
    assert numa.interleave_nodes(4, nodes) == ()


def test_the_plan_holds_the_decision(monkeypatch):
    with pytest.raises(PlanError, match="numa_nodes"):
        Plan(numa_nodes=(0, 0))
    with pytest.raises(PlanError, match="numa_nodes"):
        Plan(numa_nodes=(-1,))
    plan = Plan(numa_nodes=[1, 0])
    assert plan.numa_nodes == (1, 0) and "NUMA nodes 1, 0" in plan.describe()
    assert "NUMA" not in Plan().describe()


@linux_mbind
def test_interleave_sets_the_pages_policy():
    t = shared_host_tensor((1 << 18,), torch.float32)
    assert numa.interleave(t, (0,)) is True
    t.fill_(1.0)
    assert _policy(t) == "interleave:0"
    assert numa.interleave(t, ()) is False  # no placement: nothing changes
    assert _policy(t) == "interleave:0"
    with pytest.raises(numa.NumaError, match="mbind over nodes \\[1000\\]"):
        numa.interleave(t, (1000,))
    with pytest.raises(numa.NumaError, match="must lie in"):
        numa.interleave(t, (5000,))
    assert torch.all(t == 1.0)


@linux_mbind
def test_a_dataset_shared_for_gpus_has_its_graph_and_table_placed():
    ds = community_graph(num_nodes=2000, feature_dim=8, seed=1)
    ds.share_for_gpus((0,), features=True)
    assert _policy(ds.graph.indptr) == "interleave:0" and _policy(ds.graph.indices) == "interleave:0"
    assert ds.features.is_shared() and _policy(ds.features) == "interleave:0"
    plain = community_graph(num_nodes=2000, feature_dim=8, seed=1).share_for_gpus((), features=False)
    assert _policy(plain.graph.indices) != "interleave:0"
    assert torch.equal(plain.graph.indices, ds.graph.indices)


@linux_mbind
def test_a_generated_table_is_placed_before_it_is_filled():
    from pytorch_zerocopy.datasets.features import shared_rows
    from pytorch_zerocopy.datasets.synthetic import papers_like

    ds = papers_like(num_nodes=4000, feature_dim=8, seed=0)
    assert ds.feature_source.host_tensor() is None
    expected = shared_rows(ds.feature_source)
    ds.share_for_gpus((0,), features=True)
    assert _policy(ds.features) == "interleave:0" and torch.equal(ds.features, expected)


@linux_mbind
def test_a_process_without_numa_policies_is_warned_not_stopped(monkeypatch):
    import platform

    t = shared_host_tensor((1024,), torch.float32)
    monkeypatch.setitem(numa._SYS_MBIND, platform.machine(), 100000)  # no such system call: ENOSYS
    with pytest.warns(RuntimeWarning, match="may not set NUMA memory policies"):
        assert numa.interleave(t, (0,)) is False
    monkeypatch.delitem(numa._SYS_MBIND, platform.machine())
    with pytest.warns(RuntimeWarning, match="not supported on"):
        assert numa.interleave(t, (0,)) is False
