"""Graph analytics on a host-resident graph: BFS, connected components and PageRank, with the
edge list in GPU memory, in host memory read in place by the GPU (zero-copy, EMOGI), or in
CUDA managed memory; the time of each against the GPU memory it needs.

    python examples/graph_analytics.py                          # a generated Kronecker graph, 2^20 vertices
    python examples/graph_analytics.py --scale 12               # seconds on any machine
    python examples/graph_analytics.py --graph web.bel          # EMOGI's .bel files (web.bel.col, .dst)
    python examples/graph_analytics.py --graph soc-LiveJournal1.txt   # a SNAP edge list

Without a GPU every op runs on the CPU (placement "cpu"), and the table has one row.
"""

import argparse
import time

import torch

from pytorch_zerocopy.graph import (CSRGraph, bfs, connected_components, kronecker_graph, load_bel,
                                    load_edge_list, pagerank)


def load(path: str, scale: int) -> CSRGraph:
    if path is None:
        print(f"generating a Kronecker graph of 2^{scale} vertices and 16 x 2^{scale} edges", flush=True)
        return kronecker_graph(scale, edge_factor=16, seed=1, symmetrize=True, progress=True)
    print(f"reading {path}", flush=True)
    if path.endswith(".bel"):
        return load_bel(path, symmetric=True, weights=False, progress=True)
    # SNAP files list each undirected edge once; symmetrize so that components are defined.
    return load_edge_list(path, symmetrize=True, drop_self_loops=True, drop_duplicates=True)


def timed(fn, sync):
    fn()  # warm-up: first-touch costs (managed memory migrates here), kernel loading
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - start


def run(graph: CSRGraph, placement: str, source: int):
    gpu = placement != "cpu"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    if gpu:
        torch.cuda.synchronize()
        before = torch.cuda.mem_get_info()[0]
    placed = graph.to(placement)
    gpu_bytes = before - torch.cuda.mem_get_info()[0] if gpu else 0
    depth, t_bfs = timed(lambda: bfs(placed, source), sync)
    labels, t_cc = timed(lambda: connected_components(placed), sync)
    rank, t_pr = timed(lambda: pagerank(placed, tol=1e-4), sync)
    reached = int((depth >= 0).sum())
    components = int(torch.unique(labels).numel())
    top = int(torch.argmax(rank))
    del placed
    if gpu:
        torch.cuda.empty_cache()  # so the next placement's measurement starts from the same free memory
    return dict(placement=placement, gpu_mib=gpu_bytes / 2**20, bfs=t_bfs, cc=t_cc, pagerank=t_pr,
                reached=reached, components=components, top=top)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", help="a .bel path (EMOGI) or a SNAP / text edge list; default: generate one")
    p.add_argument("--scale", type=int, default=20, help="log2 of the generated graph's vertex count")
    p.add_argument("--source", type=int, default=None, help="BFS source vertex (default: the highest out-degree)")
    args = p.parse_args(argv)

    start = time.perf_counter()
    graph = load(args.graph, args.scale)
    print(f"{graph} ready in {time.perf_counter() - start:.1f} s; edge list {graph.edge_list_bytes / 2**20:.1f} MiB")
    source = int(torch.argmax(graph.out_degree())) if args.source is None else args.source
    placements = ["cuda", "unified", "uvm"] if torch.cuda.is_available() else ["cpu"]
    rows = []
    for placement in placements:
        print(f"{placement}: BFS, connected components and PageRank, each run twice (warm-up, then timed)",
              flush=True)
        try:
            rows.append(run(graph, placement, source))
        except RuntimeError as e:  # e.g. the edge list does not fit in GPU memory
            print(f"{placement}: skipped ({e})")
    print(f"\n{'placement':<10} {'GPU MiB':>9} {'BFS s':>8} {'CC s':>8} {'PageRank s':>11}")
    for r in rows:
        print(f"{r['placement']:<10} {r['gpu_mib']:9.1f} {r['bfs']:8.4f} {r['cc']:8.4f} {r['pagerank']:11.4f}")
    first = rows[0]
    print(f"\nBFS from {source} reached {first['reached']:,} vertices; {first['components']:,} components; "
          f"highest PageRank: vertex {first['top']}")
    for r in rows[1:]:
        assert (r["reached"], r["components"]) == (first["reached"], first["components"]), "placements disagree"


if __name__ == "__main__":
    main()
