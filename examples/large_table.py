"""A feature table larger than GPU memory: written to a ``.npy`` file, streamed into shared host
memory with ``load_unified`` (progress shown, one chunk of extra memory at a time), then read
by the GPU in place: minibatches of random rows gathered with ``gather_rows``, against the DMA
path (gather on the CPU, then copy).

    python examples/large_table.py --gib 64 --path /data/features.npy   # 64 GiB (needs the RAM and /dev/shm)
    python examples/large_table.py --gib 0.05                           # seconds on any machine

An existing file at ``--path`` is loaded as it is (any 2-D float table); otherwise one of
``--gib`` GiB is written there first. The table lives in /dev/shm, which must hold it (Docker:
--shm-size). Without a GPU the gathers run on the CPU.
"""

import argparse
import os
import tempfile
import time

import numpy as np
import torch

import pytorch_zerocopy as zc


def write_table(path: str, gib: float, width: int) -> None:
    """A float32 table of ``gib`` GiB where row ``i`` is ``i + [0, 1, ..., width) / width``
    (checkable after any gather), written in chunks with a progress bar."""
    from tqdm import tqdm

    rows = max(1, int(gib * 2**30) // (4 * width))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, width))
    step = max(1, (256 << 20) // (4 * width))
    cols = np.arange(width, dtype=np.float32) / width
    with tqdm(total=rows * width * 4, unit="B", unit_scale=True, desc="write") as bar:
        for a in range(0, rows, step):
            b = min(rows, a + step)
            out[a:b] = np.arange(a, b, dtype=np.float32)[:, None] + cols
            bar.update((b - a) * width * 4)
    out.flush()
    del out


def check_room(nbytes: int) -> None:
    st = os.statvfs("/dev/shm")
    free = st.f_bavail * st.f_frsize
    if nbytes > free:
        raise SystemExit(f"/dev/shm has {free / 2**30:.1f} GiB free, the table needs {nbytes / 2**30:.1f} GiB: "
                         "enlarge it (mount -o remount,size=<N>G /dev/shm; docker --shm-size) or pass a smaller --gib")


def median_seconds(fn, sync, reps: int) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", default=None, help="the .npy file (default: a temporary file, removed afterwards)")
    p.add_argument("--gib", type=float, default=50.0, help="size of the table to write when --path does not exist")
    p.add_argument("--width", type=int, default=128, help="float32 features per row of a written table")
    p.add_argument("--rows-per-batch", type=int, default=100_000, help="rows gathered per minibatch")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)

    tmp = None
    path = args.path
    if path is None:
        tmp = tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR"))
        path = os.path.join(tmp.name, "features.npy")
    try:
        if not os.path.exists(path):
            write_table(path, args.gib, args.width)
        header = np.load(path, mmap_mode="r")
        check_room(header.nbytes)
        start = time.perf_counter()
        table = zc.load_unified(path, progress=True)
        seconds = time.perf_counter() - start
        print(f"loaded {tuple(table.shape)} {table.dtype} ({header.nbytes / 2**30:.2f} GiB) into shared memory "
              f"in {seconds:.1f} s ({header.nbytes / seconds / 1e9:.2f} GB/s); GPU-backed: {zc.gpu_backed()}")

        gpu = torch.cuda.is_available() and zc.gpu_backed()
        device = torch.device("cuda" if gpu else "cpu")
        sync = torch.cuda.synchronize if gpu else (lambda: None)
        rows = min(args.rows_per_batch, table.shape[0])
        index = torch.randint(0, table.shape[0], (rows,), device=device)
        host = table.cpu()  # the same bytes, as a CPU tensor
        got = zc.gather_rows(table, index)
        assert torch.equal(got.cpu(), torch.from_numpy(np.asarray(header[index.cpu().numpy()]))), "gather mismatch"

        row_bytes = table.shape[1] * table.element_size()
        zero_copy = median_seconds(lambda: zc.gather_rows(table, index), sync, args.reps)
        dma = median_seconds(lambda: host[index.cpu()].to(device), sync, args.reps)
        for name, s in (("zero-copy gather (GPU reads host memory)" if gpu else "gather_rows (CPU)", zero_copy),
                        ("DMA path (CPU gather, then copy)", dma)):
            print(f"  {name:<42} {s * 1e3:8.2f} ms per {rows:,} rows  ({rows * row_bytes / s / 1e9:6.2f} GB/s)")
        if gpu:
            print(f"  zero-copy is {dma / zero_copy:.2f}x the DMA path; the table never entered GPU memory "
                  f"({torch.cuda.memory_allocated() / 2**20:.0f} MiB allocated there)")
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
