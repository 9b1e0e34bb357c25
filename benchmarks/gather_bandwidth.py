"""Row-gather bandwidth from a large host table: zero-copy gather_rows against the copy ceiling.

For each row size and dtype, random-order indices select ``--gather-gib`` of rows from a host
table of ``--table-gib`` (one unified allocation, viewed per configuration). Measured in the
same run, as GB/s of gathered rows and as a ratio to the ceiling:

* ``memcpy``      pinned host -> GPU cudaMemcpy of the same number of bytes (the ceiling),
* ``dma``         the DMA path: gather on the CPU with every core into a pinned buffer, then an
                  async copy to the GPU (the faster of zerocopy's CPU gather_rows and torch's
                  index_select; the column ``dma_impl`` says which),
* ``naive``       torch's own index_select on the CUDA alias of the mapping (no reordering),
* ``op``          pytorch_zerocopy.gather_rows on the unified table (index on the GPU),
* ``gpu_table``   gather_rows on a copy of the table in GPU memory.

Times: CUDA events (wall clock with a device synchronisation for the DMA path, which runs on
the CPU), median of ``--iters`` calls after ``--warmup`` calls. Results: JSON + Markdown (+ a
PNG plot when matplotlib is installed) in ``--out``.

    python benchmarks/gather_bandwidth.py              # 16 GiB table, 1-3 minutes
    python benchmarks/gather_bandwidth.py --quick      # 256 MiB table, seconds (smoke test)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch

import pytorch_zerocopy as zc
from pytorch_zerocopy import unified as _unified

GiB = 1 << 30
MiB = 1 << 20

FLOAT32_ROW_BYTES = [128, 256, 512, 1020, 1024, 1028, 1044, 2048, 4096, 16384]
EXTRA_CONFIGS = [(torch.float16, 256), (torch.float16, 1028), (torch.int8, 256), (torch.int8, 1028)]

# The profile: how the rate depends on how many rows one call takes from the table (density sweep).
DENSITY_ROW_BYTES = 512

# Bars from the issue: op / memcpy and op / DMA.
BAR_SMALL_ROW_BYTES = 128
BAR_SMALL = 0.80
BAR_LARGE = 0.93
BAR_VS_DMA = 2.5


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table-gib", type=float, default=16.0, help="host table size in GiB (default 16)")
    p.add_argument("--gather-gib", type=float, default=0.5, help="bytes gathered per call in GiB (default 0.5)")
    p.add_argument("--iters", type=int, default=15, help="timed calls per measurement (median; >= 10 for results)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls before timing")
    p.add_argument("--quick", action="store_true", help="256 MiB table, 32 MiB per call, 3 iterations")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"), help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default="", help="comma-separated dtype:row_bytes subset, e.g. float32:128,int8:1028")
    p.add_argument("--density-rows", default="65536,262144,1048576,4194304",
                   help="rows per call of the density sweep (float32 rows of %d B; '' to skip)" % DENSITY_ROW_BYTES)
    args = p.parse_args()
    if args.quick:
        args.table_gib, args.gather_gib, args.iters, args.warmup = 0.25, 1 / 32, 3, 1
        args.density_rows = "16384,65536"
    return args


def configs(only: str = "") -> List[Tuple[torch.dtype, int]]:
    every = [(torch.float32, b) for b in FLOAT32_ROW_BYTES] + EXTRA_CONFIGS
    if not only:
        return every
    wanted = {tuple(item.strip().split(":")) for item in only.split(",") if item.strip()}
    chosen = [(d, b) for d, b in every if (str(d).replace("torch.", ""), str(b)) in wanted]
    if len(chosen) != len(wanted):
        sys.exit(f"--only: unknown configurations in {only!r}; choose from "
                 + ", ".join(f"{str(d).replace('torch.', '')}:{b}" for d, b in every))
    return chosen


def time_gpu(fn: Callable[[], object], iters: int, warmup: int) -> float:
    """Median seconds of fn() measured with CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def time_wall(fn: Callable[[], object], iters: int, warmup: int) -> float:
    """Median seconds of fn() + a device synchronisation (for work that starts on the CPU)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def fill_random(host_bytes: torch.Tensor, seed: int) -> None:
    """Random bytes generated on the GPU in 256 MiB chunks and copied into the host table."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    chunk = 256 * MiB
    total = host_bytes.numel()
    for start in range(0, total, chunk):
        stop = min(total, start + chunk)
        part = torch.randint(0, 256, (stop - start,), dtype=torch.uint8, device="cuda", generator=gen)
        host_bytes[start:stop].copy_(part)
    torch.cuda.synchronize()


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def run(args: argparse.Namespace) -> Dict:
    if not torch.cuda.is_available() or not zc.gpu_backed():
        sys.exit("gather_bandwidth needs a CUDA GPU and a CUDA build of pytorch_zerocopy")
    torch.manual_seed(args.seed)
    device = torch.device("cuda", torch.cuda.current_device())
    table_bytes = int(args.table_gib * GiB)
    gather_bytes = int(args.gather_gib * GiB)
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)

    t0 = time.perf_counter()
    table_u8 = zc.empty_unified(table_bytes, torch.uint8)
    host_u8 = table_u8.cpu()
    fill_random(host_u8, args.seed)
    print(f"host table: {table_bytes / GiB:.2f} GiB, filled in {time.perf_counter() - t0:.1f} s", flush=True)
    gpu_u8 = host_u8.to(device)
    cuda_u8 = _unified._C.device_alias(table_u8, device)  # the mapping as a CUDA tensor

    pinned = torch.empty(gather_bytes, dtype=torch.uint8, pin_memory=True)
    dev_buf = torch.empty(gather_bytes, dtype=torch.uint8, device=device)

    def memcpy():
        dev_buf.copy_(pinned, non_blocking=True)

    ceiling_start = gbps(gather_bytes, time_gpu(memcpy, max(args.iters, 10), args.warmup))
    print(f"pinned memcpy H2D: {ceiling_start:.1f} GB/s", flush=True)

    rows_out = []
    for dtype, row_bytes in configs(args.only):
        item = torch.empty((), dtype=dtype).element_size()
        width = row_bytes // item
        rows = table_bytes // row_bytes
        n = gather_bytes // row_bytes
        moved = n * row_bytes
        table_unified = table_u8[: rows * row_bytes].view(dtype).view(rows, width)
        table_cuda_alias = cuda_u8[: rows * row_bytes].view(dtype).view(rows, width)
        table_host = host_u8[: rows * row_bytes].view(dtype).view(rows, width)
        table_gpu = gpu_u8[: rows * row_bytes].view(dtype).view(rows, width)
        index = torch.randint(0, rows, (n,), device=device)
        index_cpu = index.cpu()
        staged = pinned[:moved].view(dtype).view(n, width)
        landed = dev_buf[:moved].view(dtype).view(n, width)

        # Correctness spot check of the timed call on sampled positions (bitwise, so random bit
        # patterns that are NaN compare fine).
        full = zc.gather_rows(table_unified, index)
        probe = torch.randint(0, n, (2000,), device=device)
        got = full[probe].cpu()
        want = table_host[index_cpu[probe.cpu()]]
        del full
        if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
            raise RuntimeError(f"gather_rows returned wrong rows for {dtype} rows of {row_bytes} B")

        def dma_zerocopy_cpu():
            zc.gather_rows(table_host, index_cpu, staged)
            landed.copy_(staged, non_blocking=True)

        def dma_torch_cpu():
            torch.index_select(table_host, 0, index_cpu, out=staged)
            landed.copy_(staged, non_blocking=True)

        def naive():
            return torch.index_select(table_cuda_alias, 0, index)

        def op():
            return zc.gather_rows(table_unified, index)

        def gpu_table():
            return zc.gather_rows(table_gpu, index)

        t_dma_zc = time_wall(dma_zerocopy_cpu, args.iters, args.warmup)
        t_dma_torch = time_wall(dma_torch_cpu, args.iters, args.warmup)
        dma_impl = "zerocopy.gather_rows (CPU)" if t_dma_zc <= t_dma_torch else "torch.index_select (CPU)"
        t_dma = min(t_dma_zc, t_dma_torch)
        t_memcpy = time_gpu(memcpy, args.iters, args.warmup)
        t_naive = time_gpu(naive, args.iters, args.warmup)
        t_op = time_gpu(op, args.iters, args.warmup)
        t_gpu = time_gpu(gpu_table, args.iters, args.warmup)
        # The gather kernel alone: the same rows, already in address order, no sort.
        sorted_index = torch.sort(index).values

        def op_presorted():
            return zc.gather_rows(table_unified, sorted_index, index_sorted=True)

        t_presorted = time_gpu(op_presorted, args.iters, args.warmup)

        ceiling = gbps(gather_bytes, t_memcpy)
        result = {
            "dtype": str(dtype).replace("torch.", ""),
            "row_bytes": row_bytes,
            "rows_gathered": n,
            "bytes_gathered": moved,
            "memcpy_gbps": ceiling,
            "dma_gbps": gbps(moved, t_dma),
            "dma_impl": dma_impl,
            "dma_zerocopy_cpu_gbps": gbps(moved, t_dma_zc),
            "dma_torch_cpu_gbps": gbps(moved, t_dma_torch),
            "naive_gbps": gbps(moved, t_naive),
            "op_gbps": gbps(moved, t_op),
            "gpu_table_gbps": gbps(moved, t_gpu),
            "op_presorted_gbps": gbps(moved, t_presorted),
            "sort_share_of_op_time": max(0.0, 1.0 - t_presorted / t_op),
        }
        for key in ("dma", "naive", "op", "gpu_table"):
            result[f"{key}_vs_memcpy"] = result[f"{key}_gbps"] / ceiling
        result["op_vs_dma"] = result["op_gbps"] / result["dma_gbps"]
        bar = BAR_SMALL if row_bytes <= BAR_SMALL_ROW_BYTES else BAR_LARGE
        result["bar_vs_memcpy"] = bar
        result["meets_bars"] = result["op_vs_memcpy"] >= bar and result["op_vs_dma"] >= BAR_VS_DMA
        rows_out.append(result)
        print(
            f"{result['dtype']:>8} {row_bytes:>6} B: memcpy {ceiling:6.1f}  dma {result['dma_gbps']:6.1f}  "
            f"naive {result['naive_gbps']:6.1f}  op {result['op_gbps']:6.1f} ({result['op_vs_memcpy']:.2f}x, "
            f"{result['op_vs_dma']:.1f}x dma)  gpu table {result['gpu_table_gbps']:7.1f} GB/s",
            flush=True,
        )

    density = density_sweep(args, table_u8, table_bytes, device)
    ceiling_end = gbps(gather_bytes, time_gpu(memcpy, max(args.iters, 10), args.warmup))
    props = torch.cuda.get_device_properties(device)
    return {
        "benchmark": "gather_bandwidth",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": props.name,
        "driver": driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "pytorch_zerocopy": zc.__version__,
        "cpu_threads": threads,
        "table_bytes": table_bytes,
        "gather_bytes_per_call": gather_bytes,
        "iters": args.iters,
        "warmup": args.warmup,
        "quick": args.quick,
        "memcpy_gbps_start": ceiling_start,
        "memcpy_gbps_end": ceiling_end,
        "index_order": "random (torch.randint on the GPU)",
        "results": rows_out,
        "density": density,
    }


def density_sweep(args: argparse.Namespace, table_u8: torch.Tensor, table_bytes: int, device) -> List[Dict]:
    """gather_rows of n random float32 rows of DENSITY_ROW_BYTES for each n of --density-rows:
    GB/s and rows/s. Few rows from a large table are far apart even in address order, so each
    lands on its own pages: this shows the rate a minibatch-sized gather can reach."""
    counts = [int(c) for c in args.density_rows.split(",") if c.strip()]
    width = DENSITY_ROW_BYTES // 4
    rows = table_bytes // DENSITY_ROW_BYTES
    table = table_u8[: rows * DENSITY_ROW_BYTES].view(torch.float32).view(rows, width)
    out = []
    for n in counts:
        index = torch.randint(0, rows, (n,), device=device)
        t = time_gpu(lambda: zc.gather_rows(table, index, check_bounds=False), args.iters, args.warmup)
        gap = table_bytes / n
        out.append({"rows": n, "row_bytes": DENSITY_ROW_BYTES, "seconds": t, "gbps": gbps(n * DENSITY_ROW_BYTES, t),
                    "mrows_per_s": n / t / 1e6, "mean_gap_bytes": gap})
        print(f"density: {n:>8} rows of {DENSITY_ROW_BYTES} B (mean gap {gap / 1024:.0f} KiB): "
              f"{out[-1]['gbps']:.1f} GB/s, {out[-1]['mrows_per_s']:.1f} M rows/s", flush=True)
    return out


def markdown(report: Dict) -> str:
    lines = [
        "# Row gather from a host table: zero-copy gather_rows vs the copy ceiling",
        "",
        f"- device: {report['device']}, driver {report['driver']}, torch {report['torch']} (CUDA {report['cuda']})",
        f"- date: {report['date']}; CPU threads for the DMA path: {report['cpu_threads']}",
        f"- host table: {report['table_bytes'] / GiB:.2f} GiB (unified); gathered per call: "
        f"{report['gather_bytes_per_call'] / MiB:.0f} MiB; random-order indices; median of {report['iters']} "
        f"after {report['warmup']} warm-up calls",
        f"- pinned memcpy H2D at start / end: {report['memcpy_gbps_start']:.1f} / {report['memcpy_gbps_end']:.1f} GB/s",
        f"- bars: op >= {BAR_LARGE} x memcpy for rows >= 256 B, >= {BAR_SMALL} x at 128 B, >= {BAR_VS_DMA} x DMA",
        "",
        "GB/s of gathered rows (ratio to the memcpy ceiling measured beside it).",
        "",
        "| dtype | row B | memcpy | DMA path | DMA gather stage | naive zero-copy | gather_rows | op / DMA | GPU table | bars |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['dtype']} | {r['row_bytes']} | {r['memcpy_gbps']:.1f} | {r['dma_gbps']:.1f} ({r['dma_vs_memcpy']:.2f}) "
            f"| {'zerocopy' if r['dma_impl'].startswith('zerocopy') else 'torch'} "
            f"(zerocopy {r['dma_zerocopy_cpu_gbps']:.1f}, torch {r['dma_torch_cpu_gbps']:.1f}) "
            f"| {r['naive_gbps']:.1f} ({r['naive_vs_memcpy']:.2f}) | {r['op_gbps']:.1f} ({r['op_vs_memcpy']:.2f}) "
            f"| {r['op_vs_dma']:.1f} | {r['gpu_table_gbps']:.0f} | {'met' if r['meets_bars'] else 'MISSED'} |"
        )
    lines += ["", "DMA path: CPU gather with every core into a pinned buffer, then an async copy; the gather "
              "stage is the faster of zerocopy's CPU gather_rows and torch.index_select (GB/s of the whole "
              "path with each in brackets). GPU table: gather_rows on a copy of the table in GPU memory.", "",
              "## Profile: sort vs gather", "",
              "gather_rows on the same rows already in address order (index_sorted=True: the kernel alone) and "
              "the share of the op's time that goes to sorting.", "",
              "| dtype | row B | op | kernel alone | sort share |", "|---|---:|---:|---:|---:|"]
    for r in report["results"]:
        lines.append(f"| {r['dtype']} | {r['row_bytes']} | {r['op_gbps']:.1f} ({r['op_vs_memcpy']:.2f}) | "
                     f"{r['op_presorted_gbps']:.1f} ({r['op_presorted_gbps'] / r['memcpy_gbps']:.2f}) | "
                     f"{r['sort_share_of_op_time']:.1%} |")
    if report.get("density"):
        lines += ["", "## Profile: rows per call", "",
                  "gather_rows (no bounds check) of n random rows from the same table: with few rows per call the "
                  "rows are far apart even in address order, and the rate is bound by rows per second.", "",
                  "| rows | row B | mean gap (KiB) | GB/s | M rows/s |", "|---:|---:|---:|---:|---:|"]
        for d in report["density"]:
            lines.append(f"| {d['rows']} | {d['row_bytes']} | {d['mean_gap_bytes'] / 1024:.0f} | {d['gbps']:.1f} | "
                         f"{d['mrows_per_s']:.1f} |")
    lines.append("")
    return "\n".join(lines)


def plot(report: Dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    f32 = [r for r in report["results"] if r["dtype"] == "float32"]
    x = [r["row_bytes"] for r in f32]
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, label in (("memcpy_gbps", "pinned memcpy (ceiling)"), ("op_gbps", "gather_rows (zero-copy)"),
                       ("naive_gbps", "naive zero-copy (index_select)"), ("dma_gbps", "DMA path (CPU gather + copy)")):
        ax.plot(x, [r[key] for r in f32], marker="o", label=label)
    others = [r for r in report["results"] if r["dtype"] != "float32"]
    if others:
        ax.scatter([r["row_bytes"] for r in others], [r["op_gbps"] for r in others], marker="x", color="black",
                   label="gather_rows, float16 / int8", zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("row size (bytes)")
    ax.set_ylabel("GB/s of gathered rows")
    ax.set_title(f"Random row gather from a {report['table_bytes'] / GiB:.0f} GiB host table, {report['device']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> None:
    args = parse_args()
    start = time.perf_counter()
    report = run(args)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "gather_bandwidth" + ("_quick" if args.quick else ""))
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=2)
    with open(stem + ".md", "w") as f:
        f.write(markdown(report))
    plotted = plot(report, stem + ".png")
    print()
    print(f"{'dtype':>8} {'row B':>6} {'memcpy':>7} {'dma':>6} {'naive':>6} {'op':>6} {'op/cap':>6} {'op/dma':>6}  bars")
    for r in report["results"]:
        print(f"{r['dtype']:>8} {r['row_bytes']:>6} {r['memcpy_gbps']:7.1f} {r['dma_gbps']:6.1f} {r['naive_gbps']:6.1f} "
              f"{r['op_gbps']:6.1f} {r['op_vs_memcpy']:6.2f} {r['op_vs_dma']:6.1f}  "
              f"{'met' if r['meets_bars'] else 'MISSED'}")
    print(f"\nwrote {stem}.json, {stem}.md" + (f", {stem}.png" if plotted else " (no matplotlib: no plot)"))
    print(f"wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
