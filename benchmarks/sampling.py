"""Neighbour sampling throughput: GPU sampling from host memory (unified), from GPU memory, and
CPU sampling (this package, all cores; PyG's pyg-lib / torch-sparse CPU samplers if importable).

Graph: a power-law graph (Pareto list lengths, endpoints skewed towards popular nodes) with
>= 1 B edges, int32 neighbour ids, generated on the GPU in chunks and written straight into
shared host memory that is mapped for the GPU (no second host copy). Workload: DGL-style
3-layer sampling, fanouts (15, 10, 5) in DGL's order (the seeds sample 5, their neighbours 10,
the next hop 15; PyG is given the same per-hop counts), batches of 1024 seed nodes drawn
uniformly; a batch's
cost includes the compaction of every layer (unique nodes, relabelled edges), i.e. what the
data loader does per batch. Metric: sampled edges per second (sum over the three layers).
Also measured in the same run: the pinned cudaMemcpy H2D ceiling, and the kernel alone on one
layer (200 k seeds, fanout 10). The DMA-style baseline is CPU sampling followed by copying the
sampled layers to the GPU.

    python benchmarks/sampling.py            # full run, < 7 min on a 16-core host + one H100/H200
    python benchmarks/sampling.py --quick    # seconds; small graph (works without a GPU)

Writes sampling.json, sampling.md and sampling.png (if matplotlib imports) under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pytorch_zerocopy as zc  # noqa: E402
from benchmarks.common import environment as common_environment, pinned_memcpy_gbs  # noqa: E402
from pytorch_zerocopy import sampling as S  # noqa: E402

FANOUTS = [15, 10, 5]


# ---------------------------------------------------------------------------------------------
# Graph generation.


def generate_graph(num_nodes: int, avg_degree: float, max_degree: int, seed: int, device: torch.device):
    """CSR with Pareto(alpha=2.2) list lengths and Chung-Lu-like endpoints, in shared host
    memory mapped for the GPU. Returns unified (indptr int64, indices int32) and the time."""
    t0 = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(seed)
    alpha = 2.2
    u = torch.rand(num_nodes, generator=gen, device=device, dtype=torch.float64)
    raw = (u.clamp_min(1e-12).pow(-1.0 / alpha)).clamp_(max=max_degree / avg_degree * 4)
    deg = (raw * (avg_degree / float(raw.mean()))).floor_().clamp_(0, max_degree).long()
    indptr_dev = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(deg, 0, out=indptr_dev[1:])
    total = int(indptr_dev[-1])
    indptr = zc.empty_unified(num_nodes + 1, torch.int64)
    indptr.cpu().copy_(indptr_dev)
    del indptr_dev, deg, raw, u
    indices = zc.empty_unified(total, torch.int32)
    host = indices.cpu()
    chunk = 1 << 27
    # Endpoint rank r = floor(N * x^3), x uniform: popular low ranks; ranks are scattered over
    # ids by an odd multiplier modulo N (a bijection for N a power of two).
    assert num_nodes & (num_nodes - 1) == 0, "num_nodes must be a power of two"
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        x = torch.rand(n, generator=gen, device=device)
        rank = (x * x * x * num_nodes).long().clamp_(max=num_nodes - 1)
        ids = (rank * 2654435761 + 97) & (num_nodes - 1)
        host[start:start + n].copy_(ids.to(torch.int32))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return indptr, indices, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# Measurements.


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_batches(step: Callable[[torch.Tensor], int], num_nodes: int, device: torch.device,
                warmup: int, min_batches: int, budget_s: float, seed: int) -> Dict:
    """Runs sampling batches until both min_batches and budget_s are reached; returns rates."""
    gen = torch.Generator().manual_seed(seed)

    def make() -> torch.Tensor:
        """1024 distinct node ids, uniform, in random order."""
        if num_nodes < (1 << 22):
            return torch.randperm(num_nodes, generator=gen)[:1024]
        ids = torch.unique(torch.randint(0, num_nodes, (1100,), generator=gen))
        return ids[torch.randperm(ids.numel(), generator=gen)[:1024]]

    for _ in range(warmup):
        step(make())
    sync(device)
    times: List[float] = []
    edges: List[int] = []
    start = time.perf_counter()
    while len(times) < min_batches or (time.perf_counter() - start < budget_s and len(times) < 10000):
        seeds = make()
        t0 = time.perf_counter()
        e = step(seeds)
        sync(device)
        times.append(time.perf_counter() - t0)
        edges.append(e)
    total_t = sum(times)
    return {
        "batches": len(times),
        "sampled_edges_per_batch": statistics.mean(edges),
        "median_batch_ms": statistics.median(times) * 1e3,
        "edges_per_s": sum(edges) / total_t,
    }


def layered_step(adj: S.Adjacency, seed_device: torch.device, copy_to: Optional[torch.device] = None):
    counter = [0]

    def step(seeds: torch.Tensor) -> int:
        counter[0] += 1
        layers = S.sample_layers(adj, seeds.to(seed_device), FANOUTS, seed=counter[0])
        if copy_to is not None:
            for lay in layers:
                for t in (lay.nodes, lay.src, lay.dst, lay.eids):
                    t.to(copy_to, non_blocking=False)
        return sum(lay.num_edges() for lay in layers)

    return step


def kernel_only(adj: S.Adjacency, seed_device: torch.device, num_nodes: int, num_seeds: int,
                fanout: int, repeats: int) -> Dict:
    gen = torch.Generator().manual_seed(5)
    seeds = torch.randint(0, num_nodes, (num_seeds,), generator=gen).to(seed_device)
    out = S.sample_neighbors(adj.indptr, adj.indices, seeds, fanout, seed=1)
    sync(seed_device)
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        out = S.sample_neighbors(adj.indptr, adj.indices, seeds, fanout, seed=r + 2)
        sync(seed_device)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"seeds": num_seeds, "fanout": fanout, "sampled_edges": int(out.neighbors.numel()),
            "median_ms": med * 1e3, "edges_per_s": out.neighbors.numel() / med}


def pinned_h2d_ceiling(nbytes: int) -> Dict:
    return {"bytes": nbytes, "GB_per_s": pinned_memcpy_gbs(nbytes, 7)}


def pyg_step(indptr64: torch.Tensor, indices64: torch.Tensor):
    """A step function over PyG's CPU neighbour sampler, or (None, reason)."""
    try:
        import pyg_lib  # noqa: F401

        def step(seeds: torch.Tensor) -> int:
            out = pyg_lib.sampler.neighbor_sample(indptr64, indices64, seeds.long(), list(reversed(FANOUTS)),
                                                  replace=False, directed=True, return_edge_id=True)
            return int(out[0].numel())

        return step, "pyg_lib.sampler.neighbor_sample"
    except Exception as e:  # noqa: BLE001
        reason = f"pyg_lib: {type(e).__name__}: {e}"
    try:
        import torch_sparse  # noqa: F401

        def step(seeds: torch.Tensor) -> int:
            out = torch.ops.torch_sparse.neighbor_sample(indptr64, indices64, seeds.long(),
                                                         list(reversed(FANOUTS)), False, True)
            return int(out[1].numel())

        return step, "torch_sparse.neighbor_sample"
    except Exception as e:  # noqa: BLE001
        reason += f"; torch_sparse: {type(e).__name__}: {e}"
    return None, reason


# ---------------------------------------------------------------------------------------------


def environment() -> Dict:
    env = common_environment()
    env.update(cpu_threads=torch.get_num_threads(), cpu=platform.processor() or platform.machine(),
               pytorch_zerocopy=zc.build_info())
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny graph, a few batches (smoke test)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--log2-nodes", type=int, default=None, help="graph size: 2^k nodes (default 26)")
    ap.add_argument("--avg-degree", type=float, default=None, help="mean list length (default 16.5)")
    ap.add_argument("--budget", type=float, default=None, help="seconds per GPU measurement")
    ap.add_argument("--cpu-budget", type=float, default=None, help="seconds per CPU measurement")
    args = ap.parse_args()

    quick = args.quick
    log2_nodes = args.log2_nodes or (14 if quick else 26)
    avg_degree = args.avg_degree or (8.0 if quick else 16.5)
    budget = args.budget or (0.5 if quick else 12.0)
    cpu_budget = args.cpu_budget or (0.5 if quick else 25.0)
    has_gpu = torch.cuda.is_available() and zc.gpu_backed()
    gen_device = torch.device("cuda") if has_gpu else torch.device("cpu")
    num_nodes = 1 << log2_nodes
    os.makedirs(args.out, exist_ok=True)

    result: Dict = {"environment": environment(), "fanouts": FANOUTS, "batch_size": 1024, "modes": {}}
    wall0 = time.perf_counter()
    indptr, indices, gen_s = generate_graph(num_nodes, avg_degree, max_degree=200_000, seed=1, device=gen_device)
    num_edges = indices.numel()
    result["graph"] = {"num_nodes": num_nodes, "num_edges": num_edges, "index_dtype": "int32",
                       "host_bytes": indptr.numel() * 8 + num_edges * 4, "generate_s": gen_s,
                       "max_degree": int((indptr.cpu()[1:] - indptr.cpu()[:-1]).max())}
    print(f"graph: {num_nodes:,} nodes, {num_edges:,} edges in host memory ({gen_s:.1f} s)", flush=True)
    if not quick and num_edges < 1_000_000_000:
        print("warning: fewer than 1 B edges", flush=True)

    cpu_adj = S.Adjacency(indptr.cpu(), indices.cpu())
    modes = result["modes"]
    if has_gpu:
        result["pinned_h2d"] = pinned_h2d_ceiling(1 << 30)
        print(f"pinned H2D ceiling: {result['pinned_h2d']['GB_per_s']:.1f} GB/s", flush=True)
        cuda = torch.device("cuda")
        uni_adj = S.Adjacency(indptr, indices)
        modes["gpu_from_host"] = run_batches(layered_step(uni_adj, cuda), num_nodes, cuda, 3, 10, budget, 11)
        modes["gpu_from_host"]["kernel_only"] = kernel_only(uni_adj, cuda, num_nodes, 200_000, 10, 9)
        print("gpu from host:", modes["gpu_from_host"], flush=True)
        t0 = time.perf_counter()
        gpu_adj = S.Adjacency(indptr.cpu().to(cuda), indices.cpu().to(cuda))
        sync(cuda)
        load_s = time.perf_counter() - t0
        modes["gpu_memory"] = run_batches(layered_step(gpu_adj, cuda), num_nodes, cuda, 3, 10, budget, 11)
        modes["gpu_memory"]["kernel_only"] = kernel_only(gpu_adj, cuda, num_nodes, 200_000, 10, 9)
        modes["gpu_memory"]["graph_upload_s"] = load_s
        print("gpu memory:", modes["gpu_memory"], flush=True)
        del gpu_adj
        torch.cuda.empty_cache()

    cpu = torch.device("cpu")
    modes["cpu_ours"] = run_batches(layered_step(cpu_adj, cpu), num_nodes, cpu, 1, 3, cpu_budget, 11)
    modes["cpu_ours"]["kernel_only"] = kernel_only(cpu_adj, cpu, num_nodes, 200_000, 10, 3)
    print("cpu (ours):", modes["cpu_ours"], flush=True)
    if has_gpu:
        modes["cpu_ours_plus_copy"] = run_batches(layered_step(cpu_adj, cpu, copy_to=torch.device("cuda")),
                                                  num_nodes, cpu, 1, 3, cpu_budget / 2, 11)
        print("cpu (ours) + copy to GPU:", modes["cpu_ours_plus_copy"], flush=True)

    t0 = time.perf_counter()
    step, name = pyg_step(indptr.cpu(), indices.cpu())
    if step is not None:
        indptr64, indices64 = indptr.cpu(), indices.cpu().long()
        step, name = pyg_step(indptr64, indices64)
        try:
            modes["cpu_pyg"] = run_batches(step, num_nodes, cpu, 1, 3, cpu_budget, 11)
            modes["cpu_pyg"]["sampler"] = name
            modes["cpu_pyg"]["int64_conversion_s"] = time.perf_counter() - t0
            print("cpu (PyG):", modes["cpu_pyg"], flush=True)
        except Exception as e:  # noqa: BLE001  (an API mismatch must not lose the other results)
            result["pyg_unavailable"] = f"{name} failed: {type(e).__name__}: {e}"
            print("PyG CPU sampler failed:", result["pyg_unavailable"], flush=True)
        del indices64
    else:
        result["pyg_unavailable"] = name
        print("PyG CPU sampler unavailable:", name, flush=True)

    ratios = {}
    if "gpu_from_host" in modes:
        g = modes["gpu_from_host"]["edges_per_s"]
        ratios["gpu_from_host_over_cpu_ours"] = g / modes["cpu_ours"]["edges_per_s"]
        ratios["gpu_memory_over_gpu_from_host"] = modes["gpu_memory"]["edges_per_s"] / g
        ratios["gpu_from_host_over_cpu_ours_plus_copy"] = g / modes["cpu_ours_plus_copy"]["edges_per_s"]
        if "cpu_pyg" in modes:
            ratios["gpu_from_host_over_cpu_pyg"] = g / modes["cpu_pyg"]["edges_per_s"]
        ratios["kernel_gpu_from_host_over_cpu_ours"] = (modes["gpu_from_host"]["kernel_only"]["edges_per_s"]
                                                        / modes["cpu_ours"]["kernel_only"]["edges_per_s"])
        ratios["bar_30x_met"] = ratios["gpu_from_host_over_cpu_ours"] >= 30
    result["ratios"] = ratios
    result["wall_s"] = time.perf_counter() - wall0

    with open(os.path.join(args.out, "sampling.json"), "w") as f:
        json.dump(result, f, indent=2)
    write_markdown(result, os.path.join(args.out, "sampling.md"))
    write_plot(result, os.path.join(args.out, "sampling.png"))
    print(f"wrote {args.out}/sampling.{{json,md,png}} in {result['wall_s']:.0f} s", flush=True)
    return 0


def write_markdown(r: Dict, path: str) -> None:
    env, g = r["environment"], r["graph"]
    lines = [
        "# Neighbour sampling throughput",
        "",
        f"{env['date']} · {env.get('gpu', 'no GPU')} (driver {env.get('driver')}) · torch {env['torch']} · "
        f"{env['cpu_threads']} CPU threads",
        "",
        f"Graph: {g['num_nodes']:,} nodes, {g['num_edges']:,} edges (int32 ids, "
        f"{g['host_bytes'] / 2**30:.1f} GiB in host memory, max list length {g['max_degree']:,}), "
        f"fanouts {r['fanouts']}, batch {r['batch_size']}; edges = sampled edges over all layers, "
        "per batch including compaction.",
        "",
    ]
    if "pinned_h2d" in r:
        lines += [f"Pinned cudaMemcpy H2D ceiling (same run): {r['pinned_h2d']['GB_per_s']:.1f} GB/s", ""]
    lines += ["| mode | sampled edges/s | median batch ms | edges/batch | kernel only, edges/s |",
              "|---|---|---|---|---|"]
    for name, m in r["modes"].items():
        k = m.get("kernel_only", {}).get("edges_per_s")
        lines.append(f"| {name} | {m['edges_per_s'] / 1e6:.1f} M | {m['median_batch_ms']:.2f} | "
                     f"{m['sampled_edges_per_batch']:,.0f} | {'' if k is None else f'{k / 1e6:.1f} M'} |")
    if r.get("pyg_unavailable"):
        lines += ["", f"PyG CPU sampling not measured: {r['pyg_unavailable']}"]
    if r.get("ratios"):
        lines += ["", "| ratio | value |", "|---|---|"]
        for k, v in r["ratios"].items():
            lines.append(f"| {k} | {v if isinstance(v, bool) else f'{v:.2f}'} |")
    lines += ["", f"Wall time {r['wall_s']:.0f} s (graph generation {g['generate_s']:.1f} s)."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(r: Dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        print("matplotlib unavailable: no plot", flush=True)
        return
    names = list(r["modes"])
    vals = [r["modes"][n]["edges_per_s"] / 1e6 for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh(names, vals, color=["#2a7" if n.startswith("gpu") else "#888" for n in names])
    ax.set_xscale("log")
    ax.set_xlabel("sampled edges per second (millions, log scale)")
    ax.set_title(f"3-layer sampling {r['fanouts']}, batch 1024, {r['graph']['num_edges'] / 1e9:.2f} B edges")
    for y, v in enumerate(vals):
        ax.text(v, y, f" {v:.1f} M", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
