"""The default job until training lands: map a table, gather rows, check, report bandwidth."""

from __future__ import annotations

import time

import torch

from .unified import empty_unified, format_bytes, gpu_backed


def run_demo(rows: int = 200_000, dim: int = 128, batch: int = 65_536, iters: int = 20, seed: int = 0) -> int:
    gen = torch.Generator().manual_seed(seed)
    table = empty_unified((rows, dim), torch.float32)
    host = table.cpu()
    host.copy_(torch.randn(rows, dim, generator=gen))
    where = f"GPU {torch.cuda.get_device_name()}" if gpu_backed() else "the CPU (no GPU: CPU fallback)"
    print(f"feature table: {rows} x {dim} float32 ({format_bytes(host.nbytes)}) in shared host memory, "
          f"device {table.device}; ops run on {where}")

    device = torch.device("cuda") if gpu_backed() else torch.device("cpu")
    idx = torch.randint(0, rows, (batch,), generator=gen).to(device)
    out = table[idx]  # zero-copy gather: rows are read straight from host memory
    if not torch.equal(out.cpu(), host[idx.cpu()]):
        print("FAILED: gathered rows differ from the host table")
        return 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        out = table[idx]
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iters
    moved = batch * dim * 4
    print(f"gathered {batch} random rows into {out.device}: {seconds * 1e3:.2f} ms per call, "
          f"{moved / seconds / 1e9:.2f} GB/s; result checked against the host table: OK")
    return 0
