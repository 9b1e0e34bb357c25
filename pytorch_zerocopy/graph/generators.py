"""Synthetic graphs: Graph500/GAP Kronecker, GAP uniform random, a power-law (Chung-Lu-like)
graph with papers100M-like skew, a 2-D grid and a road-network-like perturbed grid.

Large graphs are built without ever holding the edge list twice. The edge stream is cut into
chunks, each produced by its own generator seeded from ``(seed, chunk)``, so any chunk can be
produced again bit for bit. A first pass over the chunks counts degrees, which fixes ranges
of source vertices whose edges fit a device-memory budget ("segments"); a second pass per
segment regenerates every chunk, keeps the edges whose source is in the segment, sorts them
by (source, destination) and copies the finished piece of the edge list into its place in the
host array. Peak memory is the host CSR arrays plus one segment on the generating device.

Determinism. The same arguments on the same kind of device (CPU, or one CUDA GPU model) give
the same graph; CPU and GPU random streams differ, so their graphs differ.

Vertex ids of the Kronecker graph are randomly permuted (as Graph500 does), so high-degree
vertices are not clustered at low ids. Edge weights, when asked for, are a hash of the
unordered vertex pair, so both directions of an undirected edge carry the same weight:
integers in [1, 255] (GAP's range) or those values divided by 255 as float32.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple, Union

import torch

from .. import unified as _unified
from .csr import CSRGraph, _index_dtype, coo_to_csr

DeviceLike = Union[str, torch.device, None]
ChunkFn = Callable[[int], Tuple[torch.Tensor, torch.Tensor]]


def _generation_device(device: DeviceLike) -> torch.device:
    if device is None:
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(device)


def _chunk_generator(seed: int, chunk: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((int(seed) * 1_000_003 + chunk * 7_919 + 17) % (2**63 - 1))
    return g


def _pair_weights(src: torch.Tensor, dst: torch.Tensor, kind: str) -> torch.Tensor:
    """Symmetric pseudo-random weights in [1, 255] from the unordered pair (src, dst)."""
    lo = torch.minimum(src, dst)
    hi = torch.maximum(src, dst)
    w = (lo * 2654435761 + hi * 40503 + (lo ^ hi) * 97) % 255 + 1
    if kind == "int":
        return w.to(torch.int32)
    return (w.to(torch.float32) / 255.0)


# Edges sorted at once when a graph is built on the CPU (build_from_chunks' default).
_CPU_SEGMENT_EDGES = 1 << 24


def _check_weights_kind(weights: Optional[str]) -> None:
    if weights not in (None, "int", "float"):
        raise ValueError(f"weights must be None, 'int' or 'float', got {weights!r}")


def _host_buffer(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # Filled from a GPU: page-locked and mapped up front, so the copies run at DMA speed and a
    # later to("unified") maps these bytes in place.
    if device.type == "cuda" and _unified.gpu_backed():
        return _unified.empty_unified(n, dtype).cpu()
    return torch.empty(n, dtype=dtype)


def _segments(cum: torch.Tensor, budget: int) -> list:
    """Vertex boundaries [0, b1, ..., n] such that each range's edge count is <= budget (a
    single vertex above the budget gets a range of its own)."""
    n = cum.numel()
    bounds = [0]
    while bounds[-1] < n:
        lo = bounds[-1]
        base = int(cum[lo - 1]) if lo > 0 else 0
        hi = int(torch.searchsorted(cum, torch.tensor([base + budget], dtype=cum.dtype), right=True)[0])
        bounds.append(min(n, max(hi, lo + 1)))
    return bounds


def build_from_chunks(
    num_nodes: int,
    num_chunks: int,
    make_chunk: ChunkFn,
    *,
    symmetrize: bool,
    drop_self_loops: bool,
    drop_duplicates: bool,
    weights: Optional[str],
    device: torch.device,
    index_dtype: Optional[torch.dtype] = None,
    segment_edges: Optional[int] = None,
    progress: bool = False,
    desc: str = "graph",
) -> CSRGraph:
    """A CPU CSRGraph from a stream of edge chunks ``make_chunk(i) -> (src, dst)`` (int64 on
    ``device``), which must return the same edges every time it is called with the same ``i``.
    With ``drop_duplicates`` the host arrays are sized before duplicates are removed and the
    graph holds views of their prefix."""
    _check_weights_kind(weights)
    idx_dtype = _index_dtype(num_nodes, index_dtype)
    if segment_edges is None:
        segment_edges = (1 << 29) if device.type == "cuda" else _CPU_SEGMENT_EDGES
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=num_chunks, desc=f"{desc}: degrees", unit="chunk")

    def edges(i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        s, d = make_chunk(i)
        if drop_self_loops:
            keep = s != d
            s, d = s[keep], d[keep]
        if symmetrize:
            s, d = torch.cat([s, d]), torch.cat([d, s])
        return s, d

    deg = torch.zeros(num_nodes, dtype=torch.int64, device=device)
    for i in range(num_chunks):
        s, _ = edges(i)
        deg += torch.bincount(s, minlength=num_nodes)
        if bar is not None:
            bar.update(1)
    cum = torch.cumsum(deg, 0).cpu()
    del deg
    total = int(cum[-1]) if num_nodes else 0
    bounds = _segments(cum, segment_edges) if num_nodes else [0]
    del cum
    if bar is not None:
        bar.reset(total=num_chunks * (len(bounds) - 1))
        bar.set_description(f"{desc}: fill ({len(bounds) - 1} segments)")

    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indices = _host_buffer(total, idx_dtype, device)
    wbuf = None if weights is None else _host_buffer(total, torch.int32 if weights == "int" else torch.float32, device)
    base = 0
    nn = max(num_nodes, 1)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        pieces = []
        for i in range(num_chunks):
            s, d = edges(i)
            keep = (s >= lo) & (s < hi)
            pieces.append((s[keep] - lo) * nn + d[keep])
            if bar is not None:
                bar.update(1)
        key = torch.sort(torch.cat(pieces)).values if pieces else torch.empty(0, dtype=torch.int64, device=device)
        del pieces
        if drop_duplicates:
            key = torch.unique_consecutive(key)
        src_local = torch.div(key, nn, rounding_mode="floor")
        dst = key - src_local * nn
        del key
        counts = torch.bincount(src_local, minlength=hi - lo).cpu()
        indptr[lo + 1:hi + 1] = base + torch.cumsum(counts, 0)
        m = dst.numel()
        indices[base:base + m].copy_(dst.to(idx_dtype))
        if wbuf is not None:
            wbuf[base:base + m].copy_(_pair_weights(src_local + lo, dst, weights))
        base += m
        del src_local, dst
    if bar is not None:
        bar.close()
    if base != total:
        indices = indices[:base]
        wbuf = None if wbuf is None else wbuf[:base]
    min_w = mean_w = None
    if wbuf is not None and base:
        # Lower bound and expected value of the hashed weights: enough for sssp's checks and
        # its bucket width, without another pass over a host array of billions of weights.
        scale = 1.0 if weights == "int" else 1.0 / 255.0
        min_w, mean_w = 1.0 * scale, 128.0 * scale
    return CSRGraph(indptr, indices, wbuf, symmetric=symmetrize, validate=False, min_weight=min_w,
                    mean_weight=mean_w)


def _chunking(num_edges: int, device: torch.device, chunk_edges: Optional[int]) -> Tuple[int, int]:
    if chunk_edges is None:
        chunk_edges = (1 << 26) if device.type == "cuda" else (1 << 21)
    return max(1, math.ceil(num_edges / chunk_edges)), chunk_edges


def _check_size(scale: int, edge_factor: int) -> None:
    if not 1 <= scale <= 40:
        raise ValueError(f"scale must be in [1, 40], got {scale}")
    if edge_factor < 1:
        raise ValueError(f"edge_factor must be >= 1, got {edge_factor}")


def _require_room(name: str, scale: int, edge_factor: int, symmetrize: bool, weights: Optional[str],
                  index_dtype: Optional[torch.dtype], device: torch.device) -> None:
    """Raises ``torch.OutOfMemoryError`` before anything is generated when a graph of
    ``2**scale`` vertices would not fit host memory (and, generated on a GPU, whose arrays are
    then shared memory, /dev/shm): one line with the size in GiB and the largest scale that fits.
    Counted: the int64 offsets, every CSR entry's id (and weight), the three int64 arrays per
    vertex built on the way (degrees, their prefix sums, the vertex permutation) and, generated
    on the CPU, a segment's sort keys and their by-products (six int64 per entry)."""
    def need(s: int) -> int:
        n = 1 << s
        entries = edge_factor * n * (2 if symmetrize else 1)
        per_entry = torch.empty(0, dtype=_index_dtype(n, index_dtype)).element_size() + (4 if weights else 0)
        segment = 6 * 8 * min(entries, _CPU_SEGMENT_EDGES) if device.type == "cpu" else 0
        return 8 * (n + 1) + entries * per_entry + 3 * 8 * n + segment

    room = [_unified.available_host_memory()]
    if device.type == "cuda" and _unified.gpu_backed():
        room.append(_unified.free_shared_memory())
    room = [r for r in room if r is not None]
    if not room or need(scale) <= min(room):
        return
    fits = [s for s in range(scale - 1, 0, -1) if need(s) <= min(room)]
    raise torch.OutOfMemoryError(
        f"{name}(scale={scale}): 2^{scale} vertices and {edge_factor} x 2^{scale} edges need "
        f"{_unified.format_bytes(need(scale), 'GiB')} of host memory, but {_unified.format_bytes(min(room), 'GiB')} "
        "are available; " + (f"the largest scale that fits is {fits[0]}" if fits else "no scale fits"))


def kronecker_graph(
    scale: int,
    edge_factor: int = 16,
    *,
    seed: int = 0,
    a: float = 0.57,
    b: float = 0.19,
    c: float = 0.19,
    symmetrize: bool = True,
    drop_self_loops: bool = True,
    drop_duplicates: bool = False,
    weights: Optional[str] = None,
    device: DeviceLike = None,
    index_dtype: Optional[torch.dtype] = None,
    chunk_edges: Optional[int] = None,
    segment_edges: Optional[int] = None,
    progress: bool = False,
) -> CSRGraph:
    """A Graph500 / GAP Kronecker (R-MAT) graph with ``2**scale`` vertices and
    ``edge_factor * 2**scale`` generated edges (twice that many CSR entries when symmetrized).

    Each edge picks, at each of ``scale`` levels, a quadrant with probabilities a, b, c and
    ``1 - a - b - c``. Generated on ``device`` (default: the GPU when there is one), in chunks;
    the result is a CPU graph (see the module docstring for memory and determinism). A graph
    whose arrays would not fit the host memory available raises ``torch.OutOfMemoryError``
    before anything is generated, naming the largest scale that fits.
    """
    _check_size(scale, edge_factor)
    if min(a, b, c) < 0 or a + b + c > 1:
        raise ValueError(f"a, b, c must be >= 0 with a + b + c <= 1, got {a}, {b}, {c}")
    dev = _generation_device(device)
    _require_room("kronecker_graph", scale, edge_factor, symmetrize, weights, index_dtype, dev)
    n = 1 << scale
    m = edge_factor * n
    num_chunks, step = _chunking(m, dev, chunk_edges)
    perm = torch.randperm(n, generator=_chunk_generator(seed, -1, dev), device=dev)
    ab, abc = a + b, a + b + c

    def make_chunk(i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        count = min(step, m - i * step)
        g = _chunk_generator(seed, i, dev)
        src = torch.zeros(count, dtype=torch.int64, device=dev)
        dst = torch.zeros(count, dtype=torch.int64, device=dev)
        for level in range(scale):
            u = torch.rand(count, generator=g, device=dev)
            bit = 1 << level
            src += (u >= ab).to(torch.int64) * bit
            dst += (((u >= a) & (u < ab)) | (u >= abc)).to(torch.int64) * bit
        return perm[src], perm[dst]

    return build_from_chunks(n, num_chunks, make_chunk, symmetrize=symmetrize, drop_self_loops=drop_self_loops,
                             drop_duplicates=drop_duplicates, weights=weights, device=dev,
                             index_dtype=index_dtype, segment_edges=segment_edges, progress=progress,
                             desc=f"kron{scale}")


def uniform_random_graph(
    scale: int,
    edge_factor: int = 16,
    *,
    seed: int = 0,
    symmetrize: bool = True,
    drop_self_loops: bool = True,
    drop_duplicates: bool = False,
    weights: Optional[str] = None,
    device: DeviceLike = None,
    index_dtype: Optional[torch.dtype] = None,
    chunk_edges: Optional[int] = None,
    segment_edges: Optional[int] = None,
    progress: bool = False,
) -> CSRGraph:
    """A GAP uniform random graph: ``edge_factor * 2**scale`` edges whose endpoints are drawn
    uniformly from ``2**scale`` vertices. Same chunked construction as :func:`kronecker_graph`."""
    _check_size(scale, edge_factor)
    dev = _generation_device(device)
    _require_room("uniform_random_graph", scale, edge_factor, symmetrize, weights, index_dtype, dev)
    n = 1 << scale
    m = edge_factor * n
    num_chunks, step = _chunking(m, dev, chunk_edges)

    def make_chunk(i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        count = min(step, m - i * step)
        g = _chunk_generator(seed, i, dev)
        src = torch.randint(0, n, (count,), generator=g, device=dev)
        dst = torch.randint(0, n, (count,), generator=g, device=dev)
        return src, dst

    return build_from_chunks(n, num_chunks, make_chunk, symmetrize=symmetrize, drop_self_loops=drop_self_loops,
                             drop_duplicates=drop_duplicates, weights=weights, device=dev,
                             index_dtype=index_dtype, segment_edges=segment_edges, progress=progress,
                             desc=f"urand{scale}")


def power_law_graph(
    num_nodes: int,
    avg_degree: float = 15.0,
    *,
    alpha: float = 2.2,
    skew: float = 3.0,
    max_degree: int = 200_000,
    seed: int = 0,
    device: DeviceLike = None,
    index_dtype: Optional[torch.dtype] = None,
    chunk_edges: int = 1 << 27,
) -> CSRGraph:
    """A power-law graph: row ``v`` lists ``deg(v)`` neighbours drawn with popularity skew.

    List lengths are Pareto(``alpha``) draws scaled to mean ``avg_degree`` and capped at
    ``max_degree``. Each entry is the node of rank ``floor(num_nodes * x ** skew)`` for a uniform
    ``x``, so rank ``r`` is drawn with probability ~ ``r ** (1 / skew - 1)``: a few nodes sit in
    very many lists (a heavy-tailed count with exponent ``1 + 1 / (1 - 1 / skew)``); ranks are
    spread over node ids by a random permutation, so hot nodes are not clustered by id. Lists
    may repeat a node and hold self loops, as Chung-Lu graphs do.

    Read the rows as the lists a sampler draws from (a citation graph's in-neighbour lists):
    ``sampling.sample_layers(g, seeds, fanouts, edge_dir="out")`` samples them as they are. Generated on
    ``device`` (default: the GPU when there is one) ``chunk_edges`` entries at a time, straight
    into host arrays (mapped for the GPU when generated there); the same arguments on the same
    kind of device give the same graph.
    """
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    if avg_degree <= 0 or alpha <= 1 or skew < 1 or max_degree < 1:
        raise ValueError(f"need avg_degree > 0, alpha > 1, skew >= 1 and max_degree >= 1, got {avg_degree}, "
                         f"{alpha}, {skew}, {max_degree}")
    dev = _generation_device(device)
    idx_dtype = _index_dtype(num_nodes, index_dtype)
    g = _chunk_generator(seed, -2, dev)
    u = torch.rand(num_nodes, generator=g, device=dev, dtype=torch.float64)
    raw = u.clamp_min(1e-12).pow(-1.0 / alpha).clamp_(max=max_degree / avg_degree * 4)
    deg = (raw * (avg_degree / float(raw.mean()))).floor_().clamp_(0, max_degree).long()
    del u, raw
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(deg, 0).cpu()
    del deg
    total = int(indptr[-1])
    perm = torch.randperm(num_nodes, generator=_chunk_generator(seed, -3, dev), device=dev)
    indices = _host_buffer(total, idx_dtype, dev)
    for chunk, start in enumerate(range(0, total, chunk_edges)):
        count = min(chunk_edges, total - start)
        x = torch.rand(count, generator=_chunk_generator(seed, chunk, dev), device=dev, dtype=torch.float64)
        rank = (x.pow_(skew) * num_nodes).long().clamp_(max=num_nodes - 1)
        indices[start:start + count].copy_(perm[rank].to(idx_dtype))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return CSRGraph(indptr, indices, None, symmetric=False, validate=False)


def grid_graph(
    rows: int,
    cols: int,
    *,
    weights: Optional[str] = None,
    index_dtype: Optional[torch.dtype] = None,
) -> CSRGraph:
    """The undirected ``rows x cols`` 4-neighbour lattice (vertex ``r * cols + c``): a
    road-network-like graph of degree <= 4 and diameter ``rows + cols - 2``. Neighbour lists
    are sorted. Deterministic; ``weights`` as in the module docstring."""
    if rows < 1 or cols < 1:
        raise ValueError(f"rows and cols must be >= 1, got {rows} x {cols}")
    _check_weights_kind(weights)
    n = rows * cols
    idx_dtype = _index_dtype(n, index_dtype)
    v = torch.arange(n, dtype=torch.int64)
    r = v // cols
    c = v - r * cols
    cand = torch.stack([v - cols, v - 1, v + 1, v + cols], dim=1)
    valid = torch.stack([r > 0, c > 0, c < cols - 1, r < rows - 1], dim=1)
    deg = valid.sum(1)
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=indptr[1:])
    dst = cand[valid]
    w = None
    if weights is not None:
        src = v.repeat_interleave(deg)
        w = _pair_weights(src, dst, weights)
    return CSRGraph(indptr, dst.to(idx_dtype), w, symmetric=True, validate=False)


def road_graph(
    rows: int,
    cols: int,
    *,
    drop: float = 0.3,
    diagonals: float = 0.1,
    seed: int = 0,
    weights: Optional[str] = None,
    device: DeviceLike = None,
    index_dtype: Optional[torch.dtype] = None,
) -> CSRGraph:
    """A road-network-like undirected graph: low degree, high diameter, no shortcuts.

    Start from the ``rows x cols`` 4-neighbour lattice (vertex ``r * cols + c``), remove each
    lattice edge with probability ``drop``, and add to each unit square one of its two
    diagonals (either, at random) with probability ``diagonals``. Every edge joins vertices at
    most one step apart in each coordinate, so a path between two vertices has at least their
    Chebyshev distance in hops: the diameter is at least ``max(rows, cols) - 1`` (longer where
    removals force detours). Mean degree about ``4 * (1 - drop) + 2 * diagonals`` (3.0 by
    default; road networks have 2.4-3), at most 8. With ``drop`` below the bond-percolation
    threshold (0.5) most vertices are in one component; the rest are small islands.

    Symmetric, without self loops or parallel edges, rows sorted; ``weights`` as in the module
    docstring. Generated on ``device`` (default: the GPU when there is one); the result is a
    CPU graph. The same arguments on the same kind of device give the same graph.
    """
    if rows < 1 or cols < 1:
        raise ValueError(f"rows and cols must be >= 1, got {rows} x {cols}")
    if not (0.0 <= drop <= 1.0 and 0.0 <= diagonals <= 1.0):
        raise ValueError(f"drop and diagonals must be probabilities, got {drop} and {diagonals}")
    _check_weights_kind(weights)
    dev = _generation_device(device)
    n = rows * cols
    g = _chunk_generator(seed, -4, dev)
    v = torch.arange(n, dtype=torch.int64, device=dev).reshape(rows, cols)
    right = (v[:, :-1].reshape(-1), v[:, 1:].reshape(-1))
    down = (v[:-1, :].reshape(-1), v[1:, :].reshape(-1))
    corner = v[:-1, :-1].reshape(-1)  # top-left vertex of each unit square
    flip = torch.rand(corner.numel(), generator=g, device=dev) < 0.5
    diag = (torch.where(flip, corner + 1, corner), torch.where(flip, corner + cols, corner + cols + 1))
    src, dst = [], []
    for (a, b), p in ((right, 1.0 - drop), (down, 1.0 - drop), (diag, diagonals)):
        keep = torch.rand(a.numel(), generator=g, device=dev) < p
        src += [a[keep], b[keep]]
        dst += [b[keep], a[keep]]
    src, dst = torch.cat(src), torch.cat(dst)
    w = None if weights is None else _pair_weights(src, dst, weights)
    indptr, indices, w = coo_to_csr(src, dst, n, w, index_dtype=_index_dtype(n, index_dtype))
    return CSRGraph(indptr.cpu(), indices.cpu(), None if w is None else w.cpu(), symmetric=True, validate=False)
