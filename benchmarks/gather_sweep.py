"""What limits a minibatch-sized zero-copy gather (100 K rows from a 16 GiB host table)?

One GPU run, about a minute, measuring GB/s and M rows/s of ``gather_rows`` on fresh random
rows (every timed call gathers an index it has not seen: repeating one index lets the GPU's
translation caches keep last call's pages, which flatters small gathers; the ``repeat`` line
shows by how much). Sections:

* ``ceiling``    pinned memcpy H2D, the DMA path (CPU index_select, all threads, + copy) and a
                 GPU-memory copy of the table, at the same rows.
* ``knobs``      the op under each tuning knob of csrc/cuda/gather_rows.cu (read per call from
                 the environment): loads in flight per lane (``UNROLL``), slots per lane group
                 (``STEPS``: fewer = more warps, each with fewer rows), a persistent grid of
                 ``GRID_BLOCKS`` blocks each taking a long stretch of sorted rows (compact
                 address range per SM; fewer blocks than SMs leaves SMs idle, which shows
                 whether the rate scales with SMs or is a device-wide limit), the load
                 instruction (``LOAD``: ld.global, .nc, .nc.L2::128B / ::256B prefetch), the
                 sorted slots cut into ``SPLIT`` kernels on concurrent streams, and a coarser
                 sort (``SORT_GRANULE`` bytes per key; 4096 = rows of one page together).
                 Also: the kernel alone on a presorted index (sort share), random order with
                 no sort, and torch's elementwise index_select on the presorted index.
* ``rows``       rows per call (12.5 K .. 1 M) with the distinct 4 KiB / 64 KiB / 2 MiB
                 regions each call touches: which granule's count tracks the time.
* ``cache``      ``gather_rows_cached`` with 10% of the rows in a GPU cache and 0-100% of each
                 call's rows hits: effective GB/s (bytes delivered / time) against hit rate.
* ``stride``     32 K rows, one every S bytes (S = 512 B .. 512 KiB), presorted: the cost of
                 a row as a function of how far apart rows are. The step where it jumps is the
                 GPU's translation granule for host memory.
* ``alloc``      the same gather from host memory allocated three ways (``--alloc-gib``):
                 the library's shm + cudaHostRegister, a cuMemCreate host allocation (driver
                 pinned, mapped at the driver's recommended granularity, often 2 MiB), and
                 managed memory kept on the host (preferred location CPU, accessed by the GPU).
                 Whether the GPU maps host memory with larger pages when the driver owns it.

    python benchmarks/gather_sweep.py --out $OUT      # ~1-2 minutes on an H100/H200
    python benchmarks/gather_sweep.py --quick         # seconds, 1 GiB table (smoke test)

Writes gather_sweep.json and gather_sweep.md under --out; prints one line per measurement.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pytorch_zerocopy as zc  # noqa: E402
from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from benchmarks.gather_minibatch import Clock  # noqa: E402
from pytorch_zerocopy import unified as _unified  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20
ENV = "PYTORCH_ZEROCOPY_GATHER_"

KNOBS: List[Dict[str, str]] = [
    {},
    {"UNROLL": "4"}, {"UNROLL": "16"},
    {"STEPS": "4"}, {"STEPS": "64"}, {"STEPS": "256"},
    {"LOAD": "nc"}, {"LOAD": "l2_128"}, {"LOAD": "l2_256"},
    {"SPLIT": "2"}, {"SPLIT": "4"},
    {"SORT_GRANULE": "4096"}, {"SORT_GRANULE": "65536"}, {"SORT_GRANULE": "2097152"},
    {"UNROLL": "16", "STEPS": "64"}, {"UNROLL": "16", "LOAD": "l2_256"},
]
GRID_FRACTIONS = [0.25, 0.5, 1, 2, 4, 8]  # persistent grid: blocks per SM
ROWS_PER_CALL = [12_500, 25_000, 50_000, 100_000, 200_000, 400_000, 1_000_000]
STRIDES = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288]


class Timer:
    """Median seconds of fn(index) over fresh indices ``make_index(k)`` (warm-up ones first):
    :class:`benchmarks.gather_minibatch.Clock` over a list of them."""

    def __init__(self, iters: int, warmup: int):
        self.iters, self.clock = iters, Clock(gpu=True, warmup=warmup)

    def _inputs(self, make_index: Callable[[int], torch.Tensor]) -> List[torch.Tensor]:
        return [make_index(10_000 + k) for k in range(self.clock.warmup)] + [make_index(k) for k in range(self.iters)]

    def fresh(self, fn: Callable[[torch.Tensor], object], make_index: Callable[[int], torch.Tensor]) -> float:
        return self.clock.events(fn, self._inputs(make_index))

    def wall(self, fn: Callable[[torch.Tensor], object], make_index: Callable[[int], torch.Tensor]) -> float:
        return self.clock.wall(fn, self._inputs(make_index))


class EnvKnobs:
    """Sets PYTORCH_ZEROCOPY_GATHER_* variables for the duration of a with-block."""

    def __init__(self, knobs: Dict[str, str]):
        self.knobs = {ENV + k: v for k, v in knobs.items()}
        self.saved: Dict[str, Optional[str]] = {}

    def __enter__(self):
        for k, v in self.knobs.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def knob_name(knobs: Dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in knobs.items()) or "default"


def distinct_regions(idx: torch.Tensor, row_bytes: int, shift: int) -> int:
    return int(torch.unique((idx.long() * row_bytes) >> shift).numel())


# --- host memory the driver allocates (ctypes over libcuda) ------------------------------------


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


LOC_DEVICE, LOC_HOST, LOC_HOST_NUMA = 1, 2, 3


class DriverMemory:
    """A CUDA tensor of ``nbytes`` uint8 over host memory allocated by the CUDA driver."""

    def __init__(self, kind: str, nbytes: int, device: int):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.kind, self.nbytes, self.device = kind, nbytes, device
        self.ptr = ctypes.c_uint64(0)
        self.handle = ctypes.c_uint64(0)
        self.info: Dict[str, object] = {"kind": kind}
        if kind == "vmm_host":
            self._vmm()
        else:
            self._managed()

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.cuda.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: {name.value.decode() if name.value else rc}")

    def _vmm(self) -> None:
        chosen = None
        for loc_type, handles in ((LOC_HOST_NUMA, 1), (LOC_HOST_NUMA, 0), (LOC_HOST, 0)):
            prop = _AllocProp()
            prop.type = 1  # pinned
            prop.requestedHandleTypes = handles
            prop.location = _Location(loc_type, 0)
            gran = ctypes.c_size_t(0)
            if self.cuda.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 1) != 0:
                continue
            size = (self.nbytes + gran.value - 1) // gran.value * gran.value
            if self.cuda.cuMemCreate(ctypes.byref(self.handle), ctypes.c_size_t(size), ctypes.byref(prop),
                                     ctypes.c_ulonglong(0)) == 0:
                chosen = (loc_type, handles, gran.value, size)
                break
        if chosen is None:
            raise RuntimeError("cuMemCreate of host memory is not supported here (tried HOST_NUMA and HOST)")
        loc_type, handles, gran, size = chosen
        self.size = size
        self.info.update(location="HOST_NUMA" if loc_type == LOC_HOST_NUMA else "HOST", posix_fd_handle=bool(handles),
                         granularity=gran)
        self._check(self.cuda.cuMemAddressReserve(ctypes.byref(self.ptr), ctypes.c_size_t(size),
                                                  ctypes.c_size_t(gran), ctypes.c_uint64(0), ctypes.c_ulonglong(0)),
                    "cuMemAddressReserve")
        self._check(self.cuda.cuMemMap(self.ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), self.handle,
                                       ctypes.c_ulonglong(0)), "cuMemMap")
        desc = _AccessDesc(_Location(LOC_DEVICE, self.device), 3)
        self._check(self.cuda.cuMemSetAccess(self.ptr, ctypes.c_size_t(size), ctypes.byref(desc), ctypes.c_size_t(1)),
                    "cuMemSetAccess")
        host = _AccessDesc(_Location(LOC_HOST_NUMA, 0), 3)
        rc = self.cuda.cuMemSetAccess(self.ptr, ctypes.c_size_t(size), ctypes.byref(host), ctypes.c_size_t(1))
        self.info["host_access_granted"] = rc == 0  # the CPU may then use the same address

    def _managed(self) -> None:
        self.size = self.nbytes
        self._check(self.cuda.cuMemAllocManaged(ctypes.byref(self.ptr), ctypes.c_size_t(self.nbytes), 1),
                    "cuMemAllocManaged")
        host = _Location(LOC_HOST, 0)
        self._check(self.cuda.cuMemAdvise_v2(self.ptr, ctypes.c_size_t(self.nbytes), 3, host),
                    "cuMemAdvise(preferred location: host)")
        self._check(self.cuda.cuMemAdvise_v2(self.ptr, ctypes.c_size_t(self.nbytes), 5,
                                             _Location(LOC_DEVICE, self.device)), "cuMemAdvise(accessed by GPU)")
        self._check(self.cuda.cuMemPrefetchAsync_v2(self.ptr, ctypes.c_size_t(self.nbytes), host, 0,
                                                    ctypes.c_void_p(0)), "cuMemPrefetchAsync(host)")
        self._check(self.cuda.cuCtxSynchronize(), "cuCtxSynchronize")

    def tensor(self) -> torch.Tensor:
        owner = self

        class _Iface:
            __cuda_array_interface__ = {"shape": (owner.nbytes,), "typestr": "|u1",
                                        "data": (owner.ptr.value, False), "version": 3, "strides": None}

        try:
            return torch.as_tensor(_Iface(), device=f"cuda:{self.device}")
        except (RuntimeError, TypeError, ValueError):
            import cupy  # torch may refuse a pointer it cannot classify; cupy wraps any address

            mem = cupy.cuda.UnownedMemory(owner.ptr.value, owner.nbytes, owner)
            return torch.from_dlpack(cupy.ndarray((owner.nbytes,), dtype=cupy.uint8,
                                                  memptr=cupy.cuda.MemoryPointer(mem, 0)))

    def close(self) -> None:
        torch.cuda.synchronize()
        if self.kind == "vmm_host":
            self.cuda.cuMemUnmap(self.ptr, ctypes.c_size_t(self.size))
            self.cuda.cuMemRelease(self.handle)
            self.cuda.cuMemAddressFree(self.ptr, ctypes.c_size_t(self.size))
        else:
            self.cuda.cuMemFree_v2(self.ptr)


CPU_ACCESS_PROBE = """
import ctypes, sys, torch
sys.path.insert(0, sys.argv[1])
from benchmarks.gather_sweep import DriverMemory
torch.zeros(1, device="cuda")
mem = DriverMemory("vmm_host", 2 << 20, torch.cuda.current_device())
if not mem.info.get("host_access_granted"):
    print("no-host-access")
    sys.exit(0)
buf = mem.tensor()
buf[:64].copy_(torch.arange(64, dtype=torch.uint8, device="cuda"))
torch.cuda.synchronize()
print("cpu-read-ok" if ctypes.string_at(mem.ptr.value, 64) == bytes(range(64)) else "cpu-read-mismatch")
"""


def vmm_cpu_access() -> str:
    """Whether the CPU can read a cuMemCreate host allocation at its device address, probed in a
    child process (a mapping the CPU cannot use would kill the process that touches it)."""
    import subprocess

    try:
        r = subprocess.run([sys.executable, "-c", CPU_ACCESS_PROBE, ROOT], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "probe timed out"
    lines = r.stdout.strip().splitlines()
    return lines[-1] if r.returncode == 0 and lines else f"probe died (exit {r.returncode}): {r.stderr.strip()[-300:]}"


# --- the sweep -------------------------------------------------------------------------------


def fill_random(dst: torch.Tensor, seed: int) -> None:
    """Random bytes made on the GPU, 256 MiB at a time, written into ``dst`` (uint8, any device)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    step = 256 * MiB
    for a in range(0, dst.numel(), step):
        b = min(dst.numel(), a + step)
        dst[a:b].copy_(torch.randint(0, 256, (b - a,), dtype=torch.uint8, device="cuda", generator=gen))
    torch.cuda.synchronize()


def sweep_bars(results: Dict[str, List[Dict]]) -> Dict[str, float]:
    """The sweep's summary figures: the default op's 512 B gather against memcpy and the DMA
    path, the best knob setting against the default, and host allocation kinds against shared
    memory registered with cudaHostRegister (what is measured; absent ones are left out)."""
    def gbps(section: str, name: str) -> Optional[float]:
        rec = next((r for r in results.get(section, []) if r.get("name") == name and "gbps" in r), None)
        return rec["gbps"] if rec is not None else None

    bars: Dict[str, float] = {}
    default = gbps("knobs", "512B op default")
    if default:
        first = next((r for r in results.get("knobs", []) if r.get("name") == "512B op default"), {})
        if "vs_memcpy" in first:
            bars["op_512B_vs_memcpy"] = first["vs_memcpy"]
        dma = gbps("ceiling", "512B DMA path (CPU index_select + copy)")
        if dma:
            bars["op_512B_vs_dma"] = default / dma
        tuned = [r["gbps"] for r in results.get("knobs", []) if r.get("name", "").startswith("512B op ") and "=" in
                 r.get("name", "") and "gbps" in r]
        if tuned:
            bars["best_knob_512B_over_default"] = max(tuned) / default
    registered = next((r["gbps"] for r in results.get("alloc", []) if r.get("name", "").startswith("shm+cudaHostRegister")
                       and "gbps" in r), None)
    for r in results.get("alloc", []):
        if registered and "gbps" in r and not r["name"].startswith("shm+cudaHostRegister"):
            bars[f"{r['name'].split()[0]}_over_registered"] = r["gbps"] / registered
    return bars


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table-gib", type=float, default=16.0)
    ap.add_argument("--alloc-gib", type=float, default=8.0, help="size of each table in the alloc section (0: skip)")
    ap.add_argument("--rows", type=int, default=100_000, help="rows per call (one minibatch)")
    ap.add_argument("--row-bytes", default="512,128", help="row sizes of the knob section (float32 rows)")
    ap.add_argument("--iters", type=int, default=12, help="timed calls (fresh indices) per measurement")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1 GiB table, 3 iterations")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args()
    if args.quick:
        args.table_gib, args.alloc_gib, args.iters, args.warmup = 1.0, 0.25, 3, 1
    if not torch.cuda.is_available() or not zc.gpu_backed():
        print("gather_sweep needs a CUDA GPU and a CUDA build of pytorch_zerocopy", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.set_num_threads(os.cpu_count() or 1)
    timer = Timer(args.iters, args.warmup)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    results: Dict[str, List[Dict]] = {"ceiling": [], "knobs": [], "rows": [], "cache": [], "stride": [],
                                      "alloc": []}

    def measure(section: str, name: str, nbytes: int, rows: int, seconds: Callable[[], float],
                check: Optional[Callable[[], None]] = None, **extra) -> Dict:
        """Runs check() and times seconds(); a failure is recorded and the sweep goes on."""
        try:
            if check is not None:
                check()
            t = seconds()
        except Exception as e:  # noqa: BLE001 - one broken variant must not cost the whole run
            rec = {"name": name, "error": f"{type(e).__name__}: {e}"[:500]}
            results[section].append(rec)
            print(f"[{section}] {name:<44} FAILED {rec['error']}", flush=True)
            return rec
        rec = {"name": name, "bytes": nbytes, "rows": rows, "ms": t * 1e3, "gbps": nbytes / t / 1e9,
               "mrows_per_s": rows / t / 1e6, **extra}
        rec["vs_memcpy"] = rec["gbps"] / ceiling
        results[section].append(rec)
        tail = " ".join(f"{k}={v}" for k, v in extra.items())
        print(f"[{section}] {name:<44} {rec['gbps']:7.1f} GB/s {rec['vs_memcpy']:5.2f}x {rec['mrows_per_s']:7.1f} "
              f"Mrows/s {rec['ms']:7.3f} ms {tail}", flush=True)
        return rec

    table_bytes = int(args.table_gib * GiB)
    t0 = time.perf_counter()
    table_u8 = zc.empty_unified(table_bytes, torch.uint8)
    alias_u8 = _unified._C.device_alias(table_u8, dev)
    fill_random(alias_u8, 0)
    t_fill = time.perf_counter() - t0
    t0 = time.perf_counter()
    gpu_u8 = alias_u8.clone()
    print(f"table {table_bytes / GiB:.1f} GiB: allocated, registered and filled in {t_fill:.1f} s; GPU copy "
          f"{time.perf_counter() - t0:.1f} s; {sms} SMs", flush=True)
    ceiling = pinned_memcpy_gbs(256 * MiB, 9)
    print(f"pinned memcpy H2D: {ceiling:.1f} GB/s", flush=True)

    def views(row_bytes: int):
        rows = table_bytes // row_bytes
        width = row_bytes // 4
        u = table_u8[: rows * row_bytes].view(torch.float32).view(rows, width)
        a = alias_u8[: rows * row_bytes].view(torch.float32).view(rows, width)
        g = gpu_u8[: rows * row_bytes].view(torch.float32).view(rows, width)
        h = table_u8.cpu()[: rows * row_bytes].view(torch.float32).view(rows, width)
        return rows, u, a, g, h

    def random_index(rows: int, n: int, sort: bool = False):
        def make(k: int) -> torch.Tensor:
            g = torch.Generator(device=dev).manual_seed(1000 * n + k)
            idx = torch.randint(0, rows, (n,), device=dev, generator=g)
            return torch.sort(idx).values if sort else idx
        return make

    # --- ceiling, baselines and knobs at one minibatch -------------------------------------
    n = args.rows
    for row_bytes in [int(b) for b in args.row_bytes.split(",") if b.strip()]:
        rows, u, alias, gpu, host = views(row_bytes)
        nbytes = n * row_bytes
        fresh = random_index(rows, n)
        presorted = random_index(rows, n, sort=True)
        tag = f"{row_bytes}B"

        def verify(what: str) -> None:
            """The op under the current knobs returns the right rows (bitwise, sampled)."""
            idx = fresh(99)
            got = zc.gather_rows(u, idx, check_bounds=False)
            probe = torch.randint(0, n, (4096,), device=dev)
            if not torch.equal(got[probe].cpu().view(torch.int32), host[idx[probe].cpu()].view(torch.int32)):
                raise RuntimeError(f"gather_rows returned wrong rows ({tag}, {what})")

        out = torch.empty(n, row_bytes // 4, device=dev)
        pinned = torch.empty(n, row_bytes // 4, pin_memory=True)
        measure("ceiling", f"{tag} gpu-memory table", nbytes, n,
             lambda: timer.fresh(lambda i: zc.gather_rows(gpu, i, out=out, check_bounds=False), fresh))

        def dma(i: torch.Tensor) -> None:
            torch.index_select(host, 0, i, out=pinned)
            out.copy_(pinned, non_blocking=True)

        measure("ceiling", f"{tag} DMA path (CPU index_select + copy)", nbytes, n,
             lambda: timer.wall(dma, lambda k: fresh(k).cpu()))
        for knobs in KNOBS:
            with EnvKnobs(knobs):
                measure("knobs", f"{tag} op {knob_name(knobs)}", nbytes, n,
                        lambda: timer.fresh(lambda i: zc.gather_rows(u, i, out=out, check_bounds=False), fresh),
                        check=lambda: verify(knob_name(knobs)))
        for frac in GRID_FRACTIONS:
            blocks = max(1, int(round(sms * frac)))
            with EnvKnobs({"GRID_BLOCKS": str(blocks)}):
                measure("knobs", f"{tag} op GRID_BLOCKS={blocks} ({frac:g}/SM)", nbytes, n,
                        lambda: timer.fresh(lambda i: zc.gather_rows(u, i, out=out, check_bounds=False), fresh),
                        check=lambda: verify(f"GRID_BLOCKS={blocks}"))
        fixed = fresh(7)
        measure("knobs", f"{tag} op, one index repeated", nbytes, n,
             lambda: timer.fresh(lambda i: zc.gather_rows(u, fixed, out=out, check_bounds=False), fresh))

        def trusted(i: torch.Tensor) -> None:
            zc.gather_rows(u, i, out=out, index_sorted=True, check_bounds=False)

        measure("knobs", f"{tag} kernel alone (presorted index)", nbytes, n, lambda: timer.fresh(trusted, presorted))
        measure("knobs", f"{tag} random order, no sort", nbytes, n, lambda: timer.fresh(trusted, fresh))
        measure("knobs", f"{tag} torch index_select, presorted", nbytes, n,
             lambda: timer.fresh(lambda i: torch.index_select(alias, 0, i, out=out), presorted))
        del out, pinned

    # --- rows per call -------------------------------------------------------------------
    row_bytes = 512
    rows, u, alias, gpu, host = views(row_bytes)
    for count in ROWS_PER_CALL:
        make = random_index(rows, count)
        sample = make(0)
        regions = {f"regions_{name}": distinct_regions(sample, row_bytes, shift)
                   for name, shift in (("4k", 12), ("64k", 16), ("2m", 21))}
        out = torch.empty(count, row_bytes // 4, device=dev)
        rec = measure("rows", f"512B op, {count} rows/call", count * row_bytes, count,
                      lambda: timer.fresh(lambda i: zc.gather_rows(u, i, out=out, check_bounds=False), make),
                      **regions)
        if "error" not in rec:
            for name in ("4k", "64k", "2m"):
                rec[f"m_{name}_regions_per_s"] = rec[f"regions_{name}"] / (rec["ms"] / 1e3) / 1e6
        del out

    # --- the cached gather: one kernel for cache hits (GPU memory) and misses (host) ---------
    cache_rows = rows // 10
    slot_of = torch.full((rows,), -1, dtype=torch.int32, device=dev)
    slot_of[:cache_rows] = torch.arange(cache_rows, dtype=torch.int32, device=dev)
    cache = gpu[:cache_rows]
    out = torch.empty(n, row_bytes // 4, device=dev)
    measure("cache", "512B op, no cache (same rows as hit 0)", n * row_bytes, n,
            lambda: timer.fresh(lambda i: zc.gather_rows(u, i, out=out, check_bounds=False), random_index(rows, n)))

    def cached(i: torch.Tensor) -> None:
        torch.ops.zerocopy.gather_rows_cached.out(u, cache, slot_of, i, check_bounds=False, out=out)

    for hit in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0):
        def make(k: int, hit=hit) -> torch.Tensor:
            g = torch.Generator(device=dev).manual_seed(77 + k)
            hits = torch.rand(n, device=dev, generator=g) < hit
            in_cache = torch.randint(0, cache_rows, (n,), device=dev, generator=g)
            other = torch.randint(cache_rows, rows, (n,), device=dev, generator=g)
            return torch.where(hits, in_cache, other)

        def verify_cached(make=make, hit=hit) -> None:
            idx = make(5)
            got = torch.ops.zerocopy.gather_rows_cached(u, cache, slot_of, idx, check_bounds=False)
            probe = torch.randint(0, n, (4096,), device=dev)
            if not torch.equal(got[probe].cpu().view(torch.int32), host[idx[probe].cpu()].view(torch.int32)):
                raise RuntimeError(f"gather_rows_cached returned wrong rows (hit rate {hit})")

        measure("cache", f"512B cached op, hit rate {hit:.2f}", n * row_bytes, n,
                lambda: timer.fresh(cached, make), check=verify_cached, hit_rate=hit)
    del out, slot_of, cache

    # --- stride probe --------------------------------------------------------------------
    count = 32768
    out = torch.empty(count, row_bytes // 4, device=dev)

    def trusted(i: torch.Tensor) -> None:
        zc.gather_rows(u, i, out=out, index_sorted=True, check_bounds=False)

    for stride in STRIDES:
        step = stride // row_bytes
        span = count * step
        if span > rows:
            continue
        windows = rows // span

        def make(k: int, step=step, span=span, windows=windows) -> torch.Tensor:
            base = (k * 7919 % windows) * span + (k * 13) % step
            return base + torch.arange(count, device=dev) * step

        measure("stride", f"512B rows, one every {stride} B", count * row_bytes, count,
                lambda: timer.fresh(trusted, make), stride=stride)
    del out

    # --- host allocations ---------------------------------------------------------------
    if args.alloc_gib > 0:
        alloc_bytes = int(args.alloc_gib * GiB)
        arows = alloc_bytes // row_bytes
        out = torch.empty(n, row_bytes // 4, device=dev)
        make = random_index(arows, n, sort=True)
        shm = table_u8[: arows * row_bytes].view(torch.float32).view(arows, row_bytes // 4)
        measure("alloc", f"shm+cudaHostRegister {args.alloc_gib:g} GiB", n * row_bytes, n,
                lambda: timer.fresh(lambda i: zc.gather_rows(shm, i, out=out, index_sorted=True, check_bounds=False),
                                    make))
        for kind in ("vmm_host", "managed_host"):
            t0 = time.perf_counter()
            mem = None
            try:
                mem = DriverMemory(kind, arows * row_bytes, dev.index)
                buf = mem.tensor()
                fill_random(buf, 3)
                setup = time.perf_counter() - t0
                table = buf.view(torch.float32).view(arows, row_bytes // 4)

                def driver_table(i: torch.Tensor, table=table) -> None:
                    zc.gather_rows(table, i, out=out, index_sorted=True, check_bounds=False)

                info = {k: v for k, v in mem.info.items() if k != "kind"}
                measure("alloc", f"{kind} {args.alloc_gib:g} GiB", n * row_bytes, n,
                        lambda: timer.fresh(driver_table, make), setup_s=round(setup, 2), **info)
                del buf, table, driver_table
            except Exception as e:  # noqa: BLE001 - record why a kind is unavailable and go on
                results["alloc"].append({"name": kind, "error": f"{type(e).__name__}: {e}"})
                print(f"[alloc] {kind}: unavailable: {type(e).__name__}: {e}", flush=True)
            finally:
                if mem is not None:
                    mem.close()
        del out

    if args.alloc_gib > 0:
        results["alloc"].append({"name": "vmm_host cpu access", "result": vmm_cpu_access()})
        print(f"[alloc] vmm_host cpu access: {results['alloc'][-1]['result']}", flush=True)

    report = {"benchmark": "gather_sweep", "machine": environment(), "sms": sms, "table_bytes": table_bytes,
              "rows_per_call": n, "iters": args.iters, "pinned_memcpy_gbps": ceiling, "bars": sweep_bars(results),
              "results": results, "wall_s": time.perf_counter() - t_start}
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "gather_sweep" + ("_quick" if args.quick else ""))
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=1)
    lines = [f"# gather sweep: {n} rows/call from a {table_bytes / GiB:g} GiB host table",
             "", f"{report['machine'].get('gpu')}, pinned memcpy {ceiling:.1f} GB/s, {sms} SMs", "",
             "| section | measurement | GB/s | x memcpy | M rows/s | ms | extra |", "|---|---|---:|---:|---:|---:|---|"]
    for section, recs in results.items():
        for r in recs:
            if "error" in r or "result" in r:
                lines.append(f"| {section} | {r['name']} | - | - | - | - | {r.get('error') or r.get('result')} |")
                continue
            extra = ", ".join(f"{k}={v if not isinstance(v, float) else round(v, 1)}" for k, v in r.items()
                              if k not in ("name", "bytes", "rows", "ms", "gbps", "mrows_per_s", "vs_memcpy"))
            lines.append(f"| {section} | {r['name']} | {r['gbps']:.1f} | {r['vs_memcpy']:.2f} | "
                         f"{r['mrows_per_s']:.1f} | {r['ms']:.3f} | {extra} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {stem}.json/.md; wall {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
