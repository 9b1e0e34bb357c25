"""Where an array's bytes live, and where an op over them runs: the package's one placement model.

=============  ===================================================  ============================
``Placement``  the bytes live in                                    shared between processes
=============  ===================================================  ============================
``CPU``        host memory, read by the CPU                         when in shared memory
``MAPPED``     host (shared) memory, page-locked and mapped for     yes: every process maps the
               every GPU in place (a unified tensor); GPUs read it  same bytes
               over PCIe, 4 KiB host pages at a time
``MANAGED``    CUDA managed memory kept in host memory (preferred   no: private to the process
               location the CPU) and mapped for every GPU; GPUs    that allocated it
               read it in place over PCIe; no page ever migrates
``UVM``        CUDA managed memory advised read-mostly: each page   no
               migrates to the GPU that first touches it (the UVM
               baseline of the traversal papers)
``GPU``        GPU memory                                           no
=============  ===================================================  ============================

``MAPPED`` and ``MANAGED`` are both zero-copy host memory; which one a GPU reads faster is a
property of the machine (how its GPU translates host addresses), measured by
:mod:`pytorch_zerocopy.probe`, never assumed.

Strings are accepted only where a user names a placement (``CSRGraph.to("unified")``,
``--host-memory managed``); :meth:`Placement.parse` turns them into a member, and the code
behind the edge compares members. The aliases: ``"unified"``/``"mapped"``,
``"managed"``/``"managed-host"``, ``"uvm"``, ``"cuda"``/``"gpu"``, ``"cpu"``.

:func:`op_device` is the one rule for where an op over tensors runs, and :func:`empty` the one
allocator of a table in a placement.
"""

from __future__ import annotations

import enum
from typing import Optional, Sequence, Union

import torch

__all__ = ["Placement", "PlacementError", "empty", "op_device", "place", "to_device_async"]


class PlacementError(ValueError):
    """A placement that does not exist, or cannot be used on this machine."""


class Placement(str, enum.Enum):
    CPU = "cpu"
    MAPPED = "unified"
    MANAGED = "managed"
    UVM = "uvm"
    GPU = "cuda"

    @classmethod
    def parse(cls, value: Union["Placement", str], setting: str = "placement") -> "Placement":
        """``value`` as a member: a member, its value or an alias (module docstring). Raises
        :class:`PlacementError` naming ``setting`` and the accepted words."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            found = _ALIASES.get(value.strip().lower())
            if found is not None:
                return found
        words = ", ".join(repr(w) for w in _ALIASES)
        raise PlacementError(f"{setting} must be one of {words}, got {value!r}")

    @property
    def shareable(self) -> bool:
        """Other processes can map the same bytes (shared host memory)."""
        return self in (Placement.CPU, Placement.MAPPED)

    @property
    def describe(self) -> str:
        return _WORDS[self]


_ALIASES = {
    "cpu": Placement.CPU,
    "unified": Placement.MAPPED,
    "mapped": Placement.MAPPED,
    "managed": Placement.MANAGED,
    "managed-host": Placement.MANAGED,
    "uvm": Placement.UVM,
    "cuda": Placement.GPU,
    "gpu": Placement.GPU,
}

_WORDS = {
    Placement.CPU: "host memory read by the CPU",
    Placement.MAPPED: "shared host memory mapped for the GPU",
    Placement.MANAGED: "managed memory kept in host memory",
    Placement.UVM: "managed memory migrating to the GPU",
    Placement.GPU: "GPU memory",
}

DeviceLike = Union[str, int, torch.device, None]


def _gpu_backed() -> bool:
    from . import unified

    return unified.gpu_backed()


def gpu(device: DeviceLike = None) -> torch.device:
    """``device`` as an indexed CUDA device (None or an int: the current GPU / that index)."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type != "cuda":
        raise PlacementError(f"expected a GPU, got {dev}")
    return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)


def op_device(*tensors: Optional[torch.Tensor]) -> torch.device:
    """Where an op over ``tensors`` runs and its result lives: the device of the first CUDA
    tensor among them; else the GPU of the first unified tensor (the CPU where no GPU serves
    unified tensors); else the CPU. None entries are skipped."""
    from .unified import DEVICE_TYPE

    unified = None
    for t in tensors:
        if t is None:
            continue
        if t.device.type == "cuda":
            return t.device
        if unified is None and t.device.type == DEVICE_TYPE:
            unified = t.device
    if unified is not None and _gpu_backed():
        return torch.device("cuda", unified.index if unified.index is not None else 0)
    return torch.device("cpu")


def empty(shape: Sequence[int], dtype: torch.dtype, placement: Placement, device: DeviceLike = None) -> torch.Tensor:
    """An uninitialised table of ``shape`` in ``placement``: a CPU tensor in shared memory
    (``CPU``), a unified tensor (``MAPPED``), a CUDA tensor on ``device`` (default: the current
    GPU) over managed or GPU memory (``MANAGED``, ``UVM``, ``GPU``). Host-memory kinds are
    refused (``torch.OutOfMemoryError``) before anything is allocated when the machine cannot
    back them; ``UVM`` when the GPU lacks the free memory."""
    placement = Placement.parse(placement)
    shape = tuple(int(s) for s in shape)
    if placement is Placement.CPU:
        from .datasets.base import shared_host_tensor

        return shared_host_tensor(shape, dtype)
    if placement is Placement.MAPPED:
        from .unified import empty_unified

        return empty_unified(shape, dtype, None if device is None or not _gpu_backed()
                             else f"unified:{gpu(device).index}")
    if not _gpu_backed():
        raise PlacementError(f"placement {placement.value!r} ({placement.describe}) needs a CUDA build of "
                             "pytorch_zerocopy and a GPU; this process has none")
    dev = gpu(device)
    if placement is Placement.GPU:
        return torch.empty(shape, dtype=dtype, device=dev)
    return torch.ops.zerocopy.managed_empty.default(list(shape), dtype, dev.index,
                                                    on_host=placement is Placement.MANAGED)


def place(t: torch.Tensor, placement: Placement, device: DeviceLike = None) -> torch.Tensor:
    """The host tensor ``t`` in ``placement``: itself (``CPU``), mapped in place (``MAPPED``:
    no copy, the result aliases ``t``), else a copy in managed or GPU memory on ``device``."""
    from . import unified

    placement = Placement.parse(placement)
    host = t.cpu() if unified.is_unified(t) else t
    if placement is Placement.CPU:
        return host
    if placement is Placement.MAPPED:
        if unified.is_unified(t):
            return t
        return unified.to_unified(host, None if device is None or not _gpu_backed()
                                  else f"unified:{gpu(device).index}")
    if not _gpu_backed():
        raise PlacementError(f"placement {placement.value!r} ({placement.describe}) needs a CUDA build of "
                             "pytorch_zerocopy and a GPU; this process has none")
    if placement is Placement.GPU:
        return host.to(gpu(device))
    # Filled by the CPU, so every page starts in host memory (a UVM copy starts cold).
    return torch.ops.zerocopy.managed_copy.default(host.contiguous(), gpu(device).index,
                                                   on_host=placement is Placement.MANAGED)


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The CPU tensor ``t`` (typically pageable) on ``device`` without making the host wait for
    the GPU: staged through torch's pinned-memory cache, whose blocks are reused only after the
    copy has run, then copied asynchronously. Other tensors and devices: ``t.to(device)``."""
    if t.device == device:
        return t
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def cat_to_device_async(parts: Sequence[torch.Tensor], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The CPU tensors ``parts`` flattened, converted to ``dtype`` and concatenated on
    ``device``, as :func:`to_device_async` moves one tensor: each part is written once, straight
    into one block of torch's pinned-memory cache (no concatenation on the host first), and the
    block reaches the GPU in one asynchronous copy. Off a GPU: the concatenation there."""
    staged = torch.empty(sum(p.numel() for p in parts), dtype=dtype, pin_memory=device.type == "cuda")
    offset = 0
    for p in parts:
        staged[offset:offset + p.numel()].copy_(p.reshape(-1))
        offset += p.numel()
    return staged.to(device, non_blocking=True)
