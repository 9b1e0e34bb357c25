"""Generators: determinism, degree sanity, chunked construction equals a one-shot build."""

import numpy as np
import pytest
import torch

from pytorch_zerocopy.graph import (
    CSRGraph,
    bfs,
    connected_components,
    grid_graph,
    kronecker_graph,
    road_graph,
    uniform_random_graph,
)
from pytorch_zerocopy.graph.generators import build_from_chunks


@pytest.fixture
def seed():
    from graph_reference import fresh_seed

    return fresh_seed()


def same_graph(a, b):
    return (torch.equal(a.indptr, b.indptr) and torch.equal(a.indices, b.indices)
            and (a.weights is None) == (b.weights is None)
            and (a.weights is None or torch.equal(a.weights, b.weights)))


@pytest.mark.parametrize("make", [kronecker_graph, uniform_random_graph])
def test_deterministic_with_seed(make):
    a = make(10, 8, seed=5, device="cpu", weights="int")
    b = make(10, 8, seed=5, device="cpu", weights="int")
    c = make(10, 8, seed=6, device="cpu", weights="int")
    assert same_graph(a, b)
    assert not torch.equal(a.indices, c.indices)
    a._validate()


@pytest.mark.parametrize("make", [kronecker_graph, uniform_random_graph])
def test_segments_do_not_change_the_graph(make):
    # The chunk size fixes the random stream; how the fill pass is cut into segments must not
    # change the graph.
    one = make(9, 8, seed=1, device="cpu", chunk_edges=500, segment_edges=1 << 30)
    many = make(9, 8, seed=1, device="cpu", chunk_edges=500, segment_edges=900)
    assert same_graph(one, many)
    one._validate()


def test_kronecker_degrees():
    g = kronecker_graph(12, 16, seed=2, device="cpu")
    n = 1 << 12
    assert g.num_nodes == n and g.symmetric
    deg = g.out_degree().float()
    # Self-loops dropped, both directions stored: just under 2 * 16 entries per vertex.
    assert 0.9 * 32 * n <= g.num_edges <= 32 * n
    assert deg.max() > 20 * deg.mean()  # heavy-tailed
    assert (deg == 0).sum() > 0.05 * n  # many isolated vertices, as in Graph500
    src = torch.arange(n).repeat_interleave(g.out_degree())
    assert not bool((src == g.indices.long()).any())  # no self-loops


def test_urand_degrees():
    g = uniform_random_graph(12, 16, seed=2, device="cpu")
    deg = g.out_degree().float()
    assert abs(deg.mean().item() - 32) < 1.0
    assert deg.max() < 70 and deg.min() > 5  # Poisson(32) tails


def test_symmetric_weights_and_duplicates():
    g = kronecker_graph(8, 8, seed=4, device="cpu", weights="int", drop_duplicates=True)
    g._validate()
    s = torch.arange(g.num_nodes).repeat_interleave(g.out_degree())
    key = s * g.num_nodes + g.indices.long()
    assert torch.unique(key).numel() == key.numel()  # no duplicate pairs
    w = {(int(a), int(b)): int(c) for a, b, c in zip(s, g.indices, g.weights)}
    assert all(w[(b, a)] == c for (a, b), c in w.items())
    assert 1 <= g.weights.min() and g.weights.max() <= 255


def test_build_from_chunks_equals_from_coo(seed):
    rng = np.random.default_rng(seed)
    chunks = [(torch.from_numpy(rng.integers(0, 50, 40)), torch.from_numpy(rng.integers(0, 50, 40)))
              for _ in range(5)]
    g = build_from_chunks(50, 5, lambda i: chunks[i], symmetrize=True, drop_self_loops=True,
                          drop_duplicates=True, weights=None, device=torch.device("cpu"), segment_edges=37)
    s = torch.cat([c[0] for c in chunks])
    d = torch.cat([c[1] for c in chunks])
    ref = CSRGraph.from_coo(s, d, 50, symmetrize=True, drop_self_loops=True, drop_duplicates=True)
    assert same_graph(g, ref)


def test_grid():
    g = grid_graph(3, 4, weights="float")
    g._validate()
    assert g.num_nodes == 12 and g.symmetric
    assert g.num_edges == 2 * (3 * 3 + 2 * 4)
    assert g.indices[g.indptr[5]:g.indptr[6]].tolist() == [1, 4, 6, 9]
    assert g.out_degree().tolist() == [2, 3, 3, 2, 3, 4, 4, 3, 2, 3, 3, 2]
    assert float(g.weights.min()) > 0



def edge_keys(g):
    s = torch.arange(g.num_nodes).repeat_interleave(g.out_degree())
    return s, g.indices.long(), s * g.num_nodes + g.indices.long()


def test_kronecker_as_the_traversal_benchmark_builds_it(seed):
    """Graph500-style: symmetric, without self loops or parallel edges, skewed degrees."""
    scale = 11
    g = kronecker_graph(scale, 16, seed=seed, drop_duplicates=True, device="cpu", chunk_edges=5000)
    with_duplicates = kronecker_graph(scale, 16, seed=seed, device="cpu", chunk_edges=5000)
    g._validate()
    n = 1 << scale
    assert g.num_nodes == n and g.symmetric
    s, d, key = edge_keys(g)
    assert not bool((s == d).any())
    assert torch.unique(key).numel() == key.numel()
    assert torch.equal(torch.sort(key).values, torch.sort(d * n + s).values)  # every edge has its reverse
    # R-MAT repeats pairs: removing them leaves fewer entries than the 2 * 16 * n generated.
    assert g.num_edges < with_duplicates.num_edges <= 2 * 16 * n
    deg = g.out_degree().float()
    assert deg.max() > 15 * deg.mean()


def test_road_graph_is_local_symmetric_and_sparse(seed):
    rows, cols = 40, 70
    g = road_graph(rows, cols, seed=seed, weights="int", device="cpu")
    g._validate()
    assert g.num_nodes == rows * cols and g.symmetric
    s, d, key = edge_keys(g)
    assert not bool((s == d).any())
    assert torch.unique(key).numel() == key.numel()
    assert torch.equal(torch.sort(key).values, torch.sort(d * g.num_nodes + s).values)
    # No shortcuts: both endpoints within one step in each coordinate.
    assert int((s // cols - d // cols).abs().max()) <= 1 and int((s % cols - d % cols).abs().max()) <= 1
    deg = g.out_degree()
    assert int(deg.max()) <= 8
    assert 2.6 < float(deg.float().mean()) < 3.4  # 4 * 0.7 + 2 * 0.1, less the border
    w = {(int(a), int(b)): int(c) for a, b, c in zip(s, d, g.weights)}
    assert all(w[(b, a)] == c for (a, b), c in w.items())
    # High diameter: most vertices in one component, which spans the lattice, so its first
    # vertex (near a corner) has vertices about the far side away.
    labels = connected_components(g)
    giant = int(torch.mode(labels).values)
    assert int((labels == giant).sum()) > 0.8 * g.num_nodes
    depth = bfs(g, giant)
    assert int(depth.max()) >= cols - 2
    assert road_graph(rows, cols, seed=seed, device="cpu").indices.equal(g.indices)
    assert not road_graph(rows, cols, seed=seed + 1, device="cpu").indices.equal(g.indices)

def test_generator_argument_errors():
    with pytest.raises(ValueError, match="scale"):
        kronecker_graph(0)
    with pytest.raises(ValueError, match="weights"):
        uniform_random_graph(4, weights="double", device="cpu")
    with pytest.raises(ValueError, match="rows"):
        grid_graph(0, 5)
    with pytest.raises(ValueError, match="probabilities"):
        road_graph(4, 4, drop=1.5)


@pytest.mark.parametrize("make, name", [(kronecker_graph, "kronecker_graph"),
                                        (uniform_random_graph, "uniform_random_graph")])
def test_a_graph_too_large_for_host_memory_is_refused_first(make, name):
    """scale 40 asks for hundreds of TiB: refused at once, in one line, with the figure in GiB and
    the largest scale that fits, which then does fit by the same count."""
    import re
    import time

    from pytorch_zerocopy.unified import available_host_memory

    start = time.perf_counter()
    with pytest.raises(torch.OutOfMemoryError) as info:
        make(40, device="cpu")
    assert time.perf_counter() - start < 1.0
    message = str(info.value)
    assert message.startswith(f"{name}(scale=40): 2^40 vertices and 16 x 2^40 edges need ") and "\n" not in message
    need = float(re.search(r"need ([\d,.]+) GiB of host memory", message).group(1).replace(",", ""))
    per_vertex = 8 + 2 * 16 * 8 + 3 * 8  # offset, 32 int64 ids (2^40 vertices), degree, prefix sum, permutation
    assert need == pytest.approx(per_vertex * 2**40 / 2**30, rel=1e-3)
    fits = int(re.search(r"the largest scale that fits is (\d+)", message).group(1))

    def need_at(scale):  # int32 ids from here on; a CPU segment sorts up to 2^24 entries at once
        return (8 + 2 * 16 * 4 + 3 * 8) * 2**scale + 48 * min(2 * 16 * 2**scale, 2**24)

    room = available_host_memory()  # it moves a little while other processes run
    assert need_at(fits) <= 1.05 * room and room < 1.05 * need_at(fits + 1), (fits, room)

