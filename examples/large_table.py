"""A feature table larger than GPU memory: written to a ``.npy`` file, streamed into shared host
memory with ``load_unified`` (progress shown, one chunk of extra memory at a time), then read
by the GPU in place: minibatches of random rows gathered with ``gather_rows``, against the DMA
path (gather on the CPU, then copy).

    python examples/large_table.py                                      # 1 GiB (less where room is short)
    python examples/large_table.py --gib 64 --path /data/features.npy   # 64 GiB (needs the RAM and /dev/shm)
    python examples/large_table.py --gib 0.05                           # seconds on any machine

An existing file at ``--path`` is loaded as it is (any 2-D float table); otherwise one of
``--gib`` GiB is written there first. The table lives in /dev/shm, which must hold it (Docker:
--shm-size). Both the file's disk and /dev/shm are checked before anything is written. Without
a GPU the gathers run on the CPU.
"""

import argparse
import os
import shutil
import tempfile
import time
from typing import Optional

import numpy as np
import torch

import pytorch_zerocopy as zc
from pytorch_zerocopy.unified import available_host_memory, format_bytes, free_shared_memory, require_shared_memory

DEFAULT_GIB = 1.0


def table_rows(gib: float, width: int) -> int:
    """Rows of a float32 table of ``width`` columns and (at most) ``gib`` GiB."""
    return max(1, int(gib * 2**30) // (4 * width))


def same_filesystem_as_shm(directory: str) -> bool:
    """Whether a file in ``directory`` takes /dev/shm's space (a TMPDIR on it, say)."""
    try:
        return os.stat(directory).st_dev == os.stat("/dev/shm").st_dev
    except OSError:
        return False


def default_gib(directory: str) -> float:
    """:data:`DEFAULT_GIB`, or a quarter of the room where that is less: the free space of the
    file's directory and of /dev/shm (which holds the file too when the directory is on it), and
    the host memory available."""
    room = [shutil.disk_usage(directory).free, available_host_memory() or 2**62]
    shm = free_shared_memory()
    if shm is not None:
        room.append(shm // 2 if same_filesystem_as_shm(directory) else shm)
    return min(DEFAULT_GIB, min(room) / 4 / 2**30)


def check_room(nbytes: int, directory: Optional[str] = None) -> None:
    """Exits with one line, in GiB, when the table (``nbytes``) does not fit /dev/shm or host
    memory, or, when it is still to be written to ``directory``, that directory's disk."""
    shm_bytes = nbytes
    if directory is not None:
        free = shutil.disk_usage(directory).free
        if nbytes > free:
            raise SystemExit(f"the table needs {format_bytes(nbytes, 'GiB')} on disk in {directory}, which has "
                             f"{format_bytes(free, 'GiB')} free: pass a smaller --gib or a --path elsewhere")
        if same_filesystem_as_shm(directory):
            shm_bytes += nbytes  # the file and the table it is loaded into
    try:
        require_shared_memory(shm_bytes, "the table", "pass a smaller --gib")
    except torch.OutOfMemoryError as e:
        raise SystemExit(str(e)) from None


def write_table(path: str, rows: int, width: int) -> None:
    """A float32 table of ``rows`` rows where row ``i`` is ``i + [0, 1, ..., width) / width``
    (checkable after any gather), written in chunks with a progress bar."""
    from tqdm import tqdm

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
    p.add_argument("--gib", type=float, default=None,
                   help=f"size of the table to write when --path does not exist (default: {DEFAULT_GIB:g} GiB, or a "
                        "quarter of the free space of its directory and of /dev/shm where that is less)")
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
            directory = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(directory):
                raise SystemExit(f"--path {path}: directory {directory} does not exist")
            gib = default_gib(directory) if args.gib is None else args.gib
            rows = table_rows(gib, args.width)
            check_room(rows * args.width * 4, directory)
            print(f"writing a table of {rows:,} x {args.width} float32 ({format_bytes(rows * args.width * 4, 'GiB')}) "
                  f"to {path}" + (" (the default size; --gib sets another)" if args.gib is None else ""), flush=True)
            write_table(path, rows, args.width)
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
