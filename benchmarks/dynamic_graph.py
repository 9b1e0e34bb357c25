"""Dynamic graph updates on the GPU: batched edge and vertex insertions and deletions on a
DynamicGraph, against rebuilding the CSR, and sampling / BFS on the updated graph against its CSR
snapshot.

Graphs: Kronecker (Graph500 R-MAT) and uniform random, scale 24, edge factor 16, symmetrized
(>= 500 M list entries each), generated on the GPU. The DynamicGraph is built from the CSR with
``symmetric=False``, so one update is one list entry (the thesis counts updates the same way).
Workloads, faimGraph's (thesis Figures 4.11 and 4.13): batches of 1 M edge insertions with
uniform random sources and destinations, then deletion of the same edges (the graph returns to
its edge set, so 10 rounds measure reuse of freed pages), and the same with sources focused on
a window of 1000 vertices that sweeps over the graph; deletion of 1 M existing edges; 100 K
vertex insertions and deletions. Every time is a CUDA-event interval around the user's call
(checks, sorting, duplicate removal and the host synchronisations included), the median over
the rounds after one warm-up round.

Baselines in the same run: rebuilding the CSR with the library's builder
(``CSRGraph.from_coo`` on the CPU, what a static graph needs for any update; measured on a
prefix of the edge list and scaled linearly to the whole graph, a lower bound since the build
sorts; ``--full-rebuild`` measures the whole graph), and sampling (GraphSAGE's fanouts 15, 10,
batches of 1024 seeds, every batch freshly sampled) and BFS on the CSR snapshot of the updated
graph, with identical results checked. The unified variant keeps the page pool in host memory
mapped for the GPU. Memory: the DynamicGraph's bytes (allocated, and in use) against the CSR's
(int64 offsets, int32 ids), before and after the 10 update rounds.

    python benchmarks/dynamic_graph.py            # GPU, both graphs, ~3-4 min on one H100
    python benchmarks/dynamic_graph.py --scale 20 # GPU, medium graphs, ~40 s
    python benchmarks/dynamic_graph.py --quick    # CPU, seconds

Writes dynamic_graph.json (top-level "bars") and dynamic_graph.md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pytorch_zerocopy as zc  # noqa: E402
from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from pytorch_zerocopy import sampling as S  # noqa: E402
from pytorch_zerocopy.graph import CSRGraph, DynamicGraph, bfs, kronecker_graph, uniform_random_graph  # noqa: E402
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


def update_rounds(dg: DynamicGraph, rounds: int, batch: int, focus: int, clock: Clock, gen: torch.Generator) -> Dict:
    """Insert a random batch, delete it again; ``rounds`` timed rounds after a warm-up."""
    n = dg.num_nodes
    ins, dels, added = [], [], []
    for r in range(rounds + 1):
        if focus:
            base = (r * (n - focus)) // max(rounds, 1)
            src = base + torch.randint(0, focus, (batch,), device=dg.device, generator=gen)
        else:
            src = torch.randint(0, n, (batch,), device=dg.device, generator=gen)
        dst = torch.randint(0, n, (batch,), device=dg.device, generator=gen)
        src, dst = absent_batch(dg, src, dst)
        count, t_ins = clock(lambda: dg.insert_edges(src, dst))
        removed, t_del = clock(lambda: dg.delete_edges(src, dst))
        assert removed == count, (removed, count)
        if r:
            ins.append(t_ins)
            dels.append(t_del)
            added.append(count)
    return {"insert_ms": median(ins), "delete_ms": median(dels), "insert_ms_all": ins, "delete_ms_all": dels,
            "batch": batch, "inserted_per_batch": median(added),
            "updates_per_s": batch / (median(ins) / 1e3)}


def delete_existing(dg: DynamicGraph, batch: int, clock: Clock, gen: torch.Generator) -> Dict:
    """Delete `batch` existing edges (uniform over list entries; every parallel copy goes), then
    insert them back (one copy each); median of 3 after a warm-up."""
    snap = dg.to_csr()
    times_del, times_ins = [], []
    for r in range(4):
        pos = torch.randint(0, snap.num_edges, (batch,), device=dg.device, generator=gen)
        src = torch.searchsorted(snap.indptr, pos, right=True) - 1
        dst = snap.indices[pos].long()
        key = torch.unique(src * dg.num_nodes + dst)
        src, dst = key // dg.num_nodes, key % dg.num_nodes
        removed, t_del = clock(lambda: dg.delete_edges(src, dst))
        added, t_ins = clock(lambda: dg.insert_edges(src, dst))
        if r:
            times_del.append(t_del)
            times_ins.append(t_ins)
    return {"delete_ms": median(times_del), "reinsert_ms": median(times_ins), "batch": batch}


def vertex_updates(dg: DynamicGraph, count: int, clock: Clock, gen: torch.Generator) -> Dict:
    n0 = dg.num_nodes
    new, t_ins = clock(lambda: dg.insert_vertices(count))
    _, t_del_new = clock(lambda: dg.delete_vertices(new))
    victims = torch.randperm(n0, device=dg.device, generator=gen)[:count]
    edges0 = dg.num_edges
    removed, t_del = clock(lambda: dg.delete_vertices(victims))
    _, t_reuse = clock(lambda: dg.insert_vertices(count))
    return {"insert_100K_ms": t_ins, "delete_100K_new_ms": t_del_new, "delete_100K_existing_ms": t_del,
            "edges_removed": removed, "edges_before": edges0, "reinsert_reused_ids_ms": t_reuse, "count": count}


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


def rebuild(g: CSRGraph, max_edges: int) -> Dict:
    """CSRGraph.from_coo on (a prefix of) the graph's edge list, on the CPU."""
    indptr = g.indptr.cpu()
    rows = int(torch.searchsorted(indptr, torch.tensor([min(max_edges, g.num_edges)]), right=True)[0]) - 1
    rows = max(1, min(rows, g.num_nodes))
    edges = int(indptr[rows])
    src = torch.repeat_interleave(torch.arange(rows), indptr[1:rows + 1] - indptr[:rows])
    dst = g.indices.cpu()[:edges]
    t0 = time.perf_counter()
    CSRGraph.from_coo(src, dst, g.num_nodes)
    seconds = time.perf_counter() - t0
    return {"measured_edges": edges, "measured_s": seconds, "graph_edges": g.num_edges,
            "rebuild_s": seconds * g.num_edges / max(edges, 1), "extrapolated": edges < g.num_edges,
            "cpu_threads": torch.get_num_threads()}


def run_graph(kind: str, scale: int, placement: str, device: torch.device, args) -> Dict:
    out: Dict = {"graph": kind, "scale": scale, "placement": placement}
    g, gen_s = generate(kind, scale, device)
    out.update(num_nodes=g.num_nodes, num_edges=g.num_edges, generate_s=gen_s, csr_bytes=csr_bytes(g),
               max_degree=int((g.indptr[1:] - g.indptr[:-1]).max()))
    print(f"{kind} {scale}: {g.num_nodes:,} vertices, {g.num_edges:,} entries ({gen_s:.1f} s)", flush=True)
    results = {}
    for pl in ([placement, "unified"] if not args.no_unified and kind == "kronecker" else [placement]):
        results[pl] = run_placement(g, pl, device, args)
    out["placements"] = results
    if args.rebuild_edges > 0 and kind == "kronecker":
        out["rebuild"] = rebuild(g, g.num_edges if args.full_rebuild else args.rebuild_edges)
        print(f"  rebuild (from_coo): {out['rebuild']}", flush=True)
    del g
    return out


def run_placement(g: CSRGraph, placement: str, device: torch.device, args) -> Dict:
    clock = Clock(device)
    gen = torch.Generator(device=device).manual_seed(7)
    t0 = time.perf_counter()
    dg = DynamicGraph.from_csr(g, placement=placement, page_size=args.page_size, headroom=args.headroom,
                               symmetric=False)
    if device.type == "cuda":
        torch.cuda.synchronize()
    r: Dict = {"build_s": time.perf_counter() - t0, "page_size": args.page_size}
    csr = csr_bytes(g)
    r["memory_before"] = memory_entry(dg, csr)
    rounds = args.rounds if placement != "unified" else max(2, args.rounds // 3)
    r["uniform"] = update_rounds(dg, rounds, args.batch, 0, clock, gen)
    r["focused"] = update_rounds(dg, rounds, args.batch, FOCUS, clock, gen)
    r["memory_after"] = memory_entry(dg, csr)
    r["rounds"] = rounds
    print(f"  [{placement}] build {r['build_s']:.1f} s; insert/delete uniform {r['uniform']['insert_ms']:.2f}/"
          f"{r['uniform']['delete_ms']:.2f} ms, focused {r['focused']['insert_ms']:.2f}/"
          f"{r['focused']['delete_ms']:.2f} ms; memory {r['memory_before']['allocated_over_csr']:.2f}x CSR "
          f"-> {r['memory_after']['allocated_over_csr']:.2f}x", flush=True)
    r["delete_existing"] = delete_existing(dg, args.batch, clock, gen)
    snap = dg.to_csr()
    if placement == "unified" and device.type == "cuda":
        snap = snap.to("unified")
    r["sampling"] = sampling_compare(dg, snap, clock, args.sample_batches, gen)
    r["bfs"] = bfs_compare(dg, snap, clock)
    del snap
    r["vertices"] = vertex_updates(dg, args.vertex_batch, clock, gen)
    print(f"  [{placement}] sampling dyn/csr {r['sampling']['dynamic_over_csr']:.2f} "
          f"({r['sampling']['dynamic_ms']:.2f} vs {r['sampling']['csr_ms']:.2f} ms); bfs dyn/csr "
          f"{r['bfs']['dynamic_over_csr']:.2f}; vertices {r['vertices']}", flush=True)
    del dg
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return r


def bars_of(runs: List[Dict], primary: str) -> Dict:
    ins, dels, samp, mem_b, mem_a = [], [], [], [], []
    ratio = None
    for run in runs:
        p = run["placements"].get(primary)
        if p is None:
            continue
        for mode in ("uniform", "focused"):
            ins.append(p[mode]["insert_ms"])
            dels.append(p[mode]["delete_ms"])
        dels.append(p["delete_existing"]["delete_ms"])
        samp.append(p["sampling"]["dynamic_over_csr"])
        mem_b.append(p["memory_before"]["allocated_over_csr"])
        mem_a.append(p["memory_after"]["allocated_over_csr"])
        if "rebuild" in run:
            ratio = run["rebuild"]["rebuild_s"] * 1e3 / max(p["uniform"]["insert_ms"], p["uniform"]["delete_ms"])
    bars = {
        "insert_1M_edges_ms": max(ins),
        "delete_1M_edges_ms": max(dels),
        "sampling_dynamic_over_csr": max(samp),
        "memory_over_csr_before": max(mem_b),
        "memory_over_csr_after_10_rounds": max(mem_a),
    }
    if ratio is not None:
        bars["update_vs_rebuild"] = ratio
    bars["insert_ok"] = bars["insert_1M_edges_ms"] <= 10
    bars["delete_ok"] = bars["delete_1M_edges_ms"] <= 10
    bars["sampling_ok"] = bars["sampling_dynamic_over_csr"] <= 1.5
    if ratio is not None:
        bars["update_vs_rebuild_ok"] = ratio >= 100
    return bars


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CPU, small graphs, seconds")
    ap.add_argument("--scale", type=int, default=None, help="graph scale (default 24; --quick 11)")
    ap.add_argument("--batch", type=int, default=None, help="edges per update batch (default 1 M)")
    ap.add_argument("--vertex-batch", type=int, default=None, help="vertices per vertex batch (default 100 K)")
    ap.add_argument("--rounds", type=int, default=10, help="timed insert + delete rounds")
    ap.add_argument("--sample-batches", type=int, default=None, help="timed sampling batches")
    ap.add_argument("--page-size", type=int, default=32)
    ap.add_argument("--headroom", type=float, default=0.25)
    ap.add_argument("--rebuild-edges", type=int, default=None,
                    help="edges of the from_coo rebuild measurement (default 32 M; 0: skip)")
    ap.add_argument("--full-rebuild", action="store_true", help="rebuild the whole graph (minutes at scale 24)")
    ap.add_argument("--no-unified", action="store_true", help="skip the unified-pool variant")
    ap.add_argument("--graphs", default="kronecker,uniform")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args()

    quick = args.quick
    has_gpu = torch.cuda.is_available() and not quick
    device = torch.device("cuda") if has_gpu else torch.device("cpu")
    placement = "cuda" if has_gpu else "cpu"
    scale = args.scale or (11 if quick else 24)
    args.batch = args.batch or (10_000 if quick else 1_000_000)
    args.vertex_batch = args.vertex_batch or (1_000 if quick else 100_000)
    args.sample_batches = args.sample_batches or (5 if quick else 30)
    if quick:
        args.rounds = min(args.rounds, 3)
    if args.rebuild_edges is None:
        args.rebuild_edges = 1 << 25
    os.makedirs(args.out, exist_ok=True)

    wall0 = time.perf_counter()
    result: Dict = {"environment": environment(), "pytorch_zerocopy": zc.build_info(), "device": str(device),
                    "batch": args.batch, "vertex_batch": args.vertex_batch, "rounds": args.rounds}
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
              "sampling dyn / CSR ms | BFS dyn / CSR ms | memory / CSR (before → after) | vertex ins / del ms |",
              "|---|---|---|---|---|---|---|---|"]
    notes = []
    for run in r["runs"]:
        for pl, p in run["placements"].items():
            lines.append(
                f"| {run['graph']} {run['scale']} ({run['num_edges'] / 1e6:.0f} M) | {pl} | "
                f"{p['uniform']['insert_ms']:.2f} / {p['focused']['insert_ms']:.2f} | "
                f"{p['uniform']['delete_ms']:.2f} / {p['focused']['delete_ms']:.2f} / "
                f"{p['delete_existing']['delete_ms']:.2f} | "
                f"{p['sampling']['dynamic_ms']:.2f} / {p['sampling']['csr_ms']:.2f} | "
                f"{p['bfs']['dynamic_ms']:.1f} / {p['bfs']['csr_ms']:.1f} | "
                f"{p['memory_before']['allocated_over_csr']:.2f} → {p['memory_after']['allocated_over_csr']:.2f} "
                f"(used {p['memory_after']['used_over_csr']:.2f}) | "
                f"{p['vertices']['insert_100K_ms']:.2f} / {p['vertices']['delete_100K_existing_ms']:.1f} |")
        if "rebuild" in run:
            rb = run["rebuild"]
            notes.append(f"Rebuild with CSRGraph.from_coo on the CPU ({run['graph']}, {rb['cpu_threads']} threads): "
                         f"{rb['measured_s']:.2f} s for {rb['measured_edges']:,} edges → {rb['rebuild_s']:.1f} s "
                         "for the graph" + (" (scaled linearly: a lower bound)" if rb["extrapolated"] else "") + ".")
    lines += [""] + notes + ["", "| bar | value |", "|---|---|"]
    for k, v in r["bars"].items():
        lines.append(f"| {k} | {v if isinstance(v, bool) else f'{v:.3g}'} |")
    lines += ["", f"Wall time {r['wall_s']:.0f} s (graph generation included)."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
