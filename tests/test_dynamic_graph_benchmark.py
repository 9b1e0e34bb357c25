"""benchmarks/dynamic_graph.py's baseline and checks on the CPU: the rebuilt CSR against a plain
multiset of edges, the deletion counts against a plain count, and the bars from synthetic results."""

from collections import Counter

import numpy as np
import pytest
import torch

from benchmarks import dynamic_graph as bench
from pytorch_zerocopy.graph import CSRGraph, DynamicGraph


@pytest.fixture
def rng():
    from graph_reference import fresh_seed

    return np.random.default_rng(fresh_seed())


def multiset(g: CSRGraph) -> Counter:
    out = Counter()
    for v in range(g.num_nodes):
        for u in g.indices[g.indptr[v]:g.indptr[v + 1]].tolist():
            out[(v, u)] += 1
    return out


def random_base(rng, n=30, m=200):
    """A CSR with sorted rows and parallel edges, as the generators build one."""
    s, d = rng.integers(0, n, m), rng.integers(0, n, m)
    s[: m // 5], d[: m // 5] = s[m // 5: 2 * (m // 5)], d[m // 5: 2 * (m // 5)]
    return CSRGraph.from_coo(s, d, n)


def batch_of(rng, base, size=60):
    """Pairs of which some are in ``base`` already and some repeat within the batch."""
    n = base.num_nodes
    present = list(multiset(base))
    pick = [present[i] for i in rng.integers(0, len(present), size // 3)]
    fresh = list(zip(rng.integers(0, n, size - len(pick)).tolist(), rng.integers(0, n, size - len(pick)).tolist()))
    pairs = pick + fresh + fresh[:5]
    return torch.tensor([a for a, _ in pairs]), torch.tensor([b for _, b in pairs])


def test_rebuild_after_insertion_adds_each_absent_pair_once(rng):
    base = random_base(rng)
    src, dst = batch_of(rng, base)
    got = bench.rebuild_inserted(base, src, dst)
    want = multiset(base)
    for pair in set(zip(src.tolist(), dst.tolist())) - set(want):
        want[pair] = 1
    assert multiset(got) == want
    assert got.indices.dtype == base.indices.dtype and got.device == base.device
    keys = bench.edge_keys(got.indptr, got.indices, got.num_nodes)
    assert bool((keys[1:] >= keys[:-1]).all())  # rows sorted, as the next rebuild needs


def test_rebuild_after_deletion_removes_every_copy(rng):
    base = random_base(rng)
    src, dst = batch_of(rng, base)
    got = bench.rebuild_deleted(base, src, dst)
    gone = set(zip(src.tolist(), dst.tolist()))
    assert multiset(got) == Counter({p: c for p, c in multiset(base).items() if p not in gone})


def test_rebuilds_follow_the_dynamic_graph(rng):
    base = random_base(rng)
    dg = DynamicGraph.from_csr(base, page_size=4, symmetric=False)
    src, dst = batch_of(rng, base)
    dg.insert_edges(src, dst)
    grown = bench.rebuild_inserted(base, src, dst)
    assert bench.same_edge_set(grown, dg.to_csr())
    dg.delete_edges(src[::2], dst[::2])
    assert bench.same_edge_set(bench.rebuild_deleted(grown, src[::2], dst[::2]), dg.to_csr())
    assert not bench.same_edge_set(grown, dg.to_csr())


def test_expected_removals_count_like_a_plain_loop(rng):
    base = random_base(rng)
    src, dst = batch_of(rng, base)
    edges = multiset(base)
    asked = set(zip(src.tolist(), dst.tolist()))
    assert bench.expected_edge_removals(base, src, dst) == sum(c for p, c in edges.items() if p in asked)
    victims = torch.tensor(rng.choice(base.num_nodes, 7, replace=False))
    vs = set(victims.tolist())
    assert bench.expected_vertex_removals(base, victims) == sum(c for (a, b), c in edges.items() if a in vs or b in vs)


def test_a_deletion_is_checked_against_the_reference(rng):
    base = random_base(rng)
    src, dst = batch_of(rng, base)
    clock = bench.Clock(torch.device("cpu"))
    expected = bench.expected_edge_removals(base, src, dst)
    dg = DynamicGraph.from_csr(base, page_size=4, symmetric=False)
    count, ms = bench.counted_deletion(dg, lambda: dg.delete_edges(src, dst), expected, src.numel(), clock)
    assert count.ok and count.removed == expected > 0 and ms >= 0
    dg = DynamicGraph.from_csr(base, page_size=4, symmetric=False)
    with pytest.raises(AssertionError, match=f"held {expected + 1} of them"):
        bench.counted_deletion(dg, lambda: dg.delete_edges(src, dst), expected + 1, src.numel(), clock)
    lying = bench.DeletionCount(batch=3, expected=5, returned=5, edges_before=10, edges_after=6)
    assert not lying.ok and lying.removed == 4


def placement_result(insert_ms, delete_ms, rebuild_ms, counts_ok=True):
    good = {"batch": 2, "expected": 4, "returned": 4, "edges_before": 10, "edges_after": 6}
    bad = dict(good, edges_after=7)
    workload = {"insert_ms": insert_ms, "delete_ms": delete_ms, "deletions": [good],
                "insert_vs_rebuild": rebuild_ms / insert_ms, "delete_vs_rebuild": rebuild_ms / delete_ms}
    return {"uniform": workload, "focused": dict(workload, deletions=[good if counts_ok else bad]),
            "delete_existing": {"delete_ms": delete_ms, "deletions": [good]},
            "vertices": {"deletion": good}, "sampling": {"dynamic_over_csr": 1.2},
            "memory_before": {"allocated_over_csr": 2.0}, "memory_after": {"allocated_over_csr": 2.5}}


def test_bars_take_the_worst_update_against_the_rebuild():
    runs = [{"placements": {"cuda": placement_result(4.0, 2.0, 400.0)}},
            {"placements": {"cuda": placement_result(5.0, 8.0, 200.0), "unified": placement_result(50, 80, 1)}}]
    bars = bench.bars_of(runs, "cuda")
    assert bars["update_vs_gpu_rebuild"] == pytest.approx(200.0 / 8.0)
    assert bars["insert_1M_edges_ms"] == 5.0 and bars["delete_1M_edges_ms"] == 8.0
    assert bars["deletions_match_reference"] is True and "update_vs_rebuild" not in bars
    runs[1]["placements"]["unified"] = placement_result(50, 80, 1, counts_ok=False)
    assert bench.bars_of(runs, "cuda")["deletions_match_reference"] is False


def test_the_profile_pass_times_each_update_and_leaves_the_graph_valid(rng):
    """--profile's diagnostic: a table per step, and its updates really happen (the batch comes
    and goes, the victims are deleted), on a graph whose earlier workloads deleted vertices."""
    base = random_base(rng, n=200, m=1500)
    dg = DynamicGraph.from_csr(base, placement="cpu", symmetric=False)
    dg.delete_vertices(torch.arange(0, 200, 7))
    edges, alive = dg.num_edges, int(dg.is_alive().sum())
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    tables = bench.profile_updates(dg, batch=50, vertex_batch=10, gen=gen)
    assert set(tables) == {"insert_edges", "delete_edges", "delete_vertices"}
    assert all("Self CPU" in t for t in tables.values())
    assert "zerocopy::dynamic_graph" in "".join(tables.values())
    assert int(dg.is_alive().sum()) == alive - 10 and dg.num_edges <= edges
