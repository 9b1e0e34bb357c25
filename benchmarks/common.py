"""What every benchmark records: the machine it ran on and the pinned-memcpy H2D ceiling.

Importable as ``benchmarks.common`` once the repository root is on ``sys.path`` (each script
puts it there). Nothing here initialises CUDA except :func:`pinned_memcpy_gbs`, so a
supervising process that must stay free of a GPU context can call :func:`environment`.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import time
from typing import Any, Dict, Optional

import torch


def cpu_model() -> Optional[str]:
    """The host CPU's model name (``/proc/cpuinfo``), or None."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def host_speed() -> Dict[str, float]:
    """What one host thread does per unit of time, for comparing host-bound rows of runs made on
    different hosts: ``python_loop_ms``, a fixed pure-Python loop, and ``torch_op_us``, one small
    CPU torch op (dispatch and allocation); medians of 5."""
    def loop() -> None:
        x = 0
        for i in range(200_000):
            x += i & 7

    t = torch.zeros(16)

    def ops() -> None:
        for _ in range(2000):
            t.add(1)

    def median_s(fn) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return sorted(times)[2]

    return {"python_loop_ms": median_s(loop) * 1e3, "torch_op_us": median_s(ops) / 2000 * 1e6}


def environment() -> Dict[str, Any]:
    """Date, versions, host (its CPU model and :func:`host_speed`) and GPU (name, driver,
    memory, read with nvidia-smi)."""
    info: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "host_speed": host_speed(),
        "gpu": None,
        "driver": None,
        "gpu_memory": None,
    }
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            name, driver, memory = [x.strip() for x in out.stdout.strip().splitlines()[0].split(",")]
            info.update(gpu=name, driver=driver, gpu_memory=memory)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return info


def pinned_memcpy_gbs(nbytes: int = 1 << 30, reps: int = 7) -> float:
    """Pinned host-to-device cudaMemcpy bandwidth in GB/s: the median of ``reps`` timed copies
    (CUDA events) after two untimed ones. Every zero-copy figure is divided by this."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(7)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for _ in range(2):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    times.sort()
    return nbytes / times[len(times) // 2] / 1e9
