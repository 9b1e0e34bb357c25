"""Where the time to load a feature table goes: what a job waits for before its first minibatch.

A job's process that gathers loads its table straight from the dataset's feature source into
the plan's host memory kind (``FeatureTable.load``). For a generated table (``papers_like``'s
:class:`~pytorch_zerocopy.datasets.features.GeneratedFeatures`, drawn on the GPU) this run
times, on one table of ``--gib`` GiB:

* ``managed alloc``: ``placement.empty`` in managed memory kept in host memory
  (``cudaMallocManaged``, the advice, and the prefetch that places every page in host memory);
* ``managed fill``: the source's ``fill`` into that fresh table (what a job does next: rows
  drawn on the GPU in chunks, each copied into the table by ``copy_``);
* on the same table, now filled, three ways of writing the same chunks again: ``copy_``
  (the copy engine, as the fill does), a kernel's stores (``torch.mul(..., out=)``), and the CPU
  copying from a pinned staging chunk into the table's host pages; these tell the first-touch
  cost from the copy's;
* ``mapped load``: ``load_table`` in shared host memory mapped for the GPU (allocation, the
  fill through host memory, registration), for comparison;
* the pinned memcpy H2D ceiling.

Rates are table bytes / seconds (wall clock, synchronised). No bars: a diagnostic of the load
path, whose figures decide how a table is filled.

    python benchmarks/table_load.py --out $OUT            # ~1 minute on an H100/H200 (8 GiB)
    python benchmarks/table_load.py --quick               # seconds, on the CPU: the CPU load only

Writes table_load.json and table_load.md under --out.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from typing import Callable, Dict

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from benchmarks.pipeline_common import write_report  # noqa: E402
from pytorch_zerocopy.datasets.features import GeneratedFeatures, load_table  # noqa: E402
from pytorch_zerocopy.placement import Placement, empty  # noqa: E402


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes, the GPU synchronised before and after."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def host_view(table: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over a managed table's bytes (kept in host memory: the CPU reads and writes
    them in place). Valid while ``table`` lives."""
    buf = (ctypes.c_char * table.nbytes).from_address(table.data_ptr())
    return torch.frombuffer(buf, dtype=table.dtype).view(table.shape)


def rewrites(table: torch.Tensor, source: GeneratedFeatures) -> Dict[str, float]:
    """Seconds to write chunks of the source's size into the filled ``table``, three ways."""
    rows, width = source.shape
    step = max(1, source.chunk_bytes // (width * table.element_size()))
    chunk = torch.randn(step, width, device=table.device).to(table.dtype)
    staging = torch.empty(chunk.shape, dtype=chunk.dtype, pin_memory=True)
    cpu = host_view(table)

    def each(write: Callable[[int, int], None]) -> Callable[[], None]:
        def run() -> None:
            for a in range(0, rows, step):
                write(a, min(rows, a + step))
        return run

    def by_cpu(a: int, b: int) -> None:
        staging[: b - a].copy_(chunk[: b - a])  # synchronous: GPU -> pinned
        cpu[a:b].copy_(staging[: b - a])

    return {
        "copy engine (copy_)": timed(each(lambda a, b: table[a:b].copy_(chunk[: b - a]))),
        "kernel stores (mul out=)": timed(each(lambda a, b: torch.mul(chunk[: b - a], 1.0, out=table[a:b]))),
        "CPU copy from pinned staging": timed(each(by_cpu)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=8.0, help="table size (default 8; quick 0.05)")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="CPU, seconds: the CPU load only")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not args.quick
    gib = 0.05 if args.quick else args.gib
    rows = max(1, int(gib * 2**30) // (args.width * 4))
    source = GeneratedFeatures((rows, args.width), torch.float32, 172, 0.3, seed=1, device="cuda" if gpu else "cpu")
    nbytes = rows * args.width * 4
    seconds: Dict[str, float] = {}
    ceiling = pinned_memcpy_gbs() if gpu else None
    if gpu:
        table = None

        def alloc() -> None:
            nonlocal table
            table = empty(source.shape, source.dtype, Placement.MANAGED)

        seconds["managed alloc"] = timed(alloc)
        seconds["managed fill"] = timed(lambda: source.fill(table))
        for name, s in rewrites(table, source).items():
            seconds[f"managed rewrite: {name}"] = s
        del table
        torch.cuda.empty_cache()
        seconds["mapped load"] = timed(lambda: load_table(source, Placement.MAPPED, 0))
    else:
        seconds["cpu load"] = timed(lambda: load_table(source, Placement.CPU))
    rates = {k: nbytes / s / 1e9 for k, s in seconds.items()}
    result = {"machine": environment(), "table_bytes": nbytes, "seconds": seconds, "gbs": rates,
              "pinned_memcpy_gbs": ceiling, "bars": {},
              "config": vars(args)}
    md = [f"# Loading a {nbytes / 2**30:.2f} GiB generated feature table", "",
          f"{result['machine'].get('gpu') or 'CPU'}, {result['machine']['date']}; pinned memcpy H2D: "
          + (f"{ceiling:.1f} GB/s" if ceiling else "n/a"), "",
          "| step | s | GB/s |", "|---|---|---|"]
    md += [f"| {k} | {seconds[k]:.2f} | {rates[k]:.2f} |" for k in seconds]
    write_report(args.out, "table_load", result, md)
    print("\n".join(md))


if __name__ == "__main__":
    main()
