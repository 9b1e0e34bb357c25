"""Host tables backed by huge pages, where the machine allows, for the paths whose address
translation is the CPU's: the DMA path's CPU gather, the CPU sampler, CPU traversal.

Random reads of a large table miss the CPU's TLB on nearly every access with 4 KiB pages; 2 MiB
pages cover 512 times more memory per TLB entry (the page-size seed paper measured 1.3-1.6x on
graph analytics). Two kinds:

* ``HostPages.THP``: transparent huge pages asked for with ``madvise(MADV_HUGEPAGE)`` before the
  memory is first touched. Shared tables are shmem (memfd) and need
  ``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` to allow it (``advise``, ``within_size``,
  ``always`` or ``force``); private tables need ``.../enabled`` set to ``madvise`` or ``always``.
  The kernel grants huge pages as it can (fragmented memory gets fewer): :func:`huge_bytes`
  says how much of a table it got.
* ``HostPages.HUGETLB``: 2 MiB pages from the hugetlbfs pool (``memfd_create(MFD_HUGETLB)``),
  reserved when the table is made; the pool must hold enough free pages
  (``/proc/sys/vm/nr_hugepages``).

:func:`empty_host` makes the table, or, when the machine does not allow the kind asked for,
falls back to 4 KiB pages with a warning that says why and how to enable it (``strict=True``
raises instead). Shared tables are torch shared-memory storages: ``torch.multiprocessing``
children map the same pages, and ``.to("unified")`` maps them for the GPU (whose own
translation of host memory does not depend on the host page size).
"""

from __future__ import annotations

import ctypes
import enum
import math
import mmap
import os
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

__all__ = ["HostPages", "HugePageSupport", "empty_host", "huge_bytes", "huge_page_support"]

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_MFD_HUGETLB = 0x0004
_THP = "/sys/kernel/mm/transparent_hugepage"


class HostPages(enum.Enum):
    SMALL = "small"      # the kernel's base pages (4 KiB)
    THP = "thp"          # transparent huge pages, asked for with madvise
    HUGETLB = "hugetlb"  # 2 MiB pages from the hugetlbfs pool


def read_text(path: str) -> Optional[str]:
    """The stripped text of a kernel file (procfs, sysfs), or None where it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _selected(setting: Optional[str]) -> Optional[str]:
    """The bracketed choice of a sysfs multiple-choice file ('always [madvise] never')."""
    if setting is None:
        return None
    for word in setting.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return setting


@dataclass(frozen=True)
class HugePageSupport:
    """What this machine allows: THP settings for private and shared memory, and the hugetlbfs
    pool's free 2 MiB pages."""

    thp_private: Optional[str]
    thp_shared: Optional[str]
    hugetlb_free_pages: int
    hugetlb_page_bytes: int

    def unavailable(self, pages: HostPages, shared: bool, nbytes: int) -> Optional[str]:
        """Why a table of ``nbytes`` cannot have ``pages`` here, or None when it can."""
        if pages is HostPages.SMALL:
            return None
        if pages is HostPages.THP:
            if shared:
                if self.thp_shared not in ("advise", "within_size", "always", "force"):
                    return (f"transparent huge pages for shared memory are off ({_THP}/shmem_enabled = "
                            f"{self.thp_shared}); as root, `echo advise > {_THP}/shmem_enabled` allows them")
            elif self.thp_private not in ("madvise", "always"):
                return (f"transparent huge pages are off ({_THP}/enabled = {self.thp_private}); as root, "
                        f"`echo madvise > {_THP}/enabled` allows them")
            return None
        need = math.ceil(nbytes / max(1, self.hugetlb_page_bytes))
        if self.hugetlb_free_pages < need:
            return (f"the hugetlbfs pool has {self.hugetlb_free_pages} free {self.hugetlb_page_bytes >> 20} MiB pages, "
                    f"the table needs {need}; as root, raise /proc/sys/vm/nr_hugepages by "
                    f"{need - self.hugetlb_free_pages}")
        return None


def huge_page_support() -> HugePageSupport:
    free, size = 0, HUGE_PAGE
    for line in (read_text("/proc/meminfo") or "").splitlines():
        if line.startswith("HugePages_Free:"):
            free = int(line.split()[1])
        elif line.startswith("Hugepagesize:"):
            size = int(line.split()[1]) * 1024
    return HugePageSupport(_selected(read_text(f"{_THP}/enabled")), _selected(read_text(f"{_THP}/shmem_enabled")),
                           free, size)


def _madvise_huge(address: int, nbytes: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = address - address % mmap.PAGESIZE
    length = (address + nbytes - start + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
    if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_HUGEPAGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise(MADV_HUGEPAGE) failed: {os.strerror(err)}")


def _shared_from_memfd(nbytes: int, flags: int, round_to: int) -> torch.UntypedStorage:
    """A torch shared-memory storage over a new memfd (children that receive it map the fd)."""
    size = max(round_to, math.ceil(nbytes / round_to) * round_to)
    fd = os.memfd_create("pytorch_zerocopy-table", flags)
    try:
        os.ftruncate(fd, size)
        return torch.UntypedStorage._new_shared_fd_cpu(fd, size)
    finally:
        os.close(fd)


def _private_anonymous(nbytes: int) -> torch.Tensor:
    """Private anonymous memory starting on a 2 MiB boundary, advised for huge pages (bytes)."""
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(region, dtype=torch.uint8)  # keeps the mapping alive
    offset = (-whole.data_ptr()) % HUGE_PAGE
    region.madvise(mmap.MADV_HUGEPAGE)
    return whole[offset:offset + nbytes]


def empty_host(
    shape: Union[int, Sequence[int]],
    dtype: torch.dtype = torch.float32,
    *,
    pages: HostPages = HostPages.THP,
    shared: bool = True,
    strict: bool = False,
) -> torch.Tensor:
    """An uninitialised host tensor backed by ``pages`` (see the module docstring).

    ``shared``: torch shared memory (children of ``torch.multiprocessing`` map the same pages;
    ``.to("unified")`` maps it for the GPU); otherwise private memory of this process. When the
    machine does not allow ``pages``, a warning says why and 4 KiB pages are used, or, with
    ``strict``, ``RuntimeError`` is raised. Huge pages are granted when memory is first
    touched; :func:`huge_bytes` reports what was granted.
    """
    if not isinstance(pages, HostPages):
        raise TypeError(f"pages must be a HostPages, got {pages!r}")
    shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    reason = huge_page_support().unavailable(pages, shared, nbytes)
    if reason is not None:
        message = f"empty_host: {pages.name} pages unavailable: {reason}"
        if strict:
            raise RuntimeError(message)
        warnings.warn(message + ". Using 4 KiB pages.", RuntimeWarning, stacklevel=2)
        pages = HostPages.SMALL
    if pages is HostPages.HUGETLB:
        storage = _shared_from_memfd(nbytes, _MFD_HUGETLB, huge_page_support().hugetlb_page_bytes)
    elif shared:
        storage = _shared_from_memfd(nbytes, 0, mmap.PAGESIZE)
        if pages is HostPages.THP and nbytes:
            _madvise_huge(storage.data_ptr(), nbytes)
    elif pages is HostPages.THP:
        return _private_anonymous(nbytes).view(dtype).view(shape)
    else:
        return torch.empty(shape, dtype=dtype)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def huge_bytes(t: torch.Tensor) -> int:
    """Bytes of huge pages (THP or hugetlbfs) backing the mappings that hold ``t``'s memory, read
    from ``/proc/self/smaps`` (0 where it cannot be read). A unified tensor is its host memory."""
    if t.device.type != "cpu":
        t = t.cpu()
    lo = t.data_ptr()
    hi = lo + t.numel() * t.element_size()
    total, inside = 0, False
    keys = ("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:", "Shared_Hugetlb:", "Private_Hugetlb:")
    for line in (read_text("/proc/self/smaps") or "").splitlines():
        head = line.split(None, 1)[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start < hi and end > lo
        elif inside and head in keys:
            total += int(line.split()[1]) * 1024
    return total
