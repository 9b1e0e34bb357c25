"""Sampling one minibatch: the library's op on the GPU (graph in unified host memory, graph in
GPU memory) and on the CPU (all threads), with every minibatch freshly sampled.

Graph: papers_like's structure at 2^25 nodes (pytorch_zerocopy.datasets.papers_like: every
node lists between 1 and 29 in-neighbours, uniform, spread over the whole id range; 503 M
edges, int32 ids), generated on the GPU straight into shared host memory mapped for the GPU,
without papers_like's feature table. Its lists are the in-neighbour lists (the CSC): sampled
with ``edge_dir='out'`` on the CSRGraph that holds them. Workload: GraphSAGE's minibatch,
1024 distinct seeds drawn uniformly, fanouts (15, 10) in DGL's order (the seeds sample 10, their
neighbours 15), every minibatch a fresh ``sampling.sample_layers`` call (blocks included),
back to back. Also in the same run: the pinned cudaMemcpy H2D ceiling, the DMA-style baseline
(CPU sampling, then the blocks copied to the GPU), the overlapped form
(``sample_layers_async`` for minibatch i + 1 before ``result()`` of minibatch i), one large
batch (200 K seeds, one layer of 10) for the op's sampled-edges/s at scale, and where a
minibatch's time goes: host time to enqueue, GPU span, per layer and stage GPU time and the
launches per minibatch (torch.profiler, a separate diagnostic pass).

    python benchmarks/sampling.py            # GPU run, ~1 min on a 16-core host + one H100/H200
    python benchmarks/sampling.py --quick    # seconds; small graph (works without a GPU)

Writes sampling.json (top-level "bars"), sampling.md and sampling.png (if matplotlib imports)
under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from typing import Callable, Dict, List, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pytorch_zerocopy as zc  # noqa: E402
from benchmarks.common import environment as common_environment, pinned_memcpy_gbs  # noqa: E402
from pytorch_zerocopy import sampling as S  # noqa: E402
from pytorch_zerocopy.graph import CSRGraph  # noqa: E402

FANOUTS = [15, 10]  # DGL order: the seeds sample 10, their neighbours 15
BATCH = 1024
TARGET_MS = 0.8


# ---------------------------------------------------------------------------------------------
# Graph generation.


def generate_graph(num_nodes: int, max_degree: int, seed: int, device: torch.device):
    """papers_like's lists: lengths uniform in [1, max_degree], neighbours uniform over all ids;
    indptr (int64) on ``device``, indices (int32) in shared host memory mapped for the GPU,
    drawn on ``device`` in chunks. Returns (indptr, unified indices, seconds)."""
    t0 = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(seed)
    deg = torch.randint(1, max_degree + 1, (num_nodes,), generator=gen, device=device)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(deg, 0, out=indptr[1:])
    del deg
    total = int(indptr[-1])
    indices = zc.empty_unified(total, torch.int32)
    host = indices.cpu()
    chunk = 1 << 27
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        host[start:start + n].copy_(torch.randint(0, num_nodes, (n,), generator=gen, device=device,
                                                  dtype=torch.int32))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return indptr, indices, time.perf_counter() - t0


def seed_batches(num_nodes: int, count: int, seed: int) -> torch.Tensor:
    """``count`` minibatches of BATCH distinct node ids, uniform, in random order ([count, BATCH])."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(count, BATCH, dtype=torch.int64)
    for b in range(count):
        ids = torch.unique(torch.randint(0, num_nodes, (BATCH + BATCH // 8,), generator=gen))
        out[b] = ids[torch.randperm(ids.numel(), generator=gen)[:BATCH]]
    return out


# ---------------------------------------------------------------------------------------------
# Measurements.


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_minibatches(step: Callable[[torch.Tensor, int], int], seeds: torch.Tensor, device: torch.device,
                    warmup: int, min_batches: int, budget_s: float) -> Dict:
    """Calls step(seeds[b], b) for fresh minibatches, each timed on its own (the call returns
    when its blocks are ready), until min_batches and budget_s are both reached."""
    count = seeds.shape[0]
    for b in range(warmup):
        step(seeds[b % count], b)
    sync(device)
    times: List[float] = []
    edges: List[int] = []
    start = time.perf_counter()
    b = warmup
    while len(times) < min_batches or (time.perf_counter() - start < budget_s and len(times) < 20000):
        t0 = time.perf_counter()
        e = step(seeds[b % count], b)
        times.append(time.perf_counter() - t0)
        edges.append(e)
        b += 1
    sync(device)
    med = statistics.median(times)
    return {
        "batches": len(times),
        "distinct_seed_batches": min(count, len(times)),
        "ms_per_minibatch": med * 1e3,
        "mean_ms_per_minibatch": statistics.mean(times) * 1e3,
        "p90_ms_per_minibatch": sorted(times)[int(0.9 * (len(times) - 1))] * 1e3,
        "sampled_edges_per_minibatch": statistics.mean(edges),
        "sampled_edges_per_s": sum(edges) / sum(times),
    }


def sampling_step(graph: CSRGraph, copy_to: Optional[torch.device] = None):
    def step(seeds: torch.Tensor, b: int) -> int:
        blocks = S.sample_layers(graph, seeds, FANOUTS, edge_dir="out", seed=b)
        if copy_to is not None:
            blocks = [blk.to(copy_to) for blk in blocks]
            sync(copy_to)
        return sum(blk.num_edges() for blk in blocks)

    return step


def overlapped(graph: CSRGraph, seeds: torch.Tensor, warmup: int, batches: int) -> Dict:
    """The pipeline's pattern: minibatch i + 1 is queued before minibatch i's result is taken."""
    n = min(batches, seeds.shape[0])

    def run(count: int) -> float:
        pending = S.sample_layers_async(graph, seeds[0], FANOUTS, edge_dir="out", seed=0)
        t0 = time.perf_counter()
        for b in range(1, count + 1):
            nxt = S.sample_layers_async(graph, seeds[b % seeds.shape[0]], FANOUTS, edge_dir="out", seed=b)
            pending.result()
            pending = nxt
        pending.result()
        return time.perf_counter() - t0

    run(warmup)
    total = run(n)
    return {"batches": n, "ms_per_minibatch": total / n * 1e3}


def timed_call(graph: CSRGraph, seeds: torch.Tensor, fanouts: List[int], seed: int) -> Dict[str, float]:
    """One sample_layers_async call run alone: host time to enqueue, GPU span from the call's
    start to its sizes' copy (CUDA events), and the wait + blocks (result())."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    pending = S.sample_layers_async(graph, seeds, fanouts, edge_dir="out", seed=seed)
    end.record()  # behind the sizes' copy
    t1 = time.perf_counter()
    pending.result()
    t2 = time.perf_counter()
    return {"enqueue": (t1 - t0) * 1e3, "span": start.elapsed_time(end), "finish": (t2 - t1) * 1e3,
            "total": (t2 - t0) * 1e3}


def breakdown(graph: CSRGraph, seeds: torch.Tensor, reps: int) -> Dict:
    """Where one minibatch's time goes (medians over reps minibatches, each run alone): host
    enqueue, GPU span and wait + blocks of the full call, and per layer the GPU span and host
    enqueue that each layer adds (the call with the seeds' layer alone, then with both)."""
    runs: Dict[str, List[Dict[str, float]]] = {"full": [], "first": []}
    for b in range(reps):
        s = seeds[b % seeds.shape[0]]
        runs["full"].append(timed_call(graph, s, FANOUTS, b))
        runs["first"].append(timed_call(graph, s, FANOUTS[-1:], b))
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("enqueue", "span", "finish", "total")}
           for k, v in runs.items()}
    full, first = med["full"], med["first"]
    return {"host_enqueue_ms": full["enqueue"], "gpu_span_ms": full["span"],
            "result_wait_and_blocks_ms": full["finish"], "total_ms": full["total"],
            "layer0_gpu_span_ms": first["span"], "layer1_gpu_span_ms": full["span"] - first["span"],
            "layer0_host_enqueue_ms": first["enqueue"], "layer1_host_enqueue_ms": full["enqueue"] - first["enqueue"],
            "note": "layer0 = the seeds' layer (fanout 10); gpu_span_ms > host_enqueue_ms: GPU-bound, "
                    "else bound by host issue (launches, allocation, Python)"}


STAGES = (("init_kernel", "init"), ("sample_kernel", "sample"), ("mark_first_kernel", "mark"),
          ("number_kernel", "number"), ("write_edges_kernel", "write_edges"), ("DeviceRadixSort", "sort"),
          ("DeviceScan", "scan"), ("Memcpy", "copy"), ("Memset", "memset"))


def stage_of(name: str) -> str:
    for key, stage in STAGES:
        if key in name:
            return stage
    return "other"


def profile_stages(graph: CSRGraph, seeds: torch.Tensor, reps: int) -> Dict:
    """GPU time per (layer, stage) and CUDA operations per minibatch, from torch.profiler (a
    diagnostic pass: the profiler's own overhead makes its host times meaningless)."""
    from torch.profiler import ProfilerActivity, profile

    for b in range(3):
        S.sample_layers(graph, seeds[b], FANOUTS, edge_dir="out", seed=b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in range(reps):
            S.sample_layers(graph, seeds[b % seeds.shape[0]], FANOUTS, edge_dir="out", seed=b)
        torch.cuda.synchronize()
    events = prof.events()
    gpu = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    per: Dict[str, List[float]] = defaultdict(list)
    minibatch: Dict[str, float] = defaultdict(float)
    layer = 0
    count = 0
    for e in gpu:
        stage = stage_of(e.name)
        if stage == "init" and minibatch:
            for k, v in minibatch.items():
                per[k].append(v)
            minibatch = defaultdict(float)
            layer = 0
            count += 1
        key = stage if stage in ("init", "write_edges", "copy") else f"layer{layer}.{stage}"
        minibatch[key] += e.time_range.elapsed_us() / 1e3
        if stage == "number":
            layer += 1
    for k, v in minibatch.items():
        per[k].append(v)
    gpu_ms = {k: statistics.median(v) for k, v in sorted(per.items())}
    calls = defaultdict(int)
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("cuda"):
            calls[e.name] += 1
    launches = {k: v / reps for k, v in sorted(calls.items())}
    return {"minibatches": reps, "gpu_ms_per_stage": gpu_ms, "gpu_busy_ms": sum(gpu_ms.values()),
            "cuda_calls_per_minibatch": launches,
            "kernel_launches_per_minibatch": launches.get("cudaLaunchKernel", 0.0)
            + launches.get("cudaLaunchKernelExC", 0.0)}


def large_batch(graph: CSRGraph, num_nodes: int, device: torch.device, reps: int) -> Dict:
    """One layer of fanout 10 for 200 K seeds: the op's sampled edges/s at scale."""
    gen = torch.Generator().manual_seed(5)
    seeds = torch.randperm(num_nodes, generator=gen)[:200_000].to(device)
    S.sample_layers(graph, seeds, [10], edge_dir="out", seed=1)
    sync(device)
    times, edges = [], 0
    for r in range(reps):
        t0 = time.perf_counter()
        (blk,) = S.sample_layers(graph, seeds, [10], edge_dir="out", seed=r + 2)
        times.append(time.perf_counter() - t0)
        edges = blk.num_edges()
    med = statistics.median(times)
    return {"seeds": 200_000, "fanout": 10, "sampled_edges": edges, "ms": med * 1e3, "sampled_edges_per_s": edges / med}


# ---------------------------------------------------------------------------------------------


def diagnostic(name: str, fn: Callable[[], Dict]) -> Dict:
    """A diagnostic measurement; its failure is recorded, not fatal to the run's headline numbers."""
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001
        out = {"error": f"{type(e).__name__}: {e}"}
    print(f"  {name}:", out, flush=True)
    return out


def environment() -> Dict:
    env = common_environment()
    env.update(cpu_threads=torch.get_num_threads(), cpu=platform.processor() or platform.machine(),
               pytorch_zerocopy=zc.build_info())
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small graph, a few minibatches (smoke test)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--log2-nodes", type=int, default=None, help="graph size: 2^k nodes (default 25)")
    ap.add_argument("--budget", type=float, default=None, help="seconds per GPU measurement (default 3)")
    ap.add_argument("--cpu-budget", type=float, default=None, help="seconds per CPU measurement (default 4)")
    args = ap.parse_args()

    quick = args.quick
    log2_nodes = args.log2_nodes or (14 if quick else 25)
    budget = args.budget if args.budget is not None else (0.3 if quick else 3.0)
    cpu_budget = args.cpu_budget if args.cpu_budget is not None else (0.3 if quick else 4.0)
    has_gpu = torch.cuda.is_available() and zc.gpu_backed()
    gen_device = torch.device("cuda") if has_gpu else torch.device("cpu")
    num_nodes = 1 << log2_nodes
    os.makedirs(args.out, exist_ok=True)

    result: Dict = {"environment": environment(), "fanouts": FANOUTS, "batch_size": BATCH, "modes": {},
                    "fresh_sampling": True}
    wall0 = time.perf_counter()
    indptr, indices, gen_s = generate_graph(num_nodes, 29, seed=1, device=gen_device)
    num_edges = indices.numel()
    result["graph"] = {"num_nodes": num_nodes, "num_edges": num_edges, "index_dtype": "int32",
                       "degree": "uniform in [1, 29] (papers_like)", "host_bytes": num_edges * 4,
                       "generate_s": gen_s}
    print(f"graph: {num_nodes:,} nodes, {num_edges:,} edges ({gen_s:.1f} s)", flush=True)
    batches = seed_batches(num_nodes, 64 if quick else 2000, seed=11)
    modes = result["modes"]
    cpu = torch.device("cpu")
    cpu_graph = CSRGraph(indptr.cpu(), indices.cpu(), placement="cpu", validate=False)

    if has_gpu:
        cuda = torch.device("cuda")
        result["pinned_h2d_GB_per_s"] = pinned_memcpy_gbs(1 << 30, 7)
        print(f"pinned H2D ceiling: {result['pinned_h2d_GB_per_s']:.1f} GB/s", flush=True)
        gpu_batches = batches.to(cuda)
        unified = CSRGraph(indptr, indices, placement="unified", validate=False)
        modes["gpu_unified"] = run_minibatches(sampling_step(unified), gpu_batches, cuda, 20, 50, budget)
        print("gpu, graph in unified host memory:", modes["gpu_unified"], flush=True)
        g = modes["gpu_unified"]
        g["overlapped"] = diagnostic("overlapped", lambda: overlapped(unified, gpu_batches, 20, 20 if quick else 500))
        g["breakdown"] = diagnostic("breakdown", lambda: breakdown(unified, gpu_batches, 30))
        g["profile"] = diagnostic("profile", lambda: profile_stages(unified, gpu_batches, 20))
        g["large_batch"] = diagnostic("large batch", lambda: large_batch(unified, num_nodes, cuda, 5))

        t0 = time.perf_counter()
        on_gpu = CSRGraph(indptr, indices.cpu().to(cuda), placement="cuda", validate=False)
        sync(cuda)
        upload_s = time.perf_counter() - t0
        modes["gpu_memory"] = run_minibatches(sampling_step(on_gpu), gpu_batches, cuda, 20, 50, budget)
        modes["gpu_memory"]["graph_upload_s"] = upload_s
        print("gpu, graph in GPU memory:", modes["gpu_memory"], flush=True)
        modes["gpu_memory"]["breakdown"] = diagnostic("breakdown", lambda: breakdown(on_gpu, gpu_batches, 30))
        modes["gpu_memory"]["large_batch"] = diagnostic("large batch", lambda: large_batch(on_gpu, num_nodes, cuda, 5))
        del on_gpu
        torch.cuda.empty_cache()

    modes["cpu"] = run_minibatches(sampling_step(cpu_graph), batches, cpu, 2, 10, cpu_budget)
    print(f"cpu ({torch.get_num_threads()} threads):", modes["cpu"], flush=True)
    if has_gpu:
        modes["dma_baseline"] = run_minibatches(sampling_step(cpu_graph, copy_to=torch.device("cuda")), batches,
                                                cpu, 2, 10, cpu_budget / 2)
        print("dma baseline (CPU sampling + copy of the blocks):", modes["dma_baseline"], flush=True)

    bars: Dict = {"fresh_sampling": True, "cpu_ms_per_minibatch": modes["cpu"]["ms_per_minibatch"]}
    if has_gpu:
        g = modes["gpu_unified"]
        bars.update(
            gpu_unified_ms_per_minibatch=g["ms_per_minibatch"],
            gpu_unified_target_met=g["ms_per_minibatch"] <= TARGET_MS,
            gpu_memory_ms_per_minibatch=modes["gpu_memory"]["ms_per_minibatch"],
            gpu_unified_overlapped_ms_per_minibatch=g["overlapped"].get("ms_per_minibatch", float("nan")),
            gpu_unified_sampled_edges_per_s=g["sampled_edges_per_s"],
            gpu_unified_large_batch_sampled_edges_per_s=g["large_batch"].get("sampled_edges_per_s", float("nan")),
            dma_baseline_ms_per_minibatch=modes["dma_baseline"]["ms_per_minibatch"],
            gpu_unified_speedup_over_cpu=modes["cpu"]["ms_per_minibatch"] / g["ms_per_minibatch"],
            gpu_unified_speedup_over_dma=modes["dma_baseline"]["ms_per_minibatch"] / g["ms_per_minibatch"],
            gpu_unified_over_gpu_memory=g["ms_per_minibatch"] / modes["gpu_memory"]["ms_per_minibatch"],
            pinned_h2d_GB_per_s=result["pinned_h2d_GB_per_s"],
        )
    result["bars"] = bars
    result["quick"] = quick
    result["wall_s"] = time.perf_counter() - wall0

    with open(os.path.join(args.out, "sampling.json"), "w") as f:
        json.dump(result, f, indent=2)
    write_markdown(result, os.path.join(args.out, "sampling.md"))
    write_plot(result, os.path.join(args.out, "sampling.png"))
    print(json.dumps(bars, indent=2))
    print(f"wrote {args.out}/sampling.{{json,md,png}} in {result['wall_s']:.0f} s", flush=True)
    return 0


def write_markdown(r: Dict, path: str) -> None:
    env, g = r["environment"], r["graph"]
    lines = [
        "# Sampling one minibatch",
        "",
        f"{env['date']} · {env.get('gpu') or 'no GPU'} (driver {env.get('driver')}) · torch {env['torch']} · "
        f"{env['cpu_threads']} CPU threads" + (" · **quick run**" if r.get("quick") else ""),
        "",
        f"Graph: {g['num_nodes']:,} nodes, {g['num_edges']:,} edges (int32 ids, degree {g['degree']}, "
        f"{g['host_bytes'] / 2**30:.1f} GiB), batch {r['batch_size']}, fanouts {r['fanouts']} (DGL order), "
        "every minibatch a fresh `sampling.sample_layers` call returning blocks.",
        "",
    ]
    if "pinned_h2d_GB_per_s" in r:
        lines += [f"Pinned cudaMemcpy H2D ceiling (same run): {r['pinned_h2d_GB_per_s']:.1f} GB/s", ""]
    lines += ["| mode | ms / minibatch (median) | p90 ms | sampled edges / minibatch | sampled edges/s |",
              "|---|---|---|---|---|"]
    for name, m in r["modes"].items():
        lines.append(f"| {name} | {m['ms_per_minibatch']:.3f} | {m['p90_ms_per_minibatch']:.3f} | "
                     f"{m['sampled_edges_per_minibatch']:,.0f} | {m['sampled_edges_per_s'] / 1e6:.1f} M |")
    for name in ("gpu_unified", "gpu_memory"):
        m = r["modes"].get(name)
        if not m or "error" in m["breakdown"] or "error" in m["large_batch"]:
            continue
        b = m["breakdown"]
        lines += ["", f"**{name}**: host enqueue {b['host_enqueue_ms']:.3f} ms, GPU span {b['gpu_span_ms']:.3f} ms "
                  f"(layer 0 {b['layer0_gpu_span_ms']:.3f}, layer 1 adds {b['layer1_gpu_span_ms']:.3f}), "
                  f"wait + blocks {b['result_wait_and_blocks_ms']:.3f} ms (one minibatch alone); "
                  f"200 K seeds x fanout 10: {m['large_batch']['sampled_edges_per_s'] / 1e6:.0f} M sampled edges/s"
                  + (f"; overlapped (async) {m['overlapped']['ms_per_minibatch']:.3f} ms / minibatch"
                     if "ms_per_minibatch" in m.get("overlapped", {}) else "")]
        p = m.get("profile")
        if p and "gpu_ms_per_stage" in p:
            lines += ["", f"GPU time per stage (profiler, median of {p['minibatches']} minibatches; "
                      f"{p['kernel_launches_per_minibatch']:.0f} kernel launches per minibatch):", "",
                      "| stage | GPU ms |", "|---|---|"]
            lines += [f"| {k} | {v:.4f} |" for k, v in p["gpu_ms_per_stage"].items()]
            lines += ["", "CUDA runtime calls per minibatch: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in p["cuda_calls_per_minibatch"].items())]
    lines += ["", "| bar | value |", "|---|---|"]
    for k, v in r["bars"].items():
        lines.append(f"| {k} | {v if isinstance(v, bool) else f'{v:.4g}'} |")
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
    vals = [r["modes"][n]["ms_per_minibatch"] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(names, vals, color=["#2a7" if n.startswith("gpu") else "#888" for n in names])
    ax.set_xscale("log")
    ax.axvline(TARGET_MS, color="#c33", linestyle="--", linewidth=1)
    ax.set_xlabel("ms per minibatch (log scale; dashed: 0.8 ms target)")
    ax.set_title(f"sampling one minibatch: {BATCH} seeds, fanouts {r['fanouts']}, "
                 f"{r['graph']['num_edges'] / 1e6:.0f} M edges")
    for y, v in enumerate(vals):
        ax.text(v, y, f" {v:.2f}", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
