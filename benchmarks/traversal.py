"""Graph traversal on host-resident graphs: zero-copy variants against UVM and GPU memory.

For each graph (a Kronecker graph and a uniform-random graph whose int32 edge lists are 8 GiB
each in full mode, and a high-diameter grid) and each op (BFS and SSSP from random sources
of nonzero degree, connected components and PageRank once), the script times:

* ``gpu-memory``    the whole graph in GPU memory (skipped when it does not fit);
* ``copy+gpu``      the DMA baseline: copying the edge list to the GPU with cudaMemcpy
                    (measured once per graph) plus the in-GPU run;
* ``uvm``           the edge list in CUDA managed memory, read-mostly, cold for every run (the
                    pages are sent back to host memory between runs with managed_evict, or the
                    allocation is remade with ``--uvm-mode realloc``, as EMOGI does);
* ``zc-naive``, ``zc-merged``, ``zc-aligned``, ``zc-frontier``: the edge list in unified
                    (host-mapped) memory with each read variant.

It reports seconds, traversed (scanned) edges per second, and the host-read bandwidth those
edges imply (ids, plus weights for SSSP) as a fraction of the pinned cudaMemcpy H2D ceiling
measured in the same run. Results: JSON + Markdown + a PNG bar chart under ``--out``.

Time budget (full mode, one H100/H200, 16 cores): about 8 minutes. Generation of the two
8 GiB graphs takes ~1 minute on the GPU; the default of 8 sources (not 32) per graph keeps
BFS and SSSP within budget, and each configuration stops taking sources after
``--config-seconds`` (default 8; the Markdown says how many sources each row ran, and ratios
are taken over the sources two rows share); ``--budget`` (default 450 s, generation
included) skips whatever is left. ``--sources 32`` runs the full protocol when time allows.
UVM runs are cold: the managed copy of the edge list is made once per graph and its pages
are sent back to host memory before every run (``--uvm-mode realloc`` re-allocates instead,
which costs a CPU-side copy of the edge list per run). Managed memory is never allocated
beyond the GPU's free memory, so here the graph fits on the GPU once faulted in: UVM pays for
the first touch of every page in every run, not for thrashing as in EMOGI's oversubscribed
setting; multi-pass ops (SSSP, PageRank) reuse pages within a run. ``--quick`` is a smoke
test of a few seconds on small graphs (also runs on a machine without a GPU, where only the
host configurations exist).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, Optional

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # python benchmarks/traversal.py from a checkout
    sys.path.insert(0, ROOT)

import pytorch_zerocopy  # noqa: E402
from benchmarks.common import environment as common_environment, pinned_memcpy_gbs  # noqa: E402
from pytorch_zerocopy.graph import (CSRGraph, bfs, connected_components, grid_graph, kronecker_graph, pagerank,
                                    sssp, uniform_random_graph)

ZC_VARIANTS = ["naive", "merged", "aligned", "frontier"]
OPS = ["bfs", "sssp", "cc", "pagerank"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --- environment and ceilings ---------------------------------------------------------------


def environment() -> dict:
    env = common_environment()
    env["pytorch_zerocopy"] = pytorch_zerocopy.__version__
    return env


def memcpy_ceiling_gbs(nbytes: int = 1 << 30, reps: int = 5) -> Optional[float]:
    """Pinned cudaMemcpy host-to-device bandwidth, GB/s (None without a GPU)."""
    return pinned_memcpy_gbs(nbytes, reps) if torch.cuda.is_available() else None


def edge_list_copy_seconds(graph: CSRGraph) -> Optional[float]:
    """cudaMemcpy of the (pinned, unified) edge list into GPU memory: the DMA baseline's cost."""
    if not torch.cuda.is_available():
        return None
    host = [graph.indices.cpu()] + ([graph.weights.cpu()] if graph.weights is not None else [])
    sync()
    t0 = time.perf_counter()
    copies = [h.to("cuda", non_blocking=True) for h in host]
    sync()
    dt = time.perf_counter() - t0
    del copies
    return dt


# --- graphs ---------------------------------------------------------------------------------


def make_graphs(args) -> List[dict]:
    """Specs, generated lazily (one big graph in memory at a time)."""
    # The small grid first: should the time budget run out, it cuts the end of the last graph.
    return [
        {"name": f"grid{args.grid}x{args.grid}", "kind": "grid", "side": args.grid},
        {"name": f"kron{args.kron_scale}", "kind": "kronecker", "scale": args.kron_scale},
        {"name": f"urand{args.urand_scale}", "kind": "urand", "scale": args.urand_scale},
    ]


def build(spec: dict, args, gen_device: str) -> CSRGraph:
    t0 = time.perf_counter()
    if spec["kind"] == "kronecker":
        g = kronecker_graph(spec["scale"], args.edge_factor, seed=args.seed, weights="int", device=gen_device,
                            progress=not args.quick)
    elif spec["kind"] == "urand":
        g = uniform_random_graph(spec["scale"], args.edge_factor, seed=args.seed, weights="int", device=gen_device,
                                 progress=not args.quick)
    else:
        g = grid_graph(spec["side"], spec["side"], weights="int")
    spec["build_seconds"] = time.perf_counter() - t0
    spec["num_nodes"] = g.num_nodes
    spec["num_edges"] = g.num_edges
    spec["edge_list_gib"] = g.num_edges * g.indices.element_size() / 2**30
    log(f"built {spec['name']}: {g.num_nodes} vertices, {g.num_edges} CSR entries "
        f"({spec['edge_list_gib']:.2f} GiB ids) in {spec['build_seconds']:.1f} s")
    return g


def pick_sources(graph: CSRGraph, count: int, seed: int) -> List[int]:
    deg = graph.out_degree().cpu()
    nonzero = torch.nonzero(deg > 0).flatten()
    gen = torch.Generator().manual_seed(seed)
    take = nonzero[torch.randperm(nonzero.numel(), generator=gen)[:count]]
    return [int(s) for s in take]


# --- running ---------------------------------------------------------------------------------


def warm_up(args) -> None:
    """Runs every op and variant once on a tiny graph in every placement, so that no timed run
    pays for loading a kernel."""
    g = kronecker_graph(10, 8, seed=args.seed, weights="int", device="cpu")
    placements = ["unified"]
    if torch.cuda.is_available() and pytorch_zerocopy.build_info()["with_cuda"]:
        placements += ["cuda", "uvm"]
    for placement in placements:
        pg = g.to(placement)
        for op in OPS:
            for variant in ZC_VARIANTS:
                run_op(op, pg, 0, variant, args)
    sync()


def run_op(op: str, graph: CSRGraph, source: Optional[int], variant: str, args):
    if op == "bfs":
        return bfs(graph, source, variant=variant, return_stats=True)[1]
    if op == "sssp":
        return sssp(graph, source, variant=variant, return_stats=True)[1]
    if op == "cc":
        return connected_components(graph, variant=variant, return_stats=True)[1]
    return pagerank(graph, tol=args.pagerank_tol, max_iter=args.pagerank_iters, variant=variant,
                    return_stats=True)[1]


def bytes_per_edge(op: str, graph: CSRGraph) -> int:
    b = graph.indices.element_size()
    if op == "sssp" and graph.weights is not None:
        b += graph.weights.element_size()
    return b


class Clock:
    def __init__(self, budget: float):
        self.start = time.perf_counter()
        self.budget = budget

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)


def time_config(op: str, graph, sources: List[Optional[int]], variant: str, args, clock: Clock,
                before_each=None) -> dict:
    """Runs op from each source (or once) until the per-config cap; returns per-run rows.

    ``graph`` is a CSRGraph, or a callable returning the graph to use, asked after
    ``before_each`` (which may replace it, as the cold UVM runs do)."""
    runs = []
    spent = 0.0
    for s in sources:
        if clock.left() <= 0 or (runs and spent >= args.config_seconds):
            break
        if before_each is not None:
            before_each()
        g = graph() if callable(graph) else graph
        sync()
        t0 = time.perf_counter()
        stats = run_op(op, g, s, variant, args)
        sync()
        dt = time.perf_counter() - t0
        spent += dt
        stats = stats.cpu()
        runs.append({"source": s, "seconds": dt, "edges": int(stats[0]), "iterations": int(stats[1])})
    return {"runs": runs}


def summarize(row: dict, op: str, graph: CSRGraph, ceiling: Optional[float]) -> None:
    runs = row["runs"]
    if not runs:
        return
    secs = np.array([r["seconds"] for r in runs])
    edges = np.array([r["edges"] for r in runs], dtype=np.float64)
    row["sources_run"] = len(runs)
    row["mean_seconds"] = float(secs.mean())
    row["teps"] = float(edges.sum() / secs.sum())
    row["read_gbs"] = float(edges.sum() * bytes_per_edge(op, graph) / secs.sum() / 1e9)
    row["read_vs_ceiling"] = None if not ceiling else row["read_gbs"] / ceiling
    if op == "cc":
        # CC's job is one pass over the edge list: its time against streaming the whole list
        # once. A variant that skips lists reads fewer bytes than this counts.
        whole = graph.indices.numel() * graph.indices.element_size()
        row["edge_list_gbs"] = float(whole * len(runs) / secs.sum() / 1e9)
        row["edge_list_vs_ceiling"] = None if not ceiling else row["edge_list_gbs"] / ceiling
        row["fraction_of_edge_list_read"] = float(edges.mean() / max(1, graph.indices.numel()))


def bench_graph(spec: dict, graph: CSRGraph, args, clock: Clock, ceiling: Optional[float]) -> List[dict]:
    gpu = torch.cuda.is_available() and pytorch_zerocopy.gpu_backed()
    sources = pick_sources(graph, args.sources, args.seed)
    rows: List[dict] = []

    def record(op, config, variant, row):
        row.update({"graph": spec["name"], "op": op, "config": config, "variant": variant})
        summarize(row, op, graph, ceiling)
        rows.append(row)
        if row.get("sources_run"):
            log(f"{spec['name']:>14} {op:>8} {config:>12}: {row['mean_seconds'] * 1e3:9.2f} ms/run, "
                f"{row['teps'] / 1e9:7.2f} GTEPS, {row['read_gbs']:6.1f} GB/s over {row['sources_run']} runs")
        else:
            log(f"{spec['name']:>14} {op:>8} {config:>12}: skipped ({row.get('skipped', 'time budget')})")

    def op_sources(op):
        return sources if op in ("bfs", "sssp") else [None]

    ops = [o for o in OPS if o in args.ops]
    # Zero-copy (host-mapped edge list; the CPU fallback on a machine without a GPU). The
    # unified graph maps the generated host arrays in place, which also pins them for the
    # cudaMemcpy of the DMA baseline.
    zc = graph.to("unified")
    copy_seconds = edge_list_copy_seconds(zc) if gpu else None
    spec["edge_list_copy_seconds"] = copy_seconds
    for op in ops:
        for variant in ZC_VARIANTS:
            if variant not in args.variants:
                continue
            if not gpu:  # the CPU runs one implementation for every variant
                record(op, "cpu-fallback", variant, time_config(op, zc, op_sources(op), variant, args, clock))
                break
            record(op, f"zc-{variant}", variant, time_config(op, zc, op_sources(op), variant, args, clock))
    del zc
    if not gpu:
        return rows
    # Whole graph in GPU memory, and the copy-then-run DMA baseline.
    free, _ = torch.cuda.mem_get_info()
    if graph.edge_list_bytes * 1.2 + graph.num_nodes * 64 < free:
        dev = graph.to("cuda")
        for op in ops:
            row = time_config(op, dev, op_sources(op), "aligned", args, clock)
            record(op, "gpu-memory", "aligned", row)
            if copy_seconds is not None and row["runs"]:
                base = {"runs": [dict(r, seconds=r["seconds"] + copy_seconds) for r in row["runs"]]}
                record(op, "copy+gpu", "aligned", base)
        del dev
        torch.cuda.empty_cache()
    else:
        for op in ops:
            record(op, "gpu-memory", "aligned", {"runs": [], "skipped": "does not fit in GPU memory"})
    # UVM: managed memory, read-mostly, cold for every run.
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if graph.edge_list_bytes + graph.num_nodes * 64 >= free:
        for op in ops:
            record(op, "uvm", "aligned", {"runs": [], "skipped": "managed copy would exceed free GPU memory"})
        return rows
    holder = {"g": None}

    def cold():
        if args.uvm_mode == "realloc" or holder["g"] is None:
            holder["g"] = None
            holder["g"] = graph.to("uvm")
        else:
            for t in (holder["g"].indices, holder["g"].weights):
                if t is not None:
                    torch.ops.zerocopy.managed_evict.default(t)

    for op in ops:
        if clock.left() <= 0:
            record(op, "uvm", "aligned", {"runs": []})
            continue
        record(op, "uvm", "aligned", time_config(op, lambda: holder["g"], op_sources(op), "aligned", args, clock,
                                                  before_each=cold))
    holder["g"] = None
    torch.cuda.empty_cache()
    return rows


# --- checks, reports --------------------------------------------------------------------------


def common_ratio(rows: List[dict], graph: str, op: str, num: str, den: str) -> Optional[float]:
    """Mean over common sources of time(den) / time(num): how many times faster num is."""
    by = {r["config"]: r for r in rows if r["graph"] == graph and r["op"] == op}
    if num not in by or den not in by:
        return None
    a = {r["source"]: r["seconds"] for r in by[num]["runs"]}
    b = {r["source"]: r["seconds"] for r in by[den]["runs"]}
    common = [s for s in a if s in b]
    if not common:
        return None
    return float(np.mean([b[s] / a[s] for s in common]))


def checks(rows: List[dict], graphs: List[dict]) -> List[dict]:
    out = []
    # EMOGI's protocol: BFS, SSSP and CC on the large graphs.
    big = [g for g in graphs if g["kind"] != "grid"]
    ratios = [common_ratio(rows, g["name"], op, "zc-aligned", "uvm") for g in big for op in ("bfs", "sssp", "cc")]
    ratios = [r for r in ratios if r is not None]
    out.append({"check": "zero-copy aligned vs UVM, mean speedup (BFS, SSSP, CC on the large graphs, as EMOGI)",
                "want": ">= 3", "value": float(np.mean(ratios)) if ratios else None,
                "pass": bool(ratios) and float(np.mean(ratios)) >= 3.0})
    every = [common_ratio(rows, g["name"], op, "zc-aligned", "uvm") for g in graphs for op in OPS]
    every = [r for r in every if r is not None]
    out.append({"check": "zero-copy aligned vs UVM, mean speedup over every graph and op (information)",
                "want": "-", "value": float(np.mean(every)) if every else None, "pass": bool(every)})
    for g in graphs:
        if g["kind"] == "grid":
            continue
        cc = [r for r in rows if r["graph"] == g["name"] and r["op"] == "cc" and r["config"].startswith("zc-")
              and r.get("edge_list_vs_ceiling") is not None]
        best = max(cc, key=lambda r: r["edge_list_vs_ceiling"], default=None)
        read = f", {best['fraction_of_edge_list_read']:.0%} of it read" if best else ""
        out.append({"check": f"CC edge-list rate on {g['name']} ({best['config'] if best else '-'}{read}): "
                             f"edge-list bytes / time vs memcpy ceiling", "want": ">= 0.8",
                    "value": best["edge_list_vs_ceiling"] if best else None,
                    "pass": bool(best) and best["edge_list_vs_ceiling"] >= 0.8})
    for g in graphs:
        if g["kind"] != "grid":
            continue
        for op in ("bfs", "sssp"):
            r = common_ratio(rows, g["name"], op, "zc-frontier", "zc-aligned")
            out.append({"check": f"frontier vs aligned on {g['name']} {op} (speedup)", "want": "> 1",
                        "value": r, "pass": r is not None and r > 1.0})
    return out


def write_markdown(path: str, result: dict) -> None:
    env = result["environment"]
    lines = ["# Graph traversal on host-resident graphs", "",
             f"- date: {env['date']}", f"- device: {env['gpu'] or 'CPU only'} (driver {env['driver']}, "
             f"CUDA {env['cuda']}), torch {env['torch']}, {env['cpus']} CPUs",
             "- pinned cudaMemcpy H2D ceiling: "
             + (f"{result['ceiling_gbs']:.1f} GB/s" if result["ceiling_gbs"] else "n/a (no GPU)"),
             f"- mode: {'quick' if result['args']['quick'] else 'full'}; sources per BFS/SSSP: "
             f"{result['args']['sources']} (each configuration stops after {result['args']['config_seconds']} s); "
             f"UVM runs cold ({result['args']['uvm_mode']})", "", "## Graphs", "",
             "| graph | vertices | CSR entries | edge list (GiB, int32) | build (s) | cudaMemcpy of edge list (s) |",
             "|---|---:|---:|---:|---:|---:|"]
    for g in result["graphs"]:
        cp = g.get("edge_list_copy_seconds")
        lines.append(f"| {g['name']} | {g.get('num_nodes', '-')} | {g.get('num_edges', '-')} | "
                     f"{g.get('edge_list_gib', 0):.2f} | {g.get('build_seconds', 0):.1f} | "
                     f"{'-' if cp is None else f'{cp:.3f}'} |")
    lines += ["", "## Results", "",
              "| graph | op | config | runs | mean s | GTEPS | host-read GB/s | x ceiling | x UVM |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        if not r.get("sources_run"):
            lines.append(f"| {r['graph']} | {r['op']} | {r['config']} | 0 | skipped: {r.get('skipped', 'budget')} "
                         "| | | | |")
            continue
        vs_uvm = common_ratio(result["rows"], r["graph"], r["op"], r["config"], "uvm")
        ceil = r.get("read_vs_ceiling")
        lines.append(f"| {r['graph']} | {r['op']} | {r['config']} | {r['sources_run']} | {r['mean_seconds']:.4f} | "
                     f"{r['teps'] / 1e9:.2f} | {r['read_gbs']:.1f} | {'-' if ceil is None else f'{ceil:.2f}'} | "
                     f"{'-' if vs_uvm is None else f'{vs_uvm:.2f}'} |")
    lines += ["", "Host-read GB/s counts the bytes of the neighbour lists (and weights for SSSP) the op "
              "scanned, divided by its time; for `gpu-memory` and `copy+gpu` it is the same figure for "
              "comparison, although no host memory is read during the run.", ""]
    cc_rows = [r for r in result["rows"] if r["op"] == "cc" and r.get("edge_list_gbs") is not None]
    if cc_rows:
        lines += ["CC against one pass over the edge list (edge-list bytes / time; the sampled `zc-frontier` "
                  "skips the lists of vertices already in the largest component):", "",
                  "| graph | config | edge-list GB/s | x ceiling | share of edge list read |", "|---|---|---:|---:|---:|"]
        for r in cc_rows:
            ceil = r.get("edge_list_vs_ceiling")
            lines.append(f"| {r['graph']} | {r['config']} | {r['edge_list_gbs']:.1f} | "
                         f"{'-' if ceil is None else f'{ceil:.2f}'} | {r['fraction_of_edge_list_read']:.1%} |")
        lines.append("")
    lines += ["## Checks", "",
              "| check | want | value | pass |", "|---|---|---:|---|"]
    for c in result["checks"]:
        v = c["value"]
        lines.append(f"| {c['check']} | {c['want']} | {'-' if v is None else f'{v:.2f}'} | "
                     f"{'yes' if c['pass'] else 'no'} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(path: str, result: dict) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in result["rows"] if r.get("sources_run")]
    groups = []
    for r in rows:
        key = (r["graph"], r["op"])
        if key not in groups:
            groups.append(key)
    configs = []
    for r in rows:
        if r["config"] not in configs:
            configs.append(r["config"])
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(groups)), 4.5))
    width = 0.8 / max(1, len(configs))
    for i, cfg in enumerate(configs):
        vals = []
        for g in groups:
            match = [r for r in rows if (r["graph"], r["op"]) == g and r["config"] == cfg]
            vals.append(match[0]["teps"] / 1e9 if match else 0.0)
        ax.bar(np.arange(len(groups)) + i * width, vals, width, label=cfg)
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2)
    ax.set_xticklabels([f"{g}\n{o}" for g, o in groups], fontsize=8)
    ax.set_ylabel("GTEPS (scanned edges / s)")
    ax.set_yscale("log")
    ax.set_title(f"Traversal on host-resident graphs, {result['environment']['gpu'] or 'CPU'}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small graphs, a smoke test of a few seconds")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--kron-scale", type=int, default=None, help="default 26 (8 GiB int32 edge list), quick 14")
    p.add_argument("--urand-scale", type=int, default=None, help="default 26, quick 14")
    p.add_argument("--edge-factor", type=int, default=16)
    p.add_argument("--grid", type=int, default=None, help="grid side; default 4096, quick 96")
    p.add_argument("--sources", type=int, default=None, help="BFS/SSSP sources per graph; default 8, quick 2")
    p.add_argument("--config-seconds", type=float, default=None,
                   help="stop taking sources for a configuration after this many seconds (default 8)")
    p.add_argument("--budget", type=float, default=None, help="skip what is left after this many seconds "
                                                              "(default 450)")
    p.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    p.add_argument("--variants", nargs="+", default=ZC_VARIANTS, choices=ZC_VARIANTS)
    p.add_argument("--uvm-mode", choices=["evict", "realloc"], default="evict")
    p.add_argument("--pagerank-tol", type=float, default=1e-3)
    p.add_argument("--pagerank-iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    q = args.quick
    args.kron_scale = args.kron_scale or (14 if q else 26)
    args.urand_scale = args.urand_scale or (14 if q else 26)
    args.grid = args.grid or (96 if q else 4096)
    args.sources = args.sources or (2 if q else 8)
    args.config_seconds = args.config_seconds or (5.0 if q else 8.0)
    args.budget = args.budget or (120.0 if q else 450.0)
    os.makedirs(args.out, exist_ok=True)

    clock = Clock(args.budget)
    env = environment()
    log(f"device: {env['gpu'] or 'CPU only'}; torch {env['torch']}")
    ceiling = memcpy_ceiling_gbs()
    if ceiling:
        log(f"pinned memcpy H2D ceiling: {ceiling:.1f} GB/s")
    warm_up(args)
    gen_device = "cuda" if torch.cuda.is_available() else "cpu"
    graphs = make_graphs(args)
    rows: List[dict] = []
    for spec in graphs:
        if clock.left() <= 0:
            log(f"skipping {spec['name']}: time budget spent")
            continue
        graph = build(spec, args, gen_device)
        rows += bench_graph(spec, graph, args, clock, ceiling)
        del graph
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    result = {"environment": env, "args": vars(args), "ceiling_gbs": ceiling, "graphs": graphs, "rows": rows}
    result["checks"] = checks(rows, graphs)
    stem = "traversal_quick" if q else "traversal"
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    write_markdown(os.path.join(args.out, stem + ".md"), result)
    plotted = write_plot(os.path.join(args.out, stem + ".png"), result)
    for c in result["checks"]:
        v = c["value"]
        log(f"check: {c['check']}: {'-' if v is None else f'{v:.2f}'} (want {c['want']}) "
            f"{'PASS' if c['pass'] else 'FAIL'}")
    log(f"wrote {args.out}/{stem}.json, .md{', .png' if plotted else ''} in "
        f"{time.perf_counter() - clock.start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
