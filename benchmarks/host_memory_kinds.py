"""Minibatch-sized zero-copy gathers from host memory allocated two ways.

    python benchmarks/host_memory_kinds.py               # 32 GiB tables, 113 K rows of 512 B
    python benchmarks/host_memory_kinds.py --quick

The training pipeline's producer gathers ~113 K random rows of 512 B per minibatch from a 32 GiB
table, and runs at ~35 M rows/s, far below the PCIe ceiling: sparse rows are bound by address
translation, not by bytes. This asks whether the kind of host allocation changes that:

- ``shm+register``: the library's unified tensor (POSIX shared memory, ``cudaHostRegister``);
- ``cudaHostAlloc``: torch's pinned allocation (the driver allocates and maps the pages).

Both are read by the library's ``gather_rows`` kernel (sorted by address), the second through a
CUDA alias of its host pointer (cupy). The same run measures the ceiling (pinned memcpy) and the
DMA path (CPU ``index_select`` with all threads + copy) on the same rows. Results: JSON and
Markdown in ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from benchmarks.gather_bandwidth import time_gpu  # noqa: E402
from benchmarks.pipeline_common import write_report  # noqa: E402


def _median_ms(fn, iters: int) -> float:
    return time_gpu(fn, iters, warmup=1) * 1e3


def _cuda_alias(host: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor over the pinned host tensor's pages (UVA: the device address is the host's)."""
    import cupy

    mem = cupy.cuda.UnownedMemory(host.data_ptr(), host.numel() * host.element_size(), owner=host)
    arr = cupy.ndarray(tuple(host.shape), dtype=cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))
    return torch.from_dlpack(arr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table-gib", type=float, default=32.0)
    p.add_argument("--row-bytes", type=int, default=512)
    p.add_argument("--rows", default="16384,113000,1048576", help="rows per gather")
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: this benchmark measures GPU reads of host memory", file=sys.stderr)
        return 2
    import pytorch_zerocopy as zc
    from pytorch_zerocopy.datasets.base import shared_host_tensor

    table_gib = 0.5 if args.quick else args.table_gib
    width = args.row_bytes // 4
    n_rows = int(table_gib * 2**30) // args.row_bytes
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    shm = shared_host_tensor((n_rows, width), torch.float32)
    shm.view(torch.int32).fill_(7)
    t_shm = time.perf_counter() - t0
    t0 = time.perf_counter()
    unified = zc.to_unified(shm)
    t_register = time.perf_counter() - t0
    t0 = time.perf_counter()
    pinned = torch.empty((n_rows, width), dtype=torch.float32, pin_memory=True)
    t_hostalloc = time.perf_counter() - t0
    pinned.view(torch.int32).fill_(7)
    alias = _cuda_alias(pinned)
    dev = torch.device("cuda")
    ceiling = pinned_memcpy_gbs()
    results = []
    for rows in [int(r) for r in args.rows.split(",")]:
        idx = torch.randperm(n_rows, generator=gen)[:rows]
        idx_gpu = idx.to(dev)
        out = torch.empty(rows, width, device=dev)
        nbytes = rows * args.row_bytes
        row = {"rows": rows, "bytes": nbytes}
        row["shm_register_ms"] = _median_ms(lambda: zc.gather_rows(unified, idx_gpu, out=out, check_bounds=False),
                                            args.iters)
        row["cudaHostAlloc_ms"] = _median_ms(lambda: zc.gather_rows(alias, idx_gpu, out=out, check_bounds=False),
                                             args.iters)
        staging = torch.empty(rows, width, pin_memory=True)
        row["dma_ms"] = _median_ms(lambda: out.copy_(torch.index_select(shm, 0, idx, out=staging), non_blocking=True),
                                   args.iters)
        for k in ("shm_register", "cudaHostAlloc", "dma"):
            row[f"{k}_gbs"] = nbytes / row[f"{k}_ms"] / 1e6
            row[f"{k}_mrows_s"] = rows / row[f"{k}_ms"] / 1e3
        assert torch.equal(out.cpu(), shm[idx])
        results.append(row)
        print(row, flush=True)
    report = {"machine": environment(), "table_gib": table_gib, "row_bytes": args.row_bytes,
              "pinned_memcpy_gbs": ceiling, "setup_seconds": {"fill_shm": t_shm, "cudaHostRegister": t_register,
                                                              "cudaHostAlloc": t_hostalloc}, "results": results}
    md = [f"# Zero-copy gathers from two kinds of host allocation ({table_gib:g} GiB table, {args.row_bytes} B rows)",
          "", f"{report['machine'].get('gpu', '')}; pinned memcpy ceiling {ceiling:.1f} GB/s; "
          f"cudaHostRegister {t_register:.1f} s, cudaHostAlloc {t_hostalloc:.1f} s for the table.", "",
          "| rows | shm+register GB/s (M rows/s) | cudaHostAlloc GB/s (M rows/s) | DMA path GB/s | "
          "shm+register / ceiling |", "|---|---|---|---|---|"]
    for r in results:
        md.append(f"| {r['rows']} | {r['shm_register_gbs']:.1f} ({r['shm_register_mrows_s']:.0f}) | "
                  f"{r['cudaHostAlloc_gbs']:.1f} ({r['cudaHostAlloc_mrows_s']:.0f}) | {r['dma_gbs']:.1f} | "
                  f"{r['shm_register_gbs'] / ceiling:.2f} |")
    write_report(args.out, "host_memory_kinds_quick" if args.quick else "host_memory_kinds", report, md)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
