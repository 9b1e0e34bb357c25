"""Host page size for the CPU's paths: 4 KiB pages against transparent huge pages and hugetlbfs.

For each page kind this machine allows (``pytorch_zerocopy.host_pages``; the others are listed
with the reason), one feature table and one power-law graph's neighbour lists are placed in
that kind of memory and measured, with fresh random inputs for every timed call:

* ``cpu_gather``: the DMA path's gather stage, ``gather_rows`` on the CPU with every core, of
  ``--rows`` random 512 B rows (GB/s);
* ``cpu_sampler``: ``sampling.sample_layers`` on the CPU, fanouts (15, 10), 1024 seeds
  (ms per minibatch);
* ``cpu_bfs``: ``graph.bfs`` on the CPU over the same lists (ms, one source per call);
* ``gpu_zero_copy`` (with a GPU): ``gather_rows`` of the same rows from the table mapped as a
  unified tensor: the GPU's translation of host memory, for the record.

``huge_bytes`` says how much of each array the kernel backed with huge pages.

    python benchmarks/host_pages.py --out $OUT             # GPU machine: 8 GiB table, 2**24 nodes, ~1 min
    python benchmarks/host_pages.py --quick                 # seconds
    python benchmarks/host_pages.py --table-gib 2 --nodes-log2 22   # a small CPU machine

Writes host_pages.json and host_pages.md under --out (``_quick`` suffix with --quick).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from typing import Callable, Dict, List

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pytorch_zerocopy as zc  # noqa: E402
from benchmarks.common import environment  # noqa: E402
from benchmarks.pipeline_common import write_report  # noqa: E402
from pytorch_zerocopy.graph import CSRGraph, bfs, power_law_graph  # noqa: E402
from pytorch_zerocopy.host_pages import HostPages, empty_host, huge_bytes, huge_page_support  # noqa: E402
from pytorch_zerocopy.sampling import sample_layers  # noqa: E402

GiB = 1 << 30


def median_s(fn: Callable[[int], object], iters: int, sync: bool) -> float:
    fn(-1)
    times = []
    for k in range(iters):
        t0 = time.perf_counter()
        fn(k)
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def placed(src: torch.Tensor, pages: HostPages, shared: bool) -> torch.Tensor:
    dst = empty_host(tuple(src.shape), src.dtype, pages=pages, shared=shared, strict=pages is not HostPages.SMALL)
    dst.copy_(src)
    return dst


def bars(kinds: List[Dict]) -> Dict[str, float]:
    """Each huge-page kind against 4 KiB pages: speed-ups of the CPU gather, sampler and BFS."""
    base = next((k for k in kinds if k["pages"] == "small" and "cpu_gather_gbps" in k), None)
    out: Dict[str, float] = {}
    for k in kinds:
        if base is None or k is base or "cpu_gather_gbps" not in k:
            continue
        out[f"{k['pages']}_cpu_gather_speedup"] = k["cpu_gather_gbps"] / base["cpu_gather_gbps"]
        out[f"{k['pages']}_cpu_sampler_speedup"] = base["cpu_sampler_ms"] / k["cpu_sampler_ms"]
        out[f"{k['pages']}_cpu_bfs_speedup"] = base["cpu_bfs_ms"] / k["cpu_bfs_ms"]
        if "gpu_zero_copy_gbps" in k and "gpu_zero_copy_gbps" in base:
            out[f"{k['pages']}_gpu_zero_copy_speedup"] = k["gpu_zero_copy_gbps"] / base["gpu_zero_copy_gbps"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table-gib", type=float, default=8.0)
    ap.add_argument("--nodes-log2", type=int, default=24)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args()
    if args.quick:
        args.table_gib, args.nodes_log2, args.rows, args.iters = 0.125, 16, 20_000, 3
    torch.set_num_threads(os.cpu_count() or 1)
    gpu = torch.cuda.is_available() and zc.gpu_backed()
    support = huge_page_support()
    width = 128
    rows = int(args.table_gib * GiB) // (width * 4)
    t0 = time.perf_counter()
    graph = power_law_graph(1 << args.nodes_log2, 15.0, seed=1, device="cuda" if gpu else "cpu")
    host_indices = graph.indices.clone()
    print(f"graph: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges ({time.perf_counter() - t0:.1f} s); "
          f"{support}", flush=True)
    gen = torch.Generator().manual_seed(0)
    seed_sets = [torch.randperm(graph.num_nodes, generator=gen)[:1024] for _ in range(args.iters + 1)]
    index_sets = [torch.randint(0, rows, (args.rows,), generator=gen) for _ in range(args.iters + 1)]

    report: Dict = {"benchmark": "host_pages", "machine": environment(), "quick": args.quick,
                    "support": support.__dict__, "table_bytes": rows * width * 4, "nodes": graph.num_nodes,
                    "edges": graph.num_edges, "rows_per_gather": args.rows, "kinds": []}
    for pages in HostPages:
        shared = True
        reason = support.unavailable(pages, True, rows * width * 4 + graph.indices.numel() * 4)
        if reason is not None and pages is HostPages.THP and support.unavailable(pages, False, 0) is None:
            shared, reason = False, None  # private THP still shows what huge pages do for the CPU
        if reason is not None:
            report["kinds"].append({"pages": pages.value, "unavailable": reason})
            print(f"{pages.value}: unavailable: {reason}", flush=True)
            continue
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            table = empty_host((rows, width), torch.float32, pages=pages, shared=shared,
                               strict=pages is not HostPages.SMALL)
            for a in range(0, rows, 1 << 20):
                table[a:a + (1 << 20)].uniform_(-1, 1, generator=gen)
            indices = placed(host_indices, pages, shared)
        rec: Dict = {"pages": pages.value, "shared": shared, "setup_s": time.perf_counter() - t0,
                     "table_huge_bytes": huge_bytes(table), "indices_huge_bytes": huge_bytes(indices)}
        out = torch.empty(args.rows, width)
        t = median_s(lambda k: zc.gather_rows(table, index_sets[k], out), args.iters, False)
        rec["cpu_gather_gbps"] = args.rows * width * 4 / t / 1e9
        g = CSRGraph(graph.indptr, indices, validate=False)
        rec["cpu_sampler_ms"] = 1e3 * median_s(
            lambda k: sample_layers(g, seed_sets[k], [15, 10], edge_dir="out", seed=k + 2), args.iters, False)
        sources = torch.randint(0, graph.num_nodes, (args.iters + 1,), generator=gen).tolist()
        rec["cpu_bfs_ms"] = 1e3 * median_s(lambda k: bfs(g, sources[k]), max(3, args.iters // 3), False)
        if gpu:
            unified = zc.to_unified(table)
            dev_sets = [i.cuda() for i in index_sets]
            dev_out = torch.empty(args.rows, width, device="cuda")
            t = median_s(lambda k: zc.gather_rows(unified, dev_sets[k], dev_out, check_bounds=False), args.iters, True)
            rec["gpu_zero_copy_gbps"] = args.rows * width * 4 / t / 1e9
            del unified
        report["kinds"].append(rec)
        print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()), flush=True)
        del table, indices, g

    base = next((k for k in report["kinds"] if k["pages"] == "small" and "cpu_gather_gbps" in k), None)
    report["bars"] = bars(report["kinds"])
    md = [f"# Host page size: {report['table_bytes'] / GiB:.2f} GiB table, {graph.num_nodes:,}-node power-law graph",
          "", f"{report['machine'].get('gpu') or 'no GPU'}; {report['machine']['cpus']} CPUs; {support}", "",
          "| pages | shared | table huge MiB | lists huge MiB | CPU gather GB/s | CPU sampler ms | CPU BFS ms | "
          "GPU zero-copy GB/s |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for k in report["kinds"]:
        if "unavailable" in k:
            md.append(f"| {k['pages']} | - | - | - | unavailable: {k['unavailable']} | | | |")
            continue
        speed = ""
        if base is not None and k is not base:
            speed = (f" ({k['cpu_gather_gbps'] / base['cpu_gather_gbps']:.2f}x, sampler "
                     f"{base['cpu_sampler_ms'] / k['cpu_sampler_ms']:.2f}x, "
                     f"bfs {base['cpu_bfs_ms'] / k['cpu_bfs_ms']:.2f}x)")
        md.append(f"| {k['pages']}{speed} | {k['shared']} | {k['table_huge_bytes'] >> 20} | "
                  f"{k['indices_huge_bytes'] >> 20} | {k['cpu_gather_gbps']:.2f} | {k['cpu_sampler_ms']:.1f} | {k['cpu_bfs_ms']:.0f} | "
                  f"{k.get('gpu_zero_copy_gbps', float('nan')):.1f} |")
    write_report(args.out, "host_pages" + ("_quick" if args.quick else ""), report, md)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
