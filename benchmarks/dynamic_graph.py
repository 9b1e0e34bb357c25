"""Dynamic graph updates on the GPU: batched edge and vertex insertions and deletions on a
DynamicGraph, against rebuilding the CSR, and sampling / BFS on the updated graph against its CSR
snapshot.

Graphs: Kronecker (Graph500 R-MAT) and uniform random, scale 24, edge factor 16, symmetrized
(>= 500 M list entries each), generated on the GPU. The DynamicGraph is built from the CSR with
``symmetric=False``, so one update is one list entry (the thesis counts updates the same way),
and with its in-edge index (``in_index=True``; ``--no-in-index`` leaves it out), so that vertex
deletion reads the lists holding edges into the vertices: every edge update below pays for
keeping the index, and the memory counts it.
Workloads, faimGraph's (thesis Figures 4.11 and 4.13): batches of 1 M edge insertions with
uniform random sources and destinations, then deletion of the same edges (the graph returns to
its edge set, so 10 rounds measure reuse of freed pages), and the same with sources focused on
a window of 1000 vertices that sweeps over the graph; deletion of 1 M existing edges; 100 K
vertex insertions and deletions (the deletion of 100 K existing vertices by the graph's default
path, ``--vertex-rounds`` batches of them drawn from the vertices still alive, and of another
100 K by the page sweep, ``delete_100K_existing_sweep_ms``). Every time is a CUDA-event
interval around the user's call
(checks, sorting, duplicate removal and the host synchronisations included), the median over
the rounds after one warm-up round.

Baselines in the same run. Rebuild: what a static graph needs for any update, the updated edge
set rebuilt into a CSR on the same device from scratch (the batch merged into, or filtered out
of, the current CSR's edges; then one whole-graph sort by (source, destination) key and the row
offsets by bincount and cumsum: ``pytorch_zerocopy.graph.csr.coo_to_csr``), after every insertion
and every deletion batch of the update rounds, timed with the same CUDA events as the update;
its edge set is checked against the DynamicGraph's snapshot after each workload. Sampling
(GraphSAGE's fanouts 15, 10, batches of 1024 seeds, every batch freshly sampled) and BFS on the
CSR snapshot of the updated graph, with identical results checked. The unified variant keeps the
page pool in host memory mapped for the GPU. Memory: the DynamicGraph's bytes (allocated, and in
use) against the CSR's (int64 offsets, int32 ids), before and after the 10 update rounds.

Deletions are counted: before every deletion batch (edges, or vertices) the list entries it must
remove are counted on the graph's snapshot with ``torch.isin`` over (source, destination) keys;
the count ``delete_*`` returns and the change in the graph's edge count must both equal it, or
the script stops. The counts are in the JSON (``deletions``) and the Markdown.

Bars: ``insert_1M_edges_ms`` / ``delete_1M_edges_ms`` (the slowest median of the primary
placement over graphs and workloads), ``sampling_dynamic_over_csr``, ``memory_over_csr_before`` /
``memory_over_csr_after_10_rounds``, ``update_vs_gpu_rebuild`` (the smallest median
rebuild / update ratio over graphs, workloads, insertions and deletions: how many times faster
the update is than the GPU rebuild; it replaces ``update_vs_rebuild``, whose baseline was a CPU
rebuild of a prefix of the edge list scaled to the whole graph), ``deletions_match_reference``,
``delete_100K_vertices_ms`` (the slowest primary-placement median of deleting 100 K existing
vertices by the default path), and the ``*_ok`` checks of the targets (insert and delete
<= 10 ms, sampling <= 1.5, vertex deletion <= 5 ms).

    python benchmarks/dynamic_graph.py            # GPU, both graphs, ~4-5 min on one H100
    python benchmarks/dynamic_graph.py --scale 20 # GPU, medium graphs, ~40 s
    python benchmarks/dynamic_graph.py --quick    # CPU, seconds
    python benchmarks/dynamic_graph.py --profile  # and, after the timed runs, torch.profiler tables
                                                  # of one batch of each update (a diagnostic)

Writes dynamic_graph.json (top-level "bars") and dynamic_graph.md under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pytorch_zerocopy as zc  # noqa: E402
from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from pytorch_zerocopy import sampling as S  # noqa: E402
from pytorch_zerocopy.graph import CSRGraph, DynamicGraph, bfs, kronecker_graph, uniform_random_graph  # noqa: E402
from pytorch_zerocopy.graph.csr import coo_to_csr  # noqa: E402
from pytorch_zerocopy.graph.dynamic import csr_bytes  # noqa: E402

FANOUTS = [15, 10]
BATCH_SEEDS = 1024
FOCUS = 1000


class Clock:
    """Elapsed milliseconds of a call: CUDA events on the GPU (host gaps inside the call count,
    as the stream idles through them), perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable):
        if self.cuda:
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            stop.record()
            stop.synchronize()
            return out, start.elapsed_time(stop)
        t0 = time.perf_counter()
        out = fn()
        return out, (time.perf_counter() - t0) * 1e3


def median(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def generate(kind: str, scale: int, device: torch.device) -> Tuple[CSRGraph, float]:
    t0 = time.perf_counter()
    make = kronecker_graph if kind == "kronecker" else uniform_random_graph
    g = make(scale, 16, seed=1, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return g, time.perf_counter() - t0


def memory_entry(dg: DynamicGraph, csr: int) -> Dict:
    m = dg.memory()
    return {"allocated_bytes": m.total_bytes, "used_bytes": m.used_bytes, "pool_bytes": m.pool_bytes,
            "used_pool_bytes": m.used_pool_bytes, "page_table_bytes": m.page_table_bytes,
            "vertex_bytes": m.vertex_bytes, "allocated_over_csr": m.total_bytes / csr,
            "used_over_csr": m.used_bytes / csr}


def absent_batch(dg: DynamicGraph, src: torch.Tensor, dst: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The pairs of a random batch not already in the graph, so that deleting them after
    inserting them restores the graph's edge set (untimed)."""
    keep = ~dg.has_edges(src, dst)
    return src[keep], dst[keep]


# --- the rebuild baseline and the deletion counts ------------------------------------------


def edge_keys(indptr: torch.Tensor, indices: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """``src * num_nodes + dst`` of every CSR entry, in CSR order, on the arrays' device."""
    rows = torch.repeat_interleave(torch.arange(num_nodes, device=indptr.device), indptr[1:] - indptr[:-1])
    return rows * num_nodes + indices.long()


def _members(sorted_set: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """bool per element of ``x``: whether it is in the ascending ``sorted_set``."""
    if sorted_set.numel() == 0:
        return torch.zeros_like(x, dtype=torch.bool)
    pos = torch.searchsorted(sorted_set, x).clamp_(max=sorted_set.numel() - 1)
    return sorted_set[pos] == x


def _csr_from_keys(keys: torch.Tensor, num_nodes: int, like: CSRGraph) -> CSRGraph:
    src = torch.div(keys, num_nodes, rounding_mode="floor")
    indptr, indices, _ = coo_to_csr(src, keys - src * num_nodes, num_nodes, index_dtype=like.indices.dtype)
    return CSRGraph(indptr, indices, placement=like.placement, validate=False)


def rebuild_inserted(csr: CSRGraph, src: torch.Tensor, dst: torch.Tensor) -> CSRGraph:
    """The CSR of ``csr``'s edges plus the pairs of the batch not already in it (each once), as
    ``insert_edges`` adds them, rebuilt from scratch on ``csr``'s device. ``csr``'s rows must be
    sorted (as the generators and this rebuild leave them)."""
    n = csr.num_nodes
    keys = edge_keys(csr.indptr, csr.indices, n)
    new = torch.unique(src * n + dst)
    new = new[~_members(keys, new)]
    return _csr_from_keys(torch.cat([keys, new]), n, csr)


def rebuild_deleted(csr: CSRGraph, src: torch.Tensor, dst: torch.Tensor) -> CSRGraph:
    """The CSR of ``csr``'s edges less every copy of each pair of the batch, as ``delete_edges``
    removes them, rebuilt from scratch on ``csr``'s device."""
    n = csr.num_nodes
    keys = edge_keys(csr.indptr, csr.indices, n)
    gone = torch.unique(src * n + dst)
    return _csr_from_keys(keys[~_members(gone, keys)], n, csr)


def same_edge_set(a: CSRGraph, b: CSRGraph) -> bool:
    """Whether two CSR graphs hold the same edges with the same multiplicities."""
    ka = torch.sort(edge_keys(a.indptr, a.indices, a.num_nodes)).values
    kb = torch.sort(edge_keys(b.indptr, b.indices, b.num_nodes)).values
    return a.num_nodes == b.num_nodes and torch.equal(ka.cpu(), kb.cpu())


@dataclasses.dataclass(frozen=True)
class DeletionCount:
    """One deletion batch: the list entries it had to remove (counted on the snapshot before it,
    the reference), what the delete call returned, and the graph's edge count around it."""

    batch: int
    expected: int
    returned: int
    edges_before: int
    edges_after: int

    @property
    def removed(self) -> int:
        return self.edges_before - self.edges_after

    @property
    def ok(self) -> bool:
        return self.expected == self.returned == self.removed

    def checked(self) -> "DeletionCount":
        """Itself; raises AssertionError naming the three counts when they differ."""
        if not self.ok:
            raise AssertionError(f"a deletion batch of {self.batch} removed {self.removed} list entries and "
                                 f"reported {self.returned}; the snapshot before it held {self.expected} of them")
        return self


def expected_edge_removals(snapshot: CSRGraph, src: torch.Tensor, dst: torch.Tensor) -> int:
    """List entries of ``snapshot`` equal to any pair of the batch (every parallel copy)."""
    n = snapshot.num_nodes
    keys = edge_keys(snapshot.indptr, snapshot.indices, n)
    return int(torch.isin(keys, (src * n + dst).to(keys.device)).sum())


def expected_vertex_removals(snapshot: CSRGraph, vertices: torch.Tensor) -> int:
    """List entries of ``snapshot`` leaving or entering any of ``vertices``."""
    n = snapshot.num_nodes
    keys = edge_keys(snapshot.indptr, snapshot.indices, n)
    hit = torch.zeros(n, dtype=torch.bool, device=keys.device)
    hit[vertices.to(keys.device)] = True
    return int((hit[torch.div(keys, n, rounding_mode="floor")] | hit[keys % n]).sum())


def counted_deletion(dg: DynamicGraph, delete: Callable[[], int], expected: int, batch: int, clock: "Clock"
                     ) -> Tuple[DeletionCount, float]:
    """Runs ``delete`` under the clock; its count, checked against ``expected``, and its time."""
    before = dg.num_edges
    returned, ms = clock(delete)
    return DeletionCount(batch, expected, int(returned), before, dg.num_edges).checked(), ms


# --- workloads --------------------------------------------------------------------------------


def update_rounds(dg: DynamicGraph, base: Optional[CSRGraph], rounds: int, batch: int, focus: int, clock: Clock,
                  gen: torch.Generator) -> Tuple[Dict, Optional[CSRGraph]]:
    """Insert a random batch, delete it again; ``rounds`` timed rounds after a warm-up. With a
    baseline CSR ``base`` (the graph's edge set, rows sorted), each batch is also applied to it
    by a rebuild, timed alike; returns the workload's figures and the baseline after it."""
    n = dg.num_nodes
    ins, dels, added, rb_ins, rb_del, counts = [], [], [], [], [], []
    for r in range(rounds + 1):
        if focus:
            lo = (r * (n - focus)) // max(rounds, 1)
            src = lo + torch.randint(0, focus, (batch,), device=dg.device, generator=gen)
        else:
            src = torch.randint(0, n, (batch,), device=dg.device, generator=gen)
        dst = torch.randint(0, n, (batch,), device=dg.device, generator=gen)
        src, dst = absent_batch(dg, src, dst)
        count, t_ins = clock(lambda: dg.insert_edges(src, dst))
        if base is not None:
            grown, t_rb_ins = clock(lambda: rebuild_inserted(base, src, dst))
        expected = expected_edge_removals(dg.to_csr(), src, dst)
        deletion, t_del = counted_deletion(dg, lambda: dg.delete_edges(src, dst), expected, src.numel(), clock)
        assert deletion.returned == count, f"inserted {count} list entries, deleted {deletion.returned}"
        counts.append(deletion)
        if base is not None:
            base, t_rb_del = clock(lambda: rebuild_deleted(grown, src, dst))
            del grown
            assert base.num_edges == deletion.edges_after, (base.num_edges, deletion.edges_after)
        if r:
            ins.append(t_ins)
            dels.append(t_del)
            added.append(count)
            if base is not None:
                rb_ins.append(t_rb_ins)
                rb_del.append(t_rb_del)
    out = {"insert_ms": median(ins), "delete_ms": median(dels), "insert_ms_all": ins, "delete_ms_all": dels,
           "batch": batch, "inserted_per_batch": median(added), "updates_per_s": batch / (median(ins) / 1e3),
           "deletions": [dataclasses.asdict(c) for c in counts]}
    if base is not None:
        out.update(rebuild_insert_ms=median(rb_ins), rebuild_delete_ms=median(rb_del), rebuild_insert_ms_all=rb_ins,
                   rebuild_delete_ms_all=rb_del, rebuild_matches=same_edge_set(base, dg.to_csr()),
                   insert_vs_rebuild=median(rb_ins) / median(ins), delete_vs_rebuild=median(rb_del) / median(dels))
    return out, base


def delete_existing(dg: DynamicGraph, batch: int, clock: Clock, gen: torch.Generator) -> Dict:
    """Delete `batch` existing edges (uniform over list entries; every parallel copy goes), then
    insert them back (one copy each); median of 3 after a warm-up."""
    snap = dg.to_csr()
    times_del, times_ins, counts = [], [], []
    for r in range(4):
        pos = torch.randint(0, snap.num_edges, (batch,), device=dg.device, generator=gen)
        src = torch.searchsorted(snap.indptr, pos, right=True) - 1
        dst = snap.indices[pos].long()
        key = torch.unique(src * dg.num_nodes + dst)
        src, dst = key // dg.num_nodes, key % dg.num_nodes
        expected = expected_edge_removals(dg.to_csr(), src, dst)
        deletion, t_del = counted_deletion(dg, lambda: dg.delete_edges(src, dst), expected, src.numel(), clock)
        counts.append(deletion)
        added, t_ins = clock(lambda: dg.insert_edges(src, dst))
        assert added == src.numel(), f"re-inserted {added} of {src.numel()} deleted pairs"
        if r:
            times_del.append(t_del)
            times_ins.append(t_ins)
    return {"delete_ms": median(times_del), "reinsert_ms": median(times_ins), "batch": batch,
            "deletions": [dataclasses.asdict(c) for c in counts]}


def _live_sample(dg: DynamicGraph, count: int, gen: torch.Generator) -> torch.Tensor:
    alive = torch.nonzero(dg.is_alive()).flatten()
    if alive.numel() < count:
        raise ValueError(f"--vertex-batch {count} x (--vertex-rounds + 2) batches need more vertices than the "
                         f"{alive.numel()} still alive")
    return alive[torch.randperm(alive.numel(), device=dg.device, generator=gen)[:count]]


def vertex_updates(dg: DynamicGraph, count: int, rounds: int, clock: Clock, gen: torch.Generator) -> Dict:
    """Vertex insertions and deletions of ``count`` vertices: new ones inserted and deleted;
    existing ones deleted by the default path, a warm-up and ``rounds`` timed batches (each
    drawn from the vertices still alive, its removals checked against the snapshot before it;
    the bar reads their median), then once by the page sweep; then ``count`` deleted ids reused."""
    new, t_ins = clock(lambda: dg.insert_vertices(count))
    _, t_del_new = clock(lambda: dg.delete_vertices(new))
    deletions, times = [], []
    for r in range(rounds + 1):
        victims = _live_sample(dg, count, gen)
        expected = expected_vertex_removals(dg.to_csr(), victims)
        deletion, t_del = counted_deletion(dg, lambda: dg.delete_vertices(victims), expected, count, clock)
        deletions.append(deletion)
        if r:
            times.append(t_del)
    swept = _live_sample(dg, count, gen)
    expected = expected_vertex_removals(dg.to_csr(), swept)
    sweep, t_sweep = counted_deletion(dg, lambda: dg._delete_vertices(swept, sweep=True), expected, count, clock)
    _, t_reuse = clock(lambda: dg.insert_vertices(count))
    last = deletions[-1]
    return {"insert_100K_ms": t_ins, "delete_100K_new_ms": t_del_new, "delete_100K_existing_ms": median(times),
            "delete_100K_existing_ms_all": times, "in_edge_lookup": dg.in_edge_lookup,
            "delete_100K_existing_sweep_ms": t_sweep, "edges_removed": last.removed, "edges_before": last.edges_before,
            "deletion": dataclasses.asdict(last), "deletions": [dataclasses.asdict(d) for d in deletions],
            "sweep_deletion": dataclasses.asdict(sweep), "reinsert_reused_ids_ms": t_reuse, "count": count}


PROFILE_ROWS = 25  # lines of each --profile table


def profile_updates(dg: DynamicGraph, batch: int, vertex_batch: int, gen: torch.Generator) -> Dict[str, str]:
    """Where one update's time goes (``--profile``, a diagnostic pass after the timed ones):
    torch.profiler's tables, ops by self CPU time (the host's work and synchronisations), and
    on a GPU by self CUDA time, for one insertion of ``batch`` absent edges, their deletion and
    the deletion of ``vertex_batch`` live vertices."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = dg.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    alive = torch.nonzero(dg.is_alive()).flatten()  # earlier workloads deleted vertices
    pick = [alive[torch.randint(0, alive.numel(), (batch,), device=dg.device, generator=gen)] for _ in range(2)]
    src, dst = absent_batch(dg, *pick)
    victims = alive[torch.randperm(alive.numel(), device=dg.device, generator=gen)[:vertex_batch]]
    steps = {"insert_edges": lambda: dg.insert_edges(src, dst), "delete_edges": lambda: dg.delete_edges(src, dst),
             "delete_vertices": lambda: dg.delete_vertices(victims)}
    tables = {}
    for name, step in steps.items():
        if on_gpu:
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            step()
            if on_gpu:
                torch.cuda.synchronize()
        ops = prof.key_averages()
        text = ops.table(sort_by="self_cpu_time_total", row_limit=PROFILE_ROWS)
        if on_gpu:
            text += "\n" + ops.table(sort_by="self_cuda_time_total", row_limit=PROFILE_ROWS)
        tables[name] = text
    return tables


def sampling_compare(dg: DynamicGraph, snap, clock: Clock, batches: int, gen: torch.Generator) -> Dict:
    """sample_layers on the DynamicGraph and on its CSR snapshot, same seeds and seed."""
    dyn_ms, csr_ms, edges = [], [], []
    n = dg.num_nodes
    for b in range(batches + 2):
        seeds = torch.randperm(n, device=dg.device, generator=gen)[:BATCH_SEEDS]
        blocks_d, t_d = clock(lambda: dg.sample_layers(seeds, FANOUTS, edge_dir="out", seed=b))
        blocks_c, t_c = clock(lambda: S.sample_layers(snap, seeds, FANOUTS, edge_dir="out", seed=b))
        if b == 0:
            for x, y in zip(blocks_d, blocks_c):
                assert torch.equal(x.src, y.src) and torch.equal(x.dst, y.dst), "samples differ from the snapshot's"
                assert torch.equal(x.srcdata["_ID"], y.srcdata["_ID"]), "samples differ from the snapshot's"
        if b >= 2:
            dyn_ms.append(t_d)
            csr_ms.append(t_c)
            edges.append(sum(x.num_edges() for x in blocks_d))
    # One layer, many seeds: the kernel without compaction (diagnostic).
    seeds = torch.randint(0, n, (200_000,), device=dg.device, generator=gen)
    k_d, k_c = [], []
    for r in range(4):
        _, t_d = clock(lambda: dg.sample_neighbors(seeds, 10, seed=r))
        _, t_c = clock(lambda: S.sample_neighbors(snap.indptr, snap.indices, seeds, 10, seed=r))
        if r:
            k_d.append(t_d)
            k_c.append(t_c)
    return {"dynamic_ms": median(dyn_ms), "csr_ms": median(csr_ms), "dynamic_over_csr": median(dyn_ms) / median(csr_ms),
            "sampled_edges_per_batch": median(edges), "fanouts": FANOUTS, "batch_seeds": BATCH_SEEDS,
            "one_layer_200K_seeds": {"dynamic_ms": median(k_d), "csr_ms": median(k_c),
                                     "dynamic_over_csr": median(k_d) / median(k_c)}}


def bfs_compare(dg: DynamicGraph, snap, clock: Clock) -> Dict:
    deg = dg.out_degree()
    source = int(torch.argmax(deg))
    d_dyn, t_dyn = clock(lambda: dg.bfs(source))
    d_csr, t_csr = clock(lambda: bfs(snap, source))
    _, t_dyn = clock(lambda: dg.bfs(source))
    _, t_csr = clock(lambda: bfs(snap, source))
    assert torch.equal(d_dyn, d_csr), "BFS depths differ from the snapshot's"
    return {"dynamic_ms": t_dyn, "csr_ms": t_csr, "dynamic_over_csr": t_dyn / t_csr, "source": source,
            "reached": int((d_dyn >= 0).sum())}


def run_graph(kind: str, scale: int, placement: str, device: torch.device, args) -> Dict:
    out: Dict = {"graph": kind, "scale": scale, "placement": placement}
    g, gen_s = generate(kind, scale, device)
    out.update(num_nodes=g.num_nodes, num_edges=g.num_edges, generate_s=gen_s, csr_bytes=csr_bytes(g),
               max_degree=int((g.indptr[1:] - g.indptr[:-1]).max()))
    print(f"{kind} {scale}: {g.num_nodes:,} vertices, {g.num_edges:,} entries ({gen_s:.1f} s)", flush=True)
    results = {}
    for pl in ([placement, "unified"] if not args.no_unified and kind == "kronecker" else [placement]):
        results[pl] = run_placement(g, pl, device, args, rebuild=pl == placement)
    out["placements"] = results
    del g
    return out


def run_placement(g: CSRGraph, placement: str, device: torch.device, args, rebuild: bool) -> Dict:
    """Every workload on a DynamicGraph of ``g`` in ``placement``; with ``rebuild``, the update
    rounds also rebuild a CSR copy of ``g`` on ``device`` (the baseline)."""
    clock = Clock(device)
    gen = torch.Generator(device=device).manual_seed(7)
    t0 = time.perf_counter()
    dg = DynamicGraph.from_csr(g, placement=placement, page_size=args.page_size, headroom=args.headroom,
                               symmetric=False, in_index=not args.no_in_index)
    if device.type == "cuda":
        torch.cuda.synchronize()
    r: Dict = {"build_s": time.perf_counter() - t0, "page_size": args.page_size}
    csr = csr_bytes(g)
    r["memory_before"] = memory_entry(dg, csr)
    rounds = args.rounds if placement != "unified" else max(2, args.rounds // 3)
    base = g.to("cuda") if rebuild and device.type == "cuda" else g if rebuild else None
    r["uniform"], base = update_rounds(dg, base, rounds, args.batch, 0, clock, gen)
    r["focused"], base = update_rounds(dg, base, rounds, args.batch, FOCUS, clock, gen)
    del base
    r["memory_after"] = memory_entry(dg, csr)
    r["rounds"] = rounds
    print(f"  [{placement}] build {r['build_s']:.1f} s; insert/delete uniform {r['uniform']['insert_ms']:.2f}/"
          f"{r['uniform']['delete_ms']:.2f} ms, focused {r['focused']['insert_ms']:.2f}/"
          f"{r['focused']['delete_ms']:.2f} ms; memory {r['memory_before']['allocated_over_csr']:.2f}x CSR "
          f"-> {r['memory_after']['allocated_over_csr']:.2f}x", flush=True)
    if rebuild:
        print(f"  [{placement}] rebuild after insert/delete: uniform {r['uniform']['rebuild_insert_ms']:.1f}/"
              f"{r['uniform']['rebuild_delete_ms']:.1f} ms, focused {r['focused']['rebuild_insert_ms']:.1f}/"
              f"{r['focused']['rebuild_delete_ms']:.1f} ms (on {device.type})", flush=True)
    r["delete_existing"] = delete_existing(dg, args.batch, clock, gen)
    snap = dg.to_csr()
    if placement == "unified" and device.type == "cuda":
        snap = snap.to("unified")
    r["sampling"] = sampling_compare(dg, snap, clock, args.sample_batches, gen)
    r["bfs"] = bfs_compare(dg, snap, clock)
    del snap
    r["vertices"] = vertex_updates(dg, args.vertex_batch, args.vertex_rounds, clock, gen)
    if args.profile and placement != "unified":
        r["profile"] = profile_updates(dg, args.batch, args.vertex_batch, gen)
    print(f"  [{placement}] sampling dyn/csr {r['sampling']['dynamic_over_csr']:.2f} "
          f"({r['sampling']['dynamic_ms']:.2f} vs {r['sampling']['csr_ms']:.2f} ms); bfs dyn/csr "
          f"{r['bfs']['dynamic_over_csr']:.2f}; vertices {r['vertices']}", flush=True)
    del dg
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return r


def _spread(values: Optional[List[float]]) -> str:
    """`` (lo–hi)`` of repeated times, or nothing for one."""
    return f" ({min(values):.1f}–{max(values):.1f})" if values and len(values) > 1 else ""


def deletion_counts(p: Dict) -> List[Dict]:
    """Every deletion batch's counts in one placement's results."""
    out = []
    for mode in ("uniform", "focused", "delete_existing"):
        out += p[mode]["deletions"]
    v = p["vertices"]
    return out + v.get("deletions", [v["deletion"]]) + ([v["sweep_deletion"]] if "sweep_deletion" in v else [])


def bars_of(runs: List[Dict], primary: str) -> Dict:
    ins, dels, samp, mem_b, mem_a, versus, vdel = [], [], [], [], [], [], []
    counts_ok = True
    for run in runs:
        for p in run["placements"].values():
            counts_ok &= all(c["expected"] == c["returned"] == c["edges_before"] - c["edges_after"]
                             for c in deletion_counts(p))
        p = run["placements"].get(primary)
        if p is None:
            continue
        for mode in ("uniform", "focused"):
            ins.append(p[mode]["insert_ms"])
            dels.append(p[mode]["delete_ms"])
            if "insert_vs_rebuild" in p[mode]:
                versus += [p[mode]["insert_vs_rebuild"], p[mode]["delete_vs_rebuild"]]
        dels.append(p["delete_existing"]["delete_ms"])
        if "delete_100K_existing_ms" in p["vertices"]:
            vdel.append(p["vertices"]["delete_100K_existing_ms"])
        samp.append(p["sampling"]["dynamic_over_csr"])
        mem_b.append(p["memory_before"]["allocated_over_csr"])
        mem_a.append(p["memory_after"]["allocated_over_csr"])
    bars = {
        "insert_1M_edges_ms": max(ins),
        "delete_1M_edges_ms": max(dels),
        "sampling_dynamic_over_csr": max(samp),
        "memory_over_csr_before": max(mem_b),
        "memory_over_csr_after_10_rounds": max(mem_a),
        "update_vs_gpu_rebuild": min(versus) if versus else None,
        "deletions_match_reference": counts_ok,
        "delete_100K_vertices_ms": max(vdel) if vdel else None,
    }
    bars["insert_ok"] = bars["insert_1M_edges_ms"] <= 10
    bars["delete_ok"] = bars["delete_1M_edges_ms"] <= 10
    bars["sampling_ok"] = bars["sampling_dynamic_over_csr"] <= 1.5
    if vdel:
        bars["delete_vertices_ok"] = bars["delete_100K_vertices_ms"] <= 5
    return bars


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CPU, small graphs, seconds")
    ap.add_argument("--scale", type=int, default=None, help="graph scale (default 24; --quick 11)")
    ap.add_argument("--batch", type=int, default=None, help="edges per update batch (default 1 M)")
    ap.add_argument("--vertex-batch", type=int, default=None, help="vertices per vertex batch (default 100 K)")
    ap.add_argument("--rounds", type=int, default=10, help="timed insert + delete rounds")
    ap.add_argument("--vertex-rounds", type=int, default=3, help="timed batches deleting existing vertices (median)")
    ap.add_argument("--sample-batches", type=int, default=None, help="timed sampling batches")
    ap.add_argument("--page-size", type=int, default=32)
    ap.add_argument("--headroom", type=float, default=0.25)
    ap.add_argument("--no-unified", action="store_true", help="skip the unified-pool variant")
    ap.add_argument("--no-in-index", action="store_true",
                    help="build without the in-edge index (vertex deletion then sweeps the pool)")
    ap.add_argument("--graphs", default="kronecker,uniform")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed workloads, a torch.profiler table of one insertion, one edge deletion and "
                         "one vertex deletion (a diagnostic, in the JSON and the Markdown)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args()

    quick = args.quick
    has_gpu = torch.cuda.is_available() and not quick
    device = torch.device("cuda") if has_gpu else torch.device("cpu")
    placement = "cuda" if has_gpu else "cpu"
    scale = args.scale or (11 if quick else 24)
    args.batch = args.batch or (10_000 if quick else 1_000_000)
    args.vertex_batch = args.vertex_batch or (200 if quick else 100_000)
    args.sample_batches = args.sample_batches or (5 if quick else 30)
    if quick:
        args.rounds = min(args.rounds, 3)
    os.makedirs(args.out, exist_ok=True)

    wall0 = time.perf_counter()
    result: Dict = {"environment": environment(), "pytorch_zerocopy": zc.build_info(), "device": str(device),
                    "batch": args.batch, "vertex_batch": args.vertex_batch, "rounds": args.rounds, "vertex_rounds": args.vertex_rounds,
                    "in_index": not args.no_in_index}
    if has_gpu:
        result["pinned_h2d_GB_per_s"] = pinned_memcpy_gbs(1 << 30)
        result["gpu_memory_peak_bytes"] = 0
    runs = []
    for kind in args.graphs.split(","):
        runs.append(run_graph(kind, scale, placement, device, args))
        if has_gpu:
            result["gpu_memory_peak_bytes"] = max(result["gpu_memory_peak_bytes"], torch.cuda.max_memory_allocated())
    result["runs"] = runs
    result["bars"] = bars_of(runs, placement)
    unified = [r["placements"]["unified"] for r in runs if "unified" in r["placements"]]
    if unified:
        u = unified[0]
        result["unified_pool"] = {"insert_1M_edges_ms": u["uniform"]["insert_ms"],
                                  "delete_1M_edges_ms": u["uniform"]["delete_ms"],
                                  "sampling_dynamic_over_csr": u["sampling"]["dynamic_over_csr"]}
    result["wall_s"] = time.perf_counter() - wall0
    print("bars:", json.dumps(result["bars"], indent=1), flush=True)
    with open(os.path.join(args.out, "dynamic_graph.json"), "w") as f:
        json.dump(result, f, indent=2)
    write_markdown(result, os.path.join(args.out, "dynamic_graph.md"))
    print(f"wrote {args.out}/dynamic_graph.{{json,md}} in {result['wall_s']:.0f} s", flush=True)
    return 0


def write_markdown(r: Dict, path: str) -> None:
    env = r["environment"]
    lines = ["# Dynamic graph updates", "",
             f"{env['date']} · {env.get('gpu') or 'no GPU'} (driver {env.get('driver')}) · torch {env['torch']} · "
             f"device {r['device']} · batches of {r['batch']:,} edges, {r['vertex_batch']:,} vertices", ""]
    if "pinned_h2d_GB_per_s" in r:
        lines += [f"Pinned cudaMemcpy H2D ceiling (same run): {r['pinned_h2d_GB_per_s']:.1f} GB/s", ""]
    lines += ["| graph | pool | insert ms (uniform / focused) | delete ms (uniform / focused / existing) | "
              "sampling dyn / CSR ms | BFS dyn / CSR ms | memory / CSR (before → after) | "
              "vertex ins / del ms, median (range) (del by sweep) |",
              "|---|---|---|---|---|---|---|---|"]
    rebuilds, deletions = [], []
    for run in r["runs"]:
        for pl, p in run["placements"].items():
            name = f"{run['graph']} {run['scale']} ({run['num_edges'] / 1e6:.0f} M)"
            lines.append(
                f"| {name} | {pl} | "
                f"{p['uniform']['insert_ms']:.2f} / {p['focused']['insert_ms']:.2f} | "
                f"{p['uniform']['delete_ms']:.2f} / {p['focused']['delete_ms']:.2f} / "
                f"{p['delete_existing']['delete_ms']:.2f} | "
                f"{p['sampling']['dynamic_ms']:.2f} / {p['sampling']['csr_ms']:.2f} | "
                f"{p['bfs']['dynamic_ms']:.1f} / {p['bfs']['csr_ms']:.1f} | "
                f"{p['memory_before']['allocated_over_csr']:.2f} → {p['memory_after']['allocated_over_csr']:.2f} "
                f"(used {p['memory_after']['used_over_csr']:.2f}) | "
                f"{p['vertices']['insert_100K_ms']:.2f} / {p['vertices']['delete_100K_existing_ms']:.1f}"
                f"{_spread(p['vertices'].get('delete_100K_existing_ms_all'))} "
                f"({p['vertices']['in_edge_lookup']}; sweep {p['vertices']['delete_100K_existing_sweep_ms']:.1f}) |")
            for mode in ("uniform", "focused"):
                w = p[mode]
                if "rebuild_insert_ms" in w:
                    rebuilds.append(f"| {name} | {mode} | {w['insert_ms']:.2f} / {w['rebuild_insert_ms']:.1f} | "
                                    f"{w['insert_vs_rebuild']:.0f} | {w['delete_ms']:.2f} / {w['rebuild_delete_ms']:.1f} "
                                    f"| {w['delete_vs_rebuild']:.0f} | {'yes' if w['rebuild_matches'] else 'NO'} |")
            counts = deletion_counts(p)
            deletions.append(f"| {name} | {pl} | {len(counts)} | "
                             f"{sum(c['batch'] for c in counts):,} | {sum(c['expected'] for c in counts):,} | "
                             f"{sum(c['edges_before'] - c['edges_after'] for c in counts):,} | "
                             f"{p['vertices']['deletion']['expected']:,} |")
    if rebuilds:
        lines += ["", f"Rebuild baseline: the updated edge set sorted into a new CSR on {r['device']} after each batch "
                  "(coo_to_csr), medians; ratio = rebuild / update.", "",
                  "| graph | workload | insert ms: update / rebuild | ratio | delete ms: update / rebuild | ratio | "
                  "same edges as the DynamicGraph |", "|---|---|---|---:|---|---:|---|"] + rebuilds
    lines += ["", "Deletions counted against the snapshot before each batch (all batches of a placement: edge "
              "rounds, existing edges, the vertex batch); every batch's returned count and edge-count change "
              "equal the reference count, or the run stops.", "",
              "| graph | pool | batches | pairs or vertices asked | entries expected (reference) | entries removed | "
              "of which by the vertex batch |", "|---|---|---:|---:|---:|---:|---:|"] + deletions
    lines += ["", "| bar | value |", "|---|---|"]
    for k, v in r["bars"].items():
        lines.append(f"| {k} | {'-' if v is None else v if isinstance(v, bool) else f'{v:.3g}'} |")
    for run in r["runs"]:
        for pl, p in run["placements"].items():
            if "profile" not in p:
                continue
            lines += ["", f"Diagnostic (`--profile`): {run['graph']} {run['scale']}, {pl} pool, one batch of each "
                      "update after the timed ones (torch.profiler; ops by self CPU time, then by self CUDA time on "
                      "a GPU).", ""]
            for step, table in p["profile"].items():
                lines += [f"`{step}`:", "", "```", table, "```", ""]
    lines += ["", f"Wall time {r['wall_s']:.0f} s (graph generation included)."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
