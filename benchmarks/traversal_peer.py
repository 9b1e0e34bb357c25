"""Traversal beside EMOGI's published code, on EMOGI's graph, and the async variant where it wins.

The graph is the one EMOGI's own code was measured on (MEASUREMENTS.md, "Traversal beside
EMOGI's published code"): ``uniform_random_graph(26, 8, seed=1, symmetrize=True)``, 67.1 M
vertices, 1.074 B int32 CSR entries, a 4.3 GB edge list, generated on the GPU. Sources are
EMOGI's, vertex i * V / 4 for i = 0..3; times are means over them. Beside it: a high-diameter
grid (``grid_graph(2048, 2048)``, diameter 4094, int weights for SSSP) and a power-law graph
(``kronecker_graph(22, 16)``) for the async variant.

For each graph, op (bfs, sssp, cc, pagerank) and variant (every one the op takes, ``auto``
included) the script runs the op with the edge list in unified host memory (zero-copy), in GPU
memory, and, for the ``auto`` variant only, in CUDA managed memory (UVM, cold before every run,
and only where the copy fits in free GPU memory). It reports the time, the bytes of edge list
the op read (its edges_read statistic times the bytes per edge), and the time against one pass
over the edge list at the pinned-memcpy ceiling measured in the same run (``x pass``). Every
result is compared with a reference: on the large graphs, references computed with plain torch
operations on the GPU copy of the graph (level-synchronous BFS, min-label propagation, and a
float64 PageRank by sparse matrix-vector products to 1e-10), on the small ones the package's CPU
implementations. PageRank runs to ``--pagerank-tol`` (an L1 bound, default 1e-4) and its L1
distance to the float64 reference is reported.

Bars (``benchmarks/results/traversal_peer.json``, key ``"bars"``): ``bfs_unified_ms``,
``cc_default_unified_ms``, ``pagerank_unified_ms`` and ``pagerank_l1_vs_fp64`` (the ``auto``
variants on the unified graph), ``async_over_frontier_high_diameter`` (the larger of BFS's and
SSSP's frontier-time / async-time on the grid, unified) and ``every_variant_matches_reference``.

Modes. Full (default; one H100 or H200): about 3-5 minutes, generation included; ``--budget``
(default 330 s) skips what is left. ``--first-look``: under 2 minutes; correctness of every new
kernel on small and medium graphs against the CPU implementations, then every variant timed on
``uniform_random_graph(24, 8)`` and the async variant against frontier on a 1024 x 1024 grid.
``--quick``: a few seconds on the CPU (small graphs, every op and variant, CPU fallback), to
check the script itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # python benchmarks/traversal_peer.py from a checkout
    sys.path.insert(0, ROOT)

import pytorch_zerocopy  # noqa: E402
from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from benchmarks.traversal import Clock, log, sync  # noqa: E402
from pytorch_zerocopy.graph import (OP_VARIANTS, CSRGraph, auto_variant, bfs, connected_components,  # noqa: E402
                                    grid_graph, kronecker_graph, pagerank, sssp, uniform_random_graph)

OPS = ("bfs", "sssp", "connected_components", "pagerank")
SHORT = {"bfs": "bfs", "sssp": "sssp", "connected_components": "cc", "pagerank": "pagerank"}
# EMOGI's own code on the same graph and GPU (MEASUREMENTS.md), zero-copy, best variant.
EMOGI_UNIFIED_MS = {"bfs": 157.0, "connected_components": 266.0, "pagerank": 4660.0}


def gpu() -> bool:
    return torch.cuda.is_available() and pytorch_zerocopy.gpu_backed()


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    name: str
    kind: str  # "urand", "kron", "grid"
    scale: int = 0
    edge_factor: int = 8
    rows: int = 0
    cols: int = 0
    weights: Optional[str] = None
    sources: int = 4
    ops: tuple = OPS
    variants: Optional[Dict[str, tuple]] = None  # op -> variants to run (default: all + auto)
    reference: str = "torch"  # "torch" (GPU torch ops) or "cpu" (the package's CPU ops)
    managed: bool = True


def build(spec: GraphSpec, device: str) -> CSRGraph:
    if spec.kind == "urand":
        return uniform_random_graph(spec.scale, spec.edge_factor, seed=1, symmetrize=True, weights=spec.weights,
                                    device=device)
    if spec.kind == "kron":
        return kronecker_graph(spec.scale, spec.edge_factor, seed=1, weights=spec.weights, device=device)
    return grid_graph(spec.rows, spec.cols, weights=spec.weights)


def emogi_sources(graph: CSRGraph, count: int) -> List[int]:
    return [i * graph.num_nodes // 4 for i in range(min(count, 4))]


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
    (spec.reference == "torch") or the package's CPU implementations; cc / pagerank: torch ops on
    the GPU copy when there is one, else the CPU implementation (cc) or torch ops on the host
    arrays (pagerank)."""

    def __init__(self, spec: GraphSpec, host: CSRGraph, dev: Optional[CSRGraph], alpha: float):
        self.spec, self.host, self.dev, self.alpha = spec, host, dev, alpha
        self._bfs: Dict[int, torch.Tensor] = {}
        self._sssp: Dict[int, torch.Tensor] = {}
        self._cc: Optional[torch.Tensor] = None
        self._pr: Optional[torch.Tensor] = None

    def bfs(self, s: int) -> torch.Tensor:
        if s not in self._bfs:
            self._bfs[s] = (torch_bfs(self.dev.indptr, self.dev.indices, s).cpu()
                            if self.spec.reference == "torch" and self.dev is not None else bfs(self.host, s))
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
        d, st = bfs(graph, source, variant=variant, return_stats=True)
        return d, st
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


def measure(op: str, graph: CSRGraph, variant: str, sources: List[Optional[int]], refs: References, args,
            clock: Clock, before_each: Optional[Callable[[], None]] = None) -> List[dict]:
    runs = []
    spent = 0.0
    for s in sources:
        if clock.left() <= 0 or (runs and spent >= args.config_seconds):
            break
        if before_each is not None:
            before_each()
        sync()
        t0 = time.perf_counter()
        result, stats = run_once(op, graph, variant, s, args)
        sync()
        dt = time.perf_counter() - t0
        spent += dt
        stats = stats.cpu()
        run = {"source": s, "ms": dt * 1e3, "edges_read": int(stats[0]), "iterations": int(stats[1])}
        run.update(check(op, result, refs, s, args))
        runs.append(run)
    return runs


def summarize(row: dict, op: str, graph: CSRGraph, ceiling: Optional[float]) -> dict:
    runs = row["runs"]
    if not runs:
        return row
    ms = np.array([r["ms"] for r in runs])
    row["mean_ms"] = float(ms.mean()) if op in ("bfs", "sssp") else float(np.median(ms))
    row["bytes_read"] = float(np.mean([r["edges_read"] for r in runs])) * bytes_per_edge(op, graph)
    one_pass_ms = None if not ceiling else graph.num_edges * bytes_per_edge(op, graph) / (ceiling * 1e9) * 1e3
    row["x_one_pass"] = None if one_pass_ms is None else row["mean_ms"] / one_pass_ms
    row["matched"] = all(r["match"] for r in runs)
    if op == "pagerank":
        row["l1_vs_fp64"] = max(r["l1_vs_fp64"] for r in runs)
        row["iterations"] = runs[0]["iterations"]
    return row


def variants_for(spec: GraphSpec, op: str) -> List[str]:
    """auto first (the bars), then the others, the slowest last: naive, and async, which on a
    graph of small diameter reads its lists in worklist (random) order."""
    if spec.variants and op in spec.variants:
        return list(spec.variants[op])
    slow = [v for v in ("naive", "async") if v in OP_VARIANTS[op]]
    return ["auto"] + [v for v in OP_VARIANTS[op] if v not in slow] + slow


def bench_graph(spec: GraphSpec, args, clock: Clock, ceiling: Optional[float]) -> dict:
    gen_device = "cuda" if gpu() else "cpu"
    t0 = time.perf_counter()
    host = build(spec, gen_device)
    info = {"name": spec.name, "num_nodes": host.num_nodes, "num_edges": host.num_edges,
            "edge_list_bytes": host.edge_list_bytes, "build_seconds": time.perf_counter() - t0}
    log(f"{spec.name}: {host.num_nodes} vertices, {host.num_edges} CSR entries, "
        f"{host.edge_list_bytes / 1e9:.2f} GB edge list, built in {info['build_seconds']:.1f} s")
    ug = host.to("unified")  # maps the host arrays in place (pins them)
    dev = None
    if gpu():
        free, _ = torch.cuda.mem_get_info()
        if host.edge_list_bytes * 1.3 + host.num_nodes * 48 < free:
            dev = host.to("cuda")
    refs = References(spec, host, dev, args.alpha)
    rows: List[dict] = []

    def record(op, placement, variant, runs, resolved):
        row = {"graph": spec.name, "op": SHORT[op], "placement": placement, "variant": variant,
               "runs_on": resolved, "runs": runs}
        summarize(row, op, host, ceiling)
        rows.append(row)
        if runs:
            extra = f", L1 {row['l1_vs_fp64']:.2e}" if op == "pagerank" else ""
            xp = row.get("x_one_pass")
            log(f"{spec.name:>12} {SHORT[op]:>8} {placement:>8} {variant:>9}"
                f"{'(' + resolved + ')' if variant == 'auto' else '':>12}: {row['mean_ms']:9.2f} ms "
                f"{'' if xp is None else f'{xp:6.2f} x pass'}, read {row['bytes_read'] / 1e9:6.2f} GB, "
                f"{'ok' if row['matched'] else 'MISMATCH'}{extra}")
        else:
            log(f"{spec.name:>12} {SHORT[op]:>8} {placement:>8} {variant:>9}: skipped (time budget)")

    placements = [("unified", ug)] + ([("cuda", dev)] if dev is not None else [])
    for op in spec.ops:
        sources = emogi_sources(host, spec.sources) if op in ("bfs", "sssp") else [None] * args.reps
        for placement, g in placements:
            for variant in variants_for(spec, op):
                if clock.left() <= 0:
                    record(op, placement, variant, [], auto_variant(op, g) if variant == "auto" else variant)
                    continue
                resolved = auto_variant(op, g) if variant == "auto" else variant
                # async on a small-diameter graph: one run (it is measured, not expected to win)
                srcs = sources[:1] if resolved == "async" and spec.kind == "urand" and variant != "auto" else sources
                record(op, placement, variant, measure(op, g, variant, srcs, refs, args, clock), resolved)
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

            for op in spec.ops:
                sources = emogi_sources(host, 1) if op in ("bfs", "sssp") else [None]
                runs = measure(op, mg, "auto", sources, refs, args, clock, before_each=cold)
                record(op, "managed", "auto", runs, auto_variant(op, mg))
            del mg
        else:
            info["managed"] = "skipped: the managed copy would not fit in free GPU memory"
    del ug, dev, refs, host
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    info["rows"] = rows
    return info


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
    """Mean over the sources both rows ran of time(num) / time(den)."""
    if not num or not den:
        return None
    a = {r["source"]: r["ms"] for r in num["runs"]}
    b = {r["source"]: r["ms"] for r in den["runs"]}
    common = [s for s in a if s in b]
    return float(np.mean([a[s] / b[s] for s in common])) if common else None


def bars(graphs: List[dict], main: str, mesh: str) -> dict:
    rows = [r for g in graphs for r in g["rows"]]
    out = {}
    bfs_row = find(rows, main, "bfs", "unified", "auto")
    cc_row = find(rows, main, "cc", "unified", "auto")
    pr_row = find(rows, main, "pagerank", "unified", "auto")
    out["bfs_unified_ms"] = bfs_row["mean_ms"] if bfs_row else None
    out["cc_default_unified_ms"] = cc_row["mean_ms"] if cc_row else None
    out["pagerank_unified_ms"] = pr_row["mean_ms"] if pr_row else None
    out["pagerank_l1_vs_fp64"] = pr_row["l1_vs_fp64"] if pr_row else None
    ratios = [common_ratio(find(rows, mesh, op, "unified", "frontier"), find(rows, mesh, op, "unified", "async"))
              for op in ("bfs", "sssp")]
    ratios = [r for r in ratios if r is not None]
    out["async_over_frontier_high_diameter"] = max(ratios) if ratios else None
    ran = [r for r in rows if r["runs"]]
    out["every_variant_matches_reference"] = bool(ran) and all(r["matched"] for r in ran)
    # Information beside the bars: the fastest variant of each op on the unified graph.
    for op in ("bfs", "sssp", "cc", "pagerank"):
        cands = [r for r in rows if r["graph"] == main and r["op"] == op and r["placement"] == "unified"
                 and r["runs"] and r["variant"] != "auto"]
        best = min(cands, key=lambda r: r["mean_ms"], default=None)
        out[f"{op}_fastest_unified_variant"] = best["variant"] if best else None
        out[f"{op}_fastest_unified_ms"] = best["mean_ms"] if best else None
    return out


TARGETS = {"bfs_unified_ms": ("<=", 110.0), "cc_default_unified_ms": ("<=", 100.0),
           "pagerank_unified_ms": ("<=", 1500.0), "pagerank_l1_vs_fp64": ("<=", 1e-4),
           "async_over_frontier_high_diameter": (">=", 2.0), "every_variant_matches_reference": ("==", True)}


def write_markdown(path: str, result: dict) -> None:
    env = result["environment"]
    ceiling = result["ceiling_gbs"]
    lines = ["# Traversal beside EMOGI's code, on EMOGI's graph", "",
             f"- date: {env['date']}; device: {env['gpu'] or 'CPU only'} (driver {env['driver']}, CUDA {env['cuda']}), "
             f"torch {env['torch']}, {env['cpus']} CPUs",
             f"- pinned cudaMemcpy H2D ceiling (same run): {f'{ceiling:.1f} GB/s' if ceiling else 'n/a'}",
             f"- mode: {result['mode']}; pagerank: alpha {result['args']['alpha']}, tol (L1 bound) "
             f"{result['args']['pagerank_tol']}; sources: EMOGI's (i * V / 4); `x pass` = time / one pass over the "
             "edge list at the ceiling; `read` = edges read x bytes per edge", "", "## Bars", "",
             "| bar | value | target | pass |", "|---|---:|---|---|"]
    for k, v in result["bars"].items():
        t = TARGETS.get(k)
        ok = "" if t is None or v is None else ("yes" if (v <= t[1] if t[0] == "<=" else v >= t[1] if t[0] == ">="
                                                           else v == t[1]) else "no")
        val = "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))
        lines.append(f"| {k} | {val} | {'' if t is None else f'{t[0]} {t[1]}'} | {ok} |")
    for g in result["graphs"]:
        lines += ["", f"## {g['name']} ({g['num_nodes']} vertices, {g['num_edges']} CSR entries, "
                      f"{g['edge_list_bytes'] / 1e9:.2f} GB edge list; built in {g['build_seconds']:.1f} s)", "",
                  "| op | placement | variant | runs | ms | x pass | read GB | iterations | L1 vs fp64 | matches "
                  "| EMOGI ms |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
        for r in g["rows"]:
            if not r["runs"]:
                lines.append(f"| {r['op']} | {r['placement']} | {r['variant']} | 0 | skipped | | | | | | |")
                continue
            var = r["variant"] + (f" ({r['runs_on']})" if r["variant"] == "auto" else "")
            xp = r.get("x_one_pass")
            l1 = r.get("l1_vs_fp64")
            op_key = {"cc": "connected_components"}.get(r["op"], r["op"])
            emogi = EMOGI_UNIFIED_MS.get(op_key) if (g["name"] == result["main_graph"] and
                                                    r["placement"] == "unified") else None
            lines.append(f"| {r['op']} | {r['placement']} | {var} | {len(r['runs'])} | {r['mean_ms']:.1f} | "
                         f"{'-' if xp is None else f'{xp:.2f}'} | {r['bytes_read'] / 1e9:.2f} | "
                         f"{max(x['iterations'] for x in r['runs'])} | {'-' if l1 is None else f'{l1:.1e}'} | "
                         f"{'yes' if r['matched'] else 'NO'} | {'-' if emogi is None else f'{emogi:.0f}'} |")
    if result.get("correctness"):
        bad = [c for c in result["correctness"] if not c["ok"]]
        lines += ["", "## First look: new kernels against the CPU implementations", "",
                  f"{len(result['correctness']) - len(bad)} cases passed, {len(bad)} failed.", ""]
        if bad:
            lines += ["| graph | placement | case | error |", "|---|---|---|---|"]
            lines += [f"| {c['graph']} | {c['placement']} | {c['case']} | {c['error'] or 'wrong result'} |" for c in bad]
    lines += ["", "EMOGI ms: EMOGI's published code on the same graph and an H100 (MEASUREMENTS.md); its PageRank "
              "figure is 69 iterations of its residual push, with no accuracy stated. UVM rows (`managed`) are "
              "cold: every page starts in host memory.", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# --- modes -----------------------------------------------------------------------------------------


def full_specs(args) -> List[GraphSpec]:
    # The grid first: it is small, and it carries the async bar should the budget run out.
    return [
        GraphSpec("grid2048", "grid", rows=2048, cols=2048, weights="int", sources=2,
                  variants={"bfs": ("auto", "frontier", "async", "aligned"), "sssp": ("auto", "frontier", "async"),
                            "connected_components": ("auto",), "pagerank": ("auto", "async")},
                  reference="cpu", managed=False),
        GraphSpec("urand26", "urand", scale=26, edge_factor=8, sources=4,
                  ops=("bfs", "connected_components", "pagerank", "sssp")),
        GraphSpec("kron22", "kron", scale=22, edge_factor=16, sources=2,
                  variants={"bfs": ("auto", "frontier", "direction", "async"), "sssp": ("auto", "frontier", "async"),
                            "connected_components": ("auto", "frontier", "staged"),
                            "pagerank": ("auto", "push", "async")}, managed=False),
    ]


def quick_specs(args) -> List[GraphSpec]:
    return [
        GraphSpec("grid48", "grid", rows=48, cols=48, weights="int", sources=2, reference="cpu"),
        GraphSpec("urand12", "urand", scale=12, edge_factor=8, sources=4, reference="cpu"),
        GraphSpec("kron10", "kron", scale=10, edge_factor=8, sources=2, reference="cpu"),
    ]


def first_look_specs(args) -> List[GraphSpec]:
    return [
        GraphSpec("urand24", "urand", scale=24, edge_factor=8, sources=1, reference="torch", managed=False),
        GraphSpec("grid1024", "grid", rows=1024, cols=1024, weights="int", sources=1, reference="cpu", managed=False,
                  variants={op: ("frontier", "async") if op in ("bfs", "sssp") else ("auto",) for op in OPS}),
    ]


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
                cases += [(f"bfs {v}", lambda v=v, s=s: torch.equal(bfs(pg, s, variant=v).cpu(), want_bfs[s]))
                          for s in srcs]
            cases += [("sssp async", lambda s=s: bool(torch.allclose(sssp(pg, s, variant="async").cpu().double(),
                                                                     want_sssp[s].double(), rtol=1e-5, atol=0)))
                      for s in srcs]
            for v in ("naive", "merged", "aligned", "frontier", "staged"):
                cases.append((f"cc {v}", lambda v=v: torch.equal(
                    connected_components(pg, variant=v, weak=True).cpu(), want_cc)))
            for chunk in (1000, 1 << 16):
                cases.append((f"cc staged chunk {chunk}", lambda chunk=chunk: torch.equal(
                    torch.ops.zerocopy.graph_connected_components.default(pg.indptr, pg.indices, 7, g.symmetric,
                                                                          chunk)[0].cpu(), want_cc)))
            for v in ("push", "async", "frontier"):
                cases.append((f"pagerank {v}", lambda v=v: float(
                    (pagerank(pg, alpha=args.alpha, tol=1e-5, max_iter=1000, variant=v).cpu().double()
                     - want_pr).abs().sum()) <= 1e-5 + 2e-6))
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small graphs on the CPU, a few seconds")
    mode.add_argument("--first-look", action="store_true", help="new kernels' correctness + scale-24 timings, < 2 min")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--alpha", type=float, default=0.85)
    p.add_argument("--pagerank-tol", type=float, default=1e-4, help="L1 bound asked of every PageRank variant")
    p.add_argument("--pagerank-max-iter", type=int, default=100)
    p.add_argument("--reps", type=int, default=None, help="runs of cc / pagerank per variant (median); default 3")
    p.add_argument("--config-seconds", type=float, default=None,
                   help="stop taking sources for a configuration after this many seconds (default 6)")
    p.add_argument("--budget", type=float, default=None, help="skip what is left after this many seconds "
                                                              "(default 330; first look 110; quick 60)")
    args = p.parse_args(argv)
    mode_name = "quick" if args.quick else "first-look" if args.first_look else "full"
    args.reps = args.reps or (1 if args.quick else 2 if args.first_look else 3)
    args.config_seconds = args.config_seconds or 6.0
    args.budget = args.budget or {"quick": 60.0, "first-look": 110.0, "full": 330.0}[mode_name]
    os.makedirs(args.out, exist_ok=True)
    clock = Clock(args.budget)
    env = environment()
    log(f"device: {env['gpu'] or 'CPU only'}; torch {env['torch']}; mode {mode_name}")
    ceiling = pinned_memcpy_gbs() if gpu() else None
    if ceiling:
        log(f"pinned memcpy H2D ceiling: {ceiling:.1f} GB/s")
    warm_up(args)
    result = {"environment": env, "args": vars(args), "mode": mode_name, "ceiling_gbs": ceiling, "graphs": []}
    if args.first_look:
        if not gpu():
            log("the first look needs a GPU")
            return 2
        result["correctness"] = first_look_correctness(args)
        bad = [c for c in result["correctness"] if not c["ok"]]
        log(f"first look correctness: {len(result['correctness']) - len(bad)} ok, {len(bad)} failed")
        specs = first_look_specs(args)
    else:
        specs = quick_specs(args) if args.quick else full_specs(args)
    for spec in specs:
        if clock.left() <= 0:
            log(f"skipping {spec.name}: time budget spent")
            continue
        result["graphs"].append(bench_graph(spec, args, clock, ceiling))
    main_graph = next(s.name for s in specs if s.kind == "urand")
    mesh = next(s.name for s in specs if s.kind == "grid")
    result["main_graph"] = main_graph
    result["bars"] = bars(result["graphs"], main_graph, mesh)
    if args.first_look:
        result["bars"]["first_look_correct"] = all(c["ok"] for c in result["correctness"])
    stem = {"quick": "traversal_peer_quick", "first-look": "traversal_peer_first_look", "full": "traversal_peer"}[
        mode_name]
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    write_markdown(os.path.join(args.out, stem + ".md"), result)
    for k, v in result["bars"].items():
        log(f"bar {k}: {v}")
    log(f"wrote {args.out}/{stem}.json and .md in {time.perf_counter() - clock.start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
