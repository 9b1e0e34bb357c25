"""``zerocopy doctor``: what this machine offers zero-copy GPU access, one line per check.

Every line starts with OK, WARN or FAIL; WARN and FAIL lines say what to do.
"""

from __future__ import annotations

import os
import resource
import shutil
import time
from dataclasses import dataclass
from typing import List, Optional

import torch

from . import numa
from ._build import build_info
from .host_pages import read_text
from .unified import format_bytes, gpu_backed


@dataclass
class Check:
    status: str  # "OK", "WARN" or "FAIL"
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.name:<22} {self.detail}"


def check_build() -> List[Check]:
    info = build_info()
    flavour = f"CUDA {info['cuda_version']} for {info['cuda_archs']}" if info["with_cuda"] else "CPU-only"
    checks = [Check("OK", "torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"),
              Check("OK", "pytorch_zerocopy", f"{info['version']}, built {flavour} against torch {info['torch_version']}")]
    if not info["with_cuda"] and torch.version.cuda is not None:
        checks.append(Check("WARN", "build", "torch has CUDA but this build is CPU-only: reinstall with "
                                             "FORCE_CUDA=1 pip install --no-build-isolation ."))
    if info.get("unguarded_traversal"):
        checks.append(Check("WARN", "build", "benchmark-only build without the traversal kernels' bounds checks "
                                             "(ZEROCOPY_UNGUARDED_TRAVERSAL): a bad graph can fault the GPU; "
                                             "reinstall without it"))
    return checks


def check_gpus() -> List[Check]:
    if not torch.cuda.is_available():
        return [Check("WARN", "GPU", "no CUDA GPU visible: unified tensors run their ops on the CPU")]
    checks = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        checks.append(Check("OK", f"GPU {i}", f"{p.name}, {p.multi_processor_count} SMs, "
                                              f"{format_bytes(p.total_memory)}, compute {p.major}.{p.minor}"))
    driver = numa.nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"])
    if driver:
        checks.append(Check("OK", "driver", driver.splitlines()[0]))
    links = numa.nvidia_smi(["--query-gpu=index,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
                         "pcie.link.width.max", "--format=csv,noheader"])
    for row in links.splitlines():
        parts = [p.strip() for p in row.split(",")]
        if len(parts) != 5:
            continue
        idx, gen, gen_max, width, width_max = parts
        ok = width == width_max
        checks.append(Check("OK" if ok else "WARN", f"PCIe link GPU {idx}",
                            f"gen {gen} (max {gen_max}), x{width} (max x{width_max})"
                            + ("" if ok else ": the link runs narrower than it can; reseat the card or check "
                                             "the slot") + ("; an idle link may report a lower generation" if gen != gen_max else "")))
    if not links:
        checks.append(Check("WARN", "PCIe link", "nvidia-smi not found or unanswered: cannot read link generation/width"))
    return checks


def check_numa(root: str = numa.PCI_ROOT) -> List[Check]:
    """Each GPU's NUMA node (the socket its PCIe link hangs off), beside the host's nodes with
    memory, and where a job on every GPU puts its shared host tables."""
    gpus = numa.gpu_nodes(root)
    if not gpus:
        return []
    nodes = numa.memory_nodes()
    checks = [Check("OK", "NUMA nodes", f"{len(nodes)} with memory ({', '.join(map(str, nodes))})")]
    for index, node in sorted(gpus.items()):
        checks.append(Check("OK", f"NUMA GPU {index}", f"node {node}" if node is not None
                            else "node unknown (one node, or the firmware does not say)"))
    spread = numa.interleave_nodes(len(gpus), gpus)
    if spread:
        checks.append(Check("OK", "NUMA placement", f"a job on GPUs of nodes {', '.join(map(str, spread))} "
                                                    "interleaves its shared host tables over them: each GPU reads "
                                                    "its share locally, every socket link carries an even share"))
    elif len(nodes) > 1 and len({n for n in gpus.values()}) > 1:
        checks.append(Check("WARN", "NUMA placement", "GPUs hang off different nodes, but not every GPU's node is "
                                                      "known: shared host tables stay where first touched, and "
                                                      "some GPUs read them across the socket link"))
    return checks


def check_host() -> List[Check]:
    checks = []
    try:
        st = os.statvfs("/dev/shm")
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        status = "OK" if total >= mem // 2 else "WARN"
        checks.append(Check(status, "/dev/shm", f"{format_bytes(total)} total, {format_bytes(free)} free"
                            + ("" if status == "OK" else ": smaller than half of RAM; shared feature tables must fit "
                               "here: mount -o remount,size=<N>G /dev/shm (docker: --shm-size)")))
    except OSError:
        checks.append(Check("FAIL", "/dev/shm", "missing: shared-memory tables cannot be created; mount a tmpfs there"))
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    checks.append(check_memlock(soft, effective_capabilities()))
    thp = read_text("/sys/kernel/mm/transparent_hugepage/enabled")
    checks.append(Check("OK", "transparent hugepages", (thp or "unknown") + " (GPU-side throughput does not depend on it)"))
    return checks


CAP_IPC_LOCK = 14  # linux/capability.h: exempts a process from RLIMIT_MEMLOCK


def effective_capabilities(status_path: str = "/proc/self/status") -> Optional[int]:
    """The effective capability mask (``CapEff`` of /proc/self/status), None where unreadable."""
    for line in (read_text(status_path) or "").splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split()[1], 16)
            except (IndexError, ValueError):
                return None
    return None


def check_memlock(soft_limit: int, capabilities: Optional[int]) -> Check:
    """What RLIMIT_MEMLOCK means for page-locking host memory here.

    The limit binds every process without CAP_IPC_LOCK, root included (containers run root
    without that capability by default); ``capabilities`` is the effective mask (None: unknown,
    taken as lacking it)."""
    if soft_limit == resource.RLIM_INFINITY:
        return Check("OK", "memlock limit", "unlimited")
    if capabilities is not None and capabilities >> CAP_IPC_LOCK & 1:
        return Check("OK", "memlock limit", f"{format_bytes(soft_limit)} (CAP_IPC_LOCK: not enforced)")
    return Check("WARN", "memlock limit",
                 f"{format_bytes(soft_limit)}, enforced (no CAP_IPC_LOCK"
                 + ("" if capabilities is not None else ": capabilities unreadable") + "): page-locking more host "
                 "memory than that may fail; raise it with ulimit -l unlimited (docker: --ulimit memlock=-1, or "
                 "--cap-add IPC_LOCK)")


def check_partitioning() -> List[Check]:
    if not torch.cuda.is_available():
        # MPS and green contexts split a GPU's SMs; with no GPU there is nothing to recommend.
        return [Check("OK", "GPU partitioning", "not applicable: no CUDA GPU visible (partition='none')")]
    checks = []
    control = shutil.which("nvidia-cuda-mps-control")
    server = shutil.which("nvidia-cuda-mps-server")
    green = getattr(getattr(torch.cuda, "green_contexts", None), "GreenContext", None)
    if control and server:
        checks.append(Check("OK", "CUDA MPS", f"{control}"))
    else:
        checks.append(Check("WARN", "CUDA MPS", "nvidia-cuda-mps-control not on PATH: partition='mps' is unavailable; "
                            "install the CUDA driver utilities"
                            + (" or use partition='green'" if green is not None else "")))
    if green is not None:
        checks.append(Check("OK", "green contexts", "torch.cuda.green_contexts.GreenContext available"))
    else:
        checks.append(Check("WARN", "green contexts", f"not in torch {torch.__version__}: partition='green' needs torch >= 2.9"))
    return checks


def check_bandwidth(seconds: float) -> List[Check]:
    if not gpu_backed():
        return []
    nbytes = 256 << 20
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    copies, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(4):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        copies += 4
    gbps = copies * nbytes / (time.perf_counter() - start) / 1e9
    status = "OK" if gbps >= 20 else "WARN"
    return [Check(status, "pinned H2D copy", f"{gbps:.1f} GB/s"
                  + ("" if status == "OK" else ": below a PCIe Gen4 x16 link; check the link above and NUMA placement"))]


def check_host_memory_kinds() -> List[Check]:
    """The measured gather rate of each zero-copy host memory kind (measured now, in a child
    process, and kept for the plan) and what a ``zerocopy train`` plan picks from it."""
    if not gpu_backed():
        return []
    from .probe import host_read_rates

    rates = host_read_rates(refresh=True)
    if rates is None:
        return [Check("WARN", "host memory kinds", "the measurement failed: plans read the mapped table; run "
                                                   "python -m pytorch_zerocopy.probe to see why")]
    return [Check("OK", "host memory kinds", rates.describe()),
            Check("OK", "plan picks", f"feature tables in {rates.fastest.describe} ({rates.fastest.value}) for "
                                      "zerocopy train on a GPU")]


def run_doctor(bandwidth_seconds: float = 2.0) -> int:
    checks = (check_build() + check_gpus() + check_numa() + check_host() + check_partitioning()
              + check_bandwidth(bandwidth_seconds) + check_host_memory_kinds())
    for c in checks:
        print(c.line())
    return 1 if any(c.status == "FAIL" for c in checks) else 0
