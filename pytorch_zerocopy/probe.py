"""How fast this machine's GPU reads random feature rows from each zero-copy host memory kind.

Whether managed memory kept in host memory (``Placement.MANAGED``) or registered shared memory
(``Placement.MAPPED``) serves random row reads faster depends on how the GPU and driver
translate host addresses: on machines without HMM, the driver maps managed memory at a coarser
granularity than registered 4 KiB pages and a minibatch's scattered rows read about twice as
fast; elsewhere that need not hold. So the plan decides by measurement, not by assumption:
:func:`measure` gathers a minibatch of random 512 B rows from a table in each kind (and times
a pinned memcpy, the link's ceiling), and :func:`host_read_rates` keeps the result per machine
(GPU, driver) in ``~/.cache/pytorch_zerocopy`` (``PYTORCH_ZEROCOPY_CACHE`` moves it), measuring
in a short-lived child process the first time, so the caller never creates a CUDA context
(an MPS partition started later then has the GPU to itself).

``zerocopy doctor`` prints the rates and what a plan picks; ``python -m pytorch_zerocopy.probe``
measures again and prints them as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Optional

from .placement import Placement

__all__ = ["HostReadRates", "host_read_rates", "measure"]

# A managed table must read this much faster to be chosen: a smaller gap is noise.
MANAGED_MARGIN = 1.10
PROBE_ROWS = 131_072
PROBE_ROW_BYTES = 512
PROBE_TABLE_BYTES = 4 << 30


@dataclass(frozen=True)
class HostReadRates:
    """Gather rates (GB/s of rows) of one minibatch-sized read, by host memory kind, on GPU 0."""

    gpu: str
    driver: str
    gpu_memory_bytes: int
    table_bytes: int
    rows: int
    row_bytes: int
    mapped_gbs: float
    managed_gbs: Optional[float]  # None: managed memory could not be allocated here
    memcpy_gbs: float

    @property
    def fastest(self) -> Placement:
        """The host memory kind a plan reads uncached feature rows from."""
        if self.managed_gbs is not None and self.managed_gbs > MANAGED_MARGIN * self.mapped_gbs:
            return Placement.MANAGED
        return Placement.MAPPED

    def describe(self) -> str:
        managed = "unavailable" if self.managed_gbs is None else f"{self.managed_gbs:.1f} GB/s"
        return (f"{self.rows:,} random {self.row_bytes} B rows of a {self.table_bytes / 2**30:.0f} GiB table: mapped "
                f"{self.mapped_gbs:.1f} GB/s, managed {managed}, pinned memcpy {self.memcpy_gbs:.1f} GB/s")


def _gather_gbs(table, idx, repeats: int) -> float:
    import torch

    from .ops import gather_rows

    out = torch.empty((idx.numel(), table.shape[1]), dtype=table.dtype, device=idx.device)
    gather_rows(table, idx, out, check_bounds=False)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        gather_rows(table, idx, out, check_bounds=False)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    return idx.numel() * table.shape[1] * table.element_size() / times[len(times) // 2] / 1e9


def _memcpy_gbs(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return repeats * nbytes / (time.perf_counter() - start) / 1e9


def measure(table_bytes: int = PROBE_TABLE_BYTES, rows: int = PROBE_ROWS, row_bytes: int = PROBE_ROW_BYTES,
            repeats: int = 5) -> HostReadRates:
    """Measures the rates in this process, on GPU 0 (needs a CUDA build and a GPU). The table is
    at most a quarter of the host memory still available; its rows are written once, so every
    page exists."""
    import torch

    from . import placement as _placement
    from .unified import available_host_memory

    available = available_host_memory()
    table_bytes = max(64 << 20, min(table_bytes, available // 4 if available is not None else table_bytes))
    width = row_bytes // 4
    n = table_bytes // row_bytes
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, n, (rows,), generator=gen).cuda()
    props = torch.cuda.get_device_properties(0)
    mapped = _placement.empty((n, width), torch.float32, Placement.MAPPED, 0)
    mapped.cpu().fill_(1.0)
    mapped_gbs = _gather_gbs(mapped, idx, repeats)
    del mapped
    managed_gbs: Optional[float] = None
    try:
        managed = _placement.empty((n, width), torch.float32, Placement.MANAGED, 0)
    except (RuntimeError, torch.OutOfMemoryError):
        managed = None
    if managed is not None:
        managed.fill_(1.0)
        torch.cuda.synchronize()
        managed_gbs = _gather_gbs(managed, idx, repeats)
        del managed
    return HostReadRates(props.name, _driver(), int(props.total_memory), n * row_bytes, rows, row_bytes, mapped_gbs,
                         managed_gbs, _memcpy_gbs())


def _driver() -> str:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return "unknown"
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.split(",")[-1].strip() if out else "unknown"


def _machine_key() -> str:
    """GPU 0's name and driver, as nvidia-smi reports them (no CUDA context)."""
    exe = shutil.which("nvidia-smi")
    out = ""
    if exe:
        try:
            out = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader",
                                  "-i", "0"], capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
    key = "".join(c if c.isalnum() else "-" for c in (out or "unknown-gpu"))
    return key.strip("-")[:120]


def _cache_path() -> str:
    root = os.environ.get("PYTORCH_ZEROCOPY_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                     "pytorch_zerocopy")
    return os.path.join(root, f"host-read-rates-{_machine_key()}.json")


def _load(path: str) -> Optional[HostReadRates]:
    try:
        with open(path) as f:
            return HostReadRates(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def _store(path: str, rates: HostReadRates) -> None:
    """Writes atomically: a concurrent reader sees the old file or the new one."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".host-read-rates-")
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(rates), f)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only means measuring again next time


def host_read_rates(refresh: bool = False, quiet: bool = True) -> Optional[HostReadRates]:
    """This machine's rates: from the cache, else measured in a child process and cached. None
    where no GPU serves unified tensors or the measurement failed (the caller then keeps the
    mapped table). ``refresh`` measures again."""
    from .unified import gpu_backed

    if not gpu_backed():
        return None
    path = _cache_path()
    if not refresh:
        cached = _load(path)
        if cached is not None:
            return cached
    if not quiet:
        print("measuring how fast this GPU reads each host memory kind (once per machine, a few seconds)", flush=True)
    try:
        done = subprocess.run([sys.executable, "-m", "pytorch_zerocopy.probe", "--json"], capture_output=True,
                              text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    try:
        rates = HostReadRates(**json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, TypeError, IndexError):
        return None
    _store(path, rates)
    return rates


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pytorch_zerocopy.probe", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the measurement as one JSON line")
    args = parser.parse_args(argv)
    from .unified import gpu_backed

    if not gpu_backed():
        print("no GPU serves unified tensors here: nothing to measure", file=sys.stderr)
        return 1
    rates = measure()
    print(json.dumps(asdict(rates)) if args.json else rates.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
