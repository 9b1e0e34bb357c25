"""Where a machine's shared host tables live when its GPUs hang off several NUMA nodes.

A GPU reads host memory over its PCIe link, which hangs off one socket; a page on another
socket's memory crosses the socket link first. Linux puts a page on the node of the thread that
first touches it, so a table filled by one process lives on one node, and every GPU of the other
sockets reads all of it across the link. Interleaving the table's pages over the nodes of the
GPUs that read it gives every GPU a local share and every socket link an even one.

* :func:`memory_nodes` and :func:`gpu_nodes` read the machine (sysfs; ``nvidia-smi`` for the
  GPUs' PCI addresses, so no CUDA context is made).
* :func:`interleave_nodes` is the decision, taken once for a plan (``Plan.numa_nodes``): the
  nodes of the job's GPUs when they are more than one node with memory, else none (the
  kernel's first-touch placement).
* :func:`interleave` applies it to a host tensor's pages (``mbind(MPOL_INTERLEAVE)``): the
  pages it already has move (those only this process maps), and every later fault of the range,
  by any thread or process that maps it, follows the policy (a shared-memory table keeps it as
  its own). Linux only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import shutil
import subprocess
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .host_pages import read_text

__all__ = ["NumaError", "gpu_nodes", "interleave", "interleave_nodes", "memory_nodes", "pci_sysfs_address"]

NODE_ROOT = "/sys/devices/system/node"
PCI_ROOT = "/sys/bus/pci/devices"
_MPOL_INTERLEAVE = 3
_MPOL_MF_MOVE = 1 << 1
_MASK_BITS = 1024
_SYS_MBIND = {"x86_64": 237, "aarch64": 235}


class NumaError(OSError):
    """A NUMA placement the kernel refused (an unknown node, a range it cannot bind)."""


def _parse_list(text: str) -> List[int]:
    """A sysfs node list (``0-1,3``) as its numbers."""
    out: List[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def memory_nodes(root: str = NODE_ROOT) -> List[int]:
    """The host's NUMA nodes that have memory (``[0]`` where sysfs does not say)."""
    listed = read_text(os.path.join(root, "has_memory"))
    if listed:
        return _parse_list(listed)
    try:
        found = sorted(int(n[4:]) for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit())
    except OSError:
        found = []
    return found or [0]


def pci_sysfs_address(bus_id: str) -> str:
    """nvidia-smi's PCI bus id (``00000000:1B:00.0``) as sysfs names the device (``0000:1b:00.0``)."""
    domain, _, rest = bus_id.strip().partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}" if rest else bus_id.strip().lower()


def nvidia_smi(args: List[str]) -> str:
    """``nvidia-smi``'s output for ``args`` ("" where it is missing or fails)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ""
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def gpu_nodes(root: str = PCI_ROOT) -> Dict[int, Optional[int]]:
    """The NUMA node of each GPU this process may use, by its CUDA index (``CUDA_VISIBLE_DEVICES``
    order when set, by index or UUID); None where the firmware does not say. Empty without
    ``nvidia-smi``."""
    rows = nvidia_smi(["--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"])
    by_index: Dict[str, Optional[int]] = {}
    by_uuid: Dict[str, Optional[int]] = {}
    for row in rows.splitlines():
        parts = [p.strip() for p in row.split(",")]
        if len(parts) != 3:
            continue
        node = read_text(os.path.join(root, pci_sysfs_address(parts[2]), "numa_node"))
        value = int(node) if node and node.lstrip("-").isdigit() and int(node) >= 0 else None
        by_index[parts[0]] = value
        by_uuid[parts[1]] = value
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return {int(i): node for i, node in by_index.items()}
    out: Dict[int, Optional[int]] = {}
    for cuda_index, name in enumerate(v.strip() for v in visible.split(",") if v.strip()):
        if name in by_index:
            out[cuda_index] = by_index[name]
        else:
            match = [node for uuid, node in by_uuid.items() if uuid.startswith(name)]
            if len(match) != 1:
                break  # CUDA stops at the first entry it cannot resolve
            out[cuda_index] = match[0]
    return out


def interleave_nodes(gpus: int, nodes: Optional[Dict[int, Optional[int]]] = None) -> Tuple[int, ...]:
    """The nodes a job on GPUs ``0 .. gpus - 1`` interleaves its shared host tables over: the
    nodes of those GPUs (``nodes``: :func:`gpu_nodes`, read when None) when they are more than
    one node with memory; ``()`` otherwise (one node, one GPU, or a node unknown). Reads
    ``nvidia-smi`` only on a host of several nodes."""
    have = memory_nodes()
    if gpus < 2 or len(have) < 2:
        return ()
    nodes = gpu_nodes() if nodes is None else nodes
    used = [nodes.get(i) for i in range(gpus)]
    if any(n is None or n not in have for n in used) or len(set(used)) < 2:
        return ()
    return tuple(sorted(set(used)))  # type: ignore[arg-type]


def interleave(t: torch.Tensor, nodes: Sequence[int]) -> bool:
    """Interleaves the pages of the CPU tensor ``t``'s storage over ``nodes`` (see the module
    docstring; the storage should own its pages, as a shared-memory table does); nothing for
    ``()``. Returns whether the policy was set. Where this process may not set memory policies
    (a container's seccomp profile without ``CAP_SYS_NICE``, a kernel without NUMA, a platform
    this module does not know) it warns and returns False: the table stays where first touched.
    Raises :class:`NumaError` when the kernel refuses the nodes."""
    nodes = tuple(int(n) for n in nodes)
    if not nodes:
        return False
    if t.device.type != "cpu":
        raise ValueError(f"interleave: needs a CPU tensor, got one on {t.device}")
    if any(n < 0 or n >= _MASK_BITS for n in nodes):
        raise NumaError(f"interleave: NUMA nodes must lie in [0, {_MASK_BITS}), got {list(nodes)}")
    number = _SYS_MBIND.get(platform.machine()) if platform.system() == "Linux" else None
    if number is None:
        warnings.warn(f"interleave: NUMA placement is not supported on {platform.system()} {platform.machine()}: "
                      "shared host tables stay where first touched", RuntimeWarning, stacklevel=2)
        return False
    storage = t.untyped_storage()
    page = os.sysconf("SC_PAGE_SIZE")
    start = storage.data_ptr() // page * page
    end = storage.data_ptr() + storage.nbytes()
    if end <= start:
        return False
    length = (end - start + page - 1) // page * page
    mask = (ctypes.c_ulong * (_MASK_BITS // 64))()
    for n in nodes:
        mask[n // 64] |= 1 << (n % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(number), ctypes.c_void_p(start), ctypes.c_ulong(length),
                      ctypes.c_int(_MPOL_INTERLEAVE), mask, ctypes.c_ulong(_MASK_BITS + 1),
                      ctypes.c_uint(_MPOL_MF_MOVE))
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EPERM, errno.ENOSYS):
        warnings.warn(f"interleave: this process may not set NUMA memory policies ({os.strerror(err)}; in a "
                      "container, CAP_SYS_NICE allows it): shared host tables stay where first touched, and GPUs "
                      "on other sockets read them across the socket link", RuntimeWarning, stacklevel=2)
        return False
    raise NumaError(err, f"interleave: mbind over nodes {list(nodes)} of {length} bytes failed: "
                         f"{os.strerror(err)} (the nodes must have memory and be allowed to this process)")
