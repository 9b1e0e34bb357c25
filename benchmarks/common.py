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
from typing import Any, Dict

import torch


def environment() -> Dict[str, Any]:
    """Date, versions, host and GPU (name, driver, memory, read with nvidia-smi)."""
    info: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
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
