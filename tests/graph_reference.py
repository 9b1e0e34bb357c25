"""Plain-Python references and test graphs for the graph tests (independent of the library's
own CPU kernels)."""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np
import torch


def bfs_reference(indptr, indices, source):
    n = len(indptr) - 1
    depth = np.full(n, -1, dtype=np.int64)
    depth[source] = 0
    q = deque([source])
    while q:
        v = q.popleft()
        for u in indices[indptr[v]:indptr[v + 1]]:
            if depth[u] < 0:
                depth[u] = depth[v] + 1
                q.append(int(u))
    return depth


def dijkstra_reference(indptr, indices, weights, source):
    n = len(indptr) - 1
    dist = [None] * n
    dist_best = {source: 0}
    heap = [(0, source)]
    while heap:
        d, v = heapq.heappop(heap)
        if dist[v] is not None:
            continue
        dist[v] = d
        for e in range(indptr[v], indptr[v + 1]):
            u = int(indices[e])
            nd = d + (1 if weights is None else weights[e])
            if dist[u] is None and nd < dist_best.get(u, float("inf")):
                dist_best[u] = nd
                heapq.heappush(heap, (nd, u))
    return dist


def components_reference(indptr, indices):
    """Minimum vertex id of each weakly connected component (BFS over both directions)."""
    n = len(indptr) - 1
    adj = [[] for _ in range(n)]
    for v in range(n):
        for u in indices[indptr[v]:indptr[v + 1]]:
            adj[v].append(int(u))
            adj[int(u)].append(v)
    label = np.full(n, -1, dtype=np.int64)
    for s in range(n):
        if label[s] >= 0:
            continue
        label[s] = s
        q = deque([s])
        while q:
            v = q.popleft()
            for u in adj[v]:
                if label[u] < 0:
                    label[u] = s
                    q.append(u)
    return label


def pagerank_reference(indptr, indices, alpha, tol, max_iter):
    """float64 power iteration from 1/N, stopped once the L1 change bounds the distance to the
    exact PageRank by tol (change <= tol * (1 - alpha) / alpha), or after max_iter iterations."""
    n = len(indptr) - 1
    deg = np.diff(indptr)
    src = np.repeat(np.arange(n), deg)
    rank = np.full(n, 1.0 / n)
    threshold = tol * (1 - alpha) / alpha if alpha > 0 else np.inf
    for _ in range(max_iter):
        acc = np.zeros(n)
        np.add.at(acc, indices, rank[src] / deg[src])
        new = (1 - alpha) / n + alpha * (acc + rank[deg == 0].sum() / n)
        diff = np.abs(new - rank).sum()
        rank = new
        if diff <= threshold:
            break
    return rank


def pagerank_exact(indptr, indices, alpha):
    """The exact PageRank (float64), by a dense linear solve: for graphs of a few hundred
    vertices."""
    n = len(indptr) - 1
    deg = np.diff(indptr)
    m = np.zeros((n, n))
    for v in range(n):
        if deg[v] == 0:
            m[:, v] = 1.0 / n
        else:
            np.add.at(m[:, v], indices[indptr[v]:indptr[v + 1]], 1.0 / deg[v])
    return np.linalg.solve(np.eye(n) - alpha * m, np.full(n, (1 - alpha) / n))


def random_edges(rng: np.random.Generator, n: int, m: int):
    return rng.integers(0, n, m), rng.integers(0, n, m)


def shapes(rng: np.random.Generator):
    """(name, src, dst, num_nodes) of several shapes; each has self-loops or duplicates or
    isolated vertices or several pieces."""
    out = []
    s, d = random_edges(rng, 120, 400)
    s = np.concatenate([s, s[:20], [3, 7]])  # duplicates and self-loops
    d = np.concatenate([d, d[:20], [3, 7]])
    out.append(("random", s, d, 130))  # vertices 120..129 isolated
    pieces_s, pieces_d = [], []
    for k, size in enumerate((40, 25, 1, 60)):
        base = k * 70
        ps, pd = random_edges(rng, size, size * 2)
        pieces_s.append(ps + base)
        pieces_d.append(pd + base)
    out.append(("pieces", np.concatenate(pieces_s), np.concatenate(pieces_d), 300))
    path = np.arange(150)
    out.append(("path", path[:-1], path[1:], 150))
    out.append(("star", np.zeros(80, dtype=np.int64), np.arange(1, 81), 81))
    out.append(("single", np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 1))
    out.append(("single-loop", np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), 1))
    return out


def np_csr(graph):
    g = graph.cpu()
    w = None if g.weights is None else g.weights.numpy()
    return g.indptr.numpy(), g.indices.numpy().astype(np.int64), w


def poison_cuda_cache(nbytes: int = 1 << 26) -> None:
    """Leaves freed blocks full of a non-zero pattern in the caching allocator, so an op that
    forgets to write part of a fresh output returns garbage instead of zeros."""
    junk = torch.full((nbytes // 4,), 0x7B7B7B7B, dtype=torch.int32, device="cuda")
    del junk


def fresh_seed() -> int:
    """A fresh random seed, printed so that a failure can be reproduced."""
    seed = int(np.random.SeedSequence().entropy % (2**31 - 1))
    print(f"seed = {seed}")
    return seed
