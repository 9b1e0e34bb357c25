"""EMOGI's public code (Min et al., VLDB 2021) as a peer measured in the same run: build it from a
local checkout, run it on ``.bel`` files, read the times it prints.

The checkout is the user's (``--emogi DIR``); nothing here downloads, copies or changes its
sources. :func:`build` runs its Makefile with ``NVCCFLAGS`` for the GPU at hand (the Makefile's
own flags name Pascal and Volta only) and builds the 4-byte-id programs ``bfs_32``,
``sssp_32``, ``cc_32`` and ``pagerank_32`` in the checkout. Each program reads
``<name>.bel.col`` / ``.dst`` (and ``.val`` for SSSP), which :func:`pytorch_zerocopy.graph.save_bel`
writes, and is run once per (kernel, memory) pair:

* kernels (``-t``): 0 one thread per vertex (BFS only), 1 a warp per vertex, 2 a warp per 8
  vertices with 128-byte aligned reads (EMOGI's best);
* memory (``-m``): 0 the edge list in GPU memory; 2 managed memory filled by the CPU and
  advised "accessed by" the GPU (EMOGI's direct-access mode, ``UVM_DIRECT``, compared here with
  the package's ``unified`` placement); 1 managed memory advised read-mostly (UVM, not run).

Sources. With ``-i k`` EMOGI searches from ``i * (V // k)``, ``i = 0 .. k-1``; other sources
take one run each with ``-r``. Times are EMOGI's own CUDA-event intervals around its level loop
(its label initialisation and host-side file reading excluded). PageRank runs EMOGI's residual
push to its own stopping rule (a per-vertex residual below ``-l``, default 0.001, on ranks that
sum to about ``(1 - alpha) * V``), so its time compares per iteration, not to a tolerance.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import subprocess
from typing import List, Optional, Sequence


class EmogiProgram(enum.Enum):
    """EMOGI's 4-byte-id programs, by the op they compute."""

    BFS = "bfs_32"
    SSSP = "sssp_32"
    CC = "cc_32"
    PAGERANK = "pagerank_32"


class EmogiMemory(enum.IntEnum):
    """EMOGI's ``-m``: where the edge list lives."""

    GPU = 0
    UVM = 1
    ZERO_COPY = 2


# The package's op names -> EMOGI's program, and the kernels (-t) each program takes.
PROGRAM_OF = {"bfs": EmogiProgram.BFS, "sssp": EmogiProgram.SSSP, "connected_components": EmogiProgram.CC,
              "pagerank": EmogiProgram.PAGERANK}
KERNELS = {EmogiProgram.BFS: (0, 1, 2), EmogiProgram.SSSP: (1, 2), EmogiProgram.CC: (1, 2),
           EmogiProgram.PAGERANK: (1, 2)}
KERNEL_NAMES = {0: "baseline", 1: "coalesce", 2: "coalesce_chunk"}
# The package's placements -> EMOGI's memory mode with the same bytes where they are.
MEMORY_OF = {"unified": EmogiMemory.ZERO_COPY, "cuda": EmogiMemory.GPU}

_SOURCE_RUN = re.compile(r"run\s+(\d+):\s+src\s+(\d+),\s+iteration\s+(\d+),\s+time\s+([0-9.eE+-]+)\s+ms")
_CC_ITERATIONS = re.compile(r"total iterations:\s+(\d+)")
_CC_COMPONENTS = re.compile(r"total components:\s+(\d+)")
_CC_TIME = re.compile(r"total time:\s+([0-9.eE+-]+)\s+ms")
_PAGERANK = re.compile(r"iteration\s+(\d+),\s+time\s+([0-9.eE+-]+)\s+ms")


@dataclasses.dataclass
class EmogiResult:
    """One (program, kernel, memory) configuration: what EMOGI printed, one entry per run.

    ``error`` is set (and the lists may be short) when a program failed or printed no times."""

    op: str
    kernel: int
    memory: EmogiMemory
    sources: List[Optional[int]] = dataclasses.field(default_factory=list)
    ms: List[float] = dataclasses.field(default_factory=list)
    iterations: List[int] = dataclasses.field(default_factory=list)
    components: Optional[int] = None
    error: Optional[str] = None

    @property
    def mean_ms(self) -> Optional[float]:
        return sum(self.ms) / len(self.ms) if self.ms else None

    @property
    def ms_per_iteration(self) -> Optional[float]:
        its = sum(self.iterations)
        return sum(self.ms) / its if its else None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(memory=self.memory.name.lower(), kernel_name=KERNEL_NAMES[self.kernel], mean_ms=self.mean_ms,
                 ms_per_iteration=self.ms_per_iteration)
        return d


def emogi_rule_sources(num_nodes: int, count: int) -> List[int]:
    """The sources of EMOGI's ``-i count``: ``i * (num_nodes // count)``."""
    return [i * (num_nodes // count) for i in range(count)]


def cuda_arch() -> Optional[str]:
    """``"90"`` for an H100: the compute capability of the current GPU, None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


# Force-included into EMOGI's sources when built for a GPU: the cudaMemAdvise overload CUDA 13
# removed, which they call (a no-op before CUDA 13).
CUDA13_SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "emogi_cuda13.h")


def build(checkout: str, arch: Optional[str], timeout: float = 600) -> None:
    """``make`` the four programs in ``checkout`` for ``arch`` (the Makefile's flags when None);
    raises RuntimeError with the end of make's output when it fails."""
    cmd = ["make", "-C", checkout] + [p.value for p in EmogiProgram]
    if arch:
        cmd.append(f"NVCCFLAGS=-gencode arch=compute_{arch},code=sm_{arch} -include {CUDA13_SHIM}")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"building EMOGI failed ({' '.join(cmd)}):\n{(out.stdout + out.stderr)[-3000:]}")


def commands(checkout: str, op: str, bel: str, kernel: int, memory: EmogiMemory,
             sources: Sequence[Optional[int]], num_nodes: int, alpha: float) -> List[List[str]]:
    """The command lines that run ``op`` once per source (BFS, SSSP) or once (CC, PageRank):
    one ``-i`` run when the sources are EMOGI's own, else one ``-r`` run per source."""
    program = PROGRAM_OF[op]
    base = [os.path.join(checkout, program.value), "-f", bel, "-t", str(kernel), "-m", str(int(memory))]
    if program is EmogiProgram.PAGERANK:
        return [base + ["-a", str(alpha)]]
    if program is EmogiProgram.CC:
        return [base]
    if list(sources) == emogi_rule_sources(num_nodes, len(sources)):
        return [base + ["-i", str(len(sources))]]
    return [base + ["-r", str(s)] for s in sources]


def parse(op: str, text: str, into: EmogiResult) -> None:
    """Appends the runs ``text`` (a program's standard output) reports to ``into``."""
    program = PROGRAM_OF[op]
    if program in (EmogiProgram.BFS, EmogiProgram.SSSP):
        for _, src, its, ms in _SOURCE_RUN.findall(text):
            into.sources.append(int(src))
            into.iterations.append(int(its))
            into.ms.append(float(ms))
    elif program is EmogiProgram.CC:
        its, comps, ms = _CC_ITERATIONS.search(text), _CC_COMPONENTS.search(text), _CC_TIME.search(text)
        if its and ms:
            into.sources.append(None)
            into.iterations.append(int(its.group(1)))
            into.ms.append(float(ms.group(1)))
        if comps:
            into.components = int(comps.group(1))
    else:
        for its, ms in _PAGERANK.findall(text):
            into.sources.append(None)
            into.iterations.append(int(its))
            into.ms.append(float(ms))


def run(checkout: str, op: str, bel: str, kernel: int, memory: EmogiMemory, sources: Sequence[Optional[int]],
        num_nodes: int, alpha: float, timeout: float = 600) -> EmogiResult:
    """Runs one configuration; a program that fails, times out or prints no time is recorded in
    ``error`` (with the end of its output), never raised."""
    result = EmogiResult(op, kernel, memory)
    for cmd in commands(checkout, op, bel, kernel, memory, sources, num_nodes, alpha):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            result.error = f"{' '.join(cmd)}: {type(e).__name__}: {e}"
            return result
        found = len(result.ms)
        parse(op, out.stdout, result)
        if out.returncode != 0 or len(result.ms) == found:
            tail = (out.stdout + out.stderr)[-600:].strip()
            result.error = f"{' '.join(cmd)}: exit status {out.returncode}, no time printed" if len(
                result.ms) == found else f"{' '.join(cmd)}: exit status {out.returncode}"
            result.error += f"; output ends: {tail}"
            return result
    return result
