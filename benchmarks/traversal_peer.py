"""Traversal on four graph families, every variant beside ``auto``, and EMOGI's code measured beside it.

Graphs (``--graphs``, sizes from the command line):

* ``urand``  EMOGI's graph: ``uniform_random_graph(26, 8, seed=1, symmetrize=True)``, 67.1 M
             vertices, 1.074 B int32 CSR entries (``--urand-scale``).
* ``kron``   Graph500 / R-MAT: ``kronecker_graph(24, 16, seed=1, symmetrize=True,
             drop_duplicates=True)``: both directions stored, self loops and parallel edges
             removed, vertex ids permuted (``--kron-scale``, >= 24 for the bars).
* ``grid``   the 4-neighbour lattice ``grid_graph(2048, 2048)`` (diameter 4094), int weights.
* ``road``   a road-network-like graph: ``road_graph(4096, 4096, seed=1)``, the lattice with 30 %
             of its edges removed and a diagonal in 10 % of its squares: mean degree ~3, no
             shortcuts, diameter > 4095 hops; int weights (``--road-side``).

Sources (bfs, sssp): ``--sources k`` per graph (default 4 on urand and kron, 2 on the others):
vertex ``i * (V // k)`` (EMOGI's rule), moved to the next vertex with out-edges where it has none
(a Kronecker graph has many isolated vertices); times are means over the sources.

For each graph, op (bfs, sssp, cc, pagerank), placement (``unified``: the edge list in host
memory mapped for the GPU; ``cuda``: in GPU memory) and variant (``auto`` and every variant the op
takes, :data:`~pytorch_zerocopy.graph.OP_VARIANTS`), the script times the op (wall clock around
the call, synchronised) and checks its result against a reference: on the large graphs torch ops
on the GPU copy (level-synchronous BFS, min-label propagation, float64 PageRank by sparse
matrix-vector products to 1e-10), on the others the package's CPU implementations. The ``auto``
variant also runs with the edge list in CUDA managed memory, cold before every run (``managed``),
where the copy fits in free GPU memory. A configuration stops taking sources or repetitions after
``--config-seconds``; ``--budget`` skips what is left. A configuration whose first run is under
``--warmup-ms`` (100) is warmed up, untimed, for that long (whatever the number of runs that
takes, up to WARMUP_MAX_RUNS), and takes ``--quick-reps`` (20) repetitions of cc or pagerank: a
short op's one-time costs, a GPU ramping up from idle and its spread are a large share of its
time (``auto`` runs first of its row group, so without the warm-up it alone would pay them).
Repetitions compare by their medians (the time a row reports), sources by their sums over the
sources both configurations ran. The references an op's results are
checked against are computed before its first configuration, not between timed runs.

Hopeless variants (``--hopeless``, default 10). A variant whose run took over that many times the
fastest variant measured so far for the same graph, op and placement is not run again there; and
the edge list in GPU memory is measured first, so a variant whose mean there is over that many
times the fastest's is not run from host memory at all (its row says so): reading lists over the
link makes a slow variant slower still, so it cannot come within 1.10 of the fastest there (the
``auto`` bar), and it would spend the run's budget (the async SSSP on the road graph took 104 s
from host memory).

Reported per row: time; ``x pass`` (time over one pass over the edge list at the pinned-memcpy
ceiling measured in the same run); ``read`` (the op's own count of neighbour-list entries it
read, ``stats[0]``, times the bytes per entry: 4 per id, plus 4 per weight for sssp on a weighted
graph; row offsets, per-vertex arrays and the over-fetch of aligned reads are not counted);
``link share`` = read bytes / time / ceiling; for pagerank its L1 distance to the float64
reference and ``ms/pass`` = time / ``stats[1]`` (power iterations, push rounds, or the async
variant's work in passes over the edge list), so that different stopping rules compare.

Bars (``"bars"`` in the JSON):

* ``auto_over_best_max``: over graph x op x placement (unified, cuda), the largest
  time(auto) / time(v) over the variants v that matched the reference, each ratio taken over the
  sources (or repetitions) both ran; target <= 1.10. ``auto_over_best_worst_case`` names it.
* ``topdown_bfs_link_share``, ``power_pagerank_link_share``: the Kronecker graph, unified; the
  best link share of the top-down BFS variants (naive, merged, aligned, frontier) and of the
  power-iteration PageRank variants (naive, merged, aligned, frontier); the variant beside it.
* ``bfs_unified_ms``, ``cc_default_unified_ms``, ``pagerank_unified_ms``, ``pagerank_l1_vs_fp64``:
  ``auto`` on EMOGI's graph, unified; ``async_over_frontier_high_diameter``: the larger of BFS's
  and SSSP's frontier / async time on the grid, unified; ``every_variant_matches_reference``.
* With ``--emogi``: ``<op>_unified_over_emogi`` = ``auto``'s time over EMOGI's best kernel with
  its zero-copy edge list, on EMOGI's graph (pagerank: per pass), and ``emogi_measured``.
* ``guard_overhead``, ``guard_overhead_within_3pct``: copied from ``guard_overhead.json`` in the
  same folder when it was measured on the same GPU (``benchmarks/guard_overhead.py``, which
  times two builds of this tree and then writes them in here).

EMOGI (``--emogi DIR``, a local checkout of its public code, never fetched by this script): the
script builds it (``make`` with the GPU's arch), writes each graph as ``.bel`` files
(:func:`~pytorch_zerocopy.graph.save_bel`, into ``--bel-dir`` or a temporary folder removed after
the graph), and runs every EMOGI kernel with the edge list in GPU memory and in zero-copy host
memory (``--emogi-placements``: one of them only) on the same sources, parsing the times it
prints (see ``benchmarks/emogi.py``). Each EMOGI run loads its ``.bel`` file from disk again
(seconds per run on the Kronecker graph): the bars read the zero-copy runs only. Without a
checkout, the figures of an earlier run of EMOGI's code on EMOGI's graph stay in the report,
labelled as quoted, with their source.

Modes. Full (default; one H100 or H200): ``--budget`` (default 540 s) per command; with the
hopeless variants left out, the grid, road and Kronecker graphs fit in one command, EMOGI's graph
in another with ``--merge`` (each adds its graphs to the one result set, keeping the others
measured on the same device), e.g. with EMOGI's code checked out at ``build/EMOGI``::

    python benchmarks/traversal_peer.py --graphs grid,road,kron --emogi build/EMOGI
    python benchmarks/traversal_peer.py --graphs urand --emogi build/EMOGI --merge

``--first-look``: new kernels' correctness against the CPU implementations, then every variant on
``uniform_random_graph(24, 8)`` and a 1024 x 1024 grid. ``--quick``: seconds on the CPU (tiny
graphs, every op and variant, CPU fallback), to check the script itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # python benchmarks/traversal_peer.py from a checkout
    sys.path.insert(0, ROOT)

import pytorch_zerocopy  # noqa: E402
from benchmarks import emogi  # noqa: E402
from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from benchmarks.traversal import Clock, log, sync  # noqa: E402
from pytorch_zerocopy.graph import (OP_VARIANTS, CSRGraph, auto_variant, bfs, connected_components,  # noqa: E402
                                    grid_graph, kronecker_graph, pagerank, road_graph, save_bel, sssp,
                                    uniform_random_graph)

OPS = ("bfs", "sssp", "connected_components", "pagerank")
SHORT = {"bfs": "bfs", "sssp": "sssp", "connected_components": "cc", "pagerank": "pagerank"}
PLACEMENTS = ("unified", "cuda")  # where every variant runs; "managed" runs auto only
TOPDOWN_BFS = ("naive", "merged", "aligned", "frontier")
POWER_PAGERANK = ("naive", "merged", "aligned", "frontier")


class Family(enum.Enum):
    URAND = "urand"
    KRON = "kron"
    GRID = "grid"
    ROAD = "road"


class Reference(enum.Enum):
    TORCH = "torch"  # torch ops on the GPU copy of the graph
    CPU = "cpu"  # the package's CPU implementations


@dataclasses.dataclass(frozen=True)
class QuotedFigure:
    """A time of EMOGI's code taken from an earlier run, not measured by this one."""

    op: str
    placement: str
    kernel: str
    ms: float
    iterations: Optional[int] = None


# EMOGI's code on uniform_random_graph(26, 8, seed=1, symmetrize=True), means over sources i * V / 4.
QUOTE_SOURCE = ("quoted, not measured in this run: /work/shared/MEASUREMENTS.md, table 'Traversal beside "
                "EMOGI's published code (same H100, same graph)' (EMOGI's public code on an H100)")
QUOTED_EMOGI = (
    QuotedFigure("bfs", "unified", "coalesce", 200.0), QuotedFigure("bfs", "unified", "coalesce_chunk", 157.0),
    QuotedFigure("bfs", "cuda", "best", 65.0), QuotedFigure("connected_components", "unified", "best", 266.0),
    QuotedFigure("connected_components", "cuda", "best", 125.0),
    QuotedFigure("pagerank", "unified", "best", 4660.0, iterations=69),
)


def gpu() -> bool:
    return torch.cuda.is_available() and pytorch_zerocopy.gpu_backed()


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    name: str
    family: Family
    scale: int = 0  # urand, kron: 2**scale vertices
    edge_factor: int = 8
    side: int = 0  # grid, road: side x side vertices
    weights: Optional[str] = None
    sources: int = 4
    reference: Reference = Reference.TORCH
    managed: bool = True

    @property
    def quoted_emogi(self) -> Tuple[QuotedFigure, ...]:
        """The quoted figures that describe this graph (EMOGI's own graph only)."""
        same = self.family is Family.URAND and (self.scale, self.edge_factor) == (26, 8)
        return QUOTED_EMOGI if same else ()


def build(spec: GraphSpec, device: str) -> CSRGraph:
    if spec.family is Family.URAND:
        return uniform_random_graph(spec.scale, spec.edge_factor, seed=1, symmetrize=True, weights=spec.weights,
                                    device=device)
    if spec.family is Family.KRON:
        return kronecker_graph(spec.scale, spec.edge_factor, seed=1, symmetrize=True, drop_duplicates=True,
                               weights=spec.weights, device=device)
    if spec.family is Family.ROAD:
        return road_graph(spec.side, spec.side, seed=1, weights=spec.weights, device=device)
    return grid_graph(spec.side, spec.side, weights=spec.weights)


def sources_for(graph: CSRGraph, count: int) -> List[int]:
    """EMOGI's sources ``i * (V // count)``, each moved to the first vertex at or after it with
    out-edges (wrapping around; unchanged in a graph without edges)."""
    deg = graph.out_degree().cpu()
    has = torch.nonzero(deg > 0).flatten()
    out = []
    for s in emogi.emogi_rule_sources(graph.num_nodes, count):
        if has.numel() == 0 or deg[s] > 0:
            out.append(s)
            continue
        i = int(torch.searchsorted(has, torch.tensor([s]))[0])
        out.append(int(has[i % has.numel()]))
    return out


# --- references (independent of the package's kernels) ------------------------------------------


def _edge_rows(indptr: torch.Tensor) -> torch.Tensor:
    n = indptr.numel() - 1
    deg = indptr[1:] - indptr[:-1]
    dtype = torch.int32 if n < 2**31 else torch.int64
    return torch.repeat_interleave(torch.arange(n, dtype=dtype, device=indptr.device), deg)


def torch_bfs(indptr: torch.Tensor, indices: torch.Tensor, source: int, chunk: int = 1 << 26) -> torch.Tensor:
    """Level-synchronous BFS with torch ops: int32 depths, -1 where unreachable."""
    dev = indptr.device
    n = indptr.numel() - 1
    depth = torch.full((n,), -1, dtype=torch.int32, device=dev)
    depth[source] = 0
    frontier = torch.tensor([source], dtype=torch.int64, device=dev)
    level = 0
    while frontier.numel():
        starts = indptr[frontier]
        deg = indptr[frontier + 1] - starts
        ends = torch.cumsum(deg, 0)
        total = int(ends[-1])
        done = 0
        while done < total:
            # frontier vertices whose lists end in (done, done + chunk]
            lo = int(torch.searchsorted(ends, torch.tensor([done], device=dev), right=True)[0])
            hi = int(torch.searchsorted(ends, torch.tensor([done + chunk], device=dev), right=True)[0])
            hi = max(hi, lo + 1)
            d = deg[lo:hi]
            first = ends[lo:hi] - d
            pos = torch.repeat_interleave(starts[lo:hi] - first, d) + torch.arange(
                int(first[0]), int(ends[hi - 1]), device=dev)
            nbrs = indices[pos].long()
            depth[nbrs[depth[nbrs] == -1]] = level + 1
            done = int(ends[hi - 1])
        level += 1
        frontier = torch.nonzero(depth == level).flatten()
    return depth


def torch_components(indptr: torch.Tensor, indices: torch.Tensor, chunk: int = 1 << 27) -> torch.Tensor:
    """Weakly connected components by min-label propagation with pointer jumping: every
    vertex labelled with the smallest id of its component."""
    n = indptr.numel() - 1
    rows = _edge_rows(indptr)
    labels = torch.arange(n, device=indptr.device)
    m = indices.numel()
    while True:
        new = labels.clone()
        for a in range(0, m, chunk):
            s = rows[a:a + chunk].long()
            d = indices[a:a + chunk].long()
            new.scatter_reduce_(0, d, labels[s], "amin")
            new.scatter_reduce_(0, s, labels[d], "amin")
        while True:
            jumped = new[new]
            if torch.equal(jumped, new):
                break
            new = jumped
        if torch.equal(new, labels):
            return labels.to(indices.dtype)
        labels = new


def torch_pagerank_fp64(indptr: torch.Tensor, indices: torch.Tensor, alpha: float, symmetric: bool,
                        tol: float = 1e-10, max_iter: int = 1000) -> torch.Tensor:
    """float64 PageRank by power iteration from 1/N (the package's definition: dangling mass
    spread uniformly), stopped once its L1 distance to the solution is below tol."""
    dev = indptr.device
    n = indptr.numel() - 1
    m = indices.numel()
    deg = (indptr[1:] - indptr[:-1]).double()
    dangling = deg == 0
    if symmetric:  # A^T = A: one sparse matrix-vector product per iteration
        idx_dtype = torch.int32 if m < 2**31 else torch.int64
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
            a = torch.sparse_csr_tensor(indptr.to(idx_dtype), indices.to(idx_dtype),
                                        torch.ones(m, dtype=torch.float64, device=dev), (n, n),
                                        check_invariants=False)
        walk = lambda c: torch.mv(a, c)  # noqa: E731
    else:
        rows = _edge_rows(indptr)

        def walk(c):
            y = torch.zeros(n, dtype=torch.float64, device=dev)
            for s in range(0, m, 1 << 26):
                y.index_add_(0, indices[s:s + (1 << 26)].long(), c[rows[s:s + (1 << 26)].long()])
            return y

    x = torch.full((n,), 1.0 / n, dtype=torch.float64, device=dev)
    threshold = tol * (1 - alpha) / alpha if alpha > 0 else float("inf")
    for _ in range(max_iter):
        c = torch.where(dangling, torch.zeros_like(x), x / deg.clamp(min=1))
        new = (1 - alpha) / n + alpha * (walk(c) + x[dangling].sum() / n)
        change = float((new - x).abs().sum())
        x = new
        if change <= threshold:
            break
    return x


class References:
    """Reference results of one graph, computed once. bfs / sssp: torch ops on the GPU copy
    (Reference.TORCH) or the package's CPU implementations; cc / pagerank: torch ops on
    the GPU copy when there is one, else the CPU implementation (cc) or torch ops on the host
    arrays (pagerank)."""

    def __init__(self, spec: GraphSpec, host: CSRGraph, dev: Optional[CSRGraph], alpha: float):
        self.spec, self.host, self.dev, self.alpha = spec, host, dev, alpha
        self._bfs: Dict[int, torch.Tensor] = {}
        self._sssp: Dict[int, torch.Tensor] = {}
        self._cc: Optional[torch.Tensor] = None
        self._pr: Optional[torch.Tensor] = None

    def prepare(self, op: str, sources: Sequence[Optional[int]]) -> None:
        """Computes the references ``check`` will read for ``op`` and ``sources`` now, before
        any of the op's configurations is timed, so that the GPU does not idle through a
        reference's computation in the middle of one."""
        for s in sources:
            if op == "bfs":
                self.bfs(s)
            elif op == "sssp":
                self.sssp(s)
        if op == "connected_components":
            self.cc()
        elif op == "pagerank":
            self.pagerank()

    def bfs(self, s: int) -> torch.Tensor:
        if s not in self._bfs:
            self._bfs[s] = (torch_bfs(self.dev.indptr, self.dev.indices, s).cpu()
                            if self.spec.reference is Reference.TORCH and self.dev is not None else bfs(self.host, s))
        return self._bfs[s]

    def sssp(self, s: int) -> torch.Tensor:
        if s not in self._sssp:
            if self.host.weights is None:  # unit weights: the BFS depths
                d = self.bfs(s).long()
                self._sssp[s] = torch.where(d < 0, torch.iinfo(torch.int64).max, d)
            else:
                self._sssp[s] = sssp(self.host, s)
        return self._sssp[s]

    def cc(self) -> torch.Tensor:
        if self._cc is None:
            self._cc = (torch_components(self.dev.indptr, self.dev.indices).cpu() if self.dev is not None
                        else connected_components(self.host, weak=True))
        return self._cc

    def pagerank(self) -> torch.Tensor:
        if self._pr is None:
            g = self.dev if self.dev is not None else self.host
            self._pr = torch_pagerank_fp64(g.indptr, g.indices, self.alpha, self.host.symmetric).cpu()
        return self._pr




# --- running ---------------------------------------------------------------------------------------


def run_once(op: str, graph: CSRGraph, variant: str, source: Optional[int], args):
    """(result, stats) of one call."""
    if op == "bfs":
        return bfs(graph, source, variant=variant, return_stats=True)
    if op == "sssp":
        return sssp(graph, source, variant=variant, return_stats=True)
    if op == "connected_components":
        return connected_components(graph, variant=variant, return_stats=True)
    return pagerank(graph, alpha=args.alpha, tol=args.pagerank_tol, max_iter=args.pagerank_max_iter,
                    variant=variant, return_stats=True)


def check(op: str, result: torch.Tensor, refs: References, source: Optional[int], args) -> dict:
    r = result.cpu()
    if op == "bfs":
        return {"match": bool(torch.equal(r, refs.bfs(source)))}
    if op == "sssp":
        want = refs.sssp(source)
        if r.dtype == torch.float32:
            ok = bool(torch.allclose(r.double(), want.double(), rtol=1e-5, atol=0))
        else:
            ok = bool(torch.equal(r, want))
        return {"match": ok}
    if op == "connected_components":
        return {"match": bool(torch.equal(r, refs.cc()))}
    l1 = float((r.double() - refs.pagerank()).abs().sum())
    # float32 results: allow rounding on top of the stated bound.
    return {"match": l1 <= args.pagerank_tol + 1e-6, "l1_vs_fp64": l1}


def bytes_per_edge(op: str, graph: CSRGraph) -> int:
    b = graph.indices.element_size()
    if op == "sssp" and graph.weights is not None:
        b += graph.weights.element_size()
    return b


WARMUP_MAX_RUNS = 1000  # untimed warm-up runs at most, however quick the op


def measure(op: str, graph: CSRGraph, variant: str, sources: List[Optional[int]], refs: References, args,
            clock: Clock, before_each: Optional[Callable[[], None]] = None,
            hopeless_ms: Optional[float] = None) -> List[dict]:
    """One run per source (bfs, sssp) or repetition (``None``: cc, pagerank), until the
    configuration's time is spent, or after a run slower than ``hopeless_ms``. Each run: its key
    (the source, or the repetition's index), milliseconds, the op's stats, bytes read and whether
    the result matched the reference. A configuration whose first run takes under
    ``args.warmup_ms`` is warmed up first: its first run and further untimed runs of the first
    source until ``args.warmup_ms`` have passed (at most WARMUP_MAX_RUNS runs), so that
    one-time costs, such as the first allocation of its scratch, and a GPU still at idle clocks
    after the host's reference computation are not in its times; for repetitions it then runs
    ``args.quick_reps`` of them (a short op's spread is a larger share of its time)."""
    runs = []
    spent = 0.0
    todo = list(sources)
    warmed = before_each is not None  # cold runs are the point there
    warm_ms, warm_runs = 0.0, 0
    i = 0
    while i < len(todo):
        s = todo[i]
        if clock.left() <= 0 or (runs and spent >= args.config_seconds):
            break
        if runs and hopeless_ms is not None and runs[-1]["ms"] > hopeless_ms:
            break
        if before_each is not None:
            before_each()
        sync()
        t0 = time.perf_counter()
        result, stats = run_once(op, graph, variant, s, args)
        sync()
        dt = time.perf_counter() - t0
        spent += dt
        if not warmed:
            warm_ms, warm_runs = warm_ms + dt * 1e3, warm_runs + 1
            if warm_runs == 1 and warm_ms >= args.warmup_ms:
                warmed = True  # a slow configuration: its first run counts
            else:
                if warm_runs == 1 and s is None:
                    todo = [None] * max(len(todo), args.quick_reps)
                warmed = warm_ms >= args.warmup_ms or warm_runs >= WARMUP_MAX_RUNS
                continue
        stats = stats.cpu()
        run = {"source": s, "key": s if s is not None else i, "ms": dt * 1e3, "edges_read": int(stats[0]),
               "iterations": int(stats[1]), "bytes_read": int(stats[0]) * bytes_per_edge(op, graph)}
        run.update(check(op, result, refs, s, args))
        runs.append(run)
        i += 1
    return runs


def link_share(runs: Sequence[dict], ceiling_gbs: Optional[float]) -> Optional[float]:
    """Bytes the runs read over the time they took, as a fraction of the copy ceiling."""
    seconds = sum(r["ms"] for r in runs) / 1e3
    if not ceiling_gbs or not runs or seconds <= 0:
        return None
    return sum(r["bytes_read"] for r in runs) / seconds / (ceiling_gbs * 1e9)


def summarize(row: dict, op: str, graph: CSRGraph, ceiling: Optional[float]) -> dict:
    runs = row["runs"]
    if not runs:
        return row
    ms = np.array([r["ms"] for r in runs])
    row["mean_ms"] = float(ms.mean()) if op in ("bfs", "sssp") else float(np.median(ms))
    row["bytes_read"] = float(np.mean([r["bytes_read"] for r in runs]))
    one_pass_ms = None if not ceiling else graph.num_edges * bytes_per_edge(op, graph) / (ceiling * 1e9) * 1e3
    row["x_one_pass"] = None if one_pass_ms is None else row["mean_ms"] / one_pass_ms
    row["link_share"] = link_share(runs, ceiling)
    row["matched"] = all(r["match"] for r in runs)
    if op == "pagerank":
        row["l1_vs_fp64"] = max(r["l1_vs_fp64"] for r in runs)
        row["iterations"] = runs[0]["iterations"]
        passes = sum(r["iterations"] for r in runs)
        row["ms_per_pass"] = float(ms.sum()) / passes if passes else None
    return row


def fastest_ms(rows: List[dict]) -> Optional[float]:
    """The smallest mean time among ``rows`` that ran and matched the reference; None if none did."""
    return min((r["mean_ms"] for r in rows if r["runs"] and r["matched"]), default=None)


def hopeless_variants(rows: List[dict], factor: float) -> Dict[str, float]:
    """The variants among ``rows`` (one op and placement) whose mean time is over ``factor`` times
    the fastest matching variant's, with that ratio."""
    ran = [r for r in rows if r["runs"] and r["variant"] != "auto"]
    best = fastest_ms(ran)
    if not best:
        return {}
    return {r["variant"]: r["mean_ms"] / best for r in ran if r["mean_ms"] > factor * best}


def variants_for(op: str) -> List[str]:
    """auto first, then every variant of the op, the slowest last: naive, and async, which on a
    graph of small diameter reads its lists in worklist (random) order."""
    rest = [v for v in OP_VARIANTS[op] if v not in ("naive", "async")]
    return ["auto"] + rest + [v for v in ("naive", "async") if v in OP_VARIANTS[op]]


def bench_graph(spec: GraphSpec, args, clock: Clock, ceiling: Optional[float], bel: Optional[str]) -> dict:
    """Every op, placement and variant on the graph of ``spec``; writes the graph as ``.bel``
    files at ``bel`` when given."""
    gen_device = "cuda" if gpu() else "cpu"
    t0 = time.perf_counter()
    host = build(spec, gen_device)
    sources = sources_for(host, spec.sources)
    info = {"name": spec.name, "family": spec.family.value, "num_nodes": host.num_nodes, "num_edges": host.num_edges,
            "edge_list_bytes": host.edge_list_bytes, "build_seconds": time.perf_counter() - t0,
            "ceiling_gbs": ceiling, "sources": sources}
    log(f"{spec.name}: {host.num_nodes} vertices, {host.num_edges} CSR entries, "
        f"{host.edge_list_bytes / 1e9:.2f} GB edge list, built in {info['build_seconds']:.1f} s; sources {sources}")
    ug = host.to("unified")  # maps the host arrays in place (pins them)
    dev = None
    if gpu():
        free, _ = torch.cuda.mem_get_info()
        if host.edge_list_bytes * 1.3 + host.num_nodes * 48 < free:
            dev = host.to("cuda")
    refs = References(spec, host, dev, args.alpha)
    rows: List[dict] = []

    def record(op, placement, variant, runs, resolved, skipped="time budget"):
        row = {"graph": spec.name, "op": SHORT[op], "placement": placement, "variant": variant,
               "runs_on": resolved, "runs": runs}
        if not runs:
            row["skipped"] = skipped
        summarize(row, op, host, ceiling)
        rows.append(row)
        if runs:
            extra = f", L1 {row['l1_vs_fp64']:.2e}, {row['ms_per_pass']:.2f} ms/pass" if op == "pagerank" else ""
            xp = row.get("x_one_pass")
            log(f"{spec.name:>12} {SHORT[op]:>8} {placement:>8} {variant:>9}"
                f"{'(' + resolved + ')' if variant == 'auto' else '':>12}: {row['mean_ms']:9.2f} ms "
                f"{'' if xp is None else f'{xp:6.2f} x pass'}, read {row['bytes_read'] / 1e9:6.2f} GB, "
                f"{'ok' if row['matched'] else 'MISMATCH'}{extra}")
        else:
            log(f"{spec.name:>12} {SHORT[op]:>8} {placement:>8} {variant:>9}: skipped ({skipped})")

    # Hopeless variants (see the module docstring): GPU memory first, so that a variant over
    # --hopeless times the fastest there is not run from host memory, where it is slower still.
    placements = ([("cuda", dev)] if dev is not None else []) + [("unified", ug)]
    for op in OPS:
        op_sources = sources if op in ("bfs", "sssp") else [None] * args.reps
        hopeless: Dict[str, str] = {}  # variant -> why it is not run in the placements still to come
        refs.prepare(op, op_sources)
        for placement, g in placements:
            placed: List[dict] = []
            for variant in variants_for(op):
                resolved = auto_variant(op, g) if variant == "auto" else variant
                if clock.left() <= 0:
                    record(op, placement, variant, [], resolved)
                    continue
                if variant in hopeless:
                    record(op, placement, variant, [], resolved, skipped=hopeless[variant])
                    continue
                # async on EMOGI's graph: one run (it is measured, not expected to win)
                srcs = (op_sources[:1] if resolved == "async" and spec.family is Family.URAND and variant != "auto"
                        else op_sources)
                best = fastest_ms(placed)
                cap = None if best is None or variant == "auto" else args.hopeless * best
                record(op, placement, variant, measure(op, g, variant, srcs, refs, args, clock, hopeless_ms=cap),
                       resolved)
                placed.append(rows[-1])
            for variant, ratio in hopeless_variants(placed, args.hopeless).items():
                hopeless.setdefault(variant, f"hopeless: {ratio:.0f}x the fastest in {placement}")
    order = {(op, p, v): i for i, (op, p, v) in enumerate(
        (SHORT[op], p, v) for op in OPS for p in PLACEMENTS for v in variants_for(op))}
    rows.sort(key=lambda r: order[(r["op"], r["placement"], r["variant"])])  # the report's order
    # UVM: the auto variant with the edge list in managed memory, cold before every run.
    placements.clear()
    if gpu() and spec.managed and clock.left() > 0:
        dev = refs.dev = None  # the GPU copy makes room; references already computed stay cached
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        if host.edge_list_bytes * 1.2 + host.num_nodes * 48 < free:
            mg = host.to("uvm")

            def cold():
                for t in (mg.indices, mg.weights):
                    if t is not None:
                        torch.ops.zerocopy.managed_evict.default(t)

            for op in OPS:
                runs = measure(op, mg, "auto", sources[:1] if op in ("bfs", "sssp") else [None], refs, args, clock,
                               before_each=cold)
                record(op, "managed", "auto", runs, auto_variant(op, mg))
            del mg
        else:
            info["managed"] = "skipped: the managed copy would not fit in free GPU memory"
    info["components"] = int(torch.unique(refs.cc()).numel())
    if bel is not None:
        save_bel(host, bel, unit_weights=True)
    info["rows"] = rows
    return info


def bench_graph_and_peer(spec: GraphSpec, args, clock: Clock, ceiling: Optional[float]) -> dict:
    """:func:`bench_graph`, then EMOGI's code on the same graph once the package has let go of
    it (measured with ``--emogi``, else the quoted figures that describe this graph)."""
    bel_dir = None
    if args.emogi:
        bel_dir = args.bel_dir or tempfile.mkdtemp(prefix="traversal_peer_bel_")
        os.makedirs(bel_dir, exist_ok=True)
    bel = None if bel_dir is None else os.path.join(bel_dir, f"{spec.name}.bel")
    info = bench_graph(spec, args, clock, ceiling, bel)
    gc.collect()  # the graph's host and GPU copies go before EMOGI's programs load theirs
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    info["emogi"] = emogi_section(spec, bel, info["sources"], info["num_nodes"], info["components"], args, clock)
    if bel_dir is not None and not args.bel_dir:
        shutil.rmtree(bel_dir, ignore_errors=True)
    return info


def emogi_section(spec: GraphSpec, bel: Optional[str], sources: List[int], num_nodes: int, components: int,
                  args, clock: Clock) -> dict:
    """EMOGI's code on the graph's .bel files ``bel`` (measured), or, without them, the quoted
    figures that describe this graph, labelled with their source."""
    if bel is None:
        quoted = [dataclasses.asdict(q) for q in spec.quoted_emogi]
        return {"source": QUOTE_SOURCE if quoted else None, "measured": False, "quoted": quoted, "results": []}
    results = []
    for op in OPS:
        program = emogi.PROGRAM_OF[op]
        for placement in args.emogi_placements:
            for kernel in sorted(emogi.KERNELS[program], reverse=True):  # EMOGI's best first
                if clock.left() <= 0:
                    r = emogi.EmogiResult(op, kernel, emogi.MEMORY_OF[placement], error="skipped (time budget)")
                else:
                    r = emogi.run(args.emogi, op, bel, kernel, emogi.MEMORY_OF[placement],
                                  sources if op in ("bfs", "sssp") else [None], num_nodes, args.alpha)
                entry = r.to_json()
                entry.update(placement=placement, op=SHORT[op],
                             same_sources=r.sources == sources if op in ("bfs", "sssp") else None,
                             components_match=None if r.components is None else r.components == components)
                results.append(entry)
                log(f"{spec.name:>12} EMOGI {program.value:>11} -t {kernel} -m {int(r.memory)} ({placement}): "
                    + (f"{r.mean_ms:9.2f} ms, {sum(r.iterations)} iterations" if r.mean_ms is not None else "")
                    + (f" ERROR {r.error}" if r.error else ""))
    return {"source": f"measured in this run: EMOGI's code built from {os.path.abspath(args.emogi)}",
            "measured": True, "quoted": [], "results": results}


def warm_up(args) -> None:
    """Every op and variant once on a tiny graph in every placement, so that no timed run pays
    for loading a kernel."""
    g = kronecker_graph(10, 8, seed=1, weights="int", device="cpu")
    placements = ["unified"] + (["cuda", "managed"] if gpu() else [])
    for placement in placements:
        pg = g.to(placement)
        for op in OPS:
            for variant in ["auto"] + list(OP_VARIANTS[op]):
                run_once(op, pg, variant, 0, args)
    sync()


# --- bars, reports -------------------------------------------------------------------------------


def find(rows: List[dict], graph: str, op: str, placement: str, variant: str) -> Optional[dict]:
    for r in rows:
        if (r["graph"], r["op"], r["placement"], r["variant"]) == (graph, op, placement, variant) and r["runs"]:
            return r
    return None


def common_ratio(num: Optional[dict], den: Optional[dict]) -> Optional[float]:
    """time(num) / time(den): of repetitions (cc, pagerank) their medians, the time each row
    reports (a repetition's index names no input, and one slow repetition would weigh in a
    sum); of sources, the sums over the sources both rows ran."""
    if not num or not den:
        return None
    if all(r["source"] is None for r in num["runs"] + den["runs"]):
        return float(np.median([r["ms"] for r in num["runs"]]) / np.median([r["ms"] for r in den["runs"]]))
    a = {r["key"]: r["ms"] for r in num["runs"]}
    b = {r["key"]: r["ms"] for r in den["runs"]}
    common = [k for k in a if k in b]
    if not common:
        return None
    return sum(a[k] for k in common) / sum(b[k] for k in common)


def auto_over_best(rows: List[dict]) -> List[dict]:
    """For each graph x op x placement (unified, cuda) where ``auto`` ran: the variant it loses
    most to, among those that matched the reference, and the ratio (see :func:`common_ratio`)."""
    out = []
    for auto in [r for r in rows if r["variant"] == "auto" and r["placement"] in PLACEMENTS and r["runs"]]:
        ratios = [(common_ratio(auto, r), r["variant"]) for r in rows
                  if (r["graph"], r["op"], r["placement"]) == (auto["graph"], auto["op"], auto["placement"])
                  and r["variant"] != "auto" and r["runs"] and r["matched"]]
        ratios = [(x, v) for x, v in ratios if x is not None]
        if ratios:
            ratio, best = max(ratios)
            out.append({"graph": auto["graph"], "op": auto["op"], "placement": auto["placement"],
                        "auto_runs_on": auto["runs_on"], "best": best, "ratio": ratio})
    return out


def best_link_share(rows: List[dict], graph: Optional[str], op: str, variants: Sequence[str]
                    ) -> Tuple[Optional[float], Optional[str]]:
    """The highest link share among ``variants`` of ``op`` on ``graph``, unified, and its variant."""
    cands = [(r["link_share"], r["variant"]) for r in rows
             if r["graph"] == graph and r["op"] == op and r["placement"] == "unified" and r["variant"] in variants
             and r["runs"] and r.get("link_share") is not None]
    return max(cands) if cands else (None, None)


def emogi_best(graph: dict, op: str, placement: str, per_pass: bool = False) -> Optional[float]:
    """EMOGI's fastest kernel on this graph and placement, as measured in this run (ms, or ms per
    iteration); None where it was not measured or failed."""
    times = [r["ms_per_iteration" if per_pass else "mean_ms"] for r in graph.get("emogi", {}).get("results", [])
             if r["op"] == op and r["placement"] == placement and not r["error"]]
    times = [t for t in times if t is not None]
    return min(times) if times else None


def graph_named(graphs: List[dict], family: Family) -> Optional[dict]:
    return next((g for g in graphs if g.get("family") == family.value), None)


def bars(graphs: List[dict], guard: Optional[dict] = None) -> dict:
    """The bars over ``graphs``; ``guard``: the bars of guard_overhead.json measured on the same
    device (its own benchmark: two builds of the package), copied in, or None."""
    rows = [r for g in graphs for r in g["rows"]]
    main, mesh, kron = (graph_named(graphs, f) for f in (Family.URAND, Family.GRID, Family.KRON))
    main_name = main["name"] if main else None
    out: dict = {}
    ratios = auto_over_best(rows)
    worst = max(ratios, key=lambda x: x["ratio"], default=None)
    out["auto_over_best_max"] = worst["ratio"] if worst else None
    out["auto_over_best_worst_case"] = (f"{worst['graph']} {worst['op']} {worst['placement']}: auto "
                                        f"({worst['auto_runs_on']}) vs {worst['best']}") if worst else None
    kron_name = kron["name"] if kron else None
    out["topdown_bfs_link_share"], out["topdown_bfs_link_share_variant"] = best_link_share(
        rows, kron_name, "bfs", TOPDOWN_BFS)
    out["power_pagerank_link_share"], out["power_pagerank_link_share_variant"] = best_link_share(
        rows, kron_name, "pagerank", POWER_PAGERANK)
    bfs_row, cc_row, pr_row = (find(rows, main_name, op, "unified", "auto") for op in ("bfs", "cc", "pagerank"))
    out["bfs_unified_ms"] = bfs_row["mean_ms"] if bfs_row else None
    out["cc_default_unified_ms"] = cc_row["mean_ms"] if cc_row else None
    out["pagerank_unified_ms"] = pr_row["mean_ms"] if pr_row else None
    out["pagerank_l1_vs_fp64"] = pr_row["l1_vs_fp64"] if pr_row else None
    mesh_name = mesh["name"] if mesh else None
    async_ratios = [common_ratio(find(rows, mesh_name, op, "unified", "frontier"),
                                 find(rows, mesh_name, op, "unified", "async")) for op in ("bfs", "sssp")]
    async_ratios = [r for r in async_ratios if r is not None]
    out["async_over_frontier_high_diameter"] = max(async_ratios) if async_ratios else None
    ran = [r for r in rows if r["runs"]]
    out["every_variant_matches_reference"] = bool(ran) and all(r["matched"] for r in ran)
    if guard is not None:
        out["guard_overhead"] = guard["guard_overhead"]
        out["guard_overhead_within_3pct"] = guard["guard_overhead_within_3pct"]
    out["emogi_measured"] = bool(main and main.get("emogi", {}).get("measured"))
    for op in ("bfs", "sssp", "cc", "pagerank"):
        ours = find(rows, main_name, op, "unified", "auto")
        peer = emogi_best(main, op, "unified", per_pass=op == "pagerank") if main else None
        mine = None if ours is None else ours.get("ms_per_pass") if op == "pagerank" else ours["mean_ms"]
        out[f"{op}_unified_over_emogi"] = mine / peer if mine and peer else None
    return out


TARGETS = {"auto_over_best_max": ("<=", 1.10), "topdown_bfs_link_share": (">=", 0.75),
           "power_pagerank_link_share": (">=", 0.8), "bfs_unified_ms": ("<=", 110.0), "cc_default_unified_ms": ("<=", 100.0),
           "pagerank_unified_ms": ("<=", 1500.0), "pagerank_l1_vs_fp64": ("<=", 1e-4),
           "async_over_frontier_high_diameter": (">=", 2.0), "every_variant_matches_reference": ("==", True),
           "guard_overhead": ("<=", 0.03)}


def _fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def bar_lines(result: dict) -> List[str]:
    lines = ["| bar | value | target | pass |", "|---|---:|---|---|"]
    for k, v in result["bars"].items():
        t = TARGETS.get(k)
        ok = "" if t is None or v is None else ("yes" if (v <= t[1] if t[0] == "<=" else v >= t[1] if t[0] == ">="
                                                           else v == t[1]) else "no")
        val = "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))
        lines.append(f"| {k} | {val} | {'' if t is None else f'{t[0]} {t[1]}'} | {ok} |")
    return lines


def row_lines(g: dict) -> List[str]:
    lines = ["| op | placement | variant | runs | ms | x pass | read GB | link share | iterations | ms/pass "
             "| L1 vs fp64 | matches |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in g["rows"]:
        if not r["runs"]:
            why = r.get("skipped", "time budget")
            lines.append(f"| {r['op']} | {r['placement']} | {r['variant']} | 0 | skipped ({why}) | | | | | | | |")
            continue
        var = r["variant"] + (f" ({r['runs_on']})" if r["variant"] == "auto" else "")
        lines.append(f"| {r['op']} | {r['placement']} | {var} | {len(r['runs'])} | {r['mean_ms']:.1f} | "
                     f"{_fmt(r.get('x_one_pass'), '.2f')} | {r['bytes_read'] / 1e9:.2f} | "
                     f"{_fmt(r.get('link_share'), '.2f')} | {max(x['iterations'] for x in r['runs'])} | "
                     f"{_fmt(r.get('ms_per_pass'), '.2f')} | {_fmt(r.get('l1_vs_fp64'), '.1e')} | "
                     f"{'yes' if r['matched'] else 'NO'} |")
    return lines


def emogi_lines(g: dict) -> List[str]:
    section = g.get("emogi") or {}
    if not section.get("source"):
        return []
    lines = ["", f"EMOGI's code on this graph ({section['source']}):", "",
             "| op | placement | kernel | runs | ms | iterations | ms/iteration | ours (auto) ms | ours / EMOGI | "
             "note |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    ours = {(r["op"], r["placement"]): r for r in g["rows"] if r["variant"] == "auto" and r["runs"]}
    for r in section.get("results", []):
        mine = ours.get((r["op"], r["placement"]))
        mine_ms = None if mine is None else mine.get("ms_per_pass") if r["op"] == "pagerank" else mine["mean_ms"]
        peer = r["ms_per_iteration"] if r["op"] == "pagerank" else r["mean_ms"]
        note = r["error"] or ("sources differ" if r["same_sources"] is False else "") or (
            "component count differs" if r["components_match"] is False else "")
        lines.append(f"| {r['op']} | {r['placement']} | {r['kernel_name']} | {len(r['ms'])} | {_fmt(r['mean_ms'])} | "
                     f"{sum(r['iterations']) or '-'} | {_fmt(r['ms_per_iteration'], '.2f')} | {_fmt(mine_ms)} | "
                     f"{_fmt(mine_ms / peer if mine_ms and peer else None, '.2f')} | {note[:160]} |")
    for q in section.get("quoted", []):
        op = SHORT[q["op"]]
        mine = ours.get((op, q["placement"]))
        per = q["ms"] / q["iterations"] if q["iterations"] else None
        mine_ms = None if mine is None else mine.get("ms_per_pass") if op == "pagerank" else mine["mean_ms"]
        peer = per if op == "pagerank" else q["ms"]
        lines.append(f"| {op} | {q['placement']} | {q['kernel']} | - | {q['ms']:.1f} | {q['iterations'] or '-'} | "
                     f"{_fmt(per, '.2f')} | {_fmt(mine_ms)} | "
                     f"{_fmt(mine_ms / peer if mine_ms and peer else None, '.2f')} | quoted |")
    lines += ["", "EMOGI's PageRank stops by its own rule (residual push until every residual is below 0.001 on "
              "unnormalised ranks), so it compares per iteration (ours: per pass, pagerank rows above)."]
    return lines


def write_markdown(path: str, result: dict) -> None:
    env = result["environment"]
    lines = ["# Traversal on four graph families, every variant, and EMOGI's code", "",
             f"- date: {env['date']}; device: {env['gpu'] or 'CPU only'} (driver {env['driver']}, CUDA {env['cuda']}), "
             f"torch {env['torch']}, {env['cpus']} CPUs",
             f"- mode: {result['mode']}; pagerank: alpha {result['args']['alpha']}, tol (L1 bound) "
             f"{result['args']['pagerank_tol']}; `x pass` = time / one pass over the edge list at the ceiling; "
             "`read` = neighbour-list entries the op read (its stats) x bytes per entry; `link share` = read / time / "
             "ceiling; `ms/pass` = time / iterations (power iterations, push rounds, async passes)", "",
             "## Bars", ""] + bar_lines(result)
    lines += ["", "## auto against the fastest variant", "", "| graph | op | placement | auto runs | fastest | "
              "auto / fastest |", "|---|---|---|---|---|---:|"]
    lines += [f"| {a['graph']} | {a['op']} | {a['placement']} | {a['auto_runs_on']} | {a['best']} | {a['ratio']:.2f} |"
              for a in result["auto_over_best"]]
    for g in result["graphs"]:
        ceiling = g.get("ceiling_gbs")
        lines += ["", f"## {g['name']} ({g['num_nodes']} vertices, {g['num_edges']} CSR entries, "
                      f"{g['edge_list_bytes'] / 1e9:.2f} GB edge list; built in {g['build_seconds']:.1f} s)", "",
                  f"Sources {g['sources']}; {g['components']} components; pinned cudaMemcpy H2D ceiling measured in "
                  f"the same run: {f'{ceiling:.1f} GB/s' if ceiling else 'n/a'}.", ""]
        lines += row_lines(g) + emogi_lines(g)
    if result.get("correctness"):
        bad = [c for c in result["correctness"] if not c["ok"]]
        lines += ["", "## First look: new kernels against the CPU implementations", "",
                  f"{len(result['correctness']) - len(bad)} cases passed, {len(bad)} failed.", ""]
        if bad:
            lines += ["| graph | placement | case | error |", "|---|---|---|---|"]
            lines += [f"| {c['graph']} | {c['placement']} | {c['case']} | {c['error'] or 'wrong result'} |"
                      for c in bad]
    lines += ["", "UVM rows (`managed`) are cold: every page starts in host memory.", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# --- modes -----------------------------------------------------------------------------------------


def specs_for(args) -> List[GraphSpec]:
    """The graphs of ``--graphs`` at the sizes asked; the grid first (small, and it carries the
    async bar should the budget run out)."""
    small = args.quick
    k = args.sources
    by_family = {
        Family.GRID: GraphSpec(f"grid{args.grid_side}", Family.GRID, side=args.grid_side, weights="int",
                               sources=k or 2, reference=Reference.CPU, managed=not small),
        Family.ROAD: GraphSpec(f"road{args.road_side}", Family.ROAD, side=args.road_side, weights="int",
                               sources=k or 2, reference=Reference.CPU, managed=not small),
        Family.URAND: GraphSpec(f"urand{args.urand_scale}", Family.URAND, scale=args.urand_scale, edge_factor=8,
                                sources=k or 4, reference=Reference.CPU if small else Reference.TORCH),
        Family.KRON: GraphSpec(f"kron{args.kron_scale}", Family.KRON, scale=args.kron_scale, edge_factor=16,
                               sources=k or 4, reference=Reference.CPU if small else Reference.TORCH),
    }
    return [by_family[f] for f in (Family.GRID, Family.ROAD, Family.URAND, Family.KRON) if f in args.families]


def first_look_correctness(args) -> List[dict]:
    """Every new kernel against the CPU implementations on small and medium graphs, unified and
    GPU memory: direction and async BFS, async SSSP, push and async PageRank, staged CC (several
    chunk sizes) and the zero-copy CC sweeps."""
    out = []
    graphs = {
        "urand16": uniform_random_graph(16, 8, seed=3, device="cpu"),
        "kron16": kronecker_graph(16, 16, seed=3, weights="int", device="cpu"),
        "kron14-directed": kronecker_graph(14, 8, seed=5, symmetrize=False, device="cpu"),
        "grid300": grid_graph(300, 300, weights="float"),
        "path4000": grid_graph(1, 4000, weights="int"),
    }
    for name, g in graphs.items():
        srcs = [0, g.num_nodes // 3]
        want_bfs = {s: bfs(g, s) for s in srcs}
        want_sssp = {s: sssp(g, s) for s in srcs}
        want_cc = connected_components(g, weak=True)
        want_pr = pagerank(g, alpha=args.alpha, tol=1e-9, max_iter=1000).double()
        for placement in ("unified", "cuda"):
            pg = g.to(placement)
            cases = []
            for v in ("direction", "async"):
                cases += [(f"bfs {v}", lambda v=v, s=s, pg=pg, want=want_bfs: torch.equal(
                    bfs(pg, s, variant=v).cpu(), want[s]))
                          for s in srcs]
            cases += [("sssp async", lambda s=s, pg=pg, want=want_sssp: bool(torch.allclose(
                sssp(pg, s, variant="async").cpu().double(), want[s].double(), rtol=1e-5, atol=0)))
                      for s in srcs]
            for v in ("naive", "merged", "aligned", "frontier", "staged"):
                cases.append((f"cc {v}", lambda v=v, pg=pg, want=want_cc: torch.equal(
                    connected_components(pg, variant=v, weak=True).cpu(), want)))
            for chunk in (1000, 1 << 16):
                cases.append((f"cc staged chunk {chunk}", lambda chunk=chunk, pg=pg, want=want_cc: torch.equal(
                    torch.ops.zerocopy.graph_connected_components.default(pg.indptr, pg.indices, 7, pg.symmetric,
                                                                          chunk)[0].cpu(), want)))
            for v in ("push", "async", "frontier"):
                cases.append((f"pagerank {v}", lambda v=v, pg=pg, want=want_pr: float(
                    (pagerank(pg, alpha=args.alpha, tol=1e-5, max_iter=1000, variant=v).cpu().double()
                     - want).abs().sum()) <= 1e-5 + 2e-6))
            for label, fn in cases:
                t0 = time.perf_counter()
                try:
                    ok = bool(fn())
                    err = None
                except Exception as e:  # a failing kernel is reported, the others still run
                    ok, err = False, f"{type(e).__name__}: {e}"
                sync()
                out.append({"graph": name, "placement": placement, "case": label, "ok": ok, "error": err,
                            "ms": (time.perf_counter() - t0) * 1e3})
                if not ok:
                    log(f"FIRST LOOK FAIL {name} {placement} {label} {err or ''}")
        log(f"first look: {name} checked")
    return out



# Sizes by mode: (urand scale, kron scale, grid side, road side, families).
DEFAULT_SIZES = {"full": (26, 24, 2048, 4096, "grid,road,urand,kron"),
                 "first-look": (24, 20, 1024, 1024, "urand,grid"),
                 "quick": (12, 10, 48, 64, "grid,road,urand,kron")}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="tiny graphs on the CPU, seconds")
    mode.add_argument("--first-look", action="store_true", help="new kernels' correctness + scale-24 timings")
    p.add_argument("--graphs", default=None, help="comma-separated families among urand, kron, grid, road "
                                                  "(default: all four; first look: urand,grid)")
    p.add_argument("--urand-scale", type=int, default=None, help="EMOGI's graph: 2^scale vertices (default 26)")
    p.add_argument("--kron-scale", type=int, default=None, help="Kronecker graph: 2^scale vertices (default 24)")
    p.add_argument("--grid-side", type=int, default=None, help="grid: side x side vertices (default 2048)")
    p.add_argument("--road-side", type=int, default=None, help="road-like graph: side x side vertices (default 4096)")
    p.add_argument("--sources", type=int, default=None, help="bfs / sssp sources per graph (default 4 on urand and "
                                                              "kron, 2 on grid and road)")
    p.add_argument("--emogi", default=None, metavar="DIR",
                   help="a local checkout of EMOGI's code: build it and run it beside the package (never fetched)")
    p.add_argument("--emogi-placements", default=",".join(PLACEMENTS),
                   help="where EMOGI's edge list goes, comma-separated among unified (its zero-copy mode, what "
                        "the *_over_emogi bars read) and cuda (default: both)")
    p.add_argument("--bel-dir", default=None, help="where the .bel files for EMOGI go and stay (default: a "
                                                   "temporary folder, removed after each graph)")
    p.add_argument("--merge", action="store_true", help="keep the graphs of the existing result set (same device) "
                                                        "that this run does not measure")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--alpha", type=float, default=0.85)
    p.add_argument("--pagerank-tol", type=float, default=1e-4, help="L1 bound asked of every PageRank variant")
    p.add_argument("--pagerank-max-iter", type=int, default=100)
    p.add_argument("--reps", type=int, default=None, help="runs of cc / pagerank per variant (median); default 3")
    p.add_argument("--config-seconds", type=float, default=None,
                   help="stop taking sources for a configuration after this many seconds (default 6)")
    p.add_argument("--budget", type=float, default=None, help="skip what is left after this many seconds "
                                                              "(default 540; first look 110; quick 120)")
    p.add_argument("--warmup-ms", type=float, default=100.0,
                   help="a configuration whose first run is quicker is warmed up, untimed, for this long (default 100)")
    p.add_argument("--quick-reps", type=int, default=20,
                   help="runs of cc / pagerank per variant where the first run was under --warmup-ms (default 20)")
    p.add_argument("--hopeless", type=float, default=10.0,
                   help="a variant over this many times the fastest of its op and placement is not repeated, "
                        "nor run in host memory after GPU memory (default 10)")
    args = p.parse_args(argv)
    args.mode = "quick" if args.quick else "first-look" if args.first_look else "full"
    urand, kron, grid, road, families = DEFAULT_SIZES[args.mode]
    args.urand_scale = args.urand_scale or urand
    args.kron_scale = args.kron_scale or kron
    args.grid_side = args.grid_side or grid
    args.road_side = args.road_side or road
    names = [f.strip() for f in (args.graphs or families).split(",") if f.strip()]
    known = [f.value for f in Family]
    bad = [f for f in names if f not in known]
    if bad:
        p.error(f"--graphs: unknown families {bad}; choose among {known}")
    args.families = [Family(f) for f in names]
    args.emogi_placements = [x.strip() for x in args.emogi_placements.split(",") if x.strip()]
    if not args.emogi_placements or any(x not in PLACEMENTS for x in args.emogi_placements):
        p.error(f"--emogi-placements: choose among {list(PLACEMENTS)}, got {args.emogi_placements}")
    args.reps = args.reps or (1 if args.quick else 2 if args.first_look else 3)
    args.config_seconds = args.config_seconds or 6.0
    args.budget = args.budget or {"quick": 120.0, "first-look": 110.0, "full": 540.0}[args.mode]
    return args


def merged_graphs(path: str, env: dict, new: List[dict]) -> List[dict]:
    """The graphs of the result set at ``path`` measured on the same device and not measured
    again now, followed by the new ones."""
    if not os.path.exists(path):
        return new
    with open(path) as f:
        old = json.load(f)
    if old.get("environment", {}).get("gpu") != env["gpu"]:
        log(f"--merge: {path} was measured on {old.get('environment', {}).get('gpu')}, not {env['gpu']}: not merged")
        return new
    names = {g["name"] for g in new}
    kept = [g for g in old.get("graphs", []) if g["name"] not in names]
    log(f"--merge: keeping {[g['name'] for g in kept]} from {path}")
    return kept + new


GUARD_RESULT = "guard_overhead.json"  # benchmarks/guard_overhead.py's result, beside this one


def guard_bars(out_dir: str, env: dict) -> Optional[dict]:
    """The bars of guard_overhead.json in ``out_dir`` where it was measured on ``env``'s GPU."""
    path = os.path.join(out_dir, GUARD_RESULT)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        guard = json.load(f)
    if guard.get("environment", {}).get("gpu") != env.get("gpu"):
        log(f"{path} was measured on {guard.get('environment', {}).get('gpu')}, not {env.get('gpu')}: "
            "its guard_overhead is not copied into the bars")
        return None
    return guard["bars"]


def finish(out: dict, stem_path: str) -> None:
    """Computes ``out``'s bars over its graphs (and guard_overhead.json's beside it) and writes
    ``<stem>.json`` and ``<stem>.md``."""
    rows = [r for g in out["graphs"] for r in g["rows"]]
    out["auto_over_best"] = auto_over_best(rows)
    out["bars"] = bars(out["graphs"], guard_bars(os.path.dirname(stem_path) or ".", out["environment"]))
    if "correctness" in out:  # --first-look
        out["bars"]["first_look_correct"] = all(c["ok"] for c in out["correctness"])
    with open(stem_path + ".json", "w") as f:
        json.dump(out, f, indent=1)
    write_markdown(stem_path + ".md", out)


def refresh(stem_path: str) -> dict:
    """Rewrites the result set at ``stem_path`` (.json, .md) with its bars computed again (after
    guard_overhead.py has measured the guards on the same device); returns the bars."""
    with open(stem_path + ".json") as f:
        out = json.load(f)
    finish(out, stem_path)
    return out["bars"]


def write_results(args, result: dict, stem_path: str) -> None:
    """``<stem>.json`` and ``<stem>.md`` of the graphs measured so far (with ``--merge``, beside
    the other graphs of the result set already there), with the bars computed over them all."""
    out = dict(result)
    if args.merge:
        out["graphs"] = merged_graphs(stem_path + ".json", result["environment"], result["graphs"])
    finish(out, stem_path)
    result["bars"] = out["bars"]


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    clock = Clock(args.budget)
    env = environment()
    log(f"device: {env['gpu'] or 'CPU only'}; torch {env['torch']}; mode {args.mode}")
    ceiling = pinned_memcpy_gbs() if gpu() else None
    if ceiling:
        log(f"pinned memcpy H2D ceiling: {ceiling:.1f} GB/s")
    if args.emogi:
        emogi.build(args.emogi, emogi.cuda_arch())
        log(f"EMOGI built in {args.emogi}")
    warm_up(args)
    saved_args = {k: (v if not isinstance(v, list) else [getattr(x, "value", x) for x in v])
                  for k, v in vars(args).items()}
    result = {"environment": env, "args": saved_args, "mode": args.mode, "graphs": []}
    if args.first_look:
        if not gpu():
            log("the first look needs a GPU")
            return 2
        result["correctness"] = first_look_correctness(args)
        bad = [c for c in result["correctness"] if not c["ok"]]
        log(f"first look correctness: {len(result['correctness']) - len(bad)} ok, {len(bad)} failed")
    stem = {"quick": "traversal_peer_quick", "first-look": "traversal_peer_first_look", "full": "traversal_peer"}[
        args.mode]
    for spec in specs_for(args):
        if clock.left() <= 0:
            log(f"skipping {spec.name}: time budget spent")
            continue
        result["graphs"].append(bench_graph_and_peer(spec, args, clock, ceiling))
        write_results(args, result, os.path.join(args.out, stem))  # after every graph: a killed run keeps them
    if not result["graphs"]:
        write_results(args, result, os.path.join(args.out, stem))
    for k, v in result["bars"].items():
        log(f"bar {k}: {v}")
    log(f"wrote {args.out}/{stem}.json and .md in {time.perf_counter() - clock.start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
